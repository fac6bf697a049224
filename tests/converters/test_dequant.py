"""Source dequantization (docs/FORMATS.md §9): exact float upcasts, FP8 block scales on the ceil grid."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from colitools.converters import dequant as dq
from colitools.errors import ConfigError, ConvertError


def test_float_sources_upcast_exactly():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    for dt in (ml_dtypes.bfloat16, np.float16, np.float32):
        v = x.astype(dt)
        out = dq.to_float32("t", v)
        assert out.dtype == np.float32
        assert np.array_equal(out.astype(dt).view(np.uint8), v.view(np.uint8))  # nothing lost on the way up


def _manual_fp8(q, s, br, bc):
    """Element by element, the spec's formula: f32(e4m3(q)) * f32(s[r // br, c // bc])."""
    out = np.empty(q.shape, np.float32)
    vals = q.astype(np.float32)
    for r in range(q.shape[0]):
        for c in range(q.shape[1]):
            out[r, c] = np.float32(vals[r, c]) * np.float32(s[r // br, c // bc])
    return out


@pytest.mark.parametrize(
    ("M", "N", "block"), [(130, 300, (128, 128)), (7, 9, (4, 4)), (128, 128, (128, 128))]
)
def test_fp8_block_dequant_uses_the_ceil_grid(M, N, block):
    rng = np.random.default_rng(2)
    q = (rng.standard_normal((M, N)) * 50).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
    s = rng.random(dq.expected_scale_shape((M, N), block)).astype(np.float32) + 0.5
    want = _manual_fp8(q, s, *block)
    assert np.array_equal(dq.to_float32("t", q, scale=s, block=block), want)
    # raw bytes and BF16 scales work too (BF16 scale upcast exactly first)
    sb = s.astype(ml_dtypes.bfloat16)
    assert np.array_equal(
        dq.to_float32("t", q.view(np.uint8), scale=sb, block=block),
        _manual_fp8(q, sb.astype(np.float32), *block),
    )


def test_fp8_without_scale_is_an_error():
    q = np.zeros((4, 4), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ConvertError, match="FP8 weight without its scale tensor t_scale_inv"):
        dq.to_float32("t", q)
    with pytest.raises(ConvertError, match="FP8 weight without its scale tensor w_scale_inv"):
        dq.check_source_dtype("w", "F8_E4M3", has_scale=False)


def test_wrong_scale_grid_is_an_error_naming_both_shapes():
    q = np.zeros((130, 300), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ConvertError, match=r"scale grid \[1, 3\].*expected \[2, 3\]"):
        dq.to_float32("t", q, scale=np.ones((1, 3), np.float32), block=(128, 128))
    with pytest.raises(
        ConvertError, match=r"w_scale_inv: scale grid \[2, 2\] does not match weight w \[130, 300\]"
    ):
        dq.check_scale_grid("w", (130, 300), "w_scale_inv", "F32", (2, 2), (128, 128))
    with pytest.raises(ConvertError, match="scale dtype I32"):
        dq.check_scale_grid("w", (130, 300), "w_scale_inv", "I32", (2, 3), (128, 128))
    dq.check_scale_grid(
        "w", (4, 130, 300), "w_scale_inv", "BF16", (4, 2, 3), (128, 128)
    )  # fused: lead dim kept


def test_non_float_sources_are_refused():
    with pytest.raises(ConvertError, match="source dtype I64 cannot be converted"):
        dq.check_source_dtype("pos", "I64", has_scale=False)
    with pytest.raises(ConvertError, match="cannot be converted"):
        dq.to_float32("pos", np.zeros(3, np.int64))


def test_fp8_scheme_from_config():
    assert dq.quant_scheme({}).fp8 is None
    cfg = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 128]}}
    assert dq.quant_scheme(cfg).fp8.block == (64, 128)
    assert dq.quant_scheme({"quantization_config": {"quant_method": "fp8"}}).fp8.block == (128, 128)
    with pytest.raises(ConfigError, match="quant_method 'awq'"):
        dq.quant_scheme({"quantization_config": {"quant_method": "awq"}})
    with pytest.raises(ConfigError, match="weight_block_size"):
        dq.quant_scheme({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}})


def _fp8_rows(M, N, block, seed):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((M, N)) * 50).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
    q[3, :7] = np.array([0x7F, 0xFF, 0x01, 0x80, 0x7E, 0x08, 0x00], np.uint8).view(ml_dtypes.float8_e4m3fn)
    s = rng.random(dq.expected_scale_shape((M, N), block)).astype(np.float32) * 2.0**-6 + 2.0**-10
    return q, s


@pytest.mark.parametrize("raw", [False, True])
def test_a_jobs_fp8_values_from_the_kernel_are_the_formulas(raw):
    """``unit_writer._dequant`` (an FP8 job's float32 values: its error figures, an mse job, a float target) takes
    the kernel for a tensor big enough and a slab starting on a scale-block boundary, numpy otherwise: every path
    gives the spec's formula bit for bit (NaN bytes included), element by element."""
    from types import SimpleNamespace

    from colitools.converters.unit_writer import _dequant

    block = (128, 128)
    q, s = _fp8_rows(520, 300, block, 7)  # 156,000 elements: above the kernels' small-tensor threshold
    q = q.view(np.uint8) if raw else q
    want = _manual_fp8(q.view(ml_dtypes.float8_e4m3fn), s, *block)
    whole = _dequant(SimpleNamespace(out_name="t", fused_rows=None), q, s, block)
    assert whole.tobytes() == want.tobytes()
    for r0, r1 in ((128, 520), (100, 420)):  # an aligned slab (the kernel on its grid rows), an unaligned one
        job = SimpleNamespace(out_name="t", fused_rows=(0, r0, r1))
        assert _dequant(job, q[r0:r1], s, block).tobytes() == want[r0:r1].tobytes()


def test_a_jobs_fp8_values_with_a_wrong_grid_name_the_tensor():
    from types import SimpleNamespace

    from colitools.converters.unit_writer import _dequant

    q, s = _fp8_rows(520, 300, (128, 128), 8)
    with pytest.raises(ConvertError, match=r"tensor t: scale grid \[5, 2\] does not match"):
        _dequant(SimpleNamespace(out_name="t", fused_rows=None), q, s[:, :2], (128, 128))
