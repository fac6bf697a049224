"""The ``inkling`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from colitools.formats import names
from colitools.formats.expert_layouts import FUSED, INT4_ROW, INT8_ROW
from colitools.formats.targets.base import DROPPED_TOWERS, INKLING, PAIRS_ONLY, Target

TARGET = Target(
    INKLING,
    "c/inkling.c (load_cfg; model_init's load_w / load_t and container detection; slot_fill)",
    help="the text names c/inkling.c looks up, one fused expert stack per layer (gate_up_proj / down_proj: "
    "int4-row or int8-row U8 rows + .qs, or f32 / bf16), shared experts as float stacks, towers and MTP "
    "left out; model_type inkling_mm_model only.",
    model_types=("inkling", "inkling_mm_model", "inkling_text"),
    # convert_inkling_int4.py --xbits 4 / 8 / 0; MTP modules are left out whatever the recipe says, so
    # --mtp takes only the value recorded for them
    reads=(
        ("experts", (INT4_ROW, INT8_ROW, "f32", "bf16")),
        ("dense", ("f32", "bf16")),
        ("embed", ("f32", "bf16")),
        ("mtp", ("bf16",)),
        *PAIRS_ONLY,
        ("towers", ("drop",)),
    ),
    why=(
        ("towers", f"c/inkling.c reads no tower from the container: {DROPPED_TOWERS}"),
        ("mtp", "c/inkling.c reads no MTP modules: its converter leaves them out (model.mtp.)"),
    ),
    defaults=(("experts", INT4_ROW), ("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
    experts=FUSED,
    # c/inkling.c @ 4ef9a99, model_init's container detection (lines 887-899): the row bytes of gate_up_proj and
    # down_proj are read from the first sparse layer only (``break``) and size every layer's slots; moe() (line
    # 1303) picks the int4 or int8 kernel for both from them: one format for all routed experts
    expert_granularity="uniform",
    name_map=names.inkling_text_name,
    drop_mtp=True,
    signed_scales=True,  # c/inkling.c @ 4ef9a99: int4-row / int8-row experts, ~45% negative, token-exact
)
