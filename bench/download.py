"""Downloading a Hub model's shards with 1, 2, 4 and 8 Range streams per file (``convert --download-streams``)
from the tests' fake Hub, each connection throttled as a CDN throttles it (issue 42).

``.venv/bin/python bench/download.py [--shards 6] [--mib 100] [--rate-mb 30] [--streams 1,2,4,8] [--runs 2]
[--link-mb 0] [--dir /dev/shm]``: writes ``--shards`` files of ``--mib`` MiB of random bytes, serves them from
``tests/converters/hubserver.py`` in a process of its own (so its threads do not share this one's GIL) with each
body response paced to ``--rate-mb`` MB/s (all of them together to ``--link-mb``, when given), and per run and
stream count (interleaved) downloads every shard one after another as ``convert`` does (``HubSource.ensure_local``: the Hub's redirect to the CDN, Range requests,
sha256 check, publication) into a fresh work folder, an empty HF cache. Prints each run's wall and CPU seconds,
the best wall, MB/s and the speed-up over one stream, and the link-bound time at one stream's rate.

``--convert``: instead of random shards, a generated BF16 MoE checkpoint (``tests/converters/tinyckpt.py``,
``--shards`` shards of ~``--mib`` MiB) and, per stream count, the whole ``colitools convert org/name OUT``
(a process; default recipe; output on ``--dir``) against the same conversion from the local folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
MB, MiB = 1_000_000, 1 << 20
REPO = "bench/model"

SERVER = """
import sys
sys.path.insert(0, sys.argv[1])
from hubserver import HubServer
hub = HubServer({sys.argv[2]: {"main": sys.argv[3]}}).start()
if float(sys.argv[4]) > 0:
    hub.throttle(None, float(sys.argv[4]))
if float(sys.argv[5]) > 0:
    hub.throttle_link(float(sys.argv[5]))
print(hub.endpoint, flush=True)
sys.stdin.read()
hub.stop()
"""


def make_shards(folder: Path, shards: int, mib: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        with open(folder / name, "wb") as out:
            for _ in range(mib // 16):
                out.write(os.urandom(16 * MiB))
            out.write(os.urandom((mib % 16) * MiB))
        names.append(name)
    return names


def download_all(endpoint: str, names: list[str], work: Path, streams: int) -> tuple[float, float]:
    """Wall and CPU seconds of downloading ``names`` one after another with ``streams`` streams each."""
    from colitools.converters.sources import open_source

    shutil.rmtree(work, ignore_errors=True)
    source = open_source(REPO, workdir=work, endpoint=endpoint, download_streams=streams)
    wall, cpu = time.perf_counter(), time.process_time()
    for name in names:
        source.ensure_local(name)
    return time.perf_counter() - wall, time.process_time() - cpu


def make_model(folder: Path, shards: int, mib: int) -> list[str]:
    """A BF16 MoE checkpoint of ``shards`` shards of about ``mib`` MiB each (its experts: 8 x 3 x 1024 x I)."""
    from tinyckpt import Tiny, make_checkpoint

    inter = max(mib * MiB // (8 * 3 * 1024 * 2) // 64 * 64, 64)
    spec = Tiny(layers=shards, experts=8, hidden=1024, inter=inter, vocab=256, shards=shards)
    make_checkpoint(folder, spec)
    return sorted(p.name for p in folder.glob("*.safetensors"))


def convert_once(source: str, out: Path, env: dict[str, str], streams: int | None) -> float:
    """Wall seconds of one ``colitools convert`` process (``streams`` None: a local folder)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(Path(env["HF_HOME"]), ignore_errors=True)
    command = [sys.executable, "-m", "colitools", "convert", source, str(out), "--min-free-gb", "0"]
    command += ["--no-progress"]
    command += [] if streams is None else ["--download-streams", str(streams)]
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def report_convert(endpoint: str, base: Path, counts: list[int], args) -> None:
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(base / "hf")}
    total = sum(p.stat().st_size for p in (base / "repo").iterdir())
    walls: dict[int | None, list[float]] = {n: [] for n in [None, *counts]}
    for run in range(args.runs):
        for n in walls:
            source = str(base / "repo") if n is None else REPO
            walls[n].append(convert_once(source, base / "out", env, n))
            what = "local folder" if n is None else f"streams {n}"
            print(f"run {run + 1} convert from {what}: wall {walls[n][-1]:6.2f} s", flush=True)
    print(f"checkpoint {total / MB:.0f} MB in {args.shards} shards, {args.rate_mb:g} MB/s per connection "
          f"(one stream's bound {total / (args.rate_mb * MB):.1f} s)")  # fmt: skip
    local = min(walls[None])
    print(f"convert from the local folder: best {local:6.2f} s")
    for n in counts:
        best = min(walls[n])
        print(f"convert org/name, {n} streams: best {best:6.2f} s  x{min(walls[counts[0]]) / best:.2f} over "
              f"{counts[0]} stream(s), {best / local:.1f} x the local conversion")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--rate-mb", type=float, default=30.0, help="per connection, MB/s (0: unthrottled)")
    parser.add_argument("--link-mb", type=float, default=0.0, help="all connections together, MB/s (0: none)")
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--convert", action="store_true", help="time `colitools convert org/name` instead")
    args = parser.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    with tempfile.TemporaryDirectory(prefix="colitools-bench-dl-", dir=args.dir) as tmp:
        base = Path(tmp)
        os.environ["HF_HOME"] = str(base / "hf")  # an empty cache: every shard is downloaded
        sys.path.insert(0, str(ROOT / "tests" / "converters"))
        make = make_model if args.convert else make_shards
        names = make(base / "repo", args.shards, args.mib)
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(ROOT / "tests" / "converters"), REPO, str(base / "repo"),
             str(args.rate_mb * MB), str(args.link_mb * MB)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            endpoint = server.stdout.readline().strip()
            if args.convert:
                report_convert(endpoint, base, counts, args)
            else:
                report(endpoint, names, base / "work", counts, args)
        finally:
            server.stdin.close()
            server.wait(30)


def report(endpoint: str, names: list[str], work: Path, counts: list[int], args) -> None:
    total = len(names) * args.mib * MiB
    walls: dict[int, list[float]] = {n: [] for n in counts}
    for run in range(args.runs):
        for n in counts:
            wall, cpu = download_all(endpoint, names, work, n)
            walls[n].append(wall)
            print(f"run {run + 1} streams {n}: wall {wall:6.2f} s  cpu {cpu:6.2f} s  {total / wall / MB:6.1f} MB/s",
                  flush=True)  # fmt: skip
    one = min(walls[counts[0]])
    link = f", link {args.link_mb:g} MB/s (bound {total / (args.link_mb * MB):.1f} s)" if args.link_mb else ""
    print(f"{len(names)} shards x {args.mib} MiB = {total / MB:.0f} MB, {args.rate_mb:g} MB/s per connection "
          f"(one stream's bound {total / (args.rate_mb * MB):.1f} s){link}" if args.rate_mb else "unthrottled")  # fmt: skip
    for n in counts:
        best = min(walls[n])
        print(f"streams {n}: best {best:6.2f} s  {total / best / MB:6.1f} MB/s  speed-up x{one / best:.2f}")


if __name__ == "__main__":
    main()
