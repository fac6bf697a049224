"""safetensors container I/O: a strict reader and a streaming, crash-safe writer (FORMATS-SPEC §1).

The reader validates the whole header before touching tensor data and reports every problem as one
``SafetensorsError`` line naming the file, the tensor and the numbers at fault. Tensor data is fetched with
positional reads of exactly its byte range (never a whole-file load or mmap); ``read_many`` fetches adjacent
tensors with one read.

The writer computes the header up front from ``(name, dtype, shape)`` entries, so that a planner knows every
output size before any data exists, then streams tensors one at a time into a temporary file in the target
directory and publishes it with an atomic rename. A file that was not completely written never appears under
its final name.

Byte order: safetensors data is little-endian; arrays are read and written as little-endian.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import stat
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from colitools.formats.dtypes import SAFETENSORS_DTYPES, itemsize, numpy_dtype, safetensors_name
from colitools.formats.errors import SafetensorsError

__all__ = [
    "ALIGNMENT",
    "MAX_HEADER_BYTES",
    "SafetensorsFile",
    "SafetensorsWriter",
    "TensorInfo",
    "coalesce_ranges",
    "read_header",
    "write_safetensors",
]

MAX_HEADER_BYTES = 100_000_000
"""Largest header (the JSON part, ``N``) a reader accepts and a writer produces."""

ALIGNMENT = 4096
"""Writers pad the header so that the data buffer starts at a multiple of this (``(8 + N) % 4096 == 0``)."""

# Largest byte count of one tensor (and of any byte offset) we accept: the range of a signed 64-bit offset.
# Checked on the running product of the shape so that a hostile shape cannot make us multiply huge integers.
_MAX_TENSOR_BYTES = 2**63 - 1

_ENTRY_KEYS = ("dtype", "shape", "data_offsets")
_METADATA_KEY = "__metadata__"
_LENGTH = struct.Struct("<Q")

Entry = tuple[str, str, tuple[int, ...]]
"""One planned tensor of a writer: (name, safetensors dtype name, shape)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in a safetensors file. ``begin``/``end`` are absolute file offsets."""

    name: str
    dtype: str  # safetensors dtype name, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int  # absolute byte offset of the tensor data in the file
    end: int  # absolute, exclusive

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (``end - begin``)."""
        return self.end - self.begin


# --------------------------------------------------------------------------------------------------------------
# Shared helpers


def _short(value: Any, limit: int = 80) -> str:
    """A one-line, length-limited rendering of a header value for error messages."""
    text = json.dumps(value, ensure_ascii=True, default=_plain)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Any) -> Any:
    """``json.dumps`` fallback: parsed header objects render as JSON objects, anything else as its repr."""
    return dict(value.pairs) if isinstance(value, _JsonObject) else repr(value)


def _is_int(value: Any) -> bool:
    # bool is a subclass of int in Python, but `true` is not a valid dimension or offset in JSON.
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_nbytes(shape: Sequence[int], dtype: str) -> int | None:
    """``numel(shape) * itemsize(dtype)``, or None if any intermediate product exceeds 2**63 - 1 bytes.

    Like the reference implementation (a checked multiply over the dims), an intermediate overflow is an error
    even if a later dimension is 0.
    """
    total = itemsize(dtype)
    for dim in shape:
        total *= dim
        if total > _MAX_TENSOR_BYTES:
            return None
    return total


def _le(dtype: np.dtype) -> np.dtype:
    """``dtype`` with little-endian byte order (unchanged for byte-sized and order-less dtypes)."""
    return dtype.newbyteorder("<")


# --------------------------------------------------------------------------------------------------------------
# Reader


