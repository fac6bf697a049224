"""Fast numba codecs, byte-identical to the numpy reference in ``reference.py`` (FORMATS-SPEC §2).

Every encoder performs the reference's float32 operations in the same order: ``amax``, one float32 true
division ``amax / qmax``, the ``1e-8`` floor, then per element one float32 true division ``w / s``, ``np.rint``
(LLVM ``rint``: round half to even in the default rounding mode), clip, pack. mxfp4 sums its squared errors in
float64 in element order, like the reference's ``cumsum``. No ``fastmath``: nothing is reassociated.

Two tricks keep the kernels vectorised without changing a bit of output:

* ``amax`` is computed on the float32 *bit patterns* with the sign cleared: for non-negative floats, integer
  order is float order, so an unsigned integer max (which LLVM vectorises without fastmath) gives the same
  ``amax``; and every NaN/inf has bits ``>= 0x7F800000``, so the same pass detects non-finite input with no
  separate ``np.isfinite`` sweep. Only when a kernel reports a bad row does Python build the exact message.
* Fused sources: BF16 is upcast exactly (f32 bits = bf16 bits << 16); FP8 e4m3fn is decoded exactly by bit
  arithmetic (equal to the ml_dtypes table ``E4M3_TO_F32`` for all 256 bytes, tested; unlike a table lookup
  it vectorises) times the block scale (one float32 multiply, as ``reference.dequant_fp8_block``). Each row
  is materialised in a float32 buffer (L2-resident) and encoded from there, except for int4 groups of even
  size (int4-g64, the experts' format), which are encoded straight from the source bits: the group amax is
  taken on the BF16 bit patterns, or on the e4m3 bytes times the block scale (see ``_int4_blocks_fp8``), and
  each value is upcast / dequantised again in registers where it is quantised (~1.7x faster).
* Index and refcount hygiene: see "shared pieces" below.

Parallelism: the kernels are serial and release the GIL (``nogil``); ``_run_rows`` spreads row chunks over a
thread pool, using ``numba.get_num_threads()`` threads (so ``numba.set_num_threads`` / ``NUMBA_NUM_THREADS``
apply). Unlike a ``prange`` kernel this is safe to call from several Python threads at once.

Compile time: one specialisation per source (f32, bf16, fp8) for encoding, each dispatching on a format code,
and one per decoder; all cached on disk (``cache=True``).
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError, FormatError

__all__ = [
    "encode",
    "encode_from_bf16",
    "encode_from_fp8_block",
    "decode",
    "dequant_fp8_block",
    "pairs_to_planar",
    "planar_to_pairs",
    "E4M3_TO_F32",
]

_JIT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")
njit = numba.njit(**_JIT)
inline = numba.njit(inline="always", **_JIT)

F32 = np.float32
_FLOOR = ref.SCALE_FLOOR
_NONFINITE_BITS = np.uint32(0x7F800000)  # |x| bits >= this: inf or NaN
_Q127, _Q7, _Q3, _Q1 = F32(127), F32(7), F32(3), F32(1)
_SIX = F32(6)

# Format codes inside the kernels.
_INT8_ROW, _INT4_ROW, _INT2_ROW, _INT4_GROUPED, _INT3_G64, _MXFP4 = range(6)
_FMT_CODES = {
    "int8-row": _INT8_ROW,
    "int4-row": _INT4_ROW,
    "int2-row": _INT2_ROW,
    "int4-grouped": _INT4_GROUPED,
    "int3-g64": _INT3_G64,
    "mxfp4": _MXFP4,
}

# Exact e4m3fn -> float32 for every byte (0x7F / 0xFF are NaN, 0x7E = 448).
E4M3_TO_F32 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)
# E2M1 nibble -> float32 value (bit 3 = sign; code 8 is -0.0, as the reference's np.where(.., -mag, mag)).
_E2M1_F32 = np.concatenate([ref.E2M1_VALUES, -ref.E2M1_VALUES]).astype(F32)
_E2M1_SIGNED_F64 = _E2M1_F32.astype(np.float64)  # exact; code 8 (-0.0) gives the same error as +0.0
with np.errstate(over="ignore"):  # byte 255 -> 2^128 = inf, as np.ldexp in the reference decoder
    _E8M0_F32 = np.ldexp(F32(1), np.arange(256, dtype=np.int32) - 127).astype(F32)


# ------------------------------------------------------------------------------------------ bit intrinsics
@intrinsic
def _abs_bits(typingctx, x):
    """float32 -> its bit pattern with the sign bit cleared (uint32)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        return builder.and_(builder.bitcast(args[0], i32), ir.Constant(i32, 0x7FFFFFFF))

    return types.uint32(types.float32), codegen


@intrinsic
def _f32_bits(typingctx, x):
    """float32 -> its bit pattern (uint32)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, b):
    """Integer (low 32 bits) -> float32 with that bit pattern."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(b), codegen


@intrinsic
def _umax32(typingctx, a, b):
    """Unsigned max that stays 32-bit (numba would widen to 64 bits and halve the vector width)."""
    if a != types.uint32 or b != types.uint32:
        return None

    def codegen(context, builder, sig, args):
        x, y = args
        return builder.select(builder.icmp_unsigned(">", x, y), x, y)

    return types.uint32(types.uint32, types.uint32), codegen


# (bound bits, tie goes down): |r| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5, <= 2.5 -> 2,
# < 3.5 -> 3, <= 5 -> 4, else 6 (reference._E2M1_BOUNDS / _E2M1_TIE_GOES_DOWN).
_E2M1_RULE = [
    (int(F32(b).view(np.uint32)), bool(down))
    for b, down in zip(ref._E2M1_BOUNDS, ref._E2M1_TIE_GOES_DOWN, strict=True)
]


