"""Numpy reference codecs: the readable, executable form of docs/FORMATS.md §2.

Every function here is vectorised over rows/blocks (no Python loops over elements) and is the bit-exact
reference that the numba kernels in ``kernels/`` must reproduce byte for byte. Arithmetic is float32 with
true IEEE divisions (never a reciprocal multiply) and ``np.rint`` (round half to even), as the spec requires.

Encoders take a C-contiguous float32 ``w[O, I]`` that is already known to be finite (the registry checks) and
return ``(codes uint8 [O, row_bytes], scales)``. Decoders return float32 ``[O, I]``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from colitools.formats import quantizers
from colitools.formats.quantizers import RTN

F32 = np.float32
SCALE_FLOOR = F32(1e-8)  # "floored to 1e-8 if smaller": the float32 nearest to 1e-8


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pad_cols(w: np.ndarray, width: int) -> np.ndarray:
    """Zero-pad columns to ``width``. Zeros never change a block's amax (|0| <= amax) and quantize to 0."""
    if w.shape[1] == width:
        return w
    out = np.zeros((w.shape[0], width), dtype=F32)
    out[:, : w.shape[1]] = w
    return out


def _symmetric_scales(amax: np.ndarray, qmax: int) -> np.ndarray:
    # s = max(amax / qmax, 1e-8), one float32 true division.
    return np.maximum(amax.astype(F32) / F32(qmax), SCALE_FLOOR)


