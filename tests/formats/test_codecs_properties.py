"""Property tests: the numba kernels are byte-identical to the numpy reference, the fused BF16/F16/FP8 paths equal
dequant-then-encode, round trips stay within each format's error bound, NaN/inf input is refused naming the
tensor, and every encoder's output has exactly the registry's byte counts. The cases of the first, NaN/inf and
byte-count tests are generated from the registry (``codec_cases.py``: every writable format x every source kind),
so a format is tested the moment it is registered (``test_toy_format.py``)."""

from __future__ import annotations

import threading

import ml_dtypes
import numba
import numpy as np
import pytest
from codec_cases import (
    SOURCES,
    assert_same,
    case_id,
    check_fast_paths,
    codec_cases,
    fp8_tensors,
    weights,
    width_step,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colitools.formats import kernels, planar
from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError
from colitools.formats.registry import GROUP_SIZES, by_name, writer_group_size

F32 = np.float32
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _always_the_kernels(monkeypatch, kernel_drivers):
    """These tests are about the numba kernels, compiled ahead of time and JIT (each test runs on both): no
    small-tensor shortcut to the reference (test_kernel_dispatch)."""
    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)


def reference_encode(fmt: str, w: np.ndarray, gs: int | None):
    return ref.encode_int4_grouped(w, gs) if fmt == "int4-grouped" else kernels._reference_encode(fmt, w, gs)


INT_FORMATS = [("int8-row", None), ("int4-row", None), ("int2-row", None), ("int3-g64", None)]
INT_FORMATS += [("int4-grouped", g) for g in (*GROUP_SIZES, 2, 6, 5, 7)]  # any gs, odd ones included


# ------------------------------------------------------------------- fast == reference, from every source
PATH_CASES = [(source, fmt, gs) for source in SOURCES for fmt, gs in codec_cases(source)]


@pytest.mark.parametrize(
    ("source", "fmt", "gs"), PATH_CASES, ids=[f"{s}-{case_id(f, g)}" for s, f, g in PATH_CASES]
)
@SETTINGS
@given(data=st.data())
def test_every_writable_format_from_every_source_equals_the_reference(source, fmt, gs, data):
    """F32 (``kernels.encode`` and the registry's fast path), BF16 and F16 (the fused upcast, raw bits and numpy
    dtype), block-scaled FP8 (the fused dequant, F32 or BF16 grids): the reference's bytes of the exact values.
    A format without a row kernel gets its reference on every path (``_dispatch._no_row_kernel``)."""
    check_fast_paths(data, source, fmt, gs)


@pytest.mark.parametrize("gs", [64, 16], ids=["g64", "g16"])
@SETTINGS
@given(w=weights(max_I=200))
def test_registry_fast_and_reference_paths_agree(gs, w):
    for fmt in ("int8-row", "int4-row", "int2-row", "int3-g64", "int4-grouped"):
        assert_same(registry_encode(fmt, gs, w, "t", True), registry_encode(fmt, gs, w, "t", False))


# ------------------------------------------------------------------------------------------- fused sources
@pytest.mark.parametrize("decode", ["_f16_f32", "_half"])
def test_f16_upcast_equals_numpy_for_all_half_bit_patterns(decode):
    """``_f16_f32`` (the software decode) is numpy's cast bit for bit on all 65,536 halves, NaN payloads
    included; ``_half`` (the CPU's conversion where it has one, which the F16 encoders use) on every half but
    the NaNs, which stay NaN (the encoders refuse them)."""
    from colitools.formats.kernels import _jit_bits

    fn = getattr(_jit_bits, decode)

    @numba.njit
    def upcast(h, out):
        for i in range(h.size):
            out[i] = fn(h[i])

    h = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(h.size, F32)
    upcast(h, out)
    want = h.view(np.float16).astype(F32)  # numpy's cast: subnormals, -0.0, inf and NaN payloads
    nan = np.isnan(want)
    assert nan.sum() == 2 * 1023
    exact = ~nan if decode == "_half" else np.ones(h.size, bool)
    assert out.view(np.uint32)[exact].tolist() == want.view(np.uint32)[exact].tolist()
    assert np.isnan(out[nan]).all()