@intrinsic
def _e2m1_code(typingctx, r):
    """float32 r -> E2M1 nibble (uint8): the magnitude index counts the bounds |r| passes (compared as bit
    patterns: for non-negative floats unsigned integer order is float order), bit 3 = sign unless the index
    is 0 (a value that rounds to zero is code 0, never 8). Pure 32-bit integer ops, so it vectorises."""
    if r != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        mag = builder.and_(bits, ir.Constant(i32, 0x7FFFFFFF))
        idx = ir.Constant(i32, 0)
        for bound, tie_down in _E2M1_RULE:
            passed = builder.icmp_unsigned(">" if tie_down else ">=", mag, ir.Constant(i32, bound))
            idx = builder.add(idx, builder.zext(passed, i32))
        negative = builder.icmp_signed("<", bits, ir.Constant(i32, 0))  # sign bit (r is never NaN)
        nonzero = builder.icmp_unsigned("!=", idx, ir.Constant(i32, 0))
        sign = builder.zext(builder.and_(negative, nonzero), i32)
        code = builder.or_(idx, builder.shl(sign, ir.Constant(i32, 3)))
        return builder.trunc(code, ir.IntType(8))

    return types.uint8(types.float32), codegen


# ------------------------------------------------------------------------------------------- shared pieces
# Indexing discipline (speed only, never semantics): numba wraps negative indices, which turns a load at a
# computed index such as ``i0 + k`` into a gather and stops vectorisation, and a slice taken inside a loop
# costs atomic refcount updates. So a row is reshaped once into a 2-D ``[group, k]`` view and the hot loops
# index it with ``range()`` induction variables only, which LLVM proves non-negative. Small helpers are
# inlined at numba IR level (``inline="always"``) so literal arguments specialise them.
@inline
def _sym_scale(amax_bits, qmax):
    # s = max(amax / qmax, 1e-8): one float32 true division (reference._symmetric_scales).
    s = _bits_f32(amax_bits) / qmax
    return s if s > _FLOOR else _FLOOR


@inline
def _q(x, s, lo, hi):
    """clip(rint(x / s), lo, hi). |x / s| <= qmax + 1 always (s >= amax / qmax up to one rounding), so the
    int32 conversion before the clip is exact and equals the reference's float clip."""
    v = np.int32(np.rint(x / s))
    return min(max(v, lo), hi)


_L8, _L4, _L2, _L3 = np.int32(-128), np.int32(-8), np.int32(-2), np.int32(-4)
_H8, _H4, _H2, _H3 = np.int32(127), np.int32(7), np.int32(1), np.int32(3)
_LSB8 = np.uint64(0x0101010101010101)
_GATHER8 = np.uint64(0x0102040810204080)  # (x * this) >> 56 moves bit 8k of x to bit k, without carries
_U2, _U56 = np.uint64(2), np.uint64(56)


@inline
def _pack_quad(p):
    """Bits 0-1 of the four bytes of ``p`` (uint32, little endian) at shifts 0, 2, 4, 6."""
    return np.uint8((p & 3) | ((p >> 6) & 0xC) | ((p >> 12) & 0x30) | ((p >> 18) & 0xC0))


# ------------------------------------------------------------------------------------------ row encoders
# Each takes one float32 row ``x``, its codes/scales rows and a scratch buffer (>= I + 72 bytes, a multiple
# of 8, for the uint16/32/64 views); it returns False, without finishing, if the row holds a NaN/inf.
@njit
def _enc_int8_row(x, codes, scales):
    m = np.uint32(0)
    for i in range(x.size):
        m = _umax32(m, _abs_bits(x[i]))
    if m >= _NONFINITE_BITS:
        return False
    s = _sym_scale(m, _Q127)
    scales[0] = s
    for i in range(x.size):
        codes[i] = np.uint8(_q(x[i], s, _L8, _H8) & 0xFF)  # two's complement int8 viewed as U8
    return True


@njit
def _enc_int2_row(x, codes, scales, u):
    n = x.size
    m = np.uint32(0)
    for i in range(n):
        m = _umax32(m, _abs_bits(x[i]))
    if m >= _NONFINITE_BITS:
        return False
    s = _sym_scale(m, _Q1)
    scales[0] = s
    for i in range(n):
        u[i] = np.uint8(_q(x[i], s, _L2, _H2) + 2)
    for i in range(3):
        u[n + i] = 0  # unused tail bits are 0
    u32 = u.view(np.uint32)
    for j in range(codes.size):  # element i at byte i >> 2, bits 2 * (i & 3), LSB first
        codes[j] = _pack_quad(u32[j])
    return True


@njit
def _int4_blocks(xg, cg, scales, u):
    """Whole int4 groups: ``xg [G, gs]`` (even gs) -> ``scales[:G]`` and pair bytes ``cg [G, gs / 2]``.

    Three passes over the row (every group's amax, then every scale, then the codes packed straight from
    registers), so that no group's codes wait on the latency of its own scale division: the groups' work
    overlaps (about 1.2x the one-pass version). ``u`` is unused (the other block encoders' signature)."""
    G, gs = xg.shape
    bad = np.uint32(0)
    for g in range(G):
        m = np.uint32(0)
        for k in range(gs):
            m = _umax32(m, _abs_bits(xg[g, k]))
        scales[g] = _bits_f32(m)  # amax (finite here, or the row is refused below)
        bad = _umax32(bad, m)
    if bad >= _NONFINITE_BITS:
        return False
    for g in range(G):
        s = scales[g] / _Q7  # _sym_scale
        scales[g] = s if s > _FLOOR else _FLOOR
    for g in range(G):
        s = scales[g]
        for k in range(gs >> 1):  # byte k = (v[2k] + 8) | (v[2k+1] + 8) << 4
            lo = _q(xg[g, 2 * k], s, _L4, _H4) + 8
            hi = _q(xg[g, 2 * k + 1], s, _L4, _H4) + 8
            cg[g, k] = np.uint8(lo | (hi << 4))
    return True