def _quantize(w: np.ndarray, s: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``clip(rint(w / s), lo, hi)`` as int8 (float32 division, round half to even)."""
    return np.clip(np.rint(w / s), lo, hi).astype(np.int8)


# ---------------------------------------------------------------------------------------------- int8-row (1)
def scales_codes(
    blocks: np.ndarray, lo: int, hi: int, quantizer: str = RTN, search=None
) -> tuple[np.ndarray, np.ndarray]:
    """``(scales [...], values int8 [..., n])`` of float32 scale groups ``blocks[..., n]`` (a row, or a group of a
    row; zero padding never changes a group's amax and quantizes to 0): ``rtn`` is §2's ``s = max(amax / hi,
    1e-8)``, ``v = clip(rint(w / s), lo, hi)``; ``mse`` / ``mse-positive`` the search of ``quantizers.py``
    (FORMATS §11), whose codes are the same ``clip(rint(w / s))`` of the scale it writes; ``search`` is the
    kernels' byte-identical group search (``quantizers.mse_scales_codes``), numpy's when None."""
    if quantizer != RTN:
        return quantizers.mse_scales_codes(blocks, lo, hi, quantizers.signed(quantizer), search)
    amax = np.max(np.abs(blocks), axis=-1) if blocks.shape[-1] else np.zeros(blocks.shape[:-1], F32)
    s = _symmetric_scales(amax, hi)
    return s, _quantize(blocks, s[..., None], lo, hi)


def encode_int8_row(w: np.ndarray, quantizer: str = RTN, search=None) -> tuple[np.ndarray, np.ndarray]:
    s, q = scales_codes(w, -128, 127, quantizer, search)
    return pack_int8(q), s


def pack_int8(v: np.ndarray) -> np.ndarray:
    """int8 values ``[O, I]`` as their two's complement bytes."""
    return np.ascontiguousarray(v, dtype=np.int8).view(np.uint8)


def decode_int8_row(codes: np.ndarray, scales: np.ndarray, O: int, I: int) -> np.ndarray:
    q = codes.reshape(O, I).view(np.int8).astype(F32)
    return q * scales.reshape(O, 1).astype(F32)


# ------------------------------------------------------------------------------------- int4 "pairs" (2 and 4)
def pack_int4_pairs(v: np.ndarray) -> np.ndarray:
    """Pack int4 values ``v`` in [-8, 7] ``[O, I]`` as pairs: byte j = (v[2j] + 8) | (v[2j+1] + 8) << 4.

    For odd I the unused high nibble of the last byte is 8 (the code of value 0)."""
    O, I = v.shape
    if I % 2 == 0 and v.dtype == np.int8:  # the common case without the padding copy (the same bytes)
        u = (v + np.int8(8)).view(np.uint8)  # -8..7 + 8: no int8 overflow
    else:
        u = np.full((O, 2 * ceil_div(I, 2)), 8, dtype=np.uint8)
        u[:, :I] = (v.astype(np.int16) + 8).astype(np.uint8)
    return (u[:, 0::2] | (u[:, 1::2] << np.uint8(4))).astype(np.uint8, copy=False)


def unpack_int4_pairs(codes: np.ndarray, O: int, I: int) -> np.ndarray:
    """Inverse of ``pack_int4_pairs``: signed values ``[O, I]`` as int8."""
    b = codes.reshape(O, -1)
    u = np.empty((O, 2 * b.shape[1]), dtype=np.uint8)
    u[:, 0::2] = b & 0x0F
    u[:, 1::2] = b >> 4
    return (u[:, :I].astype(np.int8) - 8).astype(np.int8)


def encode_int4_row(w: np.ndarray, quantizer: str = RTN, search=None) -> tuple[np.ndarray, np.ndarray]:
    s, v = scales_codes(w, -8, 7, quantizer, search)
    return pack_int4_pairs(v), s


def decode_int4_row(codes: np.ndarray, scales: np.ndarray, O: int, I: int) -> np.ndarray:
    return unpack_int4_pairs(codes, O, I).astype(F32) * scales.reshape(O, 1).astype(F32)


def encode_int4_grouped(w: np.ndarray, gs: int, quantizer: str = RTN, search=None) -> tuple[np.ndarray, np.ndarray]:
    O, I = w.shape
    G = ceil_div(I, gs)
    s, v = scales_codes(_pad_cols(w, G * gs).reshape(O, G, gs), -8, 7, quantizer, search)  # s [O, G]
    return pack_int4_pairs(v.reshape(O, G * gs)[:, :I]), s


def decode_int4_grouped(codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int) -> np.ndarray:
    G = ceil_div(I, gs)
    v = unpack_int4_pairs(codes, O, I).astype(F32)
    s = np.repeat(scales.reshape(O, G).astype(F32), gs, axis=1)[:, :I]
    return v * s


# ------------------------------------------------------------------------------------------- int2-row (3)
def encode_int2_row(w: np.ndarray, quantizer: str = RTN, search=None) -> tuple[np.ndarray, np.ndarray]:
    s, v = scales_codes(w, -2, 1, quantizer, search)
    return pack_int2(v), s


def pack_int2(v: np.ndarray) -> np.ndarray:
    """int2 values ``[O, I]`` in [-2, 1]: element i at byte i >> 2, bits 2*(i & 3) (LSB first), stored v + 2.
    Unused tail bits are 0, not the code of zero (2)."""
    O, I = v.shape
    u = np.zeros((O, 4 * ceil_div(I, 4)), dtype=np.uint8)
    u[:, :I] = (v + 2).astype(np.uint8)
    u = u.reshape(O, -1, 4)
    codes = u[:, :, 0] | (u[:, :, 1] << 2) | (u[:, :, 2] << 4) | (u[:, :, 3] << 6)
    return codes.astype(np.uint8)


def decode_int2_row(codes: np.ndarray, scales: np.ndarray, O: int, I: int) -> np.ndarray:
    b = codes.reshape(O, -1)
    u = np.stack([(b >> (2 * k)) & 3 for k in range(4)], axis=2).reshape(O, -1)[:, :I]
    return (u.astype(F32) - F32(2)) * scales.reshape(O, 1).astype(F32)


# ------------------------------------------------------------------------------------------- int3-g64 (5)
INT3_GROUP = 64
INT3_GROUP_BYTES = 24


def encode_int3_g64(w: np.ndarray, quantizer: str = RTN, search=None) -> tuple[np.ndarray, np.ndarray]:
    O, I = w.shape
    G = ceil_div(I, INT3_GROUP)
    s, v = scales_codes(_pad_cols(w, G * INT3_GROUP).reshape(O, G, INT3_GROUP), -4, 3, quantizer, search)
    return pack_int3_g64(v.reshape(O, G * INT3_GROUP)[:, :I]), s


def pack_int3_g64(v: np.ndarray) -> np.ndarray:
    """int3 values ``[O, I]`` in [-4, 3] as ``ceil(I/64)`` groups of 24 bytes per row (§2.6); padding past ``I``
    is value 0 (u = 4, the spec's padding code)."""
    O, I = v.shape
    G = ceil_div(I, INT3_GROUP)
    padded = np.zeros((O, G * INT3_GROUP), np.int16)
    padded[:, :I] = v
    u = (padded + 4).astype(np.uint8).reshape(O, G, INT3_GROUP)
    low = (u & 3).reshape(O, G, 16, 4)  # value k -> byte k >> 2, shift 2 * (k & 3)
    low_plane = low[..., 0] | (low[..., 1] << 2) | (low[..., 2] << 4) | (low[..., 3] << 6)
    high = ((u >> 2) & 1).reshape(O, G, 8, 8)  # value k -> byte 16 + (k >> 3), bit k & 7
    high_plane = np.zeros((O, G, 8), dtype=np.uint8)
    for bit in range(8):  # 8 bit positions, vectorised over everything else
        high_plane |= high[..., bit] << bit
    codes = np.concatenate([low_plane.astype(np.uint8), high_plane], axis=2)
    return codes.reshape(O, G * INT3_GROUP_BYTES)


def decode_int3_g64(codes: np.ndarray, scales: np.ndarray, O: int, I: int) -> np.ndarray:
    G = ceil_div(I, INT3_GROUP)
    b = codes.reshape(O, G, INT3_GROUP_BYTES)
    low = np.stack([(b[:, :, :16] >> (2 * k)) & 3 for k in range(4)], axis=3).reshape(O, G, 64)
    high = np.stack([(b[:, :, 16:] >> k) & 1 for k in range(8)], axis=3).reshape(O, G, 64)
    v = (low | (high << 2)).astype(F32) - F32(4)
    return (v * scales.reshape(O, G, 1).astype(F32)).reshape(O, G * 64)[:, :I]


# ---------------------------------------------------------------------------------------------- mxfp4 (7)
MXFP4_BLOCK = 32
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)
# The one E2M1 decode table: nibble -> float32 value, bit 3 = sign (code 8 is -0.0, decoding like -0.0 * 2^e).
E2M1_SIGNED = np.concatenate([E2M1_VALUES, -E2M1_VALUES]).astype(F32)
# The one E8M0 decode: scale byte -> 2^(byte - 127) as float32 (byte 0 is 2^-127, a float32 subnormal, exact;
# byte 255 is 2^128 = inf, as np.ldexp gives).
with np.errstate(over="ignore"):
    E8M0_TO_F32 = np.ldexp(F32(1), np.arange(256, dtype=np.int32) - 127).astype(F32)
# Upper bounds of each magnitude's rounding interval, with which side includes the tie (ties to even mantissa):
# |r| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5, <= 2.5 -> 2, < 3.5 -> 3, <= 5 -> 4, else 6.
_E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32)
_E2M1_TIE_GOES_DOWN = np.array([True, False, True, False, True, False, True])


