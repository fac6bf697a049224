"""How a symmetric integer format's scales are chosen (docs/FORMATS.md §9): ``rtn`` (the §2 rules, colibri's own
converters' bytes) or ``mse`` (an error-minimising scale per group, the same bytes per weight).

Decoders never see the choice: int8-row, int4-row, int4-grouped, int2-row and int3-g64 all decode
``code * s``. This module is the numpy reference of the ``mse`` search; the kernel
(``kernels/_jit_mse.py``) reproduces it byte for byte, so every floating-point step below is fixed:

1. **rtn**, as §2: ``s0 = max(amax / hi, 1e-8)``, ``v0 = clip(rint(w / s0), lo, hi)``.
2. **Candidates** (llama.cpp's ``make_qx_quants`` idea): ``x`` is the group's first element of largest
   magnitude; for each offset ``d`` in ``CANDIDATE_OFFSETS`` a target code ``t = lo + d`` (``signed``: the extreme
   goes to the long side of the code range whatever its sign, so a positive extreme gives a negative scale) or,
   positive scales only, ``t = lo + d`` for a negative ``x`` and ``hi + d`` for a positive one; ``iscale = t / x``
   (float32 division), codes ``l = clip(rint(w * iscale), lo, hi)`` (float32 product).
3. **Least-squares refit** of each candidate (a candidate whose ``iscale`` is not finite is skipped), in exact
   integer arithmetic so that its sums have no order: the group's values in fixed point, ``qw = rint(w * 2^(16 -
   e))`` (float64 product, an integer of at most 16 bits) with ``e`` the exponent of ``amax`` (``frexp``: ``amax =
   m * 2^e``, ``0.5 <= m < 1``); ``sx = sum(l * qw)``, ``s2 = sum(l * l)`` as exact integers; score
   ``float64(sx)^2 / float64(s2)``, scale ``float64(sx) / float64(s2) * 2^(e - 16)`` rounded to float32. The
   candidate of the highest score wins (the first on a tie; none when ``s2 == 0``).
4. **Codes of the written scale**: ``v = clip(rint(w / s), lo, hi)`` (float32 true division, as rtn), so the
   codes are always the best for the scale written.
5. **Never worse than rtn**: the squared errors ``sum((float32(v * s) - w)^2)`` of both, in float64 in the lane
   order; the candidate is written only if its error is strictly smaller, and only if ``|s| >= 1e-8`` (rtn's
   floor), so an all-zero group keeps rtn's bytes.

Lane order of the float64 error sums: a group's ``n`` elements (zero-padded to a multiple of ``LANES``; a zero
adds nothing to any sum) are summed in ``LANES`` lanes, lane ``j`` taking elements ``j, j + 8, ...`` in order, then
the lanes pairwise, ``((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))``: a fixed order a kernel can follow.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

F32 = np.float32
SCALE_FLOOR = F32(1e-8)  # rtn's floor (reference.SCALE_FLOOR): the smallest scale magnitude mse writes

RTN = "rtn"
MSE = "mse"
QUANTIZERS = (RTN, MSE)  # what a user chooses (``convert --quantizer``)
# the encoders' modes: ``mse`` with signed scales, or with positive scales only where a target's engine has not
# been shown to multiply by a negative scale (the target decides, ``targets.Target.signed_scales``)
MSE_POSITIVE = "mse-positive"
MODES = (RTN, MSE, MSE_POSITIVE)
LANES = 8
# Offsets of the target code from the end of the code range. Measured on Gaussian / Laplace / Student-t(4)
# [256, 1024] weights: llama.cpp's 19 (0.1 steps) and these 5 give the same relative RMSE within 0.003 for
# int4-g64 / int4-row / int3-g64 / int2-row (9 at 0.2 steps: within 0.001 of these 5), at a quarter of the cost.
CANDIDATE_OFFSETS = tuple(0.4 * k for k in range(-2, 3))


def signed(mode: str) -> bool:
    """Whether encoder mode ``mode`` (``MODES``) may write negative scales."""
    if mode not in MODES:
        raise ValueError(f"unknown quantizer mode {mode!r} (known: {', '.join(MODES)})")
    return mode == MSE


def mode_for(quantizer: str, signed_scales: bool) -> str:
    """The encoder mode of a user's ``quantizer`` for a target that does (not) read negative scales."""
    if quantizer == MSE and not signed_scales:
        return MSE_POSITIVE
    return quantizer


def candidate_targets(lo: int, hi: int) -> np.ndarray:
    """``[2, C]`` float32 target codes: row 0 for the ``lo`` side, row 1 for the ``hi`` side."""
    return np.array([[lo + d for d in CANDIDATE_OFFSETS], [hi + d for d in CANDIDATE_OFFSETS]], dtype=F32)


