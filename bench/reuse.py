"""A second budget costs only what changed (``convert --replace``, converters/reuse.py, docs/FORMATS.md §10).

A generated BF16 MoE checkpoint (``tests/converters/tinyckpt.py``; default 6 layers x 16 experts, hidden 2048,
expert width 1024, vocabulary 32000, 4 shards: 1.7 GB) is converted with a first budget (``--target-bpw A``)
into OUT; then, the peer measured in the same run, the second budget (``--target-bpw B``) is converted

* fresh into another folder (the measurement pass included: what a user without ``--replace`` runs),
* fresh into another folder holding the measurement cache already (the conversion alone),
* with ``--replace`` into OUT (the measurement cache is OUT's: the budget is not part of its key).

Each is a whole ``colitools convert`` process (wall and CPU seconds, peak RSS: ``bench/convert.py``'s
``run_process``). Reported: how many tensors the two allocations give another format, how many ``--replace``
copied, how many files it kept in place (the same inode: not rewritten), the times and their ratios, and whether the replaced output is byte-identical to the fresh one (every
file; ``colitools.json`` but its ``run`` section and the budget's measurement figures).

Run: ``.venv/bin/python bench/reuse.py`` [--bpw-a 4.5 --bpw-b 4.55 --layers 6 --experts 16 --hidden 2048 --inter 1024
--workdir DIR --json FILE].
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "converters"))

from convert import run_process  # noqa: E402

CACHE = ".colitools-budget.json"
MANIFEST = "colitools.json"


def _convert(src: Path, out: Path, bpw: float, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--target-bpw", str(bpw), "--json",
           *extra]  # fmt: skip
    r = run_process(cmd)
    r["summary"] = json.loads(r.pop("stdout"))
    return r


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST}  # fmt: skip


def _manifest(folder: Path) -> dict:
    data = json.loads((folder / MANIFEST).read_text())
    data.pop("run", None)
    data.get("budget", {}).pop("measurement", None)
    return data


def _formats(folder: Path) -> dict[str, str]:
    return {t: v["format"] for t, v in json.loads((folder / MANIFEST).read_text())["budget"]["tensors"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bpw-a", type=float, default=4.5)
    ap.add_argument("--bpw-b", type=float, default=4.55)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=1024)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from tinyckpt import Tiny, make_checkpoint

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-reuse-"))
    src = work / "source"
    if not (src / "config.json").is_file():
        spec = Tiny(layers=args.layers, experts=args.experts, hidden=args.hidden, inter=args.inter, vocab=32000,
                    shards=4)  # fmt: skip
        make_checkpoint(src, spec)
    for name in ("out", "fresh", "fresh-cached"):
        shutil.rmtree(work / name, ignore_errors=True)
    first = _convert(src, work / "out", args.bpw_a)
    fresh = _convert(src, work / "fresh", args.bpw_b)
    (work / "fresh-cached").mkdir()
    shutil.copy(work / "out" / CACHE, work / "fresh-cached" / CACHE)
    cached = _convert(src, work / "fresh-cached", args.bpw_b)
    before = _formats(work / "out")
    inodes = {p.name: p.stat().st_ino for p in (work / "out").glob("*.safetensors")}
    replaced = _convert(src, work / "out", args.bpw_b, "--replace")
    kept = sum((work / "out" / n).stat().st_ino == i for n, i in inodes.items() if (work / "out" / n).exists())
    after = _formats(work / "fresh")
    changed = sum(before[t] != after[t] for t in after)
    written = sum(len(u.get("keys", {})) for u in json.loads((work / "fresh" / MANIFEST).read_text())["units"].values())
    identical = _files(work / "out") == _files(work / "fresh") and _manifest(work / "out") == _manifest(work / "fresh")
    report = {
        "source_bytes": sum(p.stat().st_size for p in src.glob("*.safetensors")),
        "bpw": [args.bpw_a, args.bpw_b],
        "tensors_written": written,
        "budget_tensors": len(after),
        "format_changed": changed,
        "copied": replaced["summary"]["tensors_copied"],
        "files_kept_in_place": kept, "files": len(inodes),
        "runs": {k: {x: round(v[x], 2) for x in ("wall", "cpu", "rss_mb", "load")}
                 for k, v in (("first", first), ("fresh", fresh), ("fresh_cached", cached), ("replace", replaced))},
        "byte_identical": identical,
    }  # fmt: skip
    r = report["runs"]
    report["replace_over_fresh_wall"] = round(r["replace"]["wall"] / r["fresh"]["wall"], 3)
    report["replace_over_fresh_cached_wall"] = round(r["replace"]["wall"] / r["fresh_cached"]["wall"], 3)
    report["replace_over_fresh_cached_cpu"] = round(r["replace"]["cpu"] / r["fresh_cached"]["cpu"], 3)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
