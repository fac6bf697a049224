"""The numba kernels of ``error_stats``: a tensor's error figures (docs/FORMATS.md §11) row by row, bit for bit
the numpy reference ``error_stats.row_sums``: per block of ``BLOCK`` elements of a row, float32 terms summed in
``LANES`` lanes in element order, the lanes folded in halves, each block's four sums added to the row's in float64
in block order; a row whose float32 sums overflow summed again in float64 in element order. The largest
difference is the float32 ``|w' - w|``, taken on its bits (a maximum: no order). A BF16 source is read as its
bits (no float32 copy of the tensor). The ``error_int*`` kernels take the written tensor's codes and scales
instead of its decoded values and decode them inside the lane loop, exactly as ``_jit_decoders`` does (a group
size that is not a multiple of the lane count decodes a row into a scratch row first).

Why the lane loop is LLVM IR written here (``_lanes``) rather than numba: a float sum vectorises only when the
compiler may reorder it (``fastmath``), and then its order, so the figures' last bits, follow the machine's
vector width; numba leaves LLVM's SLP vectoriser off, so eight scalar accumulators stay scalar (~1.9 ns a
weight, measured). The IR holds the lanes as one ``<16 x float>`` per sum: the order is the IR's whatever the
CPU (AVX2 runs it as two registers, SSE as four, AVX-512 as one), and no multiply-add is fused (LLVM contracts
only what is marked). In the compiled-ahead set (``aot.CODECS``) like the codecs."""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from colitools.formats.error_stats import BLOCK, LANES
from colitools.formats.kernels._jit_decoders import _decode_int4_rows
from colitools.formats.kernels.aot import export

_ABS = np.uint32(0x7FFFFFFF)
_I64 = ir.IntType(64)
_STATE = 4 * LANES  # the lane state: four float32 lane vectors (sse, ssw, ssq, dot)


# ------------------------------------------------------------------------------------------ the lane loop
def _vec_ptr(builder, data, index, vtype):
    return builder.bitcast(builder.gep(data, [index]), vtype.as_pointer())


