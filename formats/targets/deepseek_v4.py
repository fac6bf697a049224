"""The ``deepseek_v4`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from typing import Any

from colitools.formats import model_config, names
from colitools.formats.expert_layouts import ExpertRecord
from colitools.formats.targets.base import (
    DEEPSEEK_V4,
    PAIRS_ONLY,
    V4_FLOAT_DTYPES,
    V4_FP4_EXPERTS,
    V4_FP8,
    V4_QUANTIZATION,
    V4_YARN_BETAS,
    Target,
)


def deepseek_v4_config(config: dict[str, Any]) -> dict[str, Any]:
    """The released checkpoint's ``config.json`` keys that c/deepseek_v4.c's ``coli_v4_config_parse`` reads and
    a transformers 5.24 config spells otherwise, derived from it (the transformers keys stay, for colitools'
    own readers): ``compress_ratios`` per layer (``layer_types`` through ``compress_rates``, 0 for a sliding
    layer; one 0 per MTP layer after them, as the released list has), ``num_hash_layers`` (the leading
    ``hash_moe`` layers of ``mlp_layer_types``), ``expert_dtype`` ``fp4``, ``topk_method`` ``noaux_tc``,
    ``rope_scaling`` (``deepseek_v4_rope_scaling``) and ``quantization_config`` (``V4_QUANTIZATION``). Keys the source already has are kept as they are."""
    mcfg = model_config.text_config(config)
    extra: dict[str, Any] = {}
    n = int(mcfg.get("num_hidden_layers") or 0)
    kinds, rates = mcfg.get("layer_types"), mcfg.get("compress_rates") or {}
    if "compress_ratios" not in mcfg and isinstance(kinds, list) and isinstance(rates, dict):
        mtp = int(mcfg.get("num_nextn_predict_layers") or 0)
        extra["compress_ratios"] = [int(rates.get(k, 0)) for k in kinds[:n]] + [0] * mtp
    mlp = mcfg.get("mlp_layer_types")
    if "num_hash_layers" not in mcfg and isinstance(mlp, list):
        hashed = 0
        while hashed < len(mlp) and mlp[hashed] == "hash_moe":
            hashed += 1
        extra["num_hash_layers"] = hashed
    if not isinstance(mcfg.get("rope_scaling"), dict):
        extra["rope_scaling"] = deepseek_v4_rope_scaling(mcfg)
    extra.setdefault("expert_dtype", mcfg.get("expert_dtype", "fp4"))
    extra.setdefault("topk_method", mcfg.get("topk_method", "noaux_tc"))
    extra["quantization_config"] = dict(V4_QUANTIZATION)
    return extra


def deepseek_v4_rope_scaling(mcfg: dict[str, Any]) -> dict[str, Any]:
    """``rope_scaling`` as the released config spells it and ``coli_v4_config_parse`` requires it (an object
    with ``factor``, ``beta_fast``, ``beta_slow`` (integers) and ``original_max_position_embeddings``), from
    transformers 5.24's ``rope_parameters`` (the compressed layers' ``compress`` entry, where c/deepseek_v4.c
    applies YaRN, else ``main``, else the flat dict). A rope without YaRN gets ``factor`` 1.0, with which the
    engine's ``rope_frequency`` is the plain frequency whatever the betas, and ``original_max_position_embeddings``
    = ``max_position_embeddings``."""
    params = mcfg.get("rope_parameters") or {}
    rope = next((params[k] for k in ("compress", "main") if isinstance(params.get(k), dict)), params)
    rope = rope if isinstance(rope, dict) and rope.get("rope_type") == "yarn" else {}
    return {
        "type": "yarn",
        "factor": float(rope.get("factor", 1.0)),
        "beta_fast": int(rope.get("beta_fast", V4_YARN_BETAS[0])),
        "beta_slow": int(rope.get("beta_slow", V4_YARN_BETAS[1])),
        "original_max_position_embeddings": int(
            rope.get("original_max_position_embeddings", mcfg.get("max_position_embeddings") or 0)
        ),
    }


TARGET = Target(
    DEEPSEEK_V4,
    "c/deepseek_v4.c (coli_v4_layer_plan / coli_v4_layer_validate, coli_tensor_load_fp8, "
    "coli_tensor_load_f32, coli_v4_head_cache_load, expert_record_bytes)",
    help="the released checkpoint's names and dtypes (fp8-e8m0 projections: F8_E4M3 + F8_E8M0 .scale per "
    "128x128 block, mxfp4 experts as I8 .weight + F8_E8M0 .scale, BF16 norms / router / compressor, F32 "
    "sinks and hc_*), config.json with compress_ratios / num_hash_layers; model_type deepseek_v4 only.",
    model_types=("deepseek_v4",),
    reads=(
        ("experts", ("mxfp4",)),
        ("dense", (V4_FP8,)),
        ("mtp", (V4_FP8,)),
        ("embed", ("bf16",)),
        *PAIRS_ONLY,
    ),  # embed: find_head takes a BF16 head only
    defaults=(("experts", "mxfp4"), ("dense", V4_FP8), ("embed", "bf16"), ("mtp", V4_FP8)),
    experts=ExpertRecord(formats=("mxfp4",), spelling=V4_FP4_EXPERTS),
    # c/deepseek_v4.c @ 4ef9a99, expert_record_bytes (lines 910-922): layer 0 expert 0's six parts size every
    # expert slot: one record size, mxfp4 only
    expert_granularity="uniform",
    name_map=names.deepseek_v4_released_name,
    float_dtypes=tuple(V4_FLOAT_DTYPES.items()),
    config_extra=deepseek_v4_config,
    tokenizer_stub=True,
)
