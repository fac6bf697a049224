"""Size budgets at equal bytes (docs/FORMATS.md §12): ``convert --target-size`` against the uniform recipe of the
same size, on oracle fixtures.

For each fixture (``--fixtures``, default olmoe, qwen3_moe, mixtral) and each uniform format (``--formats``,
default int3-g64 and int4-g64 for every role: experts, dense, embeddings, MTP): the uniform conversion gives the
budget (its ``metadata.total_size``); the same source is then converted with ``target_size`` = that size. Both
are compared by their size, their total squared error (sum of the manifest's per-tensor ``sse``, the objective
with every importance 1) and their mean KLD against the source (``verify.kld.model_kld``: the all-f32 conversion
run by the same runtime, teacher-forced over a fixed seeded random sequence of ``--tokens`` ids, as bench/kld.py).

Run: ``.venv/bin/python bench/budget.py`` [--fixtures ... --formats ... --tokens 256 --seed 0 --json FILE].
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("experts", "dense", "embed", "mtp")


def total_size(folder: Path) -> int:
    return json.loads((folder / "model.safetensors.index.json").read_text())["metadata"]["total_size"]


def total_sse(folder: Path) -> float:
    """The sum of every written tensor's squared error, as the conversion recorded it (colitools.json)."""
    units = json.loads((folder / "colitools.json").read_text())["units"]
    return sum(e[1] for u in units.values() for e in u.get("errors", {}).values())


def run_case(fixture: str, fmt: str, ids: list[int], work: Path) -> dict:
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert
    from colitools.verify.kld import model_kld

    src = ROOT / "oracles" / fixture
    uniform, budgeted = work / f"{fixture}-{fmt}", work / f"{fixture}-{fmt}-budget"
    convert(str(src), uniform, ConvertOptions(**dict.fromkeys(ROLES, fmt), progress=False))
    size = total_size(uniform)
    summary = convert(str(src), budgeted, ConvertOptions(target_size=size, progress=False))
    row = {"fixture": fixture, "uniform": fmt, "budget_bytes": size, "achieved_bytes": total_size(budgeted)}
    row["uniform_sse"], row["budget_sse"] = total_sse(uniform), total_sse(budgeted)
    row["uniform_kld"] = model_kld(str(src), uniform, ids, workdir=work).mean_kld
    row["budget_kld"] = model_kld(str(src), budgeted, ids, workdir=work).mean_kld
    row["formats"] = {r["role"]: sorted(r["formats"]) for r in summary.budget["per_role_layer"]}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", nargs="+", default=["olmoe", "qwen3_moe", "mixtral"])
    ap.add_argument("--formats", nargs="+", default=["int3-g64", "int4-g64"])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp:
        for fixture in a.fixtures:
            vocab = json.loads((ROOT / "oracles" / fixture / "config.json").read_text())["vocab_size"]
            ids = [int(t) for t in np.random.default_rng(a.seed).integers(0, vocab, a.tokens)]
            for fmt in a.formats:
                rows.append(run_case(fixture, fmt, ids, Path(tmp)))
                r = rows[-1]
                print(
                    f"| {fixture} | {fmt} | {r['budget_bytes']} | {r['achieved_bytes']} | {r['uniform_sse']:.4g} | "
                    f"{r['budget_sse']:.4g} | {r['uniform_kld']:.5f} | {r['budget_kld']:.5f} | "
                    f"{(1 - r['budget_kld'] / r['uniform_kld']) * 100:+.1f}% |",
                    flush=True,
                )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
