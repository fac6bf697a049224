"""The numba kernel of the ``mse`` group search (``formats/quantizers.py``, FORMATS §11), byte-identical to
``quantizers.mse_groups``: the same float32 products and true divisions, round half to even, the same strict
comparisons. Where it computes differently it is provably the same:

* the candidates' refit sums are exact integers (codes times 16-bit fixed-point values, at most 2^23: exact in
  float32), so their order is free: the five candidates of a batch are coded and summed in one pass over each
  group (``_batch_tile``, ``fastmath``: the vectoriser reorders), in int32 (and the sums of squares in float32)
  over chunks short enough that no partial sum can overflow (or pass 2^24), added into float64;
* the two float64 error sums in the reference's lane order decide only ``err(mse) < err(rtn)``: their float32
  estimates (any order, vectorised: ``_estimates_tile``) decide it when they are apart by more than a margin four
  times their rounding bound (``_smaller_error``); only a group where they are not (equal errors, an all-exact
  group, tiny values) sums in the lane order;
* ``amax``, its sign and finiteness come from the float bits as unsigned maxima (``_extreme``), ``amax``'s
  exponent and the powers of two of the fixed point from the bits too (``_exponent``);
* BF16 / F16 inputs are upcast exactly as they are copied; int4 codes are written as the reference packs them.

The groups go through in tiles of ~2048 weights (``_search_tile``): each step is a loop over a tile's groups,
each fastmath step one call per tile, so a 64-weight group pays no call of its own. numba without fastmath
neither reassociates float sums nor contracts them (no FMA); where fastmath is on, the docstring says why the
result cannot change. The property tests compare the kernel and the reference byte for byte. In the
compiled-ahead set (``aot.CODECS``) like the encoders."""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from colitools.formats.kernels._jit_row_encoders import _u16_f32
from colitools.formats.kernels.aot import export

_FLOOR = np.float32(1e-8)  # quantizers.SCALE_FLOOR
_LANES = 8  # quantizers.LANES
_FIXED_BITS = 16  # quantizers.FIXED_BITS
_MAGIC32 = np.float32(12582912.0)  # 1.5 * 2^23: float32 rounding to an integer, ties to even
_MAGIC64 = 6755399441055744.0  # 1.5 * 2^52: the same in float64
_ABS = np.uint32(0x7FFFFFFF)  # a float32 pattern without its sign
_EXPONENT = np.uint32(0x7F800000)  # float32's exponent field: all ones for inf and NaN
_BATCH = 5  # candidates coded and summed in one pass (five int32 and five float32 running sums: registers)
# a chunk of the refit sums holds at most 2^14 / max|code| elements: |int32 partial sum| <= 2^14 * 2^16 = 2^30,
# and a float32 sum of squares <= 2^14 * 128 = 2^21 (exact below 2^24)
_CHUNK_BITS = 14
# per element: above the (absolute) rounding error of a float32 square below 2^-126 (a subnormal)
_TINY = 2.0**-140


@nb.njit(nogil=True, cache=True, inline="always")
def _rint_clip(y, flo, fhi):
    """``clip(rint(y), lo, hi)`` in float32: clipping first changes nothing (rint is monotone and keeps the
    integers ``lo``, ``hi``), and for ``|y| <= 128`` adding and subtracting ``1.5 * 2^23`` rounds to the nearest
    integer, ties to even, exactly as ``np.rint`` (branch-free selects: the loops vectorise). NaN stays NaN."""
    y = flo if y < flo else y
    y = fhi if y > fhi else y
    return np.float32(np.float32(y + _MAGIC32) - _MAGIC32)


@nb.njit(nogil=True, cache=True, inline="always")
def _pow2(k):
    """``2.0 ** k`` in float64 from its bits (``-1022 <= k <= 1023``: here ``|k| <= 165``)."""
    return np.int64(np.int64(k + 1023) << np.int64(52)).view(np.float64)


@nb.njit(nogil=True, cache=True, inline="always")
def _exponent(amax):
    """``frexp(amax)[1]`` of a float32 ``amax > 0``: its biased exponent field minus 126 (a normal number
    ``1.m * 2^(E - 127) = 0.1m * 2^(E - 126)``); a subnormal through ``math.frexp``."""
    biased = np.int64(np.float32(amax).view(np.uint32) >> np.uint32(23))
    return biased - 126 if biased > 0 else np.int64(math.frexp(np.float64(amax))[1])


