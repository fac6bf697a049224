"""The streaming, crash-safe safetensors writer (docs/FORMATS.md §1, writers): ``SafetensorsWriter``.

The header is computed up front from ``(name, dtype, shape)`` entries (compact JSON, ``__metadata__`` first,
space-padded so the data buffer starts page-aligned), so that a planner knows every output size before any data
exists. Tensors are then streamed one at a time into a temporary file in the target directory, which is
published with an atomic rename: a file that was not completely written never appears under its final name.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring as _encode_string  # json.dumps's own (ensure_ascii=False)
from typing import Any, NoReturn

import numpy as np

from colitools.formats.atomic import fsync_dir, temp_name
from colitools.formats.dtypes import SAFETENSORS_DTYPES, itemsize, safetensors_name
from colitools.formats.errors import SafetensorsError
from colitools.formats.safetensors_io.header import (
    ALIGNMENT,
    LENGTH,
    MAX_HEADER_BYTES,
    METADATA_KEY,
    TensorInfo,
    checked_nbytes,
    little_endian,
)

__all__ = ["Entry", "SafetensorsWriter", "write_safetensors"]

Entry = tuple[str, str, tuple[int, ...]]
"""One planned tensor of a writer: (name, safetensors dtype name, shape)."""


# --------------------------------------------------------------------------------------------------------------
# Header layout


@dataclass(frozen=True)
class _Layout:
    """A writer's header and tensor placement, computed before any data is written."""

    header: bytes  # 8-byte length + JSON + space padding; len(header) % ALIGNMENT == 0
    tensors: dict[str, TensorInfo]  # in write order, absolute offsets

    @property
    def file_size(self) -> int:
        return len(self.header) + sum(info.nbytes for info in self.tensors.values())


def _validated_entries(where: str, entries: Iterable[Entry]) -> list[tuple[str, str, tuple[int, ...], int]]:
    """Check a writer's entries; return (name, dtype, shape, nbytes) per entry."""
    checked = []
    seen: set[str] = set()
    for entry in entries:
        name, dtype, shape = entry
        if not isinstance(name, str):
            raise SafetensorsError(f"{where}: tensor name {name!r} is not a string")
        if name == METADATA_KEY:
            raise SafetensorsError(f"{where}: tensor {name!r}: the name is reserved for the metadata map")
        if name in seen:
            raise SafetensorsError(f"{where}: tensor {name!r}: declared twice")
        seen.add(name)
        if dtype not in SAFETENSORS_DTYPES:
            raise SafetensorsError(f"{where}: tensor {name!r}: unknown dtype {dtype!r}")
        dims = tuple(shape)
        if not all(type(dim) is int and dim >= 0 for dim in dims):  # the planners' plain ints: one pass
            if not all(
                isinstance(dim, int | np.integer) and not isinstance(dim, bool | np.bool_) for dim in dims
            ) or any(dim < 0 for dim in dims):
                raise SafetensorsError(
                    f"{where}: tensor {name!r}: shape {dims!r} is not a tuple of non-negative integers"
                )
            dims = tuple(int(dim) for dim in dims)
        nbytes = checked_nbytes(dims, dtype)
        if nbytes is None:
            raise SafetensorsError(
                f"{where}: tensor {name!r}: shape {dims!r} of {dtype} overflows (more than 2**63 - 1 bytes)"
            )
        checked.append((name, dtype, dims, nbytes))
    return checked


def _validated_metadata(where: str, metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SafetensorsError(
                f"{where}: __metadata__ must map strings to strings, got {key!r}: {type(value).__name__}"
            )
    return dict(metadata)


def _starts(checked: Sequence[tuple[str, str, tuple[int, ...], int]]) -> list[int]:
    """Relative data offsets of tensors written back to back in the given order."""
    starts, pos = [], 0
    for *_, nbytes in checked:
        starts.append(pos)
        pos += nbytes
    return starts


def _dumps(header: dict[str, Any]) -> str:
    """A header's JSON: compact separators, non-ASCII kept as UTF-8 (docs/FORMATS.md §1, writers)."""
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False)


def _entry_json(dtype: str, shape: Sequence[int], begin: int, end: int) -> dict[str, Any]:
    """One tensor's header entry (relative data offsets)."""
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}


