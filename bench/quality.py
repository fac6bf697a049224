"""``colitools verify quality --source`` (weight level) next to reading the same bytes, in the same run.

One run (``.venv/bin/python bench/quality.py [--layers 4 --experts 64] [--runs 2] [--workdir DIR] [--keep]
[--base-python PY] [--skeleton RELEASE]``):

1. Generates a BF16 DeepSeek-style MoE checkpoint of a few GB (``bench/convert.py``'s ``generate``: hidden 2048,
   expert width 1024, one shard per layer) under ``--workdir`` and converts it with the default recipe
   (``colitools convert``: int4-g64 experts, int8-row dense / embed / head, F32 norms and routers), untimed
   (``--keep``: the pair is kept, and reused by the next run that finds it).
2. ``read``: every source and output shard read once (8 MB reads into one reused buffer, 1 thread: ``cat >
   /dev/null``); ``read, O_DIRECT``: the same with ``O_DIRECT`` (the drive's own rate, no page cache);
   ``verify``: ``verify quality OUT --source SRC --json`` as a whole process (start-up, planning, every tensor
   decoded and compared), and with ``--base-python`` (another checkout's venv) that checkout's, in turn: best
   and median wall, CPU and system CPU seconds, peak RSS (``VmHWM``), the load range.
3. From the drive (the benchmark's files evicted from the page cache before each case, ``POSIX_FADV_DONTNEED``:
   no other file is touched) and from the page cache, alternated ``--runs`` times; prints verify / read for each
   (of the best, and the median of each run's own ratio).
4. With ``--skeleton RELEASE`` (a ``bench/published`` folder): its full-size sparse skeleton (``bench/skeleton.py``)
   and an output skeleton of the conversion ``convert`` plans for it (every planned file: the writer's header,
   then a hole; the index, config and a complete manifest with the recipe), then ``verify quality`` on the
   pair: every tensor of a published model planned, matched and decoded at full size (holes read as zeros,
   so every figure is 0: the figures say nothing, the wall time and peak RSS do).

Targets (issue 40): verify quality faster than reading both sets of bytes from the drive (cold / cold); peak RSS
<= 400 MB.
The machine is often shared: read the CPU% and load beside every wall-clock figure.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from convert import GB, generate, run_process  # noqa: E402

CHUNK = 8 << 20


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.safetensors") if p.is_file())


def read_all(paths: list[Path], direct: bool = False) -> tuple[float, int]:
    """Read every file once, 8 MB at a time into one reused buffer (``cat > /dev/null``); (seconds, bytes).
    ``direct``: with ``O_DIRECT`` into an aligned buffer (the drive's own rate, no page cache)."""
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants it
    view = memoryview(buf)
    total, t0 = 0, time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            while (n := os.readv(fd, [view])) > 0:
                total += n
        finally:
            os.close(fd)
    return time.perf_counter() - t0, total


def timed_read(paths: list[Path], direct: bool = False) -> dict:
    """``read_all`` with this process's CPU seconds (the reads' own system time) and the load before it."""
    load, t = os.getloadavg()[0], os.times()
    wall, _ = read_all(paths, direct)
    u = os.times()
    return {"wall": wall, "cpu": u.user + u.system - t.user - t.system, "sys": u.system - t.system, "load": load}


def evict(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (``POSIX_FADV_DONTNEED``; they are clean): the next read of
    them comes from the drive. Only the benchmark's own files: nothing else on the machine is touched."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def verify(out: Path, src: Path, python: str = sys.executable) -> dict:
    cmd = [python, "-m", "colitools", "verify", "quality", str(out), "--source", str(src), "--json",
           "--no-progress"]  # fmt: skip
    res = run_process(cmd)
    report = json.loads(res.pop("stdout"))
    res.update(tensors=report["tensors_compared"], bytes_read=report["bytes_read"],
               not_compared=len(report["not_compared"]), whole=report["whole"])  # fmt: skip
    return res


def make_pair(work: Path, layers: int, experts: int, keep: bool) -> tuple[Path, Path]:
    """The generated source and its conversion under ``work`` (``keep``: reused when a run left them)."""
    src, out = work / "src", work / "out"
    if keep and (out / "colitools.json").is_file() and files_of(src):
        print(f"reusing {src} and {out}")
        return src, out
    shutil.rmtree(work, ignore_errors=True)
    nbytes = generate(src, layers, experts, "BF16")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0",
                    "--no-progress"], check=True, capture_output=True)  # fmt: skip
    os.sync()
    print(f"generated {nbytes / GB:.2f} GB BF16 ({layers} layers x {experts} experts), converted in "
          f"{time.perf_counter() - t0:.1f} s (default recipe)")  # fmt: skip
    return src, out