def e2m1_index(mag: np.ndarray) -> np.ndarray:
    """Magnitude index 0..7 of |r| under the spec's round-to-nearest, ties-to-even-mantissa rule."""
    idx = np.zeros(mag.shape, dtype=np.uint8)
    for bound, tie_down in zip(_E2M1_BOUNDS, _E2M1_TIE_GOES_DOWN, strict=True):
        idx += (mag > bound) if tie_down else (mag >= bound)
    return idx


def _mxfp4_codes(blocks: np.ndarray, e: np.ndarray) -> np.ndarray:
    """E2M1 nibbles of ``blocks [..., 32]`` for exponents ``e [...]`` (r = w / 2^e, float32 true division)."""
    r = blocks / np.ldexp(F32(1), e.astype(np.int32))[..., None].astype(F32)
    idx = e2m1_index(np.abs(r))
    neg = (r < 0) & (idx != 0)  # a value that rounds to zero is code 0, never 8
    return (idx | (neg.astype(np.uint8) << 3)).astype(np.uint8)


def _mxfp4_decode_f64(codes: np.ndarray, e: np.ndarray) -> np.ndarray:
    # float64 is exact for every E2M1 value times 2^e; code 8 (-0.0) gives the same squared error as +0.0.
    return E2M1_SIGNED[codes].astype(np.float64) * np.ldexp(1.0, e.astype(np.int32))[..., None]


