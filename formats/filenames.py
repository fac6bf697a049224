"""The file names of a model folder, in one place (docs/FORMATS.md §6 and §8, "Model directories").

Every reader and writer of colitools takes these names from here: the converter's output, the inspector, the
verifier, the runtime and the mirror. The header size limit is ``safetensors_io.MAX_HEADER_BYTES``; the
temporary-name convention is ``atomic.temp_name`` / ``atomic.parse_temp_name``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from colitools.formats.jsonfile import is_text

__all__ = [
    "CONFIG_FILE",
    "DOWNLOAD_DIR",
    "INDEX_FILE",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "SHARD_SUFFIX",
    "SINGLE_FILE",
    "USAGE_FILE",
    "inside_name_problem",
    "shard_file_name",
    "shard_files",
]

CONFIG_FILE = "config.json"  # the model's Hugging Face config
INDEX_FILE = "model.safetensors.index.json"  # weight_map: tensor -> shard file
SINGLE_FILE = "model.safetensors"  # a checkpoint without an index is this one file
SHARD_SUFFIX = ".safetensors"  # every shard file name ends so (check_shard_name)
MANIFEST_FILE = "colitools.json"  # a conversion's resume ledger and manifest
USAGE_FILE = ".coli_usage"  # routing usage history, written by the runtime, read by the mirror
LOCK_FILE = ".colitools.lock"  # held in an output folder while a conversion works in it
DOWNLOAD_DIR = ".colitools-download"  # a conversion's downloads from the Hub, inside its output folder


def shard_file_name(k: int, n: int) -> str:
    """The converter's name of output shard ``k`` (1-based) of ``n``: ``model-00001-of-00003.safetensors``."""
    return f"model-{k:05d}-of-{n:05d}{SHARD_SUFFIX}"


def shard_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The shard files of a folder without an index: every regular ``*.safetensors`` file that is not hidden
    (hidden names are temporaries and copies in progress), sorted by name."""
    return [
        p
        for p in sorted(Path(directory).glob(f"*{SHARD_SUFFIX}"))
        if not p.name.startswith(".") and p.is_file()
    ]


_DRIVE = re.compile(r"^[A-Za-z]:")


def inside_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a file name recorded inside a folder (the manifest's ``plan.files``, its units'
    files, ``shards`` and ``copied_files``: ``model-00001-of-00003.safetensors``,
    ``experts-int4g64/layer-003.safetensors``), or None. Refused: a name that is empty or no string, absolute
    (``/``, ``\\``, ``C:``), with a backslash, a NUL, an empty, ``.`` or ``..`` component, or that is no Unicode
    text: it could name a file outside the folder, or none."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    if name.startswith("/") or _DRIVE.match(name) or os.path.isabs(name):
        return "absolute path"
    if "\\" in name or "\0" in name:
        return "contains a backslash or a NUL character"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "leaves the folder (an empty, '.' or '..' component)"
    if not is_text(name):
        return "not Unicode text (a lone surrogate escape)"
    return None
