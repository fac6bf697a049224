"""Test helper: write a fixture as a converted container with exactly the per-tensor formats an oracle
reference lists (``tensor_formats``), in the "pairs" or planar layout of docs/FORMATS.md §4.

This is a small stand-in for ``colitools convert`` so that the runtime's quantized paths are checked against
the oracles independently of the converter: source tensors are read as float32 (BF16 upcast, FP8 block
dequantized, fused experts split), encoded with the registry's reference encoders, and laid out with each
expert's codes back to back followed by its scales.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from colitools.formats import reference as ref
from colitools.formats.planar import PLANAR_LAYOUT, pairs_to_planar
from colitools.formats.registry import by_name
from colitools.formats.resolver import LAYOUT_KEY, SHAPES_KEY, encode_shapes, encode_stamps, stamp_for
from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors

_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
_ORDER = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": 2, "w2": 2}


def source_tensors(fixture: Path) -> dict[str, np.ndarray]:
    """Every weight of a fixture as float32, by on-disk name (fused experts split per expert)."""
    out: dict[str, np.ndarray] = {}
    config = json.loads((fixture / "config.json").read_text())
    block = tuple((config.get("quantization_config") or {}).get("weight_block_size") or (128, 128))
    for path in sorted(fixture.glob("*.safetensors")):
        f = SafetensorsFile(path)
        names = set(f.tensors)
        for name, info in f.tensors.items():
            if name.endswith("_scale_inv") or name.endswith(".experts.gate_up_proj_scales") or \
                    name.endswith(".experts.down_proj_scales"):  # fmt: skip
                continue
            if _companion(name, names):  # natively quantized sources' scales / shapes
                continue
            a = f.read(name)
            if name.endswith(("experts.gate_up_proj_blocks", "experts.down_proj_blocks")):  # native MXFP4
                name = name[: -len("_blocks")]
                a = dequant_mxfp4_stack(a, f.read(name + "_scales"))
            if name.endswith(".weight_packed") and info.dtype == "U8":  # compressed-tensors mxfp4-pack-quantized
                base = name[: -len("_packed")]
                a, name = dequant_mxfp4_rows(a, f.read(base + "_scale")), base
            elif name.endswith(".weight_packed"):  # INT4 compressed-tensors pack-quantized
                base = name[: -len("_packed")]
                a = dequant_pack_quantized(
                    a, f.read(base + "_scale"), [int(x) for x in f.read(base + "_shape")]
                )
                name = base
            elif name + "_scale_2" in names:  # modelopt NVFP4
                a = dequant_nvfp4(a, f.read(name + "_scale"), f.read(name + "_scale_2"))
            elif info.dtype == "F8_E4M3" and name + "_scale" in names:  # MXFP8
                a = dequant_mxfp8(a, f.read(name + "_scale"))
            elif _ue8m0_scale(name, names) and info.dtype == "I8":  # DeepSeek-V4.1 FP4 experts (mxfp4's bytes)
                a = dequant_mxfp4_rows(a.view(np.uint8), f.read(_ue8m0_scale(name, names)).view(np.uint8))
            elif _ue8m0_scale(name, names) and info.dtype == "F8_E4M3":  # DeepSeek-V4.1 FP8, UE8M0 tiles / rows
                a = dequant_ue8m0_fp8(a, f.read(_ue8m0_scale(name, names)), block)
            elif info.dtype == "F8_E4M3":
                a = ref.dequant_fp8_block(a.view(np.uint8), f.read(name + "_scale_inv"), block)
            if info.dtype.startswith(("I", "U")) and a.dtype.kind != "f":  # an integer table (DeepSeek-V4's
                # tid2eid): copied unchanged (decoded MXFP4 blocks above are U8 on disk but float here)
                out[name] = np.asarray(a)
                continue
            a = np.asarray(a).astype(np.float32)
            if config["model_type"] == "gpt_oss" and ".experts." in name:
                out.update(_gpt_oss_split(name, a))
            elif config["model_type"] in COLUMN_SPLIT_STACKS and name.endswith(_STACKS):
                out.update(_column_split(name, a))
            elif name.endswith(_INKLING_STACKS):
                out.update(_inkling_split(name, a))
            elif name.endswith(_STACKS):
                base = name.rsplit(".", 1)[0]
                for e in range(a.shape[0]):
                    if name.endswith("gate_up_proj"):
                        half = a.shape[1] // 2
                        out[f"{base}.{e}.gate_proj.weight"] = a[e, :half]
                        out[f"{base}.{e}.up_proj.weight"] = a[e, half:]
                    else:
                        out[f"{base}.{e}.down_proj.weight"] = a[e]
            else:
                out[name] = a
        f.close()
        assert names
    return out


def _ue8m0_scale(name: str, names: set[str]) -> str | None:
    """DeepSeek-V4.1's ``<base>.scale`` beside ``<base>.weight``, or None."""
    scale = name.removesuffix(".weight") + ".scale"
    return scale if name.endswith(".weight") and scale in names else None