@nb.njit(nogil=True, cache=True, inline="always")
def _fixed(row, f, qw):
    """``qw = rint(w * f)`` in float64 (``|w * f| <= 2^16``: the magic constant rounds exactly), kept as float32
    (an integer of at most 17 bits: exact)."""
    for k in range(row.size):
        qw[k] = np.float32((np.float64(row[k]) * f + _MAGIC64) - _MAGIC64)


@nb.njit(nogil=True, cache=True, fastmath=True, inline="always")
def _code(w, iscale, flo, fhi):
    """``clip(rint(w * iscale))``: ``|w| <= |x|`` bounds ``|w * iscale|`` by ``|t| * (1 + 2^-23)`` (finite: what
    fastmath assumes), ``np.rint`` is one rounding instruction whatever the flags, and the sign of a zero code
    changes no sum."""
    lk = np.rint(np.float32(w * iscale))
    lk = flo if lk < flo else lk
    return fhi if lk > fhi else lk


@nb.njit(nogil=True, cache=True, inline="always")
def _codes(row, s, flo, fhi, out):
    """``out[k] = clip(rint(row[k] / s), lo, hi)`` (float32 true divisions; a loop the vectoriser takes whole)."""
    for k in range(row.size):
        out[k] = _rint_clip(np.float32(row[k] / s), flo, fhi)


@nb.njit(nogil=True, cache=True, inline="always")
def _sq(w, v, s):
    d = np.float64(np.float32(v * s)) - np.float64(w)
    return d * d


