"""sha256 (and git blob ids) of whole files, read in 8 MiB chunks (the manifest, download, cache and verify
checks share it).

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


def git_blob_sha1(path: str | os.PathLike[str]) -> str:
    """Hex git blob id of the file at ``path``: sha1 of ``b"blob <size>\\0"`` and the bytes (what the Hugging Face
    Hub gives as the ETag of a file that is not stored in LFS, and what its cache names that file's blob by)."""
    digest = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