def dequant_ue8m0_fp8(q: np.ndarray, scale: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    """DeepSeek-V4.1 FP8: e4m3 ``[O, I]`` times ``2^(e - 127)`` per ``block`` tile (``[O/b, I/b]`` scales) or per
    row group of 32 (``[O, I/32]`` scales, the engram tables)."""
    e = np.asarray(scale).view(np.uint8).astype(np.int32) - 127
    O, I = np.shape(q)
    rows, cols = (1, 32) if e.shape[0] == O else block
    full = np.repeat(np.repeat(e, rows, axis=0), cols, axis=1)[:O, :I]
    return np.ldexp(np.asarray(q).astype(np.float32), full).astype(np.float32)


def _companion(name: str, names: set[str]) -> bool:
    """A scale / shape tensor of a natively quantized weight (INT4 pack-quantized, NVFP4, MXFP8, DeepSeek-V4.1)."""
    if name.endswith(".scale") and name.removesuffix(".scale") + ".weight" in names:
        return True
    if (
        name.endswith((".weight_scale", ".weight_shape"))
        and name.rpartition(".")[0] + ".weight_packed" in names
    ):
        return True
    return any(name.endswith(sfx) and name[: -len(sfx)] in names for sfx in ("_scale", "_scale_2"))


def dequant_pack_quantized(packed: np.ndarray, scale: np.ndarray, shape: list[int]) -> np.ndarray:
    """compressed-tensors pack-quantized (symmetric, docs/FORMATS.md §9): int32 ``[O, I/8]``, nibble ``k`` of a
    word (bits ``4k..4k+3``) is element ``8c + k`` stored ``q + 8``; ``q * f32(scale[group])``."""
    O, I = shape
    words = np.asarray(packed).astype(np.int64) & 0xFFFFFFFF
    nib = np.stack([(words >> (4 * k)) & 0xF for k in range(8)], axis=-1).reshape(O, -1)[:, :I]
    s = np.asarray(scale).astype(np.float32)
    g = -(-I // s.shape[1])
    return (nib.astype(np.float32) - 8) * np.repeat(s, g, axis=1)[:, :I]


def dequant_nvfp4(packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray) -> np.ndarray:
    """modelopt NVFP4: E2M1 nibbles (low = even element) ``[O, I/2]``, e4m3 scale per 16 inputs, F32 scale_2:
    ``(e2m1 * f32(scale)) * scale_2`` in float32."""
    lut = np.array(FP4_VALUES, dtype=np.float32)
    packed = np.asarray(packed, dtype=np.uint8)
    v = np.empty((packed.shape[0], 2 * packed.shape[1]), np.float32)
    v[:, 0::2], v[:, 1::2] = lut[packed & 0x0F], lut[packed >> 4]
    s = np.repeat(np.asarray(scale).astype(np.float32), 16, axis=1)
    return (v * s) * np.float32(np.asarray(scale_2, np.float32).reshape(()))


def dequant_mxfp8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """MXFP8: e4m3 values ``[O, I]`` (or a stack ``[E, A, B]``) times ``2^(e - 127)`` per 32 inputs of the last
    axis (E8M0 U8 scale)."""
    e = np.repeat(np.asarray(scale).astype(np.int32) - 127, 32, axis=-1)[..., : np.shape(q)[-1]]
    return np.ldexp(np.asarray(q).astype(np.float32), e).astype(np.float32)


# transformers 5.24 integrations/mxfp4.py FP4_VALUES (E2M1, index = nibble)
FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequant_mxfp4_rows(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """compressed-tensors mxfp4-pack-quantized (Kimi K3): E2M1 ``[O, I/2]`` (low nibble = even element) times
    ``2^(e - 127)`` per 32 inputs."""
    lut = np.array(FP4_VALUES, dtype=np.float32)
    packed = np.asarray(packed, dtype=np.uint8)
    v = np.empty((packed.shape[0], 2 * packed.shape[1]), np.float32)
    v[:, 0::2], v[:, 1::2] = lut[packed & 0x0F], lut[packed >> 4]
    return np.ldexp(v, np.repeat(np.asarray(scales).astype(np.int32) - 127, 32, axis=1)).astype(np.float32)


def dequant_mxfp4_stack(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """numpy restatement of transformers' ``_convert_moe_packed_tensors`` (gpt-oss native MXFP4 stacks):
    ``[E, R, G, 16]`` + ``[E, R, G]`` -> float32 ``[E, G * 32, R]`` (low nibble = even element,
    ``ldexp(v, scale - 127)``, then ``transpose(1, 2)``: the float stack's orientation)."""
    lut = np.array(FP4_VALUES, dtype=np.float32)
    blocks = np.asarray(blocks, dtype=np.uint8)
    out = np.empty((*blocks.shape[:-1], 32), dtype=np.float32)
    out[..., 0::2] = lut[blocks & 0x0F]
    out[..., 1::2] = lut[blocks >> 4]
    out = np.ldexp(out, (np.asarray(scales).astype(np.int32) - 127)[..., None]).astype(np.float32)
    E, R = blocks.shape[:2]
    return np.ascontiguousarray(out.reshape(E, R, -1).transpose(0, 2, 1))


# Inkling native stacks: routed experts.w13_weight [E, 2I, H] / w2_weight [E, H, I], shared
# shared_experts.shared_w13_weight [n, 2I, H] / shared_w2_weight [n, H, I]; gate = even rows of w13, up = odd
_INKLING_STACKS = (".experts.w13_weight", ".experts.w2_weight", ".shared_experts.shared_w13_weight",
                   ".shared_experts.shared_w2_weight")  # fmt: skip


def _inkling_split(name: str, a: np.ndarray) -> dict[str, np.ndarray]:
    base, leaf = name.rsplit(".", 1)
    out = {}
    for e in range(a.shape[0]):
        if leaf.endswith("w13_weight"):
            out[f"{base}.{e}.gate_proj.weight"] = a[e, 0::2].copy()
            out[f"{base}.{e}.up_proj.weight"] = a[e, 1::2].copy()
        else:
            out[f"{base}.{e}.down_proj.weight"] = a[e]
    return out


_STACKS = (".experts.gate_up_proj", ".experts.down_proj")
# Qwen3-VL-MoE as published and Llama-4: gate_up_proj [E, H, 2I] (x @ W, then chunk(2, dim=-1): gate = the first
# I columns), down_proj [E, I, H]
COLUMN_SPLIT_STACKS = ("qwen3_vl_moe", "llama4")


def _column_split(name: str, a: np.ndarray) -> dict[str, np.ndarray]:
    base, leaf = name.rsplit(".", 1)
    out = {}
    for e in range(a.shape[0]):
        if leaf == "gate_up_proj":
            half = a.shape[2] // 2
            out[f"{base}.{e}.gate_proj.weight"] = a[e][:, :half].T.copy()
            out[f"{base}.{e}.up_proj.weight"] = a[e][:, half:].T.copy()
        else:
            out[f"{base}.{e}.down_proj.weight"] = a[e].T.copy()
    return out


def _gpt_oss_split(name: str, a: np.ndarray) -> dict[str, np.ndarray]:
    """gpt-oss stacks (transformers GptOssExperts): ``gate_up_proj [E, H, 2I]`` with ``x @ W`` and gate = even
    columns, up = odd; ``down_proj [E, I, H]``; ``gate_up_proj_bias [E, 2I]`` interleaved the same way,
    ``down_proj_bias [E, H]`` -> per-expert ``[O, I]`` weights and ``[O]`` biases."""
    base, leaf = name.rsplit(".", 1)
    out = {}
    for e in range(a.shape[0]):
        if leaf == "gate_up_proj":
            out[f"{base}.{e}.gate_proj.weight"] = a[e][:, 0::2].T.copy()
            out[f"{base}.{e}.up_proj.weight"] = a[e][:, 1::2].T.copy()
        elif leaf == "down_proj":
            out[f"{base}.{e}.down_proj.weight"] = a[e].T.copy()
        elif leaf == "gate_up_proj_bias":
            out[f"{base}.{e}.gate_proj.bias"] = a[e][0::2].copy()
            out[f"{base}.{e}.up_proj.bias"] = a[e][1::2].copy()
        elif leaf == "down_proj_bias":
            out[f"{base}.{e}.down_proj.bias"] = a[e].copy()
        else:
            raise AssertionError(f"unknown gpt-oss expert tensor {name}")
    return out


def _encode(name: str, w: np.ndarray, label: str):
    """(codes, scale, scale suffix, stamp) or None for a float tensor."""
    if label in ("f32", "bf16") or label.endswith("(copied)") or w.ndim != 2:  # bf16: a tower kept BF16
        return None
    O, I = w.shape
    if label.startswith("int4-g"):
        fmt, gs = by_name("int4-grouped"), int(label[len("int4-g") :])
    else:
        fmt, gs = by_name(label), None
    codes, scales = fmt.encode(w, gs, name=name, fast=False)
    stamp = stamp_for(name, fmt.name, O, I, gs)
    return codes, scales, stamp


def build_container(fixture: Path, reference: dict, out: Path, layout: str = "pairs") -> Path:
    """Write ``fixture`` into ``out`` with ``reference["tensor_formats"]``; returns ``out``."""
    formats: dict[str, str] = reference["tensor_formats"]
    weights = source_tensors(fixture)
    missing = set(weights) ^ set(formats)
    assert not missing, sorted(missing)[:5]
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((fixture / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for extra in ("tokenizer.json", "generation_config.json", "dsv41_engram.json"):  # + V4.1's engram tables
        if (fixture / extra).exists():
            shutil.copy(fixture / extra, out / extra)

    # Group routed experts: (prefix, expert) -> [(order, name)]
    experts: dict[tuple[str, int], list[tuple[int, str]]] = {}
    others: list[str] = []
    for name in sorted(weights):
        m = _EXPERT.match(name)
        if m:
            experts.setdefault((m.group(1), int(m.group(2))), []).append((_ORDER[m.group(3)], name))
        else:
            others.append(name)

    def emit(tensors: dict, shapes: dict, stamps: dict, names: list[str]) -> None:
        codes_part, scale_part = {}, {}
        for name in names:
            w = weights[name]
            enc = _encode(name, w, formats[name])
            if enc is None:
                codes_part[name] = w
                continue
            codes, scales, stamp = enc
            if layout == "planar" and _EXPERT.match(name):
                codes = pairs_to_planar(codes)
            if formats[name] == "mxfp4":
                base = name[: -len(".weight")]
                codes_part[base + ".weight_packed"] = codes
                scale_part[base + ".weight_scale"] = scales
                shapes[base + ".weight_packed"] = w.shape
            else:
                codes_part[name] = codes
                scale_part[name + ".qs"] = scales
                shapes[name] = w.shape
            if stamp:
                stamps[name] = stamp
        tensors.update(codes_part)
        tensors.update(scale_part)

    files: list[tuple[str, dict, dict, dict]] = []
    main: dict = {}
    main_shapes: dict = {}
    main_stamps: dict = {}
    emit(main, main_shapes, main_stamps, others)
    by_layer: dict[str, list[tuple[int, list[str]]]] = {}
    for (prefix, e), members in sorted(experts.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        by_layer.setdefault(prefix, []).append((e, [n for _, n in sorted(members)]))
    for prefix, items in by_layer.items():
        target, shapes, stamps = (main, main_shapes, main_stamps)
        # planar shards hold int4 experts only (DeepSeek-V4.1's DSpark stage experts stay int8-row, in the main file)
        planar = layout == "planar" and all(formats[n].startswith("int4") for _, names in items for n in names)
        if planar:
            target, shapes, stamps = {}, {}, {}
        for _, names in sorted(items):
            emit(target, shapes, stamps, names)
        if planar:
            files.append((f"experts-{prefix.replace('.', '-')}.safetensors", target, shapes, stamps))
    files.insert(0, ("model-main.safetensors", main, main_shapes, main_stamps))
    weight_map = {}
    for fname, tensors, shapes, stamps in files:
        meta = {SHAPES_KEY: encode_shapes(shapes)}
        if stamps:
            meta["colibri.fmt"] = encode_stamps(stamps)
        if fname != "model-main.safetensors":
            meta[LAYOUT_KEY] = PLANAR_LAYOUT
        write_safetensors(out / fname, tensors, meta)
        weight_map.update({n: fname for n in tensors})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out
