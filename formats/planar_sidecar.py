"""The planar experts sidecar ``<out>/experts-int4g64/`` (docs/FORMATS.md §4, amended): the one owner of its facts.

``colitools convert --layout planar`` writes every routed expert of a MoE layer here, in the form colibri's own
planar tooling writes (``c/tools/convert_qwen38_experts_int4.py``) and its qwen38 engine attaches
(``Q38_INT4_DIR`` / ``q38_expert_int4_attach`` in ``c/qwen38.c``); the main container holds no routed expert.

* One file per MoE layer, ``layer-NNN.safetensors`` (``layer_file_name``). One contiguous record per expert, in
  expert order, records back to back: ``gate codes | up codes | down codes | gate scales | up scales | down
  scales``; codes planar64-v8 U8 ``[O, I/2]``, scales F32 ``[O, I/64]`` (one per row and 64-block).
* Header: compact JSON, the tensor entries first and ``__metadata__`` (``layer_metadata``) **last**, space-padded
  so ``8 + N`` is a multiple of 4096 (the writer: ``SafetensorsWriter(..., metadata_last=True)``).
* ``index.json`` (``make_index``): the keys colibri's tool writes, in its order (``INDEX_KEYS``), ``indent=1``
  plus a newline; ``done`` lists the layers whose files are published, ``complete`` is true once all are.

Readers: ``read_index`` / ``open_sidecar`` give the published layer files as ``SidecarLayerFile`` objects,
whose ``metadata`` is what colitools' container readers need (``colitools.layout`` planar64-v8 and the
``colitools.shapes`` the index geometry implies; the file's own metadata stays in ``raw_metadata``), so
``resolve_container``, ``inspect`` and the runtime read the sidecar as the home of the routed experts.
``check_sidecar`` is the verifier (``verify container``).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from colitools.formats.errors import FormatError
from colitools.formats.jsonfile import invalid_text, load_json_object, shown_text
from colitools.formats.names import parse_name
from colitools.formats.planar import PLANAR_BLOCK, PLANAR_LAYOUT
from colitools.formats.safetensors_io import ALIGNMENT, MAX_HEADER_BYTES, SafetensorsFile

SIDECAR_DIR = "experts-int4g64"
INDEX_NAME = "index.json"
FORMAT = "colibri.qwen38.experts-int4g64"
VERSION = 1  # a number in index.json, the string "1" in the layer files' __metadata__ (as colibri's tool)
GROUP_SIZE = PLANAR_BLOCK
CODES = PLANAR_LAYOUT  # "planar64-v8"
SCALES = "f32-per-64"
PROJECTIONS = ("gate", "up", "down")  # record order
RECORD = ["gate codes", "up codes", "down codes", "gate scales", "up scales", "down scales"]
QUANTIZER = (
    "colitools int4 (docs/FORMATS.md §2): per 64 inputs (int4-g64) or per row (int4-row, its scale repeated "
    "per 64-block): scale = max(absmax/7, 1e-8) (f32), code = rint(w/scale) clamped to [-8,7], stored v+8"
)
INDEX_KEYS = (
    "format", "version", "complete", "group_size", "codes", "scales", "layers", "experts", "hidden_size",
    "moe_intermediate_size", "prefix", "record_bytes", "record", "quantizer", "files", "done", "source",
)  # fmt: skip
_LAYER_FILE = re.compile(r"^layer-(\d{3,})\.safetensors$")


# ------------------------------------------------------------------------------------------------ names
def layer_file_name(layer: int) -> str:
    """``layer-007.safetensors`` (3 digits, more only past layer 999, as ``f"{layer:03d}"``)."""
    return f"layer-{layer:03d}.safetensors"


def layer_file_path(layer: int) -> str:
    """A layer file's name relative to the output folder (as the plan and the manifest record it)."""
    return f"{SIDECAR_DIR}/{layer_file_name(layer)}"


def layer_of_file(name: str) -> int | None:
    """The layer of ``layer-NNN.safetensors`` (a bare file name), or None."""
    m = _LAYER_FILE.match(name)
    return int(m.group(1)) if m else None


def is_sidecar_file(name: str) -> bool:
    """Whether an output-relative file name is a sidecar layer file."""
    head, _, tail = name.partition("/")
    return head == SIDECAR_DIR and layer_of_file(tail) is not None


def layer_metadata(layer: int) -> dict[str, str]:
    """A layer file's ``__metadata__``, in colibri's key order (written last in the header)."""
    return {"format": FORMAT, "version": str(VERSION), "layer": str(layer)}


