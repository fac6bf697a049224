"""fp8-e4m3-e8m0 (docs/FORMATS.md §2.9): hand-computed byte vectors for the encoder and decoder.

The rule restated from DeepSeek's quantizer (``inference/kernel.py`` ``act_quant`` with ``scale_fmt="ue8m0"``:
``fast_round_scale(amax, 1/448) = 2^ceil(log2(amax * f32(1/448)))`` with ``amax`` floored at ``1e-4``) and
colibri's reader (``c/deepseek_v4.c`` ``coli_tensor_load_fp8``: F8_E4M3 ``[O, I]``, F8_E8M0
``[ceil(O/128), ceil(I/128)]``, ``w = e4m3(code) * 2^(byte - 127)``). Every expected byte below was worked out
by hand from that rule (the comments show the arithmetic), never taken from the encoder's output.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import registry
from colitools.formats.registry import Fp8E4m3E8m0, by_name


def _encode(w):
    """The numpy reference's bytes, after checking that the block kernel gives the very same bytes."""
    from colitools.formats.kernels import encoders

    w = np.asarray(w, np.float32)
    codes, scale = Fp8E4m3E8m0.encode(w, fast=False)
    kc, ks = encoders.encode_fp8_e8m0(w)
    assert kc.tobytes() == codes.tobytes() and ks.tobytes() == scale.tobytes() and ks.shape == scale.shape
    return codes, scale


def test_single_block_bytes_and_scale_byte():
    # amax 1.0: 1.0 * (1/448) = 2^-8.807 -> k = ceil = -8 -> byte 127 - 8 = 0x77; w * 2^8 = [256, -128, 0]
    # e4m3fn 256 = 2^8 = exponent 8 + bias 7 = 15 -> 0 1111 000 = 0x78; -128 -> 1 1110 000 = 0xF0
    codes, scale = _encode([[1.0, -0.5, 0.0]])
    assert codes.tobytes() == bytes([0x78, 0xF0, 0x00])
    assert scale.tobytes() == bytes([0x77]) and scale.shape == (1, 1)
    assert Fp8E4m3E8m0.decode(codes, scale, 1, 3).tolist() == [[1.0, -0.5, 0.0]]


def test_a_value_that_rounds_to_448():
    # amax 1.71875 = 440 / 256: 1.71875 / 448 = 2^-8.03 -> k = -8 (0x77); w * 2^8 = 440, between e4m3 416
    # (0 1111 101) and 448 (0 1111 110); 440 is nearer 448 -> 0x7E, the largest finite code
    codes, scale = _encode([[1.71875, -1.71875]])
    assert codes.tobytes() == bytes([0x7E, 0xFE]) and scale.tobytes() == bytes([0x77])
    # amax exactly 448: 448 * f32(1/448) = 1.0 exactly -> k = 0 (mantissa zero: no +1), byte 0x7F, code 448
    codes, scale = _encode([[448.0, 224.0]])
    assert codes.tobytes() == bytes([0x7E, 0x76]) and scale.tobytes() == bytes([0x7F])


def test_ties_go_to_even_mantissa():
    # amax 1.0 (k = -8): 0.53125 * 256 = 136, halfway between 128 (0 1110 000) and 144 (0 1110 001) -> 128;
    # 0.59375 * 256 = 152, halfway between 144 (001) and 160 (010) -> 160 (even)
    codes, _ = _encode([[1.0, 0.53125, 0.59375]])
    assert codes.tobytes() == bytes([0x78, 0x70, 0x72])


def test_subnormal_codes():
    # amax 1.0 (k = -8). e4m3fn subnormals are m * 2^-9 (m = 1..7, exponent field 0):
    # 2^-17 * 2^8 = 2^-9 -> code 0x01; -2^-17 -> 0x81; 3 * 2^-18 -> 1.5 * 2^-9, tie between 1 and 2 -> 2 (even)
    # -> 0x02; 2^-19 -> 2^-11 = 0.25 * 2^-9 rounds to 0 -> 0x00; 7 * 2^-17 -> 7 * 2^-9 -> 0x07
    w = [[1.0, 2.0**-17, -(2.0**-17), 3 * 2.0**-18, 2.0**-19, 7 * 2.0**-17]]
    codes, scale = _encode(w)
    assert codes.tobytes() == bytes([0x78, 0x01, 0x81, 0x02, 0x00, 0x07]) and scale.tobytes() == bytes([0x77])
    decoded = Fp8E4m3E8m0.decode(codes, scale, 1, 6)
    assert decoded.tolist() == [[1.0, 2.0**-17, -(2.0**-17), 2.0**-16, 0.0, 7 * 2.0**-17]]  # code 2: 2 * 2^-9 * 2^-8


