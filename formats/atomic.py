"""Durable, atomic publication of small files, shared by every writer of colitools.

A file is written under a hidden temporary name in the same directory (exclusive create), fsynced, renamed
over the final name, and the directory is fsynced so the rename survives a crash. A reader therefore sees the
old file or the new one, never a torn one; a crash leaves at most a ``.<name>.tmp-<pid>`` file, which the
next run of the owning command removes (it recognises it with ``parse_temp_name``).
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


_TEMP_NAME = re.compile(r"^\.(?P<stem>.+)\.tmp-(?P<pid>[0-9]+)$")


def temp_name(path: str | os.PathLike[str], pid: int | None = None) -> Path:
    """The hidden temporary name used while ``path`` is being written, in the same directory.

    ``.<name>.tmp-<pid>`` for a visible name, ``<name>.tmp-<pid>`` for a name that is hidden already
    (``.coli_usage`` -> ``.coli_usage.tmp-<pid>``, not ``..coli_usage.tmp-<pid>``). ``pid`` defaults to this
    process: two processes never share a temporary."""
    path = Path(path)
    pid = os.getpid() if pid is None else pid
    hidden = path.name if path.name.startswith(".") else f".{path.name}"
    return path.with_name(f"{hidden}.tmp-{pid}")


class TempName(NamedTuple):
    """A parsed temporary name: the text between its hidden dot and ``.tmp-``, and the writer's process id."""

    stem: str
    pid: int

    def is_temp_of(self, final: str) -> bool:
        """Whether this can be a temporary of the file named ``final``. A hidden and a visible name share
        temporaries (``x`` and ``.x`` both write ``.x.tmp-<pid>``), and the form of earlier versions, which
        always added a dot (``..x.tmp-<pid>`` for ``.x``), is accepted too."""
        return final in (self.stem, f".{self.stem}")


def parse_temp_name(name: str) -> TempName | None:
    """``TempName`` of a file name that ``temp_name`` wrote (today's or the earlier double-dot form), else
    None. Every cleaner of stale temporaries recognises them with this function."""
    m = _TEMP_NAME.match(name)
    return TempName(m["stem"], int(m["pid"])) if m else None


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
