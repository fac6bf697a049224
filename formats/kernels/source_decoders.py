"""The numba row kernels of the natively quantized source decoders (docs/FORMATS.md §9). ``_decode`` runs them
(``decode_mxfp4_blocks``, ``decode_pack_quantized``, ``decode_nvfp4``, ``decode_mxfp8``, byte-identical to the
``reference`` functions of the same names, and named here too), or the same kernels compiled ahead of time."""

from __future__ import annotations

import numpy as np

from colitools.formats.kernels._bits import njit
from colitools.formats.kernels._decode import (  # noqa: F401 (the public decoders, numba-free, named here too)
    decode_mxfp4_blocks,
    decode_mxfp8,
    decode_nvfp4,
    decode_pack_quantized,
)


@njit
def _nib_scaled_rows(packed, s, vals, stab, block, out, r0, r1):
    """out[o, i] = vals[nib(o, i)] * stab[s[o, i // block]] (mxfp4 blocks: E8M0 table)."""
    n = out.shape[1]
    for o in range(r0, r1):
        po = packed[o]
        so = s[o]
        oo = out[o]
        for i in range(n):
            nib = (po[i >> 1] >> ((i & 1) << 2)) & 15
            oo[i] = vals[nib] * stab[so[i // block]]
    return -1


@njit
def _int4_rows(packed, s, g, out, r0, r1):
    """out[o, i] = f32(nib - 8) * s[o, i // g] (pack-quantized, scales already float32)."""
    n = out.shape[1]
    for o in range(r0, r1):
        po = packed[o]
        so = s[o]
        oo = out[o]
        for i in range(n):
            nib = (po[i >> 1] >> ((i & 1) << 2)) & 15
            oo[i] = np.float32(np.int32(nib) - 8) * so[i // g]
    return -1


@njit
def _nvfp4_rows(packed, s, vals, e4m3, s2, out, r0, r1):
    n = out.shape[1]
    for o in range(r0, r1):
        po = packed[o]
        so = s[o]
        oo = out[o]
        for i in range(n):
            nib = (po[i >> 1] >> ((i & 1) << 2)) & 15
            oo[i] = (vals[nib] * e4m3[so[i >> 4]]) * s2
    return -1


@njit
def _mxfp8_rows(q, s, e4m3, e8m0, out, r0, r1):
    n = out.shape[1]
    for o in range(r0, r1):
        qo = q[o]
        so = s[o]
        oo = out[o]
        for i in range(n):
            oo[i] = e4m3[qo[i]] * e8m0[so[i >> 5]]
    return -1
