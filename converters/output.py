"""The output folder besides the shards (docs/FORMATS.md §10): ``model.safetensors.index.json``, ``config.json``
without its ``quantization_config``, ``generation_config.json`` and tokenizer files copied unchanged; with
``--layout planar`` also the sidecar's ``experts-int4g64/index.json`` (docs/FORMATS.md §4, ``write_sidecar_index``).

All files are written with a temporary name, fsync and an atomic rename, and their bytes depend only on the
source and the plan (no times), so reruns and resumed runs produce identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from colitools.converters.planner import ConversionPlan
from colitools.formats import model_config, qpack, registry
from colitools.formats import planar_sidecar as sidecar
from colitools.formats.atomic import fsync_dir, temp_name, write_bytes_atomic, write_json_atomic
from colitools.formats.errors import ConvertError
from colitools.formats.filenames import INDEX_FILE
from colitools.formats.names import parse_name

# Files copied unchanged from the source root: generation config, everything a tokenizer needs, and DeepSeek-V4.1's
# engram hash tables (``dsv41_engram.json``, read by c/deepseek_v41.c beside config.json).
_COPIED = re.compile(
    r"^(generation_config\.json|dsv41_engram\.json|tokenizer.*|special_tokens_map\.json|added_tokens\.json|"
    r"vocab\.(json|txt)|merges\.txt|chat_template\.(jinja|json)|.*\.tiktoken|spiece\.model|sentencepiece.*\.model)$"
)


def copied_files(names: list[str]) -> list[str]:
    """Source files (top-level) copied unchanged to the output: generation config and tokenizer files."""
    return sorted(n for n in names if "/" not in n and _COPIED.match(n))


def write_index(outdir: Path, plan: ConversionPlan) -> dict[str, Any]:
    """``model.safetensors.index.json``: every tensor of the main container -> its file (the planar sidecar's
    files are not part of it); total_size = sum of tensor data."""
    weight_map: dict[str, str] = {}
    total = 0
    for f in plan.main_files:
        total += f.data_size
        for name, _, _ in f.entries:
            weight_map[name] = f.name
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json_atomic(outdir / INDEX_FILE, index)
    return index


def write_target_files(outdir: Path, plan: ConversionPlan, config: dict[str, Any]) -> None:
    """The files the plan's target writes beside the shards (formats/targets/): its config files
    (``Target.config_files``: ``config.json`` without ``quantization_config``, the source's being recorded in
    the manifest; a flat one with ``config.hf.json``; the keys its loader reads) and its engine's metadata file
    (``Target.meta_files``: ``qwen36_meta.json``), from the source's ``config.json``."""
    target = plan.recipe.target
    shapes = {target.out_name(name): tuple(t.shape) for name, t in plan.inventory.tensors.items()}
    stacks = (st for u in plan.units for f in u.files for g in f.groups for st in g.stacks
              if st.fmt and st.kind != "qpack")  # fmt: skip
    first = next(stacks, None)  # the routed experts' format as written (a merged blob's, a fused stack's)
    experts, gs, down = (first.fmt, first.gs, first.down) if first is not None else (plan.recipe.experts, None, None)
    files = {**target.config_files(config), **target.meta_files(config, shapes, experts, gs, down)}
    for name, obj in files.items():
        write_json_atomic(outdir / name, obj)


def write_qpack_files(outdir: Path, plan: ConversionPlan, config: dict[str, Any], source: str) -> None:
    """``--layout qpack``: the QPACK container's ``packed_experts/layout.json`` and ``manifest.json``
    (formats/qpack.py), from the plan's layer files and the ``layer_types`` of the target's meta file (written
    before); nothing for another layout. ConvertError when a decoder layer has no routed experts (the engine
    reads one layer file per layer)."""
    files = sorted((f for f in plan.files if f.qpack_layer is not None), key=lambda f: f.qpack_layer)
    if not files:
        return
    text = model_config.text_config(config)
    layers = int(text["num_hidden_layers"])
    if [f.qpack_layer for f in files] != list(range(layers)):
        raise ConvertError(f"`layout=qpack`: the routed experts are in layers {[f.qpack_layer for f in files]}; "
                           f"QPACK holds one file for each of the {layers} layers")  # fmt: skip
    group = files[0].groups[0]
    st, gate = group.stacks[0], group.jobs[0]
    bits = registry.by_name(st.fmt).bits
    meta = json.loads((outdir / plan.recipe.target.meta.name).read_text())  # the target's (qwen36_meta.json)
    linear = [t != "full_attention" for t in meta["layer_types"]]
    layout = qpack.layout_json(layers, len(group.jobs) // 3, gate.I, gate.O, bits, st.gs, linear)
    sizes = {f.name: f.size for f in files}
    qpack.write_metadata(outdir, layout, str(text.get("model_type") or "?"), source, bits, st.gs, sizes)


def copy_file(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` atomically (temporary name, fsync, rename)."""
    tmp = temp_name(dest)
    with open(src, "rb") as fi, open(tmp, "wb") as fo:
        shutil.copyfileobj(fi, fo, 1 << 20)
        fo.flush()
        os.fsync(fo.fileno())
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def sidecar_index(plan: ConversionPlan, finished_units: Iterable[str]) -> dict[str, Any] | None:
    """The planar sidecar's ``index.json`` object when ``finished_units`` (unit keys) are published; None when
    the plan has no sidecar. ``layers`` is the base decoder's layer count (what colibri's qwen38 engine
    compares with its config), ``files`` the MoE layers' files, ``done`` the layers whose file is published.
    ``source``: sha256 of the source ``config.json`` as parsed (canonical JSON: sorted keys, compact) and the
    size of every source shard the sidecar's experts come from."""
    files = plan.sidecar_files
    if not files:
        return None
    finished = set(finished_units)
    unit_of = {f.name: u for u in plan.units for f in u.files}
    gate = files[0].groups[0].jobs[0]  # [moe_intermediate_size, hidden_size]
    shards = sorted({s for f in files for s in unit_of[f.name].shards})
    sizes = plan.inventory.shard_sizes
    config = json.dumps(plan.inventory.config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return sidecar.make_index(
        layers=plan.inventory.num_hidden_layers or max(f.sidecar_layer for f in files) + 1,
        experts=max(len(f.groups) for f in files),
        hidden_size=gate.I,
        moe_intermediate_size=gate.O,
        prefix=parse_name(gate.out_name).root.rstrip("."),
        record_bytes=sum(_entry_bytes(e) for e in files[0].groups[0].sidecar_entries),
        layer_numbers=[f.sidecar_layer for f in files],
        done=[f.sidecar_layer for f in files if unit_of[f.name].key in finished],
        source={
            "config_sha256": hashlib.sha256(config.encode("utf-8")).hexdigest(),
            "shards": {s: sizes.get(s) for s in shards},
        },
    )


def write_sidecar_index(outdir: Path, plan: ConversionPlan, finished_units: Iterable[str]) -> None:
    """(Re)write ``experts-int4g64/index.json`` atomically for the units published so far (the ledger calls it
    when it opens and after every recorded unit, so ``complete: true`` is written once, after the last layer
    file is published). Nothing without a sidecar."""
    index = sidecar_index(plan, finished_units)
    if index is None:
        return
    folder = sidecar.sidecar_dir(outdir)
    folder.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(folder / sidecar.INDEX_NAME, sidecar.index_bytes(index))


def _entry_bytes(entry) -> int:
    from colitools.formats.dtypes import itemsize

    n = itemsize(entry[1])
    for d in entry[2]:
        n *= d
    return n


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