def measure(src: Path, out: Path, runs: int, pythons: dict[str, str]) -> dict[str, list]:
    """Alternated ``runs`` times: from the drive (every file evicted before each case) the plain read, the
    ``O_DIRECT`` read and each checkout's verify; then from the page cache the read and each verify."""
    paths = files_of(src) + files_of(out)
    rows: dict[str, list] = defaultdict(list)
    for _ in range(runs):
        evict(paths)
        rows["read cold"].append(timed_read(paths))
        for name, python in pythons.items():
            evict(paths)
            rows[f"{name} cold"].append(verify(out, src, python))
        evict(paths)
        rows["direct cold"].append(timed_read(paths, direct=True))
        read_all(paths)
        rows["read"].append(timed_read(paths))
        for name, python in pythons.items():
            rows[name].append(verify(out, src, python))
    return rows


def report(rows: dict[str, list], names: list[str], size: int) -> float:
    """Print the table; returns the first checkout's best verify from the drive over the best plain read."""
    print(f"{'case':<44}{'best s':>8}{'median':>8}{'GB/s':>7}{'cpu s':>7}{'sys s':>7}{'cpu%':>6}{'RSS MB':>8}"
          f"{'load':>10}")  # fmt: skip
    for cache, cases in ((" cold", ["read", "direct", *names]), ("", ["read", *names])):
        for case in cases:
            rs = rows[case + cache]
            walls = [r["wall"] for r in rs]
            label = {"read": "read (cat > /dev/null)", "direct": "read, O_DIRECT (the drive's own rate)"}.get(
                case, f"verify quality --source ({case})")  # fmt: skip
            rss = f"{max(r['rss_mb'] for r in rs):>8.0f}" if "rss_mb" in rs[0] else f"{'':>8}"
            loads = [r["load"] for r in rs]
            print(f"{label + (', drive' if cache else ', page cache'):<44}{min(walls):>8.2f}"
                  f"{statistics.median(walls):>8.2f}{size / GB / min(walls):>7.2f}"
                  f"{statistics.median(r['cpu'] for r in rs):>7.1f}{statistics.median(r['sys'] for r in rs):>7.1f}"
                  f"{statistics.median(100 * r['cpu'] / r['wall'] for r in rs):>6.0f}{rss}"
                  f"{min(loads):>5.1f}-{max(loads):<4.1f}")  # fmt: skip
        for case in names:
            best = min(r["wall"] for r in rows[case + cache])
            pairs = [v["wall"] / r["wall"] for v, r in zip(rows[case + cache], rows["read" + cache], strict=True)]
            print(f"  {case}: verify / read ({'drive' if cache else 'page cache'}): best {best / min(r['wall'] for r in rows['read' + cache]):.2f}x, "
                  f"median of the runs' own ratios {statistics.median(pairs):.2f}x")  # fmt: skip
    return min(r["wall"] for r in rows[names[0] + " cold"]) / min(r["wall"] for r in rows["read cold"])


