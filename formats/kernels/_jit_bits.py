"""Shared pieces of the numba codecs: JIT options, constants and format codes, the ``@intrinsic`` bit helpers,
the small ``inline`` helpers every encoder uses, and the exact e4m3fn decode shared by the FP8 encoder and
``dequant_fp8_block``. See the package docstring for the byte-identity rules."""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from colitools.formats import reference as ref
from colitools.formats import registry

_JIT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")
njit = numba.njit(**_JIT)
inline = numba.njit(inline="always", **_JIT)

F32 = np.float32
_FLOOR = ref.SCALE_FLOOR
_NONFINITE_BITS = np.uint32(0x7F800000)  # |x| bits >= this: inf or NaN
_Q127, _Q7, _Q3, _Q1 = F32(127), F32(7), F32(3), F32(1)
_SIX = F32(6)

# Format codes inside the kernels: each format class owns its ``kernel_code`` (registry.py). They are read
# here once, as module constants, so numba compiles them in as literals (a changed code needs a cache purge).
_INT8_ROW = registry.Int8Row.kernel_code
_INT4_ROW = registry.Int4Row.kernel_code
_INT2_ROW = registry.Int2Row.kernel_code
_INT4_GROUPED = registry.Int4Grouped.kernel_code
_INT3_G64 = registry.Int3G64.kernel_code
_MXFP4 = registry.Mxfp4.kernel_code

# The one decode tables of the code base (reference.py), not copies.
E4M3_TO_F32 = ref.E4M3_TO_F32
_E2M1_F32 = ref.E2M1_SIGNED
_E2M1_SIGNED_F64 = _E2M1_F32.astype(np.float64)  # exact; code 8 (-0.0) gives the same error as +0.0
_E8M0_F32 = ref.E8M0_TO_F32


# ------------------------------------------------------------------------------------------ bit intrinsics
@intrinsic
def _abs_bits(typingctx, x):
    """float32 -> its bit pattern with the sign bit cleared (uint32)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        return builder.and_(builder.bitcast(args[0], i32), ir.Constant(i32, 0x7FFFFFFF))

    return types.uint32(types.float32), codegen


@intrinsic
def _f32_bits(typingctx, x):
    """float32 -> its bit pattern (uint32)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


def _int_width(builder, v, width: int):
    """An integer LLVM value cut to its low ``width`` bits or zero-extended to them (the intrinsics' argument)."""
    if v.type.width > width:
        return builder.trunc(v, ir.IntType(width))
    if v.type.width < width:
        return builder.zext(v, ir.IntType(width))
    return v


@intrinsic
def _half_f32(typingctx, h):
    """Integer (low 16 bits: IEEE half bits) -> the float32 of the same value, by the CPU's own conversion
    (LLVM ``fpext half``: x86 F16C ``vcvtph2ps``, 8 lanes at a time; AArch64 ``fcvt``). Exact for every finite
    half and for infinities; a NaN stays a NaN (its quiet bit may be set), which the encoders refuse anyway.
    Compiled only where ``HALF_IN_HARDWARE`` (elsewhere LLVM would call a runtime helper numba does not link)."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = _int_width(builder, args[0], 16)
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())

    return types.float32(h), codegen


def _half_in_hardware() -> bool:
    """Whether this CPU converts halves itself: x86 with F16C (every x86-64 CPU since 2012-2013), AArch64."""
    import platform

    import llvmlite.binding as llvm

    if platform.machine().lower() in ("aarch64", "arm64"):
        return True
    try:
        return bool(llvm.get_host_cpu_features().get("f16c", False))
    except RuntimeError:  # LLVM cannot tell on this host: the software decode (the same values)
        return False


HALF_IN_HARDWARE = _half_in_hardware()


@intrinsic
def _bits_f32(typingctx, b):
    """Integer (low 32 bits) -> float32 with that bit pattern."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(_int_width(builder, args[0], 32), ir.FloatType())

    return types.float32(b), codegen


