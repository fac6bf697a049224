"""``convert --part K/N`` on N processes + ``colitools merge`` against one machine's ``convert``, from the tests'
fake Hub (issue 42): each part's download bytes per shard from the server's log, and byte identity.

``.venv/bin/python bench/parts.py [--parts 3] [--layers 12] [--hidden 512] [--shards 6] [--dir /tmp]``: generates a
BF16 MoE checkpoint (``tests/converters/tinyckpt.py``), serves it from ``tests/converters/hubserver.py`` (in this
process: the figures here are bytes, not speed), converts it once whole (``colitools convert org/name OUT``, a
process), then each part alone (``--part k/N``, a process each, the server's counters reset before each) and
merges them (``colitools merge``). Prints per part: its units, the source bytes its units read (the share rule's
measure), each shard's body bytes served to it (the header reads, 100 001 bytes of every shard at planning, are
counted apart), then the total fetched against N x the whole model, the walls, and whether every output file and
``colitools.json`` without ``run`` equal the whole conversion's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "converters"))
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
CLI = [str(Path(sys.executable).with_name("colitools"))]
HEADER_READ = (0, 100_001)  # huggingface_hub's parse_safetensors_file_metadata asks for these first


def run(*args: str, env: dict[str, str]) -> float:
    t = time.monotonic()
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env)
    if result.returncode:
        raise SystemExit(f"{' '.join(args)}: exit {result.returncode}\n{result.stderr}")
    return time.monotonic() - t


def digests(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "colitools.json":
                manifest = json.loads(data)
                manifest.pop("run")
                data = json.dumps(manifest, sort_keys=True).encode()
            out[str(p.relative_to(folder))] = hashlib.sha256(data).hexdigest()
    return out


def lpt(units: list[dict], n: int) -> list[int]:
    """Longest-processing-time: units by (source bytes desc, name), each to the part with the fewest bytes so far
    (the lowest index on a tie). The rule docs/INTERNALS.md ("Parts") compares the midpoint rule with."""
    load, part = [0] * n, {}
    for u in sorted(units, key=lambda u: (-u["in_bytes"], u["unit"])):
        k = min(range(n), key=lambda i: (load[i], i))
        load[k] += u["in_bytes"]
        part[u["unit"]] = k + 1
    return [part[u["unit"]] for u in units]


def compare_rules(units: list[dict], sizes: dict[str, int], n: int) -> None:
    """Per rule: the largest part's source bytes over an equal share, and the shard bytes all parts fetch."""
    from colitools.converters.parts import assign

    for name, parts in (
        ("midpoint (ours)", assign([u["in_bytes"] for u in units], n)),
        ("LPT", lpt(units, n)),
    ):
        loads = [
            sum(u["in_bytes"] for u, k in zip(units, parts, strict=True) if k == p) for p in range(1, n + 1)
        ]
        fetch = sum(sizes[s] for p in range(1, n + 1)
                    for s in {s for u, k in zip(units, parts, strict=True) if k == p for s in u["shards"]})  # fmt: skip
        print(f"  {name:<16} largest part {max(loads) / (sum(loads) / n):.3f} x an equal share, fetched "
              f"{fetch:,} bytes = {fetch / sum(sizes.values()):.2f} x the model")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--shards", type=int, default=6)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    from hubserver import HubServer
    from tinyckpt import Tiny, make_checkpoint

    work = Path(tempfile.mkdtemp(prefix="bench-parts-", dir=a.dir))
    src = work / "src"
    make_checkpoint(
        src, Tiny(layers=a.layers, experts=8, hidden=a.hidden, inter=a.hidden // 2, shards=a.shards)
    )
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    sizes = {s: (src / s).stat().st_size for s in shards}
    hub = HubServer({"bench/model": {"main": src}}).start()
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "0"}
    flags = ("--min-free-gb", "0", "--no-progress")
    try:
        print(f"model: {len(shards)} shards, {sum(sizes.values()):,} bytes; {a.parts} parts")
        whole_wall = run("convert", "bench/model", str(work / "whole"), *flags, env=env)
        dry = subprocess.run([*CLI, "convert", "bench/model", str(work / "dry"), "--dry-run", "--json", *flags],
                             capture_output=True, text=True, env=env)  # fmt: skip
        print(f"the share rules on this plan ({a.parts} parts):")
        compare_rules(json.loads(dry.stdout)["plan"]["units"], sizes, a.parts)
        folders = [work / f"part{k}" for k in range(1, a.parts + 1)]
        fetched_total, walls = 0, []
        for k, folder in enumerate(folders, 1):
            hub.reset_stats()
            walls.append(
                run("convert", "bench/model", str(folder), "--part", f"{k}/{a.parts}", *flags, env=env)
            )
            section = json.loads((folder / "colitools.json").read_text())["part"]
            got = {s: [hub.stats(s).ranges.count(HEADER_READ), 0] for s in shards}
            for s in shards:
                got[s][1] = sum(e - b for b, e in hub.stats(s).ranges if (b, e) != HEADER_READ)
            fetched = sum(v[1] for v in got.values())
            fetched_total += fetched
            dry = subprocess.run([*CLI, "convert", "bench/model", str(work / "dry"), "--part", f"{k}/{a.parts}",
                                  "--dry-run", "--json", *flags], capture_output=True, text=True, env=env)  # fmt: skip
            in_bytes = json.loads(dry.stdout)["part"]["in_bytes"]
            print(f"part {k}/{a.parts}: units {section['units'][0]} .. {section['units'][-1]} "
                  f"({len(section['units'])}), source bytes its units read {in_bytes:,}, wall {walls[-1]:.1f} s, "
                  f"fetched {fetched:,} bytes")  # fmt: skip
            for s, (heads, body) in got.items():
                print(
                    f"    {s}: {body:>12,} of {sizes[s]:,}" + (f"  (+{heads} header read)" if heads else "")
                )
        t = time.monotonic()
        run("merge", *map(str, folders), str(work / "merged"), "--json", env=env)
        merge_wall = time.monotonic() - t
        same = digests(work / "merged") == digests(work / "whole")
        total = sum(sizes.values())
        print(f"fetched by the {a.parts} parts together: {fetched_total:,} bytes = {fetched_total / total:.2f} x the "
              f"model (every part fetching every shard: {a.parts:.2f} x)")  # fmt: skip
        print(f"walls: whole {whole_wall:.1f} s; parts {', '.join(f'{w:.1f}' for w in walls)} s (one after "
              f"another); merge {merge_wall:.2f} s")  # fmt: skip
        print(f"merged == whole, byte for byte (colitools.json without run): {same}")
    finally:
        hub.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