@njit
def _int4_blocks_bf16(wg, cg, scales):
    """``_int4_blocks`` straight from BF16 bits ``wg [G, gs]`` (uint16, even gs), no float32 row buffer:
    |x| bits of the float32 upcast are ``(b & 0x7FFF) << 16``, so the amax is taken on the 16-bit patterns."""
    G, gs = wg.shape
    bad = np.uint32(0)
    for g in range(G):
        m = np.uint32(0)
        for k in range(gs):
            m = _umax32(m, np.uint32(wg[g, k] & np.uint16(0x7FFF)))
        mb = np.uint32(m << 16)
        scales[g] = _bits_f32(mb)
        bad = _umax32(bad, mb)
    if bad >= _NONFINITE_BITS:
        return False
    for g in range(G):
        s = scales[g] / _Q7  # _sym_scale
        scales[g] = s if s > _FLOOR else _FLOOR
    for g in range(G):
        s = scales[g]
        for k in range(gs >> 1):
            lo = _q(_bits_f32(np.uint32(wg[g, 2 * k]) << 16), s, _L4, _H4) + 8
            hi = _q(_bits_f32(np.uint32(wg[g, 2 * k + 1]) << 16), s, _L4, _H4) + 8
            cg[g, k] = np.uint8(lo | (hi << 4))
    return True


@inline
def _int4_row_bf16(row, codes, scales, gs, xt, ct):
    """One BF16 row to int4 groups of even ``gs``: whole groups from the bits, a partial last group upcast
    into the zero-padded ``xt`` (as ``_enc_groups``)."""
    n = row.size
    full = n // gs
    half = gs >> 1
    wg = row[: full * gs].reshape((full, gs))
    if not _int4_blocks_bf16(wg, codes[: full * half].reshape((full, half)), scales):
        return False
    rem = n - full * gs
    if rem:
        xt[:gs] = 0
        for i in range(rem):
            xt[i] = _bits_f32(np.uint32(row[full * gs + i]) << 16)
        if not _int4_blocks(xt[:gs].reshape((1, gs)), ct[:half].reshape((1, half)), scales[full:], ct):
            return False
        tail = codes[full * half :]
        tail[:] = ct[: tail.size]
    return True


@njit
def _int3_blocks(xg, cg, scales, u):
    """Whole int3 groups: ``xg [G, 64]`` -> ``scales[:G]`` and 24-byte groups ``cg [G, 24]``."""
    u32 = u.view(np.uint32)
    u64 = u.view(np.uint64)
    for g in range(xg.shape[0]):
        m = np.uint32(0)
        for k in range(64):
            m = _umax32(m, _abs_bits(xg[g, k]))
        if m >= _NONFINITE_BITS:
            return False
        s = _sym_scale(m, _Q3)
        scales[g] = s
        for k in range(64):
            u[k] = np.uint8(_q(xg[g, k], s, _L3, _H3) + 4)  # u = v + 4
        for b in range(16):  # low plane: bits 0-1 of value k at byte k >> 2, shift 2 * (k & 3)
            cg[g, b] = _pack_quad(u32[b])
        for b in range(8):  # high plane: bit 2 of value k at byte 16 + (k >> 3), bit k & 7
            cg[g, 16 + b] = np.uint8((((u64[b] >> _U2) & _LSB8) * _GATHER8) >> _U56)
    return True


@njit
def _enc_groups(kind, x, codes, scales, gs, group_bytes, u, xt, ct):
    """A row of whole groups of ``gs`` (``kind`` 4: int4 pairs, even gs; 3: int3-g64). A partial last group is
    encoded from a zero-padded copy ``xt``: zeros never raise amax and quantise to value 0, whose code is
    exactly the padding the spec asks for (nibble 8 for int4, code 4 for int3)."""
    n = x.size
    full = n // gs
    xg = x[: full * gs].reshape((full, gs))
    cg = codes[: full * group_bytes].reshape((full, group_bytes))
    if kind == 4:
        ok = _int4_blocks(xg, cg, scales, u)
    else:
        ok = _int3_blocks(xg, cg, scales, u)
    rem = n - full * gs
    if ok and rem:
        xt[:gs] = 0
        xt[:rem] = x[full * gs :]
        xtg = xt[:gs].reshape((1, gs))
        ctg = ct[:group_bytes].reshape((1, group_bytes))
        ts = scales[full:]
        ok = _int4_blocks(xtg, ctg, ts, u) if kind == 4 else _int3_blocks(xtg, ctg, ts, u)
        tail = codes[full * group_bytes :]
        tail[:] = ct[: tail.size]
    return ok


@njit
def _enc_int4_groups_odd(x, codes, scales, gs):
    """Odd ``gs`` (not a spec group size, kept for generality): groups start mid-byte, element by element."""
    n = x.size
    for g in range(scales.size):
        xs = x[g * gs : min(g * gs + gs, n)]
        m = np.uint32(0)
        for k in range(xs.size):
            m = _umax32(m, _abs_bits(xs[k]))
        if m >= _NONFINITE_BITS:
            return False
        s = _sym_scale(m, _Q7)
        scales[g] = s
        for k in range(xs.size):
            i = g * gs + k
            v = np.uint8(_q(xs[k], s, _L4, _H4) + 8)
            if i & 1:
                codes[i >> 1] |= np.uint8(v << 4)  # the even partner was stored before
            else:
                codes[i >> 1] = v | np.uint8(0x80) if i == n - 1 else v
    return True


@inline
def _mx_codes(xg, b, p, c):
    """E2M1 nibbles of block ``xg[b]`` for the power of two ``p = 2^e`` (r = w / p, float32 division)."""
    for k in range(32):
        c[k] = _e2m1_code(xg[b, k] / p)


