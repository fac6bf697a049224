"""The sources the runtime reads unconverted (``runtime.weights.RUNTIME_SOURCES``: FP8 blocks, MXFP8, FP8 per
channel) are recognised, checked and decoded by their ``formats/source_encodings/`` classes; the scale dtypes
the runtime has always read (F16 / F64 floats, I8 bytes) are still read, and a scale that does not fit is the
class's one-line refusal."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from colitools.formats.errors import RuntimeModelError
from colitools.formats.safetensors_io.writer import write_safetensors
from colitools.runtime.weights import Checkpoint

Q = np.full((64, 64), 0x38, np.uint8).view(ml_dtypes.float8_e4m3fn)  # e4m3 1.0 everywhere


def _checkpoint(tmp_path, scale_name, scale):
    write_safetensors(tmp_path / "model.safetensors", {"x.weight": Q, scale_name: scale})
    return Checkpoint(tmp_path, {})


@pytest.mark.parametrize(
    ("scale_name", "scale", "form"),
    [
        ("x.weight_scale_inv", np.ones((1, 1), np.float32), "fp8-source"),
        ("x.weight_scale_inv", np.ones((1, 1), np.float16), "fp8-source"),
        ("x.weight_scale_inv", np.ones((1, 1), np.float64), "fp8-source"),
        ("x.weight_scale", np.ones((64, 1), ml_dtypes.bfloat16), "fp8-channel-source"),
        ("x.weight_scale", np.ones((1,), np.float64), "fp8-channel-source"),
        ("x.weight_scale", np.full((64, 2), 127, np.uint8), "mxfp8-source"),
        ("x.weight_scale", np.full((64, 2), 127, np.int8), "mxfp8-source"),
        ("x.weight_scale", np.full((64, 2), 127, np.uint8).view(ml_dtypes.float8_e8m0fnu), "mxfp8-source"),
    ],
)
def test_each_source_is_read_through_its_encoding_class(tmp_path, scale_name, scale, form):
    ckpt = _checkpoint(tmp_path, scale_name, scale)
    try:
        assert ckpt.stored("x.weight", 64, 64).form == form
        np.testing.assert_array_equal(ckpt.dense("x.weight", 64, 64), np.ones((64, 64), np.float32))
    finally:
        ckpt.close()


@pytest.mark.parametrize(
    ("scale_name", "scale", "message"),
    [
        ("x.weight_scale_inv", np.ones((2, 1), np.float32), "tensor x.weight_scale_inv: FP8 scale F32 [2, 1] does "
         "not fit x.weight [64, 64] with 128x128 blocks (expected F32 or BF16 [1, 1])"),
        ("x.weight_scale_inv", np.ones((2, 1), np.float16), "tensor x.weight_scale_inv: FP8 scale F32 [2, 1] does "
         "not fit x.weight [64, 64] with 128x128 blocks (expected F32 or BF16 [1, 1]) (x.weight_scale_inv is "
         "stored as F16)"),
        ("x.weight_scale", np.ones((64, 2), np.float32), "tensor x.weight_scale: FP8 channel scale F32 [64, 2] "
         "does not fit x.weight [64, 64] (expected BF16 or F16 or F32 [64, 1] or [1] or [])"),
    ],
)  # fmt: skip
def test_a_scale_that_does_not_fit_is_the_classes_one_line(tmp_path, scale_name, scale, message):
    ckpt = _checkpoint(tmp_path, scale_name, scale)
    try:
        with pytest.raises(RuntimeModelError) as exc:
            ckpt.stored("x.weight", 64, 64)
        assert str(exc.value) == message
    finally:
        ckpt.close()
