"""The error figures' kernel (``kernels/_jit_stats.py``, taken from ``KERNEL_ELEMS`` elements on, a BF16 source read
from its bits) against the numpy path of ``error_stats.tensor_error`` and an independent float64 computation,
on every kind of kernel (compiled ahead and JIT)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import error_stats
from colitools.formats.error_stats import tensor_error


@pytest.fixture(autouse=True)
def _both_kernel_kinds(kernel_drivers):
    """Each test runs on the compiled-ahead kernels and on numba's JIT (tests/conftest.py)."""


def _independent(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float, float, float]:
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    d = y - x
    return math.fsum(d * d), math.fsum(x * x), math.fsum(y * y), math.fsum(x * y), float(np.abs(d).max())


@pytest.mark.parametrize("source_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_figures_equal_an_independent_float64_computation(source_dtype, threads):
    from colitools.formats import kernels

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((300, 517)) * rng.choice([1.0, 1e-20, 1e20], size=(300, 1))).astype(np.float32)
    if source_dtype == "bf16":
        w = w.astype(ml_dtypes.bfloat16)
    decoded = (w.astype(np.float32) + rng.standard_normal(w.shape).astype(np.float32) * np.float32(1e-3))
    assert w.size >= error_stats.KERNEL_ELEMS  # the kernel's path
    kernels.set_threads(threads)
    try:
        got = tensor_error(w, decoded)
    finally:
        kernels.set_threads(None)
    sse, ssw, ssq, dot, mx = _independent(w, decoded)
    assert got.n == w.size
    for name, want in (("sse", sse), ("ssw", ssw), ("ssq", ssq), ("dot", dot)):
        assert getattr(got, name) == pytest.approx(want, rel=1e-12), name
    assert got.max_abs == pytest.approx(mx, rel=2.0**-23)  # the float32 difference (error_stats' docstring)
    halves = tensor_error(w[:150], decoded[:150]) + tensor_error(w[150:], decoded[150:])
    assert halves.n == got.n and halves.sse == pytest.approx(got.sse, rel=1e-12)  # sums add, whatever the cut


def test_the_kernel_and_the_numpy_path_agree(monkeypatch):
    rng = np.random.default_rng(6)
    w = rng.standard_normal((256, 512)).astype(np.float32)
    decoded = (w + rng.standard_normal(w.shape).astype(np.float32) * np.float32(0.01)).astype(np.float32)
    kernel = tensor_error(w, decoded)
    monkeypatch.setattr(error_stats, "KERNEL_ELEMS", w.size + 1)  # the numpy path, same tensor
    numpy_path = tensor_error(w, decoded)
    assert kernel.n == numpy_path.n
    for name in ("sse", "ssw", "ssq", "dot"):
        assert getattr(kernel, name) == pytest.approx(getattr(numpy_path, name), rel=1e-12), name
    assert kernel.max_abs == pytest.approx(numpy_path.max_abs, rel=2.0**-23)


@pytest.mark.parametrize("source_dtype", ["f32", "bf16"])
@pytest.mark.parametrize(
    "fmt, gs, shape", [("int8-row", None, (300, 517)), ("int4-row", None, (129, 2050)),
                       ("int4-grouped", 64, (257, 1024)), ("int4-grouped", 32, (100, 960))]
)  # fmt: skip
@pytest.mark.parametrize("threads", [1, 2])
def test_the_fused_decode_gives_the_decode_then_sum_figures_bit_for_bit(
    source_dtype, fmt, gs, shape, threads
):
    """``encoded_error`` (the written tensor's codes decoded inside the sums kernel, a block of rows at a time)
    against decoding first and ``tensor_error``: every figure equal to the last bit, row counts not a multiple
    of the kernel's block, odd widths, tiny and huge rows; and against the independent float64 computation."""
    from colitools.formats import kernels

    rng = np.random.default_rng(9)
    w = (rng.standard_normal(shape) * rng.choice([1.0, 1e-20, 1e20], size=(shape[0], 1))).astype(np.float32)
    source = w.astype(ml_dtypes.bfloat16) if source_dtype == "bf16" else w
    codes, scales = kernels.encode(fmt, source.astype(np.float32), gs)
    decoded = kernels.decode(fmt, codes, scales, *shape, gs)
    kernels.set_threads(threads)
    try:
        fused = error_stats.encoded_error(source, fmt, codes, scales, *shape, gs)
    finally:
        kernels.set_threads(None)
    assert fused == tensor_error(source, decoded)
    sse, ssw, ssq, dot, _ = _independent(source, decoded)
    assert fused.sse == pytest.approx(sse, rel=1e-12) and fused.dot == pytest.approx(dot, rel=1e-12)


def test_formats_the_sums_kernel_does_not_decode_are_left_to_the_caller():
    from colitools.formats import kernels

    w = np.random.default_rng(1).standard_normal((256, 512)).astype(np.float32)
    codes, scales = kernels.encode("int2-row", w, None)
    assert error_stats.encoded_error(w, "int2-row", codes, scales, 256, 512, None) is None
    small = kernels.encode("int8-row", w[:4], None)
    assert error_stats.encoded_error(w[:4], "int8-row", *small, 4, 512, None) is None  # below KERNEL_ELEMS
