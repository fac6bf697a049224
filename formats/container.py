"""Container-level resolution: every tensor of a set of shards (docs/FORMATS.md §3 applied to a whole model).

``resolve_container`` pairs each weight with its scale tensor (``<name>.qs``, or an mxfp4 ``weight_packed`` with
its ``weight_scale``), merges the shards' stamps and logical shapes (``merge_entries``), resolves each weight
with ``resolver.resolve_format`` / ``resolver.resolve_mxfp4`` and checks logical shapes against what
``config.json`` implies (``config_shapes``). ``check_shard_name`` is the rule for the shard file names an index's
``weight_map`` may use (docs/FORMATS.md §8 ("Model directories")), shared by the inspector and the converter's sources.

Single-tensor resolution, stamps and the shard-metadata codecs live in ``resolver.py``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from colitools.formats import model_config, source_encodings, targets
from colitools.formats.errors import FormatError, ResolveError
from colitools.formats.expert_layouts import MergedPart, Spelling
from colitools.formats.jsonfile import is_text
from colitools.formats.names import (
    LAYERS,
    MODULE_ALIASES,
    PROJECTION_ORDER,
    WEIGHT_SUFFIXES,
    TensorRole,
    is_tower,
    parse_name,
)
from colitools.formats.planar import PLANAR_LAYOUT
from colitools.formats.registry import (
    BLOCK_SCALE_SUFFIX,
    FORMATS,
    MX_SCALE_SUFFIX,
    PACKED_SUFFIX,
    QS_SUFFIX,
    UE8M0_FP8_FORMATS,
    WEIGHT_SUFFIX,
    Float,
    Fp8E4m3E8m0,
    Mxfp4,
    by_name,
)
from colitools.formats.resolver import (
    SHAPES_KEY,
    STAMP_KEY,
    Resolved,
    parse_layout,
    parse_shapes,
    parse_stamps,
    resolve_format,
    resolve_fp8_e8m0,
    resolve_mxfp4,
)

__all__ = [
    "FLOAT_WEIGHT_DTYPES",
    "ResolvedTensor",
    "check_shard_name",
    "config_shapes",
    "merge_entries",
    "resolve_container",
]

# QS_SUFFIX, PACKED_SUFFIX, MX_SCALE_SUFFIX: the formats' tensor names, owned by registry.py.
FLOAT_WEIGHT_DTYPES = frozenset({"F32", "BF16", "F16"})  # fmt 0 ("f32"): plain float tensors
MX_SCALE_DTYPES = frozenset({"U8", "F8_E8M0"})  # one E8M0 byte per block either way
_DRIVE = re.compile(r"^[A-Za-z]:")


# ---------------------------------------------------------------------------------- shard names (§5)
def shard_name_problem(shard: object) -> str | None:
    """Why ``shard`` is refused as a weight_map shard file name, or None for a plain ``*.safetensors`` name."""
    if not isinstance(shard, str) or not shard:
        return "not a file name"
    if shard.startswith(("/", "\\")) or _DRIVE.match(shard) or os.path.isabs(shard):
        return "absolute path"
    if "/" in shard or "\\" in shard:
        return "contains a path separator"
    if ".." in shard:
        return "contains '..'"
    if "\0" in shard:
        return "contains a NUL character"
    if not is_text(shard):
        return "not Unicode text (a lone surrogate escape)"
    if not shard.endswith(".safetensors"):
        return "does not end in .safetensors"
    if shard == ".safetensors":
        return "has no name before .safetensors"
    return None


def check_shard_name(shard: object, where: str, tensor: str | None = None) -> str:
    """``shard`` if it may name a shard in a ``weight_map``, else a FormatError (docs/FORMATS.md §8 ("Model directories")).

    A shard file name that is empty or not a string, absolute (including ``C:...``), contains a path separator
    (``/`` or ``\\``), ``..`` or a NUL, or does not end in ``.safetensors`` could leave the model directory or is
    not a safetensors file, and is refused. ``where`` names the index (its path or file name) and ``tensor``
    the weight_map entry, when known; the message is
    ``<where>: shard file name '<shard>' (tensor '<tensor>') is refused: <reason>``.
    """
    reason = shard_name_problem(shard)
    if reason is not None:
        used_by = f" (tensor {tensor!r})" if tensor is not None else ""
        raise FormatError(f"{where}: shard file name {shard!r}{used_by} is refused: {reason}")
    assert isinstance(shard, str)
    return shard


# ------------------------------------------------------------------------------- merging shard metadata
def merge_entries(key: str, per_file: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Merge one metadata map (stamps or shapes) over shards; one name with two values is an error."""
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    for where, entries in per_file:
        for tensor, value in entries.items():
            if tensor in merged and merged[tensor] != value:
                raise ResolveError(
                    f"tensor {tensor}: {key} is {_show(merged[tensor])} in {source[tensor]} "
                    f"but {_show(value)} in {where}"
                )
            merged[tensor], source[tensor] = value, where
    return merged