def encode_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(weight_packed uint8 [O, I/2], weight_scale uint8 [O, I/32])``; requires I % 32 == 0."""
    O, I = w.shape
    B = I // MXFP4_BLOCK
    blocks = w.reshape(O, B, MXFP4_BLOCK)
    amax = np.max(np.abs(blocks), axis=2) if B else np.zeros((O, 0), F32)
    _, ex = np.frexp(amax)  # amax = m * 2^ex, 0.5 <= m < 1
    e0 = np.clip(ex.astype(np.int32) - 3, -127, 127)
    e1 = np.clip(ex.astype(np.int32) - 2, -127, 127)
    c0 = _mxfp4_codes(blocks, e0)
    c1 = _mxfp4_codes(blocks, e1)
    w64 = blocks.astype(np.float64)
    # Squared error in float64 accumulated in element order k = 0..31: cumsum is a strictly sequential
    # accumulation (np.sum would use pairwise summation and could differ in the last bit).
    err0 = np.cumsum((_mxfp4_decode_f64(c0, e0) - w64) ** 2, axis=2)[..., -1] if B else np.zeros((O, 0))
    err1 = np.cumsum((_mxfp4_decode_f64(c1, e1) - w64) ** 2, axis=2)[..., -1] if B else np.zeros((O, 0))
    use1 = err1 < err0  # keep e1 only if strictly smaller
    e = np.where(use1, e1, e0)
    codes = np.where(use1[..., None], c1, c0)
    zero = amax == 0
    codes[zero] = 0
    scale = np.where(zero, 0, e + 127).astype(np.uint8)
    flat = codes.reshape(O, I)
    packed = (flat[:, 0::2] | (flat[:, 1::2] << 4)).astype(np.uint8)
    return packed, scale


def decode_mxfp4(packed: np.ndarray, scale: np.ndarray, O: int, I: int) -> np.ndarray:
    b = packed.reshape(O, I // 2)
    codes = np.empty((O, I), dtype=np.uint8)
    codes[:, 0::2] = b & 0x0F
    codes[:, 1::2] = b >> 4
    val = E2M1_SIGNED[codes]
    s = E8M0_TO_F32[scale.reshape(O, I // MXFP4_BLOCK)]
    return val * np.repeat(s, MXFP4_BLOCK, axis=1)


# ------------------------------------------------------------------------------------- fp8-e4m3-b128 (8)
FP8_BLOCK = 128
# The one e4m3fn decode table: byte -> float32, exact (ml_dtypes; 0x7F / 0xFF are NaN, 0x7E = 448).
E4M3_TO_F32 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)


def dequant_fp8_block(q: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = (128, 128)) -> np.ndarray:
    """DeepSeek-V3 FP8 block dequant: ``w[r, c] = f32(e4m3(q[r, c])) * f32(s[r // br, c // bc])``.

    One float32 multiply per element; edge blocks are partial (ceil grid). ``q`` may be uint8 bytes or
    float8_e4m3fn values; ``scale_inv`` F32 or BF16 ``[ceil(M/br), ceil(N/bc)]``."""
    M, N = q.shape
    br, bc = block
    values = E4M3_TO_F32[np.ascontiguousarray(q).view(np.uint8)]
    s = np.asarray(scale_inv).astype(F32).reshape(ceil_div(M, br), ceil_div(N, bc))
    s_full = np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:M, :N]
    return values * s_full


def decode_fp8_b128(codes: np.ndarray, scales: np.ndarray, O: int, I: int) -> np.ndarray:
    return dequant_fp8_block(codes.reshape(O, I), scales, (FP8_BLOCK, FP8_BLOCK))


# -------------------------------------------------------------------- fp8-e4m3-e8m0 (9), -t32 (101), -r32 (102)
# DeepSeek-V4's released FP8 (and what c/deepseek_v4.c coli_tensor_load_fp8 reads): e4m3fn codes ``[O, I]`` and
# one E8M0 byte per 128x128 block ``[ceil(O/128), ceil(I/128)]``, ``w = e4m3(code) * 2^(byte - 127)``.
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
# DeepSeek's quantizer (inference/kernel.py ``act_quant`` with ``scale_fmt="ue8m0"``): amax is floored at 1e-4,
# then ``s = fast_round_scale(amax, 1/448) = 2^ceil(log2(amax * f32(1/448)))``: the smallest power of two with
# amax / s <= 448 (up to the one rounding of the product, which the clamp to +-448 below absorbs). An all-zero
# block therefore gets 2^ceil(log2(1e-4/448)) = 2^-22 (byte 105) and codes 0, as DeepSeek's kernel gives it.
FP8_AMAX_FLOOR = 1e-4
_FP8_MAX_INV = F32(1.0 / E4M3_MAX)


def e8m0_block_exponents(amax: np.ndarray) -> np.ndarray:
    """``k`` (int32) of each block's scale ``2^k``: ``ceil(log2(max(amax, 1e-4) * f32(1/448)))`` in float32,
    exactly as DeepSeek's ``fast_log2_ceil`` reads it off the float's bits (exponent, +1 unless the mantissa
    is zero)."""
    x = np.maximum(np.asarray(amax, dtype=F32), F32(FP8_AMAX_FLOOR)) * _FP8_MAX_INV
    m, e = np.frexp(x)  # x = m * 2^e, 0.5 <= m < 1: a power of two has m == 0.5, log2 = e - 1 exactly
    return np.where(m == 0.5, e - 1, e).astype(np.int32)


def encode_fp8_e8m0(
    w: np.ndarray, block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``w[O, I]`` -> ``(e4m3fn codes uint8 [O, I], E8M0 bytes uint8 [ceil(O/br), ceil(I/bc)])``.

    Per ``block`` = ``(br, bc)`` block (128x128 for fp8-e4m3-e8m0, 32x32 for -t32, 1x32 for -r32; edge blocks
    partial): ``k`` by ``e8m0_block_exponents``, byte ``k + 127``; codes are ``w * 2^-k`` (exact: a power-of-two
    scaling) clamped to +-448 and rounded to e4m3fn to nearest, ties to even (ml_dtypes' cast; subnormal codes
    included). Vectorised over blocks: the zero padding of partial edge blocks changes no block's amax."""
    O, I = w.shape
    br, bc = block
    GO, GI = ceil_div(O, br), ceil_div(I, bc)
    padded = np.zeros((GO * br, GI * bc), dtype=F32)
    padded[:O, :I] = w
    blocks = padded.reshape(GO, br, GI, bc)
    amax = np.abs(blocks).max(axis=(1, 3)) if O and I else np.zeros((GO, GI), F32)
    k = e8m0_block_exponents(amax)
    kk = np.repeat(np.repeat(k, br, axis=0), bc, axis=1)[:O, :I]
    r = np.clip(np.ldexp(np.asarray(w, dtype=F32), -kk).astype(F32), -E4M3_MAX, E4M3_MAX)
    codes = r.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.ascontiguousarray(codes), (k + 127).astype(np.uint8)


def e8m0_to_f32(scale: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> float32 ``2^(byte - 127)`` (the one table ``E8M0_TO_F32``)."""
    return E8M0_TO_F32[np.asarray(scale, dtype=np.uint8)]


def decode_fp8_e8m0(
    codes: np.ndarray, scales: np.ndarray, O: int, I: int, block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
) -> np.ndarray:
    """``e4m3(code) * 2^(byte - 127)`` per ``block`` (``(br, bc)``, default 128x128), float32 ``[O, I]`` (one
    multiply per element)."""
    grid = e8m0_to_f32(np.asarray(scales).reshape(-1)).reshape(ceil_div(O, block[0]), ceil_div(I, block[1]))
    return dequant_fp8_block(np.asarray(codes).reshape(O, I), grid, block)


# ------------------------------------------------------------------------------------------ float tensors
def encode_bf16(w: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16, round to nearest even (ml_dtypes' cast)."""
    return w.astype(ml_dtypes.bfloat16)


# ----------------------------------------------------------------------- natively quantized sources (§5)
# Decoders of the source encodings colitools reads (never writes): each returns float32 ``[..., O, I]`` and
# uses the one E2M1 / E8M0 / e4m3fn tables above. E8M0 byte 0xFF decodes as 2^128 = inf (the table), so a
# non-zero code gives +-inf and code 0 / 8 gives NaN, as the producers' decoders do; the converter refuses a
# non-finite decoded weight and a native copy of a 0xFF scale (docs/FORMATS.md §5).
NVFP4_BLOCK = 16
MXFP8_BLOCK = 32


def unpack_nibbles(packed: np.ndarray, I: int) -> np.ndarray:
    """Nibbles (0..15) of a little-endian packed byte row ``[..., B]``: element ``2j`` = low nibble of byte
    ``j``, ``2j + 1`` = high nibble; the first ``I`` elements ``[..., I]``."""
    b = np.ascontiguousarray(packed).view(np.uint8)
    codes = np.empty((*b.shape[:-1], 2 * b.shape[-1]), dtype=np.uint8)
    codes[..., 0::2] = b & 0x0F
    codes[..., 1::2] = b >> 4
    return codes[..., :I]


def decode_mxfp4_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """gpt-oss MXFP4: ``blocks`` U8 ``[..., O, I/32, 16]``, ``scales`` U8 (E8M0) ``[..., O, I/32]`` ->
    ``e2m1(nib) * 2^(e - 127)`` float32 ``[..., O, I]`` (one float32 multiply)."""
    *lead, O, B, _ = blocks.shape
    codes = unpack_nibbles(blocks.reshape(*lead, O, B * 16), B * 32)
    s = E8M0_TO_F32[np.asarray(scales, dtype=np.uint8)]
    with np.errstate(invalid="ignore", over="ignore"):  # E8M0 0xFF: inf / NaN, as documented
        return E2M1_SIGNED[codes] * np.repeat(s, MXFP4_BLOCK, axis=-1)


def mxfp4_blocks_to_packed(blocks: np.ndarray) -> np.ndarray:
    """gpt-oss ``_blocks [..., O, I/32, 16]`` -> mxfp4 ``weight_packed [..., O, I/2]``: the same bytes (byte
    ``j`` of block ``b`` holds elements ``32b + 2j`` (low) and ``32b + 2j + 1`` (high) in both)."""
    *lead, O, B, K = blocks.shape
    return np.ascontiguousarray(blocks, dtype=np.uint8).reshape(*lead, O, B * K)


def int32_nibbles_to_pairs(packed: np.ndarray, I: int) -> np.ndarray:
    """compressed-tensors ``weight_packed`` I32 ``[O, ceil(I/8)]`` (eight nibbles per int32, lowest bits
    first) -> int4 pairs bytes ``[O, ceil(I/2)]``: the int32's little-endian bytes are already pairs; for odd
    ``I`` the unused high nibble of the last byte is set to 8 (the pairs rule, §2.2)."""
    b = np.ascontiguousarray(packed).astype("<i4", copy=False).view(np.uint8).reshape(packed.shape[0], -1)
    out = np.ascontiguousarray(b[:, : ceil_div(I, 2)])
    if I % 2:
        out[:, -1] = (out[:, -1] & 0x0F) | 0x80
    return out


def decode_pack_quantized(packed: np.ndarray, scale: np.ndarray, I: int, g: int) -> np.ndarray:
    """INT4 compressed-tensors ``pack-quantized`` (symmetric): ``weight_packed`` I32 ``[O, ceil(I/8)]``
    storing ``q + 8``, ``weight_scale`` (BF16/F16/F32) ``[O, ceil(I/g)]`` -> ``f32(q) * f32(s)``."""
    O = packed.shape[0]
    q = unpack_nibbles(np.ascontiguousarray(packed).astype("<i4", copy=False).view(np.uint8), I)
    v = q.astype(np.int8).astype(F32) - F32(8)
    s = np.repeat(np.asarray(scale).astype(F32).reshape(O, -1), g, axis=1)[:, :I]
    return v * s


def decode_nvfp4(packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray, I: int) -> np.ndarray:
    """modelopt NVFP4: ``packed`` U8 ``[O, I/2]`` E2M1 (low nibble = even element), ``scale`` e4m3fn bytes
    ``[O, I/16]``, ``scale_2`` F32 scalar -> ``e2m1(nib) * e4m3(scale) * scale_2`` (float32, left to right)."""
    O = packed.shape[0]
    codes = unpack_nibbles(packed.reshape(O, -1), I)
    s = E4M3_TO_F32[np.ascontiguousarray(scale).view(np.uint8).reshape(O, -1)]
    s = np.repeat(s, NVFP4_BLOCK, axis=1)[:, :I]
    with np.errstate(invalid="ignore", over="ignore"):  # e4m3 NaN scale bytes give NaN, as documented
        return (E2M1_SIGNED[codes] * s) * F32(np.asarray(scale_2, dtype=F32).reshape(()))


def dequant_fp8_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """FP8 with one scale per output row (``scale`` ``[O, 1]``) or per tensor (``[1]`` / ``[]``), F32 / BF16 / F16:
    ``w[r, c] = f32(e4m3(q[r, c])) * f32(s[r])``, one float32 multiply per element (compressed-tensors
    ``float-quantized``, docs/FORMATS.md §5)."""
    O = q.shape[0]
    values = E4M3_TO_F32[np.ascontiguousarray(q).view(np.uint8)]
    s = np.asarray(scale).astype(F32).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN codes stay NaN, as the encoders refuse them
        return values * (s.reshape(O, 1) if s.size == O and s.size != 1 else s.reshape(()))


def decode_mxfp8(q: np.ndarray, scale: np.ndarray, I: int) -> np.ndarray:
    """MXFP8: e4m3fn bytes ``[O, I]``, E8M0 ``scale`` U8 ``[O, ceil(I/32)]`` -> ``e4m3(b) * 2^(e - 127)``."""
    O = q.shape[0]
    v = E4M3_TO_F32[np.ascontiguousarray(q).view(np.uint8).reshape(O, I)]
    s = np.repeat(E8M0_TO_F32[np.asarray(scale, dtype=np.uint8).reshape(O, -1)], MXFP8_BLOCK, axis=1)[:, :I]
    with np.errstate(invalid="ignore", over="ignore"):
        return v * s


def decode_pack_quantized_general(
    packed: np.ndarray,
    scale: np.ndarray,
    I: int,
    g: int,
    zero_point: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
) -> np.ndarray:
    """INT4 ``pack-quantized``, asymmetric and/or act-order: ``(f32(q) - f32(z)) * f32(s)`` as compressed-tensors
    computes it (float32 scales). ``zero_point`` I32 ``[ceil(O/8), G]`` is packed along the rows (``q + 8``,
    lowest bits first); ``g_idx`` I32 ``[I]`` gives each input's group (default ``i // g``)."""
    O = packed.shape[0]
    q = unpack_nibbles(np.ascontiguousarray(packed).astype("<i4", copy=False).view(np.uint8), I)
    v = q.astype(F32) - F32(8)
    s = np.asarray(scale).astype(F32).reshape(O, -1)
    cols = np.arange(I) // g if g_idx is None else np.asarray(g_idx).astype(np.int64).reshape(I)
    if zero_point is not None:
        zp = np.ascontiguousarray(np.asarray(zero_point).astype("<i4").T)  # [G, ceil(O/8)]
        z = unpack_nibbles(zp.view(np.uint8), O).T.astype(F32) - F32(8)  # [O, G]
        v = v - z[:, cols]
    return v * s[:, cols]
