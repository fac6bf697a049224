"""The matmul kernels on packed codes agree with the registry's numpy decoders (float64 reference of the
decoded weight) for every format and layout, and give bit-identical rows whatever the batch size."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import reference as ref
from colitools.formats.kernels import threads
from colitools.formats.planar import pairs_to_planar
from colitools.formats.registry import by_name
from colitools.runtime import kernels
from colitools.runtime.kernels import QTensor


@pytest.fixture(autouse=True)
def _on_both_kinds_of_kernel(kernel_drivers):
    """Every case runs on the kernels compiled ahead of time and on numba's JIT (tests/conftest.py)."""


CASES = [
    # kind, format, O, I, gs
    ("int4", "int4-grouped", 37, 256, 64),
    ("int4", "int4-grouped", 20, 100, 64),  # partial last group
    ("int4", "int4-grouped", 9, 96, 48),
    ("int4", "int4-grouped", 9, 512, 128),
    ("int4", "int4-row", 33, 101, None),  # odd I: high nibble of the last byte unused
    ("int4-planar", "int4-grouped", 40, 256, 64),
    ("int4-planar", "int4-row", 17, 128, None),
    ("int3-g64", "int3-g64", 21, 200, None),
    ("int3-g64", "int3-g64", 5, 64, None),
    ("mxfp4", "mxfp4", 19, 96, None),
    ("int8-row", "int8-row", 40, 77, None),
    ("int2-row", "int2-row", 13, 77, None),
]


def _encoded(kind, fmt, O, I, gs, rng):
    """A random ``[O, I]`` weight in ``fmt`` (the numpy reference encoder) as the runtime's ``QTensor`` of
    ``kind``, and its float64 decode by the registry (the independent reference)."""
    w = rng.standard_normal((O, I)).astype(np.float32)
    f = by_name(fmt)
    codes, scales = f.encode(w, gs, fast=False)
    dense = f.decode(codes, scales, O, I, gs).astype(np.float64)
    if kind == "int4-planar":
        codes = pairs_to_planar(codes)
    return QTensor(kind, codes, scales, O, I, gs), dense


@pytest.mark.parametrize("kind,fmt,O,I,gs", CASES)
def test_kernel_matches_decoded_weight(kind, fmt, O, I, gs):
    rng = np.random.default_rng(O * 1000 + I)
    q, dense = _encoded(kind, fmt, O, I, gs, rng)
    x = rng.standard_normal((5, I)).astype(np.float32)
    y = q.matmul(x)
    assert y.shape == (5, O) and y.dtype == np.float32
    np.testing.assert_allclose(
        y, x.astype(np.float64) @ dense.T, rtol=0, atol=2e-5 * np.abs(x @ dense.T).max()
    )
    # one row at a time gives bit-identical results (prefill and decode agree exactly)
    for n in range(5):
        assert np.array_equal(q.matmul(x[n : n + 1])[0], y[n])


# Calls big enough to be split by rows over the pool (N * O * I >= SPLIT_MACS from N = 2 on); O is no multiple
# of the kernels' four-row blocks (the last block repeats row O - 1) nor of the chunk size.
SPLIT_CASES = [
    # kind, format, O, I, gs
    ("int4", "int4-grouped", 131, 8192, 64),  # the fixed 32-byte group kernel
    ("int4", "int4-grouped", 130, 8200, 64),  # I not a multiple of 64: partial last group, generic kernel
    ("int4", "int4-grouped", 133, 8192, 128),
    ("int4", "int4-row", 129, 8193, None),  # odd I
    ("int4-planar", "int4-grouped", 131, 8192, 64),
    ("int4-planar", "int4-row", 134, 8192, None),
]


