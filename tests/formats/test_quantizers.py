"""``--quantizer mse`` (FORMATS §9): an error-minimising scale per group, the same bytes per weight.

Pinned here against an independent scalar statement of §9 written in plain Python (``spec_group`` below: one
element at a time, no numpy vector code), against hand-computed bytes, and by the contract's properties: the
codes are ``clip(rint(w / s))`` of the written scale, never a larger squared error than rtn group by group,
positive scales where the target reads no negative ones, the kernel byte-identical to the numpy reference on
any thread count and from every source dtype the converter encodes from."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colitools.formats import kernels, quantizers
from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError
from colitools.formats.kernels import mse as mse_kernel
from colitools.formats.registry import FORMATS, by_name, writer_group_size

F32 = np.float32
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MSE_FORMATS = sorted(f.name for f in FORMATS.values() if f.mse_scales)
CODE_RANGE = {"int8-row": (-128, 127), "int4-row": (-8, 7), "int4-grouped": (-8, 7), "int2-row": (-2, 1),
              "int3-g64": (-4, 3)}  # fmt: skip


def f32(x: float) -> float:
    """``x`` rounded to float32 (returned as a Python float, exact; beyond float32's range: inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def rint_clip(y: float, lo: int, hi: int) -> float:
    """``clip(rint(y), lo, hi)``: NaN stays NaN, infinities clip (Python's round() is half to even)."""
    if math.isnan(y):
        return y
    return float(round(min(max(y, lo), hi)))


def lane_sum(values: list[float], rounding) -> float:
    """§9's lane order: lane j sums elements j, j+8, ... in order, then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)),
    every addition rounded by ``rounding``."""
    lanes = [0.0] * 8
    for k, v in enumerate(values):
        lanes[k % 8] = rounding(lanes[k % 8] + v)
    a = [rounding(lanes[i] + lanes[i + 1]) for i in (0, 2, 4, 6)]
    return rounding(rounding(a[0] + a[1]) + rounding(a[2] + a[3]))


def spec_group(w: list[float], lo: int, hi: int, signed: bool) -> tuple[float, list[float]]:
    """FORMATS §11 for one group, element by element (float32 steps rounded explicitly with ``f32``; the refit
    sums as Python integers)."""
    w = w + [0.0] * (-len(w) % 8)
    amax = max(abs(x) for x in w)
    s0 = max(f32(amax / hi), f32(1e-8))
    v0 = [rint_clip(f32(x / s0), lo, hi) for x in w]
    x = next(x for x in w if abs(x) == amax)
    e = math.frexp(amax)[1]
    qw = [round(v * 2.0 ** (quantizers.FIXED_BITS - e)) for v in w]  # exact in float64: a power-of-two product
    best, s_best = -1.0, 0.0
    for d in quantizers.CANDIDATE_OFFSETS:
        if amax == 0:
            break
        t = f32((lo + d) if signed or x < 0 else (hi + d))
        iscale = f32(t / x)
        if not math.isfinite(iscale):
            continue
        codes = [int(rint_clip(f32(v * iscale), lo, hi)) for v in w]
        sx = sum(c * q for c, q in zip(codes, qw, strict=True))
        s2 = sum(c * c for c in codes)
        if s2 > 0 and float(sx) * float(sx) / float(s2) > best:
            best, s_best = float(sx) * float(sx) / float(s2), f32(float(sx) / float(s2) * 2.0 ** (e - quantizers.FIXED_BITS))

    def err(s: float, v: list[float]) -> float:
        return lane_sum([(f32(c * s) - x) ** 2 for c, x in zip(v, w, strict=True)], float)

    if amax > 0 and math.isfinite(s_best) and abs(s_best) >= f32(1e-8):
        v1 = [rint_clip(f32(x / s_best), lo, hi) for x in w]
        if err(s_best, v1) < err(s0, v0):
            return s_best, v1
    return s0, v0


def test_a_hand_computed_group_gets_a_negative_scale_and_its_bytes():
    """w = [1, 0.5, 0.25, 0, 0, 0, 0, 0] at int4: rtn s = float32(1/7) = 0.14285715 (a hair above 1/7) gives
    codes 7, 3 (0.5 / s = 3.4999998), 2 (1.75 -> 2) and squared error (3/7 - 1/2)^2 + (2/7 - 1/4)^2 ~ 0.0064.
    The extreme 1.0 mapped to -8 at
    s = -1/8 gives -8, -4, -2: every value exact, error 0 (the least-squares refit of those codes is -1/8
    exactly): mse writes s = -0.125 and the nibbles 0, 4, 6 (v + 8)."""
    w = np.array([[1.0, 0.5, 0.25, 0, 0, 0, 0, 0]], F32)
    codes, s = ref.encode_int4_row(w, "mse")
    assert s.tolist() == [-0.125]
    assert codes.tobytes() == bytes([0x40, 0x86, 0x88, 0x88])
    rtn_codes, rtn_s = ref.encode_int4_row(w)
    assert rtn_s.tolist() == [F32(1.0) / F32(7)]
    assert rtn_codes.tobytes() == bytes([0xBF, 0x8A, 0x88, 0x88])  # 7+8 | 3+8 << 4, 2+8 | 0+8 << 4, ...
    # positive scales only: the extreme stays at +7 and every candidate keeps the rtn codes' error or worse,
    # except the refit s = (7 + 2 + 0.5) / (49 + 4 + 1)... computed by the independent statement
    s_pos, v_pos = spec_group(w[0].tolist(), -8, 7, signed=False)
    codes_pos, scale_pos = ref.encode_int4_row(w, "mse-positive")
    assert scale_pos.tolist() == [s_pos] and s_pos > 0
    assert ref.unpack_int4_pairs(codes_pos, 1, 8)[0].tolist() == v_pos


@st.composite
def groups(draw) -> tuple[np.ndarray, str]:
    fmt = draw(st.sampled_from(sorted(CODE_RANGE)))  # the symmetric formats (the affine ones: test_affine.py)
    O = draw(st.integers(1, 4))
    I = draw(st.integers(1, 140))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["gauss", "t4", "ties", "huge", "tiny", "zeros"]))
    w = {
        "gauss": lambda: rng.standard_normal((O, I)),
        "t4": lambda: rng.standard_t(4, size=(O, I)),
        "ties": lambda: rng.integers(-16, 17, size=(O, I)) * 0.25,
        "huge": lambda: rng.standard_normal((O, I)) * 1e37,
        "tiny": lambda: rng.standard_normal((O, I)) * 1e-41,
        "zeros": lambda: np.zeros((O, I)),
    }[kind]().astype(F32)
    return w, fmt


