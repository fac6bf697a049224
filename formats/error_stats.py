"""What a conversion lost, tensor by tensor: the one definition of the error figures (FORMATS §11) that
``convert`` records in its manifest, ``verify quality`` reports and the size budget (§10) minimises.

A tensor's figures are five float64 sums and one maximum over its elements, with ``w`` the source's decoded
float32 values and ``w'`` the output's decoded float32 values (both exact decodes; the difference is taken in
float64):

* ``sse = sum((w' - w)^2)``, ``ssw = sum(w^2)``, ``ssq = sum(w'^2)``, ``dot = sum(w' * w)``, ``n`` elements;
* ``max_abs = max |w' - w|`` (on the kernel: the float32 difference, within 2^-24 of the exact one).

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

# rows summed at once: bounds the float64 temporaries to ~8 MB whatever the tensor's size
_CHUNK_ELEMS = 1 << 20


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
    """The figures of one tensor: ``source`` and ``decoded`` hold the same number of float values (any shape,
    any float dtype; compared element by element in C order, in float64). A float32 matrix of ``KERNEL_ELEMS``
    elements or more goes to the kernel (``kernels/_jit_stats.py``, compiled ahead: one pass, rows on the kernels'
    threads; the same figures to the last few bits)."""
    if np.ndim(source) == 2 and np.size(source) >= KERNEL_ELEMS and np.shape(source) == np.shape(decoded):
        return _kernel_error(source, decoded)
    a = np.asarray(source).reshape(-1)
    b = np.asarray(decoded).reshape(-1)
    if a.size != b.size:
        raise ValueError(f"error statistics of {a.size} source values against {b.size} decoded values")
    total = ErrorStats()
    for start in range(0, a.size, _CHUNK_ELEMS):
        x = a[start : start + _CHUNK_ELEMS].astype(np.float64)
        y = b[start : start + _CHUNK_ELEMS].astype(np.float64)
        d = y - x
        # numpy's pairwise sums, not BLAS dot products (whose order can depend on its thread count): the same
        # figures on every machine, so a resumed conversion records what an uninterrupted one does
        total = total + ErrorStats(
            int(x.size),
            float(np.sum(d * d)),
            float(np.sum(x * x)),
            float(np.sum(y * y)),
            float(np.sum(x * y)),
            float(np.max(np.abs(d))) if d.size else 0.0,
        )
    return total


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
    return _from_rows(int(a.size), rows)


def _from_rows(n: int, rows: np.ndarray) -> ErrorStats:
    sums = rows[:, :4].sum(axis=0)  # rows added in a fixed (numpy pairwise) order: thread count invisible
    return ErrorStats(n, *(float(v) for v in sums), float(rows[:, 4].max()))


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
    return None if rows is None else _from_rows(O * I, rows)


def total(stats: Iterable[ErrorStats]) -> ErrorStats:
    """The sum of several tensors' figures (a role, a layer, a format, the whole model)."""
    out = ErrorStats()
    for s in stats:
        out = out + s
    return out
