"""The output folder besides the shards (FORMATS-SPEC §7): ``model.safetensors.index.json``, ``config.json``
without its ``quantization_config``, ``generation_config.json`` and tokenizer files copied unchanged.

All files are written with a temporary name, fsync and an atomic rename, and their bytes depend only on the
source and the plan (no times), so reruns and resumed runs produce identical files.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from colitools.converters.planner import ConversionPlan
from colitools.errors import ConvertError
from colitools.formats.atomic import fsync_dir, temp_name, write_json_atomic
from colitools.formats.filenames import CONFIG_FILE, INDEX_FILE

# Files copied unchanged from the source root: generation config and everything a tokenizer needs.
_COPIED = re.compile(
    r"^(generation_config\.json|tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|"
    r"merges\.txt|chat_template\.(jinja|json)|.*\.tiktoken|spiece\.model|sentencepiece.*\.model)$"
)


def copied_files(names: list[str]) -> list[str]:
    """Source files (top-level) copied unchanged to the output: generation config and tokenizer files."""
    return sorted(n for n in names if "/" not in n and _COPIED.match(n))


def write_index(outdir: Path, plan: ConversionPlan) -> dict[str, Any]:
    """``model.safetensors.index.json``: every tensor written -> its file; total_size = sum of tensor data."""
    weight_map: dict[str, str] = {}
    total = 0
    for f in plan.files:
        total += f.data_size
        for name, _, _ in f.entries:
            weight_map[name] = f.name
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json_atomic(outdir / INDEX_FILE, index)
    return index


def write_config(outdir: Path, config: dict[str, Any]) -> None:
    """``config.json`` without ``quantization_config`` (the source's is recorded in the manifest)."""
    write_json_atomic(outdir / CONFIG_FILE, {k: v for k, v in config.items() if k != "quantization_config"})


def copy_file(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` atomically (temporary name, fsync, rename)."""
    tmp = temp_name(dest)
    with open(src, "rb") as fi, open(tmp, "wb") as fo:
        shutil.copyfileobj(fi, fo, 1 << 20)
        fo.flush()
        os.fsync(fo.fileno())
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def check_output_path(out: Path) -> None:
    """Refuse, before anything is written, an output path that exists but is not a folder (or whose parent is
    a file): ``ConvertError`` in one line instead of the OS's "File exists"."""
    for p in (out, *out.parents):
        if p.exists() and not p.is_dir():
            what = "the output" if p == out else f"a parent of the output {out}"
            raise ConvertError(f"{p}: is a file, not a folder ({what}); give a folder to convert into")
        if p.is_dir():
            return


def check_not_in_source(out: Path, source_root: Path) -> None:
    """Refuse an output folder that is the local source folder or inside it (the output's files would become
    part of the source, and a lock file would be left in it), before anything is written."""
    out, root = out.resolve(), source_root.resolve()
    if out == root or root in out.parents:
        where = "is the source folder" if out == root else f"is inside the source folder {root}"
        raise ConvertError(f"{out}: the output folder {where}; choose an output folder outside it")
