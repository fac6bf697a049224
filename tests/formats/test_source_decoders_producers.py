"""The source decoders against the PRODUCERS' own decoders (no torch here): ``oracles/quant_vectors/*.safetensors``
hold source bytes and the values decoded by transformers / compressed-tensors, written by
``oracles/make_quant_vectors.py`` in the oracle venv. colitools decodes the committed bytes (numpy reference and
fast kernels) and must match bit for bit.

Decided where the producers differ from the format definitions (docs/FORMATS.md §5):
* E8M0 byte 0xFF: colitools' table gives 2^128 = inf (NaN with a zero code) and the converter refuses such a
  tensor; transformers' gpt-oss ``ldexp`` gives the finite ``v * 2^128`` when it fits. Compared on every other
  element; on 0xFF elements colitools must be non-finite.
* INT4 with bfloat16 scales: compressed-tensors computes ``q * s`` in bfloat16 (rounded); colitools keeps the
  exact float32 product, whose bfloat16 rounding must equal the producer's value.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import reference as ref
from colitools.formats.kernels import decoders as fast
from colitools.formats.safetensors_io import SafetensorsFile

VECTORS = Path(__file__).resolve().parents[2] / "oracles" / "quant_vectors"


def load(name: str) -> dict[str, np.ndarray]:
    f = SafetensorsFile(VECTORS / f"{name}.safetensors")
    try:
        return {n: f.read(n) for n in f.tensors}
    finally:
        f.close()


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def both(decode_ref, decode_fast, *args) -> np.ndarray:
    a, b = decode_ref(*args), decode_fast(*args)
    assert a.tobytes() == b.tobytes()  # kernel == reference, bit for bit
    return a


def test_mxfp4_matches_transformers_gpt_oss_dequant():
    v = load("mxfp4")
    blocks, scales, expect = v["blocks"], v["scales"], v["expect"]
    got = both(ref.decode_mxfp4_blocks, fast.decode_mxfp4_blocks, blocks, scales)  # [E, O, I]
    theirs = np.swapaxes(expect, 1, 2)  # transformers returns the stack as [E, I, O]
    assert got.shape == theirs.shape == (2, 48, 96)
    nan_scale = np.repeat(scales == 0xFF, 32, axis=-1)
    assert nan_scale.any() and (scales == 0).any() and (scales == 254).any()
    assert np.array_equal(bits(got)[~nan_scale], bits(theirs)[~nan_scale])  # 9120 values, exact
    assert not np.isfinite(got[nan_scale]).any()
    assert (bits(got) == 0x80000000).any()  # negative zero codes decode to -0.0, as transformers' table


@pytest.mark.parametrize("name", ["int4_sym_f32", "int4_asym_f32"])
def test_int4_pack_quantized_matches_compressed_tensors(name):
    v = load(name)
    O, I = (int(x) for x in v["weight_shape"])
    g = I // v["weight_scale"].shape[1]
    if "weight_zero_point" in v:
        got = ref.decode_pack_quantized_general(
            v["weight_packed"], v["weight_scale"], I, g, v["weight_zero_point"]
        )
    else:
        got = both(
            ref.decode_pack_quantized, fast.decode_pack_quantized, v["weight_packed"], v["weight_scale"], I, g
        )
    assert got.shape == v["expect"].shape == (O, I)
    assert np.array_equal(bits(got), bits(v["expect"]))  # 1536 values each, exact


def test_int4_bf16_scales_exact_product_rounds_to_the_producers_bf16():
    v = load("int4_sym_bf16")
    O, I = (int(x) for x in v["weight_shape"])
    g = I // v["weight_scale"].shape[1]
    got = both(
        ref.decode_pack_quantized, fast.decode_pack_quantized, v["weight_packed"], v["weight_scale"], I, g
    )
    assert v["expect"].dtype == ml_dtypes.bfloat16
    assert np.array_equal(got.astype(ml_dtypes.bfloat16).view(np.uint16), v["expect"].view(np.uint16))
    # and colitools' float32 value is the exact product (4-bit code x bfloat16 scale fits float32)
    q = ref.unpack_nibbles(v["weight_packed"].view(np.uint8), I).astype(np.float64) - 8
    s = np.repeat(v["weight_scale"].astype(np.float64), g, axis=1)
    assert np.array_equal(got.astype(np.float64), q * s)
    # the native form (pairs bytes + float32-widened scales) decodes to the same values
    pairs = ref.int32_nibbles_to_pairs(v["weight_packed"], I)
    native = ref.decode_int4_grouped(pairs, v["weight_scale"].astype(np.float32), O, I, g)
    assert native.tobytes() == got.tobytes()


def test_mxfp8_matches_transformers_fp8_dequantize():
    v = load("mxfp8")
    q, s, expect = v["weight"], v["weight_scale"], v["expect"]
    I = q.shape[1]
    got = both(ref.decode_mxfp8, fast.decode_mxfp8, q, s, I)
    nan_scale = np.repeat(s == 0xFF, 32, axis=1)
    ok = ~nan_scale
    same = (bits(got) == bits(expect)) | (np.isnan(got) & np.isnan(expect))
    assert same[ok].all()  # e4m3 NaN bytes give NaN in both
    assert np.isnan(got[q.view(np.uint8) & 0x7F == 0x7F]).all()
    assert not np.isfinite(got[nan_scale]).any() and not np.isfinite(expect[nan_scale]).any()


def test_nvfp4_matches_compressed_tensors_fp4_unpack_and_dequant():
    v = load("nvfp4")
    packed, sb, s2 = v["weight"], v["weight_scale"], v["weight_scale_2"]
    I = packed.shape[1] * 2
    codes = ref.E2M1_SIGNED[ref.unpack_nibbles(packed, I)]
    assert np.array_equal(bits(codes), bits(v["codes_f32"]))  # the one E2M1 table, signed zero included
    got = both(ref.decode_nvfp4, fast.decode_nvfp4, packed, sb, s2, I)
    assert np.array_equal(bits(got), bits(v["expect"]))  # 512 values, exact (scale_2 a power of two)


def test_mxfp4_pack_quantized_matches_compressed_tensors_and_keeps_its_bytes():
    """Kimi K3's experts: compressed-tensors' own ``MXFP4PackedCompressor`` compress + decompress (bfloat16, its
    compute dtype; every E2M1 code times a power of two is exact there but where float32 overflows too)."""
    from colitools.formats import source_encodings as se
    from colitools.formats.registry import Mxfp4

    v = load("mxfp4_pack")
    packed, scales, expect = v["weight_packed"], v["weight_scale"], v["expect"]
    O, I = packed.shape[0], packed.shape[1] * 2
    assert (O, I) == (48, 192) and expect.dtype == ml_dtypes.bfloat16 and scales.shape == (O, I // 32)
    parts = {"data": packed, "scale": scales}
    got = se.Mxfp4PackQuantized.decode(parts, O, I, fast=False)
    assert got.tobytes() == se.Mxfp4PackQuantized.decode(parts, O, I, fast=True).tobytes()
    nan_scale = np.repeat(scales == 0xFF, 32, axis=1)
    assert nan_scale.any() and (scales == 0).any() and (scales == 254).any()
    theirs = expect.astype(np.float32)
    assert np.array_equal(bits(got)[~nan_scale], bits(theirs)[~nan_scale])  # 9184 values, exact
    assert not np.isfinite(got[nan_scale]).any()
    # the scales compressed-tensors computed itself (before the edge bytes were written) are E8M0 of its observer
    assert v["computed_scale"].dtype == np.uint8 and 100 < int(np.median(v["computed_scale"])) < 127
    # native: the mxfp4 format holds these bytes as they are and decodes them to the producer's values
    ok = ~(scales == 0xFF).any(axis=1)
    kept = {"data": packed[ok], "scale": scales[ok]}
    codes, s = se.Mxfp4PackQuantized.keep(kept, int(ok.sum()), I, None, name="w")
    assert codes.tobytes() == packed[ok].tobytes() and s.tobytes() == scales[ok].tobytes()
    decoded = Mxfp4.decode(codes, s, int(ok.sum()), I)
    assert np.array_equal(bits(decoded), bits(theirs[ok]))
