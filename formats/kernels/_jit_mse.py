"""The numba kernel of the ``mse`` group search (``formats/quantizers.py``, FORMATS §11), byte-identical to
``quantizers.mse_groups``: the same float32 products and true divisions, round half to even, the candidates'
refit sums exact (products of codes and 16-bit fixed-point values exact in float32, their sums integers exact in
float64: no order to follow, so LLVM's
loop vectoriser takes those loops whole, as it takes the divisions' loops), the float64 error sums in the
reference's lane order, the same strict comparisons. numba without fastmath neither
reassociates float sums nor contracts them (no FMA); the property tests compare the two byte for byte.

In the compiled-ahead set (``aot.CODECS``) like the encoders."""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from colitools.formats.kernels.aot import export

_FLOOR = np.float32(1e-8)  # quantizers.SCALE_FLOOR
_LANES = 8  # quantizers.LANES
_FIXED_BITS = 16  # quantizers.FIXED_BITS
_MAGIC32 = np.float32(12582912.0)  # 1.5 * 2^23: float32 rounding to an integer, ties to even
_MAGIC64 = 6755399441055744.0  # 1.5 * 2^52: the same in float64


@nb.njit(nogil=True, cache=True, inline="always")
def _rint_clip(y, flo, fhi):
    """``clip(rint(y), lo, hi)`` in float32: clipping first changes nothing (rint is monotone and keeps the
    integers ``lo``, ``hi``), and for ``|y| <= 128`` adding and subtracting ``1.5 * 2^23`` rounds to the nearest
    integer, ties to even, exactly as ``np.rint`` (branch-free selects: the loops vectorise). NaN stays NaN."""
    y = flo if y < flo else y
    y = fhi if y > fhi else y
    return np.float32(np.float32(y + _MAGIC32) - _MAGIC32)


@nb.njit(nogil=True, cache=True, inline="always")
def _fixed(row, f, qw):
    """``qw = rint(w * f)`` in float64 (``|w * f| <= 2^16``: the magic constant rounds exactly), kept as float32
    (an integer of at most 17 bits: exact)."""
    for k in range(row.size):
        qw[k] = np.float32((np.float64(row[k]) * f + _MAGIC64) - _MAGIC64)


@nb.njit(nogil=True, cache=True, inline="always")
def _scaled_codes(row, iscale, flo, fhi, lc):
    """``lc[k] = clip(rint(w * iscale))`` (float32 product; exact rounding: no fastmath here)."""
    for k in range(row.size):
        lc[k] = _rint_clip(np.float32(row[k] * iscale), flo, fhi)


@nb.njit(nogil=True, cache=True, fastmath=True)
def _refit_sums(lc, qw):
    """``(sum(l * qw), sum(l * l))``: every product an integer of at most 23 bits, exact in float32, and every
    partial sum an integer below 2^53, exact in float64, so the sums are exact in any order: ``fastmath`` lets
    the vectoriser reorder them, and they still equal the reference's integer sums."""
    sx = 0.0
    s2 = 0.0
    for k in range(lc.size):
        lk = lc[k]
        sx += np.float64(lk * qw[k])
        s2 += np.float64(lk * lk)
    return sx, s2


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


@nb.njit(nogil=True, cache=True, inline="always")
def _extreme(row):
    """``(amax, x)``: the largest magnitude (a branch-free max the vectoriser takes; the callers refuse NaN / inf
    before any search, ``kernels._dispatch._mse_encode``) and the first element that has it."""
    amax = np.float32(0.0)
    for k in range(row.size):
        a = abs(row[k])
        amax = a if a > amax else amax
    for k in range(row.size):
        if abs(row[k]) == amax:
            return amax, row[k]
    return amax, np.float32(0.0)


@nb.njit(nogil=True, cache=True, inline="always")
def _search(row, qw, lc, x, e, signed, targets, flo, fhi):
    """The winning candidate's float32 scale (0 when none has ``s2 > 0``)."""
    f = math.ldexp(1.0, _FIXED_BITS - e)
    unit = math.ldexp(1.0, e - _FIXED_BITS)
    _fixed(row, f, qw)
    s_best, best = np.float32(0.0), -1.0
    for c in range(targets.shape[1]):
        t = targets[0, c] if signed or x < 0 else targets[1, c]
        iscale = np.float32(t / x)
        if not np.isfinite(iscale):
            continue
        _scaled_codes(row, iscale, flo, fhi, lc)
        fx, f2 = _refit_sums(lc, qw)
        if f2 > 0:
            score = fx * fx / f2
            if score > best:
                best, s_best = score, np.float32(fx / f2 * unit)
    return s_best


@export("mse_group_rows", ("float32", "i", "i", "b", "float32", "float32[]", "int8"))
@nb.njit(nogil=True, cache=True, error_model="numpy")
def mse_group_rows(w, lo, hi, signed, targets, s_out, v_out, r0, r1):
    """Groups ``w[r]`` for ``r`` in ``[r0, r1)`` (float32 ``[N, n]``, ``n % 8 == 0``, finite: the caller checks)
    -> ``s_out[r]`` and the values ``v_out[r]`` (int8). Returns -1 (the codecs' "no bad row")."""
    n = w.shape[1]
    flo, fhi = np.float32(lo), np.float32(hi)
    v0, v1 = np.empty(n, np.float32), np.empty(n, np.float32)
    qw = np.empty(n, np.float32)
    for r in range(r0, r1):
        row = w[r]
        amax, x = _extreme(row)
        s0 = np.float32(amax / fhi)
        if s0 < _FLOOR:
            s0 = _FLOOR
        s1 = np.float32(0.0)
        if amax > 0:
            s1 = _search(row, qw, v1, x, math.frexp(np.float64(amax))[1], signed, targets, flo, fhi)
        _codes(row, s0, flo, fhi, v0)
        use = np.isfinite(s1) and abs(s1) >= _FLOOR
        if use:
            _codes(row, s1, flo, fhi, v1)
            use = _lane_error(row, v1, s1) < _lane_error(row, v0, s0)
        s_out[r] = s1 if use else s0
        src = v1 if use else v0
        for k in range(n):
            v_out[r, k] = np.int8(src[k])
    return -1
