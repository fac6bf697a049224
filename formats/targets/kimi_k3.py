"""The ``kimi_k3`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from colitools.formats.expert_layouts import INT8_ROW, ExpertRecord
from colitools.formats.targets.base import KIMI_K3, PAIRS_ONLY, Target, _floats

TARGET = Target(
    KIMI_K3,
    "c/kimi_k3.c (w_load, f32_load, expert_table_init)",
    help="mxfp4 experts in the engine's slot order, f32_load tensors kept float, int8-row or int4-g64 "
    "(I % 64 == 0) projections; model_type kimi_k3 only.",
    model_types=("kimi_k3",),
    reads=(
        ("experts", ("mxfp4", "native")),
        *_floats("f32", "bf16", INT8_ROW, "int4-g64"),
        *PAIRS_ONLY,
    ),
    defaults=(("experts", "mxfp4"), ("dense", INT8_ROW), ("embed", INT8_ROW), ("mtp", INT8_ROW)),
    # w1p w1s w2p w2s w3p w3s (w2 is down, w3 up)
    experts=ExpertRecord(formats=("mxfp4",), order=("gate", "down", "up")),
    # c/kimi_k3.c @ 4ef9a99 (lines 143-144, 251): routed experts streamed as native MXFP4 only (fmt=7, never
    # re-encoded): one format, nothing for a budget to choose
    expert_granularity="uniform",
    source_float_leaves=(
        "embed_tokens",
        "f_a_proj",
        "f_b_proj",
        "b_proj",
        "self_attention_res_proj",
        "mlp_res_proj",
        "output_attn_res_proj",
    ),
    int4_group=64,
)
