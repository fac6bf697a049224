"""Durable file operations of the mirror: sha256 of a file, the verified copy, atomic JSON, directory fsync.

The verified copy (docs/CLI.md "mirror" (stage)) writes a hidden temporary file next to the target (exclusive create),
hashing every buffer it writes, fsyncs it, re-hashes the temporary file and compares, then renames it over the
target and fsyncs the directory. A copy killed at any point leaves at most the temporary file, which the next
stage removes.

Where the time goes (2-core VM, 4.4 GB staged, sha256 ~1.4 GB/s per core): the two sha256 passes the spec
asks for (the bytes written, and the re-hash of the temporary file) cost ~6.3 CPU-s and cannot be avoided, so
stage can never beat ~1.4 GB/s on two cores; the rest is kept small (~2.5 CPU-s: reading the source, writing,
reading the copy back). One copy runs in one thread, read -> hash -> write through a 1 MiB buffer that stays in
the CPU cache, and ``stage`` runs two copies at once to use two cores. Writeback of a copy is started every
8 MiB, so its fsync finds little left to write; after the re-hash the copy's clean pages are dropped from the
page cache: nothing reads a mirror file soon, and recycling those pages for the next copy is far cheaper than
growing the cache (on the VM measured, buffered writes into a growing page cache cost ~3 CPU-s/GB, into
recycled pages ~0.3). Re-hash modes:

* default: after the fsync the temporary file is read back through the page cache. This checks that the file
  holds exactly the bytes hashed from the source (no short, lost or misplaced write, no buffer reused too early,
  no other writer), and the fsync reports any writeback error; it does not read the device, so it cannot see
  corruption below the page cache (drive firmware, media). The verify that ends a stage reuses these digests;
  ``colitools mirror verify`` run on its own reads every mirror file from the device.
* ``reread_from_device``: the copy is written with ``O_DIRECT`` and re-hashed from the device (``O_DIRECT``, or
  after dropping its cached pages). Stronger, and ~1 CPU-s cheaper, but every byte crosses the mirror drive
  twice (write, then read), which shares its bandwidth: measured ~0.7 GB/s against ~0.85 GB/s for the default
  on an idle machine (the same speed when other work leaves stage only one core).

Test-only knob: ``COLITOOLS_MIRROR_TEST_STALL_AFTER_BYTES=N`` makes the copy stop (sleep, until killed) once N
bytes of a temporary file are written, so tests can kill a stage in the middle of a copy deterministically.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colitools.formats.atomic import fsync_dir
from colitools.formats.errors import MirrorError
from colitools.formats.safetensors_io.direct import ALIGN  # the one owner of O_DIRECT's alignment

__all__ = [
    "TEMP_SUFFIX",
    "PendingCopy",
    "copy_to_temp",
    "copy_verified",
    "publish_copy",
    "sha256_file",
    "temp_path_for",
]

CHUNK = 8 << 20  # pipelined reads (sha256_file) and O_DIRECT copies: a multiple of every logical block size
DEPTH = 4  # buffers in flight in sha256_file's pipeline
COPY_CHUNK = 1 << 20  # buffered copies: small enough to stay in the CPU cache between read, hash and write
WRITEBACK_EVERY = 8 << 20  # a buffered copy starts the writeback of what it wrote every this many bytes
TEMP_SUFFIX = ".colitools-part"
STALL_ENV = "COLITOOLS_MIRROR_TEST_STALL_AFTER_BYTES"

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

Progress = Callable[[int], None]


def temp_path_for(target: Path) -> Path:
    """The hidden temporary name a copy to ``target`` uses (same directory, so the rename is atomic)."""
    return target.with_name(f".{target.name}{TEMP_SUFFIX}")


def _read_full(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from ``offset`` (short only at end of file)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


_pool_lock = threading.Lock()
_pool: list[
    mmap.mmap
] = []  # CHUNK-sized buffers of finished pipelines, reused (fresh pages cost page faults)
POOL_MAX = 4 * DEPTH


def _take_buffers(n: int) -> list[mmap.mmap]:
    with _pool_lock:
        taken = [_pool.pop() for _ in range(min(n, len(_pool)))]
    return taken + [mmap.mmap(-1, CHUNK) for _ in range(n - len(taken))]  # page-aligned, as O_DIRECT requires


def _give_back(buffers: list[mmap.mmap]) -> None:
    with _pool_lock:
        keep = max(0, min(len(buffers), POOL_MAX - len(_pool)))
        _pool.extend(buffers[:keep])
    for buf in buffers[keep:]:
        buf.close()


def _pipeline(produce: Callable[[memoryview, int], int], consume: Callable[[memoryview], None]) -> int:
    """Run ``produce(buffer, offset) -> n`` in a helper thread and ``consume(buffer[:n])`` here, in order.

    Stops at the first short buffer (end of input). Returns the total byte count. Exceptions of either side
    propagate to the caller; the helper thread is always joined.
    """
    free: queue.Queue = queue.Queue()
    full: queue.Queue = queue.Queue()
    buffers = _take_buffers(DEPTH)
    for buf in buffers:
        free.put(buf)
    stop = threading.Event()

    def producer() -> None:
        offset = 0
        try:
            while not stop.is_set():
                buf = free.get()
                if buf is None:
                    return
                with memoryview(buf) as view:
                    n = produce(view, offset)
                full.put((buf, n))
                offset += n
                if n < CHUNK:
                    return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            full.put(exc)

    thread = threading.Thread(target=producer, name="colitools-mirror-reader", daemon=True)
    thread.start()
    total = 0
    try:
        while True:
            item = full.get()
            if isinstance(item, BaseException):
                raise item
            buf, n = item
            if n:
                with memoryview(buf) as view, view[:n] as part:
                    consume(part)
                total += n
            if n < CHUNK:
                return total
            free.put(buf)
    finally:
        stop.set()
        free.put(None)
        thread.join()
        _give_back(buffers)


def _open_read(path: Path, direct: bool) -> tuple[int, bool]:
    if direct and _O_DIRECT:
        try:
            return os.open(path, os.O_RDONLY | _O_DIRECT | _O_CLOEXEC), True
        except OSError:
            pass
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    if hasattr(os, "posix_fadvise"):
        if direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drop clean cached pages: read the device
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead
    return fd, False


def sha256_file(
    path: str | os.PathLike, *, progress: Progress | None = None, from_device: bool = False
) -> str:
    """sha256 hex digest of a file. ``from_device`` bypasses the page cache where the system allows it."""
    path = Path(path)
    fd, direct = _open_read(path, from_device)
    digest = hashlib.sha256()
    state = {"fd": fd, "direct": direct}

    def produce(view: memoryview, offset: int) -> int:
        try:
            return _read_full(state["fd"], view, offset)
        except OSError as exc:
            if not state["direct"] or exc.errno != errno.EINVAL:
                raise
            # O_DIRECT accepted at open but not for this read (some filesystems): continue buffered
            os.close(state["fd"])
            state["fd"], state["direct"] = os.open(path, os.O_RDONLY | _O_CLOEXEC), False
            return _read_full(state["fd"], view, offset)

    def consume(part: memoryview) -> None:
        digest.update(part)
        if progress is not None:
            progress(len(part))

    try:
        _pipeline(produce, consume)
    finally:
        os.close(state["fd"])
    return digest.hexdigest()


class _Writer:
    """Writes buffers to a new file (exclusive create): through the page cache, or with ``direct`` via ``O_DIRECT``
    while the buffers are block-aligned (falling back to buffered writes where ``O_DIRECT`` is refused)."""

    def __init__(self, path: Path, *, direct: bool):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC
        self.direct = False
        if direct and _O_DIRECT:
            try:
                self.fd = os.open(path, flags | _O_DIRECT, 0o644)
                self.direct = True
                return
            except OSError as exc:
                if exc.errno == errno.EEXIST:
                    raise
        self.fd = os.open(path, flags, 0o644)

    def _buffered(self) -> None:
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~_O_DIRECT)
        self.direct = False

    def write(self, part: memoryview) -> None:
        if self.direct and len(part) % ALIGN:
            self._buffered()  # the unaligned tail of the file
        done = 0
        while done < len(part):
            try:
                done += os.write(self.fd, part[done:])
            except OSError as exc:
                if not self.direct or exc.errno != errno.EINVAL:
                    raise
                self._buffered()  # O_DIRECT accepted at open, refused on write: carry on buffered

    def close(self) -> None:
        os.close(self.fd)


def _advise(fd: int, offset: int, length: int, advice_name: str) -> None:
    advice = getattr(os, advice_name, None)
    if advice is not None and hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, advice)
        except OSError:
            pass  # advice only


_local = threading.local()


def _copy_buffer(size: int) -> mmap.mmap:
    """A page-aligned buffer of ``size`` bytes, reused by every copy this thread makes."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    buf = buffers.get(size)
    if buf is None:
        buf = buffers[size] = mmap.mmap(-1, size)
    return buf