def _padded(where: str, json_bytes: int) -> int:
    """The header length N for ``json_bytes`` of JSON: space-padded so that the data buffer starts
    page-aligned (``8 + N`` a multiple of ``ALIGNMENT``), refused over ``MAX_HEADER_BYTES``."""
    n = json_bytes + -(8 + json_bytes) % ALIGNMENT
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(f"{where}: header would be {n} bytes, over the limit of {MAX_HEADER_BYTES}")
    return n


# What a tensor's member adds to the header besides its key, dtype and numbers: the serialized entry of an
# empty name, dtype and shape, less the braces and key around it and its two offsets' digits, plus the comma
# that separates it from the next member.
_ENTRY_PUNCTUATION = len(_dumps({"": _entry_json("", (), 0, 0)})) - len('{""}') - len("00") + len(",")


def _json_length(
    checked: Sequence[tuple[str, str, tuple[int, ...], int]], meta: dict[str, str] | None
) -> int | None:
    """The bytes of the JSON ``_plan_layout`` serializes for ``checked`` and ``meta`` (before padding), counted
    without building it, or None when a tensor name or the metadata is not ASCII (the caller builds the header).
    A planner sizes every output file before any exists: on a 92k-tensor checkpoint, building the headers to
    measure them took 1.1 s of an 8 s plan, counting them 0.3 s (bench/plan.py). tests/formats/
    test_safetensors_io.py pins the count to the header on generated entries (names that need escapes, metadata
    first or last, empty files)."""
    n = 2  # the braces
    if meta is not None:  # its member, and the comma between it and the tensors
        member = _dumps({METADATA_KEY: meta})
        if not member.isascii():
            return None
        n += len(member) - 2
        n += 1 if checked else 0
    n -= 1 if checked else 0  # the last tensor's comma (each entry below counts one)
    pos = 0
    for name, dtype, dims, nbytes in checked:
        key = _encode_string(name)
        if not key.isascii():
            return None
        n += len(key) + len(dtype) + _ENTRY_PUNCTUATION + len(str(pos)) + len(str(pos + nbytes))
        for d in dims:
            n += len(str(d)) + 1
        n -= 1 if dims else 0
        pos += nbytes
    return n


def _raw_layout(where: str, entries: Iterable[Entry]) -> _Layout:
    """No header: the tensors back to back from offset 0."""
    checked = _validated_entries(where, entries)
    return _Layout(b"", {name: TensorInfo(name, dtype, shape, begin, begin + nbytes)
                         for (name, dtype, shape, nbytes), begin in zip(checked, _starts(checked), strict=True)})  # fmt: skip


def _plan_layout(
    where: str, entries: Iterable[Entry], metadata: Mapping[str, str] | None, metadata_last: bool = False
) -> _Layout:
    """The exact header bytes and offsets for ``entries`` written in order (docs/FORMATS.md §1, writers).

    ``metadata_last`` puts ``__metadata__`` after the tensor entries (the planar sidecar's layer files,
    docs/FORMATS.md §4, the one exception to §1)."""
    checked = _validated_entries(where, entries)
    header: dict[str, Any] = {}
    meta = _validated_metadata(where, metadata)
    if meta is not None and not metadata_last:
        header[METADATA_KEY] = meta  # first: readers that scan the header see the metadata before tensors
    for (name, dtype, shape, nbytes), begin in zip(checked, _starts(checked), strict=True):
        header[name] = _entry_json(dtype, shape, begin, begin + nbytes)
    if meta is not None and metadata_last:
        header[METADATA_KEY] = meta
    try:
        raw = _dumps(header).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SafetensorsError(
            f"{where}: a tensor name or metadata string is not valid Unicode ({exc})"
        ) from exc
    n = _padded(where, len(raw))  # trailing spaces are JSON whitespace
    pad = n - len(raw)
    data_start = 8 + n
    tensors = {
        name: TensorInfo(name, dtype, shape, data_start + begin, data_start + begin + nbytes)
        for (name, dtype, shape, nbytes), begin in zip(checked, _starts(checked), strict=True)
    }
    return _Layout(LENGTH.pack(n) + raw + b" " * pad, tensors)


