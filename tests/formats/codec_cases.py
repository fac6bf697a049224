"""The codec property cases, generated from the registry: every writable format (``Format.writable``) x every
source kind an encoder reads (F32, BF16, F16, block-scaled FP8), each fast entry point of ``kernels`` against the
format's numpy reference of the exactly upcast / dequantised values. A format registered later (a test's toy,
``test_toy_format.py``) is a case the moment it is registered: nothing here names a format.

Used by ``test_codecs_properties.py`` (parametrised at collection) and ``test_toy_format.py``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from colitools.formats import kernels
from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError, FormatError
from colitools.formats.format_names import GROUPED_PREFIXES
from colitools.formats.registry import FORMATS, GROUP_SIZES, Format, by_name

F32 = np.float32
MAGNITUDES = [1.0, 0.02, 3e-3, 1e30, 3e38, 1e-30, 1e-40, 1e-44]  # huge, tiny and float32 subnormal scales
SOURCES = ("f32", "bf16", "f16", "fp8")
# a grouped format's group sizes: every reader candidate and odd ones from F32, a few from the fused sources
GROUP_SIZES_BY_SOURCE = {"f32": (*GROUP_SIZES, 2, 6, 5, 7), "bf16": (64, 48, 5), "f16": (64, 48, 5)}
GROUP_SIZES_BY_SOURCE["fp8"] = GROUP_SIZES_BY_SOURCE["bf16"]


def writable_formats() -> list[type[Format]]:
    """The formats colitools' encoders write, by ordinal (read from the registry at each call)."""
    return [FORMATS[o] for o in sorted(FORMATS) if FORMATS[o].writable]


def codec_cases(source: str, group_sizes: tuple[int, ...] | None = None) -> list[tuple[str, int | None]]:
    """``(format name, group size or None)`` for every writable format encoded from ``source``; a format that
    takes only some group sizes (the affine formats: ``GROUPED_PREFIXES``) gets those of ``sizes`` it takes, else
    its first."""
    sizes = group_sizes or GROUP_SIZES_BY_SOURCE[source]
    return [(f.name, g) for f in writable_formats() for g in (_sizes_of(f, sizes) if f.grouped else (None,))]


def _sizes_of(f: type[Format], sizes: tuple[int, ...]) -> tuple[int, ...]:
    if f.pairs:  # int4-grouped's kernels take any positive group size
        return sizes
    legal = GROUPED_PREFIXES[f.name][1]
    return tuple(g for g in sizes if g in legal) or legal[:1]


def case_id(fmt: str, gs: int | None) -> str:
    return fmt if gs is None else f"{fmt}-g{gs}"


def width_step(fmt: str, gs: int | None = None) -> int:
    """The smallest width the format encodes (``check_encodable``): the inputs are drawn as its multiples (mxfp4's
    32, 1 for a row format)."""
    cls = by_name(fmt)
    if not cls.pairs and gs:  # an affine format takes whole groups only
        return gs
    for I in range(1, 1025):
        try:
            cls.check_encodable(1, I)
        except (EncodeError, FormatError):
            continue
        return I
    raise AssertionError(f"{fmt} encodes no width up to 1024")


def reference(fmt: str, w: np.ndarray, gs: int | None):
    """The format's numpy reference encoder (the readable spec) on float32 ``w``."""
    return by_name(fmt)._encode_reference(w, gs)


def assert_same(a, b) -> None:
    (ca, sa), (cb, sb) = a, b
    assert ca.dtype == cb.dtype and sa.dtype == sb.dtype
    assert ca.shape == cb.shape and sa.shape == sb.shape
    assert ca.tobytes() == cb.tobytes()
    assert sa.tobytes() == sb.tobytes()


