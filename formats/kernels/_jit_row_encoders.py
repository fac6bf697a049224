"""Row encoders: one float32 row (or whole groups of it, straight from BF16 bits) to codes and scales, and
``_encode_row``, the format-code dispatch the encode drivers call."""

from __future__ import annotations

import numpy as np

from colitools.formats.kernels._jit_bits import (
    _E2M1_SIGNED_F64,
    _FLOOR,
    _GATHER8,
    _H2,
    _H3,
    _H4,
    _H8,
    _INT3_G64,
    _INT4_GROUPED,
    _INT4_ROW,
    _INT8_ROW,
    _L2,
    _L3,
    _L4,
    _L8,
    _LSB8,
    _MXFP4,
    _NONFINITE_BITS,
    _Q1,
    _Q3,
    _Q7,
    _Q127,
    _SIX,
    _U2,
    _U56,
    _abs_bits,
    _bits_f32,
    _e2m1_code,
    _half,
    _pack_quad,
    _q,
    _sym_scale,
    _umax32,
    inline,
    njit,
)


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


@inline
def _u16_f32(h, half):
    """16-bit source bits -> float32, exactly: BF16 (``half`` False: the bits << 16) or F16 (``_half``).
    ``half`` is a literal at every call, so each caller compiles one branch."""
    if half:
        return _half(h)
    return _bits_f32(np.uint32(h) << 16)


@inline
def _int4_blocks_u16(wg, cg, scales, half):
    """``_int4_blocks`` straight from BF16 / F16 bits ``wg [G, gs]`` (uint16, even gs), no float32 row buffer:
    both order their magnitudes as their bit patterns with the sign cleared (inf above every finite value, NaN
    above inf), so the amax is taken on the 16-bit patterns and upcast once."""
    G, gs = wg.shape
    bad = np.uint32(0)
    for g in range(G):
        m = np.uint32(0)
        for k in range(gs):  # 32-bit lanes (_umax32): numba's max would widen to 64 bits
            m = _umax32(m, np.uint32(wg[g, k] & np.uint16(0x7FFF)))
        mb = _abs_bits(_u16_f32(m, half))
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
            lo = _q(_u16_f32(wg[g, 2 * k], half), s, _L4, _H4) + 8
            hi = _q(_u16_f32(wg[g, 2 * k + 1], half), s, _L4, _H4) + 8
            cg[g, k] = np.uint8(lo | (hi << 4))
    return True


@njit
def _int4_blocks_bf16(wg, cg, scales):
    return _int4_blocks_u16(wg, cg, scales, False)


@njit
def _int4_blocks_f16(wg, cg, scales):
    return _int4_blocks_u16(wg, cg, scales, True)


@inline
def _int4_row_u16(row, codes, scales, gs, xt, ct, half):
    """One BF16 / F16 row to int4 groups of even ``gs``: whole groups from the bits, a partial last group upcast
    into the zero-padded ``xt`` (as ``_enc_groups``)."""
    n = row.size
    full = n // gs
    h = gs >> 1
    wg = row[: full * gs].reshape((full, gs))
    cg = codes[: full * h].reshape((full, h))
    if not (_int4_blocks_f16(wg, cg, scales) if half else _int4_blocks_bf16(wg, cg, scales)):
        return False
    rem = n - full * gs
    if rem:
        xt[:gs] = 0
        for i in range(rem):
            xt[i] = _u16_f32(row[full * gs + i], half)
        if not _int4_blocks(xt[:gs].reshape((1, gs)), ct[:h].reshape((1, h)), scales[full:], ct):
            return False
        tail = codes[full * h :]
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
