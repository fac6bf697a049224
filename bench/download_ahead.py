"""``colitools convert org/name`` with the next units' shards downloading while a unit converts (issue 42,
"download ahead"), from the tests' fake Hub with each connection and the whole link throttled, against the
link-bound time, the same conversion from the local folder and a Hub conversion with one stream per shard.

``.venv/bin/python bench/download_ahead.py [--shards 8] [--mib 120] [--rate-mb 25] [--link-mb 200] [--runs 3]
[--dir /dev/shm] [--base-tree DIR] [--streams N ...] [--no-single]``: writes a generated BF16 MoE checkpoint
(``bench/download.py``'s ``make_model``: ``--shards`` shards of ~``--mib`` MiB), serves it from ``tests/converters/hubserver.py`` in a
process of its own, each body response paced to ``--rate-mb`` MB/s and all of them together to ``--link-mb``,
and per run (interleaved) times whole ``colitools convert`` processes into a fresh output folder with an empty
HF cache: from the local folder; ``org/name`` (the default streams per file, download ahead);
``org/name --download-streams 1`` (unless ``--no-single``); ``--streams``: ``org/name`` at each of these stream
counts instead of the default's alone; the shards alone downloaded one after another (default streams, one file
at a time, no conversion: what the download takes on this machine now); with ``--base-tree DIR`` (a checkout whose ``colitools`` package
``PYTHONPATH=DIR`` imports) ``org/name`` as that tree converts it. Prints each wall, the medians, the link-bound
time (bytes / ``--link-mb``) and the goal ratio wall / max(link-bound, local conversion), and checks that every
Hub output's files are byte-identical to the local conversion's. Each run also prints its CPU seconds and the
server's (the fake Hub runs on the same cores: on 2 cores their sum / 2 is a floor of the wall), and where a Hub
run's wall went, from the bytes the fake Hub had sent every 10 ms (``link_phases``; with the medians too): when
2 MB were out (the start: interpreter, imports, listing, plan), the rate until the last MB, and the time after it
(the tail).

``--serve``: only write the checkpoint and serve it; prints ``HF_ENDPOINT=...`` and the folder, and serves until
stdin closes (for timing the commands with another tool).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from download import MB, REPO, SERVER, make_model  # noqa: E402 - bench/ is not a package

from colitools.converters.options import DEFAULT_DOWNLOAD_STREAMS  # noqa: E402


def digests(out: Path) -> dict[str, str]:
    """sha256 of every converted file but the manifest (which names the source)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.iterdir())
        if p.is_file() and p.name != "colitools.json"
    }


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a running process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sent_by(pid: int) -> int:
    """Bytes a process has written so far, ``sendfile`` included (``/proc/PID/io``'s ``wchar``)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def convert_once(
    source: str, out: Path, env: dict[str, str], extra: list[str], server: int | None = None
) -> tuple[float, dict[str, str] | None, str]:
    """Wall seconds of one ``colitools convert`` process, its output's digests and, with the fake Hub's
    ``server`` pid, where the wall went (``link_phases``). It runs in the folder of the tree it times
    (``python -m`` puts the working folder first on ``sys.path``)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(Path(env["HF_HOME"]), ignore_errors=True)
    if source == DOWNLOAD_ONLY:
        command = [sys.executable, "-c", DOWNLOAD_ONLY, REPO, str(out)]
    else:
        command = [sys.executable, "-m", "colitools", "convert", source, str(out), "--min-free-gb", "0"]
        command += ["--no-progress", *extra]
    tree = env.get("PYTHONPATH") or str(ROOT)
    base = sent_by(server) if server else 0
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, cwd=tree)
    samples = []  # (seconds, bytes the fake Hub sent), every 10 ms
    while proc.poll() is None:
        if server:
            samples.append((time.perf_counter() - start, sent_by(server) - base))
        time.sleep(0.01)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command)
    return wall, (None if source == DOWNLOAD_ONLY else digests(out)), link_phases(samples, wall)


def link_phases(samples: list[tuple[float, int]], wall: float) -> tuple[float, float, float] | None:
    """When the fake Hub had sent 2 MB (past the listing and the shards' header reads), the MB/s from then until
    all but the last 1 MB were out, and the seconds after that: the start, the transfer and the tail of a wall."""
    if not samples or samples[-1][1] < 4 * MB:
        return None
    total = samples[-1][1]
    first = next(t for t, n in samples if n >= 2 * MB)
    last = next(t for t, n in samples if n >= total - 1 * MB)
    return first, (total - 3 * MB) / MB / max(last - first, 1e-9), wall - last


def phases_text(phases: list[tuple[float, float, float]]) -> str:
    """``link_phases`` of one run, or the medians of several."""
    if not phases:
        return ""
    start, rate, tail = (statistics.median(p[i] for p in phases) for i in range(3))
    return f", link: 2 MB out at {start:.2f} s, then {rate:.0f} MB/s until the last MB, then {tail:.2f} s"


