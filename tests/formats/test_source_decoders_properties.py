"""Property tests: the fast source decoders (``kernels/decoders.py`` on ``_jit_decoders.py``) are bit-identical to the numpy
reference decoders of the natively quantized sources (``reference.decode_*``), for arbitrary bytes (every
nibble, every E8M0 / e4m3 byte including NaN and 0xFF), and the lossless native repackings keep every value."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colitools.formats import reference as ref
from colitools.formats.kernels import decoders as fast


@pytest.fixture(autouse=True)
def _on_both_kinds_of_kernel(kernel_drivers):
    """Every case runs on the kernels compiled ahead of time and on numba's JIT (tests/conftest.py)."""


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def arrays(draw, shape, dtype=np.uint8, lo=0, hi=255):
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).integers(lo, hi + 1, shape, dtype=np.int64).astype(dtype)


@given(st.data(), st.integers(0, 3), st.integers(1, 6), st.integers(1, 4), st.booleans())
@SETTINGS
def test_mxfp4_blocks_kernel_is_reference(data, E, O, B, narrow):
    draw = data.draw
    blocks = arrays(draw, (E, O, B, 16))
    scales = arrays(draw, (E, O, B), lo=110 if narrow else 0, hi=140 if narrow else 255)
    same_bits(fast.decode_mxfp4_blocks(blocks, scales), ref.decode_mxfp4_blocks(blocks, scales))
    # the native repacking is the same bytes: decoding it as the mxfp4 format gives the same values
    packed = ref.mxfp4_blocks_to_packed(blocks).reshape(-1, B * 16)
    with np.errstate(invalid="ignore", over="ignore"):  # E8M0 0xFF: inf / NaN
        got = ref.decode_mxfp4(packed, scales.reshape(-1, B), E * O, B * 32)
    same_bits(got.reshape(E, O, B * 32), ref.decode_mxfp4_blocks(blocks, scales))


@given(st.data(), st.integers(1, 6), st.integers(1, 80), st.sampled_from([8, 16, 32, 64, 128]),
       st.sampled_from(["F32", "BF16", "F16"]))  # fmt: skip
@SETTINGS
def test_pack_quantized_kernel_is_reference(data, O, I, g, sdtype):
    draw = data.draw
    packed = arrays(draw, (O, -(-I // 8)), np.int64, -(2**31), 2**31 - 1).astype(np.int32)
    dt = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "F16": np.float16}[sdtype]
    seed = draw(st.integers(0, 2**32 - 1))
    scale = np.random.default_rng(seed).standard_normal((O, -(-I // g))) * 10.0 ** draw(st.integers(-30, 4))
    scale = scale.astype(np.float32).astype(dt)
    want = ref.decode_pack_quantized(packed, scale, I, g)
    same_bits(fast.decode_pack_quantized(packed, scale, I, g), want)
    # native: the pairs bytes + F32-widened scales decode (int4-grouped rule) to the same values
    pairs = ref.int32_nibbles_to_pairs(packed, I)
    v = ref.unpack_int4_pairs(pairs, O, I).astype(np.float32)
    s = np.repeat(scale.astype(np.float32), g, axis=1)[:, :I]
    same_bits(v * s, want)


@given(st.data(), st.integers(1, 6), st.integers(1, 5), st.booleans())
@SETTINGS
def test_nvfp4_kernel_is_reference(data, O, B, odd):
    draw = data.draw
    I = B * 16 - (1 if odd else 0)
    packed = arrays(draw, (O, B * 8))
    scale = arrays(draw, (O, B))
    s2 = np.array(draw(st.floats(float(np.float32(1e-6)), 1e3, width=32)), dtype=np.float32)
    same_bits(fast.decode_nvfp4(packed, scale, s2, I), ref.decode_nvfp4(packed, scale, s2, I))


@given(st.data(), st.integers(1, 6), st.integers(1, 100))
@SETTINGS
def test_mxfp8_kernel_is_reference(data, O, I):
    draw = data.draw
    q = arrays(draw, (O, I))
    scale = arrays(draw, (O, -(-I // 32)))
    same_bits(fast.decode_mxfp8(q, scale, I), ref.decode_mxfp8(q, scale, I))
