"""The format names a user types: the recipe's format options (FORMATS-SPEC §6) and the int4 group sizes.

numpy-free on purpose: the CLI builds its help texts from these without importing the codecs. The registry
(``registry.py``) parses these names into format classes.
"""

from __future__ import annotations

GROUP_SIZES: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_GROUP_SIZE = 64
GROUPED_OPTION_PREFIX = "int4-g"  # int4-grouped as a recipe option: int4-g{gs}
NATIVE_OPTION = "native"  # keep the source's own quantization where a format holds it exactly (§6)

RECIPE_FORMAT_NAMES = (
    "f32", "bf16", "int8-row", "int4-row", "int2-row",
    *(f"{GROUPED_OPTION_PREFIX}{g}" for g in GROUP_SIZES), "int3-g64", "mxfp4", "fp8",
    NATIVE_OPTION,
)  # fmt: skip


def recipe_format_summary() -> str:
    """The recipe format names for help texts, the group sizes folded into ``int4-g{16..256}``."""
    ungrouped = [n for n in RECIPE_FORMAT_NAMES if not n.startswith(GROUPED_OPTION_PREFIX)]
    p = GROUPED_OPTION_PREFIX
    return ", ".join([f"{p}{DEFAULT_GROUP_SIZE}", f"{p}{{{GROUP_SIZES[0]}..{GROUP_SIZES[-1]}}}", *ungrouped])