@intrinsic
def _umax32(typingctx, a, b):
    """Unsigned max that stays 32-bit (numba would widen to 64 bits and halve the vector width)."""
    if a != types.uint32 or b != types.uint32:
        return None

    def codegen(context, builder, sig, args):
        x, y = args
        return builder.select(builder.icmp_unsigned(">", x, y), x, y)

    return types.uint32(types.uint32, types.uint32), codegen


# (bound bits, tie goes down): |r| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5, <= 2.5 -> 2,
# < 3.5 -> 3, <= 5 -> 4, else 6 (reference._E2M1_BOUNDS / _E2M1_TIE_GOES_DOWN).
_E2M1_RULE = [
    (int(F32(b).view(np.uint32)), bool(down))
    for b, down in zip(ref._E2M1_BOUNDS, ref._E2M1_TIE_GOES_DOWN, strict=True)
]


@intrinsic
def _e2m1_code(typingctx, r):
    """float32 r -> E2M1 nibble (uint8): the magnitude index counts the bounds |r| passes (compared as bit
    patterns: for non-negative floats unsigned integer order is float order), bit 3 = sign unless the index
    is 0 (a value that rounds to zero is code 0, never 8). Pure 32-bit integer ops, so it vectorises."""
    if r != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        mag = builder.and_(bits, ir.Constant(i32, 0x7FFFFFFF))
        idx = ir.Constant(i32, 0)
        for bound, tie_down in _E2M1_RULE:
            passed = builder.icmp_unsigned(">" if tie_down else ">=", mag, ir.Constant(i32, bound))
            idx = builder.add(idx, builder.zext(passed, i32))
        negative = builder.icmp_signed("<", bits, ir.Constant(i32, 0))  # sign bit (r is never NaN)
        nonzero = builder.icmp_unsigned("!=", idx, ir.Constant(i32, 0))
        sign = builder.zext(builder.and_(negative, nonzero), i32)
        code = builder.or_(idx, builder.shl(sign, ir.Constant(i32, 3)))
        return builder.trunc(code, ir.IntType(8))

    return types.uint8(types.float32), codegen


def _e2m1_of(builder, v, below, neg):
    """The E2M1 nibble of an i8 or of each lane of an i8 vector ``v`` from its block's seven thresholds, given
    as ``below`` (i8 values, or vectors of them, ``t - 1``: ``j >= t`` is ``j > t - 1``, signed, since both are
    at most 127 and t = 0 gives -1): the index counts the thresholds ``j = v & 0x7F`` reaches, bit 3 is ``v``'s
    sign bit xor ``neg`` (0 or 1) unless the index is 0 (the sign as a signed compare: one vpcmpgtb on x86)."""
    i8 = ir.IntType(8)
    lanes = v.type.count if isinstance(v.type, ir.VectorType) else None
    zero = ir.Constant(v.type, [0] * lanes if lanes else 0)
    j = builder.and_(v, _splat(builder, ir.Constant(i8, 0x7F), lanes))
    idx = zero
    for t in below:
        t = t if isinstance(t.type, ir.VectorType) else _splat(builder, t, lanes)
        idx = builder.add(idx, builder.zext(builder.icmp_signed(">", j, t), v.type))
    flipped = builder.xor(v, _splat(builder, builder.shl(neg, ir.Constant(i8, 7)), lanes))
    negative = builder.and_(builder.icmp_signed("<", flipped, zero), builder.icmp_unsigned("!=", idx, zero))
    return builder.or_(idx, builder.select(negative, _splat(builder, ir.Constant(i8, 8), lanes), zero))