@SETTINGS
@given(groups(), st.booleans())
def test_numpy_search_equals_the_scalar_statement_of_the_spec(case, signed):
    w, fmt = case
    lo, hi = CODE_RANGE[fmt]
    s, v = quantizers.mse_scales_codes(w, lo, hi, signed)  # each row one group
    for o in range(w.shape[0]):
        s_spec, v_spec = spec_group(w[o].tolist(), lo, hi, signed)
        assert np.float32(s[o]).tobytes() == np.float32(s_spec).tobytes()
        assert v[o].tolist() == v_spec[: w.shape[1]]


def _groups_of(fmt: str, w: np.ndarray, gs: int | None) -> tuple[np.ndarray, int, int]:
    """``w`` as §9's scale groups ``[N, n]`` of format ``fmt`` (rows, or zero-padded groups of a row)."""
    n = w.shape[1] if fmt in ("int8-row", "int4-row", "int2-row") else gs or ref.INT3_GROUP
    G = -(-w.shape[1] // n)
    padded = np.zeros((w.shape[0], G * n), F32)
    padded[:, : w.shape[1]] = w
    return padded.reshape(-1, n), *CODE_RANGE[fmt]


def _decode(fmt: str, codes, scales, O: int, I: int, gs: int | None) -> np.ndarray:
    return by_name(fmt).decode(codes, scales, O, I, gs)


@SETTINGS
@given(groups(), st.sampled_from(["mse", "mse-positive"]))
def test_written_codes_are_the_rounding_of_the_written_scale_and_never_worse_than_rtn(case, mode):
    w, fmt = case
    O, I = w.shape
    gs = writer_group_size(I, 16) if fmt == "int4-grouped" else None
    fmt = "int4-row" if fmt == "int4-grouped" and gs is None else fmt  # §2.4: one group per row
    codes, scales = by_name(fmt).encode(w, gs, fast=False, quantizer=mode)
    rtn_codes, rtn_scales = by_name(fmt).encode(w, gs, fast=False)
    assert codes.shape == rtn_codes.shape and scales.shape == rtn_scales.shape  # same bytes per weight
    decoded = _decode(fmt, codes, scales, O, I, gs)
    decoded_rtn = _decode(fmt, rtn_codes, rtn_scales, O, I, gs)
    groups_w, lo, hi = _groups_of(fmt, w, gs)
    n = groups_w.shape[1]
    s_flat = np.asarray(scales, F32).reshape(-1)
    with np.errstate(all="ignore"):
        assert np.array_equal(  # the codes of the scale written, group by group
            _groups_of(fmt, decoded, gs)[0],
            (np.clip(np.rint(groups_w / s_flat[:, None]), lo, hi) * s_flat[:, None]).astype(F32),
        )
    if mode == "mse-positive":
        assert (s_flat > 0).all()
    err = ((_groups_of(fmt, decoded, gs)[0].astype(np.float64) - groups_w) ** 2).sum(axis=1)
    err_rtn = ((_groups_of(fmt, decoded_rtn, gs)[0].astype(np.float64) - groups_w) ** 2).sum(axis=1)
    # never worse than rtn group by group (summed in a different order here: equal up to rounding)
    assert (err <= err_rtn * (1 + 1e-12) + 1e-300).all(), (err, err_rtn, n)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("signed", [True, False])
def test_kernel_search_is_byte_identical_to_numpy_on_any_thread_count(signed, threads, monkeypatch):
    rng = np.random.default_rng(7)
    w = (rng.standard_t(4, size=(700, 64)) * rng.choice([1.0, 1e-30, 1e30], size=(700, 1))).astype(F32)
    w[5] = 0
    w[6, :3] = 1e-42
    w[7] = np.round(w[7] * 4) / 4  # exact ties
    kernels.set_threads(threads)
    try:
        s_k, v_k = mse_kernel.mse_groups(w, -8, 7, signed)
    finally:
        kernels.set_threads(None)
    s_r, v_r = quantizers.mse_groups(w, -8, 7, signed)
    assert s_k.tobytes() == s_r.tobytes()
    assert v_k.tobytes() == v_r.tobytes()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("source", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("fmt, gs, I", [("int4-grouped", 32, 256), ("int4-grouped", 64, 192),
                                        ("int4-grouped", 128, 384), ("int4-row", None, 136)])  # fmt: skip
def test_int4_packed_by_the_search_kernel_equals_the_reference(fmt, gs, I, source, threads, monkeypatch):
    """Whole int4 groups are searched and packed into pairs by the kernel itself, straight from BF16 / F16 bits
    (``kernels/mse.py`` ``mse_int4``): the reference's bytes (its search, then ``pack_int4_pairs``) on the same
    values upcast to float32, the edge groups of every length included, on one and two threads."""
    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)
    rng = np.random.default_rng(I)
    n = gs or I
    edges = _edge_groups(n, rng)  # each row: I / n edge groups, rolled so that every kind meets every place
    w = np.concatenate([rng.standard_t(4, size=(40, I)) * 0.02,
                        np.concatenate([np.roll(edges, k, axis=0) for k in range(I // n)], axis=1)])  # fmt: skip
    dtype = {"f32": F32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[source]
    top = float(ml_dtypes.finfo(dtype).max)
    w = np.clip(w, -top, top).astype(dtype)  # F16: its own largest, not 1e38
    kernels.set_threads(threads)
    try:
        got = {mode: by_name(fmt).encode(w, gs, fast=True, quantizer=mode) for mode in ("mse", "mse-positive")}
    finally:
        kernels.set_threads(None)
    for mode, (codes, scales) in got.items():
        want_v = np.rint(w.astype(F32) / np.repeat(scales.reshape(w.shape[0], -1), n, axis=1))  # its own scale's codes
        want = by_name(fmt).encode(w.astype(F32), gs, fast=False, quantizer=mode)
        assert codes.tobytes() == want[0].tobytes() and scales.tobytes() == want[1].tobytes()
        assert codes.tobytes() == ref.pack_int4_pairs(np.clip(want_v, -8, 7).astype(np.int8)).tobytes()


def _edge_groups(n: int, rng) -> np.ndarray:
    """Groups of length ``n`` on each of the kernel's own paths (``kernels/_jit_mse.py``): every element at the
    extreme (the largest int32 partial sums of the refit), rtn and mse both exact (equal errors: the lane sums
    decide), a lone non-zero, subnormals (the float32 error estimates below their absolute bound), values near
    float32's largest (their squares overflow the estimates), exact ties, all zeros, Student-t."""
    w = (rng.standard_t(4, size=(12, n)) * 0.1).astype(F32)
    w[0] = -1.0
    w[1] = np.where(np.arange(n) % 2, 1.0, -1.0)
    w[2] = rng.integers(-8, 8, size=n) / 8.0
    w[3] = 0.0
    w[3, n // 2] = 3.0
    w[4] = rng.standard_normal(n) * 1e-41
    w[5] = (rng.standard_normal(n) * 1e38).clip(-3.4e38, 3.4e38)
    w[6] = rng.integers(-32, 33, size=n) * 0.25
    w[7] = 0.0
    w[8, : n // 2] = 1e-45
    return w


@pytest.mark.parametrize("lo, hi", sorted(set(CODE_RANGE.values())))
@pytest.mark.parametrize("n", [8, 24, 64, 136, 264, 2056])
def test_kernel_search_on_edge_groups_is_byte_identical_to_numpy(lo, hi, n):
    """Lengths across the refit's int32 chunks (128 elements at int8, 2048 at int4) and groups whose error
    comparison the float32 estimates cannot decide, both signs of scale."""
    w = _edge_groups(n, np.random.default_rng(n))
    for signed in (True, False):
        s_k, v_k = mse_kernel.mse_groups(w, lo, hi, signed)
        s_r, v_r = quantizers.mse_groups(w, lo, hi, signed)
        assert s_k.tobytes() == s_r.tobytes()
        assert v_k.tobytes() == v_r.tobytes()


@pytest.mark.parametrize("offsets", [(-0.5, 0.0, 0.5), (-0.9, -0.6, -0.3, 0.0, 0.3, 0.6, 0.9)])
def test_kernel_search_takes_any_number_of_candidates(offsets, monkeypatch):
    """The kernel codes candidates five at a time; fewer or more than five (a partial batch, two batches) give
    the reference's bytes, ties between candidates included (the first wins)."""
    monkeypatch.setattr(quantizers, "CANDIDATE_OFFSETS", offsets)
    rng = np.random.default_rng(5)
    w = np.concatenate([rng.standard_t(4, size=(300, 64)), _edge_groups(64, rng)]).astype(F32)
    for lo, hi in ((-8, 7), (-2, 1)):
        for signed in (True, False):
            s_k, v_k = mse_kernel.mse_groups(w, lo, hi, signed)
            s_r, v_r = quantizers.mse_groups(w, lo, hi, signed)
            assert s_k.tobytes() == s_r.tobytes() and v_k.tobytes() == v_r.tobytes()


def test_kernel_error_comparison_on_near_ties_is_the_lane_sums():
    """The kernel decides ``err(mse) < err(rtn)`` from float32 estimates only when they are far apart; scales
    one to a few float32 steps apart (errors equal to ~1e-7 relatively, where float32 sums misorder) still
    compare as the reference's float64 lane sums do (``quantizers.squared_error``)."""
    from colitools.formats.kernels import _jit_mse

    rng = np.random.default_rng(13)
    for n in (8, 64, 512):
        w = rng.standard_normal((400, n)).astype(F32)
        s0 = (np.abs(w).max(axis=1) / F32(7)).astype(F32)
        s1 = (s0.view(np.int32) + rng.integers(-3, 4, size=400).astype(np.int32)).view(F32)
        v0 = np.clip(np.rint(w / s0[:, None]), -8, 7).astype(F32)
        v1 = np.clip(np.rint(w / s1[:, None]), -8, 7).astype(F32)
        want = quantizers.squared_error(w, s1, v1) < quantizers.squared_error(w, s0, v0)
        e0, e1 = np.empty(400, F32), np.empty(400, F32)  # the kernel's float32 estimates of a tile of 400 groups
        _jit_mse._estimates_tile(w, v0, s0, v1, s1, np.ones(400, bool), 400, e0, e1)
        got = [bool(_jit_mse._smaller_error(w[i], v1[i], s1[i], v0[i], s0[i], e1[i], e0[i])) for i in range(400)]
        assert got == want.tolist()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("fmt", sorted(CODE_RANGE))  # the symmetric formats: the group search's kernel
def test_an_mse_kernel_encode_names_the_first_non_finite_value(fmt, bad, monkeypatch):
    """The kernel finds NaN / inf as it searches (no numpy pass before it); the error is every encoder's: the
    tensor, the first bad ``[o, i]`` and the count."""
    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)
    w = np.random.default_rng(2).standard_normal((40, 192)).astype(F32)
    w[37, 5] = bad
    w[23, 150] = bad
    gs = 64 if fmt == "int4-grouped" else None
    with pytest.raises(EncodeError, match=r"tensor t\.w: non-finite value .* at \[23, 150\] \(2 non-finite"):
        by_name(fmt).encode(w, gs, name="t.w", fast=True, quantizer="mse")


@pytest.mark.parametrize("fmt, gs", [("int8-row", None), ("int4-row", None), ("int2-row", None), ("int3-g64", None),
                                     ("int4-grouped", 32)])  # fmt: skip
def test_a_width_not_a_multiple_of_8_pads_groups_for_the_kernel_as_for_numpy(fmt, gs, monkeypatch):
    """The reference zero-pads a group to a multiple of 8 before the search (a zero adds nothing to any sum); the
    kernel's chunks and float32 estimates see the padded tail as numpy does: the same bytes."""
    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)
    w = np.random.default_rng(4).standard_t(4, size=(37, 203)).astype(F32)
    w[3, -5:] = 0.0
    w[4, -1] = -40.0  # the extreme in the tail
    for mode in ("mse", "mse-positive"):
        fast = by_name(fmt).encode(w, gs, fast=True, quantizer=mode)
        slow = by_name(fmt).encode(w, gs, fast=False, quantizer=mode)
        assert fast[0].tobytes() == slow[0].tobytes() and fast[1].tobytes() == slow[1].tobytes()


SOURCES = ["f32", "bf16", "f16", "fp8"]


@pytest.mark.parametrize("fmt", MSE_FORMATS)
@pytest.mark.parametrize("source", SOURCES)
def test_every_mse_format_from_every_source_kind_equals_the_reference(fmt, source, monkeypatch):
    """The converter's path (``unit_writer.encode_job``: BF16 / F16 values as they are, an FP8 source
    dequantised exactly, then ``encode`` with the kernels) against the numpy reference on the same float32
    values."""
    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)  # the kernel even for this small tensor
    rng = np.random.default_rng(3)
    w = rng.standard_normal((260, 200)).astype(F32)
    if source == "bf16":
        w = w.astype(ml_dtypes.bfloat16)
    elif source == "f16":
        w = w.astype(np.float16)
    elif source == "fp8":
        q = w.astype(ml_dtypes.float8_e4m3fn)
        scale_inv = np.full((3, 2), 0.5, F32)
        w = kernels.dequant_fp8_block(q.view(np.uint8), scale_inv, (128, 128))
    gs = 32 if by_name(fmt).grouped else None
    if not by_name(fmt).pairs:  # the affine formats (FORMATS §2.12) take whole groups only
        w = np.ascontiguousarray(w[:, :192])
    for mode in ("mse", "mse-positive"):
        fast = by_name(fmt).encode(w, gs, fast=True, quantizer=mode)
        slow = by_name(fmt).encode(w.astype(F32), gs, fast=False, quantizer=mode)
        assert fast[0].tobytes() == slow[0].tobytes() and fast[1].tobytes() == slow[1].tobytes()


def test_formats_without_scales_to_choose_ignore_the_quantizer():
    """mxfp4's exponent is already chosen by error (§2.7): ``mse`` writes its rtn bytes."""
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(F32)
    mx = by_name("mxfp4")
    assert not mx.mse_scales
    assert [a.tobytes() for a in mx.encode(w, fast=False, quantizer="mse")] == [
        a.tobytes() for a in mx.encode(w, fast=False)
    ]


def test_an_unknown_quantizer_mode_is_refused():
    with pytest.raises(ValueError, match="unknown quantizer mode 'fancy'"):
        by_name("int8-row").encode(np.ones((2, 8), F32), fast=False, quantizer="fancy")


@pytest.mark.parametrize("dist", ["gauss", "laplace", "t4"])
def test_int4_g64_relative_rmse_is_at_most_086_of_rtn_with_signed_scales(dist):
    """§9's goal on the three distributions (bench/quality.py prints the full table)."""
    rng = np.random.default_rng(11)
    draw = {"gauss": rng.standard_normal, "laplace": rng.laplace, "t4": lambda size: rng.standard_t(4, size)}
    w = draw[dist](size=(256, 1024)).astype(F32)
    fmt = by_name("int4-grouped")
    errs = {}
    for mode in ("rtn", "mse"):
        codes, scales = fmt.encode(w, 64, fast=False, quantizer=mode)
        errs[mode] = float(((fmt.decode(codes, scales, 256, 1024, 64).astype(np.float64) - w) ** 2).sum())
    assert math.sqrt(errs["mse"] / errs["rtn"]) <= 0.86
