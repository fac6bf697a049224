"""The error figures (docs/FORMATS.md §11): the kernel (``kernels/_jit_stats.py``, taken from ``KERNEL_ELEMS``
elements on, a BF16 source read from its bits) equal to the numpy reference ``error_stats.row_sums`` bit for bit,
the order pinned by sums computed by hand, and both within the stated bound of an independent exact computation,
on every kind of kernel (compiled ahead and JIT)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import error_stats
from colitools.formats.error_stats import REL_BOUND, TINY, ErrorStats, tensor_error


@pytest.fixture(autouse=True)
def _both_kernel_kinds(kernel_drivers):
    """Each test runs on the compiled-ahead kernels and on numba's JIT (tests/conftest.py)."""


def _exact(a: np.ndarray, b: np.ndarray) -> tuple[list[float], list[float], float]:
    """(sse, ssw, ssq, dot) as exactly rounded sums of float64 terms (``math.fsum``), the sums of the terms'
    magnitudes, and max |b - a| of the float32 difference: computed without the module."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    d = y - x
    terms = (d * d, x * x, y * y, x * y)
    d32 = np.abs(b.astype(np.float32).ravel() - a.astype(np.float32).ravel())
    return [math.fsum(t) for t in terms], [math.fsum(np.abs(t)) for t in terms], float(d32.max())


def _assert_within_bound(got: ErrorStats, a: np.ndarray, b: np.ndarray) -> None:
    sums, sizes, mx = _exact(a, b)
    assert got.n == a.size
    for name, want, size in zip(("sse", "ssw", "ssq", "dot"), sums, sizes, strict=True):
        assert abs(getattr(got, name) - want) <= REL_BOUND * size + a.size * TINY, (name, getattr(got, name), want)
    assert got.max_abs == mx


def _reference(a: np.ndarray, b: np.ndarray) -> ErrorStats:
    return error_stats.from_rows(a.size, error_stats.row_sums(a, b))


def _scaled_rows(rng, shape) -> np.ndarray:
    """Rows of magnitude 1, 1e-20 (squares below float32's normal range) and 1e20 (squares overflow it)."""
    return (rng.standard_normal(shape) * rng.choice([1.0, 1e-20, 1e20], size=(shape[0], 1))).astype(np.float32)


@pytest.mark.parametrize("source_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(300, 517), (129, 2050), (64, 1024)])
def test_the_kernel_equals_the_reference_order_bit_for_bit(source_dtype, threads, shape):
    from colitools.formats import kernels

    rng = np.random.default_rng(5)
    w = _scaled_rows(rng, shape)
    if source_dtype == "bf16":
        w = w.astype(ml_dtypes.bfloat16)
    decoded = w.astype(np.float32) * np.float32(1 + 1e-3) + rng.standard_normal(shape).astype(np.float32) * 1e-3
    assert w.size >= error_stats.KERNEL_ELEMS  # the kernel's path
    kernels.set_threads(threads)
    try:
        got = tensor_error(w, decoded)
    finally:
        kernels.set_threads(None)
    assert got == _reference(w, decoded)
    assert math.isfinite(got.ssw)  # the 1e20 rows overflow float32: summed again in float64
    _assert_within_bound(got, w, decoded)


def test_lanes_the_fold_and_the_float64_blocks_by_hand():
    """Three rows of 512 whose float32 sums round differently in each possible order (the float32 spacing at
    2^24 is 2; a tie rounds to even): lane sums, the fold in halves, and blocks added in float64."""
    w = np.zeros((128, 512), np.float32)  # KERNEL_ELEMS elements: the kernel's path
    w[0, [0, 1, 2, 3]] = [4096, 1, 1, 1]  # lanes 0-3: fold h=2 gives 2^24 + 1 -> 2^24 and 1 + 1 = 2; h=1: 2^24 + 2
    w[1, [0, 16, 32]] = [4096, 1, 1]  # lane 0 in order: (2^24 + 1) + 1 -> 2^24 + 1 -> 2^24 (ties to even)
    w[2, [0, 256]] = [4096, 1]  # two blocks: 2^24 and 1, added in float64
    rows = error_stats.row_sums(w[:3], w[:3])
    assert rows[:, 1].tolist() == [16777218.0, 16777216.0, 16777217.0]
    assert rows[:, 0].tolist() == [0.0, 0.0, 0.0] and rows[:, 4].tolist() == [0.0, 0.0, 0.0]
    got = tensor_error(w, w)
    assert (got.sse, got.ssw, got.ssq, got.dot) == (0.0, 50331651.0, 50331651.0, 50331651.0)


def test_a_row_whose_float32_sums_overflow_is_summed_in_float64_in_order():
    w = np.full((128, 512), 1e20, np.float32)  # w^2 = 1e40 > float32's largest 3.4e38
    got = tensor_error(w, w * np.float32(0.5))
    v = float(np.float32(1e20))
    assert got.ssw == pytest.approx(w.size * v * v, rel=1e-13) and got.sse == pytest.approx(got.ssw / 4, rel=1e-13)
    assert got.max_abs == float(np.float32(v) - np.float32(v) * np.float32(0.5))


def test_the_kernel_and_the_numpy_path_agree_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(6)
    w = rng.standard_normal((256, 520)).astype(np.float32)
    decoded = (w + rng.standard_normal(w.shape).astype(np.float32) * np.float32(0.01)).astype(np.float32)
    kernel = tensor_error(w, decoded)
    monkeypatch.setattr(error_stats, "KERNEL_ELEMS", w.size + 1)  # the numpy path, same tensor
    monkeypatch.setattr(error_stats, "_CHUNK_ELEMS", 5000)  # and its chunks: rows, and blocks of one row
    assert tensor_error(w, decoded) == kernel
    flat = tensor_error(w.reshape(-1), decoded.reshape(-1))  # one row of every value: the same terms
    _assert_within_bound(flat, w, decoded)


@pytest.mark.parametrize("source_dtype", ["f32", "bf16"])
@pytest.mark.parametrize(
    "fmt, gs, shape", [("int8-row", None, (300, 517)), ("int4-row", None, (129, 2050)),
                       ("int4-grouped", 64, (257, 1024)), ("int4-grouped", 32, (100, 960)),
                       ("int4-grouped", 24, (128, 528))]
)  # fmt: skip
@pytest.mark.parametrize("threads", [1, 2])
def test_the_fused_decode_gives_the_decode_then_sum_figures_bit_for_bit(
    source_dtype, fmt, gs, shape, threads
):
    """``encoded_error`` (the written tensor's codes decoded inside the lane loop; a group size that is not a
    multiple of the lanes a row at a time into scratch) against decoding first and the numpy reference: every
    figure equal to the last bit, row counts and widths off the lane and block sizes, tiny and huge rows; and
    within the bound of the independent computation."""
    from colitools.formats import kernels

    rng = np.random.default_rng(9)
    w = _scaled_rows(rng, shape)
    source = w.astype(ml_dtypes.bfloat16) if source_dtype == "bf16" else w
    codes, scales = kernels.encode(fmt, source.astype(np.float32), gs)
    decoded = kernels.decode(fmt, codes, scales, *shape, gs)
    kernels.set_threads(threads)
    try:
        fused = error_stats.encoded_error(source, fmt, codes, scales, *shape, gs)
    finally:
        kernels.set_threads(None)
    assert fused == tensor_error(source, decoded) == _reference(source, decoded)
    _assert_within_bound(fused, source, decoded)


def test_formats_the_sums_kernel_does_not_decode_are_left_to_the_caller():
    from colitools.formats import kernels

    w = np.random.default_rng(1).standard_normal((256, 512)).astype(np.float32)
    codes, scales = kernels.encode("int2-row", w, None)
    assert error_stats.encoded_error(w, "int2-row", codes, scales, 256, 512, None) is None
    small = kernels.encode("int8-row", w[:4], None)
    assert error_stats.encoded_error(w[:4], "int8-row", *small, 4, 512, None) is None  # below KERNEL_ELEMS


@pytest.mark.parametrize(
    "fmt, gs", [("int8-row", None), ("int4-row", None), ("int4-grouped", 64), ("int4-grouped", 24)]
)
@pytest.mark.parametrize("threads", [1, 2])
def test_the_bf16_encoder_measures_what_it_wrote_bit_for_bit(fmt, gs, threads, monkeypatch):
    """``encode_from_bf16_measured`` (each block of rows measured as soon as it is encoded): the bytes of
    ``encode_from_bf16`` and the figures of decoding them and the reference, to the last bit."""
    from colitools.formats import kernels

    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)  # the kernel, not the reference, on the JIT too
    shape = (203, 528)
    w = _scaled_rows(np.random.default_rng(11), shape).astype(ml_dtypes.bfloat16)
    kernels.set_threads(threads)
    try:
        codes, scales, rows = kernels.encode_from_bf16_measured(fmt, w, gs)
        want_codes, want_scales = kernels.encode_from_bf16(fmt, w, gs)
    finally:
        kernels.set_threads(None)
    assert np.array_equal(codes, want_codes) and np.array_equal(scales, want_scales)
    assert rows is not None and rows.shape == (shape[0], 5)
    decoded = kernels.decode(fmt, codes, scales, *shape, gs)
    assert error_stats.from_rows(w.size, rows) == _reference(w, decoded)


def test_the_bf16_encoder_measures_only_formats_its_kernel_decodes_and_refuses_what_encode_refuses(monkeypatch):
    from colitools.formats import kernels
    from colitools.formats.errors import EncodeError

    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)
    w = np.random.default_rng(12).standard_normal((256, 512)).astype(ml_dtypes.bfloat16)
    codes, scales, rows = kernels.encode_from_bf16_measured("int2-row", w, None)
    assert rows is None and np.array_equal(codes, kernels.encode_from_bf16("int2-row", w, None)[0])
    w[100, 7] = np.nan
    with pytest.raises(EncodeError) as measured:
        kernels.encode_from_bf16_measured("int4-grouped", w, 64, name="t")
    with pytest.raises(EncodeError) as plain:
        kernels.encode_from_bf16("int4-grouped", w, 64, name="t")
    assert str(measured.value) == str(plain.value) and "[100, 7]" in str(plain.value)