def test_e4m3_finite_decode_equals_the_table_for_every_non_nan_byte():
    from colitools.formats.kernels._jit_bits import E4M3_TO_F32, _e4m3_finite

    @numba.njit
    def decode(b, out):
        for i in range(b.size):
            out[i] = _e4m3_finite(b[i])

    b = np.array([x for x in range(256) if x & 0x7F != 0x7F], np.uint8)
    out = np.empty(b.size, F32)
    decode(b, out)
    assert b.size == 254
    assert out.view(np.uint32).tolist() == E4M3_TO_F32[b].view(np.uint32).tolist()  # -0.0 and subnormals too


@pytest.mark.parametrize("bits", [0x7E00, 0xFC00, 0x7C00, 0x7C01], ids=["nan", "-inf", "inf", "snan"])
def test_f16_fused_path_refuses_non_finite(bits):
    h = np.full((3, 70), 0x3C00, np.uint16)  # 1.0
    h[2, 65] = bits
    with pytest.raises(EncodeError, match=r"tensor experts\.7\.up_proj: non-finite value .* at \[2, 65\]"):
        kernels.encode_from_f16("int4-grouped", h, 64, name="experts.7.up_proj")


@st.composite
def fp8_checkpoint_tensors(draw, multiple: int):
    """FP8 as checkpoints ship it, over several source blocks of 128-multiple sides (the kernels that read a
    block's bytes only: int3-g64 groups and mxfp4 blocks by byte thresholds, fp8-e4m3-e8m0 by a byte table):
    Gaussian or heavy-tailed weights quantised per block (``q = e4m3(w / s)``, ``s = amax / 448``), some
    blocks all zero or holding exact E2M1 ties, and scales that push the E8M0 / mxfp4 exponents to their
    clamps (float32 subnormal, 2^-130) or near overflow."""
    O = draw(st.integers(1, 300))
    I = draw(st.integers(1, 520 // multiple)) * multiple
    block = draw(st.sampled_from([(128, 128), (256, 128), (128, 256), (32, 128)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["gauss", "heavy", "ties"]))
    if kind == "ties":  # e4m3 bytes of 0.5-multiples: exact E2M1 values and midpoints at many exponents
        q = rng.choice(
            np.array([0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C, 0x50, 0x54, 0x58], np.uint8), (O, I)
        )
        q |= rng.choice(np.array([0, 0x80], np.uint8), (O, I))
    else:
        w = rng.standard_normal((O, I)) if kind == "gauss" else rng.standard_t(2, (O, I))
        q = np.clip(w / np.abs(w).max() * 448, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    q[rng.random((O, I)) < 0.05] = 0
    grid = (ref.ceil_div(O, block[0]), ref.ceil_div(I, block[1]))
    mag = draw(st.sampled_from([0.02 / 448, 1.0, 1e-42, 2.0**-130, 2.0**-140, 1e36]))
    s = (rng.random(grid) + 0.5) * mag
    s[rng.random(grid) < 0.2] *= -1
    s[rng.random(grid) < 0.1] = 0
    return np.ascontiguousarray(q), s.astype(F32), block


@pytest.mark.parametrize("fmt", ["int3-g64", "int4-grouped", "int8-row", "mxfp4", "fp8-e4m3-e8m0"])
@SETTINGS
@given(data=st.data())
def test_fp8_block_kernels_equal_dequant_then_reference_on_checkpoint_like_tensors(fmt, data):
    q, s, block = data.draw(
        fp8_checkpoint_tensors(multiple=64 if fmt in ("int3-g64", "int4-grouped") else 32)
    )
    with np.errstate(over="ignore"):  # 448 * 1.5e36 overflows float32: both paths refuse it
        w = ref.dequant_fp8_block(q, s, block)
    if fmt == "fp8-e4m3-e8m0":
        fast = lambda: kernels.encode_from_fp8_e8m0(q, s, block, name="t")  # noqa: E731
        expected = ref.encode_fp8_e8m0 if np.isfinite(w).all() else None
    else:
        gs = 64 if fmt == "int4-grouped" else None
        fast = lambda: kernels.encode_from_fp8_block(fmt, q, s, block, gs, name="t")  # noqa: E731
        expected = (lambda w: reference_encode(fmt, w, gs)) if np.isfinite(w).all() else None
    if expected is None:
        with pytest.raises(EncodeError, match="non-finite value"):
            fast()
        return
    assert_same(fast(), expected(w))


@pytest.mark.parametrize(
    ("fmt", "gs"), [("int4-grouped", 64), ("int3-g64", None), ("int4-grouped", 32)], ids=str
)
def test_fp8_int_codes_by_thresholds_equal_the_reference_for_every_amax_byte_and_tie(fmt, gs):
    """The FP8 int4 / int3 kernels find each code by comparing the byte with thresholds per group amax byte,
    from a table, deciding only the bytes whose exact level ratio is a half-integer (ties) by the per-element
    rule (``_jit_encoders``). Every amax byte ``m`` (1..126), each of its groups holding every byte 0..m with
    random signs, times 48 per-row scales spread over 2^-40..2^40, negative ones included: a tie decided
    wrongly, or a table entry off by one, changes a code."""
    rng = np.random.default_rng(7)
    rows, cols = [], 128
    for m in range(1, 127):
        for _ in range(48):
            row = np.concatenate([np.arange(m + 1), rng.integers(0, m + 1, cols - m - 1)]).astype(np.uint8)
            row = rng.permutation(row) | (rng.integers(0, 2, cols).astype(np.uint8) << 7)
            rows.append(row)
    q = np.ascontiguousarray(np.stack(rows))
    s = (rng.random((q.shape[0], 1)) + 0.5) * 2.0 ** rng.integers(-40, 41, (q.shape[0], 1))
    s[rng.random(s.shape) < 0.3] *= -1
    s = s.astype(F32)
    expected = reference_encode(fmt, ref.dequant_fp8_block(q, s, (1, 128)), gs)
    assert_same(kernels.encode_from_fp8_block(fmt, q, s, (1, 128), gs, name="t"), expected)


def test_fp8_mxfp4_block_exponents_equal_the_reference_near_every_amax_byte():
    """The FP8 mxfp4 kernel decides a block's exponent from its amax byte (made once per scale block and amax
    byte), lets e1 = e0 + 1 compete only when the amax is above 7 * 2^e0, and compares the two by per-byte
    error differences from a table, falling back to the float64 sums when they are too close. Blocks whose
    bytes crowd just below their amax byte (e1 wins often), spread below it, or sit on E2M1 values and
    midpoints with power-of-two scales (the candidates' errors equal: the float64 sums decide), for every
    amax byte, under per-block scales from 2^-40 to 2^40 of both signs: a wrong threshold, table entry or
    rule changes an exponent or a code."""
    rng = np.random.default_rng(11)
    row_blocks, cols = 16, 512
    O = 128 * row_blocks
    B = O * cols // 32
    m = rng.integers(1, 127, B)
    kind = rng.integers(0, 3, B)
    lows = np.where(kind == 0, np.maximum(m - 12, 0), 0)
    q = (lows[:, None] + rng.random((B, 32)) * (m - lows + 1)[:, None]).astype(np.uint8)
    ties = np.array([0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C, 0x50, 0x54, 0x58, 0x5C, 0x60], np.uint8)
    tied = kind == 2
    q[tied] = np.minimum(rng.choice(ties, (int(tied.sum()), 32)), m[tied, None])
    q[np.arange(B), rng.integers(0, 32, B)] = m  # every block holds its amax byte
    q = (q | (rng.integers(0, 2, (B, 32)) << 7).astype(np.uint8)).reshape(O, cols)
    s = (rng.random((row_blocks, cols // 128)) + 0.5) * 2.0 ** rng.integers(-40, 41, (row_blocks, cols // 128))
    s[::2] = 2.0 ** rng.integers(-40, 41, s[::2].shape)  # power-of-two scales: exact ties
    s[rng.random(s.shape) < 0.3] *= -1
    s = s.astype(F32)
    expected = ref.encode_mxfp4(ref.dequant_fp8_block(q, s, (128, 128)))
    assert_same(kernels.encode_from_fp8_block("mxfp4", q, s, (128, 128), None, name="t"), expected)


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_fp8_kernels_read_sources_at_any_byte_address(offset):
    """A source tensor sits at any offset of its file (safetensors data offsets are not aligned): the FP8
    kernels that read a row's bytes as 32-byte vectors or 32-bit words give the reference's bytes from every
    address."""
    rng = np.random.default_rng(offset)
    w = rng.standard_normal((256, 512))
    q = np.clip(w / np.abs(w).max() * 448, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    s = (rng.random((2, 4)) + 0.5).astype(F32) * F32(0.02 / 448)
    buf = bytearray(q.nbytes + offset)
    src = np.frombuffer(buf, np.uint8, q.size, offset).reshape(q.shape)
    src[...] = q
    assert src.ctypes.data % 4 == offset % 4
    ref_w = ref.dequant_fp8_block(q, s, (128, 128))
    for fmt, gs in [("int4-grouped", 64), ("int3-g64", None), ("int8-row", None), ("mxfp4", None)]:
        assert_same(
            kernels.encode_from_fp8_block(fmt, src, s, (128, 128), gs), reference_encode(fmt, ref_w, gs)
        )
    assert_same(kernels.encode_from_fp8_e8m0(src, s, (128, 128)), ref.encode_fp8_e8m0(ref_w))


@st.composite
def fp8_e8m0_sources(draw):
    """FP8 codes (every byte but NaN) and a scale grid of 128-multiple blocks, over several output blocks."""
    O, I = draw(st.integers(1, 300)), draw(st.integers(1, 300))
    block = draw(st.sampled_from([(128, 128), (256, 128), (128, 256), (2, 3)]))  # (2, 3): the unfused path
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.integers(0, 256, size=(O, I), dtype=np.uint16).astype(np.uint8)
    q[(q & 0x7F) == 0x7F] = 0xB8  # no NaN codes here (below)
    if draw(st.booleans()):
        q[rng.random((O, I)) < 0.7] = 0  # zero and near-zero blocks (the 1e-4 amax floor)
    grid = (ref.ceil_div(O, block[0]), ref.ceil_div(I, block[1]))
    s = rng.random(grid) * draw(st.sampled_from([1.0, 1e-3, 1e-30, 1e-42, 1e30, 2.0**-9]))
    s[rng.random(grid) < 0.2] *= -1
    s[rng.random(grid) < 0.1] = 0
    return q, s.astype(F32), block


@SETTINGS
@given(src=fp8_e8m0_sources())
def test_fp8_e8m0_fused_path_equals_dequant_then_reference(src):
    q, s, block = src
    with np.errstate(over="ignore"):  # 448 * 1e30 overflows: refused by both paths (below)
        w = ref.dequant_fp8_block(q, s, block)
    if not np.isfinite(w).all():
        with pytest.raises(EncodeError, match="non-finite value"):
            kernels.encode_from_fp8_e8m0(q, s, block, name="t")
        return
    assert_same(kernels.encode_from_fp8_e8m0(q, s, block), ref.encode_fp8_e8m0(w))
    assert_same(
        kernels.encode_from_fp8_e8m0(q.view(ml_dtypes.float8_e4m3fn), s, block), ref.encode_fp8_e8m0(w)
    )


@pytest.mark.parametrize("case", ["nan-byte", "inf-scale", "nan-scale", "overflow"])
def test_fp8_e8m0_fused_path_refuses_non_finite_as_the_unfused_one(case):
    q = np.full((300, 260), 0x38, np.uint8)  # 1.0
    s = np.ones((3, 3), F32)
    if case == "nan-byte":
        q[290, 150] = 0xFF
    elif case == "inf-scale":
        s[2, 1] = np.inf
    elif case == "nan-scale":
        s[2, 1] = np.nan
    else:
        q[290, 150], s[2, 1] = 0x7E, 1e38  # 448 * 1e38 overflows float32
    with np.errstate(all="ignore"):
        w = ref.dequant_fp8_block(q, s, (128, 128))
    with pytest.raises(EncodeError) as unfused:
        kernels.encode_fp8_e8m0(w, name="experts.7.up_proj")
    with pytest.raises(EncodeError) as fused:
        kernels.encode_from_fp8_e8m0(q, s, 128, name="experts.7.up_proj")
    assert str(fused.value) == str(unfused.value) and "tensor experts.7.up_proj: non-finite" in str(
        fused.value
    )


def test_e4m3_arithmetic_decode_equals_ml_dtypes_table_for_all_bytes():
    q = np.arange(256, dtype=np.uint8).reshape(1, 256)
    out = kernels.dequant_fp8_block(q, np.ones((1, 1), F32), (1, 256))[0]
    table = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)
    nan = np.isnan(table)
    assert np.flatnonzero(nan).tolist() == [0x7F, 0xFF]
    assert np.array_equal(np.isnan(out), nan)
    assert out[~nan].view(np.uint32).tolist() == table[~nan].view(np.uint32).tolist()  # -0.0 included
    assert table[0x7E] == 448


@SETTINGS
@given(data=st.data())
def test_fast_fp8_dequant_matches_reference(data):
    q, s, block = data.draw(fp8_tensors())
    q[0, 0] = 0x7F  # NaN passes through dequant unchanged
    a, b = kernels.dequant_fp8_block(q, s, block), ref.dequant_fp8_block(q, s, block)
    assert a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------------------- round-trip bounds
QMAX = {"int8-row": 127, "int4-row": 7, "int2-row": 1, "int3-g64": 3, "int4-grouped": 7}


@pytest.mark.parametrize(("fmt", "gs"), INT_FORMATS[:5] + [("int4-grouped", 32)], ids=str)
@SETTINGS
@given(w=weights())
def test_integer_round_trip_error_is_at_most_half_a_step(fmt, gs, w):
    O, I = w.shape
    codes, scales = kernels.encode(fmt, w, gs)
    out = kernels.decode(fmt, codes, scales, O, I, gs)
    group = {"int3-g64": 64, "int4-grouped": gs}.get(fmt, max(I, 1))
    s = np.repeat(scales.reshape(O, -1).astype(np.float64), group, axis=1)[:, :I]
    err = np.abs(out.astype(np.float64) - w.astype(np.float64))
    # |q s - w| <= s / 2, plus the float32 rounding of w / s (qmax * 2^-24 relative) and of q * s.
    bound = s * (0.5 + QMAX[fmt] * 2.0**-23) + np.abs(w) * 2.0**-23 + 2.0**-149
    assert np.all(err <= bound)


@SETTINGS
@given(w=weights(multiple=32, max_I=320))
def test_mxfp4_round_trip_error_within_the_e2m1_grid_bound(w):
    # Above ~1.7e38 the chosen exponent can be 126 with code 4 (2^128), which the spec's float64 error picks
    # but a float32 decoder cannot represent (inf): a spec corner no real weight reaches, so stay below it.
    w = np.clip(w, -1e38, 1e38)
    O, I = w.shape
    packed, scale = kernels.encode("mxfp4", w, None)
    out = kernels.decode("mxfp4", packed, scale, O, I).astype(np.float64)
    p = np.repeat(np.ldexp(1.0, scale.astype(np.int32) - 127), 32, axis=1)  # 2^e per element
    w64 = w.astype(np.float64)
    err = np.abs(out - w64)
    inside = np.abs(w64) <= 6 * p
    # On the grid {0, .5, 1, 1.5, 2, 3, 4, 6} * 2^e the largest gap is 2 (4..6): error <= 2^e. Beyond 6 * 2^e
    # a value saturates to 6 * 2^e (it is below 8 * 2^e). All-zero blocks (scale byte 0) decode exactly.
    assert np.all(err[inside] <= p[inside] * (1 + 2.0**-20))
    assert np.all((out == np.sign(w64) * 6 * p)[~inside])
    assert np.all(np.abs(w64[~inside]) < 8 * p[~inside])


# ------------------------------------------------------------------------------------------------ NaN / inf
BAD_VALUES = [np.nan, np.inf, -np.inf]
ALL_FORMATS = codec_cases("f32", group_sizes=(16,))  # every writable format, one group size


@pytest.mark.parametrize(("fmt", "gs"), ALL_FORMATS, ids=[f for f, _ in ALL_FORMATS])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_non_finite_input_raises_naming_the_tensor_on_both_paths(fmt, gs, data):
    O = data.draw(st.integers(1, 4))
    step = width_step(fmt, gs)  # mxfp4: I % 32 == 0; an affine format: I % gs == 0
    I = data.draw(st.integers(1, 5 if step > 1 else 150)) * step
    w = np.ones((O, I), F32)
    o, i = data.draw(st.integers(0, O - 1)), data.draw(st.integers(0, I - 1))
    w[o, i] = data.draw(st.sampled_from(BAD_VALUES))
    if data.draw(st.booleans()):  # a later bad value too: the message names the first one
        w[O - 1, I - 1] = np.nan
    messages = []
    for fast in (False, True):
        with pytest.raises(EncodeError) as exc:
            registry_encode(fmt, gs, w, "model.layers.3.mlp.w", fast)
        messages.append(str(exc.value))
    assert messages[0] == messages[1]
    assert "model.layers.3.mlp.w" in messages[1] and f"[{o}, {i}]" in messages[1]


def registry_encode(fmt: str, gs: int | None, w: np.ndarray, name: str, fast: bool):
    """Encode through the registry; int4-grouped with the writer rule's group size (int4-row if I <= gs)."""
    if fmt == "int4-grouped":
        g = writer_group_size(w.shape[1], gs)
        return by_name("int4-row" if g is None else fmt).encode(w, g, name=name, fast=fast)
    return by_name(fmt).encode(w, gs, name=name, fast=fast)


@pytest.mark.parametrize("bits", [0x7FC0, 0xFF80, 0x7F80, 0x7F81], ids=["nan", "-inf", "inf", "snan"])
def test_bf16_fused_path_refuses_non_finite(bits):
    b = np.full((3, 70), 0x3F80, np.uint16)  # 1.0
    b[2, 65] = bits
    with pytest.raises(EncodeError, match=r"tensor experts\.7\.up_proj: non-finite value .* at \[2, 65\]"):
        kernels.encode_from_bf16("int4-grouped", b, 64, name="experts.7.up_proj")


@pytest.mark.parametrize("case", ["nan-byte", "inf-scale", "nan-scale", "overflow"])
def test_fp8_fused_path_refuses_non_finite(case):
    q = np.full((130, 200), 0x38, np.uint8)  # 1.0
    s = np.ones((2, 2), F32)
    if case == "nan-byte":
        q[129, 150] = 0xFF
        where = "[129, 150]"
    elif case == "inf-scale":
        s[1, 0] = np.inf
        where = "[128, 0]"
    elif case == "nan-scale":
        s[0, 1] = np.nan
        where = "[0, 128]"
    else:  # 448 * 1e37 overflows float32 -> inf
        q[5, 7] = 0x7E
        s[0, 0] = 1e37
        where = "[5, 7]"
    for fmt, gs in [("int4-grouped", 64), ("int8-row", None), ("int3-g64", None)]:
        with pytest.raises(
            EncodeError, match=r"tensor blk\.0\.w:.*at " + where.replace("[", r"\[").replace("]", r"\]")
        ):
            kernels.encode_from_fp8_block(fmt, q, s, 128, gs, name="blk.0.w")


# -------------------------------------------------------------------------------------------- byte counts
SIZE_FORMATS = ALL_FORMATS + [(f, g) for f, g in codec_cases("f32", group_sizes=(64,)) if g is not None]


@pytest.mark.parametrize(("fmt", "gs"), SIZE_FORMATS, ids=str)
@settings(max_examples=25, deadline=None)
@given(O=st.integers(1, 9), I=st.integers(1, 400))
def test_output_sizes_match_the_registry_byte_table(fmt, gs, O, I):
    step = width_step(fmt, gs)
    I = step * ref.ceil_div(I, step)
    w = np.linspace(-1, 1, O * I, dtype=F32).reshape(O, I)
    F = by_name(fmt)
    for codes, scales in (kernels.encode(fmt, w, gs), reference_encode(fmt, w, gs)):
        assert codes.dtype == np.uint8
        assert codes.nbytes == F.weight_nbytes(O, I, gs)
        assert codes.shape == F.weight_shape(O, I, gs)
        assert scales.nbytes == F.scale_nbytes(O, I, gs)
        assert scales.shape == F.scale_shape(O, I, gs)
        assert scales.dtype == F.scale_numpy


# ---------------------------------------------------------------------------------------- decoders, planar
DECODE_FORMATS = [("int8-row", None), ("int4-row", None), ("int2-row", None), ("int3-g64", None)]
DECODE_FORMATS += [("int4-grouped", 64), ("int4-grouped", 48), ("mxfp4", None)]


@pytest.mark.parametrize(("fmt", "gs"), DECODE_FORMATS, ids=str)
@settings(max_examples=20, deadline=None)
@given(O=st.integers(1, 5), I=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_fast_decoders_match_reference_on_arbitrary_codes(fmt, gs, O, I, seed):
    if fmt == "mxfp4":
        I = 32 * ref.ceil_div(I, 32)
    F = by_name(fmt)
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=F.weight_shape(O, I, gs), dtype=np.uint16).astype(np.uint8)
    if fmt == "mxfp4":
        scales = rng.integers(0, 255, size=F.scale_shape(O, I), dtype=np.uint16).astype(np.uint8)
    else:
        scales = (rng.standard_normal(F.scale_shape(O, I, gs)) * 10.0 ** rng.integers(-40, 30)).astype(F32)
    with np.errstate(all="ignore"):
        expected = F.decode(codes, scales, O, I, gs)
    assert kernels.decode(fmt, codes, scales, O, I, gs).tobytes() == expected.tobytes()


@settings(max_examples=20, deadline=None)
@given(O=st.integers(1, 5), blocks=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_fast_planar_reorder_matches_reference_and_round_trips(O, blocks, seed):
    codes = (
        np.random.default_rng(seed).integers(0, 256, size=(O, 32 * blocks), dtype=np.uint16).astype(np.uint8)
    )
    p = kernels.pairs_to_planar(codes)
    assert p.tobytes() == planar.pairs_to_planar(codes).tobytes()
    assert kernels.planar_to_pairs(p).tobytes() == codes.tobytes()
    assert kernels.planar_to_pairs(codes).tobytes() == planar.planar_to_pairs(codes).tobytes()


# ------------------------------------------------------------------------------------------------ threading
def test_threaded_chunks_are_byte_identical_to_one_thread_and_reference():
    # 300 x 1120 = 336k elements: above the size where the kernels fan out over the thread pool.
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((300, 1120)) * 0.02).astype(F32)
    w[17] = 0
    expected = ref.encode_int4_grouped(w, 64)
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            kernels.set_threads(threads)
            assert_same(kernels.encode("int4-grouped", w, 64), expected)
            assert_same(
                kernels.encode_from_bf16("mxfp4", w.astype(ml_dtypes.bfloat16), None),
                ref.encode_mxfp4(w.astype(ml_dtypes.bfloat16).astype(F32)),
            )
            w_bad = w.copy()
            w_bad[250, 3] = np.inf
            with pytest.raises(EncodeError, match=r"at \[250, 3\]"):
                kernels.encode("int8-row", w_bad, None, name="t")
    finally:
        kernels.set_threads(None)


def test_fp8_mxfp4_with_many_block_exponents_in_one_scale_block_matches_reference():
    # One 128x128 scale block whose 32-blocks peak at 1.75 x 2^k for 14 octaves k (the two exponents compete in
    # every block): 14 exponents' thresholds and error tables in one scale column, interleaved from row to row.
    rng = np.random.default_rng(5)
    q = rng.integers(0, 0x70, size=(128, 128), dtype=np.uint8) | rng.choice(
        np.array([0, 0x80], np.uint8), (128, 128)
    )
    peaks = np.array([0x7E - 8 * k for k in range(14)], np.uint8)  # e4m3 1.75 x 2^(8 - k)
    blocks = q.reshape(128, 4, 32)
    for o in range(128):
        for b in range(4):
            top = peaks[(o + 3 * b) % 14]
            blocks[o, b] = np.minimum(blocks[o, b] & 0x7F, top) | (blocks[o, b] & 0x80)
            blocks[o, b, rng.integers(0, 32)] = top
    for sv in (1.0, -1.1, 2.0**-120):  # amax / 2^e0 = 7, 7.7, 7 > 6: both exponents compete
        s = np.full((1, 1), sv, F32)
        expected = ref.encode_mxfp4(ref.dequant_fp8_block(q, s, (128, 128)))
        assert_same(kernels.encode_from_fp8_block("mxfp4", q, s, 128, None), expected)


def test_threaded_fp8_chunks_are_byte_identical_to_one_thread_and_reference():
    # 300 x 1152 FP8 with 128x128 scales: the row chunks of 2 threads start inside a scale block (the mxfp4
    # kernel's per-(scale block, exponent) thresholds are remade per chunk).
    rng = np.random.default_rng(11)
    q = (
        (rng.standard_normal((300, 1152)) * 100)
        .clip(-448, 448)
        .astype(ml_dtypes.float8_e4m3fn)
        .view(np.uint8)
    )
    s = (rng.random((3, 9)) * 1e-3 + 1e-4).astype(F32)
    w = ref.dequant_fp8_block(q, s, (128, 128))
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            kernels.set_threads(threads)
            for fmt in ("mxfp4", "int3-g64"):
                assert_same(
                    kernels.encode_from_fp8_block(fmt, q, s, 128, None), reference_encode(fmt, w, None)
                )
            assert_same(kernels.encode_from_fp8_e8m0(q, s, 128), ref.encode_fp8_e8m0(w))
    finally:
        kernels.set_threads(None)


def test_concurrent_callers_get_identical_results():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((256, 1536)) * 0.5).astype(F32)
    expected = ref.encode_int3_g64(w)
    results: list = []

    def work():
        results.append(kernels.encode("int3-g64", w, None))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    for r in results:
        assert_same(r, expected)
