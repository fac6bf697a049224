"""The ``qwen38`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from typing import Any

from colitools.formats import families, model_config
from colitools.formats.targets.base import QWEN38, Target, _floats


# ------------------------------------------------------------------------------------ qwen38 config.json
def qwen38_config(config: dict[str, Any]) -> dict[str, Any]:
    """c/qwen38_core.h ``q38_load_cfg`` takes ``layer_types`` entries ``linear_attention`` / ``full_attention`` /
    ``qwen_sparse_attention`` only: the QSA layers, whatever their spelling in the source (transformers 5.24's
    ``indexed_attention``, 5.16.1's ``qwen_sparse_attention``: the family's ``layer_type_aliases``), are written
    as the release's ``full_attention``, as ``--target qwen38``'s help promises (transformers and colitools read
    that as indexed attention too)."""
    text = model_config.text_config(config)
    types = text.get("layer_types")
    if not isinstance(types, list):
        return {}
    qsa = "indexed_attention"
    aliases = families.QWEN38.layer_type_aliases
    spelled_types = ["full_attention" if qsa in (t, aliases.get(t)) else t for t in types]
    if spelled_types == types:
        return {}
    spelled = {**text, "layer_types": spelled_types}
    return {"text_config": spelled} if text is not config else spelled


TARGET = Target(
    QWEN38,
    "c/qwen38.c (qwen38_core.h q38_load_cfg, q38_load_weight / q38_load_tensor, q38_load_ple, "
    "q38_expert_int4_attach)",
    help="the release's names with float resident weights (bf16 / f32: q38_load_weight reads no codes), "
    "PLE n-gram shards float, I64 PLE hash buffers, routed experts int4-g64 only in the experts-int4g64/ "
    "sidecar (Q38_INT4_DIR), layer_types spelled full_attention; model_type qwen4_exp only.",
    model_types=("qwen4_exp", "qwen4_exp_text"),
    reads=(("experts", ("int4-g64",)), *_floats("bf16", "f32"), ("layout", ("planar",))),
    # one expert format (int4-g64 in the planar sidecar, ``reads``; the sidecar's index.json has one record size
    # per model, formats/planar_sidecar.py); c/qwen38.c itself was not read for this (its source is not in the
    # 4ef9a99 tree): nothing for a budget to choose
    expert_granularity="uniform",
    why=(("layout", "c/qwen38.c reads int4 routed experts from the experts-int4g64/ sidecar only"),),
    defaults=(("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
    config_extra=qwen38_config,
)
