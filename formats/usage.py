"""Routing usage history (``.coli_usage``, docs/FORMATS.md §6): the one reader and writer.

Shared by the runtime (which records how often the router picked each expert) and the mirror planner (which
ranks shards by it). The file is text, one record of exactly three whitespace-separated integers per line,
sparse (non-zero counts only)::

    -1 <n_layers> <n_experts>          geometry header
    -2 <format_version=1> <engine_id>  version / engine header
    <layer> <expert> <count>           one line per expert that was selected at least once

``engine_id`` is the FNV-1a 32-bit hash of the engine name (colitools uses ``config.json`` ``model_type``).
A history with no counts is a zero-byte file.

Besides that text layout the reader takes colibri's Inkling engine's older dense binary history, ``IKU1``
(``c/route_trace.h`` ``rt_read_ex``: uint32 little-endian ``{0x31554B49, n_layers, n_experts}`` then
``uint32[n_layers][n_experts]``, layer and expert given by the position). Only an Inkling model's read takes it
(colibri's ``inkling.c`` now saves the text layout through ``rt_save``, so nothing here writes IKU1).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from colitools.formats.atomic import write_bytes_atomic
from colitools.formats.errors import ParameterError, UsageFileError
from colitools.formats.families import family_of, known_model_types

__all__ = [
    "FORMAT_VERSION",
    "IKU1_MAGIC",
    "MAX_EXPERT_SLOTS",
    "UsageFileError",
    "UsageHistory",
    "check_usage_decay",
    "decay_usage",
    "engine_id",
    "format_usage",
    "read_usage",
    "write_usage",
]

FORMAT_VERSION = 1
GEOMETRY_RECORD = -1
VERSION_RECORD = -2
IKU1_MAGIC = 0x31554B49  # b"IKU1" little-endian: route_trace.h RT_IKU1_MAGIC
_IKU1_HEADER = struct.Struct("<3I")
INKLING_FAMILY = "inkling"  # the family whose engine (colibri's inkling.c) reads IKU1

_FNV_OFFSET = 2166136261
_FNV_PRIME = 16777619
MAX_EXPERT_SLOTS = 1 << 20
"""Most experts (``n_layers * n_experts``) a usage history may describe (``read_usage`` refuses more,
whether its header, the caller or a headerless file's records give the geometry): four times 128 layers x
2048 routed experts. Reports may then allocate per expert without ``-1 1 4000000000`` taking all memory."""
_INT = re.compile(r"[+-]?[0-9]+")
_MAX_DIGITS = 20  # 2**64 - 1 has 20 digits


def engine_id(name: str) -> int:
    """FNV-1a 32-bit hash of the UTF-8 bytes of an engine name (``"glm_moe_dsa"`` -> 3815245270)."""
    h = _FNV_OFFSET
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


@dataclass
class UsageHistory:
    """Per-expert routing counts of one model.

    ``counts`` maps ``(layer, expert)`` to a positive count; every key is inside the geometry
    (``0 <= layer < n_layers``, ``0 <= expert < n_experts``). ``skipped_records`` counts the records of the
    file that were not counted (out of range or non-positive). ``headerless`` marks a legacy file without the
    two header records, whose geometry came from the caller or, failing that, from the records themselves.
    ``iku1`` marks a history read from Inkling's dense binary layout.
    """

    n_layers: int
    n_experts: int
    engine_id: int | None = None
    counts: dict[tuple[int, int], int] = field(default_factory=dict)
    skipped_records: int = 0
    headerless: bool = False
    iku1: bool = False  # read from Inkling's dense binary layout (no engine id in it)

    @property
    def total(self) -> int:
        """Total number of expert selections recorded."""
        return sum(self.counts.values())

    def count(self, layer: int, expert: int) -> int:
        """Selections of one expert (0 when never selected)."""
        return self.counts.get((layer, expert), 0)

    def add(self, layer: int, expert: int, n: int = 1) -> None:
        """Record ``n`` more selections of an expert (the runtime's entry point)."""
        if not (0 <= layer < self.n_layers and 0 <= expert < self.n_experts):
            raise UsageFileError(
                f"expert ({layer}, {expert}) is outside the usage geometry {self.n_layers} x {self.n_experts}"
            )
        if n < 0:
            raise UsageFileError(f"negative selection count {n} for expert ({layer}, {expert})")
        if n:
            self.counts[(layer, expert)] = self.counts.get((layer, expert), 0) + n

    def layer_totals(self) -> dict[int, int]:
        """Selections per layer (only layers with records)."""
        totals: dict[int, int] = {}
        for (layer, _), n in self.counts.items():
            totals[layer] = totals.get(layer, 0) + n
        return totals

    def records(self) -> Iterator[tuple[int, int, int]]:
        """``(layer, expert, count)`` in file order (sorted by layer, then expert), positive counts only."""
        for (layer, expert), n in sorted(self.counts.items()):
            if n > 0:
                yield layer, expert, n


def _engine_id_of(engine: str | int | None) -> int | None:
    if engine is None or isinstance(engine, int):
        return engine
    return engine_id(engine)


def _parse_records(path: Path, text: str) -> list[tuple[int, int, int, int]]:
    """``(line_number, a, b, c)`` for every non-blank line; anything but three integers is an error. LF, CRLF
    and CR endings read alike (colibri's reader opens ``rb`` and ``fscanf`` skips the ``\\r``)."""
    records = []
    for number, line in enumerate(text.splitlines(), start=1):  # splitlines: LF, CRLF and CR alike
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 3 or not all(_INT.fullmatch(f) for f in fields):
            shown = line.strip()[:60]
            raise UsageFileError(
                f"{path}:{number}: expected exactly three integers per record, got {len(fields)} field(s): {shown!r}"
            )
        long = next((f for f in fields if len(f.lstrip("+-")) > _MAX_DIGITS), None)
        if (
            long is not None
        ):  # before int(): Python refuses to convert > 4300 digits, and no count is that big
            raise UsageFileError(
                f"{path}:{number}: a {len(long.lstrip('+-'))}-digit number (at most {_MAX_DIGITS} digits: "
                "counts are 64-bit)"
            )
        a, b, c = (int(f) for f in fields)
        records.append((number, a, b, c))
    return records


@dataclass(frozen=True)
class _Headers:
    """What the two header records of a file say (None: the record is absent), and its counting records."""

    geometry: tuple[int, int] | None
    version: int | None
    engine_id: int | None
    body: list[tuple[int, int, int, int]]


def read_usage(
    path: str | os.PathLike,
    *,
    n_layers: int | None = None,
    n_experts: int | None = None,
    engine: str | int | None = None,
    explicit: bool = False,
    routed_layers: Collection[int] | None = None,
) -> UsageHistory:
    """Read a ``.coli_usage`` file (text, legacy headerless text, or Inkling's binary ``IKU1``).

    ``n_layers``/``n_experts`` are the model's geometry when known: a file whose geometry header differs is
    refused; a legacy headerless file takes them as its geometry. ``engine`` is the model's engine name (or
    its id): a text file recorded by another engine is refused unless ``explicit`` (the user named the file,
    colibri's trusted read); trust relaxes that identity check only: a wrong geometry, a newer format version,
    or an IKU1 file for a model not of the Inkling family is refused whatever the caller says.
    ``routed_layers``: the layers that route (colibri's ``rt_drop_row`` rule): a record of any other layer is
    not counted. Records with a negative layer other than the two headers are skipped; records outside the
    geometry, of a non-routing layer or with a non-positive count are never counted (``skipped_records``,
    never in ``total``). Repeated records add up. A geometry (the header's, the caller's, or that of a
    headerless file's records) of more than ``MAX_EXPERT_SLOTS`` experts in all is refused: whatever a consumer
    allocates per expert stays bounded.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if raw[:4] == IKU1_MAGIC.to_bytes(4, "little"):  # text starts with a digit or a sign: no false positive
        history, body = _read_iku1(path, raw, n_layers, n_experts, engine)
    else:
        history, body = _read_text_history(path, raw, n_layers, n_experts, engine, explicit)
    for layer, expert, n in body:
        if (n <= 0 or not (0 <= layer < history.n_layers and 0 <= expert < history.n_experts)
                or (routed_layers is not None and layer not in routed_layers)):  # fmt: skip
            history.skipped_records += 1
            continue
        history.counts[(layer, expert)] = history.counts.get((layer, expert), 0) + n
    return history


def _read_text_history(path: Path, raw: bytes, n_layers: int | None, n_experts: int | None,
                       engine: str | int | None, explicit: bool) -> tuple[UsageHistory, list[tuple[int, int, int]]]:  # fmt: skip
    """The text layout: its headers checked against the caller's geometry and engine, and its data records."""
    headers = _headers(path, _parse_records(path, _decode(path, raw)))
    layers, experts = _geometry(path, headers, n_layers, n_experts)
    wanted_engine = _engine_id_of(engine)
    file_engine = headers.engine_id
    if (
        file_engine is not None
        and wanted_engine is not None
        and file_engine != wanted_engine
        and not explicit
    ):
        name = f" ({engine!r})" if isinstance(engine, str) else ""
        raise UsageFileError(
            f"{path}: usage history was recorded by engine id {file_engine}, not this model's engine id "
            f"{wanted_engine}{name}; pass the file explicitly to use it anyway"
        )
    headerless = headers.geometry is None and headers.version is None
    history = UsageHistory(n_layers=layers, n_experts=experts, engine_id=file_engine, headerless=headerless)
    return history, [(layer, expert, n) for _, layer, expert, n in headers.body]


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageFileError(f"usage history not found: {path}") from None
    except IsADirectoryError:
        raise UsageFileError(f"usage history is a directory, not a file: {path}") from None


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageFileError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None


def _headers(path: Path, records: list[tuple[int, int, int, int]]) -> _Headers:
    """The geometry and version/engine headers (each at most once, or repeated unchanged) and the other
    records with a layer >= 0; reserved negative kinds are skipped."""
    geometry: tuple[int, int] | None = None
    version: int | None = None
    file_engine: int | None = None
    body: list[tuple[int, int, int, int]] = []
    for number, a, b, c in records:
        if a == GEOMETRY_RECORD:
            if b <= 0 or c <= 0:
                raise UsageFileError(f"{path}:{number}: geometry header needs positive sizes, got {b} x {c}")
            if geometry is not None and geometry != (b, c):
                raise UsageFileError(
                    f"{path}:{number}: second geometry header {b} x {c} contradicts {geometry[0]} x {geometry[1]}"
                )
            geometry = (b, c)
        elif a == VERSION_RECORD:
            if b != FORMAT_VERSION:
                raise UsageFileError(
                    f"{path}:{number}: usage format version {b} is not supported (this reader knows version "
                    f"{FORMAT_VERSION})"
                )
            if not 0 <= c <= 0xFFFFFFFF:
                raise UsageFileError(f"{path}:{number}: engine id {c} is not a 32-bit unsigned integer")
            if file_engine is not None and file_engine != c:
                raise UsageFileError(f"{path}:{number}: second engine id {c} contradicts {file_engine}")
            version, file_engine = b, c
        elif a >= 0:
            body.append((number, a, b, c))
    return _Headers(geometry, version, file_engine, body)


def _geometry(path: Path, headers: _Headers, n_layers: int | None, n_experts: int | None) -> tuple[int, int]:
    """``(layers, experts)``: the header's (which must agree with what the caller knows), else the caller's,
    else one past the largest layer and expert of the records; at most ``MAX_EXPERT_SLOTS`` experts."""
    geometry = headers.geometry
    if geometry is not None:
        if (n_layers is not None and n_layers != geometry[0]) or (
            n_experts is not None and n_experts != geometry[1]
        ):
            want = (
                f"{n_layers if n_layers is not None else '?'} x {n_experts if n_experts is not None else '?'}"
            )
            raise UsageFileError(
                f"{path}: usage geometry {geometry[0]} layers x {geometry[1]} experts does not match the model's "
                f"{want}"
            )
        _check_slots(path, *geometry, "its geometry header declares")
        return geometry
    body = headers.body
    layers = n_layers if n_layers is not None else 1 + max((r[1] for r in body), default=-1)
    experts = n_experts if n_experts is not None else 1 + max((r[2] for r in body), default=-1)
    given = (
        "the model's geometry is" if n_layers is not None and n_experts is not None else "its records imply"
    )
    _check_slots(path, layers, experts, given)
    return layers, experts


def _check_slots(path: Path, layers: int, experts: int, source: str) -> None:
    if layers * experts > MAX_EXPERT_SLOTS:
        raise UsageFileError(
            f"{path}: {source} {layers} layers x {experts} experts = {layers * experts} experts, more than "
            f"the {MAX_EXPERT_SLOTS} a usage history may describe"
        )


def _is_inkling(engine: str | int | None) -> bool:
    """Whether ``engine`` (a model type or its id) is a model of the Inkling family, the one IKU1 reader."""
    if isinstance(engine, str):
        family = family_of(engine)
        return family is not None and family.name == INKLING_FAMILY
    return any(engine == engine_id(t) and _is_inkling(t) for t in known_model_types())


def _read_iku1(path: Path, raw: bytes, n_layers: int | None, n_experts: int | None,
               engine: str | int | None) -> tuple[UsageHistory, list[tuple[int, int, int]]]:  # fmt: skip
    """The dense binary layout: refused by name for a model not of the Inkling family, even when the user named
    the file (colibri's trusted read would take it: here it is a layout only Inkling's engine writes, not an
    identity to override); its geometry is the parse geometry (a record's place gives its layer and expert), so
    it must match, always."""
    if engine is not None and not _is_inkling(engine):
        name = f"{engine!r}" if isinstance(engine, str) else f"engine id {engine}"
        raise UsageFileError(
            f"{path}: an IKU1 usage history (the dense binary layout of colibri's inkling engine) is read only "
            f"for an Inkling model, not for this model's engine {name}"
        )
    if len(raw) < _IKU1_HEADER.size:
        raise UsageFileError(
            f"{path}: IKU1 usage history is {len(raw)} bytes, shorter than its 12-byte header"
        )
    _, layers, experts = _IKU1_HEADER.unpack_from(raw)
    if (n_layers is not None and layers != n_layers) or (n_experts is not None and experts != n_experts):
        raise UsageFileError(
            f"{path}: IKU1 usage history is {layers} layers x {experts} experts, the model is "
            f"{n_layers if n_layers is not None else '?'} x {n_experts if n_experts is not None else '?'}: "
            "refusing rather than misreading it"
        )
    if layers <= 0 or experts <= 0:
        raise UsageFileError(f"{path}: IKU1 geometry header needs positive sizes, got {layers} x {experts}")
    _check_slots(path, layers, experts, "its IKU1 header declares")
    want = _IKU1_HEADER.size + 4 * layers * experts
    if len(raw) != want:
        raise UsageFileError(
            f"{path}: IKU1 usage history of {layers} x {experts} is {want} bytes, the file is {len(raw)}"
        )
    import numpy as np  # a dense block: one view instead of a Python loop over every cell

    block = np.frombuffer(raw, dtype="<u4", offset=_IKU1_HEADER.size).reshape(layers, experts)
    body = [(int(layer), int(e), int(block[layer, e])) for layer, e in zip(*np.nonzero(block), strict=True)]
    return UsageHistory(n_layers=layers, n_experts=experts, iku1=True), body


def check_usage_decay(factor: float) -> None:
    """Refuse a decay factor outside ``(0, 1]`` (colibri's engines ignore one; a typed value is refused here)."""
    if not 0.0 < factor <= 1.0:  # also refuses nan
        raise ParameterError(f"`usage_decay` must be in (0, 1], got {factor}")


def decay_usage(history: UsageHistory, factor: float) -> None:
    """Multiply every count by ``factor`` in ``(0, 1]``, as colibri's engines do before each save
    (``route_trace.h`` ``rt_decay``, ``COLI_USAGE_DECAY``): ``floor(count * factor + 0.5)`` in double precision,
    so a count of 1 survives any factor >= 0.5 and 1.0 leaves the bytes unchanged; a count that rounds to 0 is
    dropped."""
    check_usage_decay(factor)
    if factor == 1.0:
        return
    for key, n in list(history.counts.items()):
        kept = int(n * factor + 0.5)
        if kept:
            history.counts[key] = kept
        else:
            del history.counts[key]


def format_usage(history: UsageHistory) -> bytes:
    """The exact bytes :func:`write_usage` writes (zero bytes when there are no counts)."""
    lines = [f"{layer} {expert} {n}\n" for layer, expert, n in history.records()]
    if not lines:
        return b""
    header = [f"{GEOMETRY_RECORD} {history.n_layers} {history.n_experts}\n"]
    if history.engine_id is not None:
        header.append(f"{VERSION_RECORD} {FORMAT_VERSION} {history.engine_id}\n")
    return "".join(header + lines).encode("ascii")


def write_usage(path: str | os.PathLike, history: UsageHistory) -> None:
    """Write ``history`` to ``path`` atomically: temp file (exclusive create), fsync, rename, fsync dir.

    Headers first (the version header only when the engine id is known), then one ``layer expert count``
    line per selected expert, sorted; never more than three fields per line; zero bytes when empty.
    """
    path = Path(path)
    for layer, expert, _ in history.records():
        if not (0 <= layer < history.n_layers and 0 <= expert < history.n_experts):
            raise UsageFileError(
                f"{path}: expert ({layer}, {expert}) is outside the geometry {history.n_layers} x "
                f"{history.n_experts}"
            )
    write_bytes_atomic(path, format_usage(history))