def _stall_after() -> int | None:
    value = os.environ.get(STALL_ENV)
    return int(value) if value else None


@dataclass(frozen=True)
class PendingCopy:
    """A copy written under its temporary name, not yet fsynced, re-hashed and published."""

    source: Path
    target: Path
    temp: Path
    sha256: str  # of the bytes read from the source and written
    reread_from_device: bool = False


def copy_to_temp(
    source: Path,
    target: Path,
    size: int,
    *,
    progress: Progress | None = None,
    guard: Callable[[int], None] | None = None,
    guard_every: int = 256 << 20,
    reread_from_device: bool = False,
) -> PendingCopy:
    """First half of the verified copy: write ``source`` to the hidden temporary name, hashing what is written.

    Each buffer read from the source is hashed, then that very buffer is written, so the sha256 is both the
    source's and that of the bytes written. Buffered writes by default (writeback started every 8 MiB); with
    ``reread_from_device`` ``O_DIRECT`` writes, since the copy will be re-read from the device anyway. ``size``
    is the size the plan saw: a source that changed size is an error. ``guard(bytes_written)`` runs before the
    first byte and every ``guard_every`` bytes; it may raise to abort the copy (the free-space reserve check).
    On any failure the temporary file is removed and the target is untouched. :func:`publish_copy` does the
    rest (fsync, re-hash, rename).
    """
    temp = temp_path_for(target)
    if not target.parent.is_dir():  # a planar sidecar's layer files live in experts-int4g64/ (FORMATS §4)
        target.parent.mkdir(parents=True, exist_ok=True)
        fsync_dir(target.parent.parent)
    digest = hashlib.sha256()
    src = os.open(source, os.O_RDONLY | _O_CLOEXEC)
    try:
        writer = _Writer(temp, direct=reread_from_device)
    except BaseException:
        os.close(src)
        raise
    try:
        try:
            written = _copy_hashing(src, writer, digest, progress, guard, guard_every)
            if written != size:
                raise MirrorError(f"{source} is {written} bytes now, the plan saw {size}: source changed")
        finally:
            writer.close()
            os.close(src)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return PendingCopy(source, target, temp, digest.hexdigest(), reread_from_device)


