"""The format names a user types: the recipe's format options (docs/FORMATS.md §5) and the int4 group sizes.

numpy-free on purpose: the CLI builds its help texts from these without importing the codecs. The registry
(``registry.py``) parses these names into format classes.
"""

from __future__ import annotations

GROUP_SIZES: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_GROUP_SIZE = 64
GROUPED_OPTION_PREFIX = "int4-g"  # int4-grouped as a recipe option: int4-g{gs}
NATIVE_OPTION = "native"  # keep the source's own quantization where a format holds it exactly (§6)
# The MLX-affine formats (FORMATS §2.12; written only into a QPACK container, --target qwen36 --layout qpack)
AFFINE_GROUP_SIZES: tuple[int, ...] = (32, 64, 128)
AFFINE_FORMATS: tuple[str, ...] = ("affine4", "affine8")  # registry names
# registry name of a grouped format -> its recipe option prefix (``int4-g64``, ``affine4-g64``) and group sizes
GROUPED_PREFIXES: dict[str, tuple[str, tuple[int, ...]]] = {
    "int4-grouped": (GROUPED_OPTION_PREFIX, GROUP_SIZES),
    **{name: (f"{name}-g", AFFINE_GROUP_SIZES) for name in AFFINE_FORMATS},
}

RECIPE_FORMAT_NAMES = (
    "f32", "bf16", "int8-row", "int4-row", "int2-row",
    *(f"{GROUPED_OPTION_PREFIX}{g}" for g in GROUP_SIZES), "int3-g64", "mxfp4", "fp8",
    "fp8-e8m0", "fp8-e8m0-t32", "fp8-e8m0-r32", NATIVE_OPTION,
    *(f"{name}-g{g}" for name in AFFINE_FORMATS for g in AFFINE_GROUP_SIZES),
)  # fmt: skip


def recipe_format_summary() -> str:
    """The recipe format names for help texts, each grouped family's sizes folded (``int4-g{16..256}``)."""
    prefixes = [p for p, _ in GROUPED_PREFIXES.values()]
    ungrouped = [n for n in RECIPE_FORMAT_NAMES if not n.startswith(tuple(prefixes))]
    folded = [f"{p}{{{sizes[0]}..{sizes[-1]}}}" for p, sizes in GROUPED_PREFIXES.values()]
    return ", ".join([f"{GROUPED_OPTION_PREFIX}{DEFAULT_GROUP_SIZE}", folded[0], *ungrouped, *folded[1:]])


def option_group_size(option: str) -> int | None:
    """The group size a grouped recipe option names (``int4-g64`` -> 64, ``affine4-g32`` -> 32), else None."""
    for prefix, sizes in GROUPED_PREFIXES.values():
        rest = option.removeprefix(prefix)
        if rest != option and rest.isdigit() and int(rest) in sizes:
            return int(rest)
    return None


# ---------------------------------------------------------------------------------- the one vocabulary
# Every command names a stored format with the recipe option a user would type to get it (FORMATS §5, the
# table in docs/FORMATS.md "Format names"): the convert summary, colitools.json, inspect, verify and
# `colitools formats` all print ``format_label(...)``. The registry names (``int4-grouped``, ``fp8-e4m3-b128``)
# remain the stamp strings of the files and the resolver's messages.

# recipe option -> registry (stamp) name of the format it writes
OPTION_FORMATS: dict[str, str] = {
    "f32": "f32", "bf16": "f32", "int8-row": "int8-row", "int4-row": "int4-row", "int2-row": "int2-row",
    **{f"{GROUPED_OPTION_PREFIX}{g}": "int4-grouped" for g in GROUP_SIZES},
    "int3-g64": "int3-g64", "mxfp4": "mxfp4", "fp8": "fp8-e4m3-b128",
    "fp8-e8m0": "fp8-e4m3-e8m0", "fp8-e8m0-t32": "fp8-e4m3-e8m0-t32", "fp8-e8m0-r32": "fp8-e4m3-e8m0-r32",
    **{f"{name}-g{g}": name for name in AFFINE_FORMATS for g in AFFINE_GROUP_SIZES},
}  # fmt: skip

# a float tensor is named by its stored dtype (safetensors dtype name -> label)
FLOAT_LABELS: dict[str, str] = {"F32": "f32", "BF16": "bf16", "F16": "f16"}
_FLOAT_FORMAT = "f32"
_RENAMED = {
    "fp8-e4m3-b128": "fp8", "fp8-e4m3-e8m0": "fp8-e8m0",
    "fp8-e4m3-e8m0-t32": "fp8-e8m0-t32", "fp8-e4m3-e8m0-r32": "fp8-e8m0-r32",
}  # registry name -> option name where they differ (besides int4-grouped)


def format_label(name: str, group_size: int | None = None, dtype: str | None = None) -> str:
    """The user-facing name of a stored format: ``name`` is the registry (stamp) name, ``group_size`` the
    int4-grouped group size, ``dtype`` the safetensors dtype of a float tensor (default F32).

    ``f32`` / ``bf16`` / ``f16`` (floats by dtype), ``int4-g64``, ``int8-row``, ``fp8``, ...: the recipe option
    names; a read-only format (``e8-iq3-lattice``) keeps its registry name."""
    if name == _FLOAT_FORMAT:
        return FLOAT_LABELS.get(dtype or "F32", (dtype or "F32").lower())
    if name in GROUPED_PREFIXES and group_size is not None:
        return f"{GROUPED_PREFIXES[name][0]}{group_size}"
    return _RENAMED.get(name, name)


def option_names(name: str) -> tuple[str, ...]:
    """The recipe options (``convert --experts`` etc.) that write registry format ``name``; () if none."""
    return tuple(option for option, fmt in OPTION_FORMATS.items() if fmt == name)


# ----------------------------------------------------------------------------------------- formats per role
def copied_label(dtype: str) -> str:
    """How formats per role name a tensor kept in its source dtype, bytes unchanged (rules 0 and 1, ``--towers
    keep``): ``I64 (copied)``, ``F32 (copied)``."""
    return f"{dtype} (copied)"


def role_formats_line(role: str, formats: dict[str, int]) -> str:
    """One line of the formats-per-role block (``convert`` / ``--dry-run`` summary, ``inspect``):
    ``  conv             3 x f32``, formats as counted (``{label: tensors}``)."""
    return f"  {role:<16} " + ", ".join(f"{n} x {f}" for f, n in formats.items())