class _JsonObject:
    """The (key, value) pairs of one JSON object in file order, duplicates kept so that they can be reported.

    Used as ``object_pairs_hook``: a plain dict would silently keep only the last of two equal keys.
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def _json_type(value: Any) -> str:
    """The JSON type name of a parsed value, for error messages."""
    if isinstance(value, _JsonObject):
        return "object"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "number"


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity/-Infinity, which are not JSON.
    raise ValueError(f"invalid JSON constant {name}")


def _parse_tensor_entry(where: str, name: str, entry: Any, data_start: int) -> TensorInfo:
    """Validate one header entry (everything that does not depend on the other tensors)."""
    at = f"{where}: tensor {name!r}"
    if not isinstance(entry, _JsonObject):
        raise SafetensorsError(f"{at}: entry is a JSON {_json_type(entry)}, expected an object")
    fields: dict[str, Any] = {}
    for key, value in entry.pairs:
        if key in fields:
            raise SafetensorsError(f"{at}: duplicate key {key!r} in its entry")
        fields[key] = value
    missing = [key for key in _ENTRY_KEYS if key not in fields]
    if missing:
        raise SafetensorsError(f"{at}: entry lacks {', '.join(map(repr, missing))}")
    # Unknown extra keys are ignored, as the reference implementation does; they cannot change the layout.

    dtype = fields["dtype"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise SafetensorsError(f"{at}: unknown dtype {_short(dtype)}")

    shape = fields["shape"]
    if type(shape) is not list or not all(_is_int(dim) and dim >= 0 for dim in shape):
        raise SafetensorsError(f"{at}: shape {_short(shape)} is not a list of non-negative integers")
    nbytes = _checked_nbytes(shape, dtype)
    if nbytes is None:
        raise SafetensorsError(
            f"{at}: shape {_short(shape)} of {dtype} overflows (more than 2**63 - 1 bytes)"
        )

    offsets = fields["data_offsets"]
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or not all(_is_int(x) and x >= 0 for x in offsets)
        or offsets[0] > offsets[1]
    ):
        raise SafetensorsError(
            f"{at}: data_offsets {_short(offsets)} is not [begin, end] with 0 <= begin <= end"
        )
    begin, end = offsets
    if end - begin != nbytes:
        raise SafetensorsError(
            f"{at}: data_offsets [{begin}, {end}] span {end - begin} bytes, "
            f"but shape {_short(shape)} of {dtype} needs {nbytes}"
        )
    return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)


def _parse_metadata(where: str, value: Any) -> dict[str, str]:
    if not isinstance(value, _JsonObject):
        raise SafetensorsError(f"{where}: __metadata__ is a JSON {_json_type(value)}, expected an object")
    metadata: dict[str, str] = {}
    for key, item in value.pairs:
        if key in metadata:
            raise SafetensorsError(f"{where}: duplicate __metadata__ key {key!r}")
        if not isinstance(item, str):
            raise SafetensorsError(
                f"{where}: __metadata__ value of {key!r} is a JSON {_json_type(item)}, expected a string"
            )
        metadata[key] = item
    return metadata


def _check_layout(where: str, infos: list[TensorInfo], data_start: int, file_size: int) -> None:
    """Offsets must tile the data buffer exactly: no overlap, no hole, nothing past or short of the end."""
    pos = data_start
    previous: TensorInfo | None = None
    for info in infos:  # sorted by (begin, end)
        if info.begin != pos:
            rel_begin, rel_pos = info.begin - data_start, pos - data_start
            offsets = f"data_offsets [{rel_begin}, {info.end - data_start}]"
            if previous is None:
                raise SafetensorsError(
                    f"{where}: tensor {info.name!r}: {offsets} leave a hole of {rel_begin} bytes "
                    f"at the start of the data buffer"
                )
            if info.begin < pos:
                raise SafetensorsError(
                    f"{where}: tensor {info.name!r}: {offsets} overlap tensor {previous.name!r}, "
                    f"which ends at {rel_pos}"
                )
            raise SafetensorsError(
                f"{where}: tensor {info.name!r}: {offsets} leave a hole of {rel_begin - rel_pos} bytes "
                f"after tensor {previous.name!r}, which ends at {rel_pos}"
            )
        pos = info.end
        previous = info
    data_size = file_size - data_start
    if pos != file_size:
        if previous is None:
            raise SafetensorsError(f"{where}: no tensors, but the data buffer holds {data_size} bytes")
        rel_end = pos - data_start
        if pos < file_size:
            raise SafetensorsError(
                f"{where}: the last tensor {previous.name!r} ends at {rel_end}, but the data buffer holds "
                f"{data_size} bytes ({data_size - rel_end} trailing bytes)"
            )
        raise SafetensorsError(
            f"{where}: tensor {previous.name!r} ends at {rel_end}, past the end of the data buffer "
            f"({data_size} bytes; file truncated?)"
        )


def coalesce_ranges(infos: Iterable[TensorInfo]) -> list[list[TensorInfo]]:
    """Group tensors into runs whose byte ranges touch, so that each run is fetched with one read.

    Runs are in file order, tensors in a run sorted by ``begin``. Overlapping ranges (a tensor listed twice)
    join the same run.
    """
    runs: list[list[TensorInfo]] = []
    run_end = -1
    for info in sorted(infos, key=lambda t: (t.begin, t.end)):
        if runs and info.begin <= run_end:
            runs[-1].append(info)
            run_end = max(run_end, info.end)
        else:
            runs.append([info])
            run_end = info.end
    return runs


class SafetensorsFile:
    """A strict safetensors reader: the whole header is validated on open (FORMATS-SPEC §1).

    Attributes: ``path``, ``tensors`` (name -> ``TensorInfo``, in data-offset order), ``metadata``
    (``__metadata__`` or ``{}``), ``header_bytes`` (the raw ``8 + N`` bytes), ``data_start`` (``8 + N``) and
    ``file_size``.

    The file descriptor stays open until ``close()`` (or the end of a ``with`` block). A read after
    ``close()`` reopens the file, after checking that it is still the file whose header was validated.
    """

    path: pathlib.Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    header_bytes: bytes
    data_start: int
    file_size: int

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        self._where = str(self.path)
        self._fd: int | None = None
        self._identity: tuple[int, int, int, int] | None = None
        self._fd = self._open()
        try:
            self._load_header()
        except BaseException:
            self.close()
            raise

    # -- opening and validation --

    def _open(self) -> int:
        """Open the file; on a reopen, refuse a file that is no longer the one whose header was validated."""
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise SafetensorsError(f"{self._where}: cannot open: {exc.strerror or exc}") from exc
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise SafetensorsError(f"{self._where}: not a regular file")
        if self._identity is not None and identity != self._identity:
            os.close(fd)
            raise SafetensorsError(f"{self._where}: the file changed since its header was read")
        self._identity = identity
        return fd

    def _load_header(self) -> None:
        where = self._where
        assert self._identity is not None
        file_size = self._identity[2]
        if file_size < 8:
            raise SafetensorsError(
                f"{where}: file is {file_size} bytes, too short for the 8-byte header length"
            )
        prefix = self._pread(8, 0)
        (n,) = _LENGTH.unpack(prefix)
        # Both limits are checked before the header is read, so a declared N of 10**9 allocates nothing.
        if n > MAX_HEADER_BYTES:
            raise SafetensorsError(
                f"{where}: header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes"
            )
        if 8 + n > file_size:
            raise SafetensorsError(
                f"{where}: header length {n} exceeds the file size ({file_size} bytes, "
                f"{file_size - 8} after the length field)"
            )
        raw = self._pread(n, 8)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SafetensorsError(
                f"{where}: header is not valid UTF-8 (byte {exc.start} of the header)"
            ) from exc
        try:
            root = json.loads(text, object_pairs_hook=_JsonObject, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise SafetensorsError(f"{where}: header is not valid JSON ({exc})") from exc
        if not isinstance(root, _JsonObject):
            raise SafetensorsError(f"{where}: header is a JSON {_json_type(root)}, expected an object")

        data_start = 8 + n
        seen: set[str] = set()
        metadata: dict[str, str] = {}
        infos: list[TensorInfo] = []
        for name, entry in root.pairs:
            if name in seen:
                what = "__metadata__ entry" if name == _METADATA_KEY else f"tensor name {name!r}"
                raise SafetensorsError(f"{where}: duplicate {what} in the header")
            seen.add(name)
            if name == _METADATA_KEY:
                metadata = _parse_metadata(where, entry)
            else:
                infos.append(_parse_tensor_entry(where, name, entry, data_start))
        infos.sort(key=lambda t: (t.begin, t.end))  # stable: equal ranges keep header order
        _check_layout(where, infos, data_start, file_size)

        self.tensors = {info.name: info for info in infos}
        self.metadata = metadata
        self.header_bytes = prefix + raw
        self.data_start = data_start
        self.file_size = file_size

    # -- positional reads --

    def _ensure_fd(self) -> int:
        if self._fd is None:
            self._fd = self._open()
        return self._fd

    def _pread(self, size: int, offset: int) -> bytes:
        """Exactly ``size`` bytes at ``offset`` (short reads are retried; EOF is an error)."""
        fd = self._ensure_fd()
        try:
            data = os.pread(fd, size, offset)
            if len(data) == size:
                return data
        except OSError as exc:
            raise SafetensorsError(f"{self._where}: read failed at byte {offset}: {exc.strerror}") from exc
        buf = bytearray(size)
        self._pread_into(memoryview(buf), offset)
        return bytes(buf)

    def _pread_into(self, buf: memoryview, offset: int) -> None:
        """Fill ``buf`` from ``offset`` without an intermediate copy where the OS allows it (preadv)."""
        fd = self._ensure_fd()
        done = 0
        try:
            while done < len(buf):
                if hasattr(os, "preadv"):
                    got = os.preadv(fd, [buf[done:]], offset + done)
                else:  # pragma: no cover - platforms without preadv
                    chunk = os.pread(fd, min(len(buf) - done, 1 << 30), offset + done)
                    got = len(chunk)
                    buf[done : done + got] = chunk
                if got == 0:
                    raise SafetensorsError(
                        f"{self._where}: unexpected end of file at byte {offset + done} "
                        f"(the file shrank after its header was read)"
                    )
                done += got
        except OSError as exc:
            raise SafetensorsError(
                f"{self._where}: read failed at byte {offset + done}: {exc.strerror}"
            ) from exc

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise SafetensorsError(f"{self._where}: no tensor named {name!r}") from None

    @staticmethod
    def _as_array(buf: np.ndarray, info: TensorInfo) -> np.ndarray:
        """View raw little-endian bytes (uint8, contiguous) as the tensor's exact dtype and shape."""
        return buf.view(_le(numpy_dtype(info.dtype))).reshape(info.shape)

    def read_bytes(self, name: str) -> bytes:
        """The raw data bytes of tensor ``name``."""
        info = self._info(name)
        return self._pread(info.nbytes, info.begin)

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a writable array of its exact dtype (ml_dtypes for BF16/F8) and shape."""
        info = self._info(name)
        buf = np.empty(info.nbytes, dtype=np.uint8)
        self._pread_into(memoryview(buf), info.begin)
        return self._as_array(buf, info)

    def read_many(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """Several tensors, keyed in the order asked; each run of adjacent byte ranges is one read.

        Arrays of one run are views into one shared buffer.
        """
        wanted = list(dict.fromkeys(names))
        infos = [self._info(name) for name in wanted]
        arrays: dict[str, np.ndarray] = {}
        for run in coalesce_ranges(infos):
            start = run[0].begin
            stop = max(info.end for info in run)
            buf = np.empty(stop - start, dtype=np.uint8)
            if stop > start:
                self._pread_into(memoryview(buf), start)
            for info in run:
                arrays[info.name] = self._as_array(buf[info.begin - start : info.end - start], info)
        return {name: arrays[name] for name in wanted}

    # -- lifetime --

    def close(self) -> None:
        """Release the file descriptor (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finalizer
            pass

    def __repr__(self) -> str:
        return f"SafetensorsFile({self._where!r}, {len(self.tensors)} tensors, {self.file_size} bytes)"


def read_header(path: str | os.PathLike[str]) -> SafetensorsFile:
    """Open and validate ``path`` reading only its header; the descriptor is released before returning.

    The result is a full ``SafetensorsFile``: reading tensor data from it reopens the file.
    """
    file = SafetensorsFile(path)
    file.close()
    return file


# --------------------------------------------------------------------------------------------------------------
# Writer


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
        at = f"{where}: tensor {name!r}"
        if name == _METADATA_KEY:
            raise SafetensorsError(f"{at}: the name is reserved for the metadata map")
        if name in seen:
            raise SafetensorsError(f"{at}: declared twice")
        seen.add(name)
        if dtype not in SAFETENSORS_DTYPES:
            raise SafetensorsError(f"{at}: unknown dtype {dtype!r}")
        dims = tuple(shape)
        if not all(
            isinstance(dim, int | np.integer) and not isinstance(dim, bool | np.bool_) for dim in dims
        ):
            raise SafetensorsError(f"{at}: shape {dims!r} is not a tuple of non-negative integers")
        dims = tuple(int(dim) for dim in dims)
        if any(dim < 0 for dim in dims):
            raise SafetensorsError(f"{at}: shape {dims!r} is not a tuple of non-negative integers")
        nbytes = _checked_nbytes(dims, dtype)
        if nbytes is None:
            raise SafetensorsError(f"{at}: shape {dims!r} of {dtype} overflows (more than 2**63 - 1 bytes)")
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


def _plan_layout(where: str, entries: Iterable[Entry], metadata: Mapping[str, str] | None) -> _Layout:
    """The exact header bytes and offsets for ``entries`` written in order (FORMATS-SPEC §1, writers)."""
    checked = _validated_entries(where, entries)
    header: dict[str, Any] = {}
    meta = _validated_metadata(where, metadata)
    if meta is not None:
        header[_METADATA_KEY] = meta  # first: readers that scan the header see the metadata before tensors
    for (name, dtype, shape, nbytes), begin in zip(checked, _starts(checked), strict=True):
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, begin + nbytes]}
    try:
        raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SafetensorsError(
            f"{where}: a tensor name or metadata string is not valid Unicode ({exc})"
        ) from exc
    # Trailing spaces are JSON whitespace: padding the header makes the data buffer start page-aligned.
    pad = -(8 + len(raw)) % ALIGNMENT
    n = len(raw) + pad
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(f"{where}: header would be {n} bytes, over the limit of {MAX_HEADER_BYTES}")
    data_start = 8 + n
    tensors = {
        name: TensorInfo(name, dtype, shape, data_start + begin, data_start + begin + nbytes)
        for (name, dtype, shape, nbytes), begin in zip(checked, _starts(checked), strict=True)
    }
    return _Layout(_LENGTH.pack(n) + raw + b" " * pad, tensors)


