"""Resolution: which format a stored tensor is in, from byte arithmetic alone (docs/FORMATS.md §3).

A quantized tensor never stores its format as a number. The reader takes the weight bytes ``nb``, the scale
bytes ``ns`` and the logical ``[O, I]`` (``__metadata__["colitools.shapes"]``) and finds the one format whose
byte signature matches; a stamp (``__metadata__["colibri.fmt"]``) settles the few signatures that two formats
share. Every byte count comes from the registry (``registry.py``); nothing here computes a size itself.

Two layers, each usable on its own:

* ``resolve_format`` / ``resolve_mxfp4``: one tensor from its byte counts (the spec's algorithm, step by step);
* ``stamp_for`` / ``check_roundtrip``: the writer's side (which stamp it must write; does it read back?);

plus the codecs of the shard metadata they use (``parse_stamps`` / ``parse_shapes`` / ``parse_layout``,
``encode_stamps`` / ``encode_shapes``). Resolving every tensor of a set of shards (pairing weights with their
scales, merging metadata across shards, the ``config.json`` cross-check) is ``container.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from colitools.formats import layouts
from colitools.formats.errors import FormatError, ResolveError, ResolveReason
from colitools.formats.format_names import format_label
from colitools.formats.jsonfile import invalid_text, shown_text
from colitools.formats.registry import (
    FALLBACK_FORMAT,
    QS_SUFFIX,
    RANK_SIGNATURE_FIRST,
    UE8M0_FP8_FORMATS,
    E8Iq3Lattice,
    Float,
    Format,
    Fp8E4m3B128,
    Int8Row,
    Mxfp4,
    by_name,
    detect_group_size,
    ranked,
)

__all__ = [
    "LAYOUT_KEY",
    "LAYOUTS",
    "PAIRS_LAYOUT",
    "SHAPES_KEY",
    "STAMP_KEY",
    "Resolved",
    "ResolveReason",
    "check_roundtrip",
    "encode_shapes",
    "encode_stamps",
    "parse_layout",
    "parse_shapes",
    "parse_stamps",
    "resolve_format",
    "resolve_fp8_e8m0",
    "resolve_mxfp4",
    "stamp_for",
    "ue8m0_candidates",
    "ue8m0_fp8_format",
    "ue8m0_fp8_signature",
]

STAMP_KEY = "colibri.fmt"
SHAPES_KEY = "colitools.shapes"
LAYOUT_KEY = "colitools.layout"
PAIRS_LAYOUT = layouts.PAIRS.stored  # the default; a shard without LAYOUT_KEY is "pairs"
LAYOUTS = layouts.STORED_NAMES  # the stored spellings (formats/layouts.py)


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
        return format_label(self.name, self.group_size) if self.group_size is not None else self.name


# ------------------------------------------------------------------------------------ one tensor (§3)
def _check_dims(tensor: str, O: int, I: int) -> None:
    for dim, value in (("O", O), ("I", I)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ResolveError.about(
                tensor, f"logical shape [{O}, {I}] has a non-positive {dim}", ResolveReason.BAD_SHAPE
            )


def _qs_formats() -> tuple[type[Format], ...]:
    """The ``.qs`` formats in colibri's byte precedence (each class's ``byte_rank``, ``registry.ranked``)."""
    return ranked(QS_SUFFIX)


def _weight_ranks(fmts: tuple[type[Format], ...]) -> list[list[type[Format]]]:
    """``fmts`` (ranked) grouped by weight rank: the formats of one group share their weight bytes."""
    groups: dict[int, list[type[Format]]] = {}
    for fmt in fmts:
        groups.setdefault(fmt.byte_rank[0], []).append(fmt)
    return list(groups.values())


def _signature(O: int, I: int) -> str:
    """The weight byte count of each weight rank at [O, I], for error messages."""
    return ", ".join(
        f"{'/'.join(f.name for f in group)} {group[0].weight_nbytes(O, I)}"
        for group in _weight_ranks(_qs_formats())
    )


def _scale_match(tensor: str, fmt: type[Format], ns: int, O: int, I: int) -> Resolved | None:
    """``fmt`` when ``ns`` is its scale byte count at [O, I] (a grouped format's at a detected group size)."""
    if not fmt.grouped:
        return Resolved.of(fmt) if ns == fmt.scale_nbytes(O, I) else None
    try:
        gs = detect_group_size(O, I, ns, tensor=tensor)
    except ResolveError:
        return None
    return None if gs is None else Resolved.of(fmt, gs)  # one scale per row: the row format ranked before it


def _scale_mismatch(tensor: str, where: str, group: list[type[Format]], O: int, I: int) -> ResolveError:
    """Step 5's error: the weight bytes are ``group``'s (one weight rank), the scale bytes none of theirs."""
    if len(group) == 1:
        fmt = group[0]
        return ResolveError.about(
            tensor,
            f"{where}: weight bytes are {fmt.name}'s but {fmt.name} needs "
            f"{fmt.scale_nbytes(O, I)} scale bytes",
            ResolveReason.SCALE_MISMATCH,
        )
    counts = ", ".join(
        f"{f.name} at any group size" if f.grouped else f"{f.name} {f.scale_nbytes(O, I)}" for f in group
    )
    grouped = any(f.grouped for f in group)
    return ResolveError.about(
        tensor,
        f"{where}: weight bytes are {'/'.join(f.name for f in group)}'s but the scale bytes match "
        f"{'neither' if len(group) == 2 else 'none of them'} ({counts})",
        ResolveReason.NO_GROUP_SIZE if grouped else ResolveReason.SCALE_MISMATCH,
    )


def _by_bytes(tensor: str, nb: int, ns: int, O: int, I: int) -> Resolved:
    """Spec §3 steps 1-5 for an unstamped tensor, in the registry's byte precedence (``byte_rank``)."""
    where = f"weight bytes {nb}, scale bytes {ns} for [{O}, {I}]"
    fmts = _qs_formats()
    # 1. e8 first: its signature (one 4-byte scale) is checked before any weight-byte precedence.
    for fmt in fmts:
        if fmt.byte_rank[0] == RANK_SIGNATURE_FIRST and nb == fmt.weight_nbytes(O, I):
            found = _scale_match(tensor, fmt, ns, O, I)
            if found is not None:
                return found
    # 2. By weight bytes, the lowest weight rank first: int8 > int4 > int2 > int3.
    by_weight = [f for f in fmts if f.byte_rank[0] != RANK_SIGNATURE_FIRST and nb == f.weight_nbytes(O, I)]
    if not by_weight:
        raise ResolveError.about(
            tensor, f"{where}: no known layout ({_signature(O, I)})", ResolveReason.NO_LAYOUT
        )
    # 3./4. The formats of that rank by their scale bytes, in scale-rank order: int8-row before fp8-e4m3-b128
    # (both match at O == nblk: int8-row), int4-row before int4-grouped at a detected group size.
    group = [f for f in by_weight if f.byte_rank[0] == by_weight[0].byte_rank[0]]
    for fmt in group:
        found = _scale_match(tensor, fmt, ns, O, I)
        if found is not None:
            return found
    # 5. The scale byte count must match the resolved format exactly.
    raise _scale_mismatch(tensor, where, group, O, I)


def _allowed(tensor: str, nb: int, ns: int, O: int, I: int) -> list[Resolved]:
    """Every format whose weight *and* scale byte counts match, in precedence order (for stamps)."""
    found = (_scale_match(tensor, f, ns, O, I) for f in _qs_formats() if nb == f.weight_nbytes(O, I))
    return [r for r in found if r is not None]


def _stamp_format(tensor: str, stamp: str) -> type[Format]:
    try:
        return by_name(stamp)
    except FormatError:
        raise ResolveError.about(
            tensor, f"stamp {stamp!r} is not a known format name", ResolveReason.UNKNOWN_STAMP
        ) from None


def resolve_format(tensor: str, nb: int, ns: int, O: int, I: int, stamp: str | None = None) -> Resolved:
    """Resolve a U8 weight with a ``.qs`` sidecar from its byte counts (docs/FORMATS.md §3).

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
        raise ResolveError(
            f"{exc} (weight bytes {nb}, scale bytes {ns} for [{O}, {I}])", reason=exc.reason
        ) from None
    allowed = _allowed(tensor, nb, ns, O, I)
    for candidate in allowed:
        if candidate.fmt == fmt.ord:
            return candidate
    allows = ", ".join(r.label for r in allowed) or "no known format"
    raise ResolveError.about(
        tensor,
        f"stamp {stamp!r} contradicts its bytes: weight bytes {nb} and scale bytes {ns} "
        f"for [{O}, {I}] allow {allows}",
        ResolveReason.STAMP_MISMATCH,
    )


def resolve_mxfp4(tensor: str, packed_nbytes: int, scale_nbytes: int, O: int, I: int) -> Resolved:
    """Resolve an mxfp4 pair: ``weight_packed`` must be ``O*I/2`` bytes, ``weight_scale`` ``O*I/32``."""
    _check_dims(tensor, O, I)
    where = f"weight_packed bytes {packed_nbytes}, weight_scale bytes {scale_nbytes} for [{O}, {I}]"
    try:
        Mxfp4.check_encodable(O, I, name=tensor)
    except FormatError:
        raise ResolveError.about(
            tensor, f"{where}: mxfp4 needs I % 32 == 0", ResolveReason.MXFP4_SHAPE
        ) from None
    want_packed, want_scale = Mxfp4.weight_nbytes(O, I), Mxfp4.scale_nbytes(O, I)
    if (packed_nbytes, scale_nbytes) != (want_packed, want_scale):
        raise ResolveError.about(
            tensor, f"{where}: mxfp4 needs {want_packed} and {want_scale}", ResolveReason.MXFP4_SHAPE
        )
    return Resolved.of(Mxfp4)


def ue8m0_candidates(O: int, I: int, scale_nbytes: int) -> list[type[Format]]:
    """The FP8 formats with E8M0 block scales (``UE8M0_FP8_FORMATS``: 128x128, 32x32 tiles, 1x32 row groups) whose
    scale byte count at ``[O, I]`` is ``scale_nbytes``, in precedence order. Two of them match only where their
    block grids cut ``[O, I]`` the same way (``O <= 32 and I <= 32``: one 128 block and one 32 tile; ``O == 1``:
    one row of 32-input tiles or groups), so every candidate decodes every element with the same scale byte."""
    return [f for f in UE8M0_FP8_FORMATS if f.scale_nbytes(O, I) == scale_nbytes]


def resolve_fp8_e8m0(
    tensor: str,
    weight_nbytes: int,
    scale_nbytes: int,
    O: int,
    I: int,
    scale_shape: tuple[int, ...] | None = None,
) -> Resolved:
    """Resolve a DeepSeek FP8 pair (``<base>.weight`` F8_E4M3, ``<base>.scale`` F8_E8M0, told apart from every
    ``.qs`` format by its names and dtypes, never stamped): ``O*I`` weight bytes, and the scale tensor's byte
    count (and ``scale_shape`` when given) says the grid: ``ceil(O/128)*ceil(I/128)`` fp8-e4m3-e8m0,
    ``ceil(O/32)*ceil(I/32)`` -t32, ``O*ceil(I/32)`` -r32. Where two grids coincide (``ue8m0_candidates``) the
    values are the same and the first in ``UE8M0_FP8_FORMATS`` order is reported (docs/FORMATS.md §3)."""
    _check_dims(tensor, O, I)
    found = [
        f
        for f in ue8m0_candidates(O, I, scale_nbytes)
        if scale_shape is None or tuple(scale_shape) == f.scale_shape(O, I)
    ]
    if weight_nbytes != O * I or not found:
        grids = ", ".join(
            f"{f.label()} {list(f.scale_shape(O, I))} = {f.scale_nbytes(O, I)}" for f in UE8M0_FP8_FORMATS
        )
        got = f"scale {list(scale_shape)} = {scale_nbytes}" if scale_shape is not None else f"{scale_nbytes}"
        raise ResolveError.about(
            tensor,
            f"FP8 [{O}, {I}] with E8M0 scales needs weight bytes {O * I} and one scale byte per block "
            f"({grids}), got {weight_nbytes} and {got}",
            ResolveReason.ROUNDTRIP,
        )
    return Resolved.of(found[0])


def ue8m0_fp8_format(fmt: type[Format]) -> bool:
    """Whether ``fmt`` is one of the FP8 formats with E8M0 block scales (DeepSeek's spelling)."""
    return fmt in UE8M0_FP8_FORMATS


# ---------------------------------------------------------------------------------------- writer side
def _writer_format(tensor: str, fmt_name: str, gs: int | None) -> type[Format]:
    try:
        fmt = by_name(fmt_name)
    except FormatError as exc:
        raise ResolveError.about(tensor, str(exc), ResolveReason.UNKNOWN_FORMAT) from None
    if fmt.grouped != (gs is not None):
        raise ResolveError.about(
            tensor, f"group size {gs} given for format {fmt_name}", ResolveReason.BAD_GROUP_SIZE
        )
    return fmt


def _try_resolve(tensor: str, nb: int, ns: int, O: int, I: int, stamp: str | None) -> Resolved | None:
    try:
        return resolve_format(tensor, nb, ns, O, I, stamp)
    except ResolveError:
        return None


def ue8m0_fp8_signature(O: int, I: int) -> bool:
    """§3 rule 7: ``ceil(O/128) * ceil(I/128) == 4 * O``, where int8-row's F32 row scales (``4*O`` bytes) have
    the byte count of colibri's FP8 layout with one-byte UE8M0 block scales (``nblk`` bytes). colibri refuses
    such an int8-row tensor unless it is stamped ``int8-row``; colitools' reader resolves it as int8-row."""
    return Fp8E4m3B128.scale_nbytes(O, I) == 16 * O  # 4 * nblk == 16 * O


def _e8_stamp_accepted(fmt: type[Format], O: int, I: int) -> bool:
    """Whether colibri's e8 branch (``qt_resolve_fmt``) takes a stamp naming ``fmt`` on e8's byte signature: only
    where the tensor's weight bytes are also ``O*I`` (int8-row at ``O == 1``, fp8 with one f32 block) -- never
    an int4/int2/int3 stamp, which its e8 branch ignores and ``qt_verify_fmt_stamp`` then refuses."""
    if fmt is E8Iq3Lattice:
        return True
    if fmt is Int8Row:
        return O == 1
    if fmt is Fp8E4m3B128:
        return Fp8E4m3B128.scale_nbytes(O, I) == 4
    return False


def stamp_for(
    name: str, fmt_name: str, O: int, I: int, gs: int | None = None, *, allow_stamp: bool = True
) -> str | None:
    """The ``colibri.fmt`` stamp a writer must record for ``name`` written as ``fmt_name`` ``[O, I]``.

    ``None`` when the bytes alone resolve back to ``(fmt_name, gs)`` and colibri reads them unstamped. A stamp
    is returned only for the collisions the spec settles with stamps: fp8-e4m3-b128 against int8-row
    (``O == nblk``); int8-row with colibri's UE8M0-FP8 signature (``ceil(O/128)*ceil(I/128) == 4*O``, §3 rule
    7); int8-row/fp8 against e8-iq3-lattice's signature at ``I == 98`` (where colibri's e8 branch accepts the
    stamp); e8-iq3-lattice itself at ``I == 98`` as the spec asks. Any other tensor whose bytes would resolve
    to another format (int3-g64 at ``I`` in ``{24, 47, 48, 95, 96, 143, 144}``, int2-row at ``I <= 2``,
    int4-row at ``I == 1``, int4-row at ``O == 1`` with fmt 6's bytes, ``I`` in ``{195, 196, 391, 392, ...}``,
    whose stamp colibri's e8 branch refuses) raises ResolveError: the writer falls back to int8-row. With
    ``allow_stamp=False`` (routed experts are never stamped) a needed stamp raises too.
    """
    fmt = _writer_format(name, fmt_name, gs)
    _check_dims(name, O, I)
    if fmt is Float:
        return None
    if fmt is Mxfp4:  # recognised by its tensor pair, never stamped
        resolve_mxfp4(name, fmt.weight_nbytes(O, I), fmt.scale_nbytes(O, I), O, I)
        return None
    if ue8m0_fp8_format(fmt):  # recognised by its tensor names and dtypes, never stamped
        resolve_fp8_e8m0(name, fmt.weight_nbytes(O, I), fmt.scale_nbytes(O, I), O, I, fmt.scale_shape(O, I))
        return None
    nb, ns = fmt.weight_nbytes(O, I, gs), fmt.scale_nbytes(O, I, gs)
    want = Resolved.of(fmt, gs)
    plain = _try_resolve(name, nb, ns, O, I, None)
    spec_stamped = fmt is E8Iq3Lattice and I == 98  # stamped by the spec although step 1 already picks it
    where = f"{want.label} [{O}, {I}] (weight bytes {nb}, scale bytes {ns})"
    advice = f"; write {FALLBACK_FORMAT.name} instead"
    rule7 = fmt is Int8Row and ue8m0_fp8_signature(O, I)
    if plain == want and not spec_stamped and not rule7:
        return None
    stampable = plain is not None and (
        (plain.fmt == E8Iq3Lattice.ord and _e8_stamp_accepted(fmt, O, I))
        or (plain.fmt == Int8Row.ord and fmt is Fp8E4m3B128)
        or rule7
    )
    if not stampable or _try_resolve(name, nb, ns, O, I, fmt.name) != want:
        became = plain.label if plain else "nothing"
        why = (
            f"{where} would resolve as {became}; colibri's e8 branch accepts no {fmt.name} stamp there"
            if plain is not None and plain.fmt == E8Iq3Lattice.ord
            else f"{where} would resolve as {became}, which no stamp may settle"
        )
        raise ResolveError.about(name, why, ResolveReason.COLLIDES, advice)
    if rule7 and not allow_stamp:
        raise ResolveError.about(
            name,
            f"{where} has colibri's fp8-with-ue8m0-scales signature (ceil(O/128)*ceil(I/128) == 4*O), which "
            f"needs a {STAMP_KEY} stamp, and this tensor may not be stamped",
            ResolveReason.NEEDS_STAMP,
            "; write f32 instead",
        )
    if not allow_stamp:
        raise ResolveError.about(
            name,
            f"{where} needs a {STAMP_KEY} stamp ({plain.label} has the same bytes), and this tensor may "
            f"not be stamped",
            ResolveReason.NEEDS_STAMP,
            advice,
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
        raise ResolveError.about(
            tensor,
            f"{fmt_name} [{O}, {I}] wrote weight bytes {nb} and scale bytes {ns}, "
            f"expected {want_nb} and {want_ns}",
            ResolveReason.ROUNDTRIP,
        )
    if fmt is Float:
        return Resolved.of(Float)
    if fmt is Mxfp4:
        if stamp not in (None, Mxfp4.name):
            raise ResolveError.about(tensor, f"mxfp4 weight stamped {stamp!r}", ResolveReason.STAMP_MISMATCH)
        return resolve_mxfp4(tensor, want_nb, want_ns, O, I)
    if ue8m0_fp8_format(fmt):
        if stamp is not None:
            raise ResolveError.about(tensor, f"{fmt.name} weight stamped {stamp!r}", ResolveReason.STAMP_MISMATCH)
        # a grid that coincides with an earlier format's reads back as that one, with the same values (§3)
        return resolve_fp8_e8m0(tensor, want_nb, want_ns, O, I, fmt.scale_shape(O, I))
    got = resolve_format(tensor, want_nb, want_ns, O, I, stamp)
    if got != Resolved.of(fmt, gs):
        raise ResolveError.about(
            tensor,
            f"written as {Resolved.of(fmt, gs).label} but its bytes (weight {want_nb}, "
            f"scale {want_ns}, [{O}, {I}], stamp {stamp}) resolve as {got.label}",
            ResolveReason.ROUNDTRIP,
        )
    return got


# ----------------------------------------------------------------------------------- shard metadata
def _json_object(where: str, key: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ResolveError(
            f"{where}: __metadata__[{key!r}] is not valid JSON ({exc})", reason=ResolveReason.BAD_METADATA
        ) from None
    if not isinstance(value, dict):
        raise ResolveError(
            f"{where}: __metadata__[{key!r}] is not a JSON object", reason=ResolveReason.BAD_METADATA
        )
    bad = invalid_text(text.encode("utf-8", "surrogatepass"), value)  # an escape inside the metadata string
    if bad is not None:
        raise ResolveError(
            f"{where}: __metadata__[{key!r}]: the string {shown_text(bad)} is not Unicode text (a lone "
            "surrogate escape)",
            reason=ResolveReason.BAD_METADATA,
        )
    return value


def parse_stamps(metadata: Mapping[str, str], *, where: str = "?") -> dict[str, str]:
    """``colibri.fmt`` of one shard: ``{tensor: format name}`` (``{}`` without the key)."""
    if STAMP_KEY not in metadata:
        return {}
    stamps = _json_object(where, STAMP_KEY, metadata[STAMP_KEY])
    for tensor, name in stamps.items():
        if not isinstance(name, str):
            raise ResolveError(
                f"{where}: {STAMP_KEY} stamp of tensor {tensor} is not a string",
                reason=ResolveReason.BAD_METADATA,
            )
        try:
            _stamp_format(tensor, name)
        except ResolveError as exc:
            raise ResolveError(f"{where}: {exc}", reason=exc.reason) from None
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
            raise ResolveError(
                f"{where}: {SHAPES_KEY} entry of tensor {tensor} is {dims!r}, not [O, I] >= 1",
                reason=ResolveReason.BAD_METADATA,
            )
        shapes[tensor] = (dims[0], dims[1])
    return shapes


def parse_layout(metadata: Mapping[str, str], *, where: str = "?") -> str:
    """``colitools.layout`` of one shard; ``pairs`` when absent. An unknown layout is an error (never guessed)."""
    layout = metadata.get(LAYOUT_KEY, PAIRS_LAYOUT)
    if layout not in LAYOUTS:
        raise ResolveError(
            f"{where}: unknown {LAYOUT_KEY} {layout!r} (known: {', '.join(LAYOUTS)})",
            reason=ResolveReason.BAD_METADATA,
        )
    return layout


def encode_stamps(stamps: Mapping[str, str]) -> str:
    """The ``colibri.fmt`` metadata string a writer stores (JSON, sorted keys)."""
    return json.dumps(dict(stamps), sort_keys=True, separators=(",", ":"))


def encode_shapes(shapes: Mapping[str, tuple[int, int]]) -> str:
    """The ``colitools.shapes`` metadata string a writer stores (JSON, sorted keys; ``{}`` when empty)."""
    return json.dumps(
        {k: [int(O), int(I)] for k, (O, I) in shapes.items()}, sort_keys=True, separators=(",", ":")
    )
