"""What a conversion lost, tensor by tensor: the one definition of the error figures (FORMATS §11) that
``convert`` records in its manifest, ``verify quality`` reports and the size budget (§10) minimises.

A tensor's figures are four sums and one maximum over its elements, with ``x`` the source's decoded float32
values and ``y`` the output's decoded float32 values (both exact decodes), ``d = float32(y - x)``:

* ``sse = sum(d^2)``, ``ssw = sum(x^2)``, ``ssq = sum(y^2)``, ``dot = sum(x * y)``, ``n`` elements;
* ``max_abs = max |d|``.

The sums run in one fixed order (``row_sums``, the readable spec the kernels ``kernels/_jit_stats.py`` equal bit
for bit), the same on every machine and thread count: row by row (the last axis; a 1-D tensor is one row), a row
in blocks of ``BLOCK`` elements; in a block, every term rounded to float32, lane ``j`` of ``LANES`` summing the
terms of elements ``j, j + LANES, ...`` in order in float32 (past the row's end: zeros), the lanes folded in
halves (``l[j] + l[j + h]``, h = 8, 4, 2, 1); the blocks' sums added to the row's in float64 in block order; the
rows' added by numpy (``from_rows``). Each sum is within ``(BLOCK / LANES + 6) * 2^-24`` (1.3e-6) of the exact
sum of its terms relatively (of the sum of their magnitudes, for ``dot``), plus ``n * 2^-149`` (terms below
float32's normal range): ``REL_BOUND`` and ``TINY``. A row whose float32 sums overflow (a value beyond ~1.8e19)
is summed in float64 in element order instead (``d`` then the float64 difference).

From them: relative Frobenius error ``sqrt(sse / ssw)``, cosine ``dot / sqrt(ssw * ssq)``, SQNR in dB
``10 log10(ssw / sse)`` (infinite for a lossless tensor). Sums add, so a role's, a layer's or a format's
figures are the sums of its tensors' (aggregates are never means of ratios). An all-zero source tensor has
relative error 0 when it is reproduced exactly, else infinite; its cosine is 1 when both are zero.

Numpy only (this package imports nothing of ours).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

LANES = 16  # float32 lanes of a block (FORMATS §11): one <16 x float> per sum in the kernels
BLOCK = 256  # elements of a row per block: a lane sums BLOCK / LANES terms in float32 before the float64 sum
# Each sum lies within REL_BOUND of the exact sum of its exact terms' magnitudes, plus n * TINY (the module's
# docstring): BLOCK / LANES - 1 float32 additions in a lane, 4 in the fold, the term's product and difference
REL_BOUND = (BLOCK // LANES + 6) * 2.0**-24
TINY = 2.0**-149
# recorded beside a unit's figures (colitools.json ``units.<unit>.error_order``): this order. A unit without it
# holds figures colitools summed in float64 before (exact to ~1e-13): within REL_BOUND of these, not bit for bit
SUM_ORDER = "f32x16-b256"
# elements summed at once by the numpy path: bounds its temporaries (~5 float32 copies) whatever the tensor's size
_CHUNK_ELEMS = 1 << 20
_F32 = np.float32


@dataclass(frozen=True)
class ErrorStats:
    """Sums over a tensor (or a set of tensors) of source values ``w`` and decoded output values ``w'``."""

    n: int = 0
    sse: float = 0.0
    ssw: float = 0.0
    ssq: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0

    def __add__(self, other: ErrorStats) -> ErrorStats:
        return ErrorStats(
            self.n + other.n,
            self.sse + other.sse,
            self.ssw + other.ssw,
            self.ssq + other.ssq,
            self.dot + other.dot,
            max(self.max_abs, other.max_abs),
        )

    @property
    def rel_error(self) -> float:
        """``||w' - w|| / ||w||`` (0 for a lossless tensor, inf for a lossy all-zero one)."""
        if self.sse == 0.0:
            return 0.0
        return math.sqrt(self.sse / self.ssw) if self.ssw > 0 else math.inf

    @property
    def rmse(self) -> float:
        """Root mean squared error per element."""
        return math.sqrt(self.sse / self.n) if self.n else 0.0

    @property
    def cosine(self) -> float:
        """``<w', w> / (||w'|| ||w||)``; 1 when both are zero, 0 when exactly one is."""
        if self.ssw == 0.0 and self.ssq == 0.0:
            return 1.0
        if self.ssw == 0.0 or self.ssq == 0.0:
            return 0.0
        return self.dot / math.sqrt(self.ssw * self.ssq)

    @property
    def sqnr_db(self) -> float:
        """``10 log10(||w||^2 / ||w' - w||^2)`` in dB; inf for a lossless tensor."""
        if self.sse == 0.0:
            return math.inf
        if self.ssw == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.ssw / self.sse)

    def to_json(self) -> dict[str, float | int | None]:
        """The sums and the derived figures; an infinite figure is ``None`` (JSON has no infinity)."""
        out: dict[str, float | int | None] = dict(asdict(self))
        for key in ("rel_error", "cosine", "sqnr_db"):
            value = getattr(self, key)
            out[key] = value if math.isfinite(value) else None
        return out

    @classmethod
    def from_json(cls, d: dict) -> ErrorStats:
        """The sums of ``to_json`` (derived figures are recomputed, never read)."""
        return cls(int(d["n"]), float(d["sse"]), float(d["ssw"]), float(d["ssq"]), float(d["dot"]),
                   float(d["max_abs"]))


