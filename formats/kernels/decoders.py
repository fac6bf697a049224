"""Decoders (``decode``, ``dequant_fp8_block``) and the planar64 reorder (``pairs_to_planar`` /
``planar_to_pairs``)."""

from __future__ import annotations

import numpy as np

from colitools.formats import reference as ref
from colitools.formats.errors import FormatError
from colitools.formats.kernels._bits import (
    _E2M1_F32,
    _E8M0_F32,
    _INT2_ROW,
    _INT3_G64,
    _INT4_GROUPED,
    _INT4_ROW,
    _INT8_ROW,
    _MXFP4,
    F32,
    _dequant_fp8_row,
    njit,
)
from colitools.formats.kernels._dispatch import _fp8_operands, decode_operands
from colitools.formats.kernels._threads import _run_rows


# --------------------------------------------------------------------------------------------- decoders
@njit
def _decode_int8_rows(q, s, out, r0, r1):
    for o in range(r0, r1):
        sv = s[o]
        qo = q[o]
        oo = out[o]
        for i in range(oo.size):
            oo[i] = np.float32(qo[i]) * sv
    return -1


@njit
def _decode_int4_rows(codes, s, out, gs, r0, r1):
    """int4 pairs, one scale per ``gs`` inputs (``gs`` >= I for int4-row)."""
    n = out.shape[1]
    full = n // gs if gs % 2 == 0 else 0  # whole even groups as 2-D views (vectorises), the rest per element
    half = gs >> 1
    for o in range(r0, r1):
        so = s[o]
        cg = codes[o, : full * half].reshape((full, half))
        og = out[o, : full * gs].reshape((full, gs))
        for g in range(full):
            sv = so[g]
            for j in range(half):
                b = cg[g, j]
                og[g, 2 * j] = np.float32(np.int32(b & 15) - 8) * sv
                og[g, 2 * j + 1] = np.float32(np.int32(b >> 4) - 8) * sv
        co = codes[o]
        oo = out[o]
        for i in range(full * gs, n):
            nib = (co[i >> 1] >> ((i & 1) << 2)) & 15
            oo[i] = np.float32(np.int32(nib) - 8) * so[i // gs]
    return -1


@njit
def _decode_int2_rows(codes, s, out, r0, r1):
    for o in range(r0, r1):
        sv = s[o]
        co = codes[o]
        oo = out[o]
        for i in range(oo.size):
            c = (co[i >> 2] >> ((i & 3) << 1)) & 3
            oo[i] = np.float32(np.int32(c) - 2) * sv
    return -1


@njit
def _decode_int3_rows(codes, s, out, r0, r1):
    n = out.shape[1]
    G = s.shape[1]
    for o in range(r0, r1):
        cg = codes[o].reshape((G, 24))
        og = np.empty((G, 64), np.float32)  # whole groups, then trimmed to I
        for g in range(G):
            sv = s[o, g]
            for k in range(64):
                lo = (cg[g, k >> 2] >> ((k & 3) << 1)) & 3
                hi = (cg[g, 16 + (k >> 3)] >> (k & 7)) & 1
                og[g, k] = np.float32(np.int32(lo | (hi << 2)) - 4) * sv
        flat = og.reshape(G * 64)
        oo = out[o]
        for i in range(n):
            oo[i] = flat[i]
    return -1


@njit
def _decode_mxfp4_rows(packed, e8, vals, etab, out, r0, r1):
    for o in range(r0, r1):
        po = packed[o]
        eo = e8[o]
        oo = out[o]
        for i in range(oo.size):
            nib = (po[i >> 1] >> ((i & 1) << 2)) & 15
            oo[i] = vals[nib] * etab[eo[i >> 5]]
    return -1


@njit
def _dequant_fp8_rows(q, s, br, bc, out, r0, r1):
    for o in range(r0, r1):
        _dequant_fp8_row(q[o], s[o // br], bc, out[o])
    return -1


@njit
def _pairs_planar_rows(src, dst, to_planar, r0, r1):
    # planar64: byte k of a 32-byte block = element k (low nibble) | element k + 32 (high nibble).
    # pairs: element e at byte e >> 1, nibble e & 1.
    nb = src.shape[1] >> 5
    for o in range(r0, r1):
        sb = src[o].reshape((nb, 32))
        db = dst[o].reshape((nb, 32))
        for b in range(nb):
            for k in range(32):
                sh = (k & 1) << 2
                if to_planar:  # elements k and k + 32 sit in pairs bytes k >> 1 and 16 + (k >> 1)
                    db[b, k] = ((sb[b, k >> 1] >> sh) & 15) | (((sb[b, 16 + (k >> 1)] >> sh) & 15) << 4)
                else:  # elements 2k, 2k + 1 sit in planar bytes (2k) & 31, (2k + 1) & 31, nibble k >> 4
                    hs = (k >> 4) << 2
                    db[b, k] = ((sb[b, (2 * k) & 31] >> hs) & 15) | (
                        ((sb[b, (2 * k + 1) & 31] >> hs) & 15) << 4
                    )
    return -1


def dequant_fp8_block(q: np.ndarray, scale_inv: np.ndarray, block=(128, 128)) -> np.ndarray:
    """Fast ``reference.dequant_fp8_block`` (bit-identical)."""
    q, s, br, bc = _fp8_operands(q, scale_inv, block, "")
    out = np.empty(q.shape, F32)
    _run_rows(_dequant_fp8_rows, (q, s, br, bc, out), *q.shape)
    return out


def decode(
    fmt_name: str, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None = None
) -> np.ndarray:
    """Decode to float32 ``[O, I]``, bit-identical to the reference decoders (``fp8-e4m3-b128`` included)."""
    out = np.empty((O, I), F32)
    if O * I == 0:
        return out
    cls, c, s = decode_operands(fmt_name, codes, scales, O, I, gs)
    code = cls.kernel_code
    if code == _INT8_ROW:
        kernel, args = _decode_int8_rows, (c.view(np.int8), s, out)
    elif code == _INT4_ROW:  # one group of I
        kernel, args = _decode_int4_rows, (c, s.reshape(O, 1), out, I)
    elif code == _INT4_GROUPED:
        kernel, args = _decode_int4_rows, (c, s, out, int(gs))
    elif code == _INT2_ROW:
        kernel, args = _decode_int2_rows, (c, s, out)
    elif code == _INT3_G64:
        kernel, args = _decode_int3_rows, (c, s, out)
    elif code == _MXFP4:
        kernel, args = _decode_mxfp4_rows, (c, s, _E2M1_F32, _E8M0_F32, out)
    else:  # fp8-e4m3-b128: the FP8 block dequant with 128x128 blocks
        return dequant_fp8_block(c, s, (ref.FP8_BLOCK, ref.FP8_BLOCK))
    _run_rows(kernel, args, O, I)
    return out


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=F32)


def _planar(codes: np.ndarray, to_planar: bool) -> np.ndarray:
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    if codes.ndim != 2 or (2 * codes.shape[1]) % 64:
        raise FormatError(
            f"planar64-v8 needs int4 codes [O, I/2] with I % 64 == 0, got shape {list(codes.shape)}"
        )
    out = np.empty_like(codes)
    _run_rows(_pairs_planar_rows, (codes, out, to_planar), codes.shape[0], 2 * codes.shape[1])
    return out


def pairs_to_planar(codes: np.ndarray) -> np.ndarray:
    """Fast ``planar.pairs_to_planar`` (byte-identical)."""
    return _planar(codes, True)


def planar_to_pairs(codes: np.ndarray) -> np.ndarray:
    """Fast ``planar.planar_to_pairs`` (byte-identical)."""
    return _planar(codes, False)
