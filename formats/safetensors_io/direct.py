"""Reads that bypass the page cache (``O_DIRECT``) for byte ranges the page cache does not hold.

Reading a file from the drive through the page cache costs CPU per byte (the kernel allocates a page for every
4 KiB, fills it, then copies it into the reader's buffer; on a VM whose memory the host hands out lazily, a freshly
filled page is also slow to touch: bench/README.md ``quality.py`` measured 0.4-2.6 system CPU-s per GB read cold
this way against 0.05-0.11 with ``O_DIRECT``). A direct read lands in the reader's own buffer. It is used only for a range not
wholly in the page cache (``cachestat``, Linux 6.5+): what a conversion just wrote, or a cached source, is still
copied from memory, which is faster than any drive. Where the kernel cannot tell (an older kernel, another OS) or
the file system refuses ``O_DIRECT``, reads stay buffered.

Hand-written on ctypes: Python's ``os`` has no ``cachestat`` and no aligned buffers, and no maintained package
offers either (one syscall and one aligned slice).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import numpy as np

__all__ = ["ALIGN", "DIRECT_MIN", "aligned_empty", "cached", "open_direct"]

ALIGN = 4096  # offset, length and buffer alignment of a direct read: the largest logical block size in common use
DIRECT_MIN = 128 << 10  # smaller ranges stay buffered (a scale grid, a norm): the kernel's readahead serves them
_CACHESTAT = 451  # the syscall's number on every Linux architecture but alpha (since 6.5)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


def _syscall():
    if not sys.platform.startswith("linux") or not hasattr(os, "O_DIRECT"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):  # pragma: no cover - a libc without syscall()
        return None


_SYSCALL = _syscall()
_usable = _SYSCALL is not None  # False once the kernel said it has no cachestat (ENOSYS) or forbids it


def cached(fd: int, offset: int, size: int) -> bool | None:
    """Whether every page of ``[offset, offset + size)`` of ``fd`` is in the page cache (dirty pages count);
    None when the kernel cannot tell (no ``cachestat``)."""
    global _usable
    if not _usable:
        return None
    first, end = offset // 4096, -(-(offset + size) // 4096)
    rng, stat = _Range(first * 4096, (end - first) * 4096), _Stat()
    if _SYSCALL(_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(stat), 0) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _usable = False
        return None
    return stat.nr_cache >= end - first


def open_direct(path: os.PathLike[str] | str) -> int | None:
    """A descriptor of ``path`` opened for direct reads, or None where that is not possible (the platform, or a
    file system without ``O_DIRECT``)."""
    if not _usable:
        return None
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def aligned_empty(size: int) -> np.ndarray:
    """An uninitialised uint8 array of ``size`` bytes whose first byte is ``ALIGN``-aligned."""
    raw = np.empty(size + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + size]
