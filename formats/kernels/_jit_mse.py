"""The numba kernel of the ``mse`` group search (``formats/quantizers.py``, FORMATS §11), byte-identical to
``quantizers.mse_groups``: the same float32 products and true divisions, round half to even, the same strict
comparisons. Where it computes differently it is provably the same:

* the candidates' refit sums are exact integers (codes times 16-bit fixed-point values, at most 2^23: exact in
  float32), so their order is free: the five candidates of a batch are coded and summed in one pass over the
  group (``_candidate_sums``, ``fastmath``: the vectoriser reorders), in int32 (and the sums of squares in
  float32) over chunks short enough that no partial sum can overflow (or pass 2^24), added into float64;
* the two float64 error sums in the reference's lane order decide only ``err(mse) < err(rtn)``: their float32
  estimates (any order, vectorised) decide it when they are apart by more than a margin four times their
  rounding bound (``_smaller_error``); only a group where they are not (equal errors, an all-exact group, tiny
  values) sums in the lane order;
* ``amax``'s exponent and the powers of two of the fixed point come from the float bits (``_exponent``).

numba without fastmath neither reassociates float sums nor contracts them (no FMA); where fastmath is on, the
docstring says why the result cannot change. The property tests compare the kernel and the reference byte for
byte. In the compiled-ahead set (``aot.CODECS``) like the encoders."""

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


@nb.njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def _batch_chunk(row, qw, k0, k1, isc, flo, fhi, sums):
    """Adds the refit sums of ``row[k0:k1]`` (a chunk: no int32 partial sum overflows, no float32 sum of squares
    passes 2^24) to ``sums[c]`` (``sum(l * qw)``) and ``sums[_BATCH + c]`` (``sum(l * l)``) for the five
    candidates ``isc[c]``. Every term is an integer exact in float32 and every partial sum exact: fastmath may
    reorder the sums (the vectoriser does) and contract them (an FMA of exact terms is exact)."""
    i0, i1, i2, i3, i4 = isc[0], isc[1], isc[2], isc[3], isc[4]
    x0 = x1 = x2 = x3 = x4 = np.int32(0)
    q0 = q1 = q2 = q3 = q4 = np.float32(0.0)
    part, fixed = row[k0:k1], qw[k0:k1]  # views: the vectoriser peels and aligns these loops best
    for k in range(part.size):
        w, q = part[k], fixed[k]
        l0, l1, l2 = _code(w, i0, flo, fhi), _code(w, i1, flo, fhi), _code(w, i2, flo, fhi)
        l3, l4 = _code(w, i3, flo, fhi), _code(w, i4, flo, fhi)
        x0, x1 = np.int32(x0 + np.int32(l0 * q)), np.int32(x1 + np.int32(l1 * q))
        x2, x3 = np.int32(x2 + np.int32(l2 * q)), np.int32(x3 + np.int32(l3 * q))
        x4 = np.int32(x4 + np.int32(l4 * q))
        q0, q1, q2, q3, q4 = q0 + l0 * l0, q1 + l1 * l1, q2 + l2 * l2, q3 + l3 * l3, q4 + l4 * l4
    sums[0], sums[1], sums[2] = sums[0] + x0, sums[1] + x1, sums[2] + x2
    sums[3], sums[4] = sums[3] + x3, sums[4] + x4
    sums[5], sums[6], sums[7] = sums[5] + q0, sums[6] + q1, sums[7] + q2
    sums[8], sums[9] = sums[8] + q3, sums[9] + q4


