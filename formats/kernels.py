"""Fast encode kernels (placeholder: dispatches to the numpy reference until the numba kernels land)."""

from __future__ import annotations

import numpy as np

from colitools.formats import reference as ref


def encode(fmt_name: str, w: np.ndarray, gs: int | None, *, name: str = "") -> tuple[np.ndarray, np.ndarray]:
    from colitools.formats.registry import _check_finite

    _check_finite(w, name)
    if fmt_name == "int8-row":
        return ref.encode_int8_row(w)
    if fmt_name == "int4-row":
        return ref.encode_int4_row(w)
    if fmt_name == "int2-row":
        return ref.encode_int2_row(w)
    if fmt_name == "int4-grouped":
        return ref.encode_int4_grouped(w, gs)
    if fmt_name == "int3-g64":
        return ref.encode_int3_g64(w)
    if fmt_name == "mxfp4":
        return ref.encode_mxfp4(w)
    raise ValueError(fmt_name)