def generated(work: Path, layers: int, experts: int, runs: int, base: str | None, keep: bool) -> bool:
    src, out = make_pair(work, layers, experts, keep)
    pythons = {"this checkout": sys.executable, **({"--base-python": base} if base else {})}
    rows = measure(src, out, runs, pythons)
    size = sum(p.stat().st_size for p in files_of(src) + files_of(out))
    print(f"bytes of both sets: {size / GB:.2f} GB (source {sum(p.stat().st_size for p in files_of(src)) / GB:.2f}, "
          f"output {sum(p.stat().st_size for p in files_of(out)) / GB:.2f})")  # fmt: skip
    cold = report(rows, list(pythons), size)
    r = rows["this checkout"][0]
    rss = max(x["rss_mb"] for v in ("this checkout", "this checkout cold") for x in rows[v])
    print(f"{r['tensors']} tensors compared, {r['not_compared']} not compared; whole-model relative error "
          f"{r['whole']['rel_error']:.4g}")  # fmt: skip
    misses = [
        _check(
            f"verify quality from the drive faster than reading both sets from it ({cold:.2f}x)", cold < 1
        ),
        _check(f"peak RSS {rss:.0f} MB <= 400", rss <= 400),
    ]
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return not any(misses)


def _check(text: str, ok: bool) -> bool:
    print(f"{'PASS' if ok else 'MISS'}: {text}")
    return not ok


def output_skeleton(src: Path, out: Path) -> int:
    """The files ``convert`` plans for ``src`` (default recipe), each its writer's header then a hole, with the
    index, config and a complete manifest: what ``verify quality`` reads of a real output. Returns bytes."""
    from colitools.converters import output as conv_output
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import load_plan
    from colitools.converters.sources import open_source
    from colitools.formats.filenames import MANIFEST_FILE
    from colitools.formats.safetensors_io import SafetensorsWriter

    plan = load_plan(open_source(str(src), workdir=out / ".work"), ConvertOptions(progress=False))
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for f in plan.files:
        header = SafetensorsWriter.header_bytes(f.entries, f.metadata)
        path = out / f.name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(header)
            fh.truncate(f.size)
        total += f.size
    conv_output.write_index(out, plan)
    shutil.copy(src / "config.json", out / "config.json")
    manifest = {"format": 1, "state": "complete", "source": {"kind": "local", "path": str(src)},
                "recipe": plan.recipe.as_dict(), "units": {u.key: {"files": []} for u in plan.units}}  # fmt: skip
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    return total


def skeleton(release: Path, work: Path) -> None:
    from skeleton import build

    src, out = work / "skel-src", work / "skel-out"
    shutil.rmtree(work, ignore_errors=True)
    built = build(release, src)
    nbytes = output_skeleton(src, out)
    paths = files_of(src) + files_of(out)
    t_read, size = read_all(paths)
    r = verify(out, src)
    print(f"\nskeleton {release.name}: {built['tensors']} source tensors, {built['bytes'] / GB:.1f} GB -> output "
          f"skeleton {nbytes / GB:.1f} GB (holes)")  # fmt: skip
    print(f"  read both (holes: zeros from memory) {t_read:.1f} s; verify quality {r['wall']:.1f} s "
          f"({r['cpu']:.0f} cpu-s, load {r['load']:.1f}), {r['tensors']} tensors compared, {r['not_compared']} "
          f"not compared, peak RSS {r['rss_mb']:.0f} MB")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/colitools-bench-quality"))
    ap.add_argument("--skeleton", type=Path, default=None, help="a bench/published release folder")
    ap.add_argument("--skip-generated", action="store_true")
    ap.add_argument("--base-python", default=None,
                    help="the python of another checkout (its own venv): its verify interleaved with this one's")
    ap.add_argument("--keep", action="store_true", help="keep the generated pair in --workdir (and reuse it)")
    args = ap.parse_args()
    ok = True
    if not args.skip_generated:
        ok = generated(args.workdir, args.layers, args.experts, args.runs, args.base_python, args.keep)
    if args.skeleton is not None:
        skeleton(args.skeleton, args.workdir)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
