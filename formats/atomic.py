"""Durable, atomic publication of small files, shared by every writer of colitools.

A file is written under a hidden temporary name in the same directory (exclusive create), fsynced, renamed
over the final name, and the directory is fsynced so the rename survives a crash. A reader therefore sees the
old file or the new one, never a torn one; a crash leaves at most a ``.<name>.tmp-<pid>`` file, which the
next run of the owning command removes (it recognises it with ``parse_temp_name``).
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from colitools.formats.errors import ParameterError

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


def write_json_atomic(
    path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, expand: int | None = None
) -> None:
    """``write_bytes_atomic`` of ``obj`` as UTF-8 JSON (pretty by default) with a trailing newline.

    ``expand=k``: objects and arrays nested up to ``k`` levels deep get one member per line (``indent``
    spaces per level), deeper ones are written on one line (``json_lines``)."""
    text = (json.dumps(obj, indent=indent, ensure_ascii=False) if expand is None else json_lines(obj, expand, indent or 2))
    write_bytes_atomic(path, (text + "\n").encode("utf-8"))


def json_lines(obj: Any, expand: int, indent: int = 2) -> str:
    """JSON text of ``obj`` whose outer ``expand`` levels of objects / arrays have one member per line and whose
    deeper values are each on one line (``", "`` / ``": "`` separators): the same value as ``json.dumps``.

    Why by hand: with ``indent`` set, the standard library encodes in pure Python (its C encoder serves only
    ``indent=None``), and the resume ledger rewrites the manifest after every unit: a 1,500-unit manifest took
    46 ms per rewrite, 14 ms this way. Here only the outer levels are Python; each line is the C encoder's."""
    flat = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "), check_circular=False).encode

    def enc(value: Any, depth: int) -> str:
        if depth >= expand or not isinstance(value, dict | list) or not value:
            return flat(value)
        pad, inner = " " * (indent * depth), " " * (indent * (depth + 1))
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise TypeError("json_lines: object keys must be strings")
            body = ",\n".join(f"{inner}{flat(k)}: {enc(v, depth + 1)}" for k, v in value.items())
            return "{\n" + body + "\n" + pad + "}"
        body = ",\n".join(inner + enc(v, depth + 1) for v in value)
        return "[\n" + body + "\n" + pad + "]"

    return enc(obj, 0)


PNG_SUFFIX = ".png"


def check_png_path(path: str | os.PathLike[str], parameter: str = "plot") -> None:
    """A plot is written as PNG only (``write_png_atomic``): a ``path`` of another suffix (``x.jpg``) is refused
    before any work, one ParameterError line naming ``parameter``, rather than written as PNG bytes."""
    if Path(path).suffix.lower() != PNG_SUFFIX:
        raise ParameterError(f"`{parameter}={str(path)!r}`: the plot is a PNG image, name it *{PNG_SUFFIX}")


def write_png_atomic(figure, path: str | os.PathLike[str]) -> None:
    """A matplotlib ``figure`` rendered to PNG and published at ``path`` (``write_bytes_atomic``): the plots of
    ``usage show --plot`` and ``verify quality --plot``. OSError as ``write_bytes_atomic`` raises it."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    write_bytes_atomic(path, buffer.getvalue())