def _show(value: Any) -> str:
    return f"[{value[0]}, {value[1]}]" if isinstance(value, tuple) else repr(value)


# ------------------------------------------------------------------------------ config-implied shapes
def config_shapes(
    config: Mapping[str, Any], names: Iterable[str]
) -> dict[str, tuple[int | None, int | None]]:
    """The ``[O, I]`` that ``config.json`` implies for those of ``names`` where it is derivable.

    Embeddings and the output head (``[vocab_size, hidden_size]``), routed experts (``gate/up``
    ``[E_I, E_H]``, ``down`` ``[E_H, E_I]`` with ``E_I`` = ``moe_intermediate_size``, else
    ``intermediate_size``, and ``E_H`` = ``routed_expert_hidden_size``, else ``hidden_size``) and every
    per-layer linear role ``model_config.linear_shapes`` derives (attention and MLA projections, dense MLP,
    shared experts, routers; per layer ``model_config.layer_linear_shapes``: KDA layers), matched by the
    tensor-name map's module and leaf.
    ``None`` marks a dimension the config does not give. The numbers are the config facts
    (``formats/model_config.py``), validated there; a malformed config raises ConfigError.
    """
    facts = model_config.read_facts(config)
    hidden, vocab = facts.hidden_size, facts.vocab_size
    expert_i = facts.expert_width or None  # 0 gives no shape
    linear = model_config.linear_shapes(config)
    per_layer = model_config.layer_linear_shapes(config)
    implied: dict[str, tuple[int | None, int | None]] = {}
    for name in names:
        parsed = parse_name(name)
        if parsed.suffix not in WEIGHT_SUFFIXES or is_tower(name):
            continue  # a tower's layers have their own geometry (its own config section)
        if parsed.layer is not None and parsed.layer_prefix != parsed.root + LAYERS:
            continue  # layers nested in another module (not the text model's decoder layers)
        if parsed.role in (TensorRole.EMBED, TensorRole.HEAD):
            implied[name] = (vocab, hidden)
        elif parsed.expert is not None:
            if parsed.projection is not None:
                eh = facts.expert_hidden or hidden  # Kimi K3's latent experts: routed_expert_hidden_size
                implied[name] = (eh, expert_i) if parsed.projection == "down" else (expert_i, eh)
        elif parsed.layer is None:  # a global module a family claims (Qwen3.8's final hyper_connection_mixer)
            if (parsed.module, parsed.leaf) in linear:
                implied[name] = linear[(parsed.module, parsed.leaf)]
        elif parsed.layer is not None:
            module = ".".join(MODULE_ALIASES.get(p, p) for p in parsed.module.split("."))
            leaf = MODULE_ALIASES.get(parsed.leaf, parsed.leaf)  # gpt-oss mlp.router = the router mlp.gate
            layer_shapes = per_layer.get(parsed.layer, {})
            if (module, leaf) in layer_shapes:
                implied[name] = layer_shapes[(module, leaf)]
            elif (module, leaf) in linear:
                implied[name] = linear[(module, leaf)]
    return {name: dims for name, dims in implied.items() if dims != (None, None)}


# --------------------------------------------------------------------------------------- containers
class _TensorInfo(Protocol):
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int: ...


class _Shard(Protocol):
    """What the resolver needs of a ``SafetensorsFile``: its path, header entries and metadata."""

    path: Any
    tensors: Mapping[str, _TensorInfo]
    metadata: Mapping[str, str]