def lane_sum(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis (a multiple of ``LANES`` long) in the lane order, in ``x``'s dtype."""
    n = x.shape[-1]
    lanes = np.cumsum(x.reshape(*x.shape[:-1], n // LANES, LANES), axis=-2)[..., -1, :]  # sequential per lane
    pairs = lanes[..., 0::2] + lanes[..., 1::2]
    quads = pairs[..., 0::2] + pairs[..., 1::2]
    return quads[..., 0] + quads[..., 1]


def squared_error(w: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``sum((float32(v * s) - w)^2)`` per group in float64, lane order: ``w``, ``v`` ``[N, n]``, ``s`` ``[N]``."""
    d = (v * s[:, None]).astype(F32).astype(np.float64) - w.astype(np.float64)
    return lane_sum(d * d)


def _quantize(w: np.ndarray, s: np.ndarray, lo: int, hi: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.clip(np.rint(w / s[:, None]), lo, hi).astype(F32)


def mse_groups(w: np.ndarray, lo: int, hi: int, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(scales float32 [N], values int8 [N, n])`` for float32 groups ``w[N, n]`` (finite, ``n`` a multiple of
    ``LANES``, zero-padded by the caller): the module's steps 1-5."""
    N, n = w.shape
    if n % LANES:
        raise ValueError(f"mse groups must be a multiple of {LANES} long, got {n}")
    with np.errstate(all="ignore"):  # huge groups overflow a candidate's sums to inf: never chosen (step 5)
        return _mse_groups(w, lo, hi, signed)


FIXED_BITS = 16  # step 3's fixed point: |qw| <= 2^16


def _mse_groups(w: np.ndarray, lo: int, hi: int, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    N, n = w.shape
    absw = np.abs(w)
    amax = absw.max(axis=1) if n else np.zeros(N, F32)
    s0 = np.maximum(amax / F32(hi), SCALE_FLOOR).astype(F32)
    v0 = _quantize(w, s0, lo, hi)
    x = w[np.arange(N), absw.argmax(axis=1)] if n else np.zeros(N, F32)
    e = np.frexp(amax)[1].astype(np.int64)
    qw = np.rint(w.astype(np.float64) * np.ldexp(1.0, FIXED_BITS - e)[:, None]).astype(np.int64)
    unit = np.ldexp(1.0, e - FIXED_BITS)  # the fixed point's step, float64
    targets = candidate_targets(lo, hi)
    best, s_best = np.full(N, -1.0), np.zeros(N, F32)
    for c in range(targets.shape[1]):
        t = np.full(N, targets[0, c]) if signed else np.where(x < 0, targets[0, c], targets[1, c])
        iscale = (t.astype(F32) / x).astype(F32)  # x == 0 (an all-zero group): inf / nan, skipped
        ok = (amax > 0) & np.isfinite(iscale)
        l = np.clip(np.rint(w * np.where(ok, iscale, F32(0))[:, None]), lo, hi).astype(np.int64)
        sx, s2 = (l * qw).sum(axis=1), (l * l).sum(axis=1)  # exact: no order
        ok &= s2 > 0
        fx, f2 = sx.astype(np.float64), np.where(ok, s2, 1).astype(np.float64)
        score = np.where(ok, fx * fx / f2, -1.0)
        scale = np.where(ok, fx / f2 * unit, 0.0).astype(F32)
        better = score > best
        best = np.where(better, score, best)
        s_best = np.where(better, scale, s_best)
    usable = (amax > 0) & np.isfinite(s_best) & (np.abs(s_best) >= SCALE_FLOOR)
    s1 = np.where(usable, s_best, s0).astype(F32)
    v1 = _quantize(w, s1, lo, hi)
    take = usable & (squared_error(w, s1, v1) < squared_error(w, s0, v0))
    return np.where(take, s1, s0).astype(F32), np.where(take[:, None], v1, v0).astype(np.int8)


def mse_scales_codes(
    blocks: np.ndarray, lo: int, hi: int, signed: bool, search: Callable | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``search`` (default ``mse_groups``; the kernel's ``kernels.mse_groups`` is byte-identical) over
    ``blocks[..., n]`` of any leading shape (rows ``[O, I]`` or groups ``[O, G, gs]``), each group zero-padded to
    a multiple of ``LANES``: ``(scales [...], values int8 [..., n])``."""
    lead, n = blocks.shape[:-1], blocks.shape[-1]
    padded = -(-n // LANES) * LANES
    if padded == n:
        flat = np.ascontiguousarray(blocks.reshape(-1, n), dtype=F32)
    else:
        flat = np.zeros((int(np.prod(lead, dtype=np.int64)), padded), F32)
        flat[:, :n] = blocks.reshape(-1, n)
    s, v = (search or mse_groups)(flat, lo, hi, signed)
    return s.reshape(lead), v[:, :n].reshape(*lead, n)