# ------------------------------------------------------------------------------------------------ writing
def scale_shape(O: int, I: int) -> tuple[int, int]:
    """The sidecar's scale tensor shape: one F32 per (row, 64-block)."""
    return (O, I // GROUP_SIZE)


def block_scales(scales: np.ndarray, O: int, I: int) -> np.ndarray:
    """Scales as the sidecar stores them, ``f32 [O, I/64]``: int4-g64 scales unchanged, an int4-row scale
    repeated for every 64-block of its row (the decoded values are the same)."""
    s = np.asarray(scales, dtype=np.float32)
    if s.size == O:
        return np.ascontiguousarray(np.repeat(s.reshape(O, 1), I // GROUP_SIZE, axis=1))
    return np.ascontiguousarray(s.reshape(scale_shape(O, I)))


def make_index(
    *,
    layers: int,
    experts: int,
    hidden_size: int,
    moe_intermediate_size: int,
    prefix: str,
    record_bytes: int,
    layer_numbers: Sequence[int],
    done: Sequence[int],
    source: Mapping[str, Any],
) -> dict[str, Any]:
    """``index.json``'s object, keys in colibri's order; ``complete`` once every layer file is in ``done``."""
    done = sorted(set(done))
    index = {
        "format": FORMAT, "version": VERSION, "complete": set(done) == set(layer_numbers),
        "group_size": GROUP_SIZE, "codes": CODES, "scales": SCALES,
        "layers": layers, "experts": experts,
        "hidden_size": hidden_size, "moe_intermediate_size": moe_intermediate_size,
        "prefix": prefix, "record_bytes": record_bytes, "record": list(RECORD), "quantizer": QUANTIZER,
        "files": [layer_file_name(n) for n in sorted(layer_numbers)], "done": done, "source": dict(source),
    }  # fmt: skip
    assert tuple(index) == INDEX_KEYS
    return index


def index_bytes(index: Mapping[str, Any]) -> bytes:
    """The bytes of ``index.json``: ``json.dump(index, indent=1)`` plus a newline, as colibri's tool."""
    return (json.dumps(index, indent=1) + "\n").encode("utf-8")


# ------------------------------------------------------------------------------------------------ reading
def sidecar_dir(root: str | os.PathLike[str]) -> Path:
    return Path(root) / SIDECAR_DIR


def read_index(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The parsed ``<root>/experts-int4g64/index.json``, or None when the folder has no sidecar index.
    FormatError when it cannot be read or is not a JSON object."""
    path = sidecar_dir(root) / INDEX_NAME
    if not path.is_file():
        return None
    return load_json_object(path)


def _int(index: Mapping[str, Any], key: str) -> int | None:
    v = index.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def logical_shape(name: str, index: Mapping[str, Any]) -> tuple[int, int] | None:
    """``[O, I]`` of a sidecar weight from the index geometry: gate/up ``[inter, hidden]``, down
    ``[hidden, inter]``; None for a name that is not an expert projection or a geometry that is missing."""
    H, W = _int(index, "hidden_size"), _int(index, "moe_intermediate_size")
    proj = parse_name(name).projection
    if not H or not W or proj not in PROJECTIONS:
        return None
    return (H, W) if proj == "down" else (W, H)


class SidecarLayerFile(SafetensorsFile):
    """A sidecar layer file, read strictly; ``metadata`` is the view colitools' container readers use
    (``colitools.layout`` = planar64-v8, ``colitools.shapes`` from the index geometry for every weight with a
    ``.qs``); ``raw_metadata`` is the file's own ``__metadata__``; ``layer`` the layer its name says."""

    def __init__(self, path: str | os.PathLike[str], index: Mapping[str, Any]) -> None:
        super().__init__(path)
        self.layer = layer_of_file(self.path.name)
        self.raw_metadata = dict(self.metadata)
        shapes = {}
        for name in self.tensors:
            if name + ".qs" in self.tensors:
                shape = logical_shape(name, index)
                if shape is not None:
                    shapes[name] = list(shape)
        self.metadata = {
            "colitools.layout": PLANAR_LAYOUT,
            "colitools.shapes": json.dumps(shapes, sort_keys=True, separators=(",", ":")),
        }


def published_layers(index: Mapping[str, Any]) -> list[int]:
    """The layers the index lists both in ``files`` and in ``done`` (the files a reader may open)."""
    files = index.get("files") if isinstance(index.get("files"), list) else []
    listed = {layer_of_file(f) for f in files if isinstance(f, str)}
    done = index.get("done") if isinstance(index.get("done"), list) else []
    return sorted(n for n in done if isinstance(n, int) and not isinstance(n, bool) and n in listed)


def open_sidecar(root: str | os.PathLike[str]) -> list[SidecarLayerFile]:
    """The published layer files of ``root``'s sidecar (empty without one). FormatError (SafetensorsError for a
    bad header) when the index or a file it lists as done cannot be read."""
    index = read_index(root)
    if index is None:
        return []
    if index.get("format") != FORMAT:
        raise FormatError(
            f"{sidecar_dir(root) / INDEX_NAME}: format is {index.get('format')!r}, not {FORMAT!r}"
        )
    out = []
    for layer in published_layers(index):
        path = sidecar_dir(root) / layer_file_name(layer)
        if not path.is_file():
            raise FormatError(f"{path}: listed as done in {INDEX_NAME} but missing")
        out.append(SidecarLayerFile(path, index))
    return out


# ------------------------------------------------------------------------------------------------ checking
def check_sidecar(root: str | os.PathLike[str]) -> tuple[list[SidecarLayerFile], list[str]]:
    """Verify ``root``'s sidecar: ``index.json`` (exact keys and order, values, ``complete`` with every file in
    ``done``), each layer file (raw header: tensor entries first, ``__metadata__`` last and exact, compact
    JSON, 4096 alignment; strict safetensors; every expert one record of ``record_bytes`` in record order,
    records back to back in expert order). Returns the files that opened (for the container checks: scales
    finite, formats) and the problems found (empty: sound). No sidecar: ``([], [])``."""
    problems: list[str] = []
    where = sidecar_dir(root) / INDEX_NAME
    try:
        index = read_index(root)
    except FormatError as exc:
        return [], [str(exc)]
    if index is None:
        if sidecar_dir(root).is_dir():
            return [], [f"{sidecar_dir(root)}: sidecar folder without {INDEX_NAME}"]
        return [], []
    problems += _index_problems(index, where)
    files: list[SidecarLayerFile] = []
    for layer in published_layers(index):
        path = sidecar_dir(root) / layer_file_name(layer)
        if not path.is_file():
            problems.append(f"{path}: listed as done in {INDEX_NAME} but missing")
            continue
        raw = _raw_header_problems(path, layer)
        problems += raw
        try:
            f = SidecarLayerFile(path, index)
        except FormatError as exc:
            problems.append(str(exc))
            continue
        if not raw:
            problems += _record_problems(f, index)
        files.append(f)
    names = index.get("files") if isinstance(index.get("files"), list) else []  # else _index_problems says so
    listed = {n for n in names if isinstance(n, str)}
    for p in sorted(sidecar_dir(root).glob("layer-*.safetensors")):
        if p.name not in listed:
            problems.append(f"{p}: not listed in {INDEX_NAME} files")
    return files, problems


def _index_problems(index: Mapping[str, Any], where: Path) -> list[str]:
    out = []
    if tuple(index) != INDEX_KEYS:
        out.append(f"{where}: keys are {list(index)}, expected {list(INDEX_KEYS)} (in this order)")
    fixed = {"format": FORMAT, "version": VERSION, "group_size": GROUP_SIZE, "codes": CODES, "scales": SCALES,
             "record": RECORD}  # fmt: skip
    for key, want in fixed.items():
        if index.get(key) != want or isinstance(index.get(key), bool):
            out.append(f"{where}: {key} is {json.dumps(index.get(key))}, expected {json.dumps(want)}")
    for key in ("layers", "experts", "hidden_size", "moe_intermediate_size", "record_bytes"):
        if not _int(index, key):
            out.append(f"{where}: {key} is {json.dumps(index.get(key))}, expected a positive integer")
    for key in ("hidden_size", "moe_intermediate_size"):
        if _int(index, key) and index[key] % GROUP_SIZE:
            out.append(f"{where}: {key} {index[key]} is not a multiple of {GROUP_SIZE}")
    H, W = _int(index, "hidden_size"), _int(index, "moe_intermediate_size")
    if H and W and index.get("record_bytes") != record_bytes(H, W):
        out.append(
            f"{where}: record_bytes is {index.get('record_bytes')}, the geometry gives {record_bytes(H, W)}"
        )
    files, done = index.get("files"), index.get("done")
    if not isinstance(files, list) or not files or any(not isinstance(f, str) or layer_of_file(f) is None
                                                       for f in files):  # fmt: skip
        out.append(f"{where}: files is {json.dumps(files)}, expected a list of layer-NNN.safetensors names")
        files = []
    if not isinstance(done, list) or any(not isinstance(n, int) or isinstance(n, bool) for n in done):
        out.append(f"{where}: done is {json.dumps(done)}, expected a list of layer numbers")
        done = []
    elif done != sorted(set(done)):
        out.append(f"{where}: done {done} is not sorted without repeats")
    layers = {layer_of_file(f) for f in files}
    if not set(done) <= layers:
        out.append(f"{where}: done lists layer(s) {sorted(set(done) - layers)} that files does not")
    if index.get("complete") is not True:
        out.append(f"{where}: complete is {json.dumps(index.get('complete'))}: the sidecar is not complete")
    elif set(done) != layers:
        out.append(f"{where}: complete is true but done misses layer(s) {sorted(layers - set(done))}")
    if not isinstance(index.get("prefix"), str) or not isinstance(index.get("source"), dict):
        out.append(f"{where}: prefix must be a string and source an object")
    return out


def record_bytes(hidden: int, inter: int) -> int:
    """One expert's record: codes ``2 * I*H/2 + H*I/2`` plus F32 scales ``(2 * I*H/64 + H*I/64) * 4``."""
    codes = 3 * hidden * inter // 2
    scales = 3 * hidden * inter // GROUP_SIZE
    return codes + 4 * scales


def _raw_header_problems(path: Path, layer: int) -> list[str]:
    """The header's bytes, parsed independently of the strict reader: alignment, compact JSON, tensor entries
    first, ``__metadata__`` last and equal to ``layer_metadata(layer)`` (values and key order)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
            if n is None or n > MAX_HEADER_BYTES:
                return [f"{path}: not a safetensors header"]
            raw = fh.read(n)
    except OSError as exc:
        return [f"{path}: cannot read: {exc.strerror or exc}"]
    out = []
    if (8 + n) % ALIGNMENT:
        out.append(f"{path}: data starts at byte {8 + n}, not a multiple of {ALIGNMENT}")
    body = raw.rstrip(b" ")
    try:
        pairs = json.loads(body, object_pairs_hook=lambda p: p)
    except (ValueError, UnicodeDecodeError) as exc:
        return out + [f"{path}: header is not valid JSON ({exc})"]
    if not isinstance(pairs, list) or not pairs:
        return out + [f"{path}: header is not a JSON object with entries"]
    bad = invalid_text(body, pairs)
    if bad is not None:
        shown = shown_text(bad)
        return out + [f"{path}: the header string {shown} is not Unicode text (a lone surrogate escape)"]
    keys = [k for k, _ in pairs]
    if keys[-1] != "__metadata__" or keys.count("__metadata__") != 1:
        out.append(f"{path}: __metadata__ is not the last header entry")
    else:
        meta = pairs[-1][1]
        want = list(layer_metadata(layer).items())
        if not isinstance(meta, list) or meta != want:
            out.append(f"{path}: __metadata__ is {dict(meta) if isinstance(meta, list) else meta!r}, "
                       f"expected {dict(want)} (in this order)")  # fmt: skip
    compact = json.dumps(_as_dict(pairs), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if compact != body:
        out.append(f"{path}: header JSON is not compact")
    return out


def _as_dict(pairs: Any) -> Any:
    if isinstance(pairs, list) and all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
        return {k: _as_dict(v) for k, v in pairs}
    return pairs


def _record_problems(f: SidecarLayerFile, index: Mapping[str, Any]) -> list[str]:
    """Every expert ``0..experts-1`` one record of six tensors in record order, records back to back."""
    E, rb = _int(index, "experts"), _int(index, "record_bytes")
    if not E or not rb:
        return []
    infos = list(f.tensors.values())  # data-offset order
    if len(infos) != 6 * E:
        return [f"{f.path}: {len(infos)} tensors, expected 6 per expert for {E} experts"]
    for e in range(E):
        part = infos[6 * e : 6 * e + 6]
        start = f.data_start + e * rb
        at = start
        for k, info in enumerate(part):
            parsed = parse_name(info.name)
            proj, is_scale = PROJECTIONS[k % 3], k >= 3
            shape = logical_shape(info.name, index)
            want_shape = None
            if shape is not None:
                O, I = shape
                want_shape = (O, I // GROUP_SIZE) if is_scale else (O, I // 2)
            if (parsed.expert != e or parsed.layer != f.layer or parsed.projection != proj
                    or info.name.endswith(".qs") != is_scale or info.dtype != ("F32" if is_scale else "U8")
                    or tuple(info.shape) != want_shape or info.begin != at):  # fmt: skip
                return [f"{f.path}: expert {e} is not one record in record order at tensor {info.name} "
                        f"({info.dtype} {list(info.shape)} at byte {info.begin}, expected the {RECORD[k]} of "
                        f"expert {e} at byte {at})"]  # fmt: skip
            at = info.end
        if at - start != rb:
            return [f"{f.path}: expert {e}'s record is {at - start} bytes, index record_bytes is {rb}"]
    return []
