"""The numba kernels of ``error_stats.tensor_error``: one pass over a row of source and decoded values, float64
sums per row (``fastmath``: the sums are reassociated into SIMD lanes, so the last bits of a figure depend on the
machine's vector width, never on the thread count: rows are summed separately and added in row order by the
caller), the largest difference as the float32 ``|w' - w|`` (its bits compared as integers: a max the vectoriser
takes). A BF16 source is read as its bits (no float32 copy of the tensor). The ``error_int*`` kernels take the
written tensor's codes and scales instead of its decoded values: a block of rows decoded by the decoders' own
row kernel into a scratch block (in cache), then summed by the same row functions, so the figures are those of
decode-then-``error_rows`` bit for bit without the decoded tensor's float32 copy or a second pass. In the
compiled-ahead set (``aot.CODECS``) like the codecs."""

from __future__ import annotations

import numba as nb
import numpy as np

from colitools.formats.kernels._jit_decoders import _decode_int4_rows, _decode_int8_rows
from colitools.formats.kernels.aot import export

_ABS = np.uint32(0x7FFFFFFF)
_BLOCK = 8  # rows decoded at once into the scratch block of the error_int* kernels


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


@export("error_int4", ("float32", "uint8", "float32", "i", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int4(a, codes, s, gs, out, r0, r1):
    """``error_rows`` of float32 ``a`` against int4 pairs ``codes`` with a scale per ``gs`` inputs (``s [O, G]``;
    ``gs >= I`` for int4-row), decoded as ``_decode_int4_rows`` decodes them."""
    scratch = np.empty((_BLOCK, a.shape[1]), np.float32)
    for r in range(r0, r1, _BLOCK):
        b = min(_BLOCK, r1 - r)
        _decode_int4_rows(codes[r : r + b], s[r : r + b], scratch[:b], gs, 0, b)
        for i in range(b):
            _store(out, r + i, _row_f32(a[r + i], scratch[i]))
    return -1


@export("error_int4_bf16", ("uint16", "uint8", "float32", "i", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int4_bf16(a, codes, s, gs, out, r0, r1):
    """``error_int4`` of a BF16 source given as its bits."""
    scratch = np.empty((_BLOCK, a.shape[1]), np.float32)
    for r in range(r0, r1, _BLOCK):
        b = min(_BLOCK, r1 - r)
        _decode_int4_rows(codes[r : r + b], s[r : r + b], scratch[:b], gs, 0, b)
        for i in range(b):
            _store(out, r + i, _row_bf16(a[r + i], scratch[i]))
    return -1


@export("error_int8", ("float32", "int8", "float32[]", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int8(a, q, s, out, r0, r1):
    """``error_rows`` of float32 ``a`` against int8-row codes ``q`` and row scales ``s``."""
    scratch = np.empty((_BLOCK, a.shape[1]), np.float32)
    for r in range(r0, r1, _BLOCK):
        b = min(_BLOCK, r1 - r)
        _decode_int8_rows(q[r : r + b], s[r : r + b], scratch[:b], 0, b)
        for i in range(b):
            _store(out, r + i, _row_f32(a[r + i], scratch[i]))
    return -1


@export("error_int8_bf16", ("uint16", "int8", "float32[]", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int8_bf16(a, q, s, out, r0, r1):
    """``error_int8`` of a BF16 source given as its bits."""
    scratch = np.empty((_BLOCK, a.shape[1]), np.float32)
    for r in range(r0, r1, _BLOCK):
        b = min(_BLOCK, r1 - r)
        _decode_int8_rows(q[r : r + b], s[r : r + b], scratch[:b], 0, b)
        for i in range(b):
            _store(out, r + i, _row_bf16(a[r + i], scratch[i]))
    return -1
