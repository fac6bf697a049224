"""colibri's routing trace (``ROUTE_TRACE``) and the ``.coli_pairs`` co-activation table (docs/FORMATS.md §6).

The trace is a measurement stream, one line per (MoE call x batch row), written as the layer routes
(``c/route_trace.h`` ``rt_trace`` / ``rt_trace_end``)::

    <call> <row> <layer> <expert>:<gate> <expert>:<gate> ...

``%d %d %d`` then `` %d:%.4f`` per selected expert, in the router's selection order, with the gate the layer
applies (after normalisation and scaling). ``call`` counts MoE invocations from 0, once per call after its rows;
``row`` is the position in the call's batch.

``.coli_pairs`` is what colibri's ``c/tools/route_pairs.py`` builds from traces for the ``COUPLE=`` cross-layer
prefetcher: ``COLIPAIRS 1 <n_lines>``, then ``<L> <dL> <e> f1:c1 f2:c2 ...``, the top ``M`` experts of layer
``L + dL`` by how often they were selected at the same position as expert ``e`` of layer ``L``. The facts kept
from that tool (its bytes are the contract): a trace's lines are grouped by (forward, row), where a new forward
starts whenever a line's layer is below the previous line's (lines of fewer than four fields are skipped and do
not move that layer); a (forward, row) that names a layer twice keeps the last line; entries are sorted by
``(L, dL, e)``; candidates by count, high first, ties in the order the candidate was first counted for that
entry; the file ends with a newline after the joined lines (an empty table is ``COLIPAIRS 1 0`` and an empty
line).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from colitools.formats.atomic import write_bytes_atomic
from colitools.formats.errors import ParameterError, UsageFileError

__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_TOP",
    "PAIRS_MAGIC",
    "PairsTable",
    "RouteTraceWriter",
    "build_pairs",
    "format_pairs",
    "format_trace_line",
    "read_pairs",
    "trace_positions",
    "write_pairs",
    "write_route_pairs",
]

PAIRS_MAGIC = "COLIPAIRS"
PAIRS_VERSION = 1
DEFAULT_TOP = 16  # route_pairs.py M
DEFAULT_DEPTH = 2  # route_pairs.py: dL in (1, 2)


def format_trace_line(call: int, row: int, layer: int, ids: Sequence[int], gates: Sequence[float]) -> str:
    """One trace line with its newline: C's ``%.4f`` of a float promoted to double is Python's ``.4f`` of
    ``float(gate)`` (both round the exact binary value correctly)."""
    picks = "".join(f" {int(e)}:{float(g):.4f}" for e, g in zip(ids, gates, strict=True))
    return f"{call} {row} {layer}{picks}\n"


_TRACE_LINE = re.compile(r"\d+ \d+ \d+( -?\d+:\S+)*")  # format_trace_line's, gates as printed
_CHECKED_BYTES = 1 << 16  # how much of an existing file is read to tell whether it is ours


def _existing_problem(path: Path, ours) -> str | None:
    """Why the existing file at ``path`` may not be replaced by one of ours (None: it is absent, empty or one
    of ours: ``ours(text)`` is None for the text of its first ``_CHECKED_BYTES``, whole lines)."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return None  # absent (or not a file: opening it for writing names the problem)
        with open(path, "rb") as f:
            head = f.read(_CHECKED_BYTES + 1)
    except OSError:
        return None  # unreadable: the write says why
    if len(head) > _CHECKED_BYTES:  # whole lines only
        head = head[: head.rfind(b"\n", 0, _CHECKED_BYTES) + 1] or head[:_CHECKED_BYTES]
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        return "it is not ASCII text"
    return ours(text)


def _not_a_trace(text: str) -> str | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if line and not _TRACE_LINE.fullmatch(line):
            return f"line {number} is {line[:40]!r}"
    return None


def check_trace_path(path: str | os.PathLike) -> None:
    """UsageFileError when ``path`` holds a file that is not a route trace (a previous trace is replaced):
    ``run --route-trace`` never overwrites a file of the user's (a config.json, a history)."""
    problem = _existing_problem(Path(path), _not_a_trace)
    if problem is not None:
        raise UsageFileError(
            f"{path} exists and is not a route trace ({problem}): not overwritten; give another path or remove it"
        )