def _copy_hashing(
    src: int,
    writer: _Writer,
    digest: Any,  # a hashlib.sha256()
    progress: Progress | None,
    guard: Callable[[int], None] | None,
    guard_every: int,
) -> int:
    """The loop of ``copy_to_temp``: read, hash, write every buffer of ``src``; returns the bytes written."""
    stall = _stall_after()
    chunk = CHUNK if writer.direct else COPY_CHUNK
    written = flushed = 0
    next_guard = guard_every
    _advise(src, 0, 0, "POSIX_FADV_SEQUENTIAL")
    if guard is not None:
        guard(0)
    with memoryview(_copy_buffer(chunk)) as view:
        while True:
            n = _read_full(src, view, written)
            if n == 0:
                break
            with view[:n] as part:
                digest.update(part)
                if guard is not None and written >= next_guard:
                    guard(written)
                    next_guard = written + guard_every
                writer.write(part)
            written += n
            if not writer.direct and written - flushed >= WRITEBACK_EVERY:
                # dirty pages only: this starts their writeback and drops nothing the re-hash needs
                _advise(writer.fd, flushed, written - flushed, "POSIX_FADV_DONTNEED")
                flushed = written
            if progress is not None:
                progress(n)
            if stall is not None and written >= stall:
                while True:  # test knob: wait here to be killed mid-copy (or stopped by Ctrl-C)
                    if guard is not None:
                        guard(written)  # raises once the stage is told to stop
                    time.sleep(0.05)
            if n < chunk:
                break
    return written


