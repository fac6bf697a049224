"""The ``generic`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from colitools.formats.targets.base import COLIBRI_C_FORMATS, GENERIC_NAME, Target

TARGET = Target(
    GENERIC_NAME,
    "c/colibri.c qt_from_disk / qt_resolve_fmt",
    help="Hugging Face names, every format c/colibri.c reads: named explicitly it refuses mxfp4 and "
    "fp8-e8m0, which c/colibri.c lacks (the default, no target, writes them for colitools' readers).",
    engine_formats=COLIBRI_C_FORMATS,
    # c/colibri.c @ 4ef9a99 ran mse outputs with signed scales token-exact (docs/FORMATS.md §11)
    signed_scales=True,
)