@intrinsic
def _mx_nibbles32(typingctx, src, si, dst, di, thr, ti, neg):
    """The 16 mxfp4 code bytes of the 32 e4m3 bytes ``src[si:si + 32]``, into ``dst[di:di + 16]``:
    ``c[2k] | c[2k + 1] << 4``, each ``c`` the E2M1 nibble of its byte from the block's seven thresholds, each
    stored as ``t - 1`` in every byte of a 32-byte run ``thr[ti + 32 (i - 1):][:32]`` (``t``: the first magnitude
    byte whose E2M1 index is >= i), and the sign ``neg`` of the block's scale (``_e2m1_of``). One vector load,
    seven compares with the runs as memory operands, the pairs joined, one store: portable LLVM vector IR."""
    if not (_level_args_ok(src, si, dst, di, (ti, neg)) and _byte_row(thr)):
        return None

    def codegen(context, builder, sig, args):
        x = _byte_vector(context, builder, sig.args[0], args[0], args[1], 32)
        at = _int_width(builder, args[5], 64)
        below = [
            _byte_vector(
                context, builder, sig.args[4], args[4], builder.add(at, ir.Constant(at.type, 32 * k)), 32
            )
            for k in range(7)
        ]
        c = _e2m1_of(builder, x, below, _int_width(builder, args[6], 8))
        _store_bytes(context, builder, sig.args[2], args[2], args[3], _join_nibbles(builder, c))
        return context.get_dummy_value()

    return types.none(src, si, dst, di, thr, ti, neg), codegen


@intrinsic
def _mag_max8(typingctx, m, v):
    """``max(m, v & 0x7F)`` of two bytes (an e4m3 byte's magnitude bits), in 8 bits: 32 lanes to a vector
    (numba would widen ``v & mask`` to 64 bits)."""
    if not isinstance(m, types.Integer) or not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        x = _int_width(builder, args[0], 8)
        y = builder.and_(_int_width(builder, args[1], 8), ir.Constant(ir.IntType(8), 0x7F))
        return builder.select(builder.icmp_unsigned(">", x, y), x, y)

    return types.uint8(m, v), codegen


def _byte_row(t) -> bool:
    return isinstance(t, types.Array) and t.dtype == types.uint8 and t.ndim == 1 and t.layout == "C"


def _byte_vector(context, builder, arr_type, arr, at, lanes: int):
    """``lanes`` bytes of a contiguous byte row from index ``at``, as one LLVM vector (an unaligned load)."""
    a = context.make_array(arr_type)(context, builder, arr)
    ptr = builder.gep(a.data, [_int_width(builder, at, 64)])
    return builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(8), lanes).as_pointer()), align=1)


def _store_bytes(context, builder, arr_type, arr, at, value):
    a = context.make_array(arr_type)(context, builder, arr)
    ptr = builder.gep(a.data, [_int_width(builder, at, 64)])
    builder.store(value, builder.bitcast(ptr, value.type.as_pointer()), align=1)


