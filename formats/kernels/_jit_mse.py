"""The numba kernel of the ``mse`` group search (``formats/quantizers.py``, FORMATS §9), byte-identical to
``quantizers.mse_groups``: the same float32 products and true divisions, ``rint`` ties to even, the same lane
order of every sum (lane ``k % 8`` accumulates in element order, then ``((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
(l6 + l7))``), the same strict comparisons. numba without fastmath neither reassociates nor contracts
(no FMA), so the kernel's sums are the reference's; the property tests compare them byte for byte.

In the compiled-ahead set (``aot.CODECS``) like the encoders."""

from __future__ import annotations

import numba as nb
import numpy as np

from colitools.formats.kernels.aot import export

_FLOOR = np.float32(1e-8)  # quantizers.SCALE_FLOOR
_LANES = 8  # quantizers.LANES
_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23


@nb.njit(nogil=True, cache=True, inline="always")
def _total32(a):
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))


@nb.njit(nogil=True, cache=True, inline="always")
def _rint_clip(y, flo, fhi):
    """``clip(rint(y), lo, hi)`` in float32: clipping first changes nothing (rint is monotone and keeps the
    integers ``lo``, ``hi``), and for ``|y| <= 128`` adding and subtracting ``1.5 * 2^23`` rounds to the nearest
    integer, ties to even, exactly as ``np.rint`` (branch-free, so the loops vectorise). NaN stays NaN."""
    y = min(max(y, flo), fhi)
    return np.float32(np.float32(y + _MAGIC) - _MAGIC)


@nb.njit(nogil=True, cache=True, inline="always")
def _codes(row, s, flo, fhi, out):
    """``out[k] = clip(rint(row[k] / s), lo, hi)`` (float32 true division)."""
    for k in range(row.size):
        out[k] = _rint_clip(np.float32(row[k] / s), flo, fhi)


@nb.njit(nogil=True, cache=True, inline="always")
def _squared_error(row, s, v, acc):
    acc[:] = 0.0
    n = row.size
    for k0 in range(0, n, _LANES):
        for j in range(_LANES):
            d = np.float64(np.float32(v[k0 + j] * s)) - np.float64(row[k0 + j])
            acc[j] += d * d
    return _total32(acc)


@nb.njit(nogil=True, cache=True, inline="always")
def _candidate(row, iscale, flo, fhi, acc, acc2):
    """Codes ``l = clip(rint(w * iscale))`` and ``(sum(l * w), sum(l * l))`` as float32 lane sums, widened."""
    acc[:] = 0.0
    acc2[:] = 0.0
    n = row.size
    for k0 in range(0, n, _LANES):
        for j in range(_LANES):
            wk = row[k0 + j]
            lk = _rint_clip(np.float32(wk * iscale), flo, fhi)
            acc[j] += np.float32(lk * wk)
            acc2[j] += np.float32(lk * lk)
    return np.float64(_total32(acc)), np.float64(_total32(acc2))


@export("mse_group_rows", ("float32", "i", "i", "b", "float32", "float32[]", "int8"))
@nb.njit(nogil=True, cache=True, error_model="numpy")
def mse_group_rows(w, lo, hi, signed, targets, s_out, v_out, r0, r1):
    """Groups ``w[r]`` for ``r`` in ``[r0, r1)`` (float32 ``[N, n]``, ``n % 8 == 0``) -> ``s_out[r]`` and the
    values ``v_out[r]`` (int8). Returns the first row holding a NaN / inf, or -1."""
    n = w.shape[1]
    flo, fhi = np.float32(lo), np.float32(hi)
    v0, v1 = np.empty(n, np.float32), np.empty(n, np.float32)
    acc, acc2, e = np.zeros(_LANES, np.float32), np.zeros(_LANES, np.float32), np.zeros(_LANES, np.float64)
    for r in range(r0, r1):
        row = w[r]
        amax, x = np.float32(0.0), np.float32(0.0)
        for k in range(n):
            a = abs(row[k])
            if not np.isfinite(a):
                return r
            if a > amax:
                amax, x = a, row[k]
        s0 = np.float32(amax / fhi)
        if s0 < _FLOOR:
            s0 = _FLOOR
        _codes(row, s0, flo, fhi, v0)
        s_best, best = np.float32(0.0), -1.0
        if amax > 0:
            for c in range(targets.shape[1]):
                t = targets[0, c] if signed or x < 0 else targets[1, c]
                sx, s2 = _candidate(row, np.float32(t / x), flo, fhi, acc, acc2)
                if s2 > 0:
                    score = sx * sx / s2
                    if score > best:
                        best, s_best = score, np.float32(sx / s2)
        use = amax > 0 and np.isfinite(s_best) and abs(s_best) >= _FLOOR
        if use:
            _codes(row, s_best, flo, fhi, v1)
            use = _squared_error(row, s_best, v1, e) < _squared_error(row, s0, v0, e)
        s_out[r] = s_best if use else s0
        src = v1 if use else v0
        for k in range(n):
            v_out[r, k] = np.int8(src[k])
    return -1
