"""Output targets (``colitools convert --target NAME``, docs/FORMATS.md §4 "Targets"): one object per target.

A ``Target`` is everything the converter and the readers need of one colibri loader: which model types it runs,
which values of each recipe option it reads (anything else is refused before work starts, in one line naming the
option and the target: its own declaration, ``reads`` / ``why``), how its routed experts are laid out and read
back (an ``ExpertLayout`` of ``formats/expert_layouts.py``: per-projection records, merged blobs, fused stacks),
the names and float dtypes it writes (``rewrite``), the files it adds beside the shards (``config_files``,
``meta_files``) and its ``--help`` prose. ``--target NAME`` is resolved once (``by_name``, from the options);
the object travels: the recipe asks it for defaults and refusals, the planner for every tensor's ``rewrite`` and
every file's ``group``, the output writer for its files, ``resolve_container`` for the layouts to read.

``generic`` is the Hugging Face-named ``.qs`` container that ``c/colibri.c`` reads (``qt_from_disk`` /
``qt_resolve_fmt``); ``olmoe`` is the layout of colibri's OLMoE engine (``c/olmoe.c``), as its converter
``c/tools/convert_olmoe_merged.py`` writes it:

* dense tensors by their Hugging Face names, read by ``load_t`` through ``st_read_f32``, which accepts BF16, F16
  and F32 only (a U8 ``.qs`` weight is refused: "not a float tensor");
* per routed expert one merged int8 blob ``model.layers.{L}.mlp.experts.{E}.merged_weight`` (I8, 1-D,
  ``2*I*H + H*I`` bytes: gate ``[I, H]``, up ``[I, H]``, down ``[H, I]`` row-major, back to back) and its scales
  ``model.layers.{L}.mlp.experts.{E}.qs`` (F32, 1-D, ``I + I + H``: gate rows, up rows, down rows), read by
  ``load_expert_merged`` (byte counts checked exactly against ``intermediate_size`` / ``hidden_size``) and
  used as ``w[o, i] = q[o, i] * scale[o]`` by ``matmul_q``: int8-row (docs/FORMATS.md §2).

Numpy-free (the CLI imports it for its help text).


One module per engine (``generic``, ``olmoe``, ``qwen36``, ``kimi_k3``, ``glm53``, ``deepseek_v4``, ``deepseek_v41``,
``inkling``, ``qwen38``): its ``TARGET`` and the config / side-file rules only it applies; ``base`` holds the
``Target`` class and what several share. This module assembles ``TARGETS`` and re-exports the names others import.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from colitools.formats.errors import FormatError, TargetRefused
from colitools.formats.expert_layouts import (  # re-exported: the layouts' facts, read by the runtime and mirror
    FUSED,
    INT4_GROUPED,
    INT4_ROW,
    INT8_ROW,
    MERGED,
    PAIRS,
    SIGNED_NIBBLE_XOR,
    ExpertLayout,
    ExpertRecord,
    FusedLayout,
    Grouped,
    MergedLayout,
    MergedPart,
    PlannedTensor,
    Spelling,
    written_as,
)
from colitools.formats.jsonfile import load_json_object
from colitools.formats.targets import (
    deepseek_v4,
    deepseek_v41,
    generic,
    glm53,
    inkling,
    kimi_k3,
    olmoe,
    qwen36,
    qwen38,
)
from colitools.formats.targets.base import (
    COLIBRI_C_FORMATS,
    DEEPSEEK_V4,
    DEEPSEEK_V41,
    DROPPED_TOWERS,
    FLOAT_OPTIONS,
    FORMAT_OPTIONS,
    GENERIC_NAME,
    GLM53,
    GLM53_KDA_KEYS,
    HF_CONFIG_FILE,
    ID_TOKEN,
    INKLING,
    KIMI_K3,
    META_GROUP_SIZE,
    PAIRS_ONLY,
    QWEN36,
    QWEN38,
    TOKENIZER_FILE,
    V4_FLOAT_DTYPES,
    V4_FP4_EXPERTS,
    V4_FP8,
    V4_QUANTIZATION,
    V4_YARN_BETAS,
    V41_ENGRAM_FILE,
    V41_FLOAT_DTYPES,
    V41_LIMITS,
    MetaFile,
    Rewrite,
    Target,
    _floats,
    id_only_tokenizer,
    leaf_key,
)
from colitools.formats.targets.deepseek_v4 import deepseek_v4_config, deepseek_v4_rope_scaling
from colitools.formats.targets.deepseek_v41 import deepseek_v41_check, deepseek_v41_side_files
from colitools.formats.targets.glm53 import glm53_config
from colitools.formats.targets.olmoe import olmoe_heads
from colitools.formats.targets.qwen36 import qwen36_meta
from colitools.formats.targets.qwen38 import qwen38_config

__all__ = [
    "COLIBRI_C_FORMATS",
    "DEEPSEEK_V4",
    "DEEPSEEK_V41",
    "DROPPED_TOWERS",
    "EXPERT_READERS",
    "ExpertLayout",
    "ExpertRecord",
    "FLOAT_OPTIONS",
    "FORMAT_OPTIONS",
    "FUSED",
    "FusedLayout",
    "GENERIC",
    "GENERIC_NAME",
    "GLM53",
    "GLM53_KDA_KEYS",
    "Grouped",
    "HF_CONFIG_FILE",
    "ID_TOKEN",
    "INKLING",
    "INT4_GROUPED",
    "INT4_ROW",
    "INT8_ROW",
    "KIMI_K3",
    "MERGED",
    "META_GROUP_SIZE",
    "MergedLayout",
    "MergedPart",
    "MetaFile",
    "PAIRS",
    "PAIRS_ONLY",
    "PlannedTensor",
    "QWEN36",
    "QWEN38",
    "Rewrite",
    "SIGNED_NIBBLE_XOR",
    "SPELLINGS",
    "Spelling",
    "TARGETS",
    "TARGET_NAMES",
    "TOKENIZER_FILE",
    "Target",
    "V41_ENGRAM_FILE",
    "V41_FLOAT_DTYPES",
    "V41_LIMITS",
    "V4_FLOAT_DTYPES",
    "V4_FP4_EXPERTS",
    "V4_FP8",
    "V4_QUANTIZATION",
    "V4_YARN_BETAS",
    "_floats",
    "by_name",
    "deepseek_v41_check",
    "deepseek_v41_side_files",
    "deepseek_v4_config",
    "deepseek_v4_rope_scaling",
    "glm53_config",
    "id_only_tokenizer",
    "leaf_key",
    "merged_group_size",
    "olmoe_heads",
    "qwen36_meta",
    "qwen38_config",
    "written_as",
]

# in the order of --help and of messages
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        generic.TARGET,
        olmoe.TARGET,
        qwen36.TARGET,
        kimi_k3.TARGET,
        glm53.TARGET,
        deepseek_v4.TARGET,
        deepseek_v41.TARGET,
        inkling.TARGET,
        qwen38.TARGET,
    )
}
TARGET_NAMES = tuple(TARGETS)


# the default (no --target): the generic names, every format and layout colitools' own readers read
GENERIC = replace(TARGETS[GENERIC_NAME], engine_formats=None, reads=(), why=())


EXPERT_READERS: tuple[ExpertLayout, ...] = (FUSED, MERGED)  # the layouts resolve_container claims tensors for


# the targets' spellings of a format's two tensors, which resolve_container pairs by name and dtype
SPELLINGS: tuple[Spelling, ...] = tuple(
    dict.fromkeys(t.experts.spelling for t in TARGETS.values() if t.experts.spelling)
)


def by_name(name: str) -> Target:
    """The target called ``name`` (``--target NAME``); TargetRefused (one line) naming the choices."""
    try:
        return TARGETS[name]
    except KeyError:
        raise TargetRefused(f"`target={name!r}`: choose one of {', '.join(TARGET_NAMES)}") from None


def merged_group_size(folder: str | os.PathLike) -> int | None:
    """``expert_gs`` of a container's target metadata file (``qwen36_meta.json``), or None without one: what
    ``MergedLayout.identify`` needs to tell group sizes with equal counts apart. FormatError (one line) for a
    file that is not a JSON object or an ``expert_gs`` that is not a non-negative integer."""
    for target in TARGETS.values():
        if target.meta is None:
            continue
        path = Path(folder) / target.meta.name
        if not path.is_file():
            continue
        gs = load_json_object(path).get(META_GROUP_SIZE)
        if gs is not None and (type(gs) is not int or gs < 0):
            raise FormatError(f"{path}: {META_GROUP_SIZE} must be a non-negative integer in a JSON object")
        return gs
    return None