def _splat(builder, value, vtype):
    one = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vtype, ir.Undefined), ir.Constant(
        ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


def _load_x(builder, xa, i, bf16):
    """Source values ``[i, i + LANES)`` as float32 lanes (BF16 bits widened exactly: ``bits << 16``)."""
    f32v, i32v = ir.VectorType(ir.FloatType(), LANES), ir.VectorType(ir.IntType(32), LANES)
    if not bf16:
        return builder.load(_vec_ptr(builder, xa.data, i, f32v), align=4)
    bits = builder.load(_vec_ptr(builder, xa.data, i, ir.VectorType(ir.IntType(16), LANES)), align=2)
    return builder.bitcast(builder.shl(builder.zext(bits, i32v), ir.Constant(i32v, [16] * LANES)), f32v)


def _load_y(builder, kind, ya, i):
    """Decoded values ``[i, i + LANES)``: stored float32, or ``float32(code) * scale`` as the decoders compute
    them (int8; int4 pairs: element 2k the low nibble of byte k, minus 8; one scale for the whole chunk)."""
    f32v, i32v = ir.VectorType(ir.FloatType(), LANES), ir.VectorType(ir.IntType(32), LANES)
    if kind == "f32":
        return builder.load(_vec_ptr(builder, ya[0].data, i, f32v), align=4)
    if kind == "int8":
        q = builder.load(_vec_ptr(builder, ya[0].data, i, ir.VectorType(ir.IntType(8), LANES)), align=1)
        return builder.fmul(builder.sitofp(builder.sext(q, i32v), f32v), _splat(builder, ya[1], f32v))
    half = ir.VectorType(ir.IntType(32), LANES // 2)
    raw = builder.load(_vec_ptr(builder, ya[0].data, builder.lshr(i, ir.Constant(_I64, 1)),
                                ir.VectorType(ir.IntType(8), LANES // 2)), align=1)
    wide = builder.zext(raw, half)
    low = builder.and_(wide, ir.Constant(half, [15] * (LANES // 2)))
    high = builder.lshr(wide, ir.Constant(half, [4] * (LANES // 2)))
    order = ir.Constant(i32v, [k // 2 + (LANES // 2) * (k % 2) for k in range(LANES)])
    nib = builder.sub(builder.shuffle_vector(low, high, order), ir.Constant(i32v, [8] * LANES))
    scale = builder.load(builder.gep(ya[1].data, [builder.sdiv(i, ya[2])]))
    return builder.fmul(builder.sitofp(nib, f32v), _splat(builder, scale, f32v))


def _y_kind(ys) -> str | None:
    """The decoded values' operands: ``(float32 row,)``, ``(int8 row, float32 scale)`` or ``(uint8 pairs row,
    float32 scales row, group size)``."""
    if not isinstance(ys, types.BaseTuple):
        return None
    kinds = [t.dtype if isinstance(t, types.Array) else t for t in ys]
    if kinds == [types.float32]:
        return "f32"
    if kinds == [types.int8, types.float32]:
        return "int8"
    if len(kinds) == 3 and kinds[:2] == [types.uint8, types.float32] and isinstance(kinds[2], types.Integer):
        return "int4"
    return None


@intrinsic
def _lanes(typingctx, x, ys, i0, chunks, state, mx):
    """Adds the terms of elements ``i0 + LANES c + j`` (``c < chunks``) to lane ``j`` of ``state`` (float32
    ``[4 * LANES]``: sse, ssw, ssq, dot lanes), in order, and their ``|float32(y - x)|`` bits to ``mx``'s max
    (uint32 ``[LANES]``). For an int4 ``ys`` a chunk lies in one scale group (the caller's promise)."""
    kind = _y_kind(ys)
    if kind is None or not isinstance(x, types.Array) or x.dtype not in (types.uint16, types.float32):
        return None
    bf16 = x.dtype == types.uint16

    def codegen(context, builder, sig, args):
        xv, yv, start, n, st, mv = args
        f32v, i32v = ir.VectorType(ir.FloatType(), LANES), ir.VectorType(ir.IntType(32), LANES)
        xa = context.make_array(sig.args[0])(context, builder, xv)
        ya = []
        for k, t in enumerate(sig.args[1]):
            item = builder.extract_value(yv, k)
            ya.append(context.make_array(t)(context, builder, item) if isinstance(t, types.Array) else item)
        sa = context.make_array(sig.args[4])(context, builder, st)
        ma = context.make_array(sig.args[5])(context, builder, mv)
        homes = [_vec_ptr(builder, sa.data, ir.Constant(_I64, q * LANES), f32v) for q in range(4)]
        mhome = _vec_ptr(builder, ma.data, ir.Constant(_I64, 0), i32v)
        slots = [cgutils.alloca_once(builder, f32v) for _ in range(4)]  # registers after mem2reg
        mslot = cgutils.alloca_once(builder, i32v)
        for q in range(4):
            builder.store(builder.load(homes[q], align=4), slots[q])
        builder.store(builder.load(mhome, align=4), mslot)
        with cgutils.for_range(builder, n) as loop:
            i = builder.add(start, builder.mul(loop.index, ir.Constant(_I64, LANES)))
            a = _load_x(builder, xa, i, bf16)
            b = _load_y(builder, kind, ya, i)
            d = builder.fsub(b, a)
            for q, term in enumerate((builder.fmul(d, d), builder.fmul(a, a), builder.fmul(b, b), builder.fmul(a, b))):
                builder.store(builder.fadd(builder.load(slots[q]), term), slots[q])
            bits = builder.and_(builder.bitcast(d, i32v), ir.Constant(i32v, [0x7FFFFFFF] * LANES))
            m = builder.load(mslot)
            builder.store(builder.select(builder.icmp_unsigned(">", bits, m), bits, m), mslot)
        for q in range(4):
            builder.store(builder.load(slots[q]), homes[q], align=4)
        builder.store(builder.load(mslot), mhome, align=4)
        return context.get_dummy_value()

    return types.void(x, ys, types.int64, types.int64, state, mx), codegen


@intrinsic
def _fold(typingctx, state, sums):
    """Each of ``state``'s four lane vectors folded in halves (``l[j] + l[j + h]``, h = 8, 4, 2, 1), widened and
    added to ``sums[q]`` (float64 ``[4]``); the lanes reset to zero."""
    if not (isinstance(state, types.Array) and isinstance(sums, types.Array)):
        return None

    def codegen(context, builder, sig, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        sa = context.make_array(sig.args[0])(context, builder, args[0])
        oa = context.make_array(sig.args[1])(context, builder, args[1])
        for q in range(4):
            home = _vec_ptr(builder, sa.data, ir.Constant(_I64, q * LANES), ir.VectorType(f32, LANES))
            v = builder.load(home, align=4)
            h = LANES // 2
            while h >= 1:
                pick = lambda off, h=h: ir.Constant(ir.VectorType(i32, h), [off + j for j in range(h)])  # noqa: E731
                v = builder.fadd(builder.shuffle_vector(v, v, pick(0)), builder.shuffle_vector(v, v, pick(h)))
                h //= 2
            total = builder.fpext(builder.extract_element(v, ir.Constant(i32, 0)), ir.DoubleType())
            out = builder.gep(oa.data, [ir.Constant(_I64, q)])
            builder.store(builder.fadd(builder.load(out), total), out)
            builder.store(ir.Constant(ir.VectorType(f32, LANES), [0.0] * LANES), home, align=4)
        return context.get_dummy_value()

    return types.void(state, sums), codegen


# ------------------------------------------------------------------------- one element, for tails and overflow
def _x_at(x, i):
    """Source element ``i`` as float32."""


@overload(_x_at, inline="always")
def _x_at_impl(x, i):
    if x.dtype == types.uint16:
        return lambda x, i: np.uint32(np.uint32(x[i]) << np.uint32(16)).view(np.float32)
    return lambda x, i: x[i]


def _y_at(ys, i):
    """Decoded element ``i`` as float32 (the decoders' arithmetic)."""


@overload(_y_at, inline="always")
def _y_at_impl(ys, i):
    kind = _y_kind(ys)
    if kind == "f32":
        return lambda ys, i: ys[0][i]
    if kind == "int8":
        return lambda ys, i: np.float32(ys[0][i]) * ys[1]
    if kind == "int4":
        return lambda ys, i: np.float32(np.int32((ys[0][i >> 1] >> ((i & 1) << 2)) & 15) - 8) * ys[1][i // ys[2]]
    return None


# -------------------------------------------------------------------------------------------- a row's figures
@nb.njit(nogil=True, cache=True)
def _tail(x, ys, i0, n, state, mx, pad_x, pad_y):
    """Elements ``[i0, n)`` (fewer than LANES) as one chunk zero-padded to LANES (a zero adds nothing)."""
    pad_x[:] = 0.0
    pad_y[:] = 0.0
    for i in range(i0, n):
        pad_x[i - i0] = _x_at(x, i)
        pad_y[i - i0] = _y_at(ys, i)
    _lanes(pad_x, (pad_y,), 0, 1, state, mx)


@nb.njit(nogil=True, cache=True)
def _row(x, ys, out, state, mx, pad_x, pad_y):
    """``out[:] = (sse, ssw, ssq, dot, max |w' - w|)`` of one row (``error_stats.row_sums``'s order)."""
    n = x.size
    full = n - n % LANES
    sums = out[:4]
    sums[:] = 0.0
    mx[:] = 0
    for b in range(0, n, BLOCK):
        e = min(b + BLOCK, n)
        c = (min(e, full) - b) // LANES
        if c > 0:
            _lanes(x, ys, b, c, state, mx)
        if e > full:
            _tail(x, ys, full, n, state, mx, pad_x, pad_y)
        _fold(state, sums)
    if not (np.isfinite(sums[0]) and np.isfinite(sums[1]) and np.isfinite(sums[2]) and np.isfinite(sums[3])):
        _row_f64(x, ys, sums)
    out[4] = np.float64(np.uint32(mx.max()).view(np.float32))


@nb.njit(nogil=True, cache=True)
def _row_f64(x, ys, sums):
    """A row whose float32 sums overflowed: float64 sums in element order (``error_stats``'s fallback)."""
    sse = ssw = ssq = dot = 0.0
    for i in range(x.size):
        a = np.float64(_x_at(x, i))
        b = np.float64(_y_at(ys, i))
        d = b - a
        sse += d * d
        ssw += a * a
        ssq += b * b
        dot += a * b
    sums[0], sums[1], sums[2], sums[3] = sse, ssw, ssq, dot


@nb.njit(nogil=True, cache=True)
def _buffers():
    return (np.zeros(_STATE, np.float32), np.zeros(LANES, np.uint32), np.zeros(LANES, np.float32),
            np.zeros(LANES, np.float32))


# --------------------------------------------------------------------------------------------- the drivers
@export("error_rows", ("float32", "float32", "float64"))
@nb.njit(nogil=True, cache=True)
def error_rows(a, b, out, r0, r1):
    """Rows ``[r0, r1)`` of float32 ``a`` (source) and ``b`` (decoded) -> ``out[r] = (sse, ssw, ssq, dot,
    max |b - a|)``. Returns -1 (the codecs' "no bad row" convention)."""
    state, mx, px, py = _buffers()
    for r in range(r0, r1):
        _row(a[r], (b[r],), out[r], state, mx, px, py)
    return -1


@export("error_rows_bf16", ("uint16", "float32", "float64"))
@nb.njit(nogil=True, cache=True)
def error_rows_bf16(a, b, out, r0, r1):
    """``error_rows`` of a BF16 source given as its bits (uint16)."""
    state, mx, px, py = _buffers()
    for r in range(r0, r1):
        _row(a[r], (b[r],), out[r], state, mx, px, py)
    return -1


@nb.njit(nogil=True, cache=True, inline="always")
def _int4_rows(a, codes, s, gs, out, r0, r1):
    state, mx, px, py = _buffers()
    n = a.shape[1]
    if gs % LANES == 0 or gs >= n:  # every chunk of LANES lies in one scale group: decoded in the lane loop
        for r in range(r0, r1):
            _row(a[r], (codes[r], s[r], gs), out[r], state, mx, px, py)
        return -1
    scratch = np.empty((1, n), np.float32)  # another group size: each row decoded first (the same values)
    for r in range(r0, r1):
        _decode_int4_rows(codes[r : r + 1], s[r : r + 1], scratch, gs, 0, 1)
        _row(a[r], (scratch[0],), out[r], state, mx, px, py)
    return -1


@export("error_int4", ("float32", "uint8", "float32", "i", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int4(a, codes, s, gs, out, r0, r1):
    """``error_rows`` of float32 ``a`` against int4 pairs ``codes`` with a scale per ``gs`` inputs (``s [O, G]``;
    ``gs >= I`` for int4-row), decoded as ``_decode_int4_rows`` decodes them."""
    return _int4_rows(a, codes, s, gs, out, r0, r1)


@export("error_int4_bf16", ("uint16", "uint8", "float32", "i", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int4_bf16(a, codes, s, gs, out, r0, r1):
    """``error_int4`` of a BF16 source given as its bits."""
    return _int4_rows(a, codes, s, gs, out, r0, r1)


@export("error_int8", ("float32", "int8", "float32[]", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int8(a, q, s, out, r0, r1):
    """``error_rows`` of float32 ``a`` against int8-row codes ``q`` and row scales ``s``."""
    state, mx, px, py = _buffers()
    for r in range(r0, r1):
        _row(a[r], (q[r], s[r]), out[r], state, mx, px, py)
    return -1


@export("error_int8_bf16", ("uint16", "int8", "float32[]", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int8_bf16(a, q, s, out, r0, r1):
    """``error_int8`` of a BF16 source given as its bits."""
    state, mx, px, py = _buffers()
    for r in range(r0, r1):
        _row(a[r], (q[r], s[r]), out[r], state, mx, px, py)
    return -1
