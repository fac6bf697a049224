"""What a finished unit records of the source shards it read, and how a rerun decides they are still the bytes it
converted (docs/INTERNALS.md, "source_identity.py"; recorded per unit in ``colitools.json``, docs/FORMATS.md §10).

A shard's recorded identity is ``SourceFile.identity()`` (Hub: size and LFS sha256 at the pinned commit; a local
file: size, ``mtime_ns`` and ``ctime_ns`` from one ``stat``) and, for a local file, its content ``fingerprint``
(``fingerprint``: a sha256 over the size, the whole safetensors header, the first and last ``WINDOW`` bytes of
every tensor and ``BLOCKS`` blocks of ``BLOCK`` bytes spread evenly over the file). A rerun decides per shard:

* the recorded size, mtime and ctime, in the same source folder: the same bytes, nothing is read;
* another size: other bytes, nothing is read, the units that read it are converted again;
* the same size but another mtime, ctime or folder (``mv`` or ``cp -al`` of the folder, ``cp -a``, ``chmod``,
  ``chown``, ``touch``, a download of the same file again): the fingerprint is taken again and decides.

What the fingerprint does not prove: a change confined to the inside of a tensor, outside its sampled windows and
blocks, is not seen when the size is kept (a patched row in the middle of an embedding). A proof would need a
digest of every byte taken during the conversion: ~0.8 CPU-s per GB of source (sha256), about a third of what the
conversion itself costs, on every conversion (bench/resume_check.py), to spare a reconversion in the rare case an
edit keeps the size. The fingerprint reads ~7 MB per GB and sees any change of the header (names, dtypes, shapes,
offsets, metadata), any tensor written with other values (another revision, a fine-tune, a rescaled norm, an
edited first or last row), and whatever lands in a sampled block.

A ledger written before fingerprints (an earlier colitools) keeps a unit whose shards have their recorded stat
identity, in another folder too (an unchanged ``ctime_ns``, set by the kernel on any change, is the same inode
untouched since); anything else of such a record is converted again, and a kept record gets its fingerprint on
that rerun.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from colitools.converters.sources import LocalFolderSource, Source
from colitools.formats.errors import ConvertError

WINDOW = 4096  # bytes at the start and at the end of every tensor's data
BLOCK = 64 << 10  # bytes of each spread block
BLOCKS = 16  # blocks spread evenly over the file (one large tensor gets more than its two windows)
MAX_HEADER = 100 << 20  # the safetensors header limit; a longer claim is not parsed (its first block is sampled)
FINGERPRINT = "fingerprint"  # the key of a recorded identity that holds it
_TAG = b"colitools shard fingerprint 1\0"


def fingerprint(path: str | os.PathLike[str]) -> str:
    """Hex sha256 over the file's size, its safetensors header and its sampled windows (module docstring). Reads
    the header and, per tensor, ``2 * WINDOW`` bytes at most, plus ``BLOCKS * BLOCK``. Raises OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        digest = hashlib.sha256(_TAG + struct.pack("<Q", size))
        for start, length in _windows(fd, size):
            data = os.pread(fd, length, start)
            if len(data) != length:  # the file was cut while we read it
                raise OSError(f"{path}: {length} bytes at {start} could not be read")
            digest.update(struct.pack("<QQ", start, length) + data)
        return digest.hexdigest()
    finally:
        os.close(fd)


def _windows(fd: int, size: int) -> list[tuple[int, int]]:
    """The ``(start, length)`` ranges ``fingerprint`` reads, sorted and merged: the header (8 bytes of length and
    the JSON), each tensor's first and last ``WINDOW`` bytes, ``BLOCKS`` blocks spread over the data."""
    n = struct.unpack("<Q", os.pread(fd, 8, 0))[0] if size >= 8 else 0
    if size < 8 or n > min(MAX_HEADER, size - 8):  # not a safetensors header: its first block stands for it
        return [(0, min(size, BLOCK))]
    spans = [(0, 8 + n)]
    base = 8 + n
    for begin, end in _tensor_offsets(os.pread(fd, n, 8)):
        if 0 <= begin < end <= size - base:
            spans.append((base + begin, min(WINDOW, end - begin)))
            spans.append((base + max(begin, end - WINDOW), min(WINDOW, end - begin)))
    data = size - base
    if data > 0:  # block i starts i/(BLOCKS-1) of the way from the data's start to its end minus a block
        spans.extend((base + i * max(data - BLOCK, 0) // (BLOCKS - 1), min(BLOCK, data)) for i in range(BLOCKS))
    return _merged(spans)


def _tensor_offsets(header: bytes) -> Iterable[tuple[int, int]]:
    """Every tensor's ``data_offsets`` in a safetensors header; none when it is not such a header (then only the
    header and the spread blocks are sampled, and planning refuses the shard anyway)."""
    try:
        entries = json.loads(header)
    except (ValueError, UnicodeDecodeError):
        return []
    if not isinstance(entries, dict):
        return []
    found = []
    for name, info in entries.items():
        offsets = info.get("data_offsets") if isinstance(info, dict) and name != "__metadata__" else None
        if isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets):
            found.append((offsets[0], offsets[1]))
    return found


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for start, length in sorted(spans):
        if out and start <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], start + length - out[-1][0])
        else:
            out.append([start, length])
    return [(s, n) for s, n in out]


