"""Durable, atomic publication of small files, shared by every writer of colitools.

A file is written under a hidden temporary name in the same directory (exclusive create), fsynced, renamed
over the final name, and the directory is fsynced so the rename survives a crash. A reader therefore sees the
old file or the new one, never a torn one; a crash leaves at most a ``.<name>.tmp-<pid>`` file, which the
next run of the owning command removes.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def temp_name(path: Path) -> Path:
    """The hidden temporary name used while ``path`` is being written: ``.<name>.tmp-<pid>``."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_dir(directory: Path) -> None:
    """fsync ``directory`` so a rename in it is durable. A no-op where directories cannot be opened or
    fsynced (some filesystems refuse; the rename itself has still happened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EBADF, errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Publish ``data`` as ``path``: temporary file (exclusive create), fsync, atomic rename, directory fsync."""
    path = Path(path)
    temp = temp_name(path)
    temp.unlink(missing_ok=True)  # left by a crashed run of this same process id
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


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """``write_bytes_atomic`` of ``obj`` as UTF-8 JSON (pretty by default) with a trailing newline."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))
