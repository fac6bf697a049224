"""The ``qwen36`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from typing import Any

from colitools.formats import model_config
from colitools.formats.expert_layouts import INT4_ROW, INT8_ROW, MERGED
from colitools.formats.format_names import GROUP_SIZES
from colitools.formats.targets.base import (
    DROPPED_TOWERS,
    META_GROUP_SIZE,
    QWEN36,
    MetaFile,
    Target,
    _floats,
)


# --------------------------------------------------------------------------------------- qwen36_meta.json
def qwen36_meta(
    config: dict[str, Any], shapes: dict[str, tuple[int, ...]], experts: str, group_size: int | None,
    down: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``qwen36_meta.json`` as ``c/tools/convert_qwen36.py`` writes it and ``c/qwen36.c`` ``load_meta`` reads it.

    ``config`` is the source's ``config.json``, ``shapes`` the source tensor shapes by their *written* names
    (head dims come from the first full-attention layer's weights, as the converter takes them), ``experts``
    the routed experts' format (``int8-row`` -> ``ebits`` 8, int4 -> 4; ``expert_gs`` the int4-grouped group
    size, 0 for row scales; ``down`` int8-row: the mixed slab, ``expert_down_bits`` 8 and ``expert_down_gs`` 0,
    the keys ``load_meta`` reads for ``convert_qwen36.py --down-bits``). Where transformers defines a key the converter defaults differently
    (``norm_topk_prob``, ``attn_output_gate``: Qwen3.5-MoE always renormalises and always gates; rope values that
    transformers 5 keeps in ``rope_parameters``), the value is the one transformers runs the model with
    (docs/FORMATS.md §4 Targets)."""
    mcfg = model_config.text_config(config)
    rope = mcfg.get("rope_parameters") or {}
    n = int(mcfg["num_hidden_layers"])
    layer_types = mcfg.get("layer_types") or [
        "full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)
    ]
    meta: dict[str, Any] = {
        "model_type": config.get("model_type"),
        "hidden": int(mcfg["hidden_size"]),
        "n_layers": n,
        "n_active": len(layer_types),
        "layer_types": list(layer_types),
        "num_experts": int(mcfg["num_experts"]),
        "topk": int(mcfg["num_experts_per_tok"]),
        "moe_inter": int(mcfg.get("moe_intermediate_size", mcfg.get("intermediate_size", 0) // 2)),
        "shared_inter": int(
            mcfg.get("shared_expert_intermediate_size", mcfg.get("moe_intermediate_size", 0))
        ),
        "rms_eps": float(mcfg.get("rms_norm_eps", 1e-6)),
        "ebits": 8 if experts == INT8_ROW else 4,
        "scoring_func": mcfg.get("scoring_func", "softmax"),
        "n_group": int(mcfg.get("n_group", 1)),
        "topk_group": int(mcfg.get("topk_group", 1)),
        "norm_topk_prob": bool(mcfg.get("norm_topk_prob", True)),
        "attn_output_gate": bool(mcfg.get("attn_output_gate", True)),
        "rope_theta": float(rope.get("rope_theta", mcfg.get("rope_theta", 10000000.0))),
        "mrope_section": rope.get("mrope_section", [16, 16, 16]),
        "partial_rotary_factor": float(
            rope.get("partial_rotary_factor", mcfg.get("partial_rotary_factor", 0.25))
        ),
    }
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    if full:
        meta.update(_head_dims(mcfg, shapes, f"model.layers.{full[0]}.self_attn"))
    meta[META_GROUP_SIZE] = int(group_size or 0)  # 0 = per-row scales; > 0 = group size along the input
    if down == INT8_ROW:  # the mixed slab: int4 gate/up, int8-row down (row scales)
        meta["expert_down_bits"], meta["expert_down_gs"] = 8, 0
    dn = {
        "dn_vheads": ("linear_num_value_heads", "num_value_heads"),
        "dn_kheads": ("linear_num_key_heads", "num_key_heads"),
        "dn_kdim": ("linear_key_head_dim", "key_head_dim"),
        "dn_vdim": ("linear_value_head_dim", "value_head_dim"),
        "dn_convk": ("linear_conv_kernel_dim", "conv_kernel_size"),
    }
    for key, (name, alias) in dn.items():
        meta[key] = int(mcfg.get(name, mcfg.get(alias, 0)))
    meta["dn_conv_dim"] = meta["dn_kheads"] * meta["dn_kdim"] * 2 + meta["dn_vheads"] * meta["dn_vdim"]
    return meta


def _head_dims(mcfg: dict[str, Any], shapes: dict[str, tuple[int, ...]], base: str) -> dict[str, Any]:
    """The attention keys of ``qwen36_meta.json`` from the first full-attention layer's weights (``base``: its
    ``self_attn``), as the converter takes them."""
    n_q, n_kv = int(mcfg["num_attention_heads"]), int(mcfg["num_key_value_heads"])
    out: dict[str, Any] = {"q_heads": n_q, "kv_heads": n_kv}
    for key, proj, heads in (("q_head_dim", "q_proj", n_q), ("k_head_dim", "k_proj", n_kv),
                             ("v_head_dim", "v_proj", n_kv)):  # fmt: skip
        if f"{base}.{proj}.weight" in shapes:
            out[key] = int(shapes[f"{base}.{proj}.weight"][0]) // heads
    if f"{base}.o_proj.weight" in shapes:
        out["o_in"] = int(shapes[f"{base}.o_proj.weight"][1])
    if f"{base}.q_norm.weight" in shapes:
        out["qk_rope_head_dim"] = int(shapes[f"{base}.q_norm.weight"][0])
    out["head_dim"] = out.get("k_head_dim", out.get("q_head_dim", 256))
    out["rope_dim"] = out.get("qk_rope_head_dim", out["head_dim"] // 4)
    return out


TARGET = Target(
    QWEN36,
    "c/qwen36.c (load_cfg, load_meta, model_init's load_t_n, load_expert_merged)",
    help="merged int8-row / int4-row / int4-g{gs} experts (signed nibbles; with experts_down int8-row the mixed "
    "slab, int4 gate/up and int8-row down) or, layout qpack, MLX-affine experts in a QPACK v1 container; float dense tensors renamed "
    "model.language_model. -> model., flat config.json, qwen36_meta.json; model_type qwen3_5_moe only.",
    model_types=("qwen3_5_moe", "qwen3_5_moe_text"),
    reads=(
        ("experts", (INT8_ROW, INT4_ROW, *(f"int4-g{g}" for g in GROUP_SIZES))),
        ("experts_down", (INT8_ROW,)),  # the mixed slab (load_meta's expert_down_bits / expert_down_gs)
        *_floats("f32", "bf16"),
        ("layout", ("pairs", "qpack")),  # qpack: the routed experts in QPACK v1 (QWEN36_QPACK, formats/qpack.py)
        ("towers", ("drop",)),
    ),
    why=(("towers", f"c/qwen36.c runs the text model only: {DROPPED_TOWERS}"),),
    defaults=(("experts", INT4_ROW), ("dense", "f32"), ("embed", "f32"), ("mtp", "f32")),
    experts=MERGED,
    # c/qwen36.c (the 393,817-character version with the mixed slab): load_expert_merged (lines 2642-2720) tells
    # int8 / int4 / mixed apart per blob by its size, but the scale counts come from the one expert_gs of
    # qwen36_meta.json (scale_count_gu, line 2527), and the engine picks kernels for all layers from one expert:
    # xf_mode (lines 1266-1273: the first layer's expert 0), the VRAM tier's expert_is_int4 (lines 6455-6463:
    # layer 0's expert 0), quant_bits (line 7187): one format for all routed experts
    expert_granularity="uniform",
    rename=(("model.language_model.", "model."),),
    flat_config=True,
    meta=MetaFile("qwen36_meta.json", qwen36_meta),
)