class SourceIdentities(Mapping[str, dict[str, Any]]):
    """Source shard -> its identity when this run started (``SourceFile.identity()``, what a ``stat`` or the Hub's
    listing says), and what the ledger records and checks on top of it: a local shard's fingerprint, taken at most
    once per run (``recorded``, ``change``).

    ``path_of``: the file of a local shard (None for a Hub source, whose identity is its sha256 already)."""

    def __init__(self, stats: Mapping[str, dict[str, Any]], path_of: Callable[[str], Path] | None = None):
        self._stats = dict(stats)
        self._path_of = path_of
        self._fingerprints: dict[str, str | None] = {}  # taken this run (None: the shard changed meanwhile)
        self.rechecked: dict[str, str] = {}  # shard -> what differed, its fingerprint the recorded one

    @classmethod
    def of(cls, src: Source, shards: Iterable[str]) -> SourceIdentities:
        """The identities of ``src``'s ``shards`` now (the listing's: one ``stat`` per local file, made once)."""
        files = src.files()
        path_of = (lambda shard, root=src.root: root / shard) if isinstance(src, LocalFolderSource) else None
        return cls({s: files[s].identity() for s in shards}, path_of)

    def __getitem__(self, shard: str) -> dict[str, Any]:
        return self._stats[shard]

    def __iter__(self) -> Iterator[str]:
        return iter(self._stats)

    def __len__(self) -> int:
        return len(self._stats)

    def recorded(self, shard: str, restat: bool = False) -> dict[str, Any]:
        """What a unit that read ``shard`` records of it: its identity, with the fingerprint of a local file.
        Raises ConvertError when the file changed since the run started (its bytes may not be the ones the unit
        converted): seen by the ``stat`` after the fingerprint's read, and with ``restat`` (the ledger recording
        a unit) by one ``stat`` now."""
        ident = self._stats[shard]
        if self._path_of is None:
            return dict(ident)
        path = self._path_of(shard)
        try:
            taken = self._take(shard)
            if restat and taken is not None and not self._as_started(shard, os.stat(path)):
                taken = None
        except OSError as exc:
            raise ConvertError(f"{path}: cannot read the source shard ({exc.strerror or exc})") from None
        if taken is None:
            raise ConvertError(
                f"{path}: source shard changed during the conversion; rerun the same command, which redoes the "
                "units that read it"
            )
        return {**ident, FINGERPRINT: taken}

    def change(self, shard: str, before: Any, moved: bool) -> str | None:
        """Why the recorded identity ``before`` of ``shard`` is not this shard now (None: the same bytes, as the
        module docstring decides); ``moved``: the source folder is another than the recorded one."""
        now = self._stats.get(shard)
        if not isinstance(before, dict) or now is None:
            return "no identity recorded" if now is not None else "not in this source"
        differ = [k for k in sorted(set(before) | set(now)) if k != FINGERPRINT and before.get(k) != now.get(k)]
        recorded = before.get(FINGERPRINT)
        if not differ and (not moved or recorded is None):
            if isinstance(recorded, str):  # the same stat: the recorded fingerprint is this file's
                self._fingerprints.setdefault(shard, recorded)
            return None
        if self._path_of is None or "size" in differ or "sha256" in differ:
            return ", ".join(differ)
        what = ", ".join(differ) or "another folder"
        if not isinstance(recorded, str):
            return f"{what}; no content fingerprint recorded (an earlier colitools) to compare its bytes with"
        try:
            taken = self._take(shard)
        except OSError as exc:
            return f"{what}; unreadable: {exc.strerror or exc}"
        if taken is None:
            return f"{what}; it changed while it was checked"
        if taken != recorded:
            return f"{what}; its content fingerprint differs"
        self.rechecked[shard] = what
        return None

    def _take(self, shard: str) -> str | None:
        """The fingerprint of local ``shard`` now, once per run; None when the file's stat identity is not the one
        this run started with, after the read (it changed meanwhile: the fingerprint may be of other bytes)."""
        if shard not in self._fingerprints:
            path = self._path_of(shard)
            taken = fingerprint(path)
            self._fingerprints[shard] = taken if self._as_started(shard, os.stat(path)) else None
        return self._fingerprints[shard]

    def _as_started(self, shard: str, st: os.stat_result) -> bool:
        """Whether ``st`` has the size, mtime and ctime ``shard`` had when this run started."""
        ident = self._stats[shard]
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (ident["size"], ident["mtime_ns"], ident["ctime_ns"])
