"""Size budgets at equal bytes (docs/FORMATS.md §12): ``convert --target-size`` against the uniform recipe of the
same size, on oracle fixtures.

For each fixture (``--fixtures``, default olmoe, qwen3_moe, mixtral, deepseek_v3, glm4_moe) and each uniform format (``--formats``,
default int3-g64 and int4-g64 for every role: experts, dense, embeddings, MTP; ``default``: the default recipe,
int4-g64 experts and int8-row the rest): the uniform conversion gives the budget (its ``metadata.total_size``);
the same source is then converted with ``target_size`` = that size. Both are compared by their size, the
budget's objective on what each conversion recorded (sum of importance x the manifest's per-tensor ``sse``) and
their mean KLD against the source (``verify.kld.model_kld``: the all-f32 conversion
run by the same runtime, teacher-forced over a fixed seeded random sequence of ``--tokens`` ids, as bench/kld.py).

With ``--usage``, a third conversion at the same size weights the routed experts by a routing history the
runtime recorded (``colitools run``'s ``.coli_usage``) on held-out prompt ids (seed + 1000, unlike the evaluation's).

Run: ``.venv/bin/python bench/budget.py`` [--fixtures ... --formats ... --tokens 256 --seed 0 --usage --json FILE].
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


def weighted_error(folder: Path, importance: dict[str, float]) -> float:
    """The budget's objective on what a conversion recorded: sum of importance x squared error."""
    units = json.loads((folder / "colitools.json").read_text())["units"]
    errors = {name: e[1] for u in units.values() for name, e in u.get("errors", {}).items()}
    return sum(importance[n] * e for n, e in errors.items() if n in importance)


def total_sse(folder: Path) -> float:
    """The sum of every written tensor's squared error, as the conversion recorded it (colitools.json)."""
    units = json.loads((folder / "colitools.json").read_text())["units"]
    return sum(e[1] for u in units.values() for e in u.get("errors", {}).values())


def held_out_usage(fixture: str, ids: list[int], work: Path) -> Path:
    """A routing history recorded by the runtime (``colitools run``'s ``.coli_usage``) on held-out prompt ids
    (another seed than the evaluation's), generating 32 tokens after them, on the default-recipe conversion."""
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert
    from colitools.formats.filenames import USAGE_FILE
    from colitools.runtime.run import run_model

    folder = work / f"{fixture}-usage"
    convert(str(ROOT / "oracles" / fixture), folder, ConvertOptions(progress=False))
    run_model(folder, prompt_ids=ids, max_new_tokens=32, record_usage=True, stop_at_eos=False)
    return folder / USAGE_FILE


def run_case(fixture: str, fmt: str, ids: list[int], work: Path, usage: Path | None = None) -> dict:
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert
    from colitools.verify.kld import model_kld

    src = ROOT / "oracles" / fixture
    uniform, budgeted = work / f"{fixture}-{fmt}", work / f"{fixture}-{fmt}-budget"
    recipe = {} if fmt == "default" else dict.fromkeys(ROLES, fmt)
    convert(str(src), uniform, ConvertOptions(**recipe, progress=False))
    size = total_size(uniform)
    convert(str(src), budgeted, ConvertOptions(target_size=size, progress=False))
    report = json.loads((budgeted / "colitools.json").read_text())["budget"]
    imp = {name: t["importance"] for name, t in report["tensors"].items()}
    row = {"fixture": fixture, "uniform": fmt, "budget_bytes": size, "achieved_bytes": total_size(budgeted)}
    row["uniform_error"], row["budget_error"] = weighted_error(uniform, imp), weighted_error(budgeted, imp)
    row["uniform_kld"] = model_kld(str(src), uniform, ids, workdir=work).mean_kld
    row["budget_kld"] = model_kld(str(src), budgeted, ids, workdir=work).mean_kld
    row["formats"] = {r["role"]: sorted(r["formats"]) for r in report["per_role_layer"]}
    if usage is not None:
        with_usage = work / f"{fixture}-{fmt}-budget-usage"
        convert(str(src), with_usage, ConvertOptions(target_size=size, usage=str(usage), progress=False))
        row["usage_achieved_bytes"] = total_size(with_usage)
        row["usage_kld"] = model_kld(str(src), with_usage, ids, workdir=work).mean_kld
    return row


