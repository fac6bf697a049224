"""Bounded-time sequential read bandwidth of a drive, to set the routing weights (``mirror plan --probe``).

Reads a large file with ``O_DIRECT`` and page-aligned buffers when the filesystem allows it, so the number is
the drive's and not the page cache's. Without ``O_DIRECT`` it asks the kernel to drop the file's cached pages
first (``posix_fadvise(DONTNEED)``, which only drops clean pages) and says that the page cache may still
distort the result. A drive holding no large file yet (an empty mirror) is probed through a temporary file
written there, fsynced, read back and removed.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from colitools.formats.errors import MirrorError
from colitools.formats.filenames import shard_files

__all__ = ["ProbeResult", "probe_directory", "probe_drives", "probe_file"]

CHUNK = 8 << 20  # multiple of every logical block size
PROBE_FILE_BYTES = 256 << 20
DEFAULT_SECONDS = 2.0
DEFAULT_MAX_BYTES = 2 << 30

_O_DIRECT = getattr(os, "O_DIRECT", 0)


@dataclass(frozen=True)
class ProbeResult:
    """One drive's measured sequential read speed."""

    directory: str
    file: str
    bytes_read: int
    seconds: float
    direct_io: bool
    note: str | None

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_read / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "bytes_per_second": self.bytes_per_second}


def _open_for_probe(path: Path) -> tuple[int, bool]:
    if _O_DIRECT:
        try:
            return os.open(path, os.O_RDONLY | _O_DIRECT), True
        except OSError:
            pass  # tmpfs and some network filesystems refuse O_DIRECT
    fd = os.open(path, os.O_RDONLY)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return fd, False


def probe_file(
    path: str | os.PathLike, *, seconds: float = DEFAULT_SECONDS, max_bytes: int = DEFAULT_MAX_BYTES
) -> ProbeResult:
    """Read ``path`` sequentially from the start for at most ``seconds`` or ``max_bytes``."""
    path = Path(path)
    fd, direct = _open_for_probe(path)
    buf = mmap.mmap(-1, CHUNK)  # anonymous mappings are page-aligned, as O_DIRECT requires
    view = memoryview(buf)
    done = 0
    try:
        start = time.perf_counter()
        elapsed = 0.0
        while done < max_bytes and elapsed < seconds:
            try:
                n = os.preadv(fd, [view], done)
            except OSError:
                if not direct:
                    raise
                # the filesystem accepted O_DIRECT at open but not for this read: measure without it
                os.close(fd)
                fd, direct = os.open(path, os.O_RDONLY), False
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                continue
            if n <= 0:
                break
            done += n
            elapsed = time.perf_counter() - start
        elapsed = time.perf_counter() - start
    finally:
        view.release()
        buf.close()
        os.close(fd)
    note = None if direct else "O_DIRECT unavailable here: the page cache may distort this measurement"
    return ProbeResult(str(path.parent), path.name, done, elapsed, direct, note)


def _largest_file(directory: Path) -> Path | None:
    best, best_size = None, 0
    if directory.is_dir():
        for path in shard_files(directory):  # sorted: of equal sizes, the first name is probed
            size = path.stat().st_size
            if size > best_size:
                best, best_size = path, size
    return best if best_size >= CHUNK else None


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (a mirror directory may not exist yet)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def probe_directory(
    directory: str | os.PathLike,
    *,
    seconds: float = DEFAULT_SECONDS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    probe_file_bytes: int = PROBE_FILE_BYTES,
) -> ProbeResult:
    """Probe the drive of ``directory``: its largest shard, or a temporary probe file written there.

    A directory that does not exist yet is probed through its nearest existing parent (where the mirror
    will be created); the temporary file is hidden and removed afterwards.
    """
    directory = Path(directory)
    existing = _largest_file(directory)
    if existing is not None:
        return probe_file(existing, seconds=seconds, max_bytes=max_bytes)
    where = nearest_existing(directory)
    if shutil.disk_usage(where).free < 4 * probe_file_bytes:
        raise MirrorError(f"not enough free space in {where} to write a {probe_file_bytes >> 20} MiB probe file")
    fd, name = tempfile.mkstemp(prefix=".colitools-probe-", dir=where)
    try:
        block = os.urandom(1 << 20)
        with os.fdopen(fd, "wb") as out:
            for _ in range(max(1, probe_file_bytes >> 20)):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        result = probe_file(name, seconds=seconds, max_bytes=max_bytes)
        return ProbeResult(str(directory), "(temporary probe file)", result.bytes_read, result.seconds,
                           result.direct_io, result.note)
    finally:
        Path(name).unlink(missing_ok=True)


def _sample_available(directory: Path, probe_file_bytes: int) -> int:
    """Bytes a probe of ``directory`` can read: its largest shard, or the temporary probe file."""
    existing = _largest_file(directory)
    return existing.stat().st_size if existing is not None else probe_file_bytes


def probe_drives(
    primary: str | os.PathLike,
    mirror: str | os.PathLike,
    *,
    seconds: float = DEFAULT_SECONDS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    probe_file_bytes: int = PROBE_FILE_BYTES,
) -> tuple[ProbeResult, ProbeResult]:
    """Probe both drives with the same sample size, so that their speeds compare like with like.

    The primary is read for at most ``seconds`` (and at most what both sides can offer, whole chunks); the
    mirror then reads exactly as many bytes (its time bound is ten times longer, so a slower drive still
    finishes the same sample)."""
    primary, mirror = Path(primary), Path(mirror)
    sample = min(max_bytes, _sample_available(primary, probe_file_bytes), _sample_available(mirror, probe_file_bytes))
    sample = max(CHUNK, sample // CHUNK * CHUNK)
    first = probe_directory(primary, seconds=seconds, max_bytes=sample, probe_file_bytes=sample)
    same = max(first.bytes_read, 1)
    second = probe_directory(mirror, seconds=10 * seconds, max_bytes=same, probe_file_bytes=max(same, CHUNK))
    return first, second
