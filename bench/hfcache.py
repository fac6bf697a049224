"""What checking the Hugging Face cache costs a conversion: ``HF_HUB_OFFLINE=1 colitools convert org/name``
from a ~2 GB cache, next to ``colitools convert <folder>`` of the very same bytes, measured in the same run.

A conversion from the cache hashes every file it uses once, before its data is first read (an LFS file's bytes
must hash to the sha256 its blob is named by, any other file's to its git blob sha1; docs/INTERNALS.md,
"sources.py"); a conversion of a local folder checks nothing. The pipeline reads tensors (not the whole file, in
plan order, spread over units and resumes), so the hash cannot ride on its reads: it is a pass over each shard,
on a background thread while the unit before the shard's first one converts (inline for the first unit), which
also leaves the shard in the page cache for the unit's reads.

One run (``.venv/bin/python bench/hfcache.py [--runs 3] [--workdir DIR] [--shm DIR] [--small]``):

1. Generates the ~2 GB BF16 MoE checkpoint of ``bench/convert.py`` (hidden 2048, 24 experts of [1024, 2048] x 3
   per layer, 6 layers; on the disk, page cache warm) and lays it out as huggingface_hub's cache does
   (``models--bench--hfcache/{refs,blobs,snapshots}``, blobs named by sha256 / git blob sha1, snapshot
   symlinks), the blobs hard links of the folder's files (same inodes, same page cache: the two conversions
   read the same pages).
2. ``sha256`` of every blob, one thread, in this process: the least the check can cost.
3. Whole processes (``python -m colitools convert``, default recipe, output on a tmpfs), interleaved ``--runs``
   times: the folder (the peer: no check) and the cache (``HF_HUB_OFFLINE=1``; the check).
   The same pair on a tiny checkpoint (``oracles/qwen2_moe``, 0.8 MB) gives the fixed cost of a Hub source (importing
   huggingface_hub, scanning the cache), which is not the check.
4. Prints best and median wall, CPU seconds and CPU% (200 = both cores) of each, the load average before each
   run, and the check's cost: (cache - folder) on 2 GB minus (cache - folder) on the tiny one, beside the sha256
   pass alone.

No target: the check is what the cache's promise costs. On a shared machine read the CPU% and load beside the
wall figures.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_convert", Path(__file__).with_name("convert.py"))
bench_convert = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_convert)  # generate(), run_process(): one checkpoint generator for the benches

REPO = "bench/hfcache"
COMMIT = "b" * 40
CHUNK = 8 << 20
TINY = Path(__file__).resolve().parents[1] / "oracles" / "qwen2_moe"  # 0.8 MB: a Hub source's fixed cost


def lay_out_cache(folder: Path, cache: Path) -> list[Path]:
    """``folder`` as huggingface_hub's cache of ``REPO`` at ``COMMIT`` (hard-linked blobs); returns the blobs."""
    base = cache / f"models--{REPO.replace('/', '--')}"
    snapshot = base / "snapshots" / COMMIT
    for sub in (base / "blobs", base / "refs", snapshot):
        sub.mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(COMMIT)
    blobs = []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        lfs = path.suffix == ".safetensors"
        digest = hashlib.sha256() if lfs else hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
        with open(path, "rb") as fh:
            while block := fh.read(CHUNK):
                digest.update(block)
        blob = base / "blobs" / digest.hexdigest()
        try:
            os.link(path, blob)
        except OSError:  # another filesystem: a copy
            shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
        blobs.append(blob)
    return blobs


def sha256_pass(blobs: list[Path]) -> tuple[float, float, int]:
    """Wall and CPU seconds to sha256 every blob once (one thread, page cache warm), and the bytes hashed."""
    total = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for blob in blobs:
        digest = hashlib.sha256()
        with open(blob, "rb") as fh:
            while block := fh.read(CHUNK):
                digest.update(block)
                total += len(block)
    return time.perf_counter() - t0, time.process_time() - c0, total


