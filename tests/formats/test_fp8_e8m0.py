"""fp8-e4m3-e8m0 (docs/FORMATS.md §2.9): hand-computed byte vectors for the encoder and decoder.

The rule restated from DeepSeek's quantizer (``inference/kernel.py`` ``act_quant`` with ``scale_fmt="ue8m0"``:
``fast_round_scale(amax, 1/448) = 2^ceil(log2(amax * f32(1/448)))`` with ``amax`` floored at ``1e-4``) and
colibri's reader (``c/deepseek_v4.c`` ``coli_tensor_load_fp8``: F8_E4M3 ``[O, I]``, F8_E8M0
``[ceil(O/128), ceil(I/128)]``, ``w = e4m3(code) * 2^(byte - 127)``). Every expected byte below was worked out
by hand from that rule (the comments show the arithmetic), never taken from the encoder's output.
"""

from __future__ import annotations

import numpy as np

from colitools.formats import registry
from colitools.formats.registry import Fp8E4m3E8m0, by_name


def _encode(w):
    return Fp8E4m3E8m0.encode(np.asarray(w, np.float32))


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
