"""What adding a format takes (docs/INTERNALS.md "How to add"), shown by adding one here: ``int6-row``, a toy row
format (6-bit codes ``q + 32``, four to three bytes LSB first, one F32 scale per row ``s = max(amax / 31, 1e-8)``,
``q = clip(rint(w / s), -32, 31)``), with a numpy reference codec and no kernel. It is what a new format would put
in ``formats/registry.py`` (the class: ordinal, name, ``BYTE_TABLE`` row, ``byte_rank``, scale geometry,
``writable``) and ``formats/reference.py`` (the codec; here beside the class), registered for one test and removed
after it. Nothing else is edited, and:

* it resolves from its own byte counts at its ``byte_rank`` (after int3-g64: where its bytes coincide with one of
  colibri's formats', colibri's wins and the writer refuses it);
* with the kernels on (``SMALL_ELEMS = 0``) every encode path (F32, BF16, F16, block-scaled FP8; the registry's,
  the converter's ``encode_job``) writes its reference's bytes of the exact values: a format without a
  ``kernel_code`` is never run on another format's kernel;
* the generated codec property tests (``codec_cases.py``) take it as a case the moment it is registered."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from codec_cases import SOURCES, assert_same, check_fast_paths, codec_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colitools.converters import unit_writer
from colitools.formats import kernels, registry
from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError, ResolveError, ResolveReason
from colitools.formats.kernels import _dispatch, encoders
from colitools.formats.quantizers import RTN
from colitools.formats.resolver import Resolved, check_roundtrip, resolve_format, stamp_for

F32 = np.float32
NAME, ORD, QMAX = "int6-row", 150, 31  # a private ordinal (colibri's are below 100)


def encode_int6_row(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    O, I = w.shape
    s = np.maximum(np.abs(w).max(axis=1, initial=F32(0)) / F32(QMAX), F32(1e-8)).astype(F32)
    q = np.clip(np.rint(w / s[:, None]), -QMAX - 1, QMAX).astype(np.int32) + QMAX + 1
    q = np.pad(q, ((0, 0), (0, -I % 4)), constant_values=QMAX + 1).reshape(O, -1, 4)  # padding: value 0
    bits = q[..., 0] | q[..., 1] << 6 | q[..., 2] << 12 | q[..., 3] << 18
    codes = np.stack([bits & 0xFF, bits >> 8 & 0xFF, bits >> 16], axis=-1).astype(np.uint8)
    return codes.reshape(O, -1), s


def decode_int6_row(codes: np.ndarray, scales: np.ndarray, O: int, I: int) -> np.ndarray:
    b = np.asarray(codes, np.int32).reshape(O, -1, 3)
    bits = b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16
    q = np.stack([bits >> k & 63 for k in (0, 6, 12, 18)], axis=-1).reshape(O, -1)[:, :I] - QMAX - 1
    return (q * np.asarray(scales, F32).reshape(O, 1)).astype(F32)


@pytest.fixture
def int6_row(monkeypatch):
    """The toy format, registered (``Format.__init_subclass__``) for one test, then removed."""
    monkeypatch.setitem(registry.BYTE_TABLE, NAME, (4, 3))

    class Int6Row(registry.Format):
        ord = ORD
        name = NAME
        byte_rank = (50, 0)  # after int3-g64 (40): colibri's formats first where the bytes coincide
        weight_formula = "O * ceil(I/4) * 3"
        scale_formula = "O * 4"
        writable = True
        rowwise_scales = True

        @classmethod
        def scale_grid(cls, O, I, gs=None):
            return (O,)

        @classmethod
        def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
            return encode_int6_row(w)

        @classmethod
        def decode(cls, codes, scales, O, I, gs=None):
            return decode_int6_row(codes, scales, O, I)

    try:
        yield Int6Row
    finally:
        del registry.FORMATS[ORD], registry._BY_NAME[NAME]


@pytest.fixture
def kernels_on(monkeypatch):
    """No small-tensor shortcut and no start-up budget: every format with a kernel runs on it."""
    monkeypatch.setattr(_dispatch, "SMALL_ELEMS", 0)
    assert not _dispatch._reference_encodes("int8-row", 1 << 20)


def test_it_resolves_from_its_own_bytes_at_its_rank(int6_row):
    assert registry.ranked()[-2:] == (registry.Int3G64, int6_row)
    O, I = 1024, 1024
    nb, ns = int6_row.weight_nbytes(O, I), int6_row.scale_nbytes(O, I)
    assert (nb, ns) == (O * 768, O * 4)
    assert resolve_format("t", nb, ns, O, I) == Resolved(ORD, NAME)
    assert stamp_for("t", NAME, O, I) is None and check_roundtrip("t", NAME, None, O, I, None, nb=nb, ns=ns)
    with pytest.raises(ResolveError, match=f"{NAME} {nb}") as info:  # the layouts listed include it
        resolve_format("t", nb + 1, ns, O, I)
    assert info.value.reason is ResolveReason.NO_LAYOUT
    # at I = 3 its bytes are int8-row's (3 per row, one F32 scale): int8-row ranks first, the writer refuses it
    assert resolve_format("t", 8 * 3, 8 * 4, 8, 3) == Resolved(registry.Int8Row.ord, "int8-row")
    with pytest.raises(ResolveError) as info:
        stamp_for("t", NAME, 8, 3)
    assert info.value.reason is ResolveReason.COLLIDES


def _sources(w: np.ndarray):
    """``(source kind, the fast encode of it, the exact float32 values)`` for the four kinds an encoder reads."""
    b = w.astype(ml_dtypes.bfloat16)
    h = w.astype(np.float16)
    q = np.clip(w / np.abs(w).max() * 448, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    grid = (np.random.default_rng(1).random((8, 8)) + 0.5).astype(F32)
    return [
        ("f32", lambda: kernels.encode(NAME, w, None), w),
        ("bf16", lambda: kernels.encode_from_bf16(NAME, b, None), b.astype(F32)),
        ("f16", lambda: kernels.encode_from_f16(NAME, h, None), h.astype(F32)),
        (
            "fp8",
            lambda: kernels.encode_from_fp8_block(NAME, q, grid, 128, None),
            ref.dequant_fp8_block(q, grid, (128, 128)),
        ),
    ]


def test_every_encode_path_writes_the_reference_bytes_with_the_kernels_on(int6_row, kernels_on):
    w = (np.random.default_rng(0).standard_normal((1024, 1024)) * 0.02).astype(F32)
    for source, fast, exact in _sources(w):
        codes, scales = fast()
        assert_same((codes, scales), encode_int6_row(exact)), source
        err = np.abs(int6_row.decode(codes, scales, 1024, 1024) - exact)
        assert np.all(err <= scales[:, None] * F32(0.5 + 1e-6)), source  # half a step: the right scales
    assert_same(int6_row.encode(w, fast=True), encode_int6_row(w))
    with pytest.raises(EncodeError, match="no row kernel"):  # the always-kernel encoders refuse it
        encoders.encode(NAME, w, None)


def _job(values: np.ndarray) -> SimpleNamespace:
    """The fields of a ``TensorJob`` that ``unit_writer.encode_job`` reads for a plain source weight."""
    target = SimpleNamespace(
        is_source=False, is_passthrough=False, is_float=False, format_class=registry.by_name(NAME),
        fmt=NAME, gs=None, quantizer=RTN,
    )  # fmt: skip
    source = SimpleNamespace(quant=None, dtype=str(values.dtype))
    return SimpleNamespace(target=target, source=source, out_name="w", fused_rows=None, shape=values.shape)


def test_the_converter_writes_the_reference_bytes_with_the_kernels_on(int6_row, kernels_on):
    w = (np.random.default_rng(2).standard_normal((512, 768)) * 0.02).astype(F32)
    b = w.astype(ml_dtypes.bfloat16)
    q = np.clip(w * 2e4, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    grid = np.full((4, 6), 5e-5, F32)
    for values, scale, exact in (
        (w, None, w),
        (b, None, b.astype(F32)),
        (q, grid, ref.dequant_fp8_block(q, grid, (128, 128))),
    ):
        block = (128, 128) if scale is not None else None
        got = unit_writer.encode_job(_job(values), values, scale, block, planar=False)
        assert_same(got, encode_int6_row(exact))


@pytest.mark.parametrize("source", SOURCES)
def test_the_generated_codec_property_tests_take_it(int6_row, kernels_on, source):
    assert (NAME, None) in codec_cases(source)

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def prop(data):
        check_fast_paths(data, source, NAME, None)

    prop()
