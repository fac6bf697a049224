"""The numba kernels of ``error_stats``: a tensor's error figures (docs/FORMATS.md §11) row by row, bit for bit
the numpy reference ``error_stats.row_sums``: per block of ``BLOCK`` elements of a row, float32 terms summed in
``LANES`` lanes in element order, the lanes folded in halves, each block's four sums added to the row's in float64
in block order; a row whose float32 sums overflow summed again in float64 in element order. The largest
difference is the float32 ``|w' - w|``, taken on its bits (a maximum: no order). A BF16 source is read as its
bits (no float32 copy of the tensor). The ``error_int*`` kernels take the written tensor's codes and scales
instead of its decoded values and decode them inside the lane loop, exactly as ``_jit_decoders`` does (a group
size that is not a multiple of the lane count decodes a row into a scratch row first). ``rows_bf16_measured``
runs the BF16 encoder and measures what it wrote, a few rows at a time.

Why the lane loop is LLVM IR written here (``_row_lanes``) rather than numba: a float sum vectorises only when the
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
from colitools.formats.kernels._jit_bits import _INT4_GROUPED, _INT4_ROW, _INT8_ROW, _dequant_fp8_row, _e4m3
from colitools.formats.kernels._jit_decoders import _decode_int4_rows
from colitools.formats.kernels._jit_encoders import _encode_rows_bf16, _fp8_buffers, _fp8_rows_with
from colitools.formats.kernels.aot import export

_ABS = np.uint32(0x7FFFFFFF)
_I64 = ir.IntType(64)
_ROWS = 4  # rows encoded, then measured, at a time by ``rows_bf16_measured`` (a few tens of KB: in L2)


# ------------------------------------------------------------------------------------------ the lane loop
def _vec_ptr(builder, data, index, vtype):
    return builder.bitcast(builder.gep(data, [index]), vtype.as_pointer())


def _splat(builder, value, vtype):
    one = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vtype, ir.Undefined), ir.Constant(
        ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


def _load_x(builder, kind, xa, i, group):
    """Source values ``[i, i + LANES)`` as float32 lanes: stored float32, BF16 bits widened exactly (``bits <<
    16``), or e4m3fn bytes times the chunk's scale ``group`` (``_e4m3(byte) * sv`` as ``_dequant_fp8_row``).
    An e4m3fn byte ``s eeee mmm`` moved to a half's fields (``s`` to bit 15, ``eeee mmm`` to bits 13..7: the
    sign-extended byte shifted left 7, masked) is its value times 2^-8 exactly, subnormals included (both
    formats' subnormals scale alike), and a half widens to float32 exactly (F16C's vcvtph2ps where the CPU has
    it): so ``f32(half) * 256`` is the byte's value, and one float32 multiply by ``sv`` the dequant. The NaN
    byte 0x7F is not looked for: ``rows_fp8_measured`` measures only rows its encoder accepted, and the encoder
    refuses a row holding one."""
    f32v, i32v = ir.VectorType(ir.FloatType(), LANES), ir.VectorType(ir.IntType(32), LANES)
    if kind == "f32":
        return builder.load(_vec_ptr(builder, xa[0].data, i, f32v), align=4)
    if kind == "bf16":
        bits = builder.load(_vec_ptr(builder, xa[0].data, i, ir.VectorType(ir.IntType(16), LANES)), align=2)
        return builder.bitcast(builder.shl(builder.zext(bits, i32v), _ivec(16)), f32v)
    i16v = ir.VectorType(ir.IntType(16), LANES)
    b = builder.sext(builder.load(_vec_ptr(builder, xa[0].data, i, ir.VectorType(ir.IntType(8), LANES)), align=1),
                     i16v)
    half = builder.and_(builder.shl(b, ir.Constant(i16v, [7] * LANES)), ir.Constant(i16v, [0xBF80] * LANES))
    v = builder.fmul(builder.fpext(builder.bitcast(half, ir.VectorType(ir.HalfType(), LANES)), f32v),
                     ir.Constant(f32v, [256.0] * LANES))
    sv = builder.load(builder.gep(xa[1].data, [group]))
    return builder.fmul(v, _splat(builder, sv, f32v))


def _ivec(value):
    """``<LANES x i32>`` of one value."""
    return ir.Constant(ir.VectorType(ir.IntType(32), LANES), [value] * LANES)


def _load_y(builder, kind, ya, i, group):
    """Decoded values ``[i, i + LANES)``: stored float32, or ``float32(code) * scale`` as the decoders compute
    them (int8; int4 pairs: element 2k the low nibble of byte k, minus 8; the chunk's scale ``group``)."""
    f32v, i32v = ir.VectorType(ir.FloatType(), LANES), ir.VectorType(ir.IntType(32), LANES)
    if kind == "f32":
        return builder.load(_vec_ptr(builder, ya[0].data, i, f32v), align=4)
    if kind == "int8":
        q = builder.load(_vec_ptr(builder, ya[0].data, i, ir.VectorType(ir.IntType(8), LANES)), align=1)
        return builder.fmul(builder.sitofp(builder.sext(q, i32v), f32v), _splat(builder, ya[1], f32v))
    i8h, i8v = ir.VectorType(ir.IntType(8), LANES // 2), ir.VectorType(ir.IntType(8), LANES)
    raw = builder.load(_vec_ptr(builder, ya[0].data, builder.lshr(i, ir.Constant(_I64, 1)), i8h), align=1)
    low = builder.and_(raw, ir.Constant(i8h, [15] * (LANES // 2)))
    high = builder.lshr(raw, ir.Constant(i8h, [4] * (LANES // 2)))
    order = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [k // 2 + (LANES // 2) * (k % 2) for k in range(LANES)])
    nib = builder.sub(builder.shuffle_vector(low, high, order), ir.Constant(i8v, [8] * LANES))
    nib = builder.sext(nib, i32v)
    scale = builder.load(builder.gep(ya[1].data, [group]))
    return builder.fmul(builder.sitofp(nib, f32v), _splat(builder, scale, f32v))


class _GroupWalk:
    """The scale group of each chunk from ``start`` on (``gs`` a multiple of LANES, or at least the row): one
    division before the loop, then a count of the chunks left in the group (a division per chunk costs more than
    the chunk's arithmetic)."""

    def __init__(self, builder, start, gs):
        self.builder = builder
        lanes = ir.Constant(_I64, LANES)
        self.per_group = builder.sdiv(gs, lanes)
        first = builder.sdiv(start, gs)
        self.group, self.left = cgutils.alloca_once(builder, _I64), cgutils.alloca_once(builder, _I64)
        builder.store(first, self.group)
        ends = builder.mul(builder.add(first, ir.Constant(_I64, 1)), gs)
        builder.store(builder.sdiv(builder.sub(ends, start), lanes), self.left)

    def next(self):
        """The group index of the next chunk."""
        b = self.builder
        left, group = b.load(self.left), b.load(self.group)
        done = b.icmp_signed("==", left, ir.Constant(_I64, 0))
        group = b.select(done, b.add(group, ir.Constant(_I64, 1)), group)
        b.store(group, self.group)
        b.store(b.sub(b.select(done, self.per_group, left), ir.Constant(_I64, 1)), self.left)
        return group


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


def _x_kind(x) -> str | None:
    """The source values' operand: a float32 row, a BF16 row as its bits (uint16), or ``(uint8 e4m3fn bytes row,
    float32 scales row, block width)``: an FP8 row whose element ``i`` is ``e4m3(byte) * scales[i // width]``."""
    if isinstance(x, types.Array):
        return {types.float32: "f32", types.uint16: "bf16"}.get(x.dtype)
    if not isinstance(x, types.BaseTuple) or len(x) != 3 or not isinstance(x[2], types.Integer):
        return None
    kinds = [t.dtype if isinstance(t, types.Array) else None for t in x[:2]]
    return "fp8" if kinds == [types.uint8, types.float32] else None


def _operands(context, builder, typ, value):
    """The arrays (and integers) of an operand: one array, or a tuple's items."""
    if isinstance(typ, types.Array):
        return [context.make_array(typ)(context, builder, value)]
    out = []
    for k, t in enumerate(typ):
        item = builder.extract_value(value, k)
        out.append(context.make_array(t)(context, builder, item) if isinstance(t, types.Array) else item)
    return out


def _add_chunk(builder, slots, mslot, a, b):
    """The terms of one chunk (``a`` source, ``b`` decoded lanes) added to the lane sums, ``|b - a|`` bits to the
    lane maxima."""
    i32v = ir.VectorType(ir.IntType(32), LANES)
    d = builder.fsub(b, a)
    for q, term in enumerate((builder.fmul(d, d), builder.fmul(a, a), builder.fmul(b, b), builder.fmul(a, b))):
        builder.store(builder.fadd(builder.load(slots[q]), term), slots[q])
    bits = builder.and_(builder.bitcast(d, i32v), ir.Constant(i32v, [0x7FFFFFFF] * LANES))
    h = LANES // 2  # a maximum has no order: the two halves folded at once, one accumulator (register) fewer
    low, high = (builder.shuffle_vector(bits, bits, _indices(range(o, o + h))) for o in (0, h))
    bits = builder.select(builder.icmp_unsigned(">", low, high), low, high)
    m = builder.load(mslot)
    builder.store(builder.select(builder.icmp_unsigned(">", bits, m), bits, m), mslot)


def _indices(values):
    """A shuffle mask."""
    values = list(values)
    return ir.Constant(ir.VectorType(ir.IntType(32), len(values)), values)


def _fold_into(builder, slots, totals):
    """Each lane vector folded in halves (``l[j] + l[j + h]``, h = 8, 4, 2, 1), widened, added to its float64
    total."""
    i32 = ir.IntType(32)
    for q in range(4):
        v = builder.load(slots[q])
        h = LANES // 2
        while h >= 1:
            pick = lambda off, h=h: ir.Constant(ir.VectorType(i32, h), [off + j for j in range(h)])  # noqa: E731
            v = builder.fadd(builder.shuffle_vector(v, v, pick(0)), builder.shuffle_vector(v, v, pick(h)))
            h //= 2
        wide = builder.fpext(builder.extract_element(v, ir.Constant(i32, 0)), ir.DoubleType())
        builder.store(builder.fadd(builder.load(totals[q]), wide), totals[q])


@intrinsic
def _row_lanes(typingctx, x, ys, n, pad_x, pad_y, tail, out, mx):
    """One row of ``n`` elements: ``out[0:4]`` = its (sse, ssw, ssq, dot) in ``error_stats.row_sums``' order,
    ``mx`` = the lanes' maxima of ``|float32(y - x)|`` bits (uint32 ``[LANES]``). Its whole chunks are read from
    ``x`` and ``ys``; when ``tail``, the last (partial) chunk from ``pad_x`` / ``pad_y`` (float32 ``[LANES]``, the
    caller's zero-padded copy). For an int4 ``ys`` every whole chunk lies in one scale group (the caller's
    promise), and so does every whole chunk of an FP8 ``x`` in one scale block. The whole row in one call: a call per block costs ~150 cycles of reference counting."""
    kind, xkind = _y_kind(ys), _x_kind(x)
    if kind is None or xkind is None:
        return None

    def codegen(context, builder, sig, args):
        xv, yv, size, px, py, has_tail, ov, mv = args
        f32v, i32v = ir.VectorType(ir.FloatType(), LANES), ir.VectorType(ir.IntType(32), LANES)
        xa = _operands(context, builder, sig.args[0], xv)
        ya = _operands(context, builder, sig.args[1], yv)
        pxa, pya, oa, ma = (context.make_array(sig.args[k])(context, builder, args[k]) for k in (3, 4, 6, 7))
        slots = [cgutils.alloca_once(builder, f32v) for _ in range(4)]  # registers after mem2reg
        totals = [cgutils.alloca_once_value(builder, ir.Constant(ir.DoubleType(), 0.0)) for _ in range(4)]
        mslot = cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(ir.IntType(32), LANES // 2), [0] * (LANES // 2)))
        full = builder.and_(size, ir.Constant(_I64, -LANES))
        blocks = builder.udiv(builder.add(size, ir.Constant(_I64, BLOCK - 1)), ir.Constant(_I64, BLOCK))
        groups = _GroupWalk(builder, ir.Constant(_I64, 0), ya[2]) if kind == "int4" else None
        blocks_x = _GroupWalk(builder, ir.Constant(_I64, 0), xa[2]) if xkind == "fp8" else None
        with cgutils.for_range(builder, blocks) as block:
            b0 = builder.mul(block.index, ir.Constant(_I64, BLOCK))
            end = builder.add(b0, ir.Constant(_I64, BLOCK))
            end = builder.select(builder.icmp_signed("<", full, end), full, end)
            chunks = builder.sdiv(builder.sub(end, b0), ir.Constant(_I64, LANES))
            none = ir.Constant(_I64, 0)
            chunks = builder.select(builder.icmp_signed("<", chunks, none), none, chunks)
            for q in range(4):
                builder.store(ir.Constant(f32v, [0.0] * LANES), slots[q])
            with cgutils.for_range(builder, chunks) as loop:
                i = builder.add(b0, builder.mul(loop.index, ir.Constant(_I64, LANES)))
                b = _load_y(builder, kind, ya, i, groups.next() if groups else None)
                a = _load_x(builder, xkind, xa, i, blocks_x.next() if blocks_x else None)
                _add_chunk(builder, slots, mslot, a, b)
            last = builder.icmp_signed("==", block.index, builder.sub(blocks, ir.Constant(_I64, 1)))
            with builder.if_then(builder.and_(last, builder.trunc(has_tail, ir.IntType(1)))):
                zero = ir.Constant(_I64, 0)
                a = builder.load(_vec_ptr(builder, pxa.data, zero, f32v), align=4)
                _add_chunk(builder, slots, mslot, a, builder.load(_vec_ptr(builder, pya.data, zero, f32v), align=4))
            _fold_into(builder, slots, totals)
        for q in range(4):
            builder.store(builder.load(totals[q]), builder.gep(oa.data, [ir.Constant(_I64, q)]))
        m = builder.load(mslot)  # into both halves of mx
        builder.store(builder.shuffle_vector(m, m, _indices(list(range(LANES // 2)) * 2)),
                      _vec_ptr(builder, ma.data, ir.Constant(_I64, 0), i32v), align=4)
        return context.get_dummy_value()

    return types.void(x, ys, types.int64, pad_x, pad_y, types.int64, out, mx), codegen


# ------------------------------------------------------------------------- one element, for tails and overflow
def _x_at(x, i):
    """Source element ``i`` as float32."""


@overload(_x_at, inline="always")
def _x_at_impl(x, i):
    kind = _x_kind(x)
    if kind == "bf16":
        return lambda x, i: np.uint32(np.uint32(x[i]) << np.uint32(16)).view(np.float32)
    if kind == "fp8":
        return lambda x, i: _fp8_at(x[0], x[1], x[2], i)
    return lambda x, i: x[i]


@nb.njit(nogil=True, cache=True)
def _fp8_at(q, srow, bc, i):
    """Element ``i`` of an FP8 row (not inlined: ``_e4m3``'s branches inlined into an overload's lambda trip
    numba's SSA check)."""
    return _e4m3(q[i]) * srow[i // bc]


def _x_size(x):
    """The source row's element count."""


@overload(_x_size, inline="always")
def _x_size_impl(x):
    if _x_kind(x) == "fp8":
        return lambda x: x[0].size
    return lambda x: x.size


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
@nb.njit(nogil=True, cache=True, inline="always")
def _row(x, ys, out, mx, pad_x, pad_y):
    """``out[:] = (sse, ssw, ssq, dot, max |w' - w|)`` of one row (``error_stats.row_sums``'s order)."""
    n = _x_size(x)
    full = n - n % LANES
    if n > full:  # the last chunk zero-padded (a zero adds nothing)
        pad_x[:] = 0.0
        pad_y[:] = 0.0
        for i in range(full, n):
            pad_x[i - full] = _x_at(x, i)
            pad_y[i - full] = _y_at(ys, i)
    _row_lanes(x, ys, n, pad_x, pad_y, 1 if n > full else 0, out, mx)
    if not (np.isfinite(out[0]) and np.isfinite(out[1]) and np.isfinite(out[2]) and np.isfinite(out[3])):
        _row_f64(x, ys, out)
    out[4] = np.float64(np.uint32(mx.max()).view(np.float32))


@nb.njit(nogil=True, cache=True)
def _row_f64(x, ys, sums):
    """A row whose float32 sums overflowed: float64 sums in element order (``error_stats``'s fallback)."""
    sse = ssw = ssq = dot = 0.0
    for i in range(_x_size(x)):
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
    return np.zeros(LANES, np.uint32), np.zeros(LANES, np.float32), np.zeros(LANES, np.float32)


# --------------------------------------------------------------------------------------------- the drivers
@export("error_rows", ("float32", "float32", "float64"))
@nb.njit(nogil=True, cache=True)
def error_rows(a, b, out, r0, r1):
    """Rows ``[r0, r1)`` of float32 ``a`` (source) and ``b`` (decoded) -> ``out[r] = (sse, ssw, ssq, dot,
    max |b - a|)``. Returns -1 (the codecs' "no bad row" convention)."""
    return _decoded_rows(a, b, out, r0, r1)


@export("error_rows_bf16", ("uint16", "float32", "float64"))
@nb.njit(nogil=True, cache=True)
def error_rows_bf16(a, b, out, r0, r1):
    """``error_rows`` of a BF16 source given as its bits (uint16)."""
    return _decoded_rows(a, b, out, r0, r1)


@nb.njit(nogil=True, cache=True, inline="always")
def _decoded_rows(a, b, out, r0, r1):
    mx, px, py = _buffers()
    for r in range(r0, r1):
        _row(a[r], (b[r],), out[r], mx, px, py)
    return -1


@nb.njit(nogil=True, cache=True, inline="always")
def _int4_row(x, codes, s, gs, o, out, bufs, scratch):
    """Row ``o``'s figures (source row operand ``x``) against int4 pairs: decoded in the lane loop when every
    chunk of LANES lies in one scale group, else decoded into ``scratch`` (``[1, I]``) first (the same values)."""
    mx, px, py = bufs
    if gs % LANES == 0 or gs >= _x_size(x):
        _row(x, (codes[o], s[o], gs), out[o], mx, px, py)
    else:
        _decode_int4_rows(codes[o : o + 1], s[o : o + 1], scratch, gs, 0, 1)
        _row(x, (scratch[0],), out[o], mx, px, py)


@nb.njit(nogil=True, cache=True, inline="always")
def _int4_rows(a, codes, s, gs, out, r0, r1):
    bufs, scratch = _buffers(), np.empty((1, a.shape[1]), np.float32)
    for r in range(r0, r1):
        _int4_row(a[r], codes, s, gs, r, out, bufs, scratch)
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
    return _int8_rows(a, q, s, out, r0, r1)


@export("error_int8_bf16", ("uint16", "int8", "float32[]", "float64"))
@nb.njit(nogil=True, cache=True)
def error_int8_bf16(a, q, s, out, r0, r1):
    """``error_int8`` of a BF16 source given as its bits."""
    return _int8_rows(a, q, s, out, r0, r1)


@nb.njit(nogil=True, cache=True, inline="always")
def _int8_rows(a, q, s, out, r0, r1):
    mx, px, py = _buffers()
    for r in range(r0, r1):
        _row(a[r], (q[r], s[r]), out[r], mx, px, py)
    return -1


# --------------------------------------------------------------------------- measured while it is encoded
@export("rows_bf16_measured", ("uint16", "i", "i", "uint8", "float32", "uint8", "float64"))
@nb.njit(nogil=True, cache=True)
def rows_bf16_measured(wb, fmt, gs, codes, sf, su, out, r0, r1):
    """``rows_bf16`` (the BF16 encoder, ``_jit_encoders``) and, for an int8-row / int4-row / int4-grouped
    ``fmt``, ``out[r]`` = ``error_int*_bf16``'s figures of what it wrote, ``_ROWS`` rows at a time: each block of
    rows measured right after it is encoded, while its source and codes are in cache (no second pass over the
    tensor). Returns the encoder's first bad row, or -1."""
    bufs, scratch = _buffers(), np.empty((1, wb.shape[1]), np.float32)
    for r in range(r0, r1, _ROWS):
        e = min(r + _ROWS, r1)
        bad = _encode_rows_bf16(wb, fmt, gs, codes, sf, su, r, e)
        if bad >= 0:
            return bad
        for o in range(r, e):
            _written_row(wb[o], fmt, gs, codes, sf, o, out, bufs, scratch)
    return -1


@nb.njit(nogil=True, cache=True, inline="always")
def _written_row(x, fmt, gs, codes, sf, o, out, bufs, scratch):
    """Row ``o``'s figures (source row operand ``x``) against what an encoder just wrote there: int8-row codes
    and their row scale, or int4 pairs with a scale per ``gs`` (int4-grouped) or per row (int4-row); nothing for
    any other ``fmt``."""
    mx, px, py = bufs
    if fmt == _INT8_ROW:
        _row(x, (codes[o].view(np.int8), sf[o, 0]), out[o], mx, px, py)
    elif fmt == _INT4_ROW or fmt == _INT4_GROUPED:
        _int4_row(x, codes, sf, gs if fmt == _INT4_GROUPED else _x_size(x), o, out, bufs, scratch)


@export("rows_fp8_measured", ("uint8", "float32", "i", "i", "i", "i", "uint8", "float32", "uint8", "float64"))
@nb.njit(nogil=True, cache=True)
def rows_fp8_measured(q, s, br, bc, fmt, gs, codes, sf, su, out, r0, r1):
    """``rows_fp8`` (the FP8 encoder: e4m3fn bytes ``q`` with a float32 scale per ``br x bc`` block, ``s``) and,
    for an int8-row / int4-row / int4-grouped ``fmt``, ``out[r]`` = the figures of what it wrote against the
    exact dequant ``e4m3(q) * sv`` (``dequant_fp8_block``'s values), ``_ROWS`` rows at a time, the dequant done
    in the lane loop (no float32 copy of the tensor); a block width that is not a multiple of LANES dequantises
    a row into a scratch row first. Returns the encoder's first bad row, or -1."""
    bufs, scratch = _buffers(), np.empty((1, q.shape[1]), np.float32)
    xrow = np.empty(q.shape[1], np.float32)
    lanes = bc % LANES == 0 or bc >= q.shape[1]
    encoding = _fp8_buffers(q.shape[1], bc, fmt, gs)  # kept: the thresholds of a row block are made once
    for r in range(r0, r1, _ROWS):
        e = min(r + _ROWS, r1)
        bad = _fp8_rows_with(q, s, br, bc, fmt, gs, codes, sf, su, r, e, encoding)
        if bad >= 0:
            return bad
        for o in range(r, e):
            if lanes:
                _written_row((q[o], s[o // br], bc), fmt, gs, codes, sf, o, out, bufs, scratch)
            else:
                _dequant_fp8_row(q[o], s[o // br], bc, xrow)
                _written_row(xrow, fmt, gs, codes, sf, o, out, bufs, scratch)
    return -1