@dataclass(frozen=True)
class ResolvedTensor:
    """One stored tensor of a container, as the resolver sees it.

    ``kind`` is ``quantized`` (U8 codes with a ``.qs`` or an mxfp4 ``weight_packed``), ``float`` (F32/BF16/F16
    without ``.qs``, format f32), ``scale`` (the ``.qs`` / ``weight_scale`` of ``scale_of``), ``unresolved`` (a
    quantized weight whose ``[O, I]`` neither ``colitools.shapes`` nor ``config.json`` gives; ``problem`` says
    so; only with ``report_unresolved``) or ``other`` (anything else: integer tensors, F8 source weights, F64, a
    U8 tensor without sidecar; no format).
    ``logical_shape`` is ``[O, I]`` for weights; ``nbytes`` counts this tensor only, ``scale_nbytes`` its scale.
    """

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    kind: str
    layout: str
    format: Resolved | None = None
    logical_shape: tuple[int, int] | None = None
    stamp: str | None = None
    scale: str | None = None
    scale_nbytes: int = 0
    scale_of: str | None = None
    problem: str | None = None  # kind "unresolved": why its [O, I] (hence its format) is unknown
    parts: tuple[MergedPart, ...] = ()  # a merged blob's / fused stack's projections (expert_layouts.py)


# ``<base>.weight`` with a ``<base>.scale`` of another dtype: fp8-e4m3-e8m0's own names (F8_E4M3 codes, F8_E8M0
# scales per 128x128 block) and every target's spelling of a format's bytes (formats/targets/ ``SPELLINGS``:
# DeepSeek-V4's released mxfp4 experts, I8 codes with F8_E8M0 scales per 1x32 block), told apart by the codes'
# dtype (``--target deepseek_v4``, docs/FORMATS.md §4 Targets).
SPELLED_PAIRS: dict[str, Spelling] = {
    s.weight_dtype: s
    for s in (
        Spelling(
            WEIGHT_SUFFIX,
            Fp8E4m3E8m0.weight_dtype,
            BLOCK_SCALE_SUFFIX,
            Fp8E4m3E8m0.scale_dtype,
            Fp8E4m3E8m0.name,
        ),
        *targets.SPELLINGS,
    )
}


SPELLED_FORMATS = frozenset({*(f.name for f in UE8M0_FP8_FORMATS), Mxfp4.name})  # the formats whose spelled pairs are read here


def _spelled_scale(name: str, info: _TensorInfo, present: Mapping[str, _TensorInfo]) -> str | None:
    spelling = SPELLED_PAIRS.get(info.dtype)
    if spelling is None or not name.endswith(spelling.weight_suffix):
        return None
    scale = name[: -len(spelling.weight_suffix)] + spelling.scale_suffix
    return scale if scale in present and present[scale].dtype == spelling.scale_dtype else None


def _scale_name(name: str, info: _TensorInfo, present: Mapping[str, _TensorInfo]) -> str | None:
    """The scale tensor that makes ``name`` a quantized weight, or None."""
    if name + QS_SUFFIX in present:
        return name + QS_SUFFIX
    if info.dtype == "U8" and name.endswith(PACKED_SUFFIX):
        return name[: -len(PACKED_SUFFIX)] + MX_SCALE_SUFFIX
    return _spelled_scale(name, info, present)


# a source's MXFP8 pair: <name> F8_E4M3 + <name>_scale E8M0 (docs/FORMATS.md §5); the suffix is the registry's
MXFP8_SCALE_SUFFIX = source_encodings.Mxfp8.part("scale").suffix
MXFP8_BLOCK = 32


