"""The numba kernels of ``error_stats.tensor_error``: one pass over a row of source and decoded values, float64
sums per row (``fastmath``: the sums are reassociated into SIMD lanes, so the last bits of a figure depend on the
machine's vector width, never on the thread count: rows are summed separately and added in row order by the
caller), the largest difference as the float32 ``|w' - w|`` (its bits compared as integers: a max the vectoriser
takes). A BF16 source is read as its bits (no float32 copy of the tensor). In the compiled-ahead set
(``aot.CODECS``) like the codecs."""

from __future__ import annotations

import numba as nb
import numpy as np

from colitools.formats.kernels.aot import export

_ABS = np.uint32(0x7FFFFFFF)


@nb.njit(nogil=True, cache=True, fastmath=True, inline="always")
def _add(xf, yf, sse, ssw, ssq, dot, m):
    xd = np.float64(xf)
    yd = np.float64(yf)
    d = yd - xd
    b = np.float32(yf - xf).view(np.uint32) & _ABS
    return sse + d * d, ssw + xd * xd, ssq + yd * yd, dot + xd * yd, (b if b > m else m)


@nb.njit(nogil=True, cache=True, fastmath=True)
def _row_f32(x, y):
    sse = ssw = ssq = dot = 0.0
    m = np.uint32(0)
    for k in range(x.size):
        sse, ssw, ssq, dot, m = _add(x[k], y[k], sse, ssw, ssq, dot, m)
    return sse, ssw, ssq, dot, m


@nb.njit(nogil=True, cache=True, fastmath=True)
def _row_bf16(x, y):
    sse = ssw = ssq = dot = 0.0
    m = np.uint32(0)
    for k in range(x.size):
        xf = np.uint32(np.uint32(x[k]) << np.uint32(16)).view(np.float32)  # BF16 bits -> float32, exact
        sse, ssw, ssq, dot, m = _add(xf, y[k], sse, ssw, ssq, dot, m)
    return sse, ssw, ssq, dot, m


@nb.njit(nogil=True, cache=True, inline="always")
def _store(out, r, sums):
    sse, ssw, ssq, dot, m = sums
    out[r, 0], out[r, 1], out[r, 2], out[r, 3] = sse, ssw, ssq, dot
    out[r, 4] = np.float64(np.uint32(m).view(np.float32))


@export("error_rows", ("float32", "float32", "float64"))
@nb.njit(nogil=True, cache=True)
def error_rows(a, b, out, r0, r1):
    """Rows ``[r0, r1)`` of float32 ``a`` (source) and ``b`` (decoded) -> ``out[r] = (sse, ssw, ssq, dot,
    max |b - a|)``. Returns -1 (the codecs' "no bad row" convention)."""
    for r in range(r0, r1):
        _store(out, r, _row_f32(a[r], b[r]))
    return -1


@export("error_rows_bf16", ("uint16", "float32", "float64"))
@nb.njit(nogil=True, cache=True)
def error_rows_bf16(a, b, out, r0, r1):
    """``error_rows`` of a BF16 source given as its bits (uint16)."""
    for r in range(r0, r1):
        _store(out, r, _row_bf16(a[r], b[r]))
    return -1
