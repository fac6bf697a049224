"""QPACK v1, the routed-expert container colibri's qwen36 engine reads through its MLX-affine path
(``QWEN36_QPACK=<dir>``; docs/FORMATS.md §4 "QPACK v1"): the one owner of its facts, a writer and a reader.

* ``manifest.json``: a JSON object with unique keys: ``magic`` "QPACK", ``version`` 1, ``modelName`` and
  ``sourceCheckpoint`` (non-empty strings), ``quantBits`` (4 or 8), ``quantGroupSize``, and ``files``: every
  relative path -> its size in bytes, at least ``packed_experts/layout.json`` and each layer file.
* ``packed_experts/layout.json``: ``expertCount``, ``layerCount``, ``expertStride`` (a multiple of 16 KiB),
  ``linearLayers`` (one boolean per layer: a linear-attention layer) and ``sections``: per projection
  ``{gate,up,down}_proj.{weight,scales,biases}``, each ``{name, dtype, shape, offset, size}`` inside one expert's
  record (``size`` = its elements x item size, no two overlapping, ``offset + size <= expertStride``).
* ``packed_experts/layer_NN.bin`` (``%02d``): ``expertCount`` records of ``expertStride`` bytes, expert ``e`` at
  ``e * expertStride``; a record is each projection's codes (``U32 [O, I * bits / 32]``), scales and biases (BF16
  ``[O, I / gs]``), in ``PROJECTIONS`` order, back to back, zero-padded to the stride: the affine formats' bytes
  (``formats/affine.py``: a projection's scalars array is its scales then its biases).

Numpy-light: the writer takes the encoded arrays, the reader returns them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from colitools.formats import affine
from colitools.formats.atomic import write_bytes_atomic
from colitools.formats.errors import FormatError
from colitools.formats.names import expert_tensor_name

MAGIC = "QPACK"
VERSION = 1
MANIFEST = "manifest.json"
PACKED_DIR = "packed_experts"
LAYOUT = f"{PACKED_DIR}/layout.json"
PAGE = 16384  # expertStride's alignment (qpack.c COLI_QPACK_PAGE_ALIGNMENT)
SCALAR_DTYPE = "BF16"
PROJECTIONS = (
    "gate_proj",
    "up_proj",
    "down_proj",
)  # record order; down is [hidden, inter], the others [inter, hidden]
_LAYER_FILE = re.compile(r"^layer_(\d{2,})\.bin$")


def layer_file(layer: int) -> str:
    """``packed_experts/layer_NN.bin`` (``%02zu``: two digits at least)."""
    return f"{PACKED_DIR}/layer_{layer:02d}.bin"


@dataclass(frozen=True)
class Section:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    size: int

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset,
                "size": self.size}  # fmt: skip


def projection_shape(proj: str, hidden: int, inter: int) -> tuple[int, int]:
    """``[O, I]`` of ``proj``: gate/up ``[inter, hidden]``, down ``[hidden, inter]``."""
    return (hidden, inter) if proj == "down_proj" else (inter, hidden)


def sections(hidden: int, inter: int, bits: int, gs: int) -> tuple[tuple[Section, ...], int]:
    """One expert record's sections and the stride (the record rounded up to ``PAGE``)."""
    out, at = [], 0
    for proj in PROJECTIONS:
        O, I = projection_shape(proj, hidden, inter)
        if I % gs or gs % 8:
            raise FormatError(f"QPACK: {proj} [{O}, {I}] cannot be cut in groups of {gs}")
        words = I * bits // 32
        for leaf, dtype, shape, nbytes in (("weight", "U32", (O, words), O * words * 4),
                                           ("scales", SCALAR_DTYPE, (O, I // gs), O * (I // gs) * 2),
                                           ("biases", SCALAR_DTYPE, (O, I // gs), O * (I // gs) * 2)):  # fmt: skip
            out.append(Section(f"{proj}.{leaf}", dtype, shape, at, nbytes))
            at += nbytes
    return tuple(out), -(-at // PAGE) * PAGE


def layout_json(layers: int, experts: int, hidden: int, inter: int, bits: int, gs: int,
                linear_layers: Sequence[bool]) -> dict[str, Any]:  # fmt: skip
    secs, stride = sections(hidden, inter, bits, gs)
    if len(linear_layers) != layers:
        raise FormatError(f"QPACK: {len(linear_layers)} linearLayers entries for {layers} layers")
    return {"expertCount": experts, "layerCount": layers, "expertStride": stride,
            "linearLayers": [bool(x) for x in linear_layers], "sections": [s.as_json() for s in secs]}  # fmt: skip


def manifest_json(
    model_name: str, source: str, bits: int, gs: int, files: Mapping[str, int]
) -> dict[str, Any]:
    return {"magic": MAGIC, "version": VERSION, "modelName": model_name, "sourceCheckpoint": source,
            "quantBits": bits, "quantGroupSize": gs, "files": dict(sorted(files.items()))}  # fmt: skip


def json_bytes(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def expert_record(encoded: Mapping[str, tuple[np.ndarray, np.ndarray]], stride: int) -> bytes:
    """One record: per projection (``PROJECTIONS``) its codes then its scalars (scales, biases), zero-padded."""
    parts = []
    for proj in PROJECTIONS:
        codes, scalars = encoded[proj]
        parts += [
            np.ascontiguousarray(codes).view(np.uint8).tobytes(),
            np.ascontiguousarray(scalars).tobytes(),
        ]
    body = b"".join(parts)
    if len(body) > stride:
        raise FormatError(f"QPACK: an expert record of {len(body)} bytes does not fit the stride {stride}")
    return body + bytes(stride - len(body))


def layer_bytes(members: Sequence[tuple[np.ndarray, np.ndarray]], nbytes: int) -> np.ndarray:
    """A layer file's bytes from its experts' encoded projections in record order (expert by expert, gate, up,
    down: ``(codes, scalars)`` each), ``nbytes`` in all (``experts x stride``)."""
    experts = len(members) // len(PROJECTIONS)
    stride = nbytes // experts
    records = [expert_record(dict(zip(PROJECTIONS, members[3 * e : 3 * e + 3], strict=True)), stride)
               for e in range(experts)]  # fmt: skip
    return np.frombuffer(b"".join(records), np.uint8)


def encode_expert(weights: Mapping[str, np.ndarray], bits: int, gs: int, quantizer: str = affine.RTN):
    """``{proj: (codes, scalars)}`` of float32 ``{proj: [O, I]}`` (``formats/affine.py``)."""
    return {p: affine.encode(np.asarray(weights[p], np.float32), bits, gs, quantizer) for p in PROJECTIONS}


class QpackWriter:
    """Writes a QPACK v1 folder: ``write_layer`` per layer (each file atomic), then ``finish`` writes the
    layout and, last, the manifest (a folder without ``manifest.json`` is not a container)."""

    def __init__(self, folder: str | os.PathLike[str], *, layers: int, experts: int, hidden: int, inter: int,
                 bits: int, gs: int, linear_layers: Sequence[bool]):  # fmt: skip
        if bits not in affine.BITS:
            raise FormatError(f"QPACK: quantBits {bits} is not one of {', '.join(map(str, affine.BITS))}")
        self.folder = Path(folder)
        self.layout = layout_json(layers, experts, hidden, inter, bits, gs, linear_layers)
        self.stride = self.layout["expertStride"]
        self.bits, self.gs, self.hidden, self.inter = bits, gs, hidden, inter
        self.files: dict[str, int] = {}
        (self.folder / PACKED_DIR).mkdir(parents=True, exist_ok=True)

    def write_layer(self, layer: int, experts: Sequence[Mapping[str, tuple[np.ndarray, np.ndarray]]]) -> None:
        if len(experts) != self.layout["expertCount"]:
            raise FormatError(
                f"QPACK: layer {layer} has {len(experts)} experts, the layout {self.layout['expertCount']}"
            )
        data = b"".join(expert_record(e, self.stride) for e in experts)
        write_bytes_atomic(self.folder / layer_file(layer), data)
        self.files[layer_file(layer)] = len(data)

    def finish(self, model_name: str, source: str) -> None:
        write_metadata(self.folder, self.layout, model_name, source, self.bits, self.gs, self.files)


def write_metadata(folder: str | os.PathLike[str], layout: Mapping[str, Any], model_name: str, source: str,
                   bits: int, gs: int, layer_files: Mapping[str, int]) -> None:  # fmt: skip
    """``packed_experts/layout.json``, then ``manifest.json`` (last: a folder without it is no container), each
    atomic; ``layer_files``: the layer files' sizes by relative path."""
    folder = Path(folder)
    blob = json_bytes(layout)
    write_bytes_atomic(folder / LAYOUT, blob)
    files = {**layer_files, LAYOUT: len(blob)}
    write_bytes_atomic(folder / MANIFEST, json_bytes(manifest_json(model_name, source, bits, gs, files)))


# ---------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Qpack:
    folder: Path
    manifest: dict[str, Any]
    layout: dict[str, Any]

    @property
    def bits(self) -> int:
        return int(self.manifest["quantBits"])

    @property
    def group_size(self) -> int:
        return int(self.manifest["quantGroupSize"])

    def section(self, name: str) -> dict[str, Any]:
        return next(s for s in self.layout["sections"] if s["name"] == name)

    def read_expert(self, layer: int, expert: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{proj: (codes uint8 [O, I * bits / 8], scalars BF16 [2, O, I / gs])}`` of one expert."""
        stride = self.layout["expertStride"]
        with open(self.folder / layer_file(layer), "rb") as fh:
            fh.seek(expert * stride)
            blob = fh.read(stride)
        if len(blob) != stride:
            raise FormatError(f"{self.folder / layer_file(layer)}: short read for expert {expert}")
        out = {}
        for proj in PROJECTIONS:
            w, s, b = (self.section(f"{proj}.{leaf}") for leaf in ("weight", "scales", "biases"))
            O = w["shape"][0]
            codes = np.frombuffer(blob, np.uint8, w["size"], w["offset"]).reshape(O, -1)
            sb = np.stack([np.frombuffer(blob, affine.BF16, s["size"] // 2, s["offset"]),
                           np.frombuffer(blob, affine.BF16, b["size"] // 2, b["offset"])]).reshape(2, O, -1)  # fmt: skip
            out[proj] = (codes, sb)
        return out

    def decode_expert(self, layer: int, expert: int) -> dict[str, np.ndarray]:
        """float32 ``{proj: [O, I]}`` of one expert (``affine.decode``)."""
        out = {}
        for proj, (codes, sb) in self.read_expert(layer, expert).items():
            O, I = sb.shape[1], codes.shape[1] * 8 // self.bits
            out[proj] = affine.decode(codes, sb, O, I, self.bits, self.group_size)
        return out


@dataclass(frozen=True)
class Projection:
    """Where one expert projection of a container is: its layer file, ``[O, I]``, the byte ranges of its codes and
    of its scalars (scales then biases, adjacent) in that file."""

    layer: int
    expert: int
    proj: str  # gate_proj | up_proj | down_proj
    path: Path
    O: int
    I: int
    data: tuple[int, int]
    scales: tuple[int, int]
    scale_dtype: str
    bits: int
    gs: int

    @property
    def form(self) -> str:
        """The registry name of its format (``affine4`` / ``affine8``)."""
        return f"affine{self.bits}"

    def decode(self) -> np.ndarray:
        """float32 ``[O, I]``."""
        with open(self.path, "rb") as fh:
            fh.seek(self.data[0])
            codes = np.frombuffer(fh.read(self.data[1] - self.data[0]), np.uint8)
            fh.seek(self.scales[0])
            sb = np.frombuffer(fh.read(self.scales[1] - self.scales[0]), affine.BF16)
        return affine.decode(codes, sb, self.O, self.I, self.bits, self.gs)


def projections(folder: str | os.PathLike[str]) -> list[Projection]:
    """Every expert projection of the QPACK container in ``folder`` (none without a ``manifest.json``);
    FormatError for a container its engine would refuse."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return []
    c = open_qpack(folder)
    stride, out = c.layout["expertStride"], []
    for layer in range(c.layout["layerCount"]):
        for e in range(c.layout["expertCount"]):
            at = e * stride
            for proj in PROJECTIONS:
                w, s, b = (c.section(f"{proj}.{leaf}") for leaf in ("weight", "scales", "biases"))
                out.append(Projection(layer, e, proj, folder / layer_file(layer), w["shape"][0],
                                      w["shape"][1] * 32 // c.bits, (at + w["offset"], at + w["offset"] + w["size"]),
                                      (at + s["offset"], at + b["offset"] + b["size"]), s["dtype"], c.bits,
                                      c.group_size))  # fmt: skip
    return out


def weight_name(p: Projection) -> str:
    """The per-expert weight name of ``p`` in the ``--target qwen36`` snapshot's spelling (``model.layers.{L}``),
    as the converter planned it (``names.expert_tensor_name``)."""
    return expert_tensor_name(f"model.layers.{p.layer}.mlp.experts", p.expert, p.proj.removesuffix("_proj"))


def open_qpack(folder: str | os.PathLike[str]) -> Qpack:
    """The container at ``folder``, checked as qpack.c's ``coli_qpack_open`` checks it (``check``); FormatError
    naming the first problem."""
    folder = Path(folder)
    problems = check(folder)
    if problems:
        raise FormatError(f"{folder}: {problems[0]}")
    return Qpack(
        folder, json.loads((folder / MANIFEST).read_text()), json.loads((folder / LAYOUT).read_text())
    )


def _load(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique)
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path.name} is not a JSON object with unique keys ({exc})"
    return (obj, None) if isinstance(obj, dict) else (None, f"{path.name} is not a JSON object")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check(folder: str | os.PathLike[str]) -> list[str]:
    """What ``coli_qpack_open`` / ``coli_qpack_affine_view`` would refuse in ``folder`` (empty: none)."""
    folder = Path(folder)
    manifest, why = _load(folder / MANIFEST)
    if manifest is None:
        return [why or "no manifest"]
    layout, why = _load(folder / LAYOUT)
    if layout is None:
        return [why or "no layout"]
    problems = _check_manifest(manifest) + _check_layout(layout)
    if problems:
        return problems
    files = manifest["files"]
    stride, experts = layout["expertStride"], layout["expertCount"]
    want = {LAYOUT: (folder / LAYOUT).stat().st_size}
    want |= {layer_file(k): experts * stride for k in range(layout["layerCount"])}
    for rel, size in want.items():
        if files.get(rel) != size:
            problems.append(f"manifest.json files[{rel!r}] is {files.get(rel)}, expected {size}")
        elif not (folder / rel).is_file() or (folder / rel).stat().st_size != size:
            problems.append(f"{rel} is missing or not {size} bytes")
    return problems + _check_widths(manifest, layout)


def _check_manifest(m: dict[str, Any]) -> list[str]:
    out = []
    if m.get("magic") != MAGIC or m.get("version") != VERSION:
        out.append("manifest.json is not a QPACK v1 manifest (magic, version)")
    for key in ("modelName", "sourceCheckpoint"):
        if not isinstance(m.get(key), str) or not m[key]:
            out.append(f"manifest.json {key} is not a non-empty string")
    files = m.get("files")
    if not isinstance(files, dict) or not files or not all(k and _count(v) for k, v in files.items()):
        out.append("manifest.json files is not a non-empty object of sizes")
    if (
        m.get("quantBits") not in affine.BITS
        or not _count(m.get("quantGroupSize"))
        or not m["quantGroupSize"]
    ):
        out.append(f"manifest.json quantBits {m.get('quantBits')} / quantGroupSize {m.get('quantGroupSize')} "
                   "is not an affine quantization the engine reads")  # fmt: skip
    return out


def _check_layout(lay: dict[str, Any]) -> list[str]:
    counts = [lay.get(k) for k in ("expertCount", "layerCount", "expertStride")]
    if not all(_count(c) and c for c in counts):
        return ["layout.json has invalid counts or stride"]
    experts, layers, stride = counts
    out = [] if stride % PAGE == 0 else [f"layout.json expertStride {stride} is not a multiple of 16 KiB"]
    linear = lay.get("linearLayers")
    if not isinstance(linear, list) or len(linear) != layers or not all(isinstance(x, bool) for x in linear):
        out.append("layout.json linearLayers is not one boolean per layer")
    secs = lay.get("sections")
    if not isinstance(secs, list) or not secs:
        return out + ["layout.json sections is not a non-empty array"]
    spans = []
    for s in secs:
        size = _ITEM.get(s.get("dtype"), 0) * int(np.prod(s.get("shape") or [0]))
        if not (isinstance(s.get("name"), str) and _count(s.get("offset")) and s.get("size") == size and size
                and s["offset"] + size <= stride):  # fmt: skip
            out.append(f"layout.json section {s.get('name')!r} is invalid")
        spans.append((s.get("offset") or 0, (s.get("offset") or 0) + (s.get("size") or 0), s.get("name")))
    spans.sort(key=lambda t: t[0])
    out += [
        f"sections {a[2]} and {b[2]} overlap" for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]
    ]
    names = [s.get("name") for s in secs]
    missing = [
        f"{p}.{leaf}"
        for p in PROJECTIONS
        for leaf in ("weight", "scales", "biases")
        if f"{p}.{leaf}" not in names
    ]
    return out + ([f"layout.json has no section {', '.join(missing)}"] if missing else [])


_ITEM = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4,
         "U64": 8, "I64": 8, "F64": 8}  # fmt: skip


def _check_widths(m: dict[str, Any], lay: dict[str, Any]) -> list[str]:
    """Each projection's packed width against its groups (``qpack_check_packed_widths``)."""
    per_word, gs = 32 // m["quantBits"], m["quantGroupSize"]
    by = {s["name"]: s for s in lay["sections"]}
    out = []
    for p in PROJECTIONS:
        w, s, b = by[f"{p}.weight"], by[f"{p}.scales"], by[f"{p}.biases"]
        if w["dtype"] != "U32" or s["dtype"] != b["dtype"] or s["dtype"] not in ("F32", "F16", "BF16"):
            out.append(f"section {p}: weight must be U32 with F32/F16/BF16 scales and biases of one dtype")
        elif w["shape"][-1] * per_word != s["shape"][-1] * gs or s["shape"] != b["shape"]:
            out.append(f"section {p}: manifest {m['quantBits']}-bit/g{gs} disagrees with the packed shapes")
    return out