def _is_mxfp8_scale(name: str, info: _TensorInfo, present: Mapping[str, _TensorInfo], where: str) -> bool:
    """Whether ``name`` is the E8M0 scale (U8 or F8_E8M0) of an F8_E4M3 tensor ``<name minus _scale>``: an
    MXFP8 source pair, one scale per 32 values along the last axis (a partial last block allowed) on a 2-D
    weight or a 3-D expert stack. ResolveError when its shape does not fit its weight's."""
    if info.dtype not in MX_SCALE_DTYPES or not name.endswith(MXFP8_SCALE_SUFFIX):
        return False
    weight = present.get(name[: -len(MXFP8_SCALE_SUFFIX)])
    if weight is None or weight.dtype != "F8_E4M3" or not weight.shape:
        return False
    want = (*weight.shape[:-1], -(-weight.shape[-1] // MXFP8_BLOCK))
    if tuple(info.shape) != want:
        raise ResolveError(
            f"{where}: MXFP8 scale {name} is {list(info.shape)}, expected {list(want)} for its weight "
            f"{list(weight.shape)} (one E8M0 byte per {MXFP8_BLOCK} values of the last axis)"
        )
    return True


def resolve_container(
    files: Sequence[_Shard],
    shapes: Mapping[str, tuple[int, int]] | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    report_unresolved: bool = False,
    merged_group_size: int | None = None,
) -> dict[str, ResolvedTensor]:
    """Resolve every tensor of a container (one file, or all shards of a model), in file and offset order.

    Pairs each U8 weight with its F32 ``<name>.qs`` and each U8 ``<base>.weight_packed`` with its
    ``<base>.weight_scale``; takes ``[O, I]`` from the shards' merged ``colitools.shapes`` (plus ``shapes``,
    which must agree); applies the merged ``colibri.fmt`` stamps; checks logical shapes against ``config`` (a
    parsed ``config.json``) where it implies them; checks planar shards hold only planar-capable int4 tensors.
    A target's expert layout (formats/expert_layouts.py: merged blobs, fused stacks) resolves the tensors it
    claims, their geometry from ``config`` (``merged_group_size``: a container's ``expert_gs``).
    Any inconsistency is a ResolveError naming the file and tensor.

    Foreign containers (docs/FORMATS.md §3, "Foreign containers": colibri's converter writes 1-D codes and
    ``.qs``, no metadata): a quantized weight without a ``colitools.shapes`` entry takes its ``[O, I]`` from
    ``config`` by tensor role (``config_shapes``), as colibri's engines do. One that neither gives is never
    guessed: a ResolveError naming it, or with ``report_unresolved`` a ``ResolvedTensor`` of kind
    ``unresolved`` (the rest of the container still resolves).
    """
    c = _Container.of(files, shapes, config, report_unresolved, merged_group_size)
    resolved: dict[str, ResolvedTensor] = {}
    scale_owner: dict[str, str] = {}
    for name, (shard, info) in c.present.items():
        tensor = _resolve_claimed(c, name, shard, info)
        if tensor is not None:
            resolved[name] = tensor
            scale_owner[tensor.scale] = name
    for name, (shard, info) in c.present.items():
        if name not in resolved:
            resolved[name] = _resolve_unpaired(c, name, shard, info, scale_owner)
    if config:
        _check_config(resolved, config)
    for layout in targets.EXPERT_READERS:
        layout.check_resolved(resolved)
    return {name: resolved[name] for name in c.present}


@dataclass(frozen=True)
class _Container:
    """What every tensor of one ``resolve_container`` call is resolved against."""

    present: dict[str, tuple[_Shard, _TensorInfo]]  # every tensor by name, with its shard
    infos: dict[str, _TensorInfo]
    layouts: dict[int, str]  # id(shard) -> its layout
    stamps: dict[str, str]
    shapes: dict[str, tuple[int, int]]  # the shards' colitools.shapes and the given ones
    from_config: dict[str, tuple[int, int]]  # [O, I] config.json implies for quantized weights without shapes
    config: Mapping[str, Any] | None
    report_unresolved: bool
    merged_group_size: int | None

    @classmethod
    def of(
        cls, files: Sequence[_Shard], shapes, config, report_unresolved: bool, merged_group_size
    ) -> _Container:
        present: dict[str, tuple[_Shard, _TensorInfo]] = {}
        for shard in files:
            for name, info in shard.tensors.items():
                if name in present:
                    raise ResolveError(
                        f"tensor {name} is stored twice: in {present[name][0].path} and {shard.path}"
                    )
                present[name] = (shard, info)
        layouts = {id(shard): parse_layout(shard.metadata, where=str(shard.path)) for shard in files}
        stamps = merge_entries(
            STAMP_KEY, ((str(s.path), parse_stamps(s.metadata, where=str(s.path))) for s in files)
        )
        all_shapes = merge_entries(
            SHAPES_KEY,
            [(str(s.path), parse_shapes(s.metadata, where=str(s.path))) for s in files]
            + [("the given shapes", dict(shapes or {}))],
        )
        infos = {name: info for name, (_, info) in present.items()}
        for table, key in ((stamps, STAMP_KEY), (all_shapes, SHAPES_KEY)):
            for name in table:
                if name not in present:
                    raise ResolveError(f"{key} names tensor {name}, which is not in the container")
        from_config: dict[str, tuple[int, int]] = {}
        if config:
            unshaped = [
                n for n, (_, i) in present.items() if n not in all_shapes and _scale_name(n, i, infos)
            ]
            from_config = {
                n: (O, I)
                for n, (O, I) in config_shapes(config, unshaped).items()
                if O is not None and I is not None
            }
        return cls(present, infos, layouts, stamps, all_shapes, from_config, config, report_unresolved,
                   merged_group_size)  # fmt: skip


def _resolve_claimed(c: _Container, name: str, shard: _Shard, info: _TensorInfo) -> ResolvedTensor | None:
    """``name`` as a weight with a scale tensor: claimed by a target's expert layout (formats/targets/
    ``EXPERT_READERS``), or paired with its scale by name (``_scale_name``); None for any other tensor."""
    for layout in targets.EXPERT_READERS:
        if layout.scale_of(name, info, c.infos) is not None:
            return _resolve_layout(c, layout, name, shard, info)
    scale = _scale_name(name, info, c.infos)
    if scale is None:
        return None
    return _resolve_weight(
        name, shard, info, scale, c.infos, {**c.from_config, **c.shapes}, c.stamps, c.layouts, c.report_unresolved,
        c.config is not None,
    )  # fmt: skip


def _resolve_layout(c: _Container, layout, name: str, shard: _Shard, info: _TensorInfo) -> ResolvedTensor:
    """A tensor of a target's expert layout (a merged blob, a fused stack), resolved by the layout from
    ``config.json`` (kind ``quantized``, ``parts`` its projections, ``logical_shape`` None)."""
    where, shard_layout = str(shard.path), c.layouts[id(shard)]
    got = layout.read(name, info, c.infos, c.config, where, c.merged_group_size)
    scale_nbytes = c.infos[got.scale].nbytes
    if got.problem is not None:
        return _unresolved(
            got.problem, c.report_unresolved, name, where, info, shard_layout, got.scale, scale_nbytes
        )
    return ResolvedTensor(
        name, where, info.dtype, info.shape, info.nbytes, "quantized", shard_layout, Resolved.of(by_name(got.fmt), got.gs),
        None, None, got.scale, scale_nbytes, parts=got.parts,
    )  # fmt: skip


def _resolve_unpaired(
    c: _Container, name: str, shard: _Shard, info: _TensorInfo, scale_owner: Mapping[str, str]
) -> ResolvedTensor:
    """A tensor that is not a paired weight: a scale of one, a float tensor, or kind ``other``; a scale-named
    tensor without its weight and a stamp or shape on a tensor that is no weight are ResolveErrors."""
    where, layout = str(shard.path), c.layouts[id(shard)]
    if name in scale_owner:
        return ResolvedTensor(
            name, where, info.dtype, info.shape, info.nbytes, "scale", layout, scale_of=scale_owner[name]
        )
    if name.endswith(QS_SUFFIX):
        raise ResolveError(f"{where}: scale tensor {name} has no weight {name[: -len(QS_SUFFIX)]}")
    if _is_mxfp8_scale(name, info, c.infos, where):  # a source's MXFP8 pair: both "other", as FP8 sources
        return ResolvedTensor(name, where, info.dtype, info.shape, info.nbytes, "other", layout)
    if name.endswith(MX_SCALE_SUFFIX) and info.dtype in MX_SCALE_DTYPES:
        packed = name[: -len(MX_SCALE_SUFFIX)] + PACKED_SUFFIX
        why = f"is {c.infos[packed].dtype}, not U8" if packed in c.infos else "is missing"
        raise ResolveError(f"{where}: mxfp4 scale {name}: its weight {packed} {why}")
    if info.dtype in FLOAT_WEIGHT_DTYPES:
        stamp = c.stamps.get(name)
        if stamp not in (None, Float.name):
            raise ResolveError(
                f"{where}: tensor {name} is a plain {info.dtype} tensor but is stamped {stamp!r}"
            )
        logical = info.shape if len(info.shape) == 2 else None
        if name in c.shapes and c.shapes[name] != logical:
            raise ResolveError(
                f"{where}: tensor {name}: {SHAPES_KEY} says {_show(c.shapes[name])} "
                f"but the {info.dtype} tensor is {list(info.shape)}"
            )
        return ResolvedTensor(
            name, where, info.dtype, info.shape, info.nbytes, "float", layout, Resolved.of(Float), logical, stamp,
        )  # fmt: skip
    if name in c.stamps or name in c.shapes:
        raise ResolveError(
            f"{where}: tensor {name} ({info.dtype}, no scale tensor) is named in "
            f"{STAMP_KEY if name in c.stamps else SHAPES_KEY} but is not a weight"
        )
    return ResolvedTensor(name, where, info.dtype, info.shape, info.nbytes, "other", layout)


def _resolve_weight(
    name: str,
    shard: _Shard,
    info: _TensorInfo,
    scale: str,
    infos: Mapping[str, _TensorInfo],
    shapes: Mapping[str, tuple[int, int]],
    stamps: Mapping[str, str],
    layouts: Mapping[int, str],
    report_unresolved: bool = False,
    have_config: bool = False,
) -> ResolvedTensor:
    where, layout = str(shard.path), layouts[id(shard)]
    stamp = stamps.get(name)
    spelled = SPELLED_PAIRS[info.dtype].fmt if _spelled_scale(name, info, infos) == scale else None
    if spelled == Fp8E4m3E8m0.name:
        (O, I), fmt = _fp8_e8m0_pair(name, where, info, infos[scale], scale, shapes, stamp)
    elif spelled == Mxfp4.name or name + QS_SUFFIX not in infos:  # spelled, or a weight_packed + weight_scale
        (O, I), fmt = _mxfp4_pair(name, where, info, infos.get(scale), scale, shapes, stamp)
    else:
        scale_info = infos[scale]
        if info.dtype != "U8":
            raise ResolveError(
                f"{where}: tensor {name} has a {QS_SUFFIX} sidecar but is {info.dtype}, not U8"
            )
        if scale_info.dtype != "F32":
            raise ResolveError(f"{where}: scale tensor {scale} is {scale_info.dtype}, expected F32")
        if name not in shapes:
            source = "config.json does not determine it either" if have_config else "no config.json"
            problem = (
                f"{where}: quantized tensor {name} ({info.nbytes} weight bytes, {scale_info.nbytes} scale bytes) "
                f"has no {SHAPES_KEY} entry and {source}, so its [O, I] is unknown"
            )
            return _unresolved(
                problem, report_unresolved, name, where, info, layout, scale, scale_info.nbytes, stamp
            )
        O, I = shapes[name]
        fmt = resolve_format(name, info.nbytes, scale_info.nbytes, O, I, stamp)
    if layout == PLANAR_LAYOUT and not FORMATS[fmt.fmt].planar_eligible(I, fmt.group_size):
        raise ResolveError(
            f"{where}: {PLANAR_LAYOUT} shard holds tensor {name} as {fmt.label} [{O}, {I}]; planar needs "
            f"int4-row or int4-g64 with I % 64 == 0"
        )
    return ResolvedTensor(
        name, where, info.dtype, info.shape, info.nbytes, "quantized", layout, fmt, (O, I), stamp,
        scale, infos[scale].nbytes,
    )  # fmt: skip


def _fp8_e8m0_pair(
    name: str, where: str, info: _TensorInfo, scale_info: _TensorInfo, scale: str, shapes, stamp: str | None
) -> tuple[tuple[int, int], Resolved]:
    """``([O, I], format)`` of an FP8 ``<base>.weight`` (F8_E4M3 ``[O, I]``) with its E8M0 ``.scale``:
    fp8-e4m3-e8m0, -t32 or -r32 by the scale's shape."""
    if len(info.shape) != 2:
        raise ResolveError(f"{where}: FP8 weight {name} is {list(info.shape)}, expected [O, I]")
    O, I = info.shape  # F8_E4M3 codes store [O, I] exactly
    if name in shapes and tuple(shapes[name]) != (O, I):
        raise ResolveError(
            f"{where}: tensor {name}: {SHAPES_KEY} says {list(shapes[name])}, stored [{O}, {I}]"
        )
    if stamp is not None:
        raise ResolveError(f"{where}: tensor {name} is an FP8 + E8M0 pair but is stamped {stamp!r}")
    # the scale's shape says the block grid (128x128, 32x32 tiles, 1x32 row groups): resolver.resolve_fp8_e8m0
    fmt = resolve_fp8_e8m0(name, info.nbytes, scale_info.nbytes, O, I, tuple(scale_info.shape))
    return (O, I), fmt


def _mxfp4_pair(
    name: str,
    where: str,
    info: _TensorInfo,
    scale_info: _TensorInfo | None,
    scale: str,
    shapes,
    stamp: str | None,
) -> tuple[tuple[int, int], Resolved]:
    """``([O, I], format)`` of an mxfp4 weight (``[O, I/2]`` codes, or 1-D with a ``colitools.shapes`` entry)
    with its E8M0 scales."""
    if scale_info is None:
        raise ResolveError(f"{where}: mxfp4 weight {name} has no scale tensor {scale}")
    if scale_info.dtype not in MX_SCALE_DTYPES:
        raise ResolveError(f"{where}: mxfp4 scale {scale} is {scale_info.dtype}, expected U8 (E8M0)")
    if name in shapes:
        O, I = shapes[name]
    elif len(info.shape) == 2:  # [O, I/2] stores I exactly (I is even for mxfp4)
        O, I = info.shape[0], 2 * info.shape[1]
    else:
        raise ResolveError(
            f"{where}: mxfp4 weight {name} is {list(info.shape)} and has no {SHAPES_KEY} entry"
        )
    if stamp not in (None, Mxfp4.name):
        raise ResolveError(f"{where}: tensor {name} is an mxfp4 pair but is stamped {stamp!r}")
    return (O, I), resolve_mxfp4(name, info.nbytes, scale_info.nbytes, O, I)


def _unresolved(
    problem: str,
    report_unresolved: bool,
    name: str,
    where: str,
    info: _TensorInfo,
    layout: str,
    scale: str,
    scale_nbytes: int,
    stamp: str | None = None,
) -> ResolvedTensor:
    """A quantized weight whose ``[O, I]`` cannot be known: ResolveError(``problem``), or with
    ``report_unresolved`` the tensor marked ``unresolved`` with that problem."""
    if not report_unresolved:
        raise ResolveError(problem)
    return ResolvedTensor(
        name, where, info.dtype, info.shape, info.nbytes, "unresolved", layout, None, None, stamp, scale,
        scale_nbytes, problem=problem,
    )  # fmt: skip


def _check_config(resolved: Mapping[str, ResolvedTensor], config: Mapping[str, Any]) -> None:
    """The container against ``config.json``: every tensor the model needs is there
    (``model_config.check_complete``, after the shapes: a wrong tensor is named before a missing one), a float
    routed-expert projection is 2-D, and the ``[O, I]`` the config implies (``config_shapes``) are the tensors'."""
    for name, t in resolved.items():
        parsed = parse_name(name)
        if (t.kind == "float" and parsed.role is TensorRole.EXPERT and parsed.projection in PROJECTION_ORDER
                and parsed.suffix in WEIGHT_SUFFIXES and len(t.shape) != 2):  # fmt: skip
            raise ResolveError(
                f"{t.file}: tensor {name} is a routed expert's {parsed.projection} projection stored "
                f"{len(t.shape)}-D {list(t.shape)}; per-expert weights are 2-D [O, I]"
            )
    weights = {n: t for n, t in resolved.items() if t.logical_shape is not None}
    for name, (want_o, want_i) in config_shapes(config, weights).items():
        tensor = weights[name]
        O, I = tensor.logical_shape  # type: ignore[misc]
        if (want_o not in (None, O)) or (want_i not in (None, I)):
            source = SHAPES_KEY if tensor.kind == "quantized" else "its stored shape"
            show = [d if d is not None else "?" for d in (want_o, want_i)]
            raise ResolveError(
                f"{tensor.file}: tensor {name} is [{O}, {I}] ({source}) but config.json implies "
                f"[{show[0]}, {show[1]}]"
            )
    model_config.check_complete(config, resolved)
