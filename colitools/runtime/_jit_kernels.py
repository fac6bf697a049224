"""The runtime's numba matmul kernels (``kernels.py`` describes them): serial, GIL-free row loops that read the
packed codes directly, each registered beside its definition with its compiled-ahead arguments (``aot.export``).
``kernels.QTensor.matmul`` runs them, or the same functions compiled ahead of time (the set ``kernels.KERNELS``,
compiled with these options)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types, uintp
from numba.core import cgutils
from numba.extending import intrinsic

from colitools.formats.kernels.aot import export
from colitools.runtime.kernels import INT4_ROWS, PREFETCH_BLOCKS

F32 = np.float32

# Serial kernels that release the GIL: threads.py splits big calls by rows and runs experts side by side.
_JIT = {"fastmath": True, "cache": True, "nogil": True}


# ------------------------------------------------------------------------------------------------------- int4
# A byte b holds two codes, lo = b - 16 hi and hi = b >> 4, for inputs xa (lo) and xb (hi):
#     lo * xa + hi * xb = b * xa + hi * (xb - 16 xa)
# so the kernels take xa and xd = xb - 16 xa (``_int4_prep``, once per call) and need no lo. Pairs order:
# xa = x[2j], xb = x[2j+1]; planar64 order: byte k of 64-block m holds x[64m + k] (lo) and x[64m + 32 + k] (hi).
# The kernels take INT4_ROWS rows per pass over x and prefetch PREFETCH_BLOCKS blocks ahead (kernels.py).
_U4 = np.uint32(4)


@intrinsic
def _prefetch(typingctx, a, offset):  # pragma: no cover - compiled
    """Hint the CPU to fetch the cache line at byte ``offset`` of ``a``'s data (``llvm.prefetch``, read,
    keep in all levels; never faults, a no-op on targets without one)."""

    def codegen(context, builder, sig, args):
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        ptr = builder.gep(builder.bitcast(arr.data, i8p), [args[1]])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch"
        )
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(a, offset), codegen


@njit(inline="always", **_JIT)
def _prefetch_block(codes, scales, o):  # pragma: no cover - compiled
    # rows o .. o + INT4_ROWS - 1 (clipped to the matrix) of both C-contiguous arrays
    O = codes.shape[0]
    if o < O:
        end = min(o + INT4_ROWS, O)
        cb, sb = codes.shape[1], scales.shape[1] * 4
        for b in range(o * cb, end * cb, 64):
            _prefetch(codes, b)
        for b in range(o * sb, end * sb, 64):
            _prefetch(scales, b)


@export("rt_int4_prep", ("float32", "i", "i", "i", "b", "float32", "float32", "float32"), "void", rows=False)
@njit(**_JIT)
def _int4_prep(x, rb, G, gbytes, planar, xa, xd, xs):  # pragma: no cover - compiled
    # x[N, I] -> xa, xd [N, rb] and the group sums xs[N, G] (float64 accumulation) in one pass; columns past I
    # (padding of the last byte / group) count as 0.
    N, I = x.shape
    for n in range(N):
        for g in range(G):
            s = 0.0
            for k in range(g * gbytes, min(g * gbytes + gbytes, rb)):
                if planar:
                    lo = (k >> 5) * 64 + (k & 31)
                    hi = lo + 32
                else:
                    lo = 2 * k
                    hi = lo + 1
                a = x[n, lo] if lo < I else F32(0.0)
                b = x[n, hi] if hi < I else F32(0.0)
                xa[n, k] = a
                xd[n, k] = b - F32(16.0) * a
                s += np.float64(a) + np.float64(b)
            xs[n, g] = F32(s)


@njit(inline="always", **_JIT)
def _int4_rows(codes, scales, xa, xd, xs, y, gbytes, whole, o0, o1):  # pragma: no cover - compiled
    # The body of both int4 kernels; ``whole`` (every group full) with a constant ``gbytes`` lets LLVM unroll the
    # inner loop completely (``_int4_g64``: 32 bytes).
    rb = codes.shape[1]
    N = xa.shape[0]
    G = scales.shape[1]
    last = codes.shape[0] - 1
    # Unsigned indices spare numba's negative-index wraparound, which otherwise blocks vectorisation; the
    # nibble shift on uint32 keeps 32-bit lanes (int64 lanes would halve the vector width).
    for o in range(o0, o1, INT4_ROWS):
        r1, r2, r3 = min(o + 1, last), min(o + 2, last), min(o + 3, last)
        _prefetch_block(codes, scales, o + PREFETCH_BLOCKS * INT4_ROWS)
        for n in range(N):
            a0 = a1 = a2 = a3 = F32(0.0)
            for g in range(G):
                j0 = uintp(g) * uintp(gbytes)
                s0 = s1 = s2 = s3 = F32(0.0)
                for j in range(gbytes if whole else min(gbytes, rb - g * gbytes)):
                    k = j0 + uintp(j)
                    p, q = xa[n, k], xd[n, k]
                    b0, b1 = np.uint32(codes[o, k]), np.uint32(codes[r1, k])
                    b2, b3 = np.uint32(codes[r2, k]), np.uint32(codes[r3, k])
                    s0 += F32(b0) * p + F32(b0 >> _U4) * q
                    s1 += F32(b1) * p + F32(b1 >> _U4) * q
                    s2 += F32(b2) * p + F32(b2 >> _U4) * q
                    s3 += F32(b3) * p + F32(b3 >> _U4) * q
                x8 = F32(8.0) * xs[n, g]
                a0 += (s0 - x8) * scales[o, g]
                a1 += (s1 - x8) * scales[r1, g]
                a2 += (s2 - x8) * scales[r2, g]
                a3 += (s3 - x8) * scales[r3, g]
            y[n, o], y[n, r1], y[n, r2], y[n, r3] = a0, a1, a2, a3


@export("rt_int4", ("uint8", "float32", "float32", "float32", "float32", "float32", "i"), "void")
@njit(**_JIT)
def _int4(codes, scales, xa, xd, xs, y, gbytes, o0, o1):  # pragma: no cover - compiled
    _int4_rows(codes, scales, xa, xd, xs, y, gbytes, False, o0, o1)


@export("rt_int4_g64", ("uint8", "float32", "float32", "float32", "float32", "float32"), "void")
@njit(**_JIT)
def _int4_g64(codes, scales, xa, xd, xs, y, o0, o1):  # pragma: no cover - compiled
    # Group size 64 with whole groups: a fixed 32-byte inner loop that LLVM unrolls completely.
    _int4_rows(codes, scales, xa, xd, xs, y, 32, True, o0, o1)


# ---------------------------------------------------------------------------------------------------- int3-g64
@export("rt_int3_g64", ("uint8", "float32", "float32", "float32", "float32"), "void")
@njit(**_JIT)
def _int3_g64(codes, scales, x, xs, y, o0, o1):  # pragma: no cover - compiled
    # Group of 64 values in 24 bytes: bits 0-1 of u at byte k >> 2, shift 2 * (k & 3); bit 2 at byte
    # 16 + (k >> 3), bit k & 7.  Value = (u - 4) * scale.
    N = x.shape[0]
    G = scales.shape[1]
    for o in range(o0, o1):
        for n in range(N):
            acc = F32(0.0)
            for g in range(G):
                c0 = g * 24
                e0 = g * 64
                s = F32(0.0)
                for j in range(16):
                    b = codes[o, c0 + j]
                    for t in range(4):
                        k = 4 * j + t
                        hi = (codes[o, c0 + 16 + (k >> 3)] >> (k & 7)) & 1
                        u = ((b >> (2 * t)) & 3) | (hi << 2)
                        s += F32(u) * x[n, e0 + k]
                acc += (s - F32(4.0) * xs[n, g]) * scales[o, g]
            y[n, o] = acc


# ------------------------------------------------------------------------------------------------------- mxfp4
@export("rt_mxfp4", ("uint8", "uint8", "float32", "float32", "float32", "float32[]", "float32[]"), "void")
@njit(**_JIT)
def _mxfp4(codes, scale_bytes, xe, xo, y, lut, e8m0, o0, o1):  # pragma: no cover - compiled
    # 32-element blocks (16 bytes) with one E8M0 scale byte; low nibble = even column.
    N = xe.shape[0]
    B = scale_bytes.shape[1]
    for o in range(o0, o1):
        for n in range(N):
            acc = F32(0.0)
            for blk in range(B):
                s = F32(0.0)
                j0 = uintp(blk) * uintp(16)
                for j in range(16):
                    k = j0 + uintp(j)
                    b = np.int32(codes[o, k])
                    s += lut[b & 15] * xe[n, k] + lut[b >> 4] * xo[n, k]
                acc += s * e8m0[scale_bytes[o, blk]]
            y[n, o] = acc


# --------------------------------------------------------------------------------------------- fp8-e4m3-b128
@export("rt_fp8_b128", ("uint8", "float32", "float32", "float32", "float32[]"), "void")
@njit(**_JIT)
def _fp8_b128(codes, scales, x, y, lut, o0, o1):  # pragma: no cover - compiled
    I = codes.shape[1]
    N = x.shape[0]
    B = scales.shape[1]
    for o in range(o0, o1):
        r = o // 128
        for n in range(N):
            acc = F32(0.0)
            for blk in range(B):
                s = F32(0.0)
                for i in range(blk * 128, min(blk * 128 + 128, I)):
                    s += lut[codes[o, i]] * x[n, i]
                acc += s * scales[r, blk]
            y[n, o] = acc


# ----------------------------------------------------------------------------------------------- int8 / int2
@export("rt_int8_row", ("int8", "float32[]", "float32", "float32"), "void")
@njit(**_JIT)
def _int8_row(codes, scales, x, y, o0, o1):  # pragma: no cover - compiled
    I = codes.shape[1]
    N = x.shape[0]
    for o in range(o0, o1):
        for n in range(N):
            s = F32(0.0)
            for i in range(I):
                s += F32(codes[o, i]) * x[n, i]
            y[n, o] = s * scales[o]


@export("rt_int2_row", ("uint8", "float32[]", "float32", "float32", "float32"), "void")
@njit(**_JIT)
def _int2_row(codes, scales, x, xs, y, o0, o1):  # pragma: no cover - compiled
    rb = codes.shape[1]
    N = x.shape[0]
    for o in range(o0, o1):
        for n in range(N):
            s = F32(0.0)
            for j in range(rb):
                b = codes[o, j]
                for t in range(4):
                    s += F32((b >> (2 * t)) & 3) * x[n, 4 * j + t]
            y[n, o] = (s - F32(2.0) * xs[n, 0]) * scales[o]


# ----------------------------------------------------------------------------------------------------- float32
@export("rt_f32", ("float32", "float32", "float32"), "void")
@njit(**_JIT)
def _f32_rows(w, x, y, o0, o1):  # pragma: no cover - compiled
    I = w.shape[1]
    N = x.shape[0]
    for o in range(o0, o1):
        for n in range(N):
            s = F32(0.0)
            for i in range(I):
                s += w[o, i] * x[n, i]
            y[n, o] = s