class SafetensorsWriter:
    """Streams tensors into a new safetensors file; memory use is one tensor.

    ``entries`` are ``(name, dtype name, shape)`` in the order the data will be written; the header is
    computed up front and written to ``atomic.temp_name(path)`` (``.<basename>.tmp-<pid>``) in the target
    directory (exclusive create).
    ``write`` appends the next tensor; ``close`` checks that all were written, fsyncs, renames the file to
    ``path`` and fsyncs the directory. On any error (wrong order, wrong size, missing tensors, a full disk) the
    temporary file is removed and nothing is published. As a context manager, an exception aborts.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        entries: Sequence[Entry],
        metadata: Mapping[str, str] | None = None,
        *,
        metadata_last: bool = False,
        raw: bool = False,
    ) -> None:
        """``raw``: no header, the tensors' bytes alone from offset 0 (a QPACK layer file, formats/qpack.py),
        with the same streaming, checks and atomic publication."""
        self.path = pathlib.Path(path)
        self.temp_path = temp_name(self.path)
        self._where = str(self.path)
        self._fd: int | None = None
        self._state = "aborted"  # until our temporary file exists, there is nothing to clean up
        self._next = 0
        self._part = 0  # bytes written of tensor ``_next`` when it is written in pieces (``write_part``)
        layout = _raw_layout(self._where, entries) if raw else _plan_layout(self._where, entries, metadata, metadata_last)
        self.tensors: dict[str, TensorInfo] = layout.tensors
        """The planned tensors in write order (absolute offsets)."""
        self._order = list(layout.tensors.values())
        self._file_size = layout.file_size
        try:
            self._fd = os.open(
                self.temp_path,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                0o666,
            )
        except FileExistsError as exc:
            raise SafetensorsError(
                f"writing {self._where}: temporary file {self.temp_path} already exists "
                f"(another writer, or a leftover of a crashed run)"
            ) from exc
        except OSError as exc:
            raise SafetensorsError(f"writing {self._where}: {exc.strerror or exc}") from exc
        self._state = "open"
        self._write_all(memoryview(layout.header))

    # -- byte arithmetic up front --

    @staticmethod
    def data_size(entries: Iterable[Entry]) -> int:
        """Bytes of tensor data ``entries`` occupy (the data buffer size; sum of ``numel * itemsize``)."""
        return sum(nbytes for *_, nbytes in _validated_entries("<planned file>", entries))

    @staticmethod
    def file_size(
        entries: Iterable[Entry], metadata: Mapping[str, str] | None = None, *, metadata_last: bool = False
    ) -> int:
        """Exact size of the file a writer produces for ``entries`` and ``metadata`` (header included)."""
        checked = _validated_entries("<planned file>", entries)
        n = _json_length(checked, _validated_metadata("<planned file>", metadata))
        if n is None:  # not ASCII: measure the header itself (and refuse what it refuses)
            return _plan_layout("<planned file>", [c[:3] for c in checked], metadata, metadata_last).file_size
        return 8 + _padded("<planned file>", n) + sum(nbytes for *_, nbytes in checked)

    @staticmethod
    def header_bytes(entries: Iterable[Entry], metadata: Mapping[str, str] | None = None) -> bytes:
        """The exact ``8 + N`` header bytes a writer puts before the data of ``entries`` (bench/skeleton.py
        writes them, then extends the file to ``file_size`` as a hole)."""
        return _plan_layout("<planned file>", entries, metadata).header

    # -- writing --

    def _fail(self, message: str) -> NoReturn:
        self.abort()
        raise SafetensorsError(message)

    def _write_all(self, view: memoryview) -> None:
        assert self._fd is not None
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            self.abort()
            if exc.errno == errno.ENOSPC:
                raise SafetensorsError(
                    f"writing {self._where}: No space left on device (needed {self._file_size} bytes)"
                ) from exc
            raise SafetensorsError(f"writing {self._where}: {exc.strerror or exc}") from exc

    def _data_view(
        self, info: TensorInfo, data: np.ndarray | bytes | bytearray | memoryview, whole: bool = True
    ) -> memoryview:
        """The bytes to write for ``info`` (``whole``: all of them): a flat byte view of ``data``, copied only if
        it must be."""
        at = f"writing {self._where}: tensor {info.name!r}"
        if isinstance(data, np.ndarray):
            if data.dtype.hasobject:
                self._fail(f"{at}: array dtype {data.dtype} holds Python objects, not {info.dtype} values")
            want = itemsize(info.dtype)
            if data.dtype.itemsize != want:
                self._fail(
                    f"{at}: array dtype {data.dtype} has {data.dtype.itemsize}-byte items, "
                    f"{info.dtype} has {want}"
                )
            # C order, little-endian; both are no-ops (no copy) for the usual contiguous native array.
            array = np.ascontiguousarray(data)
            if array.dtype != little_endian(array.dtype):
                array = array.astype(little_endian(array.dtype))
            # numpy cannot export ml_dtypes types through the buffer protocol; a uint8 view can.
            view = memoryview(array.reshape(-1).view(np.uint8))
        elif isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data)
            if not view.c_contiguous:
                self._fail(f"{at}: buffer is not C-contiguous")
            view = view.cast("B")
        else:
            self._fail(f"{at}: data is a {type(data).__name__}, expected a numpy array or bytes")
        if whole and view.nbytes != info.nbytes:
            self._fail(
                f"{at}: got {view.nbytes} bytes, but shape {list(info.shape)} of {info.dtype} needs {info.nbytes}"
            )
        return view

    def write(self, name: str, data: np.ndarray | bytes | bytearray | memoryview) -> None:
        """Append tensor ``name``, which must be the next declared one, with exactly its byte count."""
        info = self._next_info(name)
        if self._part:
            self._fail(f"writing {self._where}: tensor {name!r} written whole after {self._part} bytes of it")
        self._write_all(self._data_view(info, data))
        self._next += 1

    def write_part(self, name: str, data: np.ndarray | bytes | bytearray | memoryview) -> None:
        """Append the next bytes of tensor ``name`` (the next declared one): a tensor written in pieces (row
        slabs), complete once its byte count is reached; a piece past it is refused."""
        info = self._next_info(name)
        view = self._data_view(info, data, whole=False)
        if self._part + view.nbytes > info.nbytes:
            self._fail(
                f"writing {self._where}: tensor {name!r}: got {self._part + view.nbytes} bytes, but shape "
                f"{list(info.shape)} of {info.dtype} needs {info.nbytes}"
            )
        self._write_all(view)
        self._part += view.nbytes
        if self._part == info.nbytes:
            self._next, self._part = self._next + 1, 0

    def _next_info(self, name: str) -> TensorInfo:
        if self._state != "open":
            raise SafetensorsError(
                f"writing {self._where}: tensor {name!r} written after the writer was {self._state}"
            )
        total = len(self._order)
        if self._next >= total:
            self._fail(f"writing {self._where}: tensor {name!r} written after all {total} declared tensors")
        info = self._order[self._next]
        if name != info.name:
            self._fail(
                f"writing {self._where}: tensor {name!r} written out of order: expected {info.name!r} "
                f"(tensor {self._next + 1} of {total})"
            )
        return info

    def close(self) -> None:
        """Publish the file: all tensors written? fsync, atomic rename to ``path``, fsync the directory."""
        if self._state == "closed":
            return
        if self._state == "aborted":
            raise SafetensorsError(f"writing {self._where}: the writer was aborted; nothing was published")
        total = len(self._order)
        if self._next < total:
            missing = self._order[self._next].name
            more = total - self._next - 1
            self._fail(
                f"writing {self._where}: closed after {self._next} of {total} tensors; tensor {missing!r} "
                f"{f'and {more} more ' if more else ''}not written"
            )
        assert self._fd is not None
        try:
            os.fsync(self._fd)
            fd, self._fd = self._fd, None
            os.close(fd)
            os.replace(self.temp_path, self.path)
        except OSError as exc:
            self.abort()
            raise SafetensorsError(f"writing {self._where}: {exc.strerror or exc}") from exc
        self._state = "closed"
        try:
            fsync_dir(self.path.parent)
        except OSError as exc:
            raise SafetensorsError(
                f"writing {self._where}: published, but syncing its directory failed: {exc.strerror or exc}"
            ) from exc

    def abort(self) -> None:
        """Drop the temporary file; nothing is published. Idempotent; no effect after a successful close."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        if self._state == "open":
            self._state = "aborted"
            try:
                os.unlink(self.temp_path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        # A writer dropped without close() must not leave its temporary file behind.
        try:
            if getattr(self, "_state", None) == "open":
                self.abort()
        except Exception:  # never raise from a finalizer
            pass


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write ``tensors`` (in mapping order) and ``metadata`` to ``path`` with a ``SafetensorsWriter``."""
    arrays = {name: np.asarray(array) for name, array in tensors.items()}
    entries: list[Entry] = []
    for name, array in arrays.items():
        try:
            dtype = safetensors_name(array.dtype.newbyteorder("="))
        except KeyError:
            raise SafetensorsError(
                f"writing {path}: tensor {name!r}: numpy dtype {array.dtype} has no safetensors dtype"
            ) from None
        entries.append((name, dtype, tuple(array.shape)))
    with SafetensorsWriter(path, entries, metadata) as writer:
        for name, array in arrays.items():
            writer.write(name, array)
