"""QPACK v1 (formats/qpack.py, docs/FORMATS.md §4): the sections and stride hand-computed, the published Swiftlet
Qwen3.6-35B container's sizes reproduced from its geometry, a round trip through the reader, and the refusals of
colibri's c/qpack.c (coli_qpack_open) restated by ``check``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from colitools.formats import affine, qpack
from colitools.formats.errors import FormatError


def test_sections_hand_computed():
    secs, stride = qpack.sections(hidden=64, inter=32, bits=4, gs=32)
    got = [(s.name, s.dtype, s.shape, s.offset, s.size) for s in secs]
    assert got == [
        ("gate_proj.weight", "U32", (32, 8), 0, 1024),  # 32 rows x 64 inputs / 8 codes a word
        ("gate_proj.scales", "BF16", (32, 2), 1024, 128),
        ("gate_proj.biases", "BF16", (32, 2), 1152, 128),
        ("up_proj.weight", "U32", (32, 8), 1280, 1024),
        ("up_proj.scales", "BF16", (32, 2), 2304, 128),
        ("up_proj.biases", "BF16", (32, 2), 2432, 128),
        ("down_proj.weight", "U32", (64, 4), 2560, 1024),
        ("down_proj.scales", "BF16", (64, 1), 3584, 128),
        ("down_proj.biases", "BF16", (64, 1), 3712, 128),
    ]
    assert stride == 16384  # 3840 bytes rounded up to 16 KiB


def test_the_published_qwen36_35b_container_sizes():
    # Swiftlet's Qwen3.6-35B-A3B QPACK (4-bit, g64, BF16 scalars): 256 experts of hidden 2048, width 512; its
    # manifest lists each packed_experts/layer_NN.bin at 452,984,832 bytes
    _, stride = qpack.sections(hidden=2048, inter=512, bits=4, gs=64)
    assert stride == 1_769_472 and 256 * stride == 452_984_832


def _experts(rng, n, hidden, inter):
    return [{p: rng.standard_normal(qpack.projection_shape(p, hidden, inter)).astype(np.float32) * 0.05
             for p in qpack.PROJECTIONS} for _ in range(n)]  # fmt: skip


@pytest.mark.parametrize("bits", [4, 8])
def test_round_trip_and_check(tmp_path, bits):
    rng = np.random.default_rng(bits)
    layers, experts, hidden, inter, gs = 2, 3, 64, 32, 32
    w = qpack.QpackWriter(tmp_path, layers=layers, experts=experts, hidden=hidden, inter=inter, bits=bits, gs=gs,
                          linear_layers=[True, False])  # fmt: skip
    src = [_experts(rng, experts, hidden, inter) for _ in range(layers)]
    for layer in range(layers):
        w.write_layer(layer, [qpack.encode_expert(e, bits, gs, "mse") for e in src[layer]])
    w.finish("qwen3_5_moe_text", "oracle")
    assert qpack.check(tmp_path) == []
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["magic"] == "QPACK" and manifest["version"] == 1 and manifest["quantBits"] == bits
    assert manifest["files"]["packed_experts/layer_01.bin"] == experts * w.stride
    c = qpack.open_qpack(tmp_path)
    for layer in range(layers):
        for e in range(experts):
            got = c.decode_expert(layer, e)
            for p in qpack.PROJECTIONS:
                O, I = qpack.projection_shape(p, hidden, inter)
                want = affine.decode(*affine.encode(src[layer][e][p], bits, gs, "mse"), O, I, bits, gs)
                assert np.array_equal(got[p], want)
    # the record's bytes at the expert's offset: gate codes first, padding zero
    raw = (tmp_path / "packed_experts/layer_01.bin").read_bytes()
    codes, _ = affine.encode(src[1][2]["gate_proj"], bits, gs, "mse")
    assert raw[2 * w.stride : 2 * w.stride + codes.nbytes] == codes.tobytes()
    assert raw[3 * w.stride - 100 : 3 * w.stride] == bytes(100)


def test_check_refuses_what_qpack_c_refuses(tmp_path):
    rng = np.random.default_rng(0)
    w = qpack.QpackWriter(
        tmp_path, layers=1, experts=2, hidden=64, inter=32, bits=4, gs=32, linear_layers=[False]
    )
    w.write_layer(0, [qpack.encode_expert(e, 4, 32) for e in _experts(rng, 2, 64, 32)])
    w.finish("m", "s")
    manifest = json.loads((tmp_path / "manifest.json").read_text())

    def with_manifest(**change):
        (tmp_path / "manifest.json").write_text(json.dumps({**manifest, **change}))
        return qpack.check(tmp_path)

    assert any("QPACK v1" in p for p in with_manifest(version=2))
    assert any("quantBits" in p for p in with_manifest(quantBits=3))
    assert any("disagrees with the packed shapes" in p for p in with_manifest(quantGroupSize=64))
    files = dict(manifest["files"], **{"packed_experts/layer_00.bin": 1})
    assert any("layer_00.bin" in p for p in with_manifest(files=files))
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    layout = json.loads((tmp_path / "packed_experts/layout.json").read_text())
    (tmp_path / "packed_experts/layout.json").write_text(json.dumps({**layout, "expertStride": 16000}))
    assert qpack.check(tmp_path)  # not 16 KiB aligned (and the files no longer match)
    with pytest.raises(FormatError, match="16 KiB"):
        qpack.open_qpack(tmp_path)
