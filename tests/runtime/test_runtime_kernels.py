"""The matmul kernels on packed codes agree with the registry's numpy decoders (float64 reference of the
decoded weight) for every format and layout, and give bit-identical rows whatever the batch size."""

# ruff: noqa: E741
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import reference as ref
from colitools.formats.planar import pairs_to_planar
from colitools.formats.registry import by_name
from colitools.runtime.kernels import QTensor

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


@pytest.mark.parametrize("kind,fmt,O,I,gs", CASES)
def test_kernel_matches_decoded_weight(kind, fmt, O, I, gs):
    rng = np.random.default_rng(O * 1000 + I)
    w = rng.standard_normal((O, I)).astype(np.float32)
    f = by_name(fmt)
    codes, scales = f.encode(w, gs, fast=False)
    dense = f.decode(codes, scales, O, I, gs).astype(np.float64)
    if kind == "int4-planar":
        codes = pairs_to_planar(codes)
    q = QTensor(kind, codes, scales, O, I, gs)
    x = rng.standard_normal((5, I)).astype(np.float32)
    y = q.matmul(x)
    assert y.shape == (5, O) and y.dtype == np.float32
    np.testing.assert_allclose(
        y, x.astype(np.float64) @ dense.T, rtol=0, atol=2e-5 * np.abs(x @ dense.T).max()
    )
    # one row at a time gives bit-identical results (prefill and decode agree exactly)
    for n in range(5):
        assert np.array_equal(q.matmul(x[n : n + 1])[0], y[n])


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