def _sha256_fd(fd: int, progress: Progress | None) -> str:
    """sha256 of an open file read sequentially through the page cache, in this thread."""
    digest = hashlib.sha256()
    offset = 0
    with memoryview(_copy_buffer(COPY_CHUNK)) as view:
        while True:
            n = _read_full(fd, view, offset)
            if n == 0:
                break
            with view[:n] as part:
                digest.update(part)
            offset += n
            if progress is not None:
                progress(n)
            if n < COPY_CHUNK:
                break
    return digest.hexdigest()


def publish_copy(pending: PendingCopy, *, progress: Progress | None = None) -> str:
    """Second half: fsync the temporary file, re-hash it and compare, rename it over the target, fsync the dir.

    Returns the sha256. The re-hash reads the file through the page cache, or from the device when the copy
    was made with ``reread_from_device`` (see the module docstring). The copy's pages, clean after the fsync,
    are then dropped from the page cache.
    """
    try:
        fd = os.open(pending.temp, os.O_RDONLY | _O_CLOEXEC)
        try:
            os.fsync(fd)  # data and inode; the rename is made durable by fsync_dir below
            if pending.reread_from_device:
                reread = sha256_file(pending.temp, progress=progress, from_device=True)
            else:
                _advise(fd, 0, 0, "POSIX_FADV_SEQUENTIAL")
                reread = _sha256_fd(fd, progress)
            _advise(fd, 0, 0, "POSIX_FADV_DONTNEED")
        finally:
            os.close(fd)
        if reread != pending.sha256:
            where = "from the device" if pending.reread_from_device else "back"
            raise MirrorError(
                f"{pending.temp}: sha256 read {where} ({reread}) differs from the bytes written ({pending.sha256})"
            )
        os.replace(pending.temp, pending.target)
    except BaseException:
        pending.temp.unlink(missing_ok=True)
        raise
    fsync_dir(pending.target.parent)
    return pending.sha256


def copy_verified(
    source: Path,
    target: Path,
    size: int,
    *,
    progress: Progress | None = None,
    guard: Callable[[int], None] | None = None,
    guard_every: int = 256 << 20,
    reread_from_device: bool = False,
) -> str:
    """Copy ``source`` to ``target`` as docs/CLI.md "mirror" (stage) requires; returns the sha256 of the bytes copied.

    :func:`copy_to_temp` then :func:`publish_copy`: temporary file (exclusive create), hashed while written,
    fsynced, re-hashed and compared, renamed over the target, directory fsynced. Runs in the calling thread
    (one core); ``stage`` runs several at once.
    """
    pending = copy_to_temp(
        source,
        target,
        size,
        progress=progress,
        guard=guard,
        guard_every=guard_every,
        reread_from_device=reread_from_device,
    )
    return publish_copy(pending, progress=progress)
