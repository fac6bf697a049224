"""Fast decoders of the natively quantized source encodings (docs/FORMATS.md §9), byte-identical to
``reference.decode_mxfp4_blocks`` / ``decode_pack_quantized`` / ``decode_nvfp4`` / ``decode_mxfp8``.

Each performs the reference's float32 operations in the same order (a table lookup, then one float32 multiply
per factor, left to right), using the one decode tables of ``reference.py``. Row chunks run on the row thread
pool (``_run_rows``); inputs are any leading shape, flattened to rows."""

from __future__ import annotations

import numpy as np

from colitools.formats import reference as ref
from colitools.formats.kernels._bits import _E2M1_F32, _E8M0_F32, E4M3_TO_F32, F32, njit
from colitools.formats.kernels._threads import _run_rows


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


def _rows(a: np.ndarray, cols: int) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1, cols)


def decode_mxfp4_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Fast ``reference.decode_mxfp4_blocks``: ``[..., O, I/32, 16]`` + ``[..., O, I/32]`` -> ``[..., O, I]``."""
    *lead, O, B, K = blocks.shape
    I = B * 32
    out = np.empty((*lead, O, I), F32)
    rows = out.reshape(-1, I)
    if rows.size:
        p, s = _rows(blocks, B * K), _rows(scales, B)
        _run_rows(_nib_scaled_rows, (p, s, _E2M1_F32, _E8M0_F32, ref.MXFP4_BLOCK, rows), rows.shape[0], I)
    return out


def decode_pack_quantized(packed: np.ndarray, scale: np.ndarray, I: int, g: int) -> np.ndarray:
    """Fast ``reference.decode_pack_quantized`` (I32 ``[O, ceil(I/8)]``, scales ``[O, ceil(I/g)]``)."""
    O = packed.shape[0]
    out = np.empty((O, I), F32)
    if O * I:
        p = np.ascontiguousarray(packed).astype("<i4", copy=False).view(np.uint8).reshape(O, -1)
        s = np.ascontiguousarray(np.asarray(scale).astype(F32).reshape(O, -1))
        _run_rows(_int4_rows, (p, s, int(g), out), O, I)
    return out


def decode_nvfp4(packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray, I: int) -> np.ndarray:
    """Fast ``reference.decode_nvfp4``."""
    O = packed.shape[0]
    out = np.empty((O, I), F32)
    if O * I:
        s2 = F32(np.asarray(scale_2, dtype=F32).reshape(()))
        p, s = _rows(packed, packed.size // O), _rows(scale, scale.size // O)
        _run_rows(_nvfp4_rows, (p, s, _E2M1_F32, E4M3_TO_F32, s2, out), O, I)
    return out


def decode_mxfp8(q: np.ndarray, scale: np.ndarray, I: int) -> np.ndarray:
    """Fast ``reference.decode_mxfp8``."""
    O = q.shape[0]
    out = np.empty((O, I), F32)
    if O * I:
        _run_rows(
            _mxfp8_rows, (_rows(q, I), _rows(scale, scale.size // O), E4M3_TO_F32, _E8M0_F32, out), O, I
        )
    return out
