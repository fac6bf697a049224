"""``colitools verify quality --source`` (weight level) next to reading the same bytes, in the same run.

One run (``.venv/bin/python bench/quality.py [--layers 4 --experts 64] [--runs 2] [--workdir DIR] [--skeleton
RELEASE]``):

1. Generates a BF16 DeepSeek-style MoE checkpoint of a few GB (``bench/convert.py``'s ``generate``: hidden 2048,
   expert width 1024, one shard per layer) under ``--workdir`` and converts it with the default recipe
   (``colitools convert``: int4-g64 experts, int8-row dense / embed / head, F32 norms and routers), untimed.
2. ``read``: every source and output shard read once (8 MB reads into one reused buffer, 1 thread: ``cat >
   /dev/null``); ``verify``: ``verify quality OUT --source SRC --json`` as a whole process (start-up, planning,
   every tensor decoded and compared): best wall, CPU seconds, peak RSS (``VmHWM``), load average.
3. Both from the drive (the benchmark's files evicted from the page cache first, ``POSIX_FADV_DONTNEED``: no
   other file is touched) and from the page cache, alternated ``--runs`` times; prints verify / read for each.
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
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from convert import GB, generate, run_process  # noqa: E402

CHUNK = 8 << 20


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.safetensors") if p.is_file())


def read_all(paths: list[Path]) -> tuple[float, int]:
    """Read every file once, 8 MB at a time into one reused buffer (``cat > /dev/null``); (seconds, bytes)."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total, t0 = 0, time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while (n := os.readv(fd, [view])) > 0:
                total += n
        finally:
            os.close(fd)
    return time.perf_counter() - t0, total


def evict(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (``POSIX_FADV_DONTNEED``; they are clean): the next read of
    them comes from the drive. Only the benchmark's own files: nothing else on the machine is touched."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def verify(out: Path, src: Path) -> dict:
    cmd = [sys.executable, "-m", "colitools", "verify", "quality", str(out), "--source", str(src), "--json",
           "--no-progress"]  # fmt: skip
    res = run_process(cmd)
    report = json.loads(res.pop("stdout"))
    res.update(tensors=report["tensors_compared"], bytes_read=report["bytes_read"],
               not_compared=len(report["not_compared"]), whole=report["whole"])  # fmt: skip
    return res


def generated(work: Path, layers: int, experts: int, runs: int) -> bool:
    src, out = work / "src", work / "out"
    shutil.rmtree(work, ignore_errors=True)
    nbytes = generate(src, layers, experts, "BF16")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0",
                    "--no-progress"], check=True, capture_output=True)  # fmt: skip
    os.sync()
    print(f"generated {nbytes / GB:.2f} GB BF16 ({layers} layers x {experts} experts), converted in "
          f"{time.perf_counter() - t0:.1f} s (default recipe)")  # fmt: skip
    paths = files_of(src) + files_of(out)
    rows: dict[str, list] = {"read": [], "verify": [], "read cold": [], "verify cold": []}
    for _ in range(runs):  # alternated: cold (the drive) then warm (the page cache), each read then verify
        evict(paths)
        rows["read cold"].append(read_all(paths)[0])
        evict(paths)
        rows["verify cold"].append(verify(out, src))
        read_all(paths)
        rows["read"].append(read_all(paths)[0])
        rows["verify"].append(verify(out, src))
    size = sum(p.stat().st_size for p in paths)
    print(f"bytes of both sets: {size / GB:.2f} GB (source {sum(p.stat().st_size for p in files_of(src)) / GB:.2f}, "
          f"output {sum(p.stat().st_size for p in files_of(out)) / GB:.2f})")  # fmt: skip
    print(f"{'case':<34}{'best s':>8}{'GB/s':>8}{'cpu s':>8}{'cpu%':>6}{'RSS MB':>8}{'load':>6}")
    for label, cache in (("drive (page cache dropped)", " cold"), ("page cache", "")):
        read = min(rows["read" + cache])
        print(f"{'read, ' + label:<34}{read:>8.2f}{size / GB / read:>8.2f}")
        for r in rows["verify" + cache]:
            print(f"{'verify quality --source, ' + label[:5]:<34}{r['wall']:>8.2f}{size / GB / r['wall']:>8.2f}"
                  f"{r['cpu']:>8.1f}{100 * r['cpu'] / r['wall']:>6.0f}{r['rss_mb']:>8.0f}{r['load']:>6.1f}")  # fmt: skip
        best = min(r["wall"] for r in rows["verify" + cache])
        print(f"  verify / read ({label}) = {best / read:.2f}x")
    r = rows["verify"][0]
    rss = max(x["rss_mb"] for v in ("verify", "verify cold") for x in rows[v])
    print(f"{r['tensors']} tensors compared, {r['not_compared']} not compared; whole-model relative error "
          f"{r['whole']['rel_error']:.4g}")  # fmt: skip
    cold = min(x["wall"] for x in rows["verify cold"]) / min(rows["read cold"])
    misses = [
        _check(
            f"verify quality from the drive faster than reading both sets from it ({cold:.2f}x)", cold < 1
        ),
        _check(f"peak RSS {rss:.0f} MB <= 400", rss <= 400),
    ]
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
    args = ap.parse_args()
    ok = True
    if not args.skip_generated:
        ok = generated(args.workdir, args.layers, args.experts, args.runs)
    if args.skeleton is not None:
        skeleton(args.skeleton, args.workdir)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
