"""sha256 of whole files, read in 8 MiB chunks (the manifest, download and verify checks share it).

The mirror copier has its own pipelined hasher (``colitools.mirror.fileops.sha256_file``) because it overlaps
reads with hashing and can bypass the page cache; everything else uses this plain one.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

CHUNK = 8 << 20


def sha256_file(path: str | os.PathLike[str], progress: Callable[[int], Any] | None = None) -> str:
    """Hex sha256 of the file at ``path``; ``progress(nbytes)`` is called after each chunk."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()
