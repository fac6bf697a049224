"""Kimi K3's own checkpoint layout: routed experts compressed-tensors ``mxfp4-pack-quantized``
(``...experts.{E}.w{1,2,3}.weight_packed`` U8 ``[O, I/2]``, low nibble = even element, ``weight_scale`` U8
E8M0 ``[O, I/32]``), the rest BF16 (docs/FORMATS.md §5). Built from ``k3tiny``'s names and shapes with codes and
scales drawn here; converted with ``native`` (generic and ``--target kimi_k3``) and with ``--experts f32``.

Expected values are this test's own decode of the codes it drew (E2M1 table times powers of two in float64,
exact, then float32), never colitools' decoders; a ``native`` expert's bytes must be the source's bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from convcheck import stored_arrays
from k3tiny import E, make_k3
from tinyckpt import write_tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.safetensors_io import SafetensorsFile

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)
EXPERTS = "language_model.model.layers.1.block_sparse_moe.experts."
QC = {  # compressed-tensors' own QuantizationConfig(...MXFP4 preset...).model_dump(), experts only
    "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["re:.*block_sparse_moe.experts.*"], "weights": {
        "num_bits": 4, "type": "float", "symmetric": True, "group_size": 32, "strategy": "group",
        "dynamic": False, "scale_dtype": "torch.uint8"}}},
}  # fmt: skip


def make_native_k3(folder: Path, seed: int = 28) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``k3tiny``'s checkpoint with every routed expert as MXFP4 pack-quantized; returns expert -> (packed,
    scale, value)."""
    make_k3(folder / "bf16")
    with SafetensorsFile(folder / "bf16" / "model.safetensors") as f:
        tensors = {n: f.read(n) for n in f.tensors}
    rng = np.random.default_rng(seed)
    experts = {}
    for name in [n for n in tensors if n.startswith(EXPERTS)]:
        O, I = tensors.pop(name).shape
        codes = rng.integers(0, 16, (O, I), dtype=np.uint8)
        scale = rng.integers(118, 126, (O, I // 32), dtype=np.uint8)
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
        unit = np.exp2(np.repeat(scale.astype(np.float64) - 127, 32, axis=1))
        value = (E2M1[codes] * unit).astype(np.float32)  # exact: <= 3 significant bits times 2^k
        base = name[: -len(".weight")]
        tensors[base + ".weight_packed"], tensors[base + ".weight_scale"] = packed, scale
        experts[name] = (packed, scale, value)
    src = folder / "src"
    src.mkdir()
    write_tensors(src, tensors, 2)
    config = json.loads((folder / "bf16" / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "quantization_config": QC}))
    return experts


@pytest.fixture(scope="module")
def native_k3(tmp_path_factory):
    root = tmp_path_factory.mktemp("native-k3")
    experts = make_native_k3(root)
    out = {}
    for name, kw in {"native": {"experts": "native"}, "f32": {"experts": "f32"},
                     "k3": {"target": "kimi_k3", "experts": "native"}}.items():  # fmt: skip
        convert(str(root / "src"), root / name, ConvertOptions(progress=False, min_free_gb=0.0, **kw))
        out[name] = root / name
    return experts, out


def test_native_keeps_every_mxfp4_pack_quantized_byte(native_k3):
    experts, out = native_k3
    assert len(experts) == 3 * E
    for folder in ("native", "k3"):
        data = stored_arrays(out[folder])
        manifest = json.loads((out[folder] / "colitools.json").read_text())
        assert manifest["fallbacks"] == []
        for name, (packed, scale, _) in experts.items():
            base = name[: -len(".weight")]
            assert data[base + ".weight_packed"].tobytes() == packed.tobytes(), name
            assert data[base + ".weight_scale"].tobytes() == scale.tobytes(), name


def test_the_decoded_experts_are_the_exact_source_values(native_k3):
    experts, out = native_k3
    data = stored_arrays(out["f32"])
    for name, (_, _, value) in experts.items():
        assert data[name].dtype == np.float32 and data[name].tobytes() == value.tobytes(), name