# the shards alone, one after another with the default streams (no conversion; ``convert``'s download ahead starts a
# file in the tail of the one before, this does not)
DOWNLOAD_ONLY = """
import sys
from pathlib import Path
from colitools.converters.sources import open_source
source = open_source(sys.argv[1], workdir=Path(sys.argv[2]))
for name in sorted(n for n in source.files() if n.endswith(".safetensors")):
    source.ensure_local(name)
"""


def cases(base: Path, endpoint: str, tree: str | None, streams: list[int], single: bool) -> dict[str, tuple]:
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(base / "hf"), "HF_HUB_DISABLE_XET": "1"}
    env.pop("PYTHONPATH", None)
    found = {"local folder": (str(base / "repo"), env, [])}
    for n in streams:  # the default's row has no option: what a user gets
        extra = [] if n == DEFAULT_DOWNLOAD_STREAMS else ["--download-streams", str(n)]
        found[f"org/name (ahead, {n} streams)"] = (REPO, env, extra)
    if single:
        found["org/name, 1 stream per shard"] = (REPO, env, ["--download-streams", "1"])
    found[f"the download alone ({DEFAULT_DOWNLOAD_STREAMS} streams, one file at a time)"] = (DOWNLOAD_ONLY, env, [])
    if tree:
        found["org/name, base tree"] = (REPO, {**env, "PYTHONPATH": tree}, [])
    return found


def measure(base: Path, endpoint: str, server: int, args) -> None:
    total = sum(p.stat().st_size for p in (base / "repo").glob("*.safetensors"))
    runs = cases(base, endpoint, args.base_tree, args.streams or [DEFAULT_DOWNLOAD_STREAMS], not args.no_single)
    walls: dict[str, list[float]] = {name: [] for name in runs}
    phases: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
    reference = None
    for name, (source, env, extra) in runs.items():  # warm-up, not counted: numba's cache of each tree
        if source == str(base / "repo") or name.endswith("base tree"):
            convert_once(str(base / "repo"), base / "out", env, extra)
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    for run in range(args.runs):
        for name, (source, env, extra) in runs.items():
            cpu, served = children_cpu(), cpu_of(server)
            wall, got, phase = convert_once(source, base / "out", env, extra, server)
            phases[name] += [phase] if phase else []
            cpu, served = children_cpu() - cpu, cpu_of(server) - served
            reference = reference or got
            same = "-" if got is None else "identical" if got == reference else "DIFFERENT"
            walls[name].append(wall)
            print(f"run {run + 1} {name}: wall {wall:6.2f} s, CPU {cpu:5.2f} s, the server's CPU {served:5.2f} s, "
                  f"output {same}, load {os.getloadavg()[0]:.1f}{phases_text([phase] if phase else [])}",
                  flush=True)  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    link = total / (args.link_mb * MB)
    local = statistics.median(walls["local folder"])
    print(f"checkpoint {total / MB:.0f} MB in {args.shards} shards, {args.rate_mb:g} MB/s per connection, link "
          f"{args.link_mb:g} MB/s: link-bound {link:.2f} s, one stream per shard's bound "
          f"{total / (args.rate_mb * MB):.1f} s")  # fmt: skip
    goal = max(link, local)
    for name, w in walls.items():
        med = statistics.median(w)
        print(f"{name}: median {med:6.2f} s (min {min(w):.2f}, max {max(w):.2f}), "
              f"{med / goal:.2f} x max(link-bound, local conversion){phases_text(phases[name])}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--mib", type=int, default=120)
    parser.add_argument("--rate-mb", type=float, default=25.0, help="per connection, MB/s")
    parser.add_argument("--link-mb", type=float, default=200.0, help="all connections together, MB/s")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--base-tree", help="a checkout to time as well (PYTHONPATH)")
    parser.add_argument("--streams", type=int, nargs="+", help="org/name with these --download-streams counts")
    parser.add_argument("--no-single", action="store_true", help="leave out org/name with one stream per shard")
    parser.add_argument("--serve", action="store_true", help="serve the checkpoint until stdin closes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="colitools-bench-ahead-", dir=args.dir) as tmp:
        base = Path(tmp)
        sys.path.insert(0, str(ROOT / "tests" / "converters"))
        make_model(base / "repo", args.shards, args.mib)
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(ROOT / "tests" / "converters"), REPO, str(base / "repo"),
             str(args.rate_mb * MB), str(args.link_mb * MB)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            endpoint = server.stdout.readline().strip()
            if args.serve:
                print(f"HF_ENDPOINT={endpoint} repo {REPO} folder {base / 'repo'}", flush=True)
                sys.stdin.read()
            else:
                measure(base, endpoint, server.pid, args)
        finally:
            server.stdin.close()
            server.wait(30)


if __name__ == "__main__":
    main()
