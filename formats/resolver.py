"""Resolution: which format a stored tensor is in, from byte arithmetic alone (FORMATS-SPEC §3).

A quantized tensor never stores its format as a number. The reader takes the weight bytes ``nb``, the scale
bytes ``ns`` and the logical ``[O, I]`` (``__metadata__["colitools.shapes"]``) and finds the one format whose
byte signature matches; a stamp (``__metadata__["colibri.fmt"]``) settles the few signatures that two formats
share. Every byte count comes from the registry (``registry.py``); nothing here computes a size itself.

Three layers, each usable on its own:

* ``resolve_format`` / ``resolve_mxfp4``: one tensor from its byte counts (the spec's algorithm, step by step);
* ``stamp_for`` / ``check_roundtrip``: the writer's side (which stamp it must write; does it read back?);
* ``resolve_container``: every tensor of a set of shards (pairing weights with ``.qs`` / ``weight_scale``,
  merging stamps and logical shapes across shards, checking them against ``config.json``).
"""

# ruff: noqa: E741  (O and I are the spec's names for out_features and in_features)
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from colitools.formats.errors import FormatError, ResolveError
from colitools.formats.planar import PLANAR_BLOCK, PLANAR_LAYOUT
from colitools.formats.registry import (
    E8Iq3Lattice,
    Float,
    Format,
    Fp8E4m3B128,
    Int2Row,
    Int3G64,
    Int4Grouped,
    Int4Row,
    Int8Row,
    Mxfp4,
    by_name,
    detect_group_size,
)

__all__ = [
    "FLOAT_WEIGHT_DTYPES",
    "LAYOUT_KEY",
    "LAYOUTS",
    "PAIRS_LAYOUT",
    "SHAPES_KEY",
    "STAMP_KEY",
    "Resolved",
    "ResolvedTensor",
    "check_roundtrip",
    "config_shapes",
    "encode_shapes",
    "encode_stamps",
    "merge_entries",
    "parse_layout",
    "parse_shapes",
    "parse_stamps",
    "resolve_container",
    "resolve_format",
    "resolve_mxfp4",
    "stamp_for",
]

STAMP_KEY = "colibri.fmt"
SHAPES_KEY = "colitools.shapes"
LAYOUT_KEY = "colitools.layout"
PAIRS_LAYOUT = "pairs"  # the default; a shard without LAYOUT_KEY is "pairs"
LAYOUTS = (PAIRS_LAYOUT, PLANAR_LAYOUT)
QS_SUFFIX = ".qs"
PACKED_SUFFIX = ".weight_packed"
MX_SCALE_SUFFIX = ".weight_scale"
FLOAT_WEIGHT_DTYPES = frozenset({"F32", "BF16", "F16"})  # fmt 0 ("f32"): plain float tensors
MX_SCALE_DTYPES = frozenset({"U8", "F8_E8M0"})  # one E8M0 byte per block either way


@dataclass(frozen=True)
class Resolved:
    """A resolved format: ordinal, stamp string and group size (int4-grouped only, else None)."""

    fmt: int
    name: str
    group_size: int | None = None

    @classmethod
    def of(cls, fmt: type[Format], gs: int | None = None) -> Resolved:
        return cls(fmt.ord, fmt.name, gs)

    @property
    def label(self) -> str:
        """``int4-grouped`` with its group size as ``int4-g64``; other formats by their name."""
        return f"int4-g{self.group_size}" if self.group_size is not None else self.name