def _fsync_directory(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems cannot fsync a directory; the rename itself has still happened.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


class SafetensorsWriter:
    """Streams tensors into a new safetensors file; memory use is one tensor.

    ``entries`` are ``(name, dtype name, shape)`` in the order the data will be written; the header is
    computed up front and written to ``.<basename>.tmp-<pid>`` in the target directory (exclusive create).
    ``write`` appends the next tensor; ``close`` checks that all were written, fsyncs, renames the file to
    ``path`` and fsyncs the directory. On any error (wrong order, wrong size, missing tensors, a full disk) the
    temporary file is removed and nothing is published. As a context manager, an exception aborts.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        entries: Sequence[Entry],
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self.path = pathlib.Path(path)
        self.temp_path = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._where = str(self.path)
        self._fd: int | None = None
        self._state = "aborted"  # until our temporary file exists, there is nothing to clean up
        self._next = 0
        layout = _plan_layout(self._where, entries, metadata)
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
    def file_size(entries: Iterable[Entry], metadata: Mapping[str, str] | None = None) -> int:
        """Exact size of the file a writer produces for ``entries`` and ``metadata`` (header included)."""
        return _plan_layout("<planned file>", entries, metadata).file_size

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

    def _data_view(self, info: TensorInfo, data: np.ndarray | bytes | bytearray | memoryview) -> memoryview:
        """The bytes to write for ``info``: a flat byte view of ``data``, copied only if it must be."""
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
            if array.dtype != _le(array.dtype):
                array = array.astype(_le(array.dtype))
            # numpy cannot export ml_dtypes types through the buffer protocol; a uint8 view can.
            view = memoryview(array.reshape(-1).view(np.uint8))
        elif isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data)
            if not view.c_contiguous:
                self._fail(f"{at}: buffer is not C-contiguous")
            view = view.cast("B")
        else:
            self._fail(f"{at}: data is a {type(data).__name__}, expected a numpy array or bytes")
        if view.nbytes != info.nbytes:
            self._fail(
                f"{at}: got {view.nbytes} bytes, but shape {list(info.shape)} of {info.dtype} needs {info.nbytes}"
            )
        return view

    def write(self, name: str, data: np.ndarray | bytes | bytearray | memoryview) -> None:
        """Append tensor ``name``, which must be the next declared one, with exactly its byte count."""
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
        self._write_all(self._data_view(info, data))
        self._next += 1

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
            _fsync_directory(self.path.parent)
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
