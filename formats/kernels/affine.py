"""The MLX-affine fits on the kernels (numba-free driver): ``fit_groups`` has the signature and the bytes of
``affine.fit_groups``, the groups spread over the kernels' thread pool (``threads.run_rows``), so the result is
the same on any thread count. ``_dispatch._mse_encode`` hands it to the affine formats' encoder as its fit."""

from __future__ import annotations

import numpy as np

from colitools.formats import affine
from colitools.formats.kernels.mse import _NonFiniteGroup


def fit_groups(w: np.ndarray, bits: int, quantizer: str = affine.RTN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``affine.fit_groups`` on the kernel: float32 groups ``w[N, n]`` (``n % 8 == 0``); _NonFiniteGroup when one
    holds a NaN or an infinity."""
    from colitools.formats.kernels import aot

    w = np.ascontiguousarray(w, dtype=np.float32)
    N, n = w.shape
    if N == 0 or n == 0 or n % affine.LANES:
        return affine.fit_groups(w, bits, quantizer)
    s, b = np.empty(N, np.float32), np.empty(N, np.float32)
    q = np.empty((N, n), np.uint8)
    numerators = np.array([affine.top(bits) + d for d in affine.OFFSETS], np.float32)
    args = (w, affine.top(bits), quantizer != affine.RTN, numerators, s, b, q)
    bad = aot.CODECS.run("affine_group_rows", args, N, n)
    if bad >= 0:
        raise _NonFiniteGroup(f"group {bad} holds a NaN or an infinity")
    return s, b, q