def test_zero_block_and_partial_edge_blocks():
    # [130, 129]: a 2x2 grid of blocks, the edge ones partial (rows 128..129, column 128).
    w = np.zeros((130, 129), np.float32)
    w[0, 0] = 1.0  # block (0, 0): amax 1.0 -> k = -8 (0x77), code 0x78
    # block (0, 1) is column 128 of rows 0..127 only: all zero -> amax floored to 1e-4:
    # 1e-4 * (1/448) = 2.23e-7 = 2^-22.09 -> k = -22 -> byte 127 - 22 = 105 = 0x69, codes 0
    w[129, 5] = 3.0  # block (1, 0), rows 128..129: 3 / 448 = 2^-7.22 -> k = -7 (0x78); 3 * 2^7 = 384 -> 0x7C
    w[128, 128] = -0.75  # block (1, 1), one element: 0.75 / 448 = 2^-9.22 -> k = -9 (0x76); -0.75 * 512 = -384
    codes, scale = _encode(w)
    assert codes.shape == (130, 129) and codes.dtype == np.uint8
    assert scale.shape == (2, 2) == Fp8E4m3E8m0.scale_shape(130, 129)
    assert scale.tobytes() == bytes([0x77, 0x69, 0x78, 0x76])
    assert (codes[0, 0], codes[129, 5], codes[128, 128]) == (0x78, 0x7C, 0xFC)
    others = np.ones(codes.shape, bool)
    others[0, 0] = others[129, 5] = others[128, 128] = False
    assert not codes[others].any()
    np.testing.assert_array_equal(Fp8E4m3E8m0.decode(codes, scale, 130, 129), w)


def test_registry_facts_of_the_format():
    assert by_name("fp8-e4m3-e8m0") is Fp8E4m3E8m0 and Fp8E4m3E8m0.ord == 9
    assert Fp8E4m3E8m0.tensor_names("layers.0.attn.wq_a.weight") == (
        "layers.0.attn.wq_a.weight", "layers.0.attn.wq_a.scale",
    )  # fmt: skip
    assert (Fp8E4m3E8m0.weight_dtype, Fp8E4m3E8m0.scale_dtype) == ("F8_E4M3", "F8_E8M0")
    assert Fp8E4m3E8m0.weight_shape(300, 200) == (300, 200) and Fp8E4m3E8m0.scale_shape(300, 200) == (3, 2)
    assert Fp8E4m3E8m0.weight_nbytes(300, 200) == 300 * 200 == registry.row_nbytes("fp8-e4m3-e8m0", 200) * 300
    assert Fp8E4m3E8m0.scale_nbytes(300, 200) == 6
    assert Fp8E4m3E8m0.kernel_scales(np.array([0x77, 0x7F, 0x69], np.uint8)).tolist() == [2.0**-8, 1.0, 2.0**-22]


def test_round_trip_error_is_within_half_an_e4m3_step():
    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.2, (200, 300)).astype(np.float32)
    codes, scale = _encode(w)
    d = Fp8E4m3E8m0.decode(codes, scale, 200, 300)
    k = scale.astype(np.int32) - 127
    s = np.repeat(np.repeat(np.ldexp(1.0, k), 128, 0), 128, 1)[:200, :300]
    # a normal e4m3 value v has 3 mantissa bits: |error| <= 2^(floor(log2|v|) - 4) after scaling back
    v = np.abs(w) / s
    step = np.where(v >= 2.0**-6, np.ldexp(1.0, np.floor(np.log2(np.maximum(v, 2.0**-6))).astype(int) - 3), 2.0**-9)
    assert np.all(np.abs(d - w) <= step * s / 2 + 1e-12)


def _every_e4m3_rounding_case() -> np.ndarray:
    """float32 values of |x| <= 448 covering every case of rounding to e4m3fn: each exponent field 0..135
    (zero, float32 subnormals, e4m3 subnormals 2^-9..2^-7, normals up to 2^8), each value of the 3 kept
    mantissa bits and the round bit (bits 22..19), sticky bits 18..0 none / lowest / all / half, both signs."""
    u = [(s << 31) | (e << 23) | (top << 19) | low
         for e in range(136) for top in range(16) for low in (0, 1, 0x3FFFF, 0x7FFFF) for s in (0, 1)]  # fmt: skip
    v = np.array(u, np.uint32).view(np.float32)
    return v[np.abs(v) <= 448]


def test_the_kernel_rounds_every_case_as_ml_dtypes():
    """In blocks whose amax is 448 (k = 0: w * 2^0 exact) the codes are the e4m3fn cast itself: the kernel's
    bit arithmetic against ml_dtypes' float32 -> float8_e4m3fn cast (round to nearest, ties to even)."""
    from colitools.formats.kernels import encoders

    v = _every_e4m3_rounding_case()
    rows = -(-v.size // 127)
    w = np.zeros((rows, 128), np.float32)
    w[:, :127] = np.concatenate([v, np.zeros(rows * 127 - v.size, np.float32)]).reshape(rows, 127)
    w[:, 127] = 448.0
    codes, scales = encoders.encode_fp8_e8m0(w)
    assert (scales == 127).all()
    want = w.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(codes, want), np.argwhere(codes != want)[:5]


@pytest.mark.parametrize(
    ("shape", "std"), [((300, 200), 1.0), ((1024, 2048), 0.02), ((129, 257), 1e-6), ((64, 48), 1e3), ((257, 130), 0.0)]
)
def test_the_kernel_equals_the_reference_on_partial_blocks_and_scales(shape, std):
    from colitools.formats.kernels import encoders

    w = (np.random.default_rng(sum(shape)).standard_normal(shape) * std).astype(np.float32)
    codes, scales = encoders.encode_fp8_e8m0(w)
    want_codes, want_scales = Fp8E4m3E8m0.encode(w, fast=False)
    assert np.array_equal(codes, want_codes) and np.array_equal(scales, want_scales)


def test_nonfinite_input_is_named_on_the_fast_path():
    from colitools.formats import kernels
    from colitools.formats.errors import EncodeError

    w = np.zeros((300, 300), np.float32)
    w[7, 9] = np.nan
    with pytest.raises(EncodeError, match=r"tensor t: .*\[7, 9\]"):
        kernels.encode_fp8_e8m0(w, "t")
