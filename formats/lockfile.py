"""One process at a time in a folder: ``convert`` (``.colitools.lock``) and ``mirror stage``
(``.colibri-mirror.lock``) hold a lock file there while they work.

``filelock`` (flock on Unix, msvcrt on Windows) with ``timeout=0``: a second process fails at once rather than
waiting behind the first. The kernel releases the lock on any exit; the file itself is removed when the holder
ends, whether it finished, failed or was stopped cleanly (Ctrl-C, SIGTERM, disk floor). Only a SIGKILL (or a
crash) leaves the file behind, and the next run simply takes the lock on it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from colitools.formats.errors import ColitoolsError

__all__ = ["held_lock"]


@contextlib.contextmanager
def held_lock(path: str | os.PathLike[str], busy: Callable[[], ColitoolsError]) -> Iterator[None]:
    """Hold the lock file ``path`` for the ``with`` block; raise ``busy()`` at once when another process holds
    it. The file is unlinked before the lock is released: a process that opened it meanwhile finds its inode
    unlinked once it gets the lock and takes a fresh file (filelock checks), so two holders never coexist."""
    from filelock import FileLock, Timeout  # here: the commands that take no lock do not import it

    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise busy() from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # gone already, or (Windows) an open file cannot be unlinked
            Path(path).unlink()
        lock.release()
