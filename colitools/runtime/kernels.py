"""Numba matmul kernels that read packed codes directly (no dequantized copy of the weight).

Every kernel computes ``Y[n, o] = sum_i W[o, i] * X[n, i]`` for the rows ``o0 <= o < o1`` of a weight ``W[O, I]``
held in one of the container formats (docs/FORMATS.md §2/§4). Kernels are serial and release the GIL; a big call is
split by rows over the runtime's thread pool (``threads.py``). For each row, every input vector ``n`` is processed
while the row's codes are still in L1, and the arithmetic for one ``(n, o)`` is the same whatever ``N`` is, so a
token gets bit-identical expert outputs in a prefill batch and in a one-token decode step.

Offset codes (int4 ``nib - 8``, int3 ``u - 4``) are folded out of the inner loop: a group computes
``sum(u * x) - offset * sum(x)`` with the group sums of ``x`` precomputed once per call. int4 kernels convert a
byte and its high nibble (``b >> 4`` on uint32: numba types integer ops on small ints as int64, and 64-bit lanes
would halve the vector width) and take four rows per pass over ``x``. Results differ from a float64 reference
by float32 rounding only (~1e-6 relative), far inside the oracle margins.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types, uintp
from numba.core import cgutils
from numba.extending import intrinsic

from colitools.errors import RuntimeModelError
from colitools.formats import reference as ref
from colitools.formats.registry import MatmulKind, matmul_format
from colitools.runtime import threads

F32 = np.float32

# The code base's one decode tables (formats/reference.py): E2M1 nibble (bit 3 = sign) -> value, E8M0 scale
# byte -> 2^(byte - 127), e4m3fn byte -> value.
MXFP4_LUT = ref.E2M1_SIGNED
E8M0_LUT = ref.E8M0_TO_F32
E4M3_LUT = ref.E4M3_TO_F32

# Serial kernels that release the GIL: threads.py splits big calls by rows and runs experts side by side.
_JIT = {"fastmath": True, "cache": True, "nogil": True}


# ------------------------------------------------------------------------------------------------------- int4
# A byte b holds two codes, lo = b - 16 hi and hi = b >> 4, for inputs xa (lo) and xb (hi):
#     lo * xa + hi * xb = b * xa + hi * (xb - 16 xa)
# so the kernels take xa and xd = xb - 16 xa (``_int4_prep``, once per call) and need no lo. Pairs order:
# xa = x[2j], xb = x[2j+1]; planar64 order: byte k of 64-block m holds x[64m + k] (lo) and x[64m + 32 + k] (hi).
# The kernels take ROWS rows per pass over x (each x load feeds ROWS rows): the rows of a pass are the aligned
# block 4q .. 4q+3 of the whole matrix, the last block repeating row O - 1, so a row's arithmetic depends on
# its index only, never on how a call was split (split bounds are multiples of ROWS) or on N.
INT4_ROWS = 4
_U4 = np.uint32(4)
# While a block runs, the codes and scales of the block this many blocks ahead are prefetched: an expert read
# once per step (the streaming case) then waits less on memory; for a cache-resident matrix it costs one hint
# per 64 bytes.
PREFETCH_BLOCKS = 2


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


@njit(**_JIT)
def _int4(codes, scales, xa, xd, xs, y, gbytes, o0, o1):  # pragma: no cover - compiled
    _int4_rows(codes, scales, xa, xd, xs, y, gbytes, False, o0, o1)


@njit(**_JIT)
def _int4_g64(codes, scales, xa, xd, xs, y, o0, o1):  # pragma: no cover - compiled
    # Group size 64 with whole groups: a fixed 32-byte inner loop that LLVM unrolls completely.
    _int4_rows(codes, scales, xa, xd, xs, y, 32, True, o0, o1)


# ---------------------------------------------------------------------------------------------------- int3-g64
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


# ------------------------------------------------------------------------------------------------ the wrapper
SPLIT_MACS = 1 << 21  # a call with at least this many multiply-adds is split by rows across the pool
CHUNK_MACS = 1 << 19  # ... into chunks of at least this many (~40 us of int4 work), at most 8 per worker
BLAS_MIN_ROWS = 16  # float32 weights: BLAS sgemm from this many input vectors on, the numba kernel below


def _pad(x: np.ndarray, width: int) -> np.ndarray:
    if x.shape[1] == width:
        return x
    out = np.zeros((x.shape[0], width), dtype=F32)
    out[:, : x.shape[1]] = x
    return out


def _group_sums(xp: np.ndarray, group: int) -> np.ndarray:
    """Sums of ``xp[N, G * group]`` over each group of ``group`` columns -> ``[N, G]`` (float32)."""
    N, W = xp.shape
    return np.ascontiguousarray(xp.reshape(N, W // group, group).sum(axis=2, dtype=F32))


KINDS = tuple(MatmulKind)
_K = MatmulKind


class QTensor:
    """A linear weight ``[O, I]`` kept in its stored form; ``matmul(X[N, I]) -> Y[N, O]`` runs a kernel on it.

    ``kind`` is one of ``KINDS``: ``"int4"`` covers int4-row and int4-grouped (pairs order, ``gs`` None for one
    scale per row), ``"int4-planar"`` the planar64-v8 order; ``"f32"`` holds a float32 matrix (float sources).
    ``codes`` is a uint8 ``[O, row_bytes]`` view into the expert's read buffer; ``scales`` float32 (uint8 E8M0
    for mxfp4).
    """

    __slots__ = ("kind", "codes", "scales", "O", "I", "gs", "row_align")

    def __init__(
        self, kind: str, codes: np.ndarray, scales: np.ndarray | None, O: int, I: int, gs: int | None
    ):
        fmt = matmul_format(kind, gs)  # the registry owns every shape below
        if fmt is None:
            raise RuntimeModelError(f"no runtime kernel for weight kind {kind!r}")
        self.kind, self.O, self.I, self.gs, self.row_align = MatmulKind(kind), O, I, gs, fmt.row_align
        if not fmt.quantized:
            self.codes = np.ascontiguousarray(codes, dtype=F32).reshape(O, I)
            self.scales = None
            return
        self.codes = codes.reshape(fmt.weight_shape(O, I, gs))
        if self.kind is _K.INT8_ROW:
            self.codes = self.codes.view(np.int8)
        self.scales = np.ascontiguousarray(scales, dtype=fmt.scale_numpy).reshape(fmt.scale_grid(O, I, gs))
        if self.kind in (_K.INT4, _K.INT4_PLANAR):  # [O, G], int4-row as one group of the whole row
            self.scales = self.scales.reshape(O, -1)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """``x[N, I]`` float32 -> ``[N, O]`` float32 (``x @ W.T``)."""
        x = np.ascontiguousarray(x, dtype=F32).reshape(-1, self.I)
        N, O = x.shape[0], self.O
        kind, codes, scales = self.kind, self.codes, self.scales
        if kind is _K.F32 and N >= BLAS_MIN_ROWS:
            return x @ codes.T
        y = np.empty((N, O), dtype=F32)
        rb = codes.shape[1]
        if kind is _K.F32:
            kernel, args = _f32_rows, (codes, x, y)
        elif kind in (_K.INT4, _K.INT4_PLANAR):
            G = scales.shape[1]
            # int4-row and planar: G groups of rb // G bytes (int4-row: one group, the whole row)
            gbytes = rb // G if G == 1 or kind is _K.INT4_PLANAR else self.gs // 2
            xa, xd = np.empty((N, rb), F32), np.empty((N, rb), F32)
            xs = np.empty((N, G), F32)
            _int4_prep(x, rb, G, gbytes, kind is _K.INT4_PLANAR, xa, xd, xs)
            if gbytes == 32 and rb == 32 * G:
                kernel, args = _int4_g64, (codes, scales, xa, xd, xs, y)
            else:
                kernel, args = _int4, (codes, scales, xa, xd, xs, y, gbytes)
        elif kind is _K.INT3_G64:
            xp = _pad(x, scales.shape[1] * ref.INT3_GROUP)
            kernel, args = _int3_g64, (codes, scales, xp, _group_sums(xp, ref.INT3_GROUP), y)
        elif kind is _K.MXFP4:
            xe, xo = np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2])
            kernel, args = _mxfp4, (codes, scales, xe, xo, y, MXFP4_LUT, E8M0_LUT)
        elif kind is _K.FP8_B128:
            kernel, args = _fp8_b128, (codes, scales, x, y, E4M3_LUT)
        elif kind is _K.INT8_ROW:
            kernel, args = _int8_row, (codes, scales, x, y)
        else:  # int2-row
            xp = _pad(x, 4 * rb)
            kernel, args = _int2_row, (codes, scales, xp, xp.sum(axis=1, dtype=F32).reshape(N, 1), y)
        if N * O * self.I >= SPLIT_MACS and threads.n_workers() > 1 and not threads.in_worker():
            align = INT4_ROWS if kind in (_K.INT4, _K.INT4_PLANAR) else self.row_align
            parts = max(threads.n_workers(), min(8 * threads.n_workers(), N * O * self.I // CHUNK_MACS))
            threads.parallel_map(lambda r: kernel(*args, *r), threads.row_chunks(O, align, parts))
        else:
            kernel(*args, 0, O)
        return y