@nb.njit(nogil=True, cache=True, inline="always")
def _candidate_sums(row, qw, isc, flo, fhi, sums):
    """The exact refit sums of the five candidates ``isc`` (float64 ``sums``; an ``iscale`` of 0, a skipped
    candidate, has codes 0 and ``s2 = 0``), the group in chunks of at most ``2^14 / max|code|`` elements."""
    chunk = max(_LANES, (1 << _CHUNK_BITS) // int(max(-flo, fhi)))
    for c in range(2 * _BATCH):
        sums[c] = 0.0
    for k0 in range(0, row.size, chunk):
        _batch_chunk(row, qw, k0, min(row.size, k0 + chunk), isc, flo, fhi, sums)


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


@nb.njit(nogil=True, cache=True, fastmath={"reassoc"}, error_model="numpy")
def _error_estimate(row, v, s):
    """``sum((float32(v * s) - w)^2)`` in float32, summed in any order (``reassoc`` only: no contraction, so the
    difference is rounded once and the square once): within ``(n + 2) * 2^-24`` of the exact sum relatively,
    plus ``n * 2^-149`` (squares below 2^-126), or inf."""
    acc = np.float32(0.0)
    for k in range(row.size):
        d = np.float32(np.float32(v[k] * s) - row[k])
        acc += d * d
    return acc


@nb.njit(nogil=True, cache=True, inline="always")
def _smaller_error(row, v1, s1, v0, s0):
    """``_lane_error(row, v1, s1) < _lane_error(row, v0, s0)``, decided by the float32 estimates when they are
    apart by more than ``m`` (four times their relative bound, which is far above the float64 lane sums' own
    ``(n / 8 + 4) * 2^-53``) on both sides, else by the lane sums themselves."""
    n = row.size
    m = (n + 8) * 2.0**-22
    a = n * _TINY
    e1 = np.float64(_error_estimate(row, v1, s1))
    e0 = np.float64(_error_estimate(row, v0, s0))
    if m < 0.5 and np.isfinite(e1) and np.isfinite(e0):
        if e1 * (1 + m) + a < e0 * (1 - m) - a:
            return True
        if e1 * (1 - m) - a > e0 * (1 + m) + a:
            return False
    return _lane_error(row, v1, s1) < _lane_error(row, v0, s0)


@nb.njit(nogil=True, cache=True, inline="always")
def _extreme(row):
    """``(amax, x, finite)``: the largest magnitude (a branch-free max the vectoriser takes), the first element
    that has it, and whether every element is finite (an exponent field short of all ones: an integer
    reduction in the same loop; the caller stops at a row that is not)."""
    amax = np.float32(0.0)
    special = np.uint32(0)
    for k in range(row.size):
        a = abs(row[k])
        amax = a if a > amax else amax
        special |= np.uint32((np.float32(a).view(np.uint32) & _EXPONENT) == _EXPONENT)
    for k in range(row.size):
        if abs(row[k]) == amax:
            return amax, row[k], special == 0
    return amax, np.float32(0.0), special == 0


@nb.njit(nogil=True, cache=True, inline="always")
def _search(row, qw, isc, sums, x, e, signed, targets, flo, fhi):
    """The winning candidate's float32 scale (0 when none has ``s2 > 0``), the candidates in batches of five
    (a batch's unused places skipped)."""
    _fixed(row, _pow2(_FIXED_BITS - e), qw)
    unit = _pow2(e - _FIXED_BITS)
    s_best, best = np.float32(0.0), -1.0
    C = targets.shape[1]
    for c0 in range(0, C, _BATCH):
        for b in range(_BATCH):
            iscale = np.float32(0.0)
            if c0 + b < C:
                t = targets[0, c0 + b] if signed or x < 0 else targets[1, c0 + b]
                iscale = np.float32(t / x)
            isc[b] = iscale if np.isfinite(iscale) else np.float32(0.0)  # not finite: skipped (s2 = 0)
        _candidate_sums(row, qw, isc, flo, fhi, sums)
        for b in range(min(_BATCH, C - c0)):
            fx, f2 = sums[b], sums[_BATCH + b]
            if f2 > 0:
                score = fx * fx / f2
                if score > best:
                    best, s_best = score, np.float32(fx / f2 * unit)
    return s_best


@export("mse_group_rows", ("float32", "i", "i", "b", "float32", "float32[]", "int8"))
@nb.njit(nogil=True, cache=True, error_model="numpy")
def mse_group_rows(w, lo, hi, signed, targets, s_out, v_out, r0, r1):
    """Groups ``w[r]`` for ``r`` in ``[r0, r1)`` (float32 ``[N, n]``, ``n % 8 == 0``) -> ``s_out[r]`` and the
    values ``v_out[r]`` (int8). Returns -1 (the codecs' "no bad row"), or the first row holding a NaN or an
    infinity (the rows after it are left unwritten)."""
    n = w.shape[1]
    flo, fhi = np.float32(lo), np.float32(hi)
    v0, v1 = np.empty(n, np.float32), np.empty(n, np.float32)
    qw, row = np.empty(n, np.float32), np.empty(n, np.float32)
    isc, sums = np.empty(_BATCH, np.float32), np.empty(2 * _BATCH, np.float64)
    for r in range(r0, r1):
        # this thread's copy of the group: a view of ``w`` (and of its views) would count references on the
        # array the other threads read, an atomic on a cache line the cores then pass back and forth
        for k in range(n):
            row[k] = w[r, k]
        amax, x, finite = _extreme(row)
        if not finite:
            return r
        s0 = np.float32(amax / fhi)
        if s0 < _FLOOR:
            s0 = _FLOOR
        s1 = np.float32(0.0)
        if amax > 0:
            s1 = _search(row, qw, isc, sums, x, _exponent(amax), signed, targets, flo, fhi)
        _codes(row, s0, flo, fhi, v0)
        use = np.isfinite(s1) and abs(s1) >= _FLOOR
        if use:
            _codes(row, s1, flo, fhi, v1)
            use = _smaller_error(row, v1, s1, v0, s0)
        s_out[r] = s1 if use else s0
        src = v1 if use else v0
        for k in range(n):
            v_out[r, k] = np.int8(src[k])
    return -1
