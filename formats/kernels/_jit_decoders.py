"""The numba row kernels of ``decoders`` (numba-free, which runs them on the kernels' thread pool, compiled ahead
of time or by numba's JIT, ``aot``): the container formats back to float32, the FP8 block dequant, the planar64
reorder, and the natively quantized sources (docs/FORMATS.md §9). Each is registered beside its definition with
its compiled-ahead arguments (``aot.export``); each returns -1 (the drivers' "no bad row")."""

from __future__ import annotations

import numpy as np

from colitools.formats.kernels._jit_bits import _dequant_fp8_row, njit
from colitools.formats.kernels.aot import export


# --------------------------------------------------------------------------------------------- decoders
@export("decode_int8", ("int8", "float32[]", "float32"))
@njit
def _decode_int8_rows(q, s, out, r0, r1):
    for o in range(r0, r1):
        sv = s[o]
        qo = q[o]
        oo = out[o]
        for i in range(oo.size):
            oo[i] = np.float32(qo[i]) * sv
    return -1


@export("decode_int4", ("uint8", "float32", "float32", "i"))
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


@export("decode_int2", ("uint8", "float32[]", "float32"))
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


@export("decode_int3", ("uint8", "float32", "float32"))
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


@export("decode_mxfp4", ("uint8", "uint8", "float32[]", "float32[]", "float32"))
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


@export("dequant_fp8", ("uint8", "float32", "i", "i", "float32"))
@njit
def _dequant_fp8_rows(q, s, br, bc, out, r0, r1):
    for o in range(r0, r1):
        _dequant_fp8_row(q[o], s[o // br], bc, out[o])
    return -1


@export("planar_reorder", ("uint8", "uint8", "b"))
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


# --------------------------------------------------------------------------------------------- sources
@export("src_nib_scaled", ("uint8", "uint8", "float32[]", "float32[]", "i", "float32"))
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


@export("src_int4", ("uint8", "float32", "i", "float32"))
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


@export("src_nvfp4", ("uint8", "uint8", "float32[]", "float32[]", "f", "float32"))
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


@export("src_mxfp8", ("uint8", "uint8", "float32[]", "float32[]", "float32"))
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
