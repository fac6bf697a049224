"""The decoders on the kernels, numba-free: the container formats back to float32 (``decode``), the FP8 block
dequant, the planar64 reorder, and the natively quantized sources (``decode_mxfp4_blocks``,
``decode_pack_quantized``, ``decode_nvfp4``, ``decode_mxfp8``; docs/FORMATS.md §9). Outputs are planned here;
the rows run on the kernels of ``_jit_decoders`` or the same ones compiled ahead of time, whichever
``aot.CODECS`` resolves. Bit-identical to the reference decoders (property tests).

Each source decoder performs the reference's float32 operations in the same order (a table lookup, then one
float32 multiply per factor, left to right), using the one decode tables of ``reference.py``; inputs are any
leading shape, flattened to rows."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from colitools.formats import reference as ref
from colitools.formats import registry
from colitools.formats.errors import FormatError
from colitools.formats.kernels import aot
from colitools.formats.kernels._dispatch import _fp8_operands, decode_operands

F32 = np.float32
# The one decode tables of the code base (reference.py), not copies (= _jit_bits' names for them).
_E2M1_F32 = ref.E2M1_SIGNED
_E8M0_F32 = ref.E8M0_TO_F32
E4M3_TO_F32 = ref.E4M3_TO_F32


# --------------------------------------------------------------------------------------------- containers
def dequant_fp8_block(q: np.ndarray, scale_inv: np.ndarray, block=(128, 128)) -> np.ndarray:
    """Fast ``reference.dequant_fp8_block`` (bit-identical)."""
    q, s, br, bc = _fp8_operands(q, scale_inv, block, "")
    out = np.empty(q.shape, F32)
    aot.CODECS.run("dequant_fp8", (q, s, br, bc, out), *q.shape)
    return out


def decode(
    fmt_name: str, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None = None
) -> np.ndarray:
    """Decode to float32 ``[O, I]``, bit-identical to the reference decoders (``fp8-e4m3-b128`` included)."""
    out = np.empty((O, I), F32)
    if O * I == 0:
        return out
    cls, c, s = decode_operands(fmt_name, codes, scales, O, I, gs)
    if cls is registry.Int8Row:
        kernel, args = "decode_int8", (c.view(np.int8), s, out)
    elif cls is registry.Int4Row:  # one group of I
        kernel, args = "decode_int4", (c, s.reshape(O, 1), out, I)
    elif cls is registry.Int4Grouped:
        kernel, args = "decode_int4", (c, s, out, int(gs))
    elif cls is registry.Int2Row:
        kernel, args = "decode_int2", (c, s, out)
    elif cls is registry.Int3G64:
        kernel, args = "decode_int3", (c, s, out)
    elif cls is registry.Mxfp4:
        kernel, args = "decode_mxfp4", (c, s, _E2M1_F32, _E8M0_F32, out)
    else:  # fp8-e4m3-b128: the FP8 block dequant with 128x128 blocks
        return dequant_fp8_block(c, s, (ref.FP8_BLOCK, ref.FP8_BLOCK))
    aot.CODECS.run(kernel, args, O, I)
    return out


def error_rows(
    source: np.ndarray, fmt_name: str, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None
) -> np.ndarray | None:
    """The per-row sums of ``error_stats`` (``[O, 5]``: sse, ssw, ssq, dot, max) of float32 or BF16 ``source``
    ``[O, I]`` against the decode of ``codes`` / ``scales`` (pairs order), decoded a block of rows at a time
    inside the sums kernel (``_jit_stats.error_int*``: bit for bit ``decode`` then ``error_rows``); None for a
    format it does not fuse (int8-row, int4-row and int4-grouped only)."""
    cls = registry.lookup(fmt_name)
    if cls not in (registry.Int8Row, registry.Int4Row, registry.Int4Grouped) or O * I == 0:
        return None
    cls, c, s = decode_operands(fmt_name, codes, scales, O, I, gs)
    bf16 = source.dtype == np.dtype(ml_dtypes.bfloat16)
    a = np.ascontiguousarray(source).view(np.uint16) if bf16 else np.ascontiguousarray(source, dtype=F32)
    out = np.empty((O, 5), np.float64)
    if cls is registry.Int8Row:
        kernel, args = "error_int8", (a, c.view(np.int8), s, out)
    else:  # int4-row: one group of I
        kernel, args = "error_int4", (a, c, s.reshape(O, -1), int(gs) if cls.grouped else I, out)
    aot.CODECS.run(kernel + ("_bf16" if bf16 else ""), args, O, I)
    return out


def _planar(codes: np.ndarray, to_planar: bool) -> np.ndarray:
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    if codes.ndim != 2 or (2 * codes.shape[1]) % 64:
        raise FormatError(
            f"planar64-v8 needs int4 codes [O, I/2] with I % 64 == 0, got shape {list(codes.shape)}"
        )
    out = np.empty_like(codes)
    aot.CODECS.run("planar_reorder", (codes, out, to_planar), codes.shape[0], 2 * codes.shape[1])
    return out


def pairs_to_planar(codes: np.ndarray) -> np.ndarray:
    """Fast ``planar.pairs_to_planar`` (byte-identical)."""
    return _planar(codes, True)


def planar_to_pairs(codes: np.ndarray) -> np.ndarray:
    """Fast ``planar.planar_to_pairs`` (byte-identical)."""
    return _planar(codes, False)


# --------------------------------------------------------------------------------------------- sources
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
        aot.CODECS.run(
            "src_nib_scaled", (p, s, _E2M1_F32, _E8M0_F32, ref.MXFP4_BLOCK, rows), rows.shape[0], I
        )
    return out


def decode_pack_quantized(packed: np.ndarray, scale: np.ndarray, I: int, g: int) -> np.ndarray:
    """Fast ``reference.decode_pack_quantized`` (I32 ``[O, ceil(I/8)]``, scales ``[O, ceil(I/g)]``)."""
    O = packed.shape[0]
    out = np.empty((O, I), F32)
    if O * I:
        p = np.ascontiguousarray(packed).astype("<i4", copy=False).view(np.uint8).reshape(O, -1)
        s = np.ascontiguousarray(np.asarray(scale).astype(F32).reshape(O, -1))
        aot.CODECS.run("src_int4", (p, s, int(g), out), O, I)
    return out


def decode_nvfp4(packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray, I: int) -> np.ndarray:
    """Fast ``reference.decode_nvfp4``."""
    O = packed.shape[0]
    out = np.empty((O, I), F32)
    if O * I:
        s2 = F32(np.asarray(scale_2, dtype=F32).reshape(()))
        p, s = _rows(packed, packed.size // O), _rows(scale, scale.size // O)
        aot.CODECS.run("src_nvfp4", (p, s, _E2M1_F32, E4M3_TO_F32, s2, out), O, I)
    return out


def decode_mxfp8(q: np.ndarray, scale: np.ndarray, I: int) -> np.ndarray:
    """Fast ``reference.decode_mxfp8``."""
    O = q.shape[0]
    out = np.empty((O, I), F32)
    if O * I:
        aot.CODECS.run(
            "src_mxfp8", (_rows(q, I), _rows(scale, scale.size // O), E4M3_TO_F32, _E8M0_F32, out), O, I
        )
    return out