@nb.njit(nogil=True, cache=True, inline="always")
def _lane_error(row, v, s):
    """``sum((float32(v * s) - w)^2)`` in float64 in the lane order (``quantizers.lane_sum``), the eight lanes as
    eight scalars (registers, eight independent chains)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    for k in range(0, row.size, _LANES):
        a0 += _sq(row[k], v[k], s)
        a1 += _sq(row[k + 1], v[k + 1], s)
        a2 += _sq(row[k + 2], v[k + 2], s)
        a3 += _sq(row[k + 3], v[k + 3], s)
        a4 += _sq(row[k + 4], v[k + 4], s)
        a5 += _sq(row[k + 5], v[k + 5], s)
        a6 += _sq(row[k + 6], v[k + 6], s)
        a7 += _sq(row[k + 7], v[k + 7], s)
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


# ---------------------------------------------------------------------------------------------- the tiles
# The groups are searched a tile at a time: each fastmath step below is one call over a tile's groups (a call per
# group cost more than its arithmetic on 64-weight groups: arguments' reference counts, loop set-up), and the
# tile stays in cache from the copy to the codes.
_TILE_ELEMS = 2048  # weights per tile (8 KB of float32): 32 groups of 64, one row of int4-row and longer


@nb.njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def _batch_tile(tile, qwt, isc, t, flo, fhi, sums):
    """The exact refit sums of the five candidates ``isc[g]`` of each group ``g < t``: ``sums[g, c] = sum(l *
    qw)``, ``sums[g, _BATCH + c] = sum(l * l)`` (an ``iscale`` of 0, a skipped candidate, has codes 0). Every
    term is an integer exact in float32 and every partial sum exact (a chunk of at most ``2^14 / max|code|``
    elements: no int32 partial sum overflows, no float32 sum of squares passes 2^24; chunks added in float64):
    fastmath may reorder the sums (the vectoriser does) and contract them (an FMA of exact terms is exact)."""
    n = tile.shape[1]
    chunk = max(_LANES, (1 << _CHUNK_BITS) // int(max(-flo, fhi)))
    for g in range(t):
        i0, i1, i2, i3, i4 = isc[g, 0], isc[g, 1], isc[g, 2], isc[g, 3], isc[g, 4]
        f0 = f1 = f2 = f3 = f4 = h0 = h1 = h2 = h3 = h4 = 0.0
        for k0 in range(0, n, chunk):
            k1 = min(n, k0 + chunk)
            part, fixed = tile[g, k0:k1], qwt[g, k0:k1]  # views: the vectoriser peels and aligns these loops best
            x0 = x1 = x2 = x3 = x4 = np.int32(0)
            q0 = q1 = q2 = q3 = q4 = np.float32(0.0)
            for k in range(part.size):
                w, q = part[k], fixed[k]
                l0, l1, l2 = _code(w, i0, flo, fhi), _code(w, i1, flo, fhi), _code(w, i2, flo, fhi)
                l3, l4 = _code(w, i3, flo, fhi), _code(w, i4, flo, fhi)
                x0, x1 = np.int32(x0 + np.int32(l0 * q)), np.int32(x1 + np.int32(l1 * q))
                x2, x3 = np.int32(x2 + np.int32(l2 * q)), np.int32(x3 + np.int32(l3 * q))
                x4 = np.int32(x4 + np.int32(l4 * q))
                q0, q1, q2, q3, q4 = q0 + l0 * l0, q1 + l1 * l1, q2 + l2 * l2, q3 + l3 * l3, q4 + l4 * l4
            f0, f1, f2, f3, f4 = f0 + x0, f1 + x1, f2 + x2, f3 + x3, f4 + x4
            h0, h1, h2, h3, h4 = h0 + q0, h1 + q1, h2 + q2, h3 + q3, h4 + q4
        sums[g, 0], sums[g, 1], sums[g, 2], sums[g, 3], sums[g, 4] = f0, f1, f2, f3, f4
        sums[g, 5], sums[g, 6], sums[g, 7], sums[g, 8], sums[g, 9] = h0, h1, h2, h3, h4


@nb.njit(nogil=True, cache=True, fastmath={"reassoc"}, error_model="numpy")
def _estimates_tile(tile, v0t, s0, v1t, s1, use, t, e0, e1):
    """``e[g] = sum((float32(v * s) - w)^2)`` in float32 for the rtn (``0``) and the searched (``1``) codes of
    each group ``g < t`` that has a searched scale (``use``), summed in any order (``reassoc`` only: no
    contraction, so each difference is rounded once and each square once): within ``(n + 2) * 2^-24`` of the
    exact sum relatively, plus ``n * 2^-149`` (squares below 2^-126), or inf."""
    n = tile.shape[1]
    for g in range(t):
        if use[g]:
            w, a, b = tile[g], v0t[g], v1t[g]
            sa, sb = s0[g], s1[g]
            acc0 = np.float32(0.0)
            acc1 = np.float32(0.0)
            for k in range(n):
                d0 = np.float32(np.float32(a[k] * sa) - w[k])
                d1 = np.float32(np.float32(b[k] * sb) - w[k])
                acc0 += d0 * d0
                acc1 += d1 * d1
            e0[g], e1[g] = acc0, acc1


@nb.njit(nogil=True, cache=True, inline="always")
def _smaller_error(row, v1, s1, v0, s0, e1, e0):
    """``_lane_error(row, v1, s1) < _lane_error(row, v0, s0)``, decided by their float32 estimates ``e1``, ``e0``
    when they are apart by more than ``m`` (four times their relative bound, which is far above the float64 lane
    sums' own ``(n / 8 + 4) * 2^-53``) on both sides, else by the lane sums themselves."""
    n = row.size
    m = (n + 8) * 2.0**-22
    a = n * _TINY
    e1, e0 = np.float64(e1), np.float64(e0)
    if m < 0.5 and np.isfinite(e1) and np.isfinite(e0):
        if e1 * (1 + m) + a < e0 * (1 - m) - a:
            return True
        if e1 * (1 - m) - a > e0 * (1 + m) + a:
            return False
    return _lane_error(row, v1, s1) < _lane_error(row, v0, s0)


@nb.njit(nogil=True, cache=True, inline="always")
def _extreme(row):
    """``(amax, x, finite)``: the largest magnitude, the first element that has it, and whether every element is
    finite. On the bits: a float's magnitude orders as its pattern with the sign cleared (inf above every finite
    value, NaN above inf), so one unsigned max gives ``amax`` and finiteness (below the all-ones exponent), and
    the maxima of the positive and of the negative elements' patterns give ``x``'s sign; only when both signs
    reach ``amax`` is the first such element looked for. Integer maxima: loops the vectoriser takes."""
    bits = row.view(np.uint32)
    m = np.uint32(0)
    mp = np.uint32(0)
    mn = np.uint32(0)
    for k in range(bits.size):
        b = bits[k]
        a = np.uint32(b & _ABS)
        m = max(m, a)
        mp = max(mp, np.uint32(a if b == a else 0))
        mn = max(mn, np.uint32(0 if b == a else a))
    amax = np.uint32(m).view(np.float32)
    if mp == m and mn == m:
        for k in range(row.size):
            if abs(row[k]) == amax:
                return amax, row[k], m < _EXPONENT
    return amax, (amax if mp == m else -amax), m < _EXPONENT


@nb.njit(nogil=True, cache=True, inline="always")
def _prepare(tile, t, fhi, qwt, s0, s1, best, xs, amaxs, unit):
    """Each group's extreme, rtn scale ``s0`` and fixed point ``qwt``; the number of groups before the first
    that holds a NaN or an infinity (``t`` when none does)."""
    for g in range(t):
        amax, x, finite = _extreme(tile[g])
        if not finite:
            return g
        amaxs[g], xs[g] = amax, x
        s = np.float32(amax / fhi)
        s0[g] = _FLOOR if s < _FLOOR else s
        s1[g], best[g] = np.float32(0.0), -1.0
        if amax > 0:
            e = _exponent(amax)
            _fixed(tile[g], _pow2(_FIXED_BITS - e), qwt[g])
            unit[g] = _pow2(e - _FIXED_BITS)
    return t


@nb.njit(nogil=True, cache=True, inline="always")
def _candidates(isc, t, c0, xs, amaxs, signed, targets):
    """``isc[g, b]``: the inverse scales of candidates ``c0 .. c0 + 4`` of each group (0: skipped, a place past
    the last candidate, a group of zeros, a scale that is not finite)."""
    C = targets.shape[1]
    for g in range(t):
        x = xs[g]
        for b in range(_BATCH):
            iscale = np.float32(0.0)
            if c0 + b < C and amaxs[g] > 0:
                tt = targets[0, c0 + b] if signed or x < 0 else targets[1, c0 + b]
                iscale = np.float32(tt / x)
            isc[g, b] = iscale if np.isfinite(iscale) else np.float32(0.0)


@nb.njit(nogil=True, cache=True, inline="always")
def _scores(sums, t, nb_, best, s1, unit):
    """Keeps each group's best candidate so far: the largest ``fx^2 / f2`` and its scale ``fx / f2 * unit``."""
    for g in range(t):
        for b in range(nb_):
            fx, f2 = sums[g, b], sums[g, _BATCH + b]
            if f2 > 0:
                score = fx * fx / f2
                if score > best[g]:
                    best[g], s1[g] = score, np.float32(fx / f2 * unit[g])


@nb.njit(nogil=True, cache=True, inline="always")
def _write(src, out, r, packed):
    """Row ``r`` of ``out``: the values as int8 bytes, or (``packed``) int4 pairs, byte ``j`` = ``(v[2j] + 8) |
    (v[2j + 1] + 8) << 4`` (``reference.pack_int4_pairs``)."""
    if packed:
        for j in range(src.size >> 1):
            lo4 = np.int32(src[2 * j]) + 8
            hi4 = np.int32(src[2 * j + 1]) + 8
            out[r, j] = np.uint8(lo4 | (hi4 << 4))
    else:
        for k in range(src.size):
            out[r, k] = np.uint8(np.int32(src[k]) & 0xFF)


@nb.njit(nogil=True, cache=True, inline="always")
def _search_tile(tile, t, rt, lo, hi, signed, targets, s_out, out, packed, work):
    """Searches the first ``t`` groups of ``tile`` (rows ``rt ..`` of the output) and writes their scales and
    codes; the first group holding a NaN or an infinity stops it (the groups before it are written): its row,
    else -1."""
    qwt, v0t, v1t, isc, sums, s0, s1, best, xs, amaxs, unit, use, e0, e1 = work
    flo, fhi = np.float32(lo), np.float32(hi)
    good = _prepare(tile, t, fhi, qwt, s0, s1, best, xs, amaxs, unit)
    C = targets.shape[1]
    for c0 in range(0, C, _BATCH):
        _candidates(isc, good, c0, xs, amaxs, signed, targets)
        _batch_tile(tile, qwt, isc, good, flo, fhi, sums)
        _scores(sums, good, min(_BATCH, C - c0), best, s1, unit)
    for g in range(good):
        _codes(tile[g], s0[g], flo, fhi, v0t[g])
        sb = s1[g]
        use[g] = amaxs[g] > 0 and np.isfinite(sb) and abs(sb) >= _FLOOR
        if use[g]:
            _codes(tile[g], sb, flo, fhi, v1t[g])
    _estimates_tile(tile, v0t, s0, v1t, s1, use, good, e0, e1)
    for g in range(good):
        take = use[g] and _smaller_error(tile[g], v1t[g], s1[g], v0t[g], s0[g], e1[g], e0[g])
        s_out[rt + g] = s1[g] if take else s0[g]
        _write(v1t[g] if take else v0t[g], out, rt + g, packed)
    return rt + good if good < t else -1


@nb.njit(nogil=True, cache=True, inline="always")
def _workspace(n):
    """The tile and the per-group buffers of one call (this thread's own: a view of the caller's array would
    count references on the array the other threads read, an atomic on a cache line the cores pass back and
    forth)."""
    T = max(1, _TILE_ELEMS // n)
    tile = np.empty((T, n), np.float32)
    work = (np.empty((T, n), np.float32), np.empty((T, n), np.float32), np.empty((T, n), np.float32),
            np.empty((T, _BATCH), np.float32), np.empty((T, 2 * _BATCH), np.float64), np.empty(T, np.float32),
            np.empty(T, np.float32), np.empty(T, np.float64), np.empty(T, np.float32), np.empty(T, np.float32),
            np.empty(T, np.float64), np.empty(T, np.bool_), np.empty(T, np.float32), np.empty(T, np.float32))
    return T, tile, work


@nb.njit(nogil=True, cache=True, inline="always")
def _group_rows(w, half, lo, hi, signed, targets, s_out, out, packed, r0, r1):
    """The groups ``w[r0:r1]`` a tile at a time: float32 (``half`` None) copied as they are, BF16 (``half``
    False) or F16 bits (uint16) upcast exactly as they are copied (no float32 copy of the tensor). ``half`` is a
    literal in each driver below, so each compiles one copy loop."""
    n = w.shape[1]
    T, tile, work = _workspace(n)
    for rt in range(r0, r1, T):
        t = min(T, r1 - rt)
        for g in range(t):
            if half is None:
                for k in range(n):
                    tile[g, k] = w[rt + g, k]
            else:
                for k in range(n):
                    tile[g, k] = _u16_f32(w[rt + g, k], half)
        bad = _search_tile(tile, t, rt, lo, hi, signed, targets, s_out, out, packed, work)
        if bad >= 0:
            return bad
    return -1


@export("mse_group_rows", ("float32", "i", "i", "b", "float32", "float32[]", "uint8", "b"))
@nb.njit(nogil=True, cache=True, error_model="numpy")
def mse_group_rows(w, lo, hi, signed, targets, s_out, out, packed, r0, r1):
    """Groups ``w[r]`` for ``r`` in ``[r0, r1)`` (float32 ``[N, n]``, ``n % 8 == 0``) -> ``s_out[r]`` and the codes
    ``out[r]``: the int8 values' bytes ``[N, n]``, or (``packed``) their int4 pairs ``[N, n / 2]``. Returns -1
    (the codecs' "no bad row"), or the first row holding a NaN or an infinity (the rows after it unwritten)."""
    return _group_rows(w, None, lo, hi, signed, targets, s_out, out, packed, r0, r1)


@export("mse_group_rows_bf16", ("uint16", "i", "i", "b", "float32", "float32[]", "uint8", "b"))
@nb.njit(nogil=True, cache=True, error_model="numpy")
def mse_group_rows_bf16(w, lo, hi, signed, targets, s_out, out, packed, r0, r1):
    """``mse_group_rows`` of BF16 groups given as their bits."""
    return _group_rows(w, False, lo, hi, signed, targets, s_out, out, packed, r0, r1)


@export("mse_group_rows_f16", ("uint16", "i", "i", "b", "float32", "float32[]", "uint8", "b"))
@nb.njit(nogil=True, cache=True, error_model="numpy")
def mse_group_rows_f16(w, lo, hi, signed, targets, s_out, out, packed, r0, r1):
    """``mse_group_rows`` of F16 groups given as their bits."""
    return _group_rows(w, True, lo, hi, signed, targets, s_out, out, packed, r0, r1)