@inline
def _mx_errs(xg, b, c0, p0, c1, p1):
    """Both candidates' sums of (decoded - w)^2 in float64, each accumulated in element order k = 0..31 (two
    independent chains in one loop, so their add latencies overlap; signed table lookups, no branches)."""
    err0 = 0.0
    err1 = 0.0
    for k in range(32):
        w = np.float64(xg[b, k])
        d0 = _E2M1_SIGNED_F64[c0[k]] * p0 - w
        d1 = _E2M1_SIGNED_F64[c1[k]] * p1 - w
        err0 += d0 * d0
        err1 += d1 * d1
    return err0, err1


@inline
def _pow2_f32(e):
    """2^e as float32 for -127 <= e <= 127, exact (2^-127 is the subnormal 0x00400000)."""
    return _bits_f32(np.uint32((e + 127) << 23)) if e > -127 else _bits_f32(np.uint32(0x00400000))


@inline
def _pow2_f64(e):
    """2^e as float64 (exact for any e the kernel uses)."""
    return np.float64(_pow2_f32(e))


@inline
def _frexp_exponent(bits):
    """``ex`` of ``frexp(amax) = (m, ex)``, 0.5 <= m < 1, from amax's bits (finite, non-zero)."""
    if bits >= np.uint32(0x00800000):  # normal: amax = 1.f * 2^(E - 127) = 0.1f * 2^(E - 126)
        return np.int64(bits >> 23) - 126
    ex = np.int64(-149)  # subnormal: amax = mant * 2^-149, ex = bit_length(mant) - 149
    while bits:
        bits >>= np.uint32(1)
        ex += 1
    return ex


@njit
def _enc_mxfp4(x, codes, scales, scratch):
    c0 = scratch[0:32]
    c1 = scratch[64:96]
    c0_16 = c0.view(np.uint16)
    c1_16 = c1.view(np.uint16)
    B = x.size >> 5
    xg = x.reshape((B, 32))
    cg = codes.reshape((B, 16))
    for b in range(B):
        m = np.uint32(0)
        for k in range(32):
            m = _umax32(m, _abs_bits(xg[b, k]))
        if m >= _NONFINITE_BITS:
            return False
        if m == 0:  # all-zero block: scale byte 0, codes 0
            scales[b] = 0
            for k in range(16):
                cg[b, k] = 0
            continue
        ex = _frexp_exponent(m)
        e0 = min(max(ex - 3, -127), 127)
        p0 = _pow2_f32(e0)
        _mx_codes(xg, b, p0, c0)
        use_e1 = False
        e1 = e0
        # Shortcut, byte-identical to always comparing: when amax / 2^e0 <= 6, e0 saturates nothing, and on
        # [0, 6 * 2^e0] the e0 grid contains every e1 grid point, so each element's e0 error is <= its e1
        # error; rounding is monotone, so the float64 sums keep err0 <= err1 and e0 wins (ties go to e0).
        if _bits_f32(m) / p0 > _SIX:
            e1 = min(max(ex - 2, -127), 127)
            _mx_codes(xg, b, _pow2_f32(e1), c1)
            err0, err1 = _mx_errs(xg, b, c0, _pow2_f64(e0), c1, _pow2_f64(e1))
            use_e1 = err1 < err0  # keep e1 only if strictly smaller
        scales[b] = np.uint8((e1 if use_e1 else e0) + 127)
        for k in range(16):  # low nibble = even column (no array is rebound in the loop: no refcounting)
            p = c1_16[k] if use_e1 else c0_16[k]
            cg[b, k] = np.uint8((p & 0xF) | ((p >> 4) & 0xF0))
    return True


@njit
def _encode_row(fmt, x, codes, sf, su, gs, scratch, xt, ct):
    if fmt == _INT4_GROUPED:
        if gs & 1:
            return _enc_int4_groups_odd(x, codes, sf, gs)
        return _enc_groups(4, x, codes, sf, gs, gs >> 1, scratch, xt, ct)
    if fmt == _INT4_ROW:  # one group of I (rounded up to even: an odd I pads like a partial group)
        g = x.size + (x.size & 1)
        return _enc_groups(4, x, codes, sf, g, g >> 1, scratch, xt, ct)
    if fmt == _INT8_ROW:
        return _enc_int8_row(x, codes, sf)
    if fmt == _INT3_G64:
        return _enc_groups(3, x, codes, sf, 64, 24, scratch, xt, ct)
    if fmt == _MXFP4:
        return _enc_mxfp4(x, codes, su, scratch)
    return _enc_int2_row(x, codes, sf, scratch)


# --------------------------------------------------------------------------------- encode drivers (per source)
# Each encodes rows [r0, r1) and returns the first row holding a non-finite value, or -1. The BF16 and FP8
# drivers materialise one row at a time in a float32 buffer (L2-resident) and encode it.
@njit
def _scratch(n, gs):
    """Per-thread buffers: quantised codes of a row/group (+ padding, a multiple of 8 for the uint16/32/64
    views), and a zero-padded float32 copy of a partial last group with room for its codes."""
    m = max(n, gs, 64) + 2
    return np.empty(((m + 72) >> 3) << 3, np.uint8), np.empty(m, np.float32), np.empty(m, np.uint8)


@njit
def _encode_rows_f32(w, fmt, gs, codes, sf, su, r0, r1):
    scratch, xt, ct = _scratch(w.shape[1], gs)
    for o in range(r0, r1):
        if not _encode_row(fmt, w[o], codes[o], sf[o], su[o], gs, scratch, xt, ct):
            return o
    return -1