@pytest.mark.parametrize("kind,fmt,O,I,gs", SPLIT_CASES)
def test_int4_split_calls_match_reference_and_single_rows(kind, fmt, O, I, gs, monkeypatch):
    monkeypatch.setenv("COLITOOLS_THREADS", "2")  # split even on a one-CPU machine
    assert 2 * O * I >= kernels.SPLIT_MACS > O * I  # N = 1 runs unsplit, N >= 2 split
    rng = np.random.default_rng(O + I)
    q, dense = _encoded(kind, fmt, O, I, gs, rng)
    x = rng.standard_normal((3, I)).astype(np.float32)
    calls, pool_map = [], threads.parallel_map
    monkeypatch.setattr(threads, "parallel_map", lambda fn, items: calls.append(items) or pool_map(fn, items))
    y = q.matmul(x)
    (chunks,) = calls  # several chunks, contiguous, starting on four-row block bounds
    starts, ends = [a for a, _ in chunks], [b for _, b in chunks]
    assert len(chunks) >= 2 and starts[0] == 0 and ends[-1] == O and starts[1:] == ends[:-1]
    assert all(a % kernels.INT4_ROWS == 0 for a in starts)
    expect = x.astype(np.float64) @ dense.T
    np.testing.assert_allclose(y, expect, rtol=0, atol=2e-5 * np.abs(expect).max())
    for n in range(3):  # unsplit one-row calls: bit-identical rows
        assert np.array_equal(q.matmul(x[n : n + 1])[0], y[n])
    assert len(calls) == 1


def test_int4_prep_orders_and_padding():
    """The compiled x preparation against a numpy restatement: xa = inputs of the low nibbles, xd = high - 16 low,
    xs = group sums, columns past I as zeros; pairs and planar64 orders."""
    rng = np.random.default_rng(3)
    for planar, I, gbytes in ((False, 101, 51), (False, 200, 32), (True, 256, 32), (True, 128, 64)):
        rb = -(-I // 2)
        G = -(-rb // gbytes)
        x = rng.standard_normal((2, I)).astype(np.float32)
        xp = np.zeros((2, 2 * G * gbytes), np.float32)
        xp[:, :I] = x
        if planar:
            blocks = xp[:, : 2 * rb].reshape(2, -1, 2, 32)
            lo, hi = blocks[:, :, 0, :].reshape(2, -1), blocks[:, :, 1, :].reshape(2, -1)
        else:
            lo, hi = xp[:, 0 : 2 * rb : 2], xp[:, 1 : 2 * rb : 2]
        xa, xd, xs = (
            np.empty((2, rb), np.float32),
            np.empty((2, rb), np.float32),
            np.empty((2, G), np.float32),
        )
        kernels.KERNELS.kernels().rt_int4_prep(x, rb, G, gbytes, planar, xa, xd, xs)
        assert np.array_equal(xa, lo) and np.array_equal(xd, hi - np.float32(16) * lo)
        sums = xp.astype(np.float64).reshape(2, G, 2 * gbytes).sum(axis=2)
        np.testing.assert_allclose(xs, sums, rtol=1e-6, atol=1e-6)


def test_fp8_b128_kernel_with_partial_blocks():
    rng = np.random.default_rng(8)
    O, I = 300, 260  # ceil grid 3 x 3 with partial edge blocks
    q8 = rng.standard_normal((O, I)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    s = rng.random((3, 3)).astype(np.float32)
    dense = ref.decode_fp8_b128(q8, s, O, I).astype(np.float64)
    x = rng.standard_normal((2, I)).astype(np.float32)
    y = QTensor("fp8-e4m3-b128", q8, s, O, I, None).matmul(x)
    np.testing.assert_allclose(y, x @ dense.T, rtol=0, atol=2e-5 * np.abs(x @ dense.T).max())


def test_kernels_read_codes_in_place():
    """A QTensor keeps the stored bytes (a view of the read buffer), never a float copy of the weight."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    codes, scales = by_name("int4-grouped").encode(w, 64, fast=False)
    buf = memoryview(codes.tobytes())
    q = QTensor("int4", np.frombuffer(buf, dtype=np.uint8), scales, 64, 128, 64)
    assert q.codes.base is not None and q.nbytes == codes.nbytes + scales.nbytes
    q.matmul(rng.standard_normal((1, 128)).astype(np.float32))


def test_unknown_kind_is_an_error():
    from colitools.errors import RuntimeModelError

    with pytest.raises(RuntimeModelError, match="no runtime kernel"):
        QTensor("e8-iq3-lattice", np.zeros((1, 98), np.uint8), np.ones(1, np.float32), 1, 256, None)
