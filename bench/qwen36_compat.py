"""colibri's newer qwen36 engine (zhyanbo/colibri @ d295eba, built with ``-DQWEN36_QPACK``) on what colitools
writes for it (issue 45; not part of CI: colibri's source is not there): the mixed expert slab (``--target qwen36
--experts int4-g32 --experts-down int8-row``) and a QPACK v1 container of MLX-affine experts
(``formats/qpack.py``, ``QWEN36_QPACK=<dir>``), rtn and mse, teacher-forced and greedy against ``colitools run``.

The QPACK rows: ``convert --target qwen36 --layout qpack`` writes the snapshot (dense f32, no routed expert) and
the QPACK container in one folder; the engine runs it with ``SNAP=QWEN36_QPACK=<folder>``. The reference is
``colitools run`` on that folder, and (the check of the runtime's own decode) on the source whose routed experts
are replaced by the values the container decodes to, every weight f32 (generic target): the same weights the
engine multiplies with. The rest is bench/colibri_compat.py's (engine environment with exact kernels,
teacher-forced prefix by prefix, divergences with colitools' top-2 margins).

Usage: ``.venv/bin/python bench/qwen36_compat.py ENGINE_DIR [--work DIR]``, ``ENGINE_DIR`` the folder of the
built ``qwen36`` binary (bench/README.md says how it was built).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import colibri_compat as cc  # noqa: E402

from colitools.converters.options import ConvertOptions  # noqa: E402
from colitools.converters.runner import convert  # noqa: E402
from colitools.formats import qpack  # noqa: E402
from colitools.verify.kld import F32_RECIPE  # noqa: E402

FIXTURE = "qwen3_5_moe"
PREFIX = "model.language_model.layers"


def mixed_cases() -> list[cc.Case]:
    """The mixed slab (rtn, mse) and a size budget on the merged experts (the fixture's sizes reach 228,320 to
    444,384 bytes with --target qwen36)."""
    base = (("target", "qwen36"), ("experts", "int4-g32"), ("experts-down", "int8-row"))
    return [cc.Case("qwen36", FIXTURE, base), cc.Case("qwen36", FIXTURE, (*base, ("quantizer", "mse"))),
            cc.Case("qwen36", FIXTURE, (("target", "qwen36"), ("target-size", "300000")), label="size budget")]


# QPACK rows: (experts, quantizer) and a size budget among the affine formats (304,096 to 526,304 bytes here)
QPACK_ROWS = [(("experts", x), ("quantizer", q)) for x in ("affine4-g32", "affine4-g64", "affine8-g64")
              for q in ("rtn", "mse")] + [(("target-size", "330000"),)]  # fmt: skip


def reference_container(source: Path, container: Path, out: Path) -> Path:
    """``source`` with its routed experts replaced by ``container``'s decoded values, converted all-f32."""
    if (out / "colitools.json").exists():
        return out
    src = out.with_name(out.name + "-src")
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(source, src, ignore=shutil.ignore_patterns("reference"))
    c = qpack.open_qpack(container)
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(f)
        for layer in range(c.layout["layerCount"]):
            for e in range(c.layout["expertCount"]):
                for p, v in c.decode_expert(layer, e).items():
                    name = f"{PREFIX}.{layer}.mlp.experts.{e}.{p}.weight"
                    if name in tensors:
                        tensors[name] = np.ascontiguousarray(v, np.float32)
        save_file(tensors, f)
    convert(str(src), out, ConvertOptions(**F32_RECIPE, progress=False, min_free_gb=0.0))
    return out


def run_qpack(cdir: Path, work: Path, options: tuple[tuple[str, str], ...]) -> cc.Row:
    case = cc.Case("qwen36", FIXTURE, (("target", "qwen36"), ("layout", "qpack"), *options), label="QPACK")
    tag = "-".join(v for _, v in options)
    row = cc.Row(case, "yes")
    source = cc.ORACLES / FIXTURE
    snap = container = cc.convert_case(case, source, work)
    ref_dir = reference_container(source, container, work / f"qpack-{tag}-reference")
    oracle = json.loads((cc.ORACLES / FIXTURE / "reference" / "f32.json").read_text())
    prompt, n = [int(t) for t in oracle["prompt_ids"]], len(oracle["generated_ids"])
    ref = cc.colitools_reference(snap, prompt, n, None)
    f32 = cc.colitools_reference(ref_dir, prompt, n, None)
    row.extra["runtime_vs_f32"] = (ref["full_ids"] == f32["full_ids"], ref["tf_pred"] == f32["tf_pred"])
    ref_path = work / "refs" / f"qpack-{tag}.json"
    ref_path.parent.mkdir(parents=True, exist_ok=True)
    ref_path.write_text(json.dumps({**{k: ref[k] for k in ("prompt_ids", "full_ids", "tf_pred")},
                                    "output_ids": ref["full_ids"][len(prompt):]}))  # fmt: skip
    os.environ["QWEN36_QPACK"] = str(container)
    try:
        result = cc.run_engine(case, cdir, snap, ref_path, len(ref["tf_pred"]), n)
        if result["ran"] == "yes":
            result["tf"], notes = cc.tf_by_prefix(case, cdir, snap, ref, work)
            result["out"] = f"{result['out']}\n{notes}"
    finally:
        del os.environ["QWEN36_QPACK"]
    row.ran = str(result["ran"])
    row.loaded = "yes" if "[qpack] routed experts <- MLX affine container" in str(result["out"]) else "no"
    row.tf = "{}/{}".format(*result["tf"]) if result["tf"] else "-"
    row.greedy = "{}/{}".format(*result["greedy"]) if result["greedy"] else "-"
    same = row.extra["runtime_vs_f32"]
    row.note = cc.divergence_note(str(result["out"]), ref) + (
        "" if all(same) else f" (colitools run on QPACK vs f32 decoded experts: greedy {same[0]}, TF {same[1]})")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine_dir", type=Path, help="the folder holding the built qwen36 binary")
    ap.add_argument("--work", type=Path, default=cc.REPO / ".bench-tmp" / "qwen36-compat")
    args = ap.parse_args(argv)
    if not (args.engine_dir / "qwen36").is_file():
        ap.error(f"{args.engine_dir}/qwen36 is not there: build it first (bench/README.md)")
    args.work.mkdir(parents=True, exist_ok=True)
    rows = [cc.run_case(c, args.engine_dir, "yes", args.work, None) for c in mixed_cases()]
    rows += [run_qpack(args.engine_dir, args.work, options) for options in QPACK_ROWS]
    cc.print_table(rows)
    return 0 if all(r.ran == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
