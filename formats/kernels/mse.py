"""The ``mse`` group search on the kernels (numba-free driver): ``mse_groups`` has the signature and the bytes of
``quantizers.mse_groups``, the groups spread over the kernels' thread pool (``threads.run_rows``), so the result
is the same on any thread count. The encoders plug it into the numpy reference's packing as ``search``."""

from __future__ import annotations

import numpy as np

from colitools.formats import quantizers


class _NonFiniteGroup(ValueError):
    """A group holds a NaN or an infinity (``_dispatch._mse_encode`` then names the tensor and the first bad
    ``[o, i]``, as every encoder does)."""


def mse_groups(w: np.ndarray, lo: int, hi: int, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """``quantizers.mse_groups`` on the kernel: float32 groups ``w[N, n]`` (``n % 8 == 0``); _NonFiniteGroup when
    one holds a NaN or an infinity (the kernel checks as it finds each group's extreme)."""
    from colitools.formats.kernels import aot

    w = np.ascontiguousarray(w, dtype=np.float32)
    N, n = w.shape
    s = np.empty(N, np.float32)
    v = np.empty((N, n), np.int8)
    if N == 0 or n == 0:
        return quantizers.mse_groups(w, lo, hi, signed)
    targets = quantizers.candidate_targets(lo, hi)
    bad = aot.CODECS.run("mse_group_rows", (w, lo, hi, bool(signed), targets, s, v), N, n)
    if bad >= 0:
        raise _NonFiniteGroup(f"group {bad} holds a NaN or an infinity")
    return s, v