def importance_case(fixture: str, degraded: str, ids: list[int], work: Path) -> dict[str, float]:
    """Per role: the mean KLD one role costs per unit of its squared error, ``(KLD(role at degraded, the rest
    int8-row) - KLD(all int8-row)) / (its squared error's increase)`` (bench/README.md, "Role importances")."""
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert
    from colitools.verify.kld import model_kld

    src = ROOT / "oracles" / fixture
    base = work / f"{fixture}-imp-base"
    convert(str(src), base, ConvertOptions(**dict.fromkeys(ROLES, "int8-row"), progress=False))
    base_kld, base_sse = model_kld(str(src), base, ids, workdir=work).mean_kld, total_sse(base)
    out = {}
    for role in ("experts", "dense", "embed"):
        folder = work / f"{fixture}-imp-{role}"
        convert(str(src), folder, ConvertOptions(**{**dict.fromkeys(ROLES, "int8-row"), role: degraded},
                                                 progress=False))  # fmt: skip
        kld = model_kld(str(src), folder, ids, workdir=work).mean_kld
        out[role] = (kld - base_kld) / (total_sse(folder) - base_sse)
    return out


def importances(fixtures: list[str], degraded: str, tokens: int, seed: int) -> None:
    """Print each fixture's KLD per unit of squared error per role, normalised to the routed experts', and their
    geometric mean over the fixtures."""
    logs: dict[str, list[float]] = {"experts": [], "dense": [], "embed": []}
    with tempfile.TemporaryDirectory(prefix="bench-budget-imp-") as tmp:
        for fixture in fixtures:
            vocab = json.loads((ROOT / "oracles" / fixture / "config.json").read_text())["vocab_size"]
            ids = [int(t) for t in np.random.default_rng(seed).integers(0, vocab, tokens)]
            per = importance_case(fixture, degraded, ids, Path(tmp))
            rel = {r: v / per["experts"] for r, v in per.items()}
            for r, v in rel.items():
                logs[r].append(float(np.log(max(v, 1e-12))))
            print(f"| {fixture} | " + " | ".join(f"{per[r]:.3g} ({rel[r]:.3g})" for r in logs) + " |", flush=True)
    print("| geometric mean | " + " | ".join(f"{np.exp(np.mean(v)):.3g}" for v in logs.values()) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", nargs="+", default=["olmoe", "qwen3_moe", "mixtral", "deepseek_v3", "glm4_moe"])
    ap.add_argument("--formats", nargs="+", default=["int3-g64", "int4-g64", "default"])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--usage", action="store_true", help="also convert with a routing history recorded by the "
                    "runtime on held-out prompt ids (seed + 1000)")  # fmt: skip
    ap.add_argument("--importance", metavar="FORMAT", help="measure the role importances instead (degrading one "
                    "role at a time to FORMAT, the others int8-row)")  # fmt: skip
    a = ap.parse_args(argv)
    if a.importance:
        importances(a.fixtures, a.importance, a.tokens, a.seed)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp:
        for fixture in a.fixtures:
            vocab = json.loads((ROOT / "oracles" / fixture / "config.json").read_text())["vocab_size"]
            ids = [int(t) for t in np.random.default_rng(a.seed).integers(0, vocab, a.tokens)]
            held = [int(t) for t in np.random.default_rng(a.seed + 1000).integers(0, vocab, a.tokens)]
            usage = held_out_usage(fixture, held, Path(tmp)) if a.usage else None
            for fmt in a.formats:
                rows.append(run_case(fixture, fmt, ids, Path(tmp), usage))
                r = rows[-1]
                with_usage = f" {r['usage_kld']:.5f} |" if usage is not None else ""
                print(
                    f"| {fixture} | {fmt} | {r['budget_bytes']} | {r['achieved_bytes']} | {r['uniform_error']:.4g} | "
                    f"{r['budget_error']:.4g} | {r['uniform_kld']:.5f} | {r['budget_kld']:.5f} | "
                    f"{(1 - r['budget_kld'] / r['uniform_kld']) * 100:+.1f}% |{with_usage}",
                    flush=True,
                )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