def _fp8_source(rng, shape, block) -> tuple[np.ndarray, np.ndarray]:
    """e4m3fn bytes (cast by ml_dtypes) and a float32 scale per block: scales of magnitude 1, 1e-20 and 1e17
    (the last two take the sums below float32's normal range and past its overflow), subnormal bytes, both
    zeros."""
    (O, I), (br, bc) = shape, block
    grid = (-(-O // br), -(-I // bc))
    s = (rng.random(grid) + 0.5) * rng.choice([1.0, 1e-20, 1e17], size=grid)
    q = (rng.standard_normal(shape) * 100).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    q[:, :9] = [0x00, 0x80, 0x01, 0x07, 0x81, 0x87, 0x08, 0x7E, 0xFE]  # zeros, subnormals, the extremes
    return q, s.astype(np.float32)


@pytest.mark.parametrize(
    "fmt, gs", [("int8-row", None), ("int4-row", None), ("int4-grouped", 64), ("int4-grouped", 24)]
)
@pytest.mark.parametrize("block", [(128, 128), (1, 48), (3, 40)])  # 40: not whole chunks of LANES
@pytest.mark.parametrize("threads", [1, 2])
def test_the_fp8_encoder_measures_what_it_wrote_bit_for_bit(fmt, gs, block, threads, monkeypatch):
    """``encode_from_fp8_measured`` (the dequant done inside the sums, each block of rows measured as soon as it
    is encoded): the bytes of ``encode_from_fp8_block`` and the figures of the reference dequant against the
    decoded output, to the last bit."""
    from colitools.formats import kernels
    from colitools.formats import reference as ref

    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)
    shape = (203, 528)
    q, s = _fp8_source(np.random.default_rng(13), shape, block)
    kernels.set_threads(threads)
    try:
        codes, scales, rows = kernels.encode_from_fp8_measured(fmt, q, s, block, gs)
        want_codes, want_scales = kernels.encode_from_fp8_block(fmt, q, s, block, gs)
    finally:
        kernels.set_threads(None)
    assert np.array_equal(codes, want_codes) and np.array_equal(scales, want_scales)
    assert rows is not None and rows.shape == (shape[0], 5)
    decoded = kernels.decode(fmt, codes, scales, *shape, gs)
    with np.errstate(over="ignore"):
        source = ref.dequant_fp8_block(q, s, block)
    assert error_stats.from_rows(q.size, rows) == _reference(source, decoded)


def test_the_fp8_encoder_measures_only_formats_its_kernel_decodes_and_refuses_what_encode_refuses(monkeypatch):
    from colitools.formats import kernels
    from colitools.formats.errors import EncodeError

    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)
    q, s = _fp8_source(np.random.default_rng(14), (256, 512), (128, 128))
    codes, scales, rows = kernels.encode_from_fp8_measured("int2-row", q, s, 128, None)
    assert rows is None and np.array_equal(codes, kernels.encode_from_fp8_block("int2-row", q, s, 128, None)[0])
    q[100, 37] = 0x7F  # e4m3fn NaN
    with pytest.raises(EncodeError) as measured:
        kernels.encode_from_fp8_measured("int4-grouped", q, s, 128, 64, name="t")
    with pytest.raises(EncodeError) as plain:
        kernels.encode_from_fp8_block("int4-grouped", q, s, 128, 64, name="t")
    assert str(measured.value) == str(plain.value) and "[100, 37]" in str(plain.value)
