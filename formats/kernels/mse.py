"""The ``mse`` group search on the kernels (numba-free driver): ``mse_groups`` has the signature and the bytes of
``quantizers.mse_groups``, the groups spread over the kernels' thread pool (``threads.run_rows``), so the result
is the same on any thread count. The encoders plug it into the numpy reference's packing as ``search``;
``mse_int4`` writes an int4 tensor's packed pairs itself, from float32, BF16 or F16 values."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from colitools.formats import quantizers

_BF16 = np.dtype(ml_dtypes.bfloat16)
_INT4 = (-8, 7)


class _NonFiniteGroup(ValueError):
    """A group holds a NaN or an infinity (``_dispatch._mse_encode`` then names the tensor and the first bad
    ``[o, i]``, as every encoder does)."""


def mse_groups(w: np.ndarray, lo: int, hi: int, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """``quantizers.mse_groups`` on the kernel: float32 groups ``w[N, n]`` (``n % 8 == 0``); _NonFiniteGroup when
    one holds a NaN or an infinity (the kernel checks as it finds each group's extreme)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    N, n = w.shape
    if N == 0 or n == 0:
        return quantizers.mse_groups(w, lo, hi, signed)
    s = np.empty(N, np.float32)
    v = np.empty((N, n), np.int8)
    _search("mse_group_rows", w, lo, hi, signed, s, v.view(np.uint8), False)
    return s, v


def fits_int4(O: int, I: int, n: int) -> bool:
    """Whether ``mse_int4`` packs a ``[O, I]`` tensor in groups of ``n`` inputs (``n = I``: one group a row):
    whole groups of a multiple of ``quantizers.LANES`` (hence even) inputs, so each group's pairs are its own
    bytes of the row. Other shapes take the reference's padding around ``mse_groups``."""
    return O > 0 and n > 0 and I % n == 0 and n % quantizers.LANES == 0


def mse_int4(w: np.ndarray, n: int, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """int4 pairs ``[O, I / 2]`` and scales ``[O, I / n]`` of ``w [O, I]`` (float32, ``ml_dtypes.bfloat16`` or
    float16; ``fits_int4``): the bytes of ``reference.encode_int4_grouped`` / ``encode_int4_row`` with the
    ``mse`` search, the BF16 / F16 values upcast in the kernel as each tile is copied."""
    O, I = w.shape
    groups = np.ascontiguousarray(w).reshape(O * I // n, n)
    s = np.empty(groups.shape[0], np.float32)
    codes = np.empty((groups.shape[0], n // 2), np.uint8)
    if groups.dtype == _BF16 or groups.dtype == np.float16:
        kernel = "mse_group_rows_bf16" if groups.dtype == _BF16 else "mse_group_rows_f16"
        _search(kernel, groups.view(np.uint16), *_INT4, signed, s, codes, True)
    else:
        _search("mse_group_rows", groups.astype(np.float32, copy=False), *_INT4, signed, s, codes, True)
    return codes.reshape(O, I // 2), s.reshape(O, I // n)


def _search(kernel: str, groups: np.ndarray, lo: int, hi: int, signed: bool, s: np.ndarray, out: np.ndarray,
            packed: bool) -> None:  # fmt: skip
    from colitools.formats.kernels import aot

    targets = quantizers.candidate_targets(lo, hi)
    bad = aot.CODECS.run(kernel, (groups, lo, hi, bool(signed), targets, s, out, packed), *groups.shape)
    if bad >= 0:
        raise _NonFiniteGroup(f"group {bad} holds a NaN or an infinity")
