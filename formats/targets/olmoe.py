"""The ``olmoe`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from typing import Any

from colitools.formats.expert_layouts import INT8_ROW, MERGED
from colitools.formats.targets.base import PAIRS_ONLY, Target, _floats


def olmoe_heads(config: dict[str, Any]) -> str | None:
    """c/olmoe.c reads no ``num_key_value_heads``: it multiplies ``k_proj`` / ``v_proj`` as ``[hidden,
    hidden]`` (``model_init``, ``attention``), so a grouped-query config would be read past both buffers."""
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads", heads)
    if kv == heads:
        return None
    return (
        f"num_key_value_heads {kv} != num_attention_heads {heads}: c/olmoe.c multiplies k_proj / v_proj as "
        f"[hidden, hidden] (it reads no num_key_value_heads)"
    )


TARGET = Target(
    "olmoe",
    "c/olmoe.c (model_init's load_t, load_expert_merged)",
    help="merged int8 experts (...experts.{E}.merged_weight + .qs), dense tensors f32 or bf16; model_type "
    "olmoe only.",
    model_types=("olmoe",),
    reads=(("experts", (INT8_ROW,)), *_floats("f32", "bf16"), *PAIRS_ONLY),
    defaults=(("experts", INT8_ROW), ("dense", "f32"), ("embed", "f32"), ("mtp", "f32")),
    experts=MERGED,
    # c/olmoe.c @ 4ef9a99, load_expert_merged (lines 424-433): every blob must be exactly 2*I*H + H*I bytes with
    # 2*I + H scales (int8-row), refused otherwise: one format for all routed experts
    expert_granularity="uniform",
    config_check=olmoe_heads,
    signed_scales=True,  # c/olmoe.c @ 4ef9a99: merged int8 experts, ~41% negative scales, token-exact
)
