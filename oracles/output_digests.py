"""Print the sha256 of every file a conversion writes, for every oracle fixture x recipe (a refactoring guard).

    .venv/bin/python oracles/output_digests.py > before.json      # on the old code
    .venv/bin/python oracles/output_digests.py --compare before.json

``colitools.json`` is left out (it records wall-clock times); everything else (shards, index, config, copied
files, planar sidecars) is listed by its path relative to the output folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ORACLES = Path(__file__).resolve().parent


def digests() -> dict[str, dict[str, str]]:
    from colitools.converters.runner import convert
    from colitools.verify.oracle import convert_options, fixture_recipes, load_reference

    out: dict[str, dict[str, str]] = {}
    for fixture in sorted(p for p in ORACLES.iterdir() if (p / "reference").is_dir()):
        for recipe in fixture_recipes(fixture):
            with tempfile.TemporaryDirectory(prefix="colitools-digest-") as tmp:
                dest = Path(tmp) / "out"
                convert(str(fixture), dest, convert_options(load_reference(fixture, recipe)))
                out[f"{fixture.name}/{recipe}"] = {
                    str(p.relative_to(dest)): hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in sorted(dest.rglob("*"))
                    if p.is_file() and p.name != "colitools.json"
                }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", type=Path, help="a JSON file printed by an earlier run")
    args = ap.parse_args()
    now = digests()
    if args.compare is None:
        json.dump(now, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    before = json.loads(args.compare.read_text())
    diff = [k for k in sorted(set(before) & set(now)) if before[k] != now[k]]
    new = sorted(set(now) - set(before))  # fixtures added since (not a difference)
    gone = sorted(set(before) - set(now))
    files = sum(len(v) for v in now.values())
    for k in diff:
        print(f"DIFFERENT: {k}")
    for k in gone:
        print(f"MISSING: {k}")
    for k in new:
        print(f"NEW: {k}")
    print(f"{len(now)} fixture x recipe outputs, {files} files: {len(diff)} different, {len(gone)} missing, "
          f"{len(new)} new")
    return 1 if diff or gone else 0


if __name__ == "__main__":
    sys.exit(main())