# ------------------------------------------------------------------------------------ one tensor (§3)
def _check_dims(tensor: str, O: int, I: int) -> None:
    for dim, value in (("O", O), ("I", I)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ResolveError(f"tensor {tensor}: logical shape [{O}, {I}] has a non-positive {dim}")


def _signature(O: int, I: int) -> str:
    """The byte counts each layout would have at [O, I], for error messages."""
    return (
        f"int8-row/fp8 {Int8Row.weight_nbytes(O, I)}, int4 {Int4Row.weight_nbytes(O, I)}, "
        f"int2 {Int2Row.weight_nbytes(O, I)}, int3-g64 {Int3G64.weight_nbytes(O, I)}, "
        f"e8 {E8Iq3Lattice.weight_nbytes(O, I)}"
    )


def _by_bytes(tensor: str, nb: int, ns: int, O: int, I: int) -> Resolved:
    """Spec §3 steps 1-5 for an unstamped tensor."""
    where = f"tensor {tensor}: weight bytes {nb}, scale bytes {ns} for [{O}, {I}]"
    # 1. e8 first: its signature (one 4-byte scale) is checked before any weight-byte precedence.
    if ns == E8Iq3Lattice.scale_nbytes(O, I) and nb == E8Iq3Lattice.weight_nbytes(O, I):
        return Resolved.of(E8Iq3Lattice)
    # 2. By weight bytes, precedence int8 > int4 > int2 > int3.
    for fmt in (Int8Row, Int4Row, Int2Row, Int3G64):
        if nb == fmt.weight_nbytes(O, I):
            break
    else:
        raise ResolveError(f"{where}: no known layout ({_signature(O, I)})")
    if fmt is Int8Row:
        # 4. int8-row vs fp8-e4m3-b128: same weight bytes, told apart by the scale count.
        row = ns == Int8Row.scale_nbytes(O, I)
        blk = ns == Fp8E4m3B128.scale_nbytes(O, I)
        if row or blk:  # both (O == nblk) and no stamp -> int8-row
            return Resolved.of(Int8Row if row else Fp8E4m3B128)
        raise ResolveError(
            f"{where}: weight bytes are int8-row/fp8's but the scale bytes match neither "
            f"(int8-row {Int8Row.scale_nbytes(O, I)}, fp8-e4m3-b128 {Fp8E4m3B128.scale_nbytes(O, I)})"
        )
    if fmt is Int4Row:
        # 3. int4 with a detected group size is int4-grouped; one scale per row is int4-row.
        try:
            gs = detect_group_size(O, I, ns, tensor=tensor)
        except ResolveError:
            raise ResolveError(
                f"{where}: weight bytes are int4's but the scale bytes match neither int4-row "
                f"({Int4Row.scale_nbytes(O, I)}) nor any group size"
            ) from None
        return Resolved.of(Int4Row) if gs is None else Resolved.of(Int4Grouped, gs)
    # 5. The scale byte count must match the resolved format exactly.
    if ns != fmt.scale_nbytes(O, I):
        raise ResolveError(
            f"{where}: weight bytes are {fmt.name}'s but {fmt.name} needs {fmt.scale_nbytes(O, I)} scale bytes"
        )
    return Resolved.of(fmt)


def _allowed(tensor: str, nb: int, ns: int, O: int, I: int) -> list[Resolved]:
    """Every format whose weight *and* scale byte counts match, in precedence order (for stamps)."""
    allowed = []
    for fmt in (E8Iq3Lattice, Int8Row, Fp8E4m3B128, Int4Row, Int4Grouped, Int2Row, Int3G64):
        if nb != fmt.weight_nbytes(O, I):
            continue
        if fmt is Int4Grouped:  # int4 with a detected group size (one scale per row is int4-row above)
            try:
                gs = detect_group_size(O, I, ns, tensor=tensor)
            except ResolveError:
                gs = None
            if gs is not None:
                allowed.append(Resolved.of(Int4Grouped, gs))
        elif ns == fmt.scale_nbytes(O, I):
            allowed.append(Resolved.of(fmt))
    return allowed


def _stamp_format(tensor: str, stamp: str) -> type[Format]:
    try:
        return by_name(stamp)
    except FormatError:
        raise ResolveError(f"tensor {tensor}: stamp {stamp!r} is not a known format name") from None


def resolve_format(tensor: str, nb: int, ns: int, O: int, I: int, stamp: str | None = None) -> Resolved:
    """Resolve a U8 weight with a ``.qs`` sidecar from its byte counts (FORMATS-SPEC §3).

    ``nb`` weight bytes, ``ns`` ``.qs`` bytes, ``[O, I]`` the logical shape, ``stamp`` the tensor's
    ``colibri.fmt`` entry if any. Without a stamp the spec's precedence applies (e8 first, then int8 > int4 >
    int2 > int3, a detected group size makes int4 grouped, int8-row over fp8 when both scale counts match).
    A stamp selects among the formats whose weight and scale bytes both match; a stamp naming a format the
    bytes do not allow is an error. Every error is a one-line ResolveError naming the tensor and both counts.
    """
    _check_dims(tensor, O, I)
    if stamp is None:
        return _by_bytes(tensor, nb, ns, O, I)
    try:
        fmt = _stamp_format(tensor, stamp)
    except ResolveError as exc:
        raise ResolveError(f"{exc} (weight bytes {nb}, scale bytes {ns} for [{O}, {I}])") from None
    allowed = _allowed(tensor, nb, ns, O, I)
    for candidate in allowed:
        if candidate.fmt == fmt.ord:
            return candidate
    allows = ", ".join(r.label for r in allowed) or "no known format"
    raise ResolveError(
        f"tensor {tensor}: stamp {stamp!r} contradicts its bytes: weight bytes {nb} and scale bytes {ns} "
        f"for [{O}, {I}] allow {allows}"
    )


def resolve_mxfp4(tensor: str, packed_nbytes: int, scale_nbytes: int, O: int, I: int) -> Resolved:
    """Resolve an mxfp4 pair: ``weight_packed`` must be ``O*I/2`` bytes, ``weight_scale`` ``O*I/32``."""
    _check_dims(tensor, O, I)
    where = f"tensor {tensor}: weight_packed bytes {packed_nbytes}, weight_scale bytes {scale_nbytes} for [{O}, {I}]"
    try:
        Mxfp4.check_encodable(O, I, name=tensor)
    except FormatError:
        raise ResolveError(f"{where}: mxfp4 needs I % 32 == 0") from None
    want_packed, want_scale = Mxfp4.weight_nbytes(O, I), Mxfp4.scale_nbytes(O, I)
    if (packed_nbytes, scale_nbytes) != (want_packed, want_scale):
        raise ResolveError(f"{where}: mxfp4 needs {want_packed} and {want_scale}")
    return Resolved.of(Mxfp4)


# ---------------------------------------------------------------------------------------- writer side
def _writer_format(tensor: str, fmt_name: str, gs: int | None) -> type[Format]:
    try:
        fmt = by_name(fmt_name)
    except FormatError as exc:
        raise ResolveError(f"tensor {tensor}: {exc}") from None
    if (fmt is Int4Grouped) != (gs is not None):
        raise ResolveError(f"tensor {tensor}: group size {gs} given for format {fmt_name}")
    return fmt


def _try_resolve(tensor: str, nb: int, ns: int, O: int, I: int, stamp: str | None) -> Resolved | None:
    try:
        return resolve_format(tensor, nb, ns, O, I, stamp)
    except ResolveError:
        return None


def stamp_for(
    name: str, fmt_name: str, O: int, I: int, gs: int | None = None, *, allow_stamp: bool = True
) -> str | None:
    """The ``colibri.fmt`` stamp a writer must record for ``name`` written as ``fmt_name`` ``[O, I]``.

    ``None`` when the bytes alone resolve back to ``(fmt_name, gs)``. A stamp is returned only for the
    collisions the spec settles with stamps: fp8-e4m3-b128 against int8-row (``O == nblk``), and any format
    against e8-iq3-lattice's signature (int8-row/fp8 at ``I == 98``, int4-row at ``O == 1``, ``I`` in
    ``{195, 196, 391, 392, ...}``); e8-iq3-lattice itself is stamped at ``I == 98`` as the spec asks.
    Any other tensor whose bytes would resolve to another format (int3-g64 at ``I`` in ``{24, 47, 48, 95, 96,
    143, 144}``, int2-row at ``I <= 2``, int4-row at ``I == 1``) raises ResolveError: the writer falls back to
    int8-row. With ``allow_stamp=False`` (routed experts are never stamped) a needed stamp raises too.
    """
    fmt = _writer_format(name, fmt_name, gs)
    _check_dims(name, O, I)
    if fmt is Float:
        return None
    if fmt is Mxfp4:  # recognised by its tensor pair, never stamped
        resolve_mxfp4(name, fmt.weight_nbytes(O, I), fmt.scale_nbytes(O, I), O, I)
        return None
    nb, ns = fmt.weight_nbytes(O, I, gs), fmt.scale_nbytes(O, I, gs)
    want = Resolved.of(fmt, gs)
    plain = _try_resolve(name, nb, ns, O, I, None)
    spec_stamped = fmt is E8Iq3Lattice and I == 98  # stamped by the spec although step 1 already picks it
    if plain == want and not spec_stamped:
        return None
    stampable = plain is not None and (
        plain.fmt == E8Iq3Lattice.ord or (plain.fmt == Int8Row.ord and fmt is Fp8E4m3B128)
    )
    where = f"tensor {name}: {want.label} [{O}, {I}] (weight bytes {nb}, scale bytes {ns})"
    if not stampable or _try_resolve(name, nb, ns, O, I, fmt.name) != want:
        became = plain.label if plain else "nothing"
        raise ResolveError(
            f"{where} would resolve as {became}, which no stamp may settle; write int8-row instead"
        )
    if not allow_stamp:
        raise ResolveError(
            f"{where} needs a {STAMP_KEY} stamp ({plain.label} has the same bytes), and this tensor may "
            f"not be stamped; write int8-row instead"
        )
    return fmt.name


def check_roundtrip(
    tensor: str,
    fmt_name: str,
    gs: int | None,
    O: int,
    I: int,
    stamp: str | None,
    *,
    nb: int | None = None,
    ns: int | None = None,
) -> Resolved:
    """Assert that the writer's own bytes (plus ``stamp``) resolve to exactly ``(fmt_name, gs)``.

    ``nb``/``ns`` are the byte counts actually produced (weight codes, scales); when given they must equal the
    registry's counts for ``[O, I]``. Returns the resolution; raises ResolveError naming the tensor otherwise.
    """
    fmt = _writer_format(tensor, fmt_name, gs)
    _check_dims(tensor, O, I)
    want_nb, want_ns = fmt.weight_nbytes(O, I, gs), fmt.scale_nbytes(O, I, gs)
    if (nb, ns) != (None, None) and (nb, ns) != (want_nb, want_ns):
        raise ResolveError(
            f"tensor {tensor}: {fmt_name} [{O}, {I}] wrote weight bytes {nb} and scale bytes {ns}, "
            f"expected {want_nb} and {want_ns}"
        )
    if fmt is Float:
        return Resolved.of(Float)
    if fmt is Mxfp4:
        if stamp not in (None, Mxfp4.name):
            raise ResolveError(f"tensor {tensor}: mxfp4 weight stamped {stamp!r}")
        return resolve_mxfp4(tensor, want_nb, want_ns, O, I)
    got = resolve_format(tensor, want_nb, want_ns, O, I, stamp)
    if got != Resolved.of(fmt, gs):
        raise ResolveError(
            f"tensor {tensor}: written as {Resolved.of(fmt, gs).label} but its bytes (weight {want_nb}, "
            f"scale {want_ns}, [{O}, {I}], stamp {stamp}) resolve as {got.label}"
        )
    return got


# ----------------------------------------------------------------------------------- shard metadata
def _json_object(where: str, key: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ResolveError(f"{where}: __metadata__[{key!r}] is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ResolveError(f"{where}: __metadata__[{key!r}] is not a JSON object")
    return value


def parse_stamps(metadata: Mapping[str, str], *, where: str = "?") -> dict[str, str]:
    """``colibri.fmt`` of one shard: ``{tensor: format name}`` (``{}`` without the key)."""
    if STAMP_KEY not in metadata:
        return {}
    stamps = _json_object(where, STAMP_KEY, metadata[STAMP_KEY])
    for tensor, name in stamps.items():
        if not isinstance(name, str):
            raise ResolveError(f"{where}: {STAMP_KEY} stamp of tensor {tensor} is not a string")
        try:
            _stamp_format(tensor, name)
        except ResolveError as exc:
            raise ResolveError(f"{where}: {exc}") from None
    return stamps


def parse_shapes(metadata: Mapping[str, str], *, where: str = "?") -> dict[str, tuple[int, int]]:
    """``colitools.shapes`` of one shard: ``{tensor: (O, I)}`` (``{}`` without the key)."""
    if SHAPES_KEY not in metadata:
        return {}
    shapes = {}
    for tensor, dims in _json_object(where, SHAPES_KEY, metadata[SHAPES_KEY]).items():
        if (
            not isinstance(dims, list)
            or len(dims) != 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
        ):
            raise ResolveError(f"{where}: {SHAPES_KEY} entry of tensor {tensor} is {dims!r}, not [O, I] >= 1")
        shapes[tensor] = (dims[0], dims[1])
    return shapes


def parse_layout(metadata: Mapping[str, str], *, where: str = "?") -> str:
    """``colitools.layout`` of one shard; ``pairs`` when absent. An unknown layout is an error (never guessed)."""
    layout = metadata.get(LAYOUT_KEY, PAIRS_LAYOUT)
    if layout not in LAYOUTS:
        raise ResolveError(f"{where}: unknown {LAYOUT_KEY} {layout!r} (known: {', '.join(LAYOUTS)})")
    return layout


def encode_stamps(stamps: Mapping[str, str]) -> str:
    """The ``colibri.fmt`` metadata string a writer stores (JSON, sorted keys)."""
    return json.dumps(dict(stamps), sort_keys=True, separators=(",", ":"))


def encode_shapes(shapes: Mapping[str, tuple[int, int]]) -> str:
    """The ``colitools.shapes`` metadata string a writer stores (JSON, sorted keys; ``{}`` when empty)."""
    return json.dumps(
        {k: [int(O), int(I)] for k, (O, I) in shapes.items()}, sort_keys=True, separators=(",", ":")
    )


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
_EXPERT_RE = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight(_packed)?$")
_EMBED_RE = re.compile(r"(^|\.)(embed_tokens|lm_head)\.weight(_packed)?$")


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def config_shapes(
    config: Mapping[str, Any], names: Iterable[str]
) -> dict[str, tuple[int | None, int | None]]:
    """The ``[O, I]`` that ``config.json`` implies for those of ``names`` where it is derivable.

    Modest on purpose: embeddings and the output head (``[vocab_size, hidden_size]``) and routed experts
    (``gate/up`` ``[E_I, hidden_size]``, ``down`` ``[hidden_size, E_I]`` with ``E_I`` =
    ``moe_intermediate_size``, else ``intermediate_size``). ``None`` marks a dimension the config does not give.
    A multimodal config's ``text_config`` is used when the top level has no ``hidden_size``.
    """
    if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]
    hidden = _int(config, "hidden_size")
    vocab = _int(config, "vocab_size")
    expert_i = _int(config, "moe_intermediate_size", "intermediate_size")
    implied: dict[str, tuple[int | None, int | None]] = {}
    for name in names:
        if _EMBED_RE.search(name):
            implied[name] = (vocab, hidden)
        elif m := _EXPERT_RE.search(name):
            implied[name] = (hidden, expert_i) if m.group(1) in ("down_proj", "w2") else (expert_i, hidden)
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
    without ``.qs``, format f32), ``scale`` (the ``.qs`` / ``weight_scale`` of ``scale_of``) or ``other``
    (anything else: integer tensors, F8 source weights, F64, a U8 tensor without sidecar; no format).
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


def _scale_name(name: str, info: _TensorInfo, present: Mapping[str, _TensorInfo]) -> str | None:
    """The scale tensor that makes ``name`` a quantized weight, or None."""
    if name + QS_SUFFIX in present:
        return name + QS_SUFFIX
    if info.dtype == "U8" and name.endswith(PACKED_SUFFIX):
        return name[: -len(PACKED_SUFFIX)] + MX_SCALE_SUFFIX
    return None


def resolve_container(
    files: Sequence[_Shard],
    shapes: Mapping[str, tuple[int, int]] | None = None,
    config: Mapping[str, Any] | None = None,
) -> dict[str, ResolvedTensor]:
    """Resolve every tensor of a container (one file, or all shards of a model), in file and offset order.

    Pairs each U8 weight with its F32 ``<name>.qs`` and each U8 ``<base>.weight_packed`` with its
    ``<base>.weight_scale``; takes ``[O, I]`` from the shards' merged ``colitools.shapes`` (plus ``shapes``,
    which must agree); applies the merged ``colibri.fmt`` stamps; checks logical shapes against ``config`` (a
    parsed ``config.json``) where it implies them; checks planar shards hold only planar-capable int4 tensors.
    Any inconsistency is a ResolveError naming the file and tensor.
    """
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

    resolved: dict[str, ResolvedTensor] = {}
    scale_owner: dict[str, str] = {}
    for name, (shard, info) in present.items():
        scale = _scale_name(name, info, infos)
        if scale is not None:
            resolved[name] = _resolve_weight(name, shard, info, scale, infos, all_shapes, stamps, layouts)
            scale_owner[scale] = name
    for name, (shard, info) in present.items():
        where, layout = str(shard.path), layouts[id(shard)]
        if name in resolved:
            continue
        if name in scale_owner:
            resolved[name] = ResolvedTensor(
                name, where, info.dtype, info.shape, info.nbytes, "scale", layout, scale_of=scale_owner[name]
            )
        elif name.endswith(QS_SUFFIX):
            raise ResolveError(f"{where}: scale tensor {name} has no weight {name[: -len(QS_SUFFIX)]}")
        elif name.endswith(MX_SCALE_SUFFIX) and info.dtype in MX_SCALE_DTYPES:
            packed = name[: -len(MX_SCALE_SUFFIX)] + PACKED_SUFFIX
            why = f"is {infos[packed].dtype}, not U8" if packed in infos else "is missing"
            raise ResolveError(f"{where}: mxfp4 scale {name}: its weight {packed} {why}")
        elif info.dtype in FLOAT_WEIGHT_DTYPES:
            stamp = stamps.get(name)
            if stamp not in (None, Float.name):
                raise ResolveError(
                    f"{where}: tensor {name} is a plain {info.dtype} tensor but is stamped {stamp!r}"
                )
            logical = info.shape if len(info.shape) == 2 else None
            if name in all_shapes and all_shapes[name] != logical:
                raise ResolveError(
                    f"{where}: tensor {name}: {SHAPES_KEY} says {_show(all_shapes[name])} "
                    f"but the {info.dtype} tensor is {list(info.shape)}"
                )
            resolved[name] = ResolvedTensor(
                name, where, info.dtype, info.shape, info.nbytes, "float", layout,
                Resolved.of(Float), logical, stamp,
            )  # fmt: skip
        else:
            if name in stamps or name in all_shapes:
                raise ResolveError(
                    f"{where}: tensor {name} ({info.dtype}, no scale tensor) is named in "
                    f"{STAMP_KEY if name in stamps else SHAPES_KEY} but is not a weight"
                )
            resolved[name] = ResolvedTensor(name, where, info.dtype, info.shape, info.nbytes, "other", layout)
    if config:
        _check_config(resolved, config)
    return {name: resolved[name] for name in present}


def _resolve_weight(
    name: str,
    shard: _Shard,
    info: _TensorInfo,
    scale: str,
    infos: Mapping[str, _TensorInfo],
    shapes: Mapping[str, tuple[int, int]],
    stamps: Mapping[str, str],
    layouts: Mapping[int, str],
) -> ResolvedTensor:
    where, layout = str(shard.path), layouts[id(shard)]
    stamp = stamps.get(name)
    mxfp4 = name + QS_SUFFIX not in infos
    if mxfp4:
        if scale not in infos:
            raise ResolveError(f"{where}: mxfp4 weight {name} has no scale tensor {scale}")
        scale_info = infos[scale]
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
        fmt = resolve_mxfp4(name, info.nbytes, scale_info.nbytes, O, I)
    else:
        scale_info = infos[scale]
        if info.dtype != "U8":
            raise ResolveError(
                f"{where}: tensor {name} has a {QS_SUFFIX} sidecar but is {info.dtype}, not U8"
            )
        if scale_info.dtype != "F32":
            raise ResolveError(f"{where}: scale tensor {scale} is {scale_info.dtype}, expected F32")
        if name not in shapes:
            raise ResolveError(
                f"{where}: quantized tensor {name} ({info.nbytes} weight bytes, {scale_info.nbytes} scale bytes) "
                f"has no {SHAPES_KEY} entry, so its [O, I] is unknown"
            )
        O, I = shapes[name]
        fmt = resolve_format(name, info.nbytes, scale_info.nbytes, O, I, stamp)
    if layout == PLANAR_LAYOUT and not (
        (fmt.fmt == Int4Row.ord or (fmt.fmt == Int4Grouped.ord and fmt.group_size == PLANAR_BLOCK))
        and I % PLANAR_BLOCK == 0
    ):
        raise ResolveError(
            f"{where}: {PLANAR_LAYOUT} shard holds tensor {name} as {fmt.label} [{O}, {I}]; planar needs "
            f"int4-row or int4-g64 with I % 64 == 0"
        )
    return ResolvedTensor(
        name, where, info.dtype, info.shape, info.nbytes, "quantized", layout, fmt, (O, I), stamp,
        scale, scale_info.nbytes,
    )  # fmt: skip


def _check_config(resolved: Mapping[str, ResolvedTensor], config: Mapping[str, Any]) -> None:
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