@njit
def _encode_rows_bf16(wb, fmt, gs, codes, sf, su, r0, r1):
    n = wb.shape[1]
    buf = np.empty(n, np.float32)
    scratch, xt, ct = _scratch(n, gs)
    direct = fmt == _INT4_GROUPED and gs > 0 and gs % 2 == 0
    for o in range(r0, r1):
        row = wb[o]
        if direct:
            if n % gs == 0:
                G = n // gs
                if not _int4_blocks_bf16(row.reshape((G, gs)), codes[o].reshape((G, gs >> 1)), sf[o]):
                    return o
            elif not _int4_row_bf16(row, codes[o], sf[o], gs, xt, ct):
                return o
            continue
        for i in range(n):
            buf[i] = _bits_f32(np.uint32(row[i]) << 16)  # exact BF16 -> F32
        if not _encode_row(fmt, buf, codes[o], sf[o], su[o], gs, scratch, xt, ct):
            return o
    return -1


_E4M3_SUBNORMAL_UNIT = F32(2.0**-9)
_NAN = F32(np.nan)


@inline
def _e4m3(byte):
    """Exact e4m3fn byte -> float32 without a table gather (vectorises, and never feeds a subnormal float
    to the FPU). Equal to ``E4M3_TO_F32`` for all 256 bytes (tested)."""
    b = np.int32(byte)
    mag = b & 0x7F
    if mag < 8:  # zero and subnormals: m * 2^-9 (exact)
        v = np.float32(mag) * _E4M3_SUBNORMAL_UNIT
    else:  # exponent field e -> e + 120 (bias 7 -> 127), mantissa bits 3 -> 23
        v = _bits_f32((mag << 20) + (120 << 23))
    if mag == 0x7F:  # 0x7F / 0xFF: NaN (e4m3fn has no infinities)
        v = _NAN
    return _bits_f32(_f32_bits(v) | np.uint32((b & 0x80) << 24))


@inline
def _dequant_fp8_row(q, srow, bc, out):
    """out[c] = f32(e4m3(q[c])) * srow[c // bc]: one float32 multiply (reference.dequant_fp8_block)."""
    n = q.size
    full = n // bc
    qb = q[: full * bc].reshape((full, bc))
    ob = out[: full * bc].reshape((full, bc))
    for cb in range(full):
        sv = srow[cb]
        for k in range(bc):
            ob[cb, k] = _e4m3(qb[cb, k]) * sv
    if n > full * bc:
        sv = srow[full]
        qr = q[full * bc :]
        orow = out[full * bc :]
        for k in range(qr.size):
            orow[k] = _e4m3(qr[k]) * sv


