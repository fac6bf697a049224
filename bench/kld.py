"""Model-level quality of the expert formats: KL divergence of converted oracle models against their source.

For each oracle family (``--fixtures``, default olmoe, qwen3_moe, deepseek_v3, gpt_oss, qwen3_vl_moe) the source
is converted once with the all-f32 recipe (``verify.kld.F32_RECIPE``: the reference, run by the same runtime) and
then once per expert format x quantizer, the other roles at their defaults (int8-row dense and embeddings: the
``f32`` experts row is what those alone cost) or, with ``--other-roles f32``, in f32 (only the experts
quantized). Each conversion is run teacher-forced over the same tokens and compared with the reference by
``verify.kld.kld_stats`` (the statistics of ``llama-perplexity --kl-divergence``, defined in verify/kld.py):
mean and 99th-percentile KLD, top-1 agreement and the converted model's perplexity on the next tokens.
``written`` is what the routed experts became (the summary's ``formats_per_role``): a group as wide as the row is
written as int4-row, so at the oracles' expert input widths (64; 128 for qwen3_vl_moe's ``down_proj``) int4-g64
and int4-g128 are mostly int4-row.

Tokens: a fixed seeded random sequence (``numpy.random.default_rng(--seed).integers(0, vocab, --tokens)``, 256
by default, the same for every conversion of a fixture). The oracles' own references carry only 40-44 tokens
(prompt + greedy continuation), too few positions for a mean; the models are random (init std 0.2) either way, so
no text is more natural to them than another. Their KLD values are therefore large-ish and their perplexities
near or above the vocabulary size: compare formats and quantizers by ratios, not against published numbers.

Quantizers: ``rtn`` (round to nearest), and ``mse`` when ``ConvertOptions`` has the ``quantizer`` field
(``colitools convert --quantizer``: it chooses the scales of every int8-row / int4 / int3 / int2 tensor, the
default int8-row dense and embeddings included; mxfp4 and f32 are unchanged by it). ``bytes`` is the converted
folder's shard bytes, the same for every quantizer of a format (checked): rtn and mse compare at identical size.

Run: ``.venv/bin/python bench/kld.py`` [--fixtures olmoe qwen3_moe ... --formats int4-g64 ... --tokens 256
--seed 0 --quantizers rtn mse --other-roles default|f32 --json FILE]. About a second per conversion on the
oracles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.runtime.config import ModelArgs
from colitools.verify.kld import F32_RECIPE, kld_stats, teacher_forced_logits

ORACLES = Path(__file__).resolve().parents[1] / "oracles"
FIXTURES = ("olmoe", "qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_vl_moe")
# f32 experts first: the divergence the other roles' default formats (int8-row) cause on their own
FORMATS = (
    "f32",
    "int8-row",
    "int4-g32",
    "int4-g64",
    "int4-g128",
    "int4-row",
    "mxfp4",
    "int3-g64",
    "int2-row",
)
# the encoder modes `convert` offers: rtn always, mse once ConvertOptions carries `quantizer`
HAS_QUANTIZER = "quantizer" in {f.name for f in dataclasses.fields(ConvertOptions)}
QUANTIZERS = ("rtn", "mse") if HAS_QUANTIZER else ("rtn",)


def options(experts: str, quantizer: str, other_roles: str) -> ConvertOptions:
    extra = {"quantizer": quantizer} if HAS_QUANTIZER else {}
    if other_roles == "f32":  # only the experts quantized: the quantizer's effect on them alone
        extra.update({k: v for k, v in F32_RECIPE.items() if k != "experts"})
    return ConvertOptions(experts=experts, **extra, progress=False, min_free_gb=0.0)


def expert_formats(summary) -> str:
    """What the experts were written as (a format the tensors cannot take falls back, e.g. int4-g128 at I = 64)."""
    per_role = summary.formats_per_role.get("routed experts") or {}
    return ", ".join(f"{name} x{n}" for name, n in sorted(per_role.items())) or "?"


def bench_fixture(
    fixture: str, formats, quantizers, n_tokens: int, seed: int, other_roles: str, work: Path
) -> dict:
    source = ORACLES / fixture
    vocab = ModelArgs.from_dir(source).vocab_size
    ids = [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n_tokens)]
    ref_dir = work / f"{fixture}-f32"
    convert(str(source), ref_dir, ConvertOptions(**F32_RECIPE, progress=False, min_free_gb=0.0))
    ref = teacher_forced_logits(ref_dir, ids)
    out = {"fixture": fixture, "tokens": len(ids), "vocab": vocab, "other_roles": other_roles, "rows": []}
    for fmt in formats:
        row = {"experts": fmt}
        for q in quantizers:
            dest = work / f"{fixture}-{fmt}-{q}"
            summary = convert(str(source), dest, options(fmt, q, other_roles))
            r = kld_stats(ref, teacher_forced_logits(dest, ids), ids)
            if "bytes" in row and row["bytes"] != summary.total_out_bytes:
                raise SystemExit(
                    f"{fixture} {fmt}: {q} wrote {summary.total_out_bytes} bytes, not {row['bytes']}"
                )
            row["bytes"], row["written"] = summary.total_out_bytes, expert_formats(summary)
            row[q] = r.to_json()
            out["ppl_ref"] = r.ppl_ref
            shutil.rmtree(dest)
        out["rows"].append(row)
        print(f"  {fixture} {fmt}: " + "  ".join(f"{q} KLD {row[q]['mean_kld']:.5f}" for q in quantizers),
              file=sys.stderr, flush=True)  # fmt: skip
    return out


def table(result: dict, quantizers) -> list[str]:
    head = ["experts", "written", "bytes"]
    for q in quantizers:
        head += [f"{q} mean KLD", f"{q} p99 KLD", f"{q} top-1", f"{q} PPL"]
    if "rtn" in quantizers and len(quantizers) > 1:
        head += [f"{q}/rtn KLD" for q in quantizers if q != "rtn"]
    lines = [
        f"**{result['fixture']}** ({result['tokens']} tokens, vocab {result['vocab']}, other roles "
        f"{result['other_roles']}, "
        f"PPL of the f32 source {result['ppl_ref']:.1f})",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in result["rows"]:
        cells = [row["experts"], row["written"], f"{row['bytes']:,}"]
        for q in quantizers:
            r = row[q]
            cells += [
                f"{r['mean_kld']:.5f}",
                f"{r['p99_kld']:.4f}",
                f"{r['top1_agreement']:.3f}",
                f"{r['ppl_test']:.1f}",
            ]
        if "rtn" in quantizers and len(quantizers) > 1:
            base = row["rtn"]["mean_kld"]
            cells += [
                f"{row[q]['mean_kld'] / base:.3f}" if base > 0 else "-" for q in quantizers if q != "rtn"
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixtures", nargs="+", default=list(FIXTURES))
    p.add_argument("--formats", nargs="+", default=list(FORMATS))
    p.add_argument("--quantizers", nargs="+", default=list(QUANTIZERS), choices=["rtn", "mse"])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument(
        "--other-roles",
        choices=["default", "f32"],
        default="default",
        help="dense / embed / mtp at their default formats (int8-row), or f32: only the experts quantized",
    )
    p.add_argument("--json", dest="json_out", default=None, help="also write the results to this file")
    a = p.parse_args(argv)
    if not HAS_QUANTIZER and a.quantizers != ["rtn"]:
        p.error("this colitools has no --quantizer (ConvertOptions.quantizer): only rtn")
    results = []
    with tempfile.TemporaryDirectory(prefix="colitools-bench-kld-", dir=a.workdir) as tmp:
        for fixture in a.fixtures:
            fixture_work = Path(tmp) / fixture
            fixture_work.mkdir()
            results.append(
                bench_fixture(fixture, a.formats, a.quantizers, a.tokens, a.seed, a.other_roles, fixture_work)
            )
    for result in results:
        print("\n".join(table(result, a.quantizers)) + "\n")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
