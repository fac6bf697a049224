"""What the resume's source check costs per GB of source (issue 43 item 8, converters/source_identity.py), next to
its peer, a full sha256 of the same shards, and to converting them again, measured in the same run on the same bytes.

``.venv/bin/python bench/resume_check.py [--layers 4] [--experts 16] [--repeat 3] [--workdir DIR]``

1. Generates a BF16 MoE checkpoint (``bench/convert.py``'s ``generate``: one ~235 MB shard per layer with 54
   tensors, ~230 tensors per GB; DeepSeek-R1 has ~130 per GB) and converts it once (``colitools convert``, a whole
   process: its CPU seconds per GB are what a unit redone costs).
2. Per GB of source, best of ``--repeat``: ``stat`` of every shard (what a rerun does when nothing changed); the
   fingerprint of every shard (``source_identity.fingerprint``: what a rerun does for a shard whose mtime, ctime
   or folder changed) and a full sha256 of every shard (``formats.digest.sha256_file``), each from the page
   cache (warm) and after ``posix_fadvise(DONTNEED)`` of every shard (cold: from the drive, as far as the VM's
   host cache lets it be).
3. Whole processes: the rerun of the complete output (nothing to do) with the source as converted, after ``mv``
   of the source folder and after ``chmod`` of every shard (each re-checks every shard's fingerprint).

Prints the table, the fingerprint's bytes read per GB, and the ratios sha256 / fingerprint and conversion /
fingerprint. No targets: the figures are for docs/INTERNALS.md's ledger section and the report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convert import GB, generate, run_process, shards  # noqa: E402

from colitools.converters import source_identity  # noqa: E402
from colitools.formats.digest import sha256_file  # noqa: E402


def _evict(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(8 << 20):
                pass


def _best(fn: Callable[[], object], repeat: int, before: Callable[[], None]) -> tuple[float, float]:
    """Best wall and CPU seconds of ``fn`` over ``repeat`` runs, ``before`` run untimed ahead of each."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        before()
        t, c = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - t, time.process_time() - c))
    return best


def _sampled_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            total += sum(n for _, n in source_identity._windows(fd, os.fstat(fd).st_size))
        finally:
            os.close(fd)
    return total


def _rerun(src: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0", "--json"]
    res = run_process(cmd)
    res["summary"] = json.loads(res.pop("stdout"))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="colitools-resume-check-", dir=args.workdir))
    try:
        src, out = work / "src", work / "out"
        generate(src, args.layers, args.experts, "BF16")
        paths = shards(src)
        size = sum(p.stat().st_size for p in paths)
        gbs = size / GB
        print(f"checkpoint: {len(paths)} shards, {size / GB:.3f} GB, load {os.getloadavg()[0]:.2f}")
        conv = run_process([sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0"])
        rows = [("convert (whole process, once)", conv["wall"], conv["cpu"])]
        nothing = lambda: None  # noqa: E731
        cases = [
            ("stat of every shard", lambda: [p.stat() for p in paths], nothing),
            ("fingerprint, page cache", lambda: [source_identity.fingerprint(p) for p in paths], lambda: _warm(paths)),
            ("fingerprint, evicted", lambda: [source_identity.fingerprint(p) for p in paths], lambda: _evict(paths)),
            ("sha256, page cache", lambda: [sha256_file(p) for p in paths], lambda: _warm(paths)),
            ("sha256, evicted", lambda: [sha256_file(p) for p in paths], lambda: _evict(paths)),
        ]
        for label, fn, before in cases:
            rows.append((label, *_best(fn, args.repeat, before)))
        same = _rerun(src, out)
        moved = work / "moved"
        src.rename(moved)
        after_mv = _rerun(moved, out)
        for p in shards(moved):
            os.chmod(p, 0o444)
        after_chmod = _rerun(moved, out)
        for label, res in (("rerun, nothing changed", same), ("rerun after mv", after_mv),
                           ("rerun after chmod", after_chmod)):  # fmt: skip
            rows.append((f"{label} (process; {len(res['summary']['sources_rechecked'])} re-checked)",
                         res["wall"], res["cpu"]))  # fmt: skip
        print(f"{'case':<44} {'wall s':>8} {'CPU s':>8} {'wall s/GB':>10} {'CPU s/GB':>9}")
        for label, wall, cpu in rows:
            print(f"{label:<44} {wall:>8.4f} {cpu:>8.4f} {wall / gbs:>10.4f} {cpu / gbs:>9.4f}")
        fp = dict((r[0], r) for r in rows)
        sampled = _sampled_bytes(shards(moved))
        print(f"fingerprint reads {sampled / size * 1e3:.2f} bytes per kB of source ({sampled / 2**20:.1f} MiB)")
        for kind in ("page cache", "evicted"):
            f, s = fp[f"fingerprint, {kind}"], fp[f"sha256, {kind}"]
            print(f"{kind}: sha256 / fingerprint wall x{s[1] / f[1]:.0f}; conversion CPU / fingerprint CPU "
                  f"x{conv['cpu'] / max(f[2], 1e-9):.0f}")  # fmt: skip
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
