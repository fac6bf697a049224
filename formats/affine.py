"""MLX-affine integer codec (docs/FORMATS.md §2 "affine4-g{gs} / affine8-g{gs}"): the numpy reference.

A row of ``I`` weights in groups of ``gs`` consecutive inputs; each group has a scale ``s`` and a bias ``b``
(BF16) and unsigned codes ``q`` in ``[0, top]`` (``top = 2^bits - 1``); a weight decodes as
``float32(float32(s * q) + b)``. This is what colibri's ``c/affine_quant.h`` reads (``COLI_AFFINE_MLX_Q4`` /
``_Q8`` with ``COLI_AFFINE_SCALAR_BF16``) and what MLX's ``mx.quantize(mode="affine")`` stores:

* **codes**: little-endian uint32 words along the input, ``32 / bits`` codes per word, the lowest bits the lowest
  input; as bytes, 4 bits: byte ``k`` = ``q[2k] | q[2k + 1] << 4``, 8 bits: byte ``k`` = ``q[k]`` (``pack``);
  a row is ``I * bits / 8`` bytes (``I`` a multiple of ``gs``, itself a multiple of 8);
* **scalars**: one BF16 array ``[2, O, I / gs]``, the scales then the biases, each row-major ``[O, I / gs]``:
  the two tensors (sections) MLX and QPACK name ``<name>.scales`` and ``<name>.biases``, back to back.

Two fits, every floating-point step fixed so that a kernel can follow it byte for byte:

* ``rtn`` (the plain min-max fit): ``mn``, ``mx`` the group's min and max (float32), ``s = bf16(float32(mx - mn)
  / top)``, ``b = bf16(mn)`` (round to nearest even; ``bf16`` keeps the value as float32).
* ``mse`` (an asymmetric search in the spirit of llama.cpp's ``make_qkx2_quants``, data-free): for each offset
  ``d`` of ``OFFSETS`` a trial inverse scale ``t = float32(top + d) / float32(mx - mn)`` (skipped when ``mx ==
  mn``) gives trial codes ``l = clip(rint(float32(w - mn) * t), 0, top)``; a least-squares refit of ``(s, b)``
  to ``l`` in exact integer arithmetic on the fixed-point values ``qw = rint(w * 2^(16 - e))`` (float64 product,
  ``e`` the ``frexp`` exponent of the group's largest magnitude): with ``n = gs``, ``L = sum l``, ``LL = sum
  l^2``, ``W = sum qw``, ``LW = sum l * qw`` and ``D = n * LL - L^2`` (skipped when ``D == 0``), ``s =
  bf16(float32(float64(n * LW - L * W) / float64(D) * 2^(e - 16)))`` and ``b = bf16(float32(float64(LL * W - L
  * LW) / float64(D) * 2^(e - 16)))`` (skipped unless ``s > 0`` and both finite). Each trial and rtn are then
  scored by the squared error of their own codes (below); the smallest error wins, the first on a tie, and a
  trial replaces rtn only when its error is strictly smaller: never worse than rtn, group by group.

Codes of a written ``(s, b)``: ``q = clip(rint(float32(w - b) / s), 0, top)`` (float32 true division, round half
to even; ``q = 0`` where ``s == 0``), the nearest code to every weight for the scalars written. Squared error:
``sum((float32(float32(s * q) + b) - w)^2)`` in float64 in ``quantizers.lane_sum``'s lane order.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from colitools.formats.quantizers import LANES, RTN, lane_sum

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)  # MLX's affine group sizes; each a multiple of 8 codes (one U32 word at 4 bits)
DEFAULT_GROUP_SIZE = 64
FIXED_BITS = 16  # the refit's fixed point: |qw| <= 2^16
# Trial offsets of the code range (``top + d`` steps over ``mx - mn``), llama.cpp's make_qkx2_quants range
# [-1, 1]; the step is chosen by measurement (bench/affine.py, docs/FORMATS.md §11).
OFFSETS = tuple(round(-1.0 + 0.25 * k, 2) for k in range(9))


def top(bits: int) -> int:
    """The largest code of a ``bits``-bit affine format."""
    return (1 << bits) - 1


def row_nbytes(I: int, bits: int) -> int:
    """Bytes of one code row: ``I * bits / 8``."""
    return I * bits // 8


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 ``x`` to bfloat16 (nearest even), kept as float32 values."""
    return np.asarray(x, F32).astype(BF16).astype(F32)


