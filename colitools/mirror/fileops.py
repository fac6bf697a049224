"""Durable file operations of the mirror: sha256 of a file, the verified copy, atomic JSON, directory fsync.

Reads and writes are pipelined: a helper thread fills page-aligned buffers while the calling thread consumes
them (hashlib and the I/O calls release the GIL), so hashing overlaps I/O.

The verified copy (MIRROR-SPEC "stage") writes a hidden temporary file next to the target (exclusive create),
hashes every buffer it writes, fsyncs, re-reads the file from the device (``O_DIRECT``, or after dropping its
cached pages) and compares, then renames it over the target and fsyncs the directory. A copy killed at any
point leaves at most the temporary file, which the next stage removes.

Test-only knob: ``COLITOOLS_MIRROR_TEST_STALL_AFTER_BYTES=N`` makes the copy stop (sleep, until killed) once N
bytes of a temporary file are written, so tests can kill a stage in the middle of a copy deterministically.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from colitools.errors import MirrorError

__all__ = [
    "TEMP_SUFFIX",
    "atomic_write_json",
    "PendingCopy",
    "copy_to_temp",
    "copy_verified",
    "publish_copy",
    "fsync_dir",
    "sha256_file",
    "temp_path_for",
]

CHUNK = 8 << 20  # a multiple of every logical block size (O_DIRECT alignment)
DEPTH = 4  # buffers in flight
ALIGN = 4096
TEMP_SUFFIX = ".colitools-part"
STALL_ENV = "COLITOOLS_MIRROR_TEST_STALL_AFTER_BYTES"

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

Progress = Callable[[int], None]


def temp_path_for(target: Path) -> Path:
    """The hidden temporary name a copy to ``target`` uses (same directory, so the rename is atomic)."""
    return target.with_name(f".{target.name}{TEMP_SUFFIX}")


def fsync_dir(directory: Path) -> None:
    """fsync a directory so a rename in it is durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EBADF, errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def atomic_write_json(path: Path, payload: object) -> None:
    """Write JSON to ``path`` via a temporary file (exclusive create), fsync, rename, fsync the directory."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = (json.dumps(payload, indent=2) + "\n").encode("utf-8")
    temp.unlink(missing_ok=True)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _read_full(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from ``offset`` (short only at end of file)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _pipeline(produce: Callable[[memoryview, int], int], consume: Callable[[memoryview], None]) -> int:
    """Run ``produce(buffer, offset) -> n`` in a helper thread and ``consume(buffer[:n])`` here, in order.

    Stops at the first short buffer (end of input). Returns the total byte count. Exceptions of either side
    propagate to the caller; the helper thread is always joined.
    """
    free: queue.Queue = queue.Queue()
    full: queue.Queue = queue.Queue()
    buffers = [mmap.mmap(-1, CHUNK) for _ in range(DEPTH)]  # page-aligned, as O_DIRECT requires
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
        for buf in buffers:
            buf.close()


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


def sha256_file(path: str | os.PathLike, *, progress: Progress | None = None, from_device: bool = False) -> str:
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
    """Writes buffers to a new file with O_DIRECT while they are block-aligned, buffered otherwise."""

    def __init__(self, path: Path):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC
        self.direct = False
        if _O_DIRECT:
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


def _stall_after() -> int | None:
    value = os.environ.get(STALL_ENV)
    return int(value) if value else None


@dataclass(frozen=True)
class PendingCopy:
    """A copy written and fsynced under its temporary name, not yet re-read and published."""

    source: Path
    target: Path
    temp: Path
    sha256: str  # of the bytes read from the source and written


def copy_to_temp(
    source: Path,
    target: Path,
    size: int,
    *,
    progress: Progress | None = None,
    guard: Callable[[int], None] | None = None,
    guard_every: int = 256 << 20,
) -> PendingCopy:
    """First half of the verified copy: write ``source`` to the hidden temporary name, hashing it, and fsync.

    ``size`` is the size the plan saw: a source that changed size is an error. ``guard(bytes_written)`` runs
    before the first byte and every ``guard_every`` bytes; it may raise to abort the copy (the free-space
    reserve check). On any failure the temporary file is removed and the target is untouched.
    """
    temp = temp_path_for(target)
    digest = hashlib.sha256()
    stall = _stall_after()
    src = os.open(source, os.O_RDONLY | _O_CLOEXEC)
    try:
        writer = _Writer(temp)
    except BaseException:
        os.close(src)
        raise
    written = 0
    next_guard = guard_every
    try:
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(src, 0, 0, os.POSIX_FADV_SEQUENTIAL)

            def produce(view: memoryview, offset: int) -> int:
                n = _read_full(src, view, offset)
                digest.update(view[:n])  # the very buffer the writer writes next
                return n

            def consume(part: memoryview) -> None:
                nonlocal written, next_guard
                if guard is not None and written >= next_guard:
                    guard(written)
                    next_guard = written + guard_every
                writer.write(part)
                written += len(part)
                if progress is not None:
                    progress(len(part))
                if stall is not None and written >= stall:
                    while True:  # test knob: wait here to be killed mid-copy
                        time.sleep(3600)

            if guard is not None:
                guard(0)
            _pipeline(produce, consume)
            if written != size:
                raise MirrorError(f"{source} is {written} bytes now, the plan saw {size}: source changed")
            os.fsync(writer.fd)
        finally:
            writer.close()
            os.close(src)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return PendingCopy(source, target, temp, digest.hexdigest())


def publish_copy(pending: PendingCopy, *, progress: Progress | None = None) -> str:
    """Second half: re-read the temporary file from the device, compare, rename over the target, fsync dir.

    Returns the sha256. Safe to run in another thread while the next copy is written.
    """
    try:
        reread = sha256_file(pending.temp, progress=progress, from_device=True)
        if reread != pending.sha256:
            raise MirrorError(
                f"{pending.temp}: sha256 read back from the device ({reread}) differs from the bytes written "
                f"({pending.sha256})"
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
) -> str:
    """Copy ``source`` to ``target`` as MIRROR-SPEC "stage" requires; returns the sha256 of the bytes copied.

    :func:`copy_to_temp` then :func:`publish_copy`: temporary file (exclusive create), hashed while written,
    fsynced, re-read from the device and compared, renamed over the target, directory fsynced.
    """
    pending = copy_to_temp(source, target, size, progress=progress, guard=guard, guard_every=guard_every)
    return publish_copy(pending, progress=progress)
