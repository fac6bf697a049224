"""The numba encode drivers of ``encoders`` (numba-free, which runs them on the kernels' thread pool, compiled
ahead of time or by numba's JIT, ``aot``): one per source (float32, BF16 bits, F16 bits, FP8 e4m3 bytes + block
scales)
and the fp8-e4m3-e8m0 block encoder, each registered beside its definition with its compiled-ahead arguments
(``aot.export``). The package's entry points of the same names, in ``_dispatch``, send small tensors to the numpy
reference instead."""

from __future__ import annotations

import numpy as np

from colitools.formats import reference as ref
from colitools.formats.kernels._jit_bits import (
    _E2M1_SIGNED_F64,
    _FLOOR,
    _GATHER8,
    _H3,
    _H4,
    _H8,
    _INT3_G64,
    _INT4_GROUPED,
    _INT8_ROW,
    _L3,
    _L4,
    _L8,
    _LSB8,
    _MXFP4,
    _NONFINITE_BITS,
    _Q127,
    _U2,
    _U56,
    F32,
    _abs_bits,
    _bits_f32,
    _dequant_fp8_row,
    _e2m1_code,
    _e4m3,
    _e4m3_finite,
    _f32_bits,
    _int3_planes32,
    _level_bytes32,
    _level_bytes64,
    _level_code,
    _mag_max8,
    _mag_max32,
    _mx_nibbles32,
    _pack_nibbles32,
    _pack_quad,
    _q,
    _sym_scale,
    _umax32,
    inline,
    njit,
)
from colitools.formats.kernels._jit_row_encoders import (
    _encode_row,
    _frexp_exponent,
    _int4_blocks,
    _int4_blocks_bf16,
    _int4_blocks_f16,
    _int4_row_u16,
    _pow2_f32,
    _u16_f32,
)
from colitools.formats.kernels.aot import export


# --------------------------------------------------------------------------------- encode drivers (per source)
# Each encodes rows [r0, r1) and returns the first row holding a non-finite value, or -1. The BF16 and FP8
# drivers materialise one row at a time in a float32 buffer (L2-resident) and encode it.
@njit
def _scratch(n, gs):
    """Per-thread buffers: quantised codes of a row/group (+ padding, a multiple of 8 for the uint16/32/64
    views), and a zero-padded float32 copy of a partial last group with room for its codes."""
    m = max(n, gs, 64) + 2
    return np.empty(((m + 72) >> 3) << 3, np.uint8), np.empty(m, np.float32), np.empty(m, np.uint8)


@export("rows_f32", ("float32", "i", "i", "uint8", "float32", "uint8"))
@njit
def _encode_rows_f32(w, fmt, gs, codes, sf, su, r0, r1):
    scratch, xt, ct = _scratch(w.shape[1], gs)
    for o in range(r0, r1):
        if not _encode_row(fmt, w[o], codes[o], sf[o], su[o], gs, scratch, xt, ct):
            return o
    return -1


@inline
def _encode_rows_u16(wb, fmt, gs, codes, sf, su, r0, r1, half):
    """BF16 (``half`` False) or F16 rows, as raw 16-bit patterns: int4 groups of even size straight from the
    bits, every other format upcast exactly a row at a time into a float32 buffer (L2-resident) and encoded:
    no float32 copy of the tensor. ``half`` is a literal in each driver below, so each compiles one decode."""
    n = wb.shape[1]
    buf = np.empty(n, np.float32)
    scratch, xt, ct = _scratch(n, gs)
    direct = fmt == _INT4_GROUPED and gs > 0 and gs % 2 == 0
    for o in range(r0, r1):
        row = wb[o]
        if direct:
            if n % gs == 0:
                G = n // gs
                wg, cg = row.reshape((G, gs)), codes[o].reshape((G, gs >> 1))
                if not (_int4_blocks_f16(wg, cg, sf[o]) if half else _int4_blocks_bf16(wg, cg, sf[o])):
                    return o
            elif not _int4_row_u16(row, codes[o], sf[o], gs, xt, ct, half):
                return o
            continue
        for i in range(n):
            buf[i] = _u16_f32(row[i], half)
        if not _encode_row(fmt, buf, codes[o], sf[o], su[o], gs, scratch, xt, ct):
            return o
    return -1


@export("rows_bf16", ("uint16", "i", "i", "uint8", "float32", "uint8"))
@njit
def _encode_rows_bf16(wb, fmt, gs, codes, sf, su, r0, r1):
    return _encode_rows_u16(wb, fmt, gs, codes, sf, su, r0, r1, False)


@export("rows_f16", ("uint16", "i", "i", "uint8", "float32", "uint8"))
@njit
def _encode_rows_f16(wh, fmt, gs, codes, sf, su, r0, r1):
    return _encode_rows_u16(wh, fmt, gs, codes, sf, su, r0, r1, True)