def codes_of(w: np.ndarray, s: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``clip(rint(float32(w - b) / s), 0, top)`` per group (``w[N, n]``, ``s``, ``b`` ``[N]``), 0 where ``s`` is 0
    or infinite (a range past float32's, which ``encode`` refuses); int64."""
    with np.errstate(all="ignore"):
        q = np.clip(np.rint((w - b[:, None]) / s[:, None]), 0, top(bits))
        return np.where(((s > 0) & np.isfinite(s))[:, None], q, 0).astype(np.int64)


def squared_error(w: np.ndarray, s: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``sum((float32(float32(s * q) + b) - w)^2)`` per group, float64 in the lane order."""
    v = ((s[:, None] * q.astype(F32)).astype(F32) + b[:, None]).astype(F32)
    d = v.astype(np.float64) - w.astype(np.float64)
    return lane_sum(d * d)


def _minmax(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    mn, mx = w.min(axis=1), w.max(axis=1)
    rng = (mx - mn).astype(F32)
    s = bf16(rng / F32(top(bits)))
    return mn, rng, s, bf16(mn)


def _refit(l: np.ndarray, qw: np.ndarray, unit: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact least-squares ``(s, b, usable)`` of codes ``l`` to fixed-point values ``qw`` (int64 ``[N, n]``)."""
    n = l.shape[1]
    L, LL = l.sum(axis=1), (l * l).sum(axis=1)
    W, LW = qw.sum(axis=1), (l * qw).sum(axis=1)
    D = n * LL - L * L
    ok = D > 0
    Df = np.where(ok, D, 1).astype(np.float64)
    s = bf16(((n * LW - L * W).astype(np.float64) / Df * unit).astype(F32))
    b = bf16(((LL * W - L * LW).astype(np.float64) / Df * unit).astype(F32))
    return s, b, ok & (s > 0) & np.isfinite(s) & np.isfinite(b)


def fit_groups(w: np.ndarray, bits: int, quantizer: str = RTN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(scales, biases, codes)`` of float32 groups ``w[N, n]`` (finite, ``n`` a multiple of 8): scales and biases
    float32 values of BF16 ``[N]``, codes int64 ``[N, n]`` (the module's rules)."""
    if w.shape[1] % LANES:
        raise ValueError(f"affine groups must be a multiple of {LANES} long, got {w.shape[1]}")
    with np.errstate(all="ignore"):  # huge groups overflow a trial to inf: never usable
        mn, rng, s, b = _minmax(w, bits)
        q = codes_of(w, s, b, bits)
        if quantizer == RTN:
            return s, b, q
        best = squared_error(w, s, b, q)
        amax = np.abs(w).max(axis=1)
        e = np.frexp(amax)[1].astype(np.int64)
        qw = np.rint(w.astype(np.float64) * np.ldexp(1.0, FIXED_BITS - e)[:, None]).astype(np.int64)
        unit = np.ldexp(1.0, e - FIXED_BITS)
        for d in OFFSETS:
            t = (F32(top(bits) + d) / rng).astype(F32)
            live = (rng > 0) & np.isfinite(t)
            l = np.clip(np.rint((w - mn[:, None]) * np.where(live, t, F32(0))[:, None]), 0, top(bits))
            ts, tb, ok = _refit(l.astype(np.int64), qw, unit)
            ok &= live
            tq = codes_of(w, np.where(ok, ts, F32(0)), tb, bits)
            err = squared_error(w, ts, tb, tq)
            take = ok & (err < best)
            best = np.where(take, err, best)
            s, b = np.where(take, ts, s), np.where(take, tb, b)
            q = np.where(take[:, None], tq, q)
    return s.astype(F32), b.astype(F32), q


def overflow(scalars: np.ndarray, gs: int) -> tuple[int, int] | None:
    """``[row, col]`` of the first weight of the first group whose scale is infinite (its range passes float32's:
    it would decode to NaN, so the encoders refuse it), or None."""
    s = np.asarray(scalars).astype(F32)[0]
    bad = np.argwhere(~np.isfinite(s))
    return None if bad.size == 0 else (int(bad[0][0]), int(bad[0][1]) * gs)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Codes ``[O, I]`` (0..top) -> the little-endian word bytes ``uint8 [O, I * bits / 8]``."""
    q = q.astype(np.uint8)
    if bits == 8:
        return np.ascontiguousarray(q)
    return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4))


def unpack(codes: np.ndarray, O: int, I: int, bits: int) -> np.ndarray:
    """The inverse of ``pack``: ``uint8 [O, I]`` codes."""
    c = np.ascontiguousarray(codes, dtype=np.uint8).reshape(O, row_nbytes(I, bits))
    if bits == 8:
        return c
    q = np.empty((O, I), np.uint8)
    q[:, 0::2], q[:, 1::2] = c & 0x0F, c >> 4
    return q


def encode(
    w: np.ndarray, bits: int, gs: int, quantizer: str = RTN, fit: Callable | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``w[O, I]`` (``I % gs == 0``) -> ``(codes uint8 [O, I * bits / 8], scalars BF16 [2, O, I / gs])``;
    ``fit``: the kernels' byte-identical ``fit_groups`` (``kernels/affine.py``), numpy's when None."""
    O, I = w.shape
    s, b, q = (fit or fit_groups)(np.ascontiguousarray(w, F32).reshape(O * (I // gs), gs), bits, quantizer)
    scalars = np.stack([s.reshape(O, I // gs), b.reshape(O, I // gs)]).astype(BF16)
    return pack(q.reshape(O, I), bits), scalars


def decode(codes: np.ndarray, scalars: np.ndarray, O: int, I: int, bits: int, gs: int) -> np.ndarray:
    """``float32(float32(s * q) + b)`` per weight, float32 ``[O, I]``."""
    sb = np.asarray(scalars).view(BF16).astype(F32).reshape(2, O, I // gs)
    q = unpack(codes, O, I, bits).astype(F32).reshape(O, I // gs, gs)
    v = (sb[0][:, :, None] * q).astype(F32) + sb[1][:, :, None]
    return v.astype(F32).reshape(O, I)