class RouteTraceWriter:
    """The ``ROUTE_TRACE`` stream of one run: ``record`` once per MoE call (every row of its batch). An existing
    file at ``path`` is replaced only when it is a route trace (``check_trace_path``)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        check_trace_path(self.path)
        try:
            self._file: TextIO | None = open(self.path, "w", encoding="ascii", newline="\n")  # noqa: SIM115
        except OSError as exc:
            raise UsageFileError(f"cannot open the route trace {self.path}: {exc.strerror or exc}") from None
        self.call = 0

    def record(self, layer: int, ids, gates) -> None:
        """Trace one MoE call of ``layer``: ``ids`` / ``gates`` are ``[rows, k]`` (selection order)."""
        if self._file is None:
            return
        lines = [format_trace_line(self.call, row, layer, ids[row], gates[row]) for row in range(len(ids))]
        self._file.write("".join(lines))
        self.call += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class PairsTable:
    """A ``.coli_pairs`` table: ``entries`` in file order, ``(L, dL, e, [(f, count), ...])``; ``positions``: the
    (forward, row) groups each trace gave (``route_pairs.py``'s "N positions"), by trace path."""

    entries: list[tuple[int, int, int, list[tuple[int, int]]]] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    out: Path | None = None  # where write_route_pairs wrote it

    def to_json(self) -> dict:
        return {
            "out": str(self.out) if self.out is not None else None,
            "entries": len(self.entries),
            "positions": [{"trace": t, "positions": n} for t, n in self.positions.items()],
        }


def trace_positions(path: str | os.PathLike) -> dict[tuple[int, int], dict[int, list[int]]]:
    """``(forward, row) -> {layer: expert ids}`` of one trace, in order of first appearance: its positions as
    ``route_pairs.py`` groups them (a line naming a layer below the previous one starts a forward)."""
    rows: dict[tuple[int, int], dict[int, list[int]]] = {}
    forward, previous = 0, -1
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            for number, line in enumerate(f, start=1):
                fields = line.split()
                if len(fields) < 4:
                    continue
                try:
                    row, layer = int(fields[1]), int(fields[2])
                    ids = [int(t.split(":")[0]) for t in fields[3:]]
                except ValueError:
                    raise UsageFileError(
                        f"{path}:{number}: expected '<call> <row> <layer> <expert>:<gate> ...', got {line.strip()[:60]!r}"
                    ) from None
                if layer < previous:
                    forward += 1
                previous = layer
                rows.setdefault((forward, row), {})[layer] = ids
    except FileNotFoundError:
        raise UsageFileError(f"route trace not found: {path}") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UsageFileError(f"{path}: not a route trace ({exc.__class__.__name__})") from None
    return rows


def build_pairs(
    traces: Iterable[str | os.PathLike], *, top: int = DEFAULT_TOP, depth: int = DEFAULT_DEPTH
) -> PairsTable:
    """Aggregate traces into the co-activation table ``route_pairs.py`` writes (``depth`` 2 is its ``dL`` 1..2;
    ``top`` its ``M``)."""
    if top < 1:
        raise ParameterError(f"`top` must be >= 1, got {top}")
    if depth < 1:
        raise ParameterError(f"`depth` must be >= 1, got {depth}")
    counts: dict[tuple[int, int, int], dict[int, int]] = {}
    table = PairsTable()
    first: tuple[Path, tuple[frozenset[int], frozenset[int]]] | None = None
    for path in map(Path, traces):
        rows = trace_positions(path)
        geometry = _geometry(rows)
        if geometry[0] and first is None:
            first = (path, geometry)
        elif geometry[0] and geometry != first[1]:
            raise UsageFileError(
                f"{path}: {_show_geometry(geometry)}, but {first[0]}: {_show_geometry(first[1])}; traces of "
                "different models are not merged"
            )
        for layers in rows.values():
            for L in sorted(layers):
                for dL in range(1, depth + 1):
                    after = layers.get(L + dL)
                    if after is None:
                        continue
                    for e in layers[L]:
                        entry = counts.setdefault((L, dL, e), {})
                        for f in after:
                            entry[f] = entry.get(f, 0) + 1
        table.positions[str(path)] = len(rows)
    for key in sorted(counts):
        ranked = sorted(
            counts[key].items(), key=lambda item: -item[1]
        )  # stable: ties keep first-counted order
        table.entries.append((*key, ranked[:top]))
    return table


def _geometry(rows: dict[tuple[int, int], dict[int, list[int]]]) -> tuple[frozenset[int], frozenset[int]]:
    """A trace's geometry: its MoE layers and its experts per line (the model's routed top-k)."""
    layers = frozenset(layer for position in rows.values() for layer in position)
    per_line = frozenset(len(ids) for position in rows.values() for ids in position.values())
    return layers, per_line


def _show_geometry(geometry: tuple[frozenset[int], frozenset[int]]) -> str:
    layers, per_line = geometry
    ks = "/".join(str(k) for k in sorted(per_line))
    return f"{len(layers)} MoE layers ({min(layers)}-{max(layers)}), {ks} experts per token"


def format_pairs(table: PairsTable) -> bytes:
    """The exact bytes of the table (``route_pairs.py``'s: the joined lines and one final newline)."""
    lines = [f"{L} {dL} {e} " + " ".join(f"{f}:{c}" for f, c in picks) for L, dL, e, picks in table.entries]
    return (f"{PAIRS_MAGIC} {PAIRS_VERSION} {len(lines)}\n" + "\n".join(lines) + "\n").encode("ascii")


def write_pairs(path: str | os.PathLike, table: PairsTable) -> None:
    """Write the table atomically (temp file, fsync, rename)."""
    write_bytes_atomic(Path(path), format_pairs(table))


def write_route_pairs(traces: Sequence[str | os.PathLike], out: str | os.PathLike, *, top: int = DEFAULT_TOP,
                      depth: int = DEFAULT_DEPTH) -> PairsTable:  # fmt: skip
    """``colitools usage pairs``: aggregate ``traces`` (``build_pairs``) and write the table to ``out``."""
    if not traces:
        raise ParameterError("`traces`: give at least one route trace")
    problem = _existing_problem(Path(out), _not_a_pairs_table)
    if problem is not None:  # never over a file of the user's (a model's config.json, a trace)
        raise UsageFileError(
            f"{out} exists and is not a .coli_pairs table ({problem}): not overwritten; give another path or "
            "remove it"
        )
    table = build_pairs(traces, top=top, depth=depth)
    write_pairs(out, table)
    table.out = Path(out)
    return table


def _not_a_pairs_table(text: str) -> str | None:
    head = text.split("\n", 1)[0].split()
    if len(head) != 3 or head[0] != PAIRS_MAGIC or not head[2].isdigit():
        return f"line 1 is {text.split(chr(10), 1)[0][:40]!r}, not '{PAIRS_MAGIC} {PAIRS_VERSION} <n_lines>'"
    return None


def read_pairs(path: str | os.PathLike) -> PairsTable:
    """Read a ``.coli_pairs`` table (integer counts, as ``route_pairs.py`` writes them)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        raise UsageFileError(f"pairs table not found: {path}") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UsageFileError(f"{path}: not a pairs table ({exc.__class__.__name__})") from None
    head = lines[0].split() if lines else []
    if len(head) != 3 or head[0] != PAIRS_MAGIC or head[1] != str(PAIRS_VERSION) or not head[2].isdigit():
        raise UsageFileError(
            f"{path}:1: expected '{PAIRS_MAGIC} {PAIRS_VERSION} <n_lines>', got {' '.join(head)[:60]!r}"
        )
    table = PairsTable()
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split()
        if not fields:
            continue
        try:
            L, dL, e = (int(x) for x in fields[:3])
            picks = [(int(f), int(c)) for f, c in (t.split(":") for t in fields[3:])]
        except ValueError:
            raise UsageFileError(
                f"{path}:{number}: expected '<L> <dL> <e> f:c ...', got {line.strip()[:60]!r}"
            ) from None
        table.entries.append((L, dL, e, picks))
    if len(table.entries) != int(head[2]):
        raise UsageFileError(f"{path}: header says {head[2]} lines, the table has {len(table.entries)}")
    return table
