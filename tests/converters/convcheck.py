"""Independent checks of a converted output folder, shared by the converter tests.

Expected bytes are computed here from the *source arrays* with the numpy reference encoders
(``Format.encode(..., fast=False)``) and an FP8 dequantizer written out in the test, never through the
converter's own code paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from colitools.formats import container
from colitools.formats.errors import ResolveError
from colitools.formats.planar import pairs_to_planar
from colitools.formats.planar_sidecar import open_sidecar
from colitools.formats.registry import by_name
from colitools.formats.safetensors_io import SafetensorsFile

COMPARED = (
    "*.safetensors",
    "model.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "experts-int4g64/*",  # the planar sidecar: layer files and index.json
)


def dequant_source(tensors: dict[str, np.ndarray], name: str, block=(128, 128)) -> np.ndarray:
    """float32 of a source tensor; FP8 with its ``_scale_inv`` (ceil grid), leading dims kept."""
    x = tensors[name]
    if x.dtype.itemsize == 1:
        s = tensors[name + "_scale_inv"].astype(np.float32)
        rows = np.repeat(s, block[0], axis=-2)[..., : x.shape[-2], :]
        full = np.repeat(rows, block[1], axis=-1)[..., : x.shape[-1]]
        return x.astype(np.float32) * full
    return x.astype(np.float32)


def source_weight(tensors: dict[str, np.ndarray], out_name: str, block=(128, 128)) -> np.ndarray:
    """The float32 source of output weight ``out_name`` (fused expert tensors sliced per expert, §4)."""
    if out_name in tensors:
        return dequant_source(tensors, out_name, block)
    base, e, proj = out_name.rsplit(".", 3)[0], int(out_name.split(".")[-3]), out_name.split(".")[-2]
    base = out_name[: out_name.index(f".experts.{e}.")] + ".experts"
    if proj == "down_proj":
        return dequant_source(tensors, f"{base}.down_proj", block)[e]
    gu = dequant_source(tensors, f"{base}.gate_up_proj", block)[e]
    half = gu.shape[0] // 2
    return gu[:half] if proj == "gate_proj" else gu[half:]


def open_output(out: Path) -> list[SafetensorsFile]:
    """The main shards the index names, then the planar sidecar's layer files (the routed experts' home)."""
    index = json.loads((out / "model.safetensors.index.json").read_text())
    return [SafetensorsFile(out / f) for f in sorted(set(index["weight_map"].values()))] + open_sidecar(out)


def resolve_without_config(out: Path, refused: str) -> dict:
    """``resolve_container`` of ``out``'s shards alone (no config.json): asserts the ResolveError matching
    ``refused``, then returns what ``report_unresolved=True`` resolves."""
    shards = [SafetensorsFile(p) for p in sorted(out.glob("*.safetensors"))]
    try:
        with pytest.raises(ResolveError, match=refused):
            container.resolve_container(shards)
        return container.resolve_container(shards, report_unresolved=True)
    finally:
        for s in shards:
            s.close()


def check_output(
    out: Path, tensors: dict[str, np.ndarray], expected_formats: dict[str, str], block=(128, 128)
) -> dict:
    """Resolve every tensor, compare every quantized tensor's bytes with the reference encoding of the source,
    load every file with safetensors' own ``safe_open``, check the index. Returns the resolution."""
    files = open_output(out)
    config = json.loads((out / "config.json").read_text())
    resolved = container.resolve_container(files, config=config)
    by_file = {str(f.path): f for f in files}
    seen = set()
    for name, r in resolved.items():
        if r.kind == "scale":
            continue
        f = by_file[r.file]
        label = r.format.label if r.format else None
        want = expected_formats.get(name)
        if want is not None:
            assert label == want, f"{name}: resolved {label}, expected {want}"
        seen.add(name)
        if r.kind == "float":
            src_name = name
            w = source_weight(tensors, src_name, block)
            got = f.read(name)
            expect = w.astype(got.dtype)
            assert np.array_equal(
                got.view(np.uint8), np.ascontiguousarray(expect).reshape(got.shape).view(np.uint8)
            ), name
            continue
        assert r.kind == "quantized", (name, r.kind)
        O, I = r.logical_shape
        fmt = by_name(r.format.name)
        gs = r.format.group_size
        src_name = name[: -len(".weight_packed")] + ".weight" if name.endswith(".weight_packed") else name
        w = source_weight(tensors, src_name, block)
        assert w.shape == (O, I), (name, w.shape, (O, I))
        codes = f.read(name)
        scales = f.read(r.scale)
        if fmt.name == "fp8-e4m3-b128":
            ref_codes, ref_scales = (
                tensors[src_name].view(np.uint8),
                tensors[src_name + "_scale_inv"].astype(np.float32),
            )
        else:
            ref_codes, ref_scales = fmt.encode(w, gs, name=name, fast=False)
        if r.layout == "planar64-v8":
            ref_codes = pairs_to_planar(ref_codes)
        assert np.array_equal(
            codes.reshape(-1).view(np.uint8), np.ascontiguousarray(ref_codes).reshape(-1).view(np.uint8)
        ), name
        assert np.array_equal(
            scales.reshape(-1).view(np.uint8), np.ascontiguousarray(ref_scales).reshape(-1).view(np.uint8)
        ), name
        if r.layout != "planar64-v8":
            assert np.array_equal(
                fmt.decode(codes, scales, O, I, gs), fmt.decode(ref_codes, ref_scales, O, I, gs)
            )
    for name in expected_formats:
        assert name in seen, f"{name} missing from the output"
    # conformance: safetensors' own reader loads every file; the index covers the main shards only (no sidecar)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    total = 0
    main = [f for f in files if f.path.parent == out]
    for f in files:
        with safe_open(str(f.path), framework="numpy") as sf:
            assert set(sf.keys()) == set(f.tensors)
            for name, info in f.tensors.items():
                if f in main:
                    total += info.nbytes
                    assert index["weight_map"][name] == f.path.name
                else:
                    assert name not in index["weight_map"]
                if info.dtype != "BF16":
                    assert sf.get_tensor(name).shape == tuple(info.shape)
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"]) == {n for f in main for n in f.tensors}
    for f in files:
        f.close()
    return resolved


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file compared for byte identity (all but colitools.json, whose ``run`` section has times)."""
    files = {}
    for pattern in COMPARED:
        for p in out.glob(pattern):
            files[str(p.relative_to(out))] = p.read_bytes()
    manifest = json.loads((out / "colitools.json").read_text())
    manifest.pop("run", None)
    files["colitools.json without run"] = json.dumps(manifest, sort_keys=True).encode()
    return files


def listing(out: Path) -> list[str]:
    """Every entry of the folder, hidden ones included (no leftovers allowed)."""
    side = out / "experts-int4g64"
    inner = [f"{side.name}/{p.name}" for p in side.iterdir()] if side.is_dir() else []
    return sorted([p.name for p in out.iterdir()] + inner)


def stored_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """Every tensor of a folder's shards as stored: name -> (dtype, shape, raw array)."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with SafetensorsFile(path) as f:
            for name, info in f.tensors.items():
                out[name] = (info.dtype, tuple(info.shape), f.read(name))
    return out


def stored_arrays(folder: Path) -> dict[str, np.ndarray]:
    """name -> raw stored array of every tensor of a folder's shards."""
    return {name: data for name, (_, _, data) in stored_tensors(folder).items()}


def stored_headers(folder: Path) -> dict[str, tuple[str, str, tuple[int, ...], int, int]]:
    """name -> (file, dtype, shape, absolute begin, absolute end) of every tensor of a folder's shards."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with SafetensorsFile(path) as f:
            for name, info in f.tensors.items():
                out[name] = (path.name, info.dtype, tuple(info.shape), info.begin, info.end)
    return out
