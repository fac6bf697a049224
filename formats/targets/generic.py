"""The ``generic`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from colitools.formats.targets.base import COLIBRI_C_FORMATS, GENERIC_NAME, PAIRS_ONLY, Target

_PAIRS_ONLY_WHY = (
    "c/colibri.c reads routed experts only as pairs tensors in the model folder's own shards "
    "(st_scan_dir, expert_load_impl); it never opens the experts-int4g64/ sidecar"
)

TARGET = Target(
    GENERIC_NAME,
    "c/colibri.c qt_from_disk / qt_resolve_fmt",
    help="Hugging Face names, pairs experts, every format c/colibri.c reads: named explicitly it refuses "
    "mxfp4, fp8-e8m0 and the planar layout, which c/colibri.c cannot read (the default, no target, writes them "
    "for colitools' readers).",
    # c/colibri.c @ 4ef9a99 looks routed experts up only as ...mlp.experts.{E}.{gate,up,down}_proj.weight
    # (+ .qs) in the *.safetensors of the model folder itself (st.h st_scan_dir: no sub-folder) and has no
    # planar64 kernel: a planar output's experts-int4g64/ sidecar is never opened
    reads=PAIRS_ONLY,
    why=(("layout", _PAIRS_ONLY_WHY),),
    engine_formats=COLIBRI_C_FORMATS,
    # c/colibri.c @ 4ef9a99 ran mse outputs with signed scales token-exact (docs/FORMATS.md §11)
    signed_scales=True,
    # c/colibri.c @ 4ef9a99, expert_load (line 2312): each of an expert's gate / up / down is resolved from its own
    # byte and scale counts (qt_resolve_fmt per tensor); nothing sizes or picks a kernel from another expert
    expert_granularity="tensor",
)
