"""A size budget's allocation at full scale (issue 41): ``convert --target-bpw --dry-run`` on ``bench/plan.py``'s
DeepSeek-R1 skeleton (163 shards, 91,991 tensors, FP8 weights), its measurements already cached.

Measuring a 690 GB source is the conversion's own order of cost and a skeleton's data is holes (zeros): what this
measures is everything else a budget adds, the part that would not shrink with a faster encoder. The run a user
makes for a second budget (the cache is kept, its key has no budget):

1. the skeleton (``bench/plan.py make_skeleton``, under ``--workdir``);
2. the measurement cache ``OUTDIR/.colitools-budget.json`` (``converters/budget.py`` ``CACHE_FILE``) written here:
   every budgeted tensor's candidates as the conversion offers them (``budget._offered``: the recipe asked once
   per candidate option) with their real written bytes, and a **synthetic** squared error per candidate,
   ``n * 4^-bits`` times a seeded log-normal factor (sigma 0.5): the solver's work does not depend on the values;
3. ``colitools convert SKELETON OUTDIR --target-bpw B --dry-run --json`` as a child process (wall, CPU seconds,
   peak RSS: ``bench/convert.py`` ``run_process``), against the peer measured in the same run: the same dry run
   without a budget (planning alone).

Run: ``.venv/bin/python bench/budget_scale.py [--workdir /tmp/colitools-bench-plan] [--bpw 4.5] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from convert import run_process  # noqa: E402
from plan import make_skeleton  # noqa: E402


def write_cache(skeleton: Path, out: Path, bpw: float, seed: int = 0) -> dict:
    """The measurement cache a measured run would leave in ``out`` for ``--target-bpw bpw`` (synthetic errors,
    real bytes and keys); returns its counts and the seconds the candidates' planning took."""
    from colitools.converters import budget
    from colitools.converters.inventory import build_inventory, read_source_headers
    from colitools.converters.options import ConvertOptions
    from colitools.converters.sources import LocalFolderSource
    from colitools.formats.atomic import write_json_atomic
    from colitools.formats.layouts import PLANAR

    t0 = time.perf_counter()
    src = LocalFolderSource(skeleton)
    weight_map = src.weight_map()
    shards = sorted(set(weight_map.values()))
    files = src.files()
    inventory = build_inventory(read_source_headers(src, shards), weight_map, src.read_json("config.json"),
                                {s: files[s].size for s in shards})  # fmt: skip
    recipe, _ = ConvertOptions(target_bpw=bpw, progress=False).source_recipe(inventory)
    recipe = replace(recipe, budget=replace(recipe.budget, usage=None))
    rng = np.random.default_rng(seed)
    tensors, options = {}, 0
    planar = recipe.layout == PLANAR.option
    for _, src_t, role in budget._budget_sources(inventory, recipe):
        for rname, _job, offered in budget._offered(src_t, role, recipe, inventory):
            if len(offered) < 2:
                continue
            entry = {}
            for option, j in offered.items():
                nbytes = budget.written_bytes(j, planar and role is budget.rc.Role.EXPERT)
                bits = 8 * nbytes / max(j.O * j.I, 1)
                entry[option] = [nbytes, j.O * j.I * math.pow(4.0, -bits) * float(rng.lognormal(0.0, 0.5))]
            tensors[rname] = entry
            options += len(entry)
    key = budget.cache_key(src, inventory, recipe)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / budget.CACHE_FILE, {"version": budget.CACHE_VERSION, "key": key, "tensors": tensors})
    return {"tensors": len(tensors), "options": options, "seconds": round(time.perf_counter() - t0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/colitools-bench-plan"))
    ap.add_argument("--bpw", type=float, default=4.5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    skeleton = make_skeleton(args.workdir / "deepseek-r1-skeleton")
    out = args.workdir / "out-budget"
    shutil.rmtree(out, ignore_errors=True)
    cache = write_cache(skeleton, out, args.bpw)
    exe = [sys.executable, "-m", "colitools", "convert", str(skeleton), str(out), "--dry-run", "--json"]
    plain = run_process(exe)
    budgeted = run_process([*exe, "--target-bpw", str(args.bpw)])
    b = json.loads(budgeted.pop("stdout"))["budget"]
    plain.pop("stdout")
    report = {
        "tensors_in_cache": cache["tensors"], "candidates": cache["options"], "cache_written_s": cache["seconds"],
        "budget_bytes": b["budget_bytes"], "achieved_bytes": b["achieved_bytes"],
        "achieved_over_budget": round(b["achieved_bytes"] / b["budget_bytes"], 6),
        "measured": b["measurement"]["measured"], "cached": b["measurement"]["cached"],
        "dry_run_plain": {k: round(v, 2) for k, v in plain.items()},
        "dry_run_budget": {k: round(v, 2) for k, v in budgeted.items()},
        "load": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