def convert(spec: str, out: Path, env: dict[str, str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "colitools", "convert", spec, str(out), "--min-free-gb", "0", "--json"]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        res = bench_convert.run_process(cmd)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    summary = json.loads(res.pop("stdout"))
    res["units"] = summary["units_converted"]
    shutil.rmtree(out, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workdir", type=Path, default=Path(__file__).resolve().parents[1] / ".bench-tmp-hfcache"
    )
    ap.add_argument("--shm", type=Path, default=Path("/dev/shm"), help="a tmpfs for the outputs")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs of each case (best and median)")
    ap.add_argument(
        "--small", action="store_true", help="a tiny checkpoint: a smoke test of the script itself"
    )
    args = ap.parse_args()
    work = args.workdir.resolve()
    out = args.shm / f"colitools-bench-hfcache-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    print(
        f"machine: {os.cpu_count()} CPUs; load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    try:
        layers, experts = (1, 4) if args.small else (6, 24)
        cases, blobs = {}, []
        shutil.copytree(TINY, work / "tiny", ignore=shutil.ignore_patterns("reference"))
        size = bench_convert.generate(work / "big", layers=layers, experts=experts, dtype="BF16")
        for label in ("tiny", "big"):
            src = work / label
            cache = work / f"cache-{label}"
            blobs = lay_out_cache(src, cache)
            env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
            cases[f"{label}: folder (peer)"] = (str(src), {})
            cases[f"{label}: HF cache (check)"] = (REPO, env)
        os.sync()  # no writeback of the generator's pages during the timed runs
        convert(str(work / "tiny"), out, {})  # numba's cache and the imports, untimed
        hashed, hashed_cpu, nbytes = sha256_pass(blobs)
        print(f"checkpoint: {size / 1e9:.2f} GB of tensors in {len(blobs)} cache blobs ({nbytes / 1e9:.2f} GB); "
              f"tiny: {TINY.name} (the fixed cost of a Hub source: imports, the cache scan)")  # fmt: skip
        print(f"sha256 of every blob, 1 thread: {hashed:.2f} s, {hashed_cpu:.2f} CPU s "
              f"({nbytes / hashed_cpu / 1e9:.2f} GB per CPU second)")  # fmt: skip
        results: dict[str, list[dict]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, (spec, env) in cases.items():
                results[name].append(convert(spec, out, env))
        print(f"{'case':24} {'best s':>7} {'median s':>8} {'cpu s':>6} {'cpu%':>5} {'load':>5}")
        best, cpu = {}, {}
        for name, runs in results.items():
            top = min(runs, key=lambda r: r["wall"])
            best[name], cpu[name] = top["wall"], min(r["cpu"] for r in runs)
            median = statistics.median(r["wall"] for r in runs)
            print(f"{name:24} {top['wall']:7.2f} {median:8.2f} {top['cpu']:6.2f} "
                  f"{100 * top['cpu'] / top['wall']:5.0f} {top['load']:5.2f}")  # fmt: skip
        tiny_peer, tiny_hub, peer, checked = best.values()
        cost = (checked - peer) - (tiny_hub - tiny_peer)
        print(f"fixed cost of a Hub source (tiny): +{tiny_hub - tiny_peer:.2f} s; 2 GB cache / folder: "
              f"{checked / peer:.2f}x best wall")  # fmt: skip
        tiny_cpu, tiny_hub_cpu, peer_cpu, checked_cpu = cpu.values()
        cpu_cost = (checked_cpu - peer_cpu) - (tiny_hub_cpu - tiny_cpu)
        print(f"the check on {nbytes / 1e9:.2f} GB: +{cost:.2f} s wall = {cost / peer:.0%} of the folder's conversion; "
              f"+{cpu_cost:.2f} CPU s = {cpu_cost / peer_cpu:.0%} of its CPU (least CPU of the runs); "
              f"the sha256 pass alone: {hashed:.2f} s, {hashed_cpu:.2f} CPU s")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