def tensor_error(source: np.ndarray, decoded: np.ndarray) -> ErrorStats:
    """The figures of one tensor: ``source`` and ``decoded`` hold the same number of float values (any float
    dtype, both taken as float32; rows: the last axis when the shapes are equal, else one row of all values in C
    order). A float32 or BF16 matrix of ``KERNEL_ELEMS`` elements or more goes to the kernel
    (``kernels/_jit_stats.py``, compiled ahead: one pass, rows on the kernels' threads; ``row_sums`` bit for bit)."""
    if np.ndim(source) == 2 and np.size(source) >= KERNEL_ELEMS and np.shape(source) == np.shape(decoded):
        return _kernel_error(source, decoded)
    a, b = np.asarray(source), np.asarray(decoded)
    if a.size != b.size:
        raise ValueError(f"error statistics of {a.size} source values against {b.size} decoded values")
    width = a.shape[-1] if a.ndim >= 2 and a.shape == b.shape and a.size else max(a.size, 1)
    a, b = a.reshape(-1, width), b.reshape(-1, width)
    step = max(1, _CHUNK_ELEMS // width)
    rows = [row_sums(a[r : r + step], b[r : r + step]) for r in range(0, a.shape[0], step)]
    return from_rows(int(a.size), np.concatenate(rows) if rows else np.zeros((0, 5)))


def row_sums(source: np.ndarray, decoded: np.ndarray) -> np.ndarray:
    """``[R, 5]`` float64 ``(sse, ssw, ssq, dot, max_abs)`` of each row of ``source`` and ``decoded`` (``[R, n]``,
    any float dtype, taken as float32): the module's order, the one the kernels follow."""
    x = np.asarray(source).astype(_F32)
    y = np.asarray(decoded).astype(_F32)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is found below and summed again
        return _row_sums(x, y)


def _row_sums(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    R, n = x.shape
    out = np.zeros((R, 5))
    cols = max(BLOCK, _CHUNK_ELEMS // max(R, 1) // BLOCK * BLOCK)  # whole blocks at a time
    for c0 in range(0, n, cols):
        xs, ys = x[:, c0 : c0 + cols], y[:, c0 : c0 + cols]
        d = ys - xs
        if d.size:
            out[:, 4] = np.maximum(out[:, 4], np.abs(d).max(axis=1))
        blocks = _block_sums(np.stack([d * d, xs * xs, ys * ys, xs * ys]))  # [4, R, blocks] float32
        for k in range(blocks.shape[2]):  # the blocks' sums into the row's, float64, in block order
            out[:, :4] += blocks[:, :, k].T.astype(np.float64)
    for r in np.flatnonzero(~np.isfinite(out[:, :4]).all(axis=1)):  # float32 overflow: float64, element order
        x64, y64 = x[r].astype(np.float64), y[r].astype(np.float64)
        d64 = y64 - x64
        out[r, :4] = [np.cumsum(t)[-1] for t in (d64 * d64, x64 * x64, y64 * y64, x64 * y64)]
    return out


def _block_sums(terms: np.ndarray) -> np.ndarray:
    """``terms [..., n]`` float32 -> ``[..., ceil(n / BLOCK)]``: each block's lanes summed in order, then folded."""
    n = terms.shape[-1]
    blocks = -(-n // BLOCK)
    padded = np.zeros((*terms.shape[:-1], blocks * BLOCK), _F32)  # past the row's end: zeros (add nothing)
    padded[..., :n] = terms
    steps = padded.reshape(*terms.shape[:-1], blocks, BLOCK // LANES, LANES)
    lanes = np.zeros((*terms.shape[:-1], blocks, LANES), _F32)
    for k in range(BLOCK // LANES):  # lane j: elements j, j + LANES, ... in order
        lanes = lanes + steps[..., k, :]
    h = LANES // 2
    while h:  # folded in halves: l[j] + l[j + h]
        lanes = lanes[..., :h] + lanes[..., h : 2 * h]
        h //= 2
    return lanes[..., 0]


_BF16 = np.dtype(ml_dtypes.bfloat16)
KERNEL_ELEMS = 1 << 16  # from this size on, the kernel (numba's start-up is paid by the encoders anyway)


def _kernel_error(source: np.ndarray, decoded: np.ndarray) -> ErrorStats:
    from colitools.formats.kernels import aot

    b = np.ascontiguousarray(decoded, dtype=np.float32)
    rows = np.empty((b.shape[0], 5), np.float64)
    if np.asarray(source).dtype == _BF16:  # its bits: no float32 copy of the tensor
        a = np.ascontiguousarray(source).view(np.uint16)
        aot.CODECS.run("error_rows_bf16", (a, b, rows), *b.shape)
    else:
        a = np.ascontiguousarray(source, dtype=np.float32)
        aot.CODECS.run("error_rows", (a, b, rows), *b.shape)
    return from_rows(int(a.size), rows)


def from_rows(n: int, rows: np.ndarray) -> ErrorStats:
    """The figures of ``n`` elements from their rows' ``row_sums`` (``[R, 5]``, a kernel's or the reference's)."""
    sums = rows[:, :4].sum(axis=0)  # rows added in a fixed (numpy pairwise) order: thread count invisible
    return ErrorStats(n, *(float(v) for v in sums), float(rows[:, 4].max()) if len(rows) else 0.0)


def encoded_error(
    source: np.ndarray, fmt_name: str, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None
) -> ErrorStats | None:
    """``tensor_error(source, decoded)`` of a written tensor given as its codes and scales (pairs order) instead
    of its decoded values: for an int8-row, int4-row or int4-grouped tensor of ``KERNEL_ELEMS`` elements or more
    from a float32 or BF16 ``source [O, I]``, the decode runs inside the sums kernel a block of rows at a time
    (no float32 copy of the decoded tensor, one pass; the same figures bit for bit); None otherwise (the caller
    decodes and calls ``tensor_error``)."""
    src = np.asarray(source)
    if src.shape != (O, I) or src.size < KERNEL_ELEMS or src.dtype not in (np.float32, _BF16):
        return None
    from colitools.formats.kernels import decoders

    rows = decoders.error_rows(src, fmt_name, codes, scales, O, I, gs)
    return None if rows is None else from_rows(O * I, rows)


def total(stats: Iterable[ErrorStats]) -> ErrorStats:
    """The sum of several tensors' figures (a role, a layer, a format, the whole model)."""
    out = ErrorStats()
    for s in stats:
        out = out + s
    return out