# --------------------------------------------------------------------------------------------- sources
@st.composite
def weights(draw, max_O: int = 5, max_I: int = 300, multiple: int = 1) -> np.ndarray:
    """Finite float32 ``[O, I]``: Gaussian at a drawn magnitude, per-row mixed magnitudes, exact ties
    (multiples of 1/4), or arbitrary finite bit patterns (subnormals, 3e38 ...); some rows all zero."""
    O = draw(st.integers(1, max_O))
    I = draw(st.integers(1, max_I // multiple)) * multiple
    kind = draw(st.sampled_from(["gauss", "mixed", "ties", "bits"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "gauss":
        w = rng.standard_normal((O, I)) * draw(st.sampled_from(MAGNITUDES))
    elif kind == "mixed":
        scales = rng.choice(MAGNITUDES, size=(O, 1)) * 2.0 ** rng.integers(-20, 20, size=(O, I))
        w = rng.standard_normal((O, I)) * np.minimum(scales, 1e38)
    elif kind == "ties":
        w = rng.integers(-40, 41, size=(O, I)) * 0.25 * draw(st.sampled_from([1.0, 2.0**-130, 2.0**100]))
    else:
        w = rng.integers(0, 2**32, size=(O, I), dtype=np.uint64).astype(np.uint32).view(F32).copy()
        w[~np.isfinite(w)] = 0
    w = np.clip(w, -3.4e38, 3.4e38).astype(F32)  # stay finite after the float32 cast
    if draw(st.booleans()):
        w[rng.random(O) < 0.4] = 0
    return np.ascontiguousarray(w)


@st.composite
def bf16_bits(draw, multiple: int = 1) -> np.ndarray:
    O = draw(st.integers(1, 4))
    I = draw(st.integers(1, max(1, 160 // multiple))) * multiple
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):  # arbitrary finite bf16 bit patterns (subnormals, huge)
        b = rng.integers(0, 2**16, size=(O, I), dtype=np.uint32).astype(np.uint16)
        b[(b & 0x7F80) == 0x7F80] = 0  # exponent all ones: inf / NaN
    else:
        b = (rng.standard_normal((O, I)) * draw(st.sampled_from(MAGNITUDES[:4]))).astype(ml_dtypes.bfloat16)
        b = b.view(np.uint16)
    return np.ascontiguousarray(b)


@st.composite
def f16_bits(draw, multiple: int = 1) -> np.ndarray:
    O = draw(st.integers(1, 4))
    I = draw(st.integers(1, max(1, 160 // multiple))) * multiple
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):  # arbitrary finite half bit patterns: subnormals (exponent 0), -0.0, 65504
        h = rng.integers(0, 2**16, size=(O, I), dtype=np.uint32).astype(np.uint16)
        h[(h & 0x7C00) == 0x7C00] = 0x8000  # exponent all ones (inf / NaN) -> -0.0
    else:
        h = (rng.standard_normal((O, I)) * draw(st.sampled_from([1.0, 0.02, 3e-3, 1e-6]))).astype(np.float16)
        h = h.view(np.uint16)
    return np.ascontiguousarray(h)


@st.composite
def fp8_tensors(draw, multiple: int = 1):
    O = draw(st.integers(1, 6))
    I = draw(st.integers(1, max(1, 160 // multiple))) * multiple
    block = draw(st.sampled_from([(128, 128), (2, 3), (1, 32), (4, 7), (3, 64)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.integers(0, 256, size=(O, I), dtype=np.uint16).astype(np.uint8)
    q[(q & 0x7F) == 0x7F] = 0x38  # no NaN codes here (NaN is tested below)
    grid = (ref.ceil_div(O, block[0]), ref.ceil_div(I, block[1]))
    s = rng.random(grid) * draw(st.sampled_from([1.0, 1e-3, 1e-30, 1e-42, 1e30]))
    s[rng.random(grid) < 0.2] *= -1  # negative and zero scales are legal multipliers
    s[rng.random(grid) < 0.1] = 0
    return q, s.astype(F32), block


# ------------------------------------------------------------------------------------ one case, one source
def check_fast_paths(data, source: str, fmt: str, gs: int | None) -> None:
    """Draw a ``source`` tensor whose width ``fmt`` encodes and assert that every fast entry point for that source
    (both spellings of its dtype) gives the reference's bytes of the exact float32 values; from F32 the
    registry's own fast path (a row format's, or its own kernel: fp8-e4m3-e8m0) as well."""
    step = width_step(fmt, gs)
    if source == "f32":
        w = data.draw(weights(multiple=step, max_I=300 if step == 1 else 10 * step))
        expected = reference(fmt, w, gs)
        assert_same(kernels.encode(fmt, w, gs), expected)
        cls = by_name(fmt)
        if not cls.grouped:  # a grouped one by the writer rule: test_registry_fast_and_reference_paths_agree
            assert_same(cls.encode(w, gs, fast=True), expected)
    elif source == "bf16":
        b = data.draw(bf16_bits(multiple=step))
        expected = reference(fmt, b.view(ml_dtypes.bfloat16).astype(F32), gs)
        assert_same(kernels.encode_from_bf16(fmt, b, gs), expected)
        assert_same(kernels.encode_from_bf16(fmt, b.view(ml_dtypes.bfloat16), gs), expected)
    elif source == "f16":
        h = data.draw(f16_bits(multiple=step))
        expected = reference(fmt, h.view(np.float16).astype(F32), gs)  # numpy's exact upcast
        assert_same(kernels.encode_from_f16(fmt, h, gs), expected)
        assert_same(kernels.encode_from_f16(fmt, h.view(np.float16), gs), expected)
    else:
        q, s, block = data.draw(fp8_tensors(multiple=step))
        if data.draw(st.booleans()):  # sources may ship the scale grid as BF16
            s = s.astype(ml_dtypes.bfloat16)
        expected = reference(fmt, ref.dequant_fp8_block(q, s, block), gs)
        assert_same(kernels.encode_from_fp8_block(fmt, q, s, block, gs), expected)
        e4m3 = q.view(ml_dtypes.float8_e4m3fn)
        assert_same(kernels.encode_from_fp8_block(fmt, e4m3, s, block, gs), expected)
