"""Test helper: write a container in the layout of colibri's own converter, from a committed oracle fixture.

The layout facts are from colibri's ``c/tools/convert_fp8_to_int4.py`` (read for facts only; this is our own
code): every shard is ``safetensors.numpy.save_file(out, "out-{n:05d}.safetensors")`` -- no ``__metadata__``, no
index -- holding, per quantized weight, ``<name>`` as flat 1-D U8 codes and ``<name>.qs`` as flat 1-D F32 scales;
``config.json``, ``generation_config.json`` and the tokenizer files are copied unchanged. Its ``classify``:
names ending ``norm.weight``, routers ``mlp.gate.weight``, ``e_score_correction_bias`` and every name not ending
``.weight`` stay F32; ``model.embed_tokens.weight`` / ``lm_head.weight`` ("io") get ``--io-bits`` (default 8:
int8 per row); routed experts and every other resident weight get ``--ebits`` / ``--xbits`` (default 4) with
``--group-size`` (default 64: grouped int4, one scale per 64 inputs, ``ceil(I/64)`` per row).

The codes are produced by the numpy reference encoders (the same arithmetic as that converter's ``quant_int8`` /
``quant_int4_grouped``: ``s = max(amax/qmax, 1e-8)``, ``clip(rint(w/s))``, low nibble first, +8).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from colitools.formats import reference as ref

COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
SHARD = "out-00000.safetensors"


def _kind(name: str) -> str:
    """The converter's classification, reduced to what a fixture has: ``f32``, ``io`` or ``q``."""
    if name.endswith("e_score_correction_bias") or name.endswith("mlp.gate.weight"):
        return "f32"
    if name.endswith("norm.weight") or not name.endswith(".weight"):
        return "f32"
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return "io"
    return "q"


def _read_fixture(src: Path) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    tensors = {}
    for path in sorted(src.glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name).astype(np.float32)
    return tensors


def write_colibri_layout(
    src: Path, out: Path, *, extra_unresolved: bool = False, group_size: int = 64
) -> dict:
    """Convert fixture ``src`` into ``out`` the way colibri's converter lays it out; returns
    ``{name: (fmt, gs, O, I)}`` of the quantized weights (``[O, I]`` from the source tensors). ``extra_unresolved`` adds one quantized tensor whose ``[O, I]`` no config gives."""
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, np.ndarray] = {}
    formats: dict[str, tuple[str, int | None, int, int]] = {}
    for name, w in _read_fixture(src).items():
        kind = _kind(name)
        if kind == "f32" or w.ndim != 2:
            written[name] = np.ascontiguousarray(w, dtype=np.float32)
            continue
        if kind == "io":
            codes, scales = ref.encode_int8_row(w)
            formats[name] = ("int8-row", None, *w.shape)
        else:
            codes, scales = ref.encode_int4_grouped(w, group_size)
            groups = -(-w.shape[1] // group_size)
            formats[name] = (
                ("int4-row", None, *w.shape) if groups == 1 else ("int4-grouped", group_size, *w.shape)
            )
        written[name] = np.ascontiguousarray(codes).reshape(-1).view(np.uint8)
        written[name + ".qs"] = np.ascontiguousarray(scales, dtype=np.float32).reshape(-1)
    if extra_unresolved:
        codes, scales = ref.encode_int8_row(np.ones((3, 5), np.float32))
        written["model.layers.0.self_attn.extra_proj.weight"] = codes.reshape(-1).view(np.uint8)
        written["model.layers.0.self_attn.extra_proj.weight.qs"] = scales.reshape(-1)
    save_file(written, str(out / SHARD))  # no metadata, as the converter's save_file(out, path)
    for fn in COPIED:
        if (src / fn).exists():
            shutil.copy(src / fn, out / fn)
    return formats


def write_decoded_f32(colibri_dir: Path, out: Path, formats: dict) -> None:
    """The reference: every weight of ``colibri_dir`` decoded by the numpy reference decoders (``formats`` as
    ``write_colibri_layout`` returned it), written as a plain F32 checkpoint with the same config."""
    from safetensors import safe_open

    tensors = {}
    with safe_open(str(colibri_dir / SHARD), framework="numpy") as f:
        names = set(f.keys())
        for name in names:
            if name.endswith(".qs"):
                continue
            if name not in formats:
                tensors[name] = f.get_tensor(name)
                continue
            fmt, gs, O, I = formats[name]
            codes, scales = f.get_tensor(name), f.get_tensor(name + ".qs")
            if fmt == "int8-row":
                w = ref.decode_int8_row(codes.reshape(O, I), scales, O, I)
            elif fmt == "int4-row":
                w = ref.decode_int4_row(codes.reshape(O, -1), scales, O, I)
            else:
                w = ref.decode_int4_grouped(codes.reshape(O, -1), scales.reshape(O, -1), O, I, gs)
            tensors[name] = np.ascontiguousarray(w, dtype=np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    for fn in COPIED:
        if (colibri_dir / fn).exists():
            shutil.copy(colibri_dir / fn, out / fn)