# ------------------------------------------------------------ int4 / int3 groups from FP8: codes by thresholds
# A group that lies in one source scale block has one ``sv``; its values are ``w = e4m3(q) * sv``, so
# ``|w| = e4m3(j) * |sv|`` with the magnitude byte ``j = q & 0x7F``. With the group's byte amax ``m`` and its
# scale ``s = f32(e4m3(m) * |sv|) / qmax`` above the floor, a value's level ``rint(|w| / s)`` is non-decreasing in
# ``j`` (each step rounds monotonically) and at most qmax, and it is the level of the exact ratio
# ``r = qmax * e4m3(j) / e4m3(m)`` whatever ``sv`` is, unless r is a half-integer. The float32 chain is two
# products and two quotients, each rounded to nearest. It does not underflow: ``s > 1e-8`` keeps every nonzero
# ``|w|`` above 2^-42. So it lies within 4 * 2^-24 (relative) of r, that is within 1.7e-6, because r <= qmax. Every
# r that is not a half-integer lies at least 0.0048 from one, and the table build asserts a 1e-4 margin. So the
# first byte of each level is a table per ``m`` (``_LEVELS``). The exception is at most one tie byte per level
# (``_TIES``), whose level the per-element rule decides once per (scale block, m) (``_make_levels``). A code is
# then byte compares (``_level_code``; ``_level_bytes32``: 32 lanes to a vector), with no
# division. A group whose scale is the floor (amax < 7e-8, an all-zero group for instance) takes the
# per-element rule. The tables are checked against the kernels' per-element rule for every amax byte, tie and
# sign (tests/formats/test_codecs_properties.py).
def _level_tables(qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``levels[m, k - 1]``: the first magnitude byte whose level is >= k in a group of byte amax ``m`` (127 for
    k > qmax), counting a tie byte as reaching it; ``ties[m, k - 1]``: that tie byte, or 255."""
    v = ref.E4M3_TO_F32[:127].astype(np.float64)  # magnitude bytes 0..126 (127 is NaN)
    levels = np.full((127, 8), 127, np.uint8)
    ties = np.full((127, 8), 255, np.uint8)
    for m in range(1, 127):
        r = qmax * v / v[m]  # within 1e-15 (relative) of the exact ratio; increasing in j
        for k in range(1, qmax + 1):
            levels[m, k - 1] = np.count_nonzero(r < k - 0.5 - 1e-4)
            near = np.flatnonzero(np.abs(r - (k - 0.5)) <= 1e-4)
            if near.size:
                assert near.size == 1 and near[0] == levels[m, k - 1], (qmax, m, k)
                ties[m, k - 1] = near[0]
    return levels, ties


_LEVELS7, _TIES7 = _level_tables(7)
_LEVELS3, _TIES3 = _level_tables(3)
_NO_TIE = np.uint8(255)
_E4M3_MAGS = np.ascontiguousarray(ref.E4M3_TO_F32[:128])  # magnitude byte -> value (127: NaN), the one table
_LEVEL_KEYS = 127  # thresholds rows per scale column: byte amaxes 0..126


@njit
def _level_cache(n, bc, gs):
    """Per-thread buffers of the threshold path for rows of ``n`` values, scale blocks ``bc`` wide, groups of
    ``gs``: thresholds per (scale column, byte amax) and the row block each was made for, the groups' byte
    amaxes, and the codes of one group (+ padding for the uint16/32/64 views)."""
    nc = (n + bc - 1) // bc
    codes = np.zeros(((max(gs, 64) + 8) >> 3) << 3, np.uint8)
    return (
        np.empty((nc * _LEVEL_KEYS, 8), np.uint8),
        np.full(nc * _LEVEL_KEYS, -1, np.int64),
        np.empty(n // max(gs, 1) + 1, np.uint8),
        codes,
    )


@njit
def _make_levels(levels, ties, qmax, thr, stamp, key, rb, m, asv, s):
    """Row ``key`` of ``thr``: the thresholds of byte amax ``m`` in the scale block of ``|sv| = asv`` and row
    block ``rb``, from the table, each tie byte decided by the per-element rule (called once per row block)."""
    for k in range(8):
        thr[key, k] = levels[m, k]
    for k in range(qmax):
        j = ties[m, k]
        if j != _NO_TIE and np.rint((_e4m3_finite(j) * asv) / s) < k + 1:
            thr[key, k] = j + 1
    stamp[key] = rb


@inline
def _fp8_group_scales(qrow, srow, gs, per, qmax, scales, mj):
    """Each group's byte amax into ``mj``, its scale ``max(amax / qmax, 1e-8)`` into ``scales`` (``_sym_scale``;
    the amax ``f32(e4m3(m)) * |sv|`` by a table load), ``per`` groups to a scale block: every amax, then every
    value, then every division, so each loop stays simple. False if an amax is not finite (inline: ``gs`` stays
    a literal where the caller's is)."""
    G = qrow.size // gs
    wide = gs % 32 == 0
    for g in range(G):
        m = np.uint8(0)
        if wide:
            for c in range(g * gs, (g + 1) * gs, 32):
                m = _mag_max8(m, _mag_max32(qrow, c))
        else:
            for k in range(g * gs, (g + 1) * gs):
                m = _mag_max8(m, qrow[k])
        mj[g] = m
    bad = np.uint32(0)
    cb = 0
    for g0 in range(0, G, per):
        asv = _bits_f32(_abs_bits(srow[cb]))
        cb += 1
        for g in range(g0, min(g0 + per, G)):
            mb = _abs_bits(_E4M3_MAGS[mj[g]] * asv)  # a load, not _e4m3's branches
            scales[g] = _bits_f32(mb)
            bad = _umax32(bad, mb)
    if bad >= _NONFINITE_BITS:
        return False
    for g in range(G):
        s = scales[g] / F32(qmax)  # _sym_scale
        scales[g] = s if s > _FLOOR else _FLOOR
    return True


@njit
def _int_groups_fp8(qrow, srow, bc, gs, crow, scales, rb, planes, levels, ties, thr, stamp, mj, cbuf):
    """The whole groups of one row: int4 (``planes`` False; ``_int4_blocks``: even gs, ``levels`` / ``ties`` =
    ``_LEVELS7`` / ``_TIES7``) or int3-g64 (``planes`` True; ``_int3_blocks``, gs 64, ``_LEVELS3`` / ``_TIES3``)
    straight from the e4m3 bytes ``qrow`` of row block ``rb`` into ``crow`` and ``scales``, each group lying in
    one scale block (``bc % gs == 0``), without a float32 row buffer. Codes by thresholds (above), 32 bytes to a
    vector when ``gs % 32 == 0``; the per-element rule for a group whose scale is the floor. ``cbuf`` holds one
    group's codes (one byte per value). The group loop is written out here, not in inline helpers: numba
    counts a reference to each array an inlined call takes, a round trip per group.

    The amax is taken on the bytes: ``byte & 0x7F`` orders e4m3fn magnitudes (0x7F is NaN) and float32
    multiplication by ``|sv|`` is monotone and sign-symmetric, so ``max |f32(e4m3(q)) * sv| ==
    f32(e4m3(max(q & 0x7F))) * |sv|`` bit for bit, NaN / inf included. Every amax, then every division (they
    overlap; ``_fp8_group_scales``), then the codes."""
    G = qrow.size // gs
    wide = gs % 32 == 0
    qmax, zero = (3, np.uint8(4)) if planes else (7, np.uint8(8))
    lo, hi = (_L3, _H3) if planes else (_L4, _H4)
    width = 24 if planes else gs >> 1  # code bytes per group
    per = bc // gs  # groups per scale block
    if not _fp8_group_scales(qrow, srow, gs, per, qmax, scales, mj):
        return False
    u32 = cbuf.view(np.uint32)
    u64 = cbuf.view(np.uint64)
    cb = 0
    for g0 in range(0, G, per):
        sv = srow[cb]
        asv = _bits_f32(_abs_bits(sv))
        flip = np.uint8(_f32_bits(sv) >> np.uint32(31))
        base = cb * _LEVEL_KEYS
        cb += 1
        for g in range(g0, min(g0 + per, G)):
            s = scales[g]
            q0, c0 = g * gs, g * width
            if s > _FLOOR:
                m = mj[g]
                key = base + m
                if stamp[key] != rb:
                    _make_levels(levels, ties, qmax, thr, stamp, key, rb, m, asv, s)
                if gs == 64:  # the two 32-byte halves share one load of the thresholds
                    _level_bytes64(qrow, q0, cbuf, 0, thr, key * 8, flip, zero)
                else:
                    t1, t2, t3, t4 = thr[key, 0], thr[key, 1], thr[key, 2], thr[key, 3]
                    t5, t6, t7 = thr[key, 4], thr[key, 5], thr[key, 6]
                    if wide:
                        for c in range(0, gs, 32):
                            _level_bytes32(qrow, q0 + c, cbuf, c, t1, t2, t3, t4, t5, t6, t7, flip, zero)
                    else:
                        for k in range(gs):
                            cbuf[k] = _level_code(qrow[q0 + k], t1, t2, t3, t4, t5, t6, t7, flip, zero)
            else:
                for k in range(gs):
                    cbuf[k] = np.uint8(
                        _q(_e4m3_finite(qrow[q0 + k]) * sv, s, lo, hi) + zero
                    )  # no NaN byte here
            if planes and wide:  # the planes as _int3_blocks packs them, 32 codes at a time
                _int3_planes32(cbuf, 0, crow, c0, c0 + 16)
                _int3_planes32(cbuf, 32, crow, c0 + 8, c0 + 20)
            elif planes:
                for b in range(16):
                    crow[c0 + b] = _pack_quad(u32[b])
                for b in range(8):
                    crow[c0 + 16 + b] = np.uint8((((u64[b] >> _U2) & _LSB8) * _GATHER8) >> _U56)
            elif wide:
                for c in range(0, gs, 32):
                    _pack_nibbles32(cbuf, c, crow, c0 + (c >> 1))
            else:
                for k in range(gs >> 1):  # byte k = code[2k] | code[2k+1] << 4
                    crow[c0 + k] = np.uint8(cbuf[2 * k] | (cbuf[2 * k + 1] << 4))
    return True


@njit
def _int8_row_fp8(qrow, srow, bc, codes, scales):
    """``_enc_int8_row`` straight from e4m3 bytes, without a float32 row buffer: the row's amax is the largest
    ``f32(e4m3(m_c)) * |sv_c|`` over its scale blocks' byte amaxes ``m_c`` (as ``_int_groups_fp8`` takes a
    group's), then each code from the value made again in registers. False if the row is not finite."""
    n = qrow.size
    full = n // bc
    qb = qrow[: full * bc].reshape((full, bc))
    cb2 = codes[: full * bc].reshape((full, bc))
    m = np.uint32(0)
    for c in range(full + (1 if n > full * bc else 0)):
        j = np.uint8(0)
        if c < full:
            for k in range(bc):
                j = _mag_max8(j, qb[c, k])
        else:
            for k in range(full * bc, n):
                j = _mag_max8(j, qrow[k])
        m = _umax32(m, _abs_bits(_e4m3(j) * _bits_f32(_abs_bits(srow[c]))))
    if m >= _NONFINITE_BITS:
        return False
    s = _sym_scale(m, _Q127)
    scales[0] = s
    for c in range(full):
        sv = srow[c]
        for k in range(bc):
            cb2[c, k] = np.uint8(_q(_e4m3_finite(qb[c, k]) * sv, s, _L8, _H8) & 0xFF)  # no NaN byte here
    if n > full * bc:
        sv = srow[full]
        for k in range(full * bc, n):
            codes[k] = np.uint8(_q(_e4m3_finite(qrow[k]) * sv, s, _L8, _H8) & 0xFF)
    return True


@inline
def _int4_row_fp8(qrow, srow, bc, codes, scales, gs, xt, ct, rb, levels, ties, thr, stamp, mj, cbuf):
    """One FP8 row to int4 groups of even ``gs`` with ``bc % gs == 0`` (a group lies in one scale block): whole
    groups from the bytes, a partial last group dequantised into the zero-padded ``xt`` (as ``_enc_groups``)."""
    n = qrow.size
    full = n // gs
    half = gs >> 1
    if not _int_groups_fp8(qrow, srow, bc, gs, codes, scales, rb, False, levels, ties, thr, stamp, mj, cbuf):
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


# ------------------------------------------------------------------------------------ mxfp4 from FP8 (§2.7)
# Every value of a source scale block is ``w = e4m3(q) * sv`` with one ``sv``, and for a block exponent ``e``
# the E2M1 index of ``|w| / 2^e`` (``_mx_codes``) is a non-decreasing function of the byte's magnitude
# ``j = q & 0x7F`` (``e4m3`` increases with ``j``, float32 multiplication and the division by a power of two
# round monotonically, the index counts bounds passed; ``|e4m3(q) * sv| == e4m3(j) * |sv|``). So seven
# thresholds per (scale block, exponent), found by binary search on the exact per-element rule, give every
# code by byte compares (``_mx_nibbles32``), 32 lanes at a time.
# A block's exponent e0, and whether e1 = e0 + 1 competes, depend on its amax byte ``m`` and ``|sv|`` only: they
# are made once per (scale block, m) (``ent``), so a block costs its amax, one table load and its codes.
# e1 competes only when the block's amax ``x = amax / 2^e0`` (in [4, 8)) is > 7, not > 6 as ``_enc_mxfp4``
# asks; the same decision: every element's e0 error is <= its e1 error when its ``x <= 7`` (``x <= 6``: the e0
# grid holds every e1 point <= 6, as ``_enc_mxfp4`` says; ``6 < x <= 7``: e0 saturates at 6, e1 rounds ``x / 2``
# in (3, 3.5] to 3, giving 6 again, or at 7 exactly to 4, giving 8: an error of 1 either way). The differences
# ``v * 2^e - w`` are exact in float64 (at most 29 significant bits), so the squares and the float64 sums in
# element order keep err1 >= err0, and e0 wins.
# The two-candidate rule (``_enc_mxfp4``): the float64 error sums in element order are compared only when a
# float32 sum of their differences, in any order, leaves it open; each difference is again a function of the
# byte, looked up in a table per (scale block, e0) (``_mx_gap_table``, a pool per row block). Scaled by 2^-2e0
# (exact), each term is ``(v1 - x)^2 - (v0 - x)^2`` with ``x = |w| * 2^-e0``; its float32 value and a float32 sum
# of 32 such terms in any order are within 2.2e-6 of the exact sum of ``(v1 - x)^2 + (v0 - x)^2`` (plus ~1e-43
# absolute from underflow), and that sum is at most 32 times its largest term over the bytes <= m (the table's
# second half, ``_mx_gap_table``), the reference's float64 sequential sums within 4e-15: a gap beyond
# ``_MX_REL_SLACK`` of that bound decides the same way.
_MX_E = 255  # exponents -127..127
_MX_T = 7 * 32  # thresholds of one (scale column, exponent): 7 runs of 32 equal bytes (_mx_nibbles32)
_MX_REL_SLACK = F32(1e-5)
_MX_ABS_SLACK = F32(1e-30)
_TWO = F32(2.0)
_SEVEN = F32(7.0)
_EIGHT = F32(8.0)
_EIGHTH = F32(0.125)
_MX_BOUNDS = ref._E2M1_BOUNDS  # E2M1 index bounds, and whether a value on one rounds down (the reference's)
_MX_TIE_DOWN = ref._E2M1_TIE_GOES_DOWN
_E2M1_MAGS = np.ascontiguousarray(ref.E2M1_SIGNED[:8])  # index -> magnitude
_MX_ROWS_MIN = 4096  # smaller scale blocks (per-row or 1x32 scales) would remake the thresholds too often
# Gap tables per scale column and row block: one per exponent e0 in competition. The amaxes of a scale block,
# e4m3(1..126) * |sv|, span less than 2^18, so at most 20 exponents occur; a full pool sends a block to the exact
# sums (never expected: a safety, not a path).
_MX_POOL = 24
_MX_ZERO = np.int64(-1)  # entry of an all-zero block (``ent``)
_MX_SLOT = np.int64((1 << 31) - 1)  # an entry's pool row field


@njit
def _mx_thresholds(thr, r, e, asv):
    """``thr[_MX_T r + 32 (t - 1):][:32] = t' - 1`` (32 copies, wrapping: 0 gives 255), ``t'``: the first
    magnitude byte (0..126, 127 if none) whose E2M1 index at ``e``, ``_e2m1_code(|w| / 2^e)``, is >= t (``_mx_nibbles32`` compares
    ``j > t' - 1``): the first byte whose ``x = (e4m3(j) * |sv|) * 2^-e`` passes bound t (index >= t means the
    bound t is passed, the bounds increasing), by binary search (``x`` increases with ``j``; multiplying by the
    exact inverse of a power of two rounds as dividing by it; a float compare of non-negative values is
    ``_e2m1_code``'s bit-pattern compare)."""
    inv = _pow2_f32(-e)
    lo = 0
    for t in range(7):
        bound = _MX_BOUNDS[t]
        down = _MX_TIE_DOWN[t]
        hi = 127  # j < lo: bound not passed; j >= hi: passed
        while lo < hi:
            mid = (lo + hi) >> 1
            x = (_E4M3_MAGS[mid] * asv) * inv
            if x > bound or (x == bound and not down):
                hi = mid
            else:
                lo = mid + 1
        below = np.uint8((lo + 255) & 255)
        for k in range(32):
            thr[_MX_T * r + 32 * t + k] = below


@njit
def _mx_e1_wins_exact(q3, o, b, asv, e0, e1, n):
    """``_mx_errs``' decision itself: float64 sums in element order (on magnitudes: the squares are equal)."""
    p0 = _pow2_f32(e0)
    p1 = _pow2_f32(e1)
    err0 = 0.0
    err1 = 0.0
    for k in range(n):
        a = _e4m3(q3[o, b, k] & np.uint8(0x7F)) * asv
        d0 = _E2M1_SIGNED_F64[_e2m1_code(a / p0)] * np.float64(p0) - np.float64(a)
        d1 = _E2M1_SIGNED_F64[_e2m1_code(a / p1)] * np.float64(p1) - np.float64(a)
        err0 += d0 * d0
        err1 += d1 * d1
    return err1 < err0


@inline
def _mx_slack(top):
    """The slack of a block whose largest summed term (``(2 v1 - x)^2 + (v0 - x)^2``) is at most ``top``."""
    return _MX_REL_SLACK * (F32(32.0) * top) + _MX_ABS_SLACK


@njit
def _mx_gap_table(dt, p, e0, asv, thr, r):
    """Pool row ``p``: per magnitude byte ``j``, with ``x = e4m3(j) * |sv| * 2^-e0`` (as the codes divide),
    ``(2 v1 - x)^2 - (v0 - x)^2`` in ``dt[p, j]`` (``v0`` / ``v1``: the E2M1 values e0 / e1 round to, from their
    thresholds, rows ``r`` and ``r + 1`` of ``thr``), float32: the difference of the scaled squared errors; in
    ``dt[p, 128 + m]`` the slack of a block whose amax byte is ``m``: ``_MX_REL_SLACK`` times 32 times the
    largest ``(2 v1 - x)^2 + (v0 - x)^2`` over the bytes <= m, plus ``_MX_ABS_SLACK``. Only the bytes a block of
    exponent e0 can hold are computed (``x < 8``: e0 is its amax's); below ``x <= 1/4`` both candidates round to
    0, so the difference is 0 and the sum ``2 x^2 <= 1/8`` (the running largest starts there)."""
    inv0 = _pow2_f32(-e0)
    t0 = np.int64(thr[_MX_T * r]) + 1 & 255  # the first byte of index 1 at e0: x > 1/4 from there on
    top = _EIGHTH
    for j in range(t0):
        dt[p, j] = 0
        dt[p, 128 + j] = _mx_slack(top)
    c0, c1 = 0, 0  # the indices at e0 and e1 of byte j: thresholds passed
    for j in range(t0, 127):
        x = (_E4M3_MAGS[j] * asv) * inv0
        if x >= _EIGHT:
            break
        while c0 < 7 and j >= (np.int64(thr[_MX_T * r + 32 * c0]) + 1 & 255):
            c0 += 1
        while c1 < 7 and j >= (np.int64(thr[_MX_T * (r + 1) + 32 * c1]) + 1 & 255):
            c1 += 1
        d0 = _E2M1_MAGS[c0] - x
        d1 = _E2M1_MAGS[c1] * _TWO - x
        dt[p, j] = d1 * d1 - d0 * d0
        top = max(top, d1 * d1 + d0 * d0)
        dt[p, 128 + j] = _mx_slack(top)


@njit
def _mxfp4_fp8_rows(q, s, br, bc, codes, su, r0, r1):
    """Rows ``[r0, r1)`` of mxfp4 from FP8 (``bc % 32 == 0``, ``I % 32 == 0``), byte-identical to
    ``_enc_mxfp4`` on the dequantised rows. Returns the first row holding a non-finite value, or -1.

    A row in three passes: every block's amax and entry (the competing blocks listed without a branch on
    them), the competing blocks' decisions, then every block's scale byte and codes. One pass with a branch per
    block on whether it competes (29% of ``quant.py``'s blocks, unpredictably) ran 8% slower at one thread
    and 17% at two, though it executed fewer instructions (bench/README). It is one function: moving the entry
    fill and the decisions into functions of their own (called per fill and per row) cost 3-5% at one thread."""
    O, I = q.shape
    B = I >> 5
    K = min(32, I)  # 32, opaque to LLVM: a literal 32 gets the block loops unrolled into branchy scalar code
    q3 = q.reshape((O, B, 32))
    c3 = codes.reshape((O, B, 16))
    NC = (I + bc - 1) // bc
    per = bc >> 5  # blocks per scale column
    thr = np.empty(NC * _MX_E * _MX_T, np.uint8)  # per (scale column, exponent): _mx_thresholds
    stamp = np.full(NC * _MX_E, -1, np.int64)  # the row block each (scale column, exponent) row was made for
    # per (scale column, amax byte): e0 + 127 | e1 competes << 8 | pool row << 9 | amax byte << 40
    ent = np.empty(NC * 128, np.int64)
    estamp = np.full(NC * 128, -1, np.int64)
    NP = _MX_POOL * NC
    dt = np.empty((NP, 256), F32)
    gslot = np.empty(NC * _MX_E, np.int64)
    gstamp = np.full(NC * _MX_E, -1, np.int64)
    pool_rb, used = -1, 0
    vb = np.empty(B, np.int64)  # per block of the row: its entry (e1 added when it wins)
    cand = np.empty(B + 1, np.int64)  # the row's competing blocks
    for o in range(r0, r1):
        rb = o // br
        qrow, crow, surow = q[o], codes[o], su[o]
        qw = qrow.view(np.uint32).reshape((B, 8))
        if rb != pool_rb:  # the pool's rows are this row block's
            pool_rb, used = rb, 0
        nc = 0
        for cb in range(NC):  # every block's amax and entry
            asv = _bits_f32(_abs_bits(s[rb, cb]))
            for b in range(cb * per, min(cb * per + per, B)):
                m = np.int64(_mag_max32(qrow, b << 5))
                key = cb * 128 + m
                if estamp[key] != rb:
                    mb = _abs_bits(_e4m3(m) * asv)  # the block's amax, as _enc_mxfp4 finds it
                    if mb >= _NONFINITE_BITS:
                        return o
                    v = _MX_ZERO
                    if mb != 0:
                        ex = _frexp_exponent(mb)
                        e = min(max(ex - 3, -127), 127)
                        r = cb * _MX_E + e + 127
                        if stamp[r] != rb:
                            _mx_thresholds(thr, r, e, asv)
                            stamp[r] = rb
                        v = np.int64(e + 127)
                        # e1 competes when amax / 2^e0 > 7 (above) and the clamp keeps it apart
                        if ex - 2 > -127 and _bits_f32(mb) * _pow2_f32(-e) > _SEVEN:
                            if stamp[r + 1] != rb:
                                _mx_thresholds(thr, r + 1, e + 1, asv)
                                stamp[r + 1] = rb
                            if gstamp[r] != rb:
                                gstamp[r] = rb
                                gslot[r] = used
                                if used < NP:
                                    _mx_gap_table(dt, used, e, asv, thr, r)
                                    used += 1
                            v |= (gslot[r] << 9) | 256
                    ent[key] = v if v == _MX_ZERO else v | (m << 40)
                    estamp[key] = rb
                v = ent[key]
                vb[b] = v
                cand[nc] = b  # a competing block joins the list (no branch on it)
                nc += (v >> 8) & 1 if v != _MX_ZERO else 0
        for i in range(nc):  # the competing blocks: e1 wins by the table's gap, or by the float64 sums
            b = cand[i]
            v = vb[b]
            e8 = v & 255
            p = (v >> 9) & _MX_SLOT
            wins = False
            undecided = p >= NP  # no table (a full pool)
            if not undecided:
                g0, g1, g2, g3 = F32(0.0), F32(0.0), F32(0.0), F32(0.0)
                for k in range(K >> 2):
                    w = qw[b, k] & np.uint32(0x7F7F7F7F)
                    g0 += dt[p, w & np.uint32(0xFF)]
                    g1 += dt[p, (w >> np.uint32(8)) & np.uint32(0xFF)]
                    g2 += dt[p, (w >> np.uint32(16)) & np.uint32(0xFF)]
                    g3 += dt[p, w >> np.uint32(24)]
                g = (g0 + g1) + (g2 + g3)
                slack = dt[p, 128 + (v >> 40)]
                wins = g < -slack
                undecided = not wins and g <= slack
            if undecided:
                asv = _bits_f32(_abs_bits(s[rb, (b << 5) // bc]))
                wins = _mx_e1_wins_exact(q3, o, b, asv, e8 - 127, e8 - 126, K)
            vb[b] = v + np.int64(wins)
        for cb in range(NC):  # every block's scale byte and codes
            neg = np.uint8(_f32_bits(s[rb, cb]) >> np.uint32(31))
            for b in range(cb * per, min(cb * per + per, B)):
                v = vb[b]
                if v == _MX_ZERO:  # all-zero block: scale byte 0, codes 0
                    surow[np.uint64(b)] = 0
                    for k in range(K >> 1):
                        c3[o, b, k] = 0
                    continue
                e8 = v & 255
                surow[np.uint64(b)] = np.uint8(e8)  # unsigned: no negative-index wrap
                _mx_nibbles32(qrow, b << 5, crow, b << 4, thr, _MX_T * (cb * _MX_E + e8), neg)
    return -1


@export("rows_fp8", ("uint8", "float32", "i", "i", "i", "i", "uint8", "float32", "uint8"))
@njit
def _encode_rows_fp8(q, s, br, bc, fmt, gs, codes, sf, su, r0, r1):
    if fmt == _MXFP4 and bc % 32 == 0 and bc >= 128 and br * bc >= _MX_ROWS_MIN:
        return _mxfp4_fp8_rows(q, s, br, bc, codes, su, r0, r1)
    return _fp8_rows_with(q, s, br, bc, fmt, gs, codes, sf, su, r0, r1, _fp8_buffers(q.shape[1], bc, fmt, gs))


@njit
def _fp8_buffers(n, bc, fmt, gs):
    """The per-thread buffers of ``_fp8_rows_with`` for rows of ``n`` values: a caller that encodes a few rows at
    a time keeps them (and so the thresholds made for the current row block) from call to call."""
    int3 = fmt == _INT3_G64 and n % 64 == 0 and bc % 64 == 0
    scratch, xt, ct = _scratch(n, gs)
    thr, stamp, mj, cbuf = _level_cache(n, bc, 64 if int3 else gs)
    return np.empty(n, np.float32), scratch, xt, ct, thr, stamp, mj, cbuf


@njit
def _fp8_rows_with(q, s, br, bc, fmt, gs, codes, sf, su, r0, r1, buffers):
    """Rows ``[r0, r1)`` of ``rows_fp8`` (any format but the mxfp4 threshold path) with ``_fp8_buffers``."""
    n = q.shape[1]
    buf, scratch, xt, ct, thr, stamp, mj, cbuf = buffers
    direct = fmt == _INT4_GROUPED and gs > 0 and gs % 2 == 0 and bc % gs == 0
    int3 = fmt == _INT3_G64 and n % 64 == 0 and bc % 64 == 0
    levels, ties = (_LEVELS3, _TIES3) if int3 else (_LEVELS7, _TIES7)
    for o in range(r0, r1):
        rb = o // br
        if int3:
            if not _int_groups_fp8(
                q[o], s[rb], bc, 64, codes[o], sf[o], rb, True, levels, ties, thr, stamp, mj, cbuf
            ):
                return o
            continue
        if fmt == _INT8_ROW:
            ok = (
                _int8_row_fp8(q[o], s[rb], 128, codes[o], sf[o])
                if bc == 128
                else _int8_row_fp8(q[o], s[rb], bc, codes[o], sf[o])
            )
            if not ok:
                return o
            continue
        if direct and gs == 64:  # the literal 64 compiles the experts' int4-g64 its own loops (~1.3x)
            if not _int4_row_fp8(
                q[o], s[rb], bc, codes[o], sf[o], 64, xt, ct, rb, levels, ties, thr, stamp, mj, cbuf
            ):
                return o
            continue
        if direct:
            if not _int4_row_fp8(
                q[o], s[rb], bc, codes[o], sf[o], gs, xt, ct, rb, levels, ties, thr, stamp, mj, cbuf
            ):
                return o
            continue
        _dequant_fp8_row(q[o], s[o // br], bc, buf)
        if not _encode_row(fmt, buf, codes[o], sf[o], su[o], gs, scratch, xt, ct):
            return o
    return -1


# ------------------------------------------------------------------------------------ fp8-e4m3-e8m0 (§2.9)
# reference.encode_fp8_e8m0 restated per 128x128 block (``ref.FP8_BLOCK``): amax, the E8M0 exponent k read off the float bits of
# max(amax, 1e-4) * f32(1/448) (as DeepSeek's fast_log2_ceil, = the reference's frexp rule), codes = e4m3fn
# round-to-nearest-even of clamp(w * 2^-k, +-448) (2^-k is exact for every k the floor allows: -22 <= k <= 120).
_FP8_B = ref.FP8_BLOCK  # 128
_E8M0_FLOOR = F32(ref.FP8_AMAX_FLOOR)
_E8M0_MAX_INV = ref._FP8_MAX_INV
_E4M3_MAX_F32 = F32(ref.E4M3_MAX)
_E4M3_MIN_NORMAL_BITS = np.uint32(0x3C800000)  # 2^-6, the smallest normal float8_e4m3fn
_E4M3_REBIAS = np.uint32(
    (127 - 7) << 3
)  # float32 exponent bias 127 -> e4m3 bias 7, in (exponent | 3 bits) units
_TWO9 = F32(512.0)  # 2^9: the e4m3 subnormal unit is 2^-9
_RNE_MAGIC = F32(8388608.0)  # 2^23: (y + 2^23) - 2^23 rounds 0 <= y < 2^22 to an integer, ties to even


@inline
def _e4m3_rne(y):
    """float32 ``y`` with ``|y| <= 448`` -> its float8_e4m3fn byte, rounded to nearest, ties to even (the
    ml_dtypes cast): normals by rounding the float32 bits at bit 20 (a carry into the exponent is the right
    next code), subnormals as ``rne(|y| * 2^9)`` units of 2^-9; the sign bit kept (-0.0 -> 0x80)."""
    u = _f32_bits(y)
    a = u & np.uint32(0x7FFFFFFF)
    sign = np.uint8((u >> np.uint32(24)) & np.uint32(0x80))
    if a >= _E4M3_MIN_NORMAL_BITS:
        r = a + np.uint32(0x7FFFF) + ((a >> np.uint32(20)) & np.uint32(1))
        return sign | np.uint8((r >> np.uint32(20)) - _E4M3_REBIAS)
    t = (_bits_f32(a) * _TWO9 + _RNE_MAGIC) - _RNE_MAGIC
    return sign | np.uint8(t)


@inline
def _e8m0_exponent(amax):
    """The E8M0 exponent ``k`` of a block of ``amax`` (``max(amax, 1e-4) * f32(1/448)``, rounded up to a power of
    two on its float bits)."""
    x = max(amax, _E8M0_FLOOR) * _E8M0_MAX_INV
    xb = _f32_bits(x)
    k = np.int32(xb >> np.uint32(23)) - np.int32(127)
    if xb & np.uint32(0x7FFFFF):
        k += np.int32(1)
    return k


@export("fp8_e8m0_fp8", ("uint8", "float32", "i", "i", "uint8", "uint8"))
@njit
def _fp8_e8m0_from_fp8(q, s, br, bc, codes, scales, b0, b1):
    """Block rows ``[b0, b1)`` of fp8-e4m3-e8m0 from FP8 ``q`` with source blocks ``br x bc`` that are multiples
    of 128 (each output block lies in one source block, of scale ``sv``): the values ``w = e4m3(q) * sv``
    (``reference.dequant_fp8_block``) made in registers, never stored. The block amax is taken on the bytes
    (``max(q & 0x7F)``: e4m3fn magnitudes order as their bytes, and multiplying by ``|sv|`` is monotone, so
    ``f32(e4m3(m)) * |sv|`` is ``max |w|`` bit for bit, NaN / inf included, as in ``_int_groups_fp8``). Returns
    the first block row holding a non-finite value, or -1.

    Each output block's code is a function of the source byte alone (``sv`` and ``k`` are the block's): one
    table of 256 codes per block, then a byte lookup per element. The table is made exactly by the per-element
    rule for the 127 magnitudes; a byte with the sign bit set gets its magnitude's code with the sign bit
    flipped (the product's sign is the byte's xor the scale's, zeros included, and the clamp and the rounding
    are symmetric). A block row is read row by row, twice (every column's largest magnitude byte, kept per
    column in ``colmax`` with no horizontal reduction, then every code): walking it block by block (128 short
    strides of 128 bytes) ran at a third of the speed."""
    O, I = q.shape
    GI = scales.shape[1]
    full = I // _FP8_B  # whole blocks per row, through [full, 128] views (loops from 0 vectorise)
    luts = np.empty((GI, 256), np.uint8)
    colmax = np.empty(I, np.uint8)
    for bo in range(b0, b1):
        o0 = bo * _FP8_B
        o1 = min(O, o0 + _FP8_B)
        colmax[:] = 0
        for o in range(o0, o1):
            qrow = q[o]
            for i in range(I):
                colmax[i] = _mag_max8(colmax[i], qrow[i])
        for bi in range(GI):
            m = np.uint8(0)
            for c in range(bi * _FP8_B, min(I, (bi + 1) * _FP8_B)):
                m = _mag_max8(m, colmax[c])
            sv = s[o0 // br, (bi * _FP8_B) // bc]
            asv = _bits_f32(_abs_bits(sv))
            amax_bits = _abs_bits(_E4M3_MAGS[m] * asv)
            if amax_bits >= _NONFINITE_BITS:
                return bo
            k = _e8m0_exponent(_bits_f32(amax_bits))
            scales[bo, bi] = np.uint8(k + np.int32(127))
            inv = _bits_f32(np.uint32(np.int32(127) - k) << np.uint32(23))  # 2^-k
            flip = np.uint8((_f32_bits(sv) >> np.uint32(24)) & np.uint32(0x80))
            for j in range(127):
                y = min((_E4M3_MAGS[j] * asv) * inv, _E4M3_MAX_F32)
                code = _e4m3_rne(y) | flip
                luts[bi, j] = code
                luts[bi, 128 + j] = code ^ np.uint8(0x80)
            luts[bi, 127] = 0  # NaN bytes: absent here (the amax above would be NaN)
            luts[bi, 255] = 0
        for o in range(o0, o1):
            qb = q[o, : full * _FP8_B].reshape((full, _FP8_B))
            cb = codes[o, : full * _FP8_B].reshape((full, _FP8_B))
            for bi in range(full):
                for i in range(_FP8_B):
                    cb[bi, i] = luts[bi, qb[bi, i]]
            if full < GI:
                qt = q[o, full * _FP8_B :]
                ct = codes[o, full * _FP8_B :]
                for i in range(qt.size):
                    ct[i] = luts[full, qt[i]]
    return -1


@export("fp8_e8m0", ("float32", "uint8", "uint8"))
@njit
def _fp8_e8m0_blocks(w, codes, scales, b0, b1):
    """Block rows ``[b0, b1)`` of ``w[O, I]`` (finite float32): E8M0 bytes into ``scales``, e4m3 codes into
    ``codes``. Returns -1 (the drivers' "no bad row")."""
    O, I = w.shape
    GI = scales.shape[1]
    for bo in range(b0, b1):
        o0 = bo * _FP8_B
        o1 = min(O, o0 + _FP8_B)
        for bi in range(GI):
            i0 = bi * _FP8_B
            i1 = min(I, i0 + _FP8_B)
            amax = F32(0.0)
            for o in range(o0, o1):
                for i in range(i0, i1):
                    v = abs(w[o, i])
                    if v > amax:
                        amax = v
            k = _e8m0_exponent(amax)
            scales[bo, bi] = np.uint8(k + np.int32(127))
            inv = _bits_f32(np.uint32(np.int32(127) - k) << np.uint32(23))  # 2^-k
            for o in range(o0, o1):
                for i in range(i0, i1):
                    y = min(max(w[o, i] * inv, -_E4M3_MAX_F32), _E4M3_MAX_F32)
                    codes[o, i] = _e4m3_rne(y)
    return -1
