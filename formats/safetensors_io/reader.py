"""The strict safetensors reader (docs/FORMATS.md §1): ``SafetensorsFile``, ``read_header``, ``coalesce_ranges``.

The whole header is validated before any tensor data is touched; every problem is one ``SafetensorsError``
line naming the file, the tensor and the numbers at fault. Tensor data is fetched with positional reads of
exactly its byte range (never a whole-file load or mmap); ``read_many`` fetches adjacent tensors with one read. A
file opened with ``direct=True`` reads a large range the page cache does not hold with ``O_DIRECT`` (``direct.py``).
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import stat
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from colitools.formats.dtypes import SAFETENSORS_DTYPES, numpy_dtype
from colitools.formats.errors import SafetensorsError
from colitools.formats.jsonfile import invalid_text, shown_text
from colitools.formats.safetensors_io import direct as _direct
from colitools.formats.safetensors_io.header import (
    LENGTH,
    MAX_HEADER_BYTES,
    METADATA_KEY,
    TensorInfo,
    checked_nbytes,
    little_endian,
)

__all__ = ["SafetensorsFile", "TensorInfo", "coalesce_ranges", "read_header"]

_ENTRY_KEYS = ("dtype", "shape", "data_offsets")


_DIRECT_OPEN = threading.Lock()


class _DirectRefused(Exception):
    """The file system refused a direct read (EINVAL): the reader goes on buffered."""


# --------------------------------------------------------------------------------------------------------------
# Header validation


def _short(value: Any, limit: int = 80) -> str:
    """A one-line, length-limited rendering of a header value for error messages."""
    text = json.dumps(value, ensure_ascii=True, default=_plain)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Any) -> Any:
    """``json.dumps`` fallback: parsed header objects render as JSON objects, anything else as its repr."""
    return dict(value.pairs) if isinstance(value, _JsonObject) else repr(value)


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
    """Validate one header entry (everything that does not depend on the other tensors).

    The loop of every source header (92k entries on DeepSeek-R1): the entry's message prefix is made only for
    an error, and an entry with exactly the three keys in the order every writer uses skips the key checks. A
    JSON number without a fraction or exponent is a Python ``int``: ``type(x) is int`` (never a ``bool``)."""
    if not isinstance(entry, _JsonObject):
        raise SafetensorsError(
            f"{where}: tensor {name!r}: entry is a JSON {_json_type(entry)}, expected an object"
        )
    pairs = entry.pairs
    if (
        len(pairs) == 3
        and pairs[0][0] == "dtype"
        and pairs[1][0] == "shape"
        and pairs[2][0] == "data_offsets"
    ):
        dtype, shape, offsets = pairs[0][1], pairs[1][1], pairs[2][1]
    else:
        fields: dict[str, Any] = {}
        for key, value in pairs:
            if key in fields:
                raise SafetensorsError(f"{where}: tensor {name!r}: duplicate key {key!r} in its entry")
            fields[key] = value
        missing = [key for key in _ENTRY_KEYS if key not in fields]
        if missing:
            raise SafetensorsError(f"{where}: tensor {name!r}: entry lacks {', '.join(map(repr, missing))}")
        # Unknown extra keys are ignored, as the reference implementation does; they cannot change the layout.
        dtype, shape, offsets = fields["dtype"], fields["shape"], fields["data_offsets"]

    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise SafetensorsError(f"{where}: tensor {name!r}: unknown dtype {_short(dtype)}")
    if type(shape) is not list or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise SafetensorsError(
            f"{where}: tensor {name!r}: shape {_short(shape)} is not a list of non-negative integers"
        )
    nbytes = checked_nbytes(shape, dtype)
    if nbytes is None:
        raise SafetensorsError(
            f"{where}: tensor {name!r}: shape {_short(shape)} of {dtype} overflows (more than 2**63 - 1 bytes)"
        )
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or type(begin := offsets[0]) is not int
        or type(end := offsets[1]) is not int
        or not 0 <= begin <= end
    ):
        raise SafetensorsError(
            f"{where}: tensor {name!r}: data_offsets {_short(offsets)} is not [begin, end] with 0 <= begin <= end"
        )
    if end - begin != nbytes:
        raise SafetensorsError(
            f"{where}: tensor {name!r}: data_offsets [{begin}, {end}] span {end - begin} bytes, "
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


def _check_text(where: str, raw: bytes, root: _JsonObject) -> None:
    """Every tensor name and every ``__metadata__`` key and value is Unicode text: JSON's lone surrogate
    escapes (``"e\\udfff"``) are refused, as the upstream reader refuses them (nothing could print the name)."""
    strings: list[str] = []
    for name, entry in root.pairs:
        strings.append(name)
        if name == METADATA_KEY and isinstance(entry, _JsonObject):
            strings += [s for pair in entry.pairs for s in pair if isinstance(s, str)]
    bad = invalid_text(raw, strings)
    if bad is not None:
        raise SafetensorsError(
            f"{where}: the header string {shown_text(bad)} is not Unicode text (a lone surrogate escape)"
        )


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
    """A strict safetensors reader: the whole header is validated on open (docs/FORMATS.md §1).

    Attributes: ``path``, ``tensors`` (name -> ``TensorInfo``, in data-offset order), ``metadata``
    (``__metadata__`` or ``{}``), ``header_bytes`` (the raw ``8 + N`` bytes), ``data_start`` (``8 + N``) and
    ``file_size``.

    The file descriptor stays open until ``close()`` (or the end of a ``with`` block). A read after
    ``close()`` reopens the file, after checking that it is still the file whose header was validated.

    ``direct`` (settable): ``read`` / ``read_range`` of at least ``direct.DIRECT_MIN`` bytes that the page cache
    does not wholly hold go around it (``O_DIRECT`` on a second descriptor, into an aligned buffer: no page
    cache pages, no copy); the same bytes, the same errors. Off by default (a reader that wants the pages
    cached for a second pass keeps them).
    """

    path: pathlib.Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    header_bytes: bytes
    data_start: int
    file_size: int

    def __init__(
        self, path: str | os.PathLike[str], *, known: SafetensorsFile | None = None, direct: bool = False
    ) -> None:
        """Open and validate ``path``. ``known``: an earlier (possibly closed) reader of the same path; when the
        file is still that one (same device, inode, size and mtime), its validated header is taken over
        instead of being parsed again (a converter opens the same source shard once per unit)."""
        self.path = pathlib.Path(path)
        self._where = str(self.path)
        self._fd: int | None = None
        self._dfd: int | None = None  # the O_DIRECT descriptor (``direct``), opened at the first direct read
        self._no_direct = False  # the file system refused O_DIRECT: every read buffered
        self.direct = direct
        self._identity: tuple[int, int, int, int] | None = None
        self._fd = self._open()
        try:
            if known is not None and known.path == self.path and known._identity == self._identity:
                self.tensors, self.metadata = known.tensors, known.metadata
                self.header_bytes, self.data_start = known.header_bytes, known.data_start
                self.file_size = known.file_size
            else:
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
        return self._checked(fd)

    def _checked(self, fd: int) -> int:
        """``fd`` when it is a regular file and, on a reopen, still the file whose header was validated."""
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
        (n,) = LENGTH.unpack(prefix)
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
        _check_text(where, raw, root)

        data_start = 8 + n
        seen: set[str] = set()
        metadata: dict[str, str] = {}
        infos: list[TensorInfo] = []
        for name, entry in root.pairs:
            if name in seen:
                what = "__metadata__ entry" if name == METADATA_KEY else f"tensor name {name!r}"
                raise SafetensorsError(f"{where}: duplicate {what} in the header")
            seen.add(name)
            if name == METADATA_KEY:
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

    def _pread_into(self, buf: memoryview, offset: int, fd: int | None = None, need: int | None = None) -> None:
        """Fill ``buf`` from ``offset`` without an intermediate copy where the OS allows it (preadv). A direct
        read (``fd``: the O_DIRECT descriptor) needs only the first ``need`` bytes: the rest is alignment past
        the end of the file, where a direct read stops short."""
        fd = self._ensure_fd() if fd is None else fd
        need = len(buf) if need is None else need
        done = 0
        try:
            while done < need:
                if hasattr(os, "preadv"):
                    got = os.preadv(fd, [buf[done:]], offset + done)
                else:  # pragma: no cover - platforms without preadv
                    chunk = os.pread(fd, min(len(buf) - done, 1 << 30), offset + done)
                    got = len(chunk)
                    buf[done : done + got] = chunk
                done += got
                # (a direct read stops short of a block only at the end of the file)
                if done < need and (got == 0 or (fd == self._dfd and done % _direct.ALIGN)):
                    raise SafetensorsError(
                        f"{self._where}: unexpected end of file at byte {offset + done} "
                        f"(the file shrank after its header was read)"
                    )
        except OSError as exc:
            if fd == self._dfd and exc.errno == errno.EINVAL and done == 0:
                raise _DirectRefused from None
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
        return buf.view(little_endian(numpy_dtype(info.dtype))).reshape(info.shape)

    def read_bytes(self, name: str) -> bytes:
        """The raw data bytes of tensor ``name``."""
        info = self._info(name)
        return self._pread(info.nbytes, info.begin)

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a writable array of its exact dtype (ml_dtypes for BF16/F8) and shape."""
        info = self._info(name)
        return self._as_array(self.read_range(info.begin, info.nbytes), info)

    def read_range(self, offset: int, size: int) -> np.ndarray:
        """``size`` bytes at absolute file ``offset`` as a new uint8 array, read in place (a slab of a stack)."""
        if self.direct and size >= _direct.DIRECT_MIN and offset % 8 == 0:  # (8: the array stays aligned)
            fd = self._direct_fd(offset, size)
            if fd is not None:
                start = offset - offset % _direct.ALIGN
                stop = -(-(offset + size) // _direct.ALIGN) * _direct.ALIGN
                buf = _direct.aligned_empty(stop - start)
                try:
                    self._pread_into(memoryview(buf), start, fd, offset + size - start)
                    return buf[offset - start : offset - start + size]
                except _DirectRefused:  # O_DIRECT accepted at open, not for a read (some file systems)
                    self._no_direct = True
        buf = np.empty(size, dtype=np.uint8)  # not zero-filled: every byte is read into
        self._pread_into(memoryview(buf), offset)
        return buf

    def _direct_fd(self, offset: int, size: int) -> int | None:
        """The O_DIRECT descriptor when ``[offset, offset + size)`` is to be read around the page cache (not all
        of it cached), else None (buffered)."""
        if self._no_direct or _direct.cached(self._ensure_fd(), offset, size) is not False:
            return None
        if self._dfd is None:
            with _DIRECT_OPEN:  # threads sharing a reader (ShardReader) open one descriptor, not one each
                if self._dfd is None and not self._no_direct:
                    fd = _direct.open_direct(self.path)
                    if fd is None:
                        self._no_direct = True
                    else:  # (``_checked`` closes it when it is not the file whose header was read)
                        self._dfd = self._checked(fd)
        return self._dfd

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
        for fd in (self._fd, self._dfd):
            if fd is not None:
                os.close(fd)
        self._fd = self._dfd = None

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