def _splat(builder, value, lanes: int | None):
    """An i8 scalar in every lane of a vector (``lanes`` None: the scalar itself)."""
    if lanes is None:
        return value
    vec = ir.VectorType(ir.IntType(8), lanes)
    one = builder.insert_element(ir.Constant(vec, None), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(
        one, ir.Constant(vec, None), ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
    )


@intrinsic
def _mag_max32(typingctx, src, si):
    """``max(src[si + k] & 0x7F for k < 32)``: the largest magnitude bits of 32 e4m3 bytes, in one vector load,
    mask and reduction (portable LLVM vector IR; LLVM's own vectoriser takes 8 bytes at a time here)."""
    if not (_byte_row(src) and isinstance(si, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i8 = ir.IntType(8)
        x = builder.and_(
            _byte_vector(context, builder, sig.args[0], args[0], args[1], 32),
            _splat(builder, ir.Constant(i8, 0x7F), 32),
        )
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i8, [x.type]), "llvm.vector.reduce.umax.v32i8"
        )
        return builder.call(fn, [x])

    return types.uint8(src, si), codegen


@intrinsic
def _int3_planes32(typingctx, src, si, dst, dl, dh):
    """int3 planes of 32 codes ``u = src[si:si + 32]`` (0..7): the low plane, bits 0-1 of four codes to a byte
    (``_pack_quad``), into ``dst[dl:dl + 8]``; the high plane, bit 2 of eight codes to a byte (code i at bit i),
    into ``dst[dh:dh + 4]``. One vector load, shifts and masks on 32-bit lanes, and a sign-mask (vpmovmskb on
    x86), in portable LLVM vector IR."""
    if not (_byte_row(src) and _byte_row(dst) and all(isinstance(a, types.Integer) for a in (si, dl, dh))):
        return None

    def codegen(context, builder, sig, args):
        i8, i32 = ir.IntType(8), ir.IntType(32)
        u = _byte_vector(context, builder, sig.args[0], args[0], args[1], 32)
        x = builder.bitcast(builder.and_(u, _splat(builder, ir.Constant(i8, 3), 32)), ir.VectorType(i32, 8))
        low = x
        for shift, mask in ((6, 0xC), (12, 0x30), (18, 0xC0)):
            part = builder.lshr(x, ir.Constant(x.type, [shift] * 8))
            low = builder.or_(low, builder.and_(part, ir.Constant(x.type, [mask] * 8)))
        _store_bytes(
            context, builder, sig.args[2], args[2], args[3], builder.trunc(low, ir.VectorType(i8, 8))
        )
        top = builder.icmp_signed(
            "<", builder.shl(u, _splat(builder, ir.Constant(i8, 5), 32)), ir.Constant(u.type, [0] * 32)
        )
        _store_bytes(context, builder, sig.args[2], args[2], args[4], builder.bitcast(top, i32))
        return context.get_dummy_value()

    return types.none(src, si, dst, dl, dh), codegen


def _levels_of(builder, x, thresholds, flip, zero):
    """``_level_code`` of an i8 or of each lane of an i8 vector ``x`` (the same ops). ``j >= t`` is computed as
    ``j > t - 1``, signed (both are at most 127, and t = 0 gives -1): one vpcmpgtb per threshold on x86."""
    i8 = ir.IntType(8)
    lanes = x.type.count if isinstance(x.type, ir.VectorType) else None
    j = builder.and_(x, _splat(builder, ir.Constant(i8, 0x7F), lanes))
    n = ir.Constant(x.type, [0] * lanes if lanes else 0)
    for t in thresholds:
        if isinstance(t.type, ir.VectorType):  # already t - 1 in every lane
            below = t
        else:
            below = _splat(builder, builder.sub(_int_width(builder, t, 8), ir.Constant(i8, 1)), lanes)
        n = builder.add(n, builder.zext(builder.icmp_signed(">", j, below), x.type))
    sign = builder.lshr(x, _splat(builder, ir.Constant(i8, 7), lanes))
    negative = builder.and_(
        builder.xor(sign, _splat(builder, _int_width(builder, flip, 8), lanes)),
        _splat(builder, ir.Constant(i8, 1), lanes),
    )
    mask = builder.sub(ir.Constant(x.type, [0] * lanes if lanes else 0), negative)  # -1 where negative
    return builder.add(
        _splat(builder, _int_width(builder, zero, 8), lanes), builder.sub(builder.xor(n, mask), mask)
    )


def _level_args_ok(src, si, dst, di, rest) -> bool:
    return _byte_row(src) and _byte_row(dst) and all(isinstance(a, types.Integer) for a in (si, di, *rest))


@intrinsic
def _level_bytes32(typingctx, src, si, dst, di, t1, t2, t3, t4, t5, t6, t7, flip, zero):
    """``dst[di + k] = _level_code(src[si + k], ...)`` for k < 32, as one vector (portable LLVM vector IR)."""
    if not _level_args_ok(src, si, dst, di, (t1, t2, t3, t4, t5, t6, t7, flip, zero)):
        return None

    def codegen(context, builder, sig, args):
        x = _byte_vector(context, builder, sig.args[0], args[0], args[1], 32)
        codes = _levels_of(builder, x, args[4:11], args[11], args[12])
        _store_bytes(context, builder, sig.args[2], args[2], args[3], codes)
        return context.get_dummy_value()

    return types.none(src, si, dst, di, t1, t2, t3, t4, t5, t6, t7, flip, zero), codegen


def _threshold_lanes(context, builder, arr_type, arr, at, lanes: int):
    """The seven thresholds ``arr.flat[at:at + 7]`` (a C-contiguous byte array), each minus one in every lane
    of its own ``lanes``-byte vector: one 8-byte load, one subtraction, and a lane splat each (a byte shuffle
    on x86) instead of seven scalar loads and broadcasts."""
    a = context.make_array(arr_type)(context, builder, arr)
    ptr = builder.gep(a.data, [_int_width(builder, at, 64)])
    v8 = ir.VectorType(ir.IntType(8), 8)
    t = builder.load(builder.bitcast(ptr, v8.as_pointer()), align=1)
    t = builder.sub(t, ir.Constant(v8, [1] * 8))
    return [
        builder.shuffle_vector(
            t, ir.Constant(v8, None), ir.Constant(ir.VectorType(ir.IntType(32), lanes), [k] * lanes)
        )
        for k in range(7)
    ]


@intrinsic
def _level_bytes64(typingctx, src, si, dst, di, thr, ti, flip, zero):
    """``dst[di + k] = _level_code(src[si + k], t1..t7, flip, zero)`` for k < 64, the thresholds read from
    ``thr.flat[ti:ti + 7]`` (``_threshold_lanes``, shared by the two 32-byte vectors; portable LLVM vector IR)."""
    if not (
        _level_args_ok(src, si, dst, di, (ti, flip, zero))
        and isinstance(thr, types.Array)
        and thr.dtype == types.uint8
        and thr.layout == "C"
    ):
        return None

    def codegen(context, builder, sig, args):
        below = _threshold_lanes(context, builder, sig.args[4], args[4], args[5], 32)
        si, di = _int_width(builder, args[1], 64), _int_width(builder, args[3], 64)
        for half in (0, 32):
            at = ir.Constant(ir.IntType(64), half)
            x = _byte_vector(context, builder, sig.args[0], args[0], builder.add(si, at), 32)
            codes = _levels_of(builder, x, below, args[6], args[7])
            _store_bytes(context, builder, sig.args[2], args[2], builder.add(di, at), codes)
        return context.get_dummy_value()

    return types.none(src, si, dst, di, thr, ti, flip, zero), codegen


@intrinsic
def _pack_nibbles32(typingctx, src, si, dst, di):
    """The 16 int4 pair bytes of 32 codes (0..15): ``dst[di + k] = src[si + 2k] | src[si + 2k + 1] << 4``, each
    pair joined in a 16-bit lane and narrowed (portable LLVM vector IR; LLVM's vectoriser packs 8 at a time)."""
    if not (
        _byte_row(src) and _byte_row(dst) and isinstance(si, types.Integer) and isinstance(di, types.Integer)
    ):
        return None

    def codegen(context, builder, sig, args):
        c = _byte_vector(context, builder, sig.args[0], args[0], args[1], 32)
        _store_bytes(context, builder, sig.args[2], args[2], args[3], _join_nibbles(builder, c))
        return context.get_dummy_value()

    return types.none(src, si, dst, di), codegen


def _join_nibbles(builder, c):
    """32 codes (0..15, an i8 vector) -> their 16 pair bytes ``c[2k] | c[2k + 1] << 4``: each pair joined in a
    16-bit lane and narrowed."""
    pairs = builder.bitcast(c, ir.VectorType(ir.IntType(16), 16))  # even code low, odd code high
    odd = builder.and_(
        builder.lshr(pairs, ir.Constant(pairs.type, [4] * 16)), ir.Constant(pairs.type, [0xF0] * 16)
    )
    return builder.trunc(builder.or_(pairs, odd), ir.VectorType(ir.IntType(8), 16))


@intrinsic
def _level_code(typingctx, v, t1, t2, t3, t4, t5, t6, t7, flip, zero):
    """Symmetric integer code of e4m3 byte ``v`` from its group's level thresholds (``t_i``: the first magnitude
    byte whose level ``rint(|w| / s)`` is >= i; 127 for a level out of reach): the level ``n`` counts the
    thresholds ``v & 0x7F`` reaches, and the code is ``zero + n``, or ``zero - n`` when ``v``'s sign bit xor
    ``flip`` is set (a level 0 is ``zero`` either way, as ``rint(-0.0)``). 8-bit ops only: every argument is an
    integer, cut to its low byte. ``_level_bytes32`` does the same to 32 bytes at once."""
    if not all(isinstance(a, types.Integer) for a in (v, t1, t2, t3, t4, t5, t6, t7, flip, zero)):
        return None

    def codegen(context, builder, sig, args):
        args = [_int_width(builder, a, 8) for a in args]
        return _levels_of(builder, args[0], args[1:8], args[8], args[9])

    return types.uint8(v, t1, t2, t3, t4, t5, t6, t7, flip, zero), codegen


# ------------------------------------------------------------------------------------------- shared pieces
# Indexing discipline (speed only, never semantics): numba wraps negative indices, which turns a load at a
# computed index such as ``i0 + k`` into a gather and stops vectorisation, and a slice taken inside a loop
# costs atomic refcount updates. So a row is reshaped once into a 2-D ``[group, k]`` view and the hot loops
# index it with ``range()`` induction variables only, which LLVM proves non-negative. Small helpers are
# inlined at numba IR level (``inline="always"``) so literal arguments specialise them.
@inline
def _sym_scale(amax_bits, qmax):
    # s = max(amax / qmax, 1e-8): one float32 true division (reference._symmetric_scales).
    s = _bits_f32(amax_bits) / qmax
    return s if s > _FLOOR else _FLOOR


@inline
def _q(x, s, lo, hi):
    """clip(rint(x / s), lo, hi). |x / s| <= qmax + 1 always (s >= amax / qmax up to one rounding), so the
    int32 conversion before the clip is exact and equals the reference's float clip."""
    v = np.int32(np.rint(x / s))
    return min(max(v, lo), hi)


_L8, _L4, _L2, _L3 = np.int32(-128), np.int32(-8), np.int32(-2), np.int32(-4)
_H8, _H4, _H2, _H3 = np.int32(127), np.int32(7), np.int32(1), np.int32(3)
_LSB8 = np.uint64(0x0101010101010101)
_GATHER8 = np.uint64(0x0102040810204080)  # (x * this) >> 56 moves bit 8k of x to bit k, without carries
_U2, _U56 = np.uint64(2), np.uint64(56)


@inline
def _pack_quad(p):
    """Bits 0-1 of the four bytes of ``p`` (uint32, little endian) at shifts 0, 2, 4, 6."""
    return np.uint8((p & 3) | ((p >> 6) & 0xC) | ((p >> 12) & 0x30) | ((p >> 18) & 0xC0))


# ------------------------------------------------------------------------------------------ half decode
_F16_EXP = np.uint32(0x7C00 << 13)  # a half's exponent field, shifted to float32's
_F16_REBIAS = np.uint32((127 - 15) << 23)
_TWO_M14 = F32(2.0**-14)  # the smallest normal half


@inline
def _f16_f32(h):
    """IEEE half bits ``h`` (uint16) -> the float32 of the same value, exactly (numpy's ``float16 -> float32``:
    subnormals normalised, inf kept, a NaN's payload shifted into the float32 mantissa, the sign bit kept).
    Branch-free (selects), so the row loop vectorises: exponent and mantissa shifted into place and the
    exponent rebiased by 112; inf / NaN rebiased once more, to 255; a subnormal ``m * 2^-24`` computed as
    ``(2^-14 * (1 + m / 1024)) - 2^-14``, exact (both operands within a factor of two)."""
    u = np.uint32(h)
    o = (u & np.uint32(0x7FFF)) << np.uint32(13)
    e = o & _F16_EXP
    o = o + _F16_REBIAS
    o = o + _F16_REBIAS if e == _F16_EXP else o
    sub = _f32_bits(_bits_f32(o + np.uint32(0x800000)) - _TWO_M14)
    o = sub if e == np.uint32(0) else o
    return _bits_f32(o | ((u & np.uint32(0x8000)) << np.uint32(16)))


@inline
def _half(h):
    """Half bits -> float32 for the encoders: the CPU's conversion where it has one (``_half_f32``, ~2x the
    software decode in the int4 loops), else ``_f16_f32``; equal for every non-NaN half (tested on all 65,536)."""
    if HALF_IN_HARDWARE:
        return _half_f32(h)
    return _f16_f32(h)


# ------------------------------------------------------------------------------------------ e4m3 decode
_E4M3_SUBNORMAL_UNIT = F32(2.0**-9)
_NAN = F32(np.nan)


@inline
def _e4m3(byte):
    """Exact e4m3fn byte -> float32 without a table gather (vectorises, and never feeds a subnormal float
    to the FPU). Equal to ``E4M3_TO_F32`` for all 256 bytes (tested)."""
    b = np.int32(byte)
    mag = b & 0x7F
    if mag < 8:  # zero and subnormals: m * 2^-9 (exact)
        v = np.float32(mag) * _E4M3_SUBNORMAL_UNIT
    else:  # exponent field e -> e + 120 (bias 7 -> 127), mantissa bits 3 -> 23
        v = _bits_f32((mag << 20) + (120 << 23))
    if mag == 0x7F:  # 0x7F / 0xFF: NaN (e4m3fn has no infinities)
        v = _NAN
    return _bits_f32(_f32_bits(v) | np.uint32((b & 0x80) << 24))


_TWO120 = F32(2.0**120)


@inline
def _e4m3_finite(byte):
    """``_e4m3`` for a byte known not to be NaN (its row's or block's byte amax checked first): the magnitude
    bits placed at float32's exponent / mantissa (``mag << 20``, a float32 of exponent ``e - 127``) times
    ``2^120`` (exact: rebias 127 -> 7; the subnormal bytes are float32 subnormals ``m * 2^-129``, scaled to
    ``m * 2^-9`` exactly), then the sign bit: one multiply, no select (1.6x ``_e4m3`` in a numba-JIT
    micro-benchmark of the int4 loop; within the noise of the compiled-ahead A/B, bench/README). A NaN byte (0x7F / 0xFF) would decode as +-480, so only behind a NaN check (tested on all 255
    other bytes against ``E4M3_TO_F32``)."""
    b = np.uint32(byte)
    v = _bits_f32((b & np.uint32(0x7F)) << np.uint32(20)) * _TWO120
    return _bits_f32(_f32_bits(v) | ((b & np.uint32(0x80)) << np.uint32(24)))


@inline
def _dequant_fp8_row(q, srow, bc, out):
    """out[c] = f32(e4m3(q[c])) * srow[c // bc]: one float32 multiply (reference.dequant_fp8_block)."""
    n = q.size
    full = n // bc
    qb = q[: full * bc].reshape((full, bc))
    ob = out[: full * bc].reshape((full, bc))
    for cb in range(full):
        sv = srow[cb]
        for k in range(bc):
            ob[cb, k] = _e4m3(qb[cb, k]) * sv
    if n > full * bc:
        sv = srow[full]
        qr = q[full * bc :]
        orow = out[full * bc :]
        for k in range(qr.size):
            orow[k] = _e4m3(qr[k]) * sv
