"""The numba kernel of the MLX-affine fits (``formats/affine.py``, FORMATS §2.12 and §11), byte-identical to
``affine.fit_groups``: the same float32 subtractions, products and true divisions, round half to even, BF16
rounding to nearest even (from the float bits), the refit's sums as exact int64 integers, the float64 error sums
in ``quantizers.lane_sum``'s lane order, the same strict comparisons. No fastmath: numba then neither reassociates
float sums nor contracts them (no FMA). In the compiled-ahead set (``aot.CODECS``) like the encoders."""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from colitools.formats.kernels.aot import export

_LANES = 8  # quantizers.LANES
_FIXED_BITS = 16  # affine.FIXED_BITS
_MAGIC32 = np.float32(12582912.0)  # 1.5 * 2^23: float32 rounding to an integer, ties to even (|y| <= 2^22)


@nb.njit(nogil=True, cache=True, inline="always")
def _bf16(x):
    """float32 ``x`` rounded to bfloat16, nearest even (ml_dtypes' cast for finite values and infinities)."""
    bits = np.array([x], np.float32).view(np.uint32)[0]
    bits = np.uint32(bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.array([bits], np.uint32).view(np.float32)[0]


@nb.njit(nogil=True, cache=True, inline="always")
def _code(y, ftop):
    """``clip(rint(y), 0, top)``: clipping first changes nothing (rint is monotone and keeps 0 and ``top``)."""
    y = np.float32(0.0) if y < 0 else y
    y = ftop if y > ftop else y
    return np.float32(np.float32(y + _MAGIC32) - _MAGIC32)


@nb.njit(nogil=True, cache=True)
def _codes(row, s, b, ftop, q):
    """``affine.codes_of`` of one group into ``q`` (float32 codes)."""
    n = row.shape[0]
    if not (s > 0 and np.isfinite(s)):  # 0, or a range past float32's (encode refuses it)
        for k in range(n):
            q[k] = np.float32(0.0)
        return
    for k in range(n):
        q[k] = _code(np.float32(np.float32(row[k] - b) / s), ftop)


@nb.njit(nogil=True, cache=True)
def _error(row, s, b, q, lanes):
    """``affine.squared_error`` of one group: float64 sums in the lane order."""
    n = row.shape[0]
    for j in range(_LANES):
        lanes[j] = 0.0
    for k in range(n):
        v = np.float32(np.float32(s * q[k]) + b)
        d = np.float64(v) - np.float64(row[k])
        lanes[k % _LANES] += d * d
    p0, p1 = lanes[0] + lanes[1], lanes[2] + lanes[3]
    p2, p3 = lanes[4] + lanes[5], lanes[6] + lanes[7]
    return (p0 + p1) + (p2 + p3)


@nb.njit(nogil=True, cache=True)
def _trial(row, mn, t, ftop, qw, unit, q):
    """One trial: its codes into ``q`` and the refit ``(s, b, usable)`` (``affine._refit``)."""
    n = row.shape[0]
    L = LL = W = LW = np.int64(0)
    for k in range(n):
        lk = np.int64(_code(np.float32(np.float32(row[k] - mn) * t), ftop))
        L += lk
        LL += lk * lk
        W += qw[k]
        LW += lk * qw[k]
    D = n * LL - L * L
    if D <= 0:
        return np.float32(0.0), np.float32(0.0), False
    s = _bf16(np.float32(np.float64(n * LW - L * W) / np.float64(D) * unit))
    b = _bf16(np.float32(np.float64(LL * W - L * LW) / np.float64(D) * unit))
    return s, b, (s > 0) and np.isfinite(s) and np.isfinite(b)


@nb.njit(nogil=True, cache=True)
def _search(row, s, b, best, numerators, ftop, q, tq, qw, lanes):
    """The mse trials of one group (``affine.fit_groups``), starting from the min-max fit ``(s, b)`` whose codes
    are in ``q`` and error ``best``; returns the winner's ``(s, b)``, its codes left in ``q``."""
    n = row.shape[0]
    mn, amax = row[0], abs(row[0])
    for k in range(n):
        mn = row[k] if row[k] < mn else mn
        amax = abs(row[k]) if abs(row[k]) > amax else amax
    mx = row[0]
    for k in range(n):
        mx = row[k] if row[k] > mx else mx
    rng = np.float32(mx - mn)
    e = math.frexp(np.float64(amax))[1]
    scale, unit = math.ldexp(1.0, _FIXED_BITS - e), math.ldexp(1.0, e - _FIXED_BITS)
    for k in range(n):
        qw[k] = np.int64(np.rint(np.float64(row[k]) * scale))
    for c in range(numerators.shape[0]):
        t = np.float32(numerators[c] / rng)
        if not (rng > 0 and np.isfinite(t)):
            continue
        ts, tb, ok = _trial(row, mn, t, ftop, qw, unit, tq)
        if not ok:
            continue
        _codes(row, ts, tb, ftop, tq)
        err = _error(row, ts, tb, tq, lanes)
        if err < best:
            best, s, b = err, ts, tb
            for k in range(n):
                q[k] = tq[k]
    return s, b


@export("affine_group_rows", ("float32", "i", "b", "float32[]", "float32[]", "float32[]", "uint8"))
@nb.njit(nogil=True, cache=True, error_model="numpy")
def affine_group_rows(w, top, mse, numerators, s_out, b_out, q_out, r0, r1):
    """Groups ``w[r]`` for ``r`` in ``[r0, r1)`` (float32 ``[N, n]``, ``n % 8 == 0``) -> scale ``s_out[r]``, bias
    ``b_out[r]`` (float32 values of BF16) and codes ``q_out[r]`` (uint8): the min-max fit, and with ``mse`` the
    trials of ``numerators`` (``float32(top + d)`` per offset). Returns -1, or the first row holding a NaN or an
    infinity (the rows after it are left unwritten)."""
    n = w.shape[1]
    ftop = np.float32(top)
    q, tq = np.empty(n, np.float32), np.empty(n, np.float32)
    qw, lanes = np.empty(n, np.int64), np.empty(_LANES, np.float64)
    for r in range(r0, r1):
        row = w[r]
        mn, mx = row[0], row[0]
        for k in range(n):
            if not np.isfinite(row[k]):
                return r
            mn = row[k] if row[k] < mn else mn
            mx = row[k] if row[k] > mx else mx
        s = _bf16(np.float32(np.float32(mx - mn) / ftop))
        b = _bf16(mn)
        _codes(row, s, b, ftop, q)
        if mse:
            s, b = _search(row, s, b, _error(row, s, b, q, lanes), numerators, ftop, q, tq, qw, lanes)
        s_out[r], b_out[r] = s, b
        for k in range(n):
            q_out[r, k] = np.uint8(q[k])
    return -1