@njit
def _int4_blocks_fp8(qg, srow, bc, cg, scales):
    """``_int4_blocks`` straight from e4m3 bytes ``qg [G, gs]`` (even gs, ``bc % gs == 0``: a group lies in one
    scale block), without a float32 row buffer. The amax is taken on the bytes: ``byte & 0x7F`` orders e4m3fn
    magnitudes (0x7F is NaN), and float32 multiplication by ``|sv|`` is monotone and sign-symmetric, so
    ``max |f32(e4m3(q)) * sv| == f32(e4m3(max(q & 0x7F))) * |sv|`` bit for bit, NaN/inf included."""
    G, gs = qg.shape
    bad = np.uint32(0)
    for g in range(G):
        m = np.uint32(0)
        for k in range(gs):
            m = _umax32(m, np.uint32(qg[g, k] & np.uint8(0x7F)))
        sv = srow[(g * gs) // bc]
        mb = _abs_bits(_e4m3(m) * _bits_f32(_abs_bits(sv)))
        scales[g] = _bits_f32(mb)
        bad = _umax32(bad, mb)
    if bad >= _NONFINITE_BITS:
        return False
    for g in range(G):
        s = scales[g] / _Q7  # _sym_scale
        scales[g] = s if s > _FLOOR else _FLOOR
    for g in range(G):
        s = scales[g]
        sv = srow[(g * gs) // bc]
        for k in range(gs >> 1):
            lo = _q(_e4m3(qg[g, 2 * k]) * sv, s, _L4, _H4) + 8
            hi = _q(_e4m3(qg[g, 2 * k + 1]) * sv, s, _L4, _H4) + 8
            cg[g, k] = np.uint8(lo | (hi << 4))
    return True


@inline
def _int4_row_fp8(qrow, srow, bc, codes, scales, gs, xt, ct):
    """One FP8 row to int4 groups of even ``gs`` with ``bc % gs == 0`` (a group lies in one scale block): whole
    groups from the bytes, a partial last group dequantised into the zero-padded ``xt`` (as ``_enc_groups``)."""
    n = qrow.size
    full = n // gs
    half = gs >> 1
    qg = qrow[: full * gs].reshape((full, gs))
    if not _int4_blocks_fp8(qg, srow, bc, codes[: full * half].reshape((full, half)), scales):
        return False
    rem = n - full * gs
    if rem:
        sv = srow[(full * gs) // bc]
        xt[:gs] = 0
        for i in range(rem):
            xt[i] = _e4m3(qrow[full * gs + i]) * sv
        if not _int4_blocks(xt[:gs].reshape((1, gs)), ct[:half].reshape((1, half)), scales[full:], ct):
            return False
        tail = codes[full * half :]
        tail[:] = ct[: tail.size]
    return True


@njit
def _encode_rows_fp8(q, s, br, bc, fmt, gs, codes, sf, su, r0, r1):
    n = q.shape[1]
    buf = np.empty(n, np.float32)
    scratch, xt, ct = _scratch(n, gs)
    direct = fmt == _INT4_GROUPED and gs > 0 and gs % 2 == 0 and bc % gs == 0
    for o in range(r0, r1):
        if direct:
            if n % gs == 0:
                G = n // gs
                cg = codes[o].reshape((G, gs >> 1))
                if not _int4_blocks_fp8(q[o].reshape((G, gs)), s[o // br], bc, cg, sf[o]):
                    return o
            elif not _int4_row_fp8(q[o], s[o // br], bc, codes[o], sf[o], gs, xt, ct):
                return o
            continue
        _dequant_fp8_row(q[o], s[o // br], bc, buf)
        if not _encode_row(fmt, buf, codes[o], sf[o], su[o], gs, scratch, xt, ct):
            return o
    return -1


# --------------------------------------------------------------------------------------------- decoders
@njit
def _decode_int8_rows(q, s, out, r0, r1):
    for o in range(r0, r1):
        sv = s[o]
        qo = q[o]
        oo = out[o]
        for i in range(oo.size):
            oo[i] = np.float32(qo[i]) * sv
    return -1


@njit
def _decode_int4_rows(codes, s, out, gs, r0, r1):
    """int4 pairs, one scale per ``gs`` inputs (``gs`` >= I for int4-row)."""
    n = out.shape[1]
    full = n // gs if gs % 2 == 0 else 0  # whole even groups as 2-D views (vectorises), the rest per element
    half = gs >> 1
    for o in range(r0, r1):
        so = s[o]
        cg = codes[o, : full * half].reshape((full, half))
        og = out[o, : full * gs].reshape((full, gs))
        for g in range(full):
            sv = so[g]
            for j in range(half):
                b = cg[g, j]
                og[g, 2 * j] = np.float32(np.int32(b & 15) - 8) * sv
                og[g, 2 * j + 1] = np.float32(np.int32(b >> 4) - 8) * sv
        co = codes[o]
        oo = out[o]
        for i in range(full * gs, n):
            nib = (co[i >> 1] >> ((i & 1) << 2)) & 15
            oo[i] = np.float32(np.int32(nib) - 8) * so[i // gs]
    return -1


@njit
def _decode_int2_rows(codes, s, out, r0, r1):
    for o in range(r0, r1):
        sv = s[o]
        co = codes[o]
        oo = out[o]
        for i in range(oo.size):
            c = (co[i >> 2] >> ((i & 3) << 1)) & 3
            oo[i] = np.float32(np.int32(c) - 2) * sv
    return -1


@njit
def _decode_int3_rows(codes, s, out, r0, r1):
    n = out.shape[1]
    G = s.shape[1]
    for o in range(r0, r1):
        cg = codes[o].reshape((G, 24))
        og = np.empty((G, 64), np.float32)  # whole groups, then trimmed to I
        for g in range(G):
            sv = s[o, g]
            for k in range(64):
                lo = (cg[g, k >> 2] >> ((k & 3) << 1)) & 3
                hi = (cg[g, 16 + (k >> 3)] >> (k & 7)) & 1
                og[g, k] = np.float32(np.int32(lo | (hi << 2)) - 4) * sv
        flat = og.reshape(G * 64)
        oo = out[o]
        for i in range(n):
            oo[i] = flat[i]
    return -1


@njit
def _decode_mxfp4_rows(packed, e8, vals, etab, out, r0, r1):
    for o in range(r0, r1):
        po = packed[o]
        eo = e8[o]
        oo = out[o]
        for i in range(oo.size):
            nib = (po[i >> 1] >> ((i & 1) << 2)) & 15
            oo[i] = vals[nib] * etab[eo[i >> 5]]
    return -1


@njit
def _dequant_fp8_rows(q, s, br, bc, out, r0, r1):
    for o in range(r0, r1):
        _dequant_fp8_row(q[o], s[o // br], bc, out[o])
    return -1


@njit
def _pairs_planar_rows(src, dst, to_planar, r0, r1):
    # planar64: byte k of a 32-byte block = element k (low nibble) | element k + 32 (high nibble).
    # pairs: element e at byte e >> 1, nibble e & 1.
    nb = src.shape[1] >> 5
    for o in range(r0, r1):
        sb = src[o].reshape((nb, 32))
        db = dst[o].reshape((nb, 32))
        for b in range(nb):
            for k in range(32):
                sh = (k & 1) << 2
                if to_planar:  # elements k and k + 32 sit in pairs bytes k >> 1 and 16 + (k >> 1)
                    db[b, k] = ((sb[b, k >> 1] >> sh) & 15) | (((sb[b, 16 + (k >> 1)] >> sh) & 15) << 4)
                else:  # elements 2k, 2k + 1 sit in planar bytes (2k) & 31, (2k + 1) & 31, nibble k >> 4
                    hs = (k >> 4) << 2
                    db[b, k] = ((sb[b, (2 * k) & 31] >> hs) & 15) | (
                        ((sb[b, (2 * k + 1) & 31] >> hs) & 15) << 4
                    )
    return -1


# ------------------------------------------------------------------------------------------ threading
_POOL: ThreadPoolExecutor | None = None
_MIN_PARALLEL_ELEMS = 1 << 18  # below this, threads cost more than they save
_CHUNK_ELEMS = 1 << 20  # rows per work item ~ this many elements (cache-friendly, few dispatches)


_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=max(1, numba.config.NUMBA_NUM_THREADS - 1), thread_name_prefix="colitools-kernel"
            )
        return _POOL


def _run_rows(kernel, args: tuple, O: int, I: int) -> int:
    """Run ``kernel(*args, r0, r1)`` over row chunks on ``numba.get_num_threads()`` threads (the calling
    thread included); return the smallest non-negative result (first bad row) or -1."""
    threads = min(numba.get_num_threads(), O, os.cpu_count() or 1)
    if threads <= 1 or O * I < _MIN_PARALLEL_ELEMS:
        return int(kernel(*args, 0, O))
    rows = max(1, min(_CHUNK_ELEMS // max(I, 1), -(-O // (4 * threads))))
    counter = itertools.count()

    def worker() -> int:
        bad = -1
        while True:
            r0 = next(counter) * rows  # itertools.count is atomic under the GIL
            if r0 >= O:
                return bad
            r = int(kernel(*args, r0, min(O, r0 + rows)))
            if r >= 0 and (bad < 0 or r < bad):
                bad = r

    futures = [_pool().submit(worker) for _ in range(threads - 1)]
    results = [worker()] + [f.result() for f in futures]
    bad = [r for r in results if r >= 0]
    return min(bad) if bad else -1


# ------------------------------------------------------------------------------------------ public API
def _plan(fmt_name: str, O: int, I: int, gs: int | None, name: str):
    """Format code, effective group size and the output arrays (codes, f32 scales, u8 scales)."""
    if fmt_name not in _FMT_CODES:  # f32, fp8-e4m3-b128 (passthrough), e8-iq3-lattice
        raise EncodeError(f"tensor {name or '?'}: format {fmt_name} cannot be written by colitools' encoders")
    fmt = _FMT_CODES[fmt_name]
    if fmt == _INT4_GROUPED and (not isinstance(gs, int | np.integer) or gs < 1):
        raise FormatError(f"tensor {name or '?'}: int4-grouped needs a positive group size, got {gs}")
    if fmt == _MXFP4 and I % ref.MXFP4_BLOCK:
        raise EncodeError(f"tensor {name or '?'}: mxfp4 needs I % 32 == 0, got I = {I}")
    row_bytes = {
        _INT8_ROW: I,
        _INT4_ROW: ref.ceil_div(I, 2),
        _INT4_GROUPED: ref.ceil_div(I, 2),
        _INT2_ROW: ref.ceil_div(I, 4),
        _INT3_G64: ref.ceil_div(I, 64) * ref.INT3_GROUP_BYTES,
        _MXFP4: I // 2,
    }[fmt]
    n_scales = {_INT4_GROUPED: ref.ceil_div(I, gs or 1), _INT3_G64: ref.ceil_div(I, 64)}.get(fmt, 1)
    codes = np.empty((O, row_bytes), np.uint8)
    if fmt == _MXFP4:
        sf, su = np.empty((O, 0), F32), np.empty((O, I // ref.MXFP4_BLOCK), np.uint8)
    else:
        sf, su = np.empty((O, n_scales), F32), np.empty((O, 0), np.uint8)
    return fmt, int(gs or 0), codes, sf, su


def _result(fmt: int, codes: np.ndarray, sf: np.ndarray, su: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if fmt == _MXFP4:
        return codes, su
    if fmt in (_INT8_ROW, _INT4_ROW, _INT2_ROW):
        return codes, sf.reshape(-1)
    return codes, sf


def _reference_encode(fmt_name: str, w: np.ndarray, gs: int | None) -> tuple[np.ndarray, np.ndarray]:
    if fmt_name == "int4-grouped":
        return ref.encode_int4_grouped(w, gs)
    return {
        "int8-row": ref.encode_int8_row,
        "int4-row": ref.encode_int4_row,
        "int2-row": ref.encode_int2_row,
        "int3-g64": ref.encode_int3_g64,
        "mxfp4": ref.encode_mxfp4,
    }[fmt_name](w)


def _raise_nonfinite(w_f32: np.ndarray, name: str) -> None:
    """Error path only: the registry's exact message (first bad [o, i] and the count)."""
    from colitools.formats.registry import _check_finite

    _check_finite(w_f32, name)
    raise EncodeError(f"tensor {name or '?'}: non-finite value")  # pragma: no cover (kernel/ref disagree)


def _matrix(a: np.ndarray, raw: type, exact: type, name: str) -> np.ndarray:
    """A 2-D C-contiguous view of ``a`` as the raw integer dtype ``raw`` (``a`` is ``raw`` or ``exact``)."""
    a = np.asarray(a)
    if a.ndim != 2:
        raise EncodeError(f"tensor {name or '?'}: expected a 2-D weight, got shape {list(a.shape)}")
    if a.dtype not in (np.dtype(raw), np.dtype(exact)):
        raise EncodeError(
            f"tensor {name or '?'}: expected {np.dtype(exact).name} or {np.dtype(raw).name}, got {a.dtype}"
        )
    return np.ascontiguousarray(a).view(raw)


def encode(fmt_name: str, w: np.ndarray, gs: int | None, *, name: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Encode float32 ``w[O, I]`` to ``(codes uint8 [O, row_bytes], scales)``, byte-identical to the reference.

    ``fmt_name`` is a format's stamp string (``int8-row``, ``int4-row``, ``int2-row``, ``int4-grouped`` with
    any ``gs``, ``int3-g64``, ``mxfp4``). The group-size writer rule is the caller's (the registry's) job.
    Raises EncodeError naming the tensor and the first bad ``[o, i]`` for NaN/inf input."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise EncodeError(f"tensor {name or '?'}: expected a 2-D weight, got shape {list(w.shape)}")
    w = np.ascontiguousarray(w, dtype=F32)
    O, I = w.shape
    fmt, g, codes, sf, su = _plan(fmt_name, O, I, gs, name)
    if w.size == 0:
        return _reference_encode(fmt_name, w, gs)
    if _run_rows(_encode_rows_f32, (w, fmt, g, codes, sf, su), O, I) >= 0:
        _raise_nonfinite(w, name)
    return _result(fmt, codes, sf, su)


def encode_from_bf16(
    fmt_name: str, w_bf16: np.ndarray, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``encode(fmt_name, bf16 -> f32, gs)`` with the exact upcast fused in. ``w_bf16`` is ``[O, I]`` uint16
    (the raw BF16 bits) or ``ml_dtypes.bfloat16``."""
    wb = _matrix(w_bf16, np.uint16, ml_dtypes.bfloat16, name)
    O, I = wb.shape
    fmt, g, codes, sf, su = _plan(fmt_name, O, I, gs, name)
    if wb.size == 0:
        return _reference_encode(fmt_name, wb.view(ml_dtypes.bfloat16).astype(F32), gs)
    if _run_rows(_encode_rows_bf16, (wb, fmt, g, codes, sf, su), O, I) >= 0:
        _raise_nonfinite(wb.view(ml_dtypes.bfloat16).astype(F32), name)
    return _result(fmt, codes, sf, su)


def _block(block) -> tuple[int, int]:
    br, bc = (block, block) if isinstance(block, int | np.integer) else tuple(block)
    if br < 1 or bc < 1:
        raise FormatError(f"FP8 block size must be positive, got {block}")
    return int(br), int(bc)


def _fp8_operands(q, scale_inv, block, name: str):
    q = _matrix(q, np.uint8, ml_dtypes.float8_e4m3fn, name)
    br, bc = _block(block)
    M, N = q.shape
    grid = (ref.ceil_div(M, br), ref.ceil_div(N, bc))
    s = np.ascontiguousarray(np.asarray(scale_inv).astype(F32))
    if s.size != grid[0] * grid[1]:
        raise EncodeError(
            f"tensor {name or '?'}: FP8 scale_inv has shape {list(s.shape)}, expected {list(grid)} "
            f"for [{M}, {N}] with {br}x{bc} blocks"
        )
    return q, s.reshape(grid), br, bc


def encode_from_fp8_block(
    fmt_name: str, q: np.ndarray, scale_inv: np.ndarray, block, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``encode(fmt_name, reference.dequant_fp8_block(q, scale_inv, block), gs)`` with the dequant fused in.

    ``q`` is ``[O, I]`` e4m3fn bytes (uint8 or ``ml_dtypes.float8_e4m3fn``), ``scale_inv`` F32/BF16
    ``[ceil(O/br), ceil(I/bc)]``, ``block`` an int or ``(br, bc)``."""
    q, s, br, bc = _fp8_operands(q, scale_inv, block, name)
    O, I = q.shape
    fmt, g, codes, sf, su = _plan(fmt_name, O, I, gs, name)
    if q.size == 0:
        return _reference_encode(fmt_name, ref.dequant_fp8_block(q, s, (br, bc)), gs)
    if _run_rows(_encode_rows_fp8, (q, s, br, bc, fmt, g, codes, sf, su), O, I) >= 0:
        with np.errstate(all="ignore"):  # the error path: inf * 0 and overflow are expected here
            w = ref.dequant_fp8_block(q, s, (br, bc))
        _raise_nonfinite(w, name)
    return _result(fmt, codes, sf, su)


def dequant_fp8_block(q: np.ndarray, scale_inv: np.ndarray, block=(128, 128)) -> np.ndarray:
    """Fast ``reference.dequant_fp8_block`` (bit-identical)."""
    q, s, br, bc = _fp8_operands(q, scale_inv, block, "")
    out = np.empty(q.shape, F32)
    _run_rows(_dequant_fp8_rows, (q, s, br, bc, out), *q.shape)
    return out


def decode(
    fmt_name: str, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None = None
) -> np.ndarray:
    """Decode to float32 ``[O, I]``, bit-identical to the reference decoders (``fp8-e4m3-b128`` included)."""
    out = np.empty((O, I), F32)
    if O * I == 0:
        return out
    c = np.ascontiguousarray(codes, dtype=np.uint8)
    if fmt_name == "int8-row":
        args = (c.reshape(O, I).view(np.int8), _f32(scales).reshape(O), out)
        kernel = _decode_int8_rows
    elif fmt_name in ("int4-row", "int4-grouped"):
        if fmt_name == "int4-grouped" and not gs:
            raise FormatError("int4-grouped decode needs the group size")
        g = I if fmt_name == "int4-row" else int(gs)
        args = (c.reshape(O, -1), _f32(scales).reshape(O, ref.ceil_div(I, g)), out, g)
        kernel = _decode_int4_rows
    elif fmt_name == "int2-row":
        args, kernel = (c.reshape(O, -1), _f32(scales).reshape(O), out), _decode_int2_rows
    elif fmt_name == "int3-g64":
        args = (c.reshape(O, -1), _f32(scales).reshape(O, ref.ceil_div(I, 64)), out)
        kernel = _decode_int3_rows
    elif fmt_name == "mxfp4":
        e8 = np.ascontiguousarray(scales, dtype=np.uint8).reshape(O, I // ref.MXFP4_BLOCK)
        args, kernel = (c.reshape(O, I // 2), e8, _E2M1_F32, _E8M0_F32, out), _decode_mxfp4_rows
    elif fmt_name == "fp8-e4m3-b128":
        return dequant_fp8_block(c.reshape(O, I), scales, (ref.FP8_BLOCK, ref.FP8_BLOCK))
    else:
        raise FormatError(f"no fast decoder for format {fmt_name!r}")
    _run_rows(kernel, args, O, I)
    return out


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=F32)


def _planar(codes: np.ndarray, to_planar: bool) -> np.ndarray:
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    if codes.ndim != 2 or (2 * codes.shape[1]) % 64:
        raise FormatError(
            f"planar64-v8 needs int4 codes [O, I/2] with I % 64 == 0, got shape {list(codes.shape)}"
        )
    out = np.empty_like(codes)
    _run_rows(_pairs_planar_rows, (codes, out, to_planar), codes.shape[0], 2 * codes.shape[1])
    return out


def pairs_to_planar(codes: np.ndarray) -> np.ndarray:
    """Fast ``planar.pairs_to_planar`` (byte-identical)."""
    return _planar(codes, True)


def planar_to_pairs(codes: np.ndarray) -> np.ndarray:
    """Fast ``planar.planar_to_pairs`` (byte-identical)."""
    return _planar(codes, False)
