"""The ``glm53`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from typing import Any

from colitools.formats import model_config
from colitools.formats.expert_layouts import ExpertRecord
from colitools.formats.targets.base import GLM53, GLM53_KDA_KEYS, PAIRS_ONLY, Target, _floats


def glm53_config(config: dict[str, Any]) -> dict[str, Any]:
    """``linear_attn_config`` as c/glm53.c ``load_cfg`` reads it (``GLM53_KDA_KEYS``, from the flat
    ``linear_*`` keys), added to the text config (``text_config`` of a multimodal config, else the top level)
    when the source has none; the flat keys stay, for colitools' own readers. Nothing when the source already
    has one (a hub config), or has no flat KDA keys to derive it from. No ``full_attn_layers`` / ``kda_layers``:
    the engine takes the layer kinds from ``layer_types`` and only cross-checks those optional lists."""
    text = model_config.text_config(config)
    if isinstance(text.get("linear_attn_config"), dict):
        return {}
    if any(text.get(flat) is None for _, flat in GLM53_KDA_KEYS[:3]):  # the three it requires
        return {}
    kda = {key: text[flat] for key, flat in GLM53_KDA_KEYS if text.get(flat) is not None}
    if text is config:
        return {"linear_attn_config": kda}
    return {"text_config": {**text, "linear_attn_config": kda}}


TARGET = Target(
    GLM53,
    "c/glm53.c (load_f32, load_mat, absorb_kvb, expert_geometry / expert_table_init)",
    help="int4-g64 experts in the engine's slot order, float or int4-g64 projections, "
    "text_config.linear_attn_config added; model_type glm5_next only.",
    model_types=("glm5_next", "glm5_next_text"),
    reads=(("experts", ("int4-g64",)), *_floats("f32", "bf16", "int4-g64"), *PAIRS_ONLY),
    defaults=(("experts", "int4-g64"), ("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
    # gate.w gate.qs up.w up.qs down.w down.qs
    experts=ExpertRecord(formats=("int4-g64",), order=("gate", "up", "down")),
    # one expert format (int4-g64, ``reads``); c/glm53.c itself was not read for this (its source is not in the
    # 4ef9a99 tree): nothing for a budget to choose
    expert_granularity="uniform",
    source_float_leaves=("embed_tokens", "kv_b_proj"),
    int4_group=64,
    int4_fallback="bf16",
    config_extra=glm53_config,
)
