"""Byte vectors that pin every rule of docs/FORMATS.md §2.

Every expected byte is computed by hand in the comments next to it (never by running the code under test).
Each encoding test runs on both paths: ``fast=False`` (the numpy reference through the registry) and
``fast=True`` (the numba kernels).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import kernels, planar
from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError
from colitools.formats.registry import (
    Fp8E4m3B128,
    Int2Row,
    Int3G64,
    Int4Grouped,
    Int4Row,
    Int8Row,
    Mxfp4,
    detect_group_size,
    writer_group_size,
)

F32 = np.float32
both_paths = pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])

# float32 nearest to 1e-8: 1e-8 = 1.34217728 * 2^-27 -> exponent field 127 - 27 = 100 = 0b01100100,
# mantissa round(0.34217728 * 2^23) = 2870391 = 0x2BCC77 -> bits 0 01100100 0101011... = 0x322BCC77.
FLOOR_BITS = 0x322BCC77


def f32_bits(a) -> list[int]:
    return np.asarray(a, dtype=F32).reshape(-1).view(np.uint32).tolist()


def row(*values: float, width: int | None = None) -> np.ndarray:
    """A [1, width] float32 row holding ``values`` then zeros."""
    w = np.zeros((1, width or len(values)), F32)
    w[0, : len(values)] = values
    return w


def decode(fmt, codes, scales, O, I, gs=None, *, fast):
    return kernels.decode(fmt.name, codes, scales, O, I, gs) if fast else fmt.decode(codes, scales, O, I, gs)


# ------------------------------------------------------------------------------------------------ int8-row
@both_paths
def test_int8_row_twos_complement_and_scale(fast):
    # Row 0: amax 127 -> s = 127 / 127 = 1.0 (0x3F800000). q = rint(w / 1):
    #   127 -> 127 = 0x7F; -127 -> two's complement 256 - 127 = 129 = 0x81; 3.5 -> 4 (half to even);
    #   -0.5 -> -0 -> 0x00; 2.5 -> 2 (half to even); 0 -> 0.
    # Row 1: amax 254 -> s = 2.0 (0x40000000). w / 2 = [127, -0.5, -1.5, 2.5, 0, 0]
    #   -> [127, -0 (0x00), -2 (0xFE), 2, 0, 0].
    w = np.array([[127, -127, 3.5, -0.5, 2.5, 0], [254, -1, -3, 5, 0, 0]], F32)
    codes, scales = Int8Row.encode(w, fast=fast)
    assert codes.dtype == np.uint8 and codes.shape == (2, 6)
    assert codes.tolist() == [[0x7F, 0x81, 0x04, 0x00, 0x02, 0x00], [0x7F, 0x00, 0xFE, 0x02, 0x00, 0x00]]
    assert f32_bits(scales) == [0x3F800000, 0x40000000]
    # decode: q * s -> 0xFE is -2 -> -4.0
    out = decode(Int8Row, codes, scales, 2, 6, fast=fast)
    assert out[1].tolist() == [254.0, 0.0, -4.0, 4.0, 0.0, 0.0]


# -------------------------------------------------------------------------------------- int4 pairs (2 and 4)
@both_paths
def test_int4_row_pairs_low_nibble_is_even_element_plus_8(fast):
    # amax 7 -> s = 1.0. v = rint(w) = [7, -7, 0 (0.5 -> 0), 2 (1.5 -> 2), -2 (-2.5 -> -2), 3]
    # stored v + 8 = [15, 1, 8, 10, 6, 11]; byte j = elem 2j | elem 2j+1 << 4:
    #   15 | 1 << 4 = 0x1F; 8 | 10 << 4 = 0xA8; 6 | 11 << 4 = 0xB6.
    codes, scales = Int4Row.encode(row(7, -7, 0.5, 1.5, -2.5, 3), fast=fast)
    assert codes.tolist() == [[0x1F, 0xA8, 0xB6]]
    assert f32_bits(scales) == [0x3F800000]
    assert decode(Int4Row, codes, scales, 1, 6, fast=fast).tolist() == [[7, -7, 0, 2, -2, 3]]


@both_paths
def test_int4_row_odd_width_pads_high_nibble_with_8(fast):
    # I = 3, amax 7 -> s = 1; v + 8 = [15, 1, 9]; bytes 15 | 1 << 4 = 0x1F, 9 | 8 << 4 = 0x89 (pad nibble 8).
    codes, scales = Int4Row.encode(row(7, -7, 1), fast=fast)
    assert codes.tolist() == [[0x1F, 0x89]]


@both_paths
def test_int4_grouped_odd_width_pads_high_nibble_with_8(fast):
    # I = 17, gs = 16 (the writer rule keeps 16: 2 scales per row detect as 16). Group 0 = elements 0..15,
    # amax 7 -> s = 1.0; group 1 = element 16 alone, amax 14 -> s = 14 / 7 = 2.0.
    # byte 0 = (7 + 8) | (0 + 8) << 4 = 0x8F; bytes 1..7 = 0x88; byte 8 = (-14 / 2 = -7 -> 1) | 8 << 4 = 0x81.
    assert writer_group_size(17, 16) == 16
    codes, scales = Int4Grouped.encode(row(7, width=17) + row(*[0] * 16, -14), 16, fast=fast)
    assert codes.tolist() == [[0x8F] + [0x88] * 7 + [0x81]]
    assert f32_bits(scales) == [0x3F800000, 0x40000000]
    assert scales.shape == (1, 2)


@both_paths
def test_int4_grouped_partial_last_group_has_its_own_scale(fast):
    # I = 100, gs = 64: groups [0, 64) and [64, 100) (36 elements). writer_group_size(100, 64) == 64.
    # group 0: w0 = 14 (amax) -> s = 2.0; w1 = -3 -> -1.5 -> -2 (half to even) -> 6; w63 = 1 -> 0.5 -> 0 -> 8.
    # group 1: amax over its own 36 elements: w64 = -7 -> s = 1.0; w65 = 2.5 -> 2 -> 10; w99 = 7 -> 15.
    # byte 0 = 15 | 6 << 4 = 0x6F; byte 31 = (elems 62, 63) 8 | 8 << 4 = 0x88; byte 32 = (64, 65) 1 | 10 << 4
    # = 0xA1; byte 49 = (98, 99) 8 | 15 << 4 = 0xF8; every other byte 0x88.
    w = np.zeros((1, 100), F32)
    w[0, [0, 1, 63, 64, 65, 99]] = [14, -3, 1, -7, 2.5, 7]
    assert writer_group_size(100, 64) == 64
    codes, scales = Int4Grouped.encode(w, 64, fast=fast)
    expected = [0x88] * 50
    expected[0], expected[32], expected[49] = 0x6F, 0xA1, 0xF8
    assert codes.tolist() == [expected]
    assert f32_bits(scales) == [0x40000000, 0x3F800000]
    out = decode(Int4Grouped, codes, scales, 1, 100, 64, fast=fast)
    assert out[0, [0, 1, 63, 64, 65, 99]].tolist() == [14, -4, 0, -7, 2, 7]


# ------------------------------------------------------------------------------------------------ int2-row
@both_paths
def test_int2_row_lsb_first_and_zero_tail_bits(fast):
    # s = max(amax / 1, 1e-8) = 2.0. w / 2 = [1, -1, 0.5, -0.5, 0.6, 0] -> rint [1, -1, 0, -0, 1, 0]
    # stored v + 2 = [3, 1, 2, 2, 3, 2]. byte 0 (elements 0..3) = 3 | 1 << 2 | 2 << 4 | 2 << 6
    # = 3 + 4 + 32 + 128 = 167 = 0xA7; byte 1 (elements 4, 5, tail, tail) = 3 | 2 << 2 = 0x0B, tail bits 0.
    codes, scales = Int2Row.encode(row(2, -2, 1, -1, 1.2, 0), fast=fast)
    assert codes.tolist() == [[0xA7, 0x0B]]
    assert f32_bits(scales) == [0x40000000]
    assert decode(Int2Row, codes, scales, 1, 6, fast=fast).tolist() == [[2, -2, 0, 0, 2, 0]]


# ------------------------------------------------------------------------------------------------ int3-g64
@both_paths
def test_int3_planes_and_padding_code_4(fast):
    # I = 70: group 0 = elements 0..63, group 1 = 64..69 plus 58 padding codes.
    # group 0: amax 3 -> s = 1.0; u = v + 4: w0 = 3 -> 7, w1 = -3 -> 1, w2 = 1 -> 5, w3 = -1 -> 3, w8 = 2 -> 6,
    #   w63 = -2 -> 2, every other element 0 -> 4.
    #   low plane (u & 3, element k at byte k >> 2, shift 2 * (k & 3)):
    #     byte 0 = [3, 1, 1, 3] -> 3 | 1 << 2 | 1 << 4 | 3 << 6 = 3 + 4 + 16 + 192 = 0xD7
    #     byte 2 = [6 & 3 = 2, 0, 0, 0] -> 0x02; byte 15 = [0, 0, 0, 2] -> 2 << 6 = 0x80; others 0x00
    #   high plane (bit 2 of u, element k at byte 16 + (k >> 3), bit k & 7):
    #     byte 16 = bits of [7, 1, 5, 3, 4, 4, 4, 4] -> [1, 0, 1, 0, 1, 1, 1, 1] -> 0b11110101 = 0xF5
    #     byte 17 = [6, 4 x 7] -> all ones 0xFF; bytes 18..22 = 0xFF; byte 23 = [4 x 7, 2] -> 0x7F
    # group 1: amax over the 6 real values only: w64 = 0.5, w65 = -1.5 -> s = 1.5 / 3 = 0.5 (0x3F000000);
    #   u = [5, 1, 4, 4, 4, 4] then padding u = 4 (value 0).
    #     low byte 0 = [5 & 3 = 1, 1, 0, 0] -> 1 | 1 << 2 = 0x05; low bytes 1..15 = 0x00 (4 & 3 = 0)
    #     high byte 16 = bits of [5, 1, 4, 4, 4, 4, 4, 4] -> 0b11111101 = 0xFD; bytes 17..23 = 0xFF (padding)
    w = np.zeros((1, 70), F32)
    w[0, [0, 1, 2, 3, 8, 63, 64, 65]] = [3, -3, 1, -1, 2, -2, 0.5, -1.5]
    codes, scales = Int3G64.encode(w, fast=fast)
    g0 = [0xD7, 0, 0x02] + [0] * 12 + [0x80] + [0xF5, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]
    g1 = [0x05] + [0] * 15 + [0xFD] + [0xFF] * 7
    assert codes.tolist() == [g0 + g1]
    assert f32_bits(scales) == [0x3F800000, 0x3F000000]
    out = decode(Int3G64, codes, scales, 1, 70, fast=fast)
    assert out[0, [0, 1, 2, 3, 8, 63, 64, 65, 66]].tolist() == [3, -3, 1, -1, 2, -2, 0.5, -1.5, 0]


@both_paths
def test_int3_padding_does_not_enter_amax(fast):
    # I = 65: the second group holds the single value -0.75, so s = 0.75 / 3 = 0.25 (0x3E800000) — had the 63
    # padding slots counted as anything but absent/zero, the scale could differ. v = -3 -> u = 1:
    # low byte 0 = 1; high byte 16 = bits of [1, 4, 4, 4, 4, 4, 4, 4] = 0b11111110 = 0xFE.
    w = row(1.5, width=65)
    w[0, 64] = -0.75
    codes, scales = Int3G64.encode(w, fast=fast)
    assert f32_bits(scales) == [0x3F000000, 0x3E800000]  # 1.5 / 3 = 0.5, then 0.25
    assert codes[0, 24:].tolist() == [0x01] + [0] * 15 + [0xFE] + [0xFF] * 7


# ---------------------------------------------------------------------------------------------------- mxfp4
@both_paths
def test_mxfp4_e2m1_tie_cases_round_to_even_mantissa(fast):
    # amax 6 = 0.75 * 2^3 -> ex = 3, e0 = 0; 6 / 2^0 = 6 saturates nothing -> e = 0, scale byte 127 = 0x7F.
    # r = w. Codes (magnitude index, bit 3 = sign):
    #   6 -> 7; 0.25 -> 0 (tie 0 | 0.5 -> 0); 0.75 -> 2 (tie 0.5 | 1 -> 1); 1.25 -> 2 (tie 1 | 1.5 -> 1);
    #   1.75 -> 4 (tie 1.5 | 2 -> 2); 2.5 -> 4 (tie 2 | 3 -> 2); 3.5 -> 6 (tie 3 | 4 -> 4); 5 -> 6 (tie 4 | 6 -> 4);
    #   -0.25 -> rounds to zero -> 0 (never 8); -0.75 -> 8 | 2 = 10; -5 -> 8 | 6 = 14; -0.0 -> 0;
    #   0.5 -> 1; 1 -> 2; 1.5 -> 3; 2 -> 4; 3 -> 5; 4 -> 6; -6 -> 15; 0.1 -> 0; the rest 0.
    # bytes (low nibble = even column): 7|0<<4 = 0x07, 2|2<<4 = 0x22, 4|4<<4 = 0x44, 6|6<<4 = 0x66,
    #   0|10<<4 = 0xA0, 14|0<<4 = 0x0E, 1|2<<4 = 0x21, 3|4<<4 = 0x43, 5|6<<4 = 0x65, 15|0<<4 = 0x0F, then 0.
    values = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -5, -0.0, 0.5, 1, 1.5, 2, 3, 4, -6, 0.1]
    packed, scale = Mxfp4.encode(row(*values, width=32), fast=fast)
    assert packed.tolist() == [[0x07, 0x22, 0x44, 0x66, 0xA0, 0x0E, 0x21, 0x43, 0x65, 0x0F] + [0] * 6]
    assert scale.dtype == np.uint8 and scale.tolist() == [[0x7F]]


@both_paths
def test_mxfp4_exponent_e1_wins_when_strictly_better(fast):
    # amax 7.5 = 0.9375 * 2^3 -> e0 = 0, e1 = 1.
    #   e0: 7.5 -> 6 (saturates) err 2.25; -1 -> idx 2 err 0; 0.75 -> 1 err 0.0625 -> err0 = 2.3125
    #   e1: r = w / 2 = [3.75 -> 4 (idx 6) -> 8, err 0.25; -0.5 -> 8|1 = 9 -> -1, err 0; 0.375 -> idx 1 -> 1,
    #       err 0.0625] -> err1 = 0.3125 < err0 -> e1, scale byte 1 + 127 = 0x80.
    # bytes: 6 | 9 << 4 = 0x96; elements 2, 3: 1 | 0 << 4 = 0x01.
    packed, scale = Mxfp4.encode(row(7.5, -1, 0.75, width=32), fast=fast)
    assert scale.tolist() == [[0x80]]
    assert packed.tolist() == [[0x96, 0x01] + [0] * 14]


@both_paths
def test_mxfp4_exponent_tie_keeps_e0(fast):
    # amax 7 = 0.875 * 2^3 -> e0 = 0, e1 = 1. e0: 7 -> 6 (idx 7), err 1. e1: 3.5 -> 4 (tie to even), decoded 8,
    # err 1. Equal -> keep e0: scale byte 0x7F, code 7 -> byte 0 = 0x07.
    packed, scale = Mxfp4.encode(row(7, width=32), fast=fast)
    assert scale.tolist() == [[0x7F]]
    assert packed.tolist() == [[0x07] + [0] * 15]


@both_paths
def test_mxfp4_saturates_beyond_6(fast):
    # 6.5 = 0.8125 * 2^3: e0 = 0 -> 6.5 saturates to 6 (idx 7), err 0.25; e1 = 1 -> 3.25 -> 3 (idx 5) -> 6,
    # err 0.25: a tie, so e0 and the saturated code 7 (and -6.5 -> 15). Bytes 7 | 15 << 4 = 0xF7.
    packed, scale = Mxfp4.encode(row(6.5, -6.5, width=32), fast=fast)
    assert scale.tolist() == [[0x7F]]
    assert packed.tolist() == [[0xF7] + [0] * 15]


@both_paths
def test_mxfp4_all_zero_block_scale_byte_0(fast):
    # Row of two blocks: block 0 all +0 / -0 -> scale byte 0, codes 0 (never 8 for -0);
    # block 1: amax 4 = 0.5 * 2^3 -> e0 = 0 -> byte 0x7F; 4 -> idx 6 -> byte 16 = 0x06.
    w = np.zeros((1, 64), F32)
    w[0, 1::2] = -0.0
    w[0, 32] = 4
    packed, scale = Mxfp4.encode(w, fast=fast)
    assert scale.tolist() == [[0x00, 0x7F]]
    assert packed.tolist() == [[0] * 16 + [0x06] + [0] * 15]


@both_paths
def test_mxfp4_e8m0_decode(fast):
    # byte 0x97: low nibble 7 -> +6, high nibble 9 -> -0.5; byte 0x28: 8 -> -0, 2 -> 1.
    # Scale byte 129 -> 2^(129 - 127) = 4 -> [24, -2, -0, 4]. Scale byte 0 -> 2^-127 (a float32 subnormal,
    # bits 0x00400000): 6 * 2^-127 = 1.5 * 2^-125 is normal, exponent field -125 + 127 = 2, mantissa .5
    # -> 0x01000000 | 0x00400000 = 0x01400000; -0.5 * 2^-127 = -2^-128, subnormal -> 0x80000000 | 0x00200000.
    packed = np.zeros((2, 16), np.uint8)
    packed[:, 0], packed[:, 1] = 0x97, 0x28
    scale = np.array([[129], [0]], np.uint8)
    out = decode(Mxfp4, packed, scale, 2, 32, fast=fast)
    assert out[0, :4].tolist() == [24.0, -2.0, -0.0, 4.0]
    assert np.signbit(out[0, 2])
    assert f32_bits(out[1, :2]) == [0x01400000, 0x80200000]


# ------------------------------------------------------------------------------------------- fp8 e4m3 (8)
@both_paths
def test_e4m3_decode_values_nan_and_max(fast):
    # e4m3fn: sign | 4 exponent bits (bias 7) | 3 mantissa bits, no infinities.
    #   0x00 -> 0; 0x80 -> -0; 0x01 -> subnormal 1/8 * 2^-6 = 2^-9; 0x07 -> 7/8 * 2^-6 = 7 * 2^-9;
    #   0x08 -> 2^(1-7) = 2^-6 (smallest normal); 0x38 = 0 0111 000 -> 2^0 = 1; 0x40 = 0 1000 000 -> 2;
    #   0x7E = 0 1111 110 -> 2^8 * 1.75 = 448 (max); 0xFE -> -448; 0x7F and 0xFF -> NaN.
    q = np.array([[0x00, 0x80, 0x01, 0x07, 0x08, 0x38, 0x40, 0x7E, 0xFE, 0x7F, 0xFF]], np.uint8)
    s = np.ones((1, 1), F32)
    out = kernels.dequant_fp8_block(q, s, (128, 128)) if fast else ref.dequant_fp8_block(q, s)
    expected = [0.0, -0.0, 2.0**-9, 7 * 2.0**-9, 2.0**-6, 1.0, 2.0, 448.0, -448.0]
    assert out[0, :9].tolist() == expected
    assert np.signbit(out[0, 1])
    assert np.isnan(out[0, 9]) and np.isnan(out[0, 10])


@both_paths
def test_fp8_block_scales_cover_partial_edge_blocks(fast):
    # [130, 129] with 128x128 blocks -> scale grid ceil(130/128) x ceil(129/128) = 2 x 2, edge blocks partial.
    # Every byte 0x38 (= 1.0), so w[r, c] = s[r // 128, c // 128]:
    #   w[0, 0] = 1; w[127, 127] = 1; w[0, 128] = 2; w[128, 127] = 4; w[129, 128] = 8.
    q = np.full((130, 129), 0x38, np.uint8)
    s = np.array([[1, 2], [4, 8]], F32)
    out = decode(Fp8E4m3B128, q, s, 130, 129, fast=fast)
    assert [out[0, 0], out[127, 127], out[0, 128], out[128, 127], out[129, 128]] == [1, 1, 2, 4, 8]
    assert Fp8E4m3B128.scale_shape(130, 129) == (2, 2)


# -------------------------------------------------------------------------------------------- scale floor
@both_paths
@pytest.mark.parametrize("fmt", [Int8Row, Int4Row, Int2Row, Int3G64])
def test_scale_floor_on_all_zero_and_subnormal_rows(fast, fmt):
    # Row 0 all zero: amax / qmax = 0 < 1e-8 -> s = float32(1e-8) = 0x322BCC77, every value 0.
    # Row 1 subnormal: amax = 1e-40 (a float32 subnormal); 1e-40 / qmax < 1e-8 -> s = 1e-8 again, and
    # 1e-40 / 1e-8 = 1e-32 rounds to 0, so row 1 has the same codes as row 0.
    w = np.zeros((2, 5), F32)
    w[1] = [1e-40, -1e-40, 5e-41, 0, 1e-45]
    codes, scales = fmt.encode(w, fast=fast)
    assert set(f32_bits(scales)) == {FLOOR_BITS}
    assert codes[0].tolist() == codes[1].tolist()
    assert np.all(decode(fmt, codes, scales, 2, 5, fast=fast) == 0)


@both_paths
def test_scale_floor_on_int4_grouped_zero_group(fast):
    # I = 32, gs = 16: group 0 zero -> s = 1e-8 (0x322BCC77), codes 8 | 8 << 4 = 0x88; group 1: w16 = 7 -> s = 1.
    w = row(*[0] * 16, 7, width=32)
    codes, scales = Int4Grouped.encode(w, 16, fast=fast)
    assert f32_bits(scales) == [FLOOR_BITS, 0x3F800000]
    assert codes.tolist() == [[0x88] * 8 + [0x8F] + [0x88] * 7]


# ----------------------------------------------------------------------------------- group-size writer rule
def test_group_size_writer_rule_examples():
    # I = 96, gs = 64: 2 scales per row; detection tries 16 (6 scales), 32 (3), 48 (2) -> 48, so write 48.
    assert detect_group_size(1, 96, 2 * 4) == 48
    assert writer_group_size(96, 64) == 48
    # I = 100, gs = 64: 2 scales; 16 -> 7, 32 -> 4, 48 -> 3, 64 -> 2 -> detected as 64: write 64.
    assert detect_group_size(1, 100, 2 * 4) == 64
    assert writer_group_size(100, 64) == 64
    # I <= gs: one group per row has int4-row's bytes and values -> write int4-row (None).
    assert writer_group_size(64, 64) is None
    assert writer_group_size(50, 64) is None
    assert writer_group_size(128, 64) == 64


@both_paths
def test_group_size_writer_rule_encodes_and_refuses(fast):
    w = np.arange(96, dtype=F32).reshape(1, 96)
    codes, scales = Int4Grouped.encode(w, 48, fast=fast)
    assert scales.shape == (1, 2)  # ceil(96 / 48)
    with pytest.raises(EncodeError, match="would not resolve back"):
        Int4Grouped.encode(w, 64, fast=fast)  # I = 96 at gs 64 would be read back as gs 48
    # I <= gs: int4-row (one scale per row) holds the same values as the one-group encoding.
    w50 = np.linspace(-3, 4, 50, dtype=F32).reshape(1, 50)
    c_row, s_row = Int4Row.encode(w50, fast=fast)
    c_grp, s_grp = (kernels.encode if fast else _ref_grouped)("int4-grouped", w50, 64)
    assert c_row.tobytes() == c_grp.tobytes() and s_row.tobytes() == s_grp.tobytes()


def _ref_grouped(_fmt, w, gs):
    return ref.encode_int4_grouped(w, gs)


# ---------------------------------------------------------------------------------------------- planar64-v8
@both_paths
def test_planar64_byte_order(fast):
    # I = 64. Row 0: element e holds nibble e % 16. Pairs byte j = (2j % 16) | ((2j + 1) % 16) << 4, e.g.
    # byte 0 = 0 | 1 << 4 = 0x10, byte 1 = 0x32. Planar byte k = element k | element k + 32 << 4
    # = (k % 16) * 0x11: byte 0 = 0x00, byte 1 = 0x11, byte 15 = 0xFF, byte 16 = 0x00, byte 31 = 0xFF.
    # Row 1: elements 0..31 hold 1, elements 32..63 hold 2: pairs bytes 0..15 = 0x11, 16..31 = 0x22;
    # planar bytes all 1 | 2 << 4 = 0x21.
    pairs = np.zeros((2, 32), np.uint8)
    pairs[0] = [(2 * j % 16) | ((2 * j + 1) % 16) << 4 for j in range(32)]
    pairs[1] = [0x11] * 16 + [0x22] * 16
    assert pairs[0, :2].tolist() == [0x10, 0x32]
    to_planar = kernels.pairs_to_planar if fast else planar.pairs_to_planar
    to_pairs = kernels.planar_to_pairs if fast else planar.planar_to_pairs
    out = to_planar(pairs)
    assert out[0].tolist() == [(k % 16) * 0x11 for k in range(32)]
    assert out[1].tolist() == [0x21] * 32
    assert to_pairs(out).tolist() == pairs.tolist()


# ---------------------------------------------------------------------------------------------- bf16 output
def test_bf16_round_to_nearest_even():
    # f32 -> bf16 keeps the top 16 bits, rounding the low 16 to nearest, ties to even:
    #   0x3F808000 (1 + 2^-8) is exactly halfway between 0x3F80 and 0x3F81 -> even 0x3F80;
    #   0x3F818000 (1 + 3 * 2^-8) halfway between 0x3F81 and 0x3F82 -> even 0x3F82;
    #   0x3F808001 is just above halfway -> 0x3F81; 0x3F807FFF just below -> 0x3F80.
    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF], np.uint32)
    out = ref.encode_bf16(bits.view(F32))
    assert out.dtype == ml_dtypes.bfloat16
    assert out.view(np.uint16).tolist() == [0x3F80, 0x3F82, 0x3F81, 0x3F80]
