"""The numba kernel of ``error_stats.tensor_error``: one pass over a row of source and decoded values, float64
sums per row (``fastmath``: the sums may be reassociated into SIMD lanes, so the last bits of a figure depend on
the machine's vector width, never on the thread count: rows are summed separately and added in row order by the
caller). In the compiled-ahead set (``aot.CODECS``) like the codecs."""

from __future__ import annotations

import numba as nb
import numpy as np

from colitools.formats.kernels.aot import export


@export("error_rows", ("float32", "float32", "float64"))
@nb.njit(nogil=True, cache=True, fastmath=True)
def error_rows(a, b, out, r0, r1):
    """Rows ``[r0, r1)`` of float32 ``a`` (source) and ``b`` (decoded) -> ``out[r] = (sse, ssw, ssq, dot,
    max |b - a|)``. Returns -1 (the codecs' "no bad row" convention)."""
    n = a.shape[1]
    for r in range(r0, r1):
        x, y = a[r], b[r]
        sse = ssw = ssq = dot = 0.0
        m = 0.0
        for k in range(n):
            xa = np.float64(x[k])
            yb = np.float64(y[k])
            d = yb - xa
            sse += d * d
            ssw += xa * xa
            ssq += yb * yb
            dot += xa * yb
            m = max(m, abs(d))
        out[r, 0], out[r, 1], out[r, 2], out[r, 3], out[r, 4] = sse, ssw, ssq, dot, m
    return -1
