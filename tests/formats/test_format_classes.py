"""Format classes own their format: tensor names, kernel codes, matmul kinds, planar eligibility, the one set of
decode tables, the layout vocabulary and the machine-readable reasons of ResolveError."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from colitools.formats import kernels, layouts, planar, reference, registry, resolver
from colitools.formats.errors import EncodeError, ResolveError, ResolveReason
from colitools.formats.kernels import _jit_bits as _bits
from colitools.formats.registry import (
    FORMATS,
    E8Iq3Lattice,
    Float,
    Fp8E4m3B128,
    Int2Row,
    Int3G64,
    Int4Grouped,
    Int4Row,
    Int8Row,
    MatmulKind,
    Mxfp4,
)


# ------------------------------------------------------------------------------------------- tensor names
@pytest.mark.parametrize(
    ("fmt", "name", "names"),
    [
        (Float, "m.layers.0.mlp.gate.weight", ("m.layers.0.mlp.gate.weight", None)),
        (Int8Row, "a.weight", ("a.weight", "a.weight.qs")),
        (Int4Row, "a.weight", ("a.weight", "a.weight.qs")),
        (Int2Row, "a.weight", ("a.weight", "a.weight.qs")),
        (Int4Grouped, "a.experts.0.up_proj.weight", ("a.experts.0.up_proj.weight", "a.experts.0.up_proj.weight.qs")),
        (Int3G64, "a.weight", ("a.weight", "a.weight.qs")),
        (E8Iq3Lattice, "a.weight", ("a.weight", "a.weight.qs")),
        (Fp8E4m3B128, "a.weight", ("a.weight", "a.weight.qs")),
        (Mxfp4, "a.experts.0.up_proj.weight", ("a.experts.0.up_proj.weight_packed", "a.experts.0.up_proj.weight_scale")),
        (Mxfp4, "lm_head", ("lm_head.weight_packed", "lm_head.weight_scale")),  # no .weight to strip
    ],
)
def test_every_format_class_names_its_tensors(fmt, name, names):
    assert fmt.tensor_names(name) == names


def test_every_registered_format_has_tensor_names_and_formulas():
    for fmt in FORMATS.values():
        weight, scale = fmt.tensor_names("x.weight")
        assert weight.startswith("x") and (scale is None) == (not fmt.quantized)
        assert fmt.weight_formula and fmt.scale_formula and fmt.scale_tensor_label


def test_container_suffixes_are_the_registry_s():
    from colitools.formats import container

    assert container.QS_SUFFIX is registry.QS_SUFFIX
    assert container.PACKED_SUFFIX is registry.PACKED_SUFFIX
    assert container.MX_SCALE_SUFFIX is registry.MX_SCALE_SUFFIX


# ------------------------------------------------------------------------------------------- kernel codes
def test_kernel_codes_are_unique_and_the_kernels_read_them_from_the_classes():
    codes = [f.kernel_code for f in FORMATS.values() if f.kernel_code is not None]
    assert len(codes) == len(set(codes))
    assert (_bits._INT8_ROW, _bits._INT4_ROW, _bits._INT2_ROW) == (0, 1, 2)  # numba cache: codes never move
    assert _bits._INT4_GROUPED == Int4Grouped.kernel_code and _bits._INT3_G64 == Int3G64.kernel_code
    assert _bits._MXFP4 == Mxfp4.kernel_code
    assert not hasattr(_bits, "_FMT_CODES")


def test_writable_formats_are_exactly_those_colitools_encodes():
    assert {f.name for f in FORMATS.values() if f.writable} == {
        "int8-row", "int4-row", "int2-row", "int4-grouped", "int3-g64", "mxfp4",
        "fp8-e4m3-e8m0",  # the numpy reference is its encoder (no kernel code)
        "fp8-e4m3-e8m0-t32", "fp8-e4m3-e8m0-r32",  # the same reference over 32x32 tiles / 1x32 row groups
        "affine4", "affine8",  # MLX-affine (FORMATS §2.12): written only into a QPACK container
    }  # fmt: skip
    w = np.ones((2, 64), np.float32)
    for fmt in (Float, Fp8E4m3B128, E8Iq3Lattice):
        with pytest.raises(EncodeError, match="cannot be written by colitools' encoders"):
            kernels.encode(fmt.name, w, None)


@pytest.mark.parametrize("fmt", [Int8Row, Int4Row, Int2Row, Int3G64, Mxfp4])
def test_kernel_output_shapes_are_the_registry_s(fmt):
    O, I = 3, 96
    codes, scales = kernels.encode(fmt.name, np.ones((O, I), np.float32), None)
    assert codes.shape == fmt.weight_shape(O, I) and scales.shape == fmt.scale_shape(O, I)
    assert scales.dtype == fmt.scale_numpy


def test_kernel_int4_grouped_takes_any_positive_group_size_with_the_registry_grid():
    codes, scales = kernels.encode("int4-grouped", np.ones((2, 10), np.float32), 3)
    assert codes.shape == (2, 5) and scales.shape == Int4Grouped.scale_grid(2, 10, 3) == (2, 4)
    with pytest.raises(Exception, match="not one of"):
        Int4Grouped.scale_shape(2, 10, 3)  # the stored format only knows GROUP_SIZES


# ------------------------------------------------------------------------------------------- one table each
def test_one_e2m1_e8m0_e4m3_table_for_the_whole_code_base():
    from colitools.runtime import kernels as runtime_kernels

    assert _bits._E2M1_F32 is reference.E2M1_SIGNED
    assert _bits._E8M0_F32 is reference.E8M0_TO_F32
    assert _bits.E4M3_TO_F32 is reference.E4M3_TO_F32 and kernels.E4M3_TO_F32 is reference.E4M3_TO_F32
    assert runtime_kernels.MXFP4_LUT is reference.E2M1_SIGNED
    assert runtime_kernels.E8M0_LUT is reference.E8M0_TO_F32
    assert runtime_kernels.E4M3_LUT is reference.E4M3_TO_F32


def test_decode_tables_values():
    assert reference.E2M1_SIGNED.tolist()[:8] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert np.signbit(reference.E2M1_SIGNED[8]) and reference.E2M1_SIGNED[15] == -6.0
    assert reference.E8M0_TO_F32[127] == 1.0 and reference.E8M0_TO_F32[0] == np.float32(2.0**-127)
    assert np.isinf(reference.E8M0_TO_F32[255])
    assert reference.E4M3_TO_F32[0x7E] == 448.0 and np.isnan(reference.E4M3_TO_F32[[0x7F, 0xFF]]).all()


# ------------------------------------------------------------------------------------------- runtime kinds
def test_matmul_kinds_come_from_the_classes():
    assert Int4Row.matmul_kind_of() is Int4Grouped.matmul_kind_of() is MatmulKind.INT4
    assert Int4Row.matmul_kind_of(planar=True) is MatmulKind.INT4_PLANAR
    assert Int8Row.matmul_kind_of(planar=True) is None  # only int4 has a planar kernel
    assert E8Iq3Lattice.matmul_kind is None
    held = {f.matmul_kind for f in FORMATS.values()} | {f.planar_matmul_kind for f in FORMATS.values()}
    assert set(MatmulKind) <= held


@pytest.mark.parametrize(
    ("kind", "gs", "fmt"),
    [("int4", 64, Int4Grouped), ("int4", None, Int4Row), ("int4-planar", 64, Int4Grouped), ("mxfp4", None, Mxfp4),
     ("fp8-e4m3-b128", None, Fp8E4m3B128), ("f32", None, Float), ("e8-iq3-lattice", None, None)],
)  # fmt: skip
def test_matmul_format_is_the_format_a_kernel_kind_holds(kind, gs, fmt):
    assert registry.matmul_format(kind, gs) is fmt


# ------------------------------------------------------------------------------------------- planar
@pytest.mark.parametrize(
    ("fmt", "I", "gs", "ok"),
    [(Int4Row, 128, None, True), (Int4Row, 100, None, False), (Int4Grouped, 128, 64, True),
     (Int4Grouped, 128, 32, False), (Int4Grouped, 96, 64, False), (Int8Row, 128, None, False),
     (Mxfp4, 128, None, False), (Float, 128, None, False)],
)  # fmt: skip
def test_planar_eligibility_is_the_format_s(fmt, I, gs, ok):
    assert fmt.planar_eligible(I, gs) is ok


# ------------------------------------------------------------------------------------------- layouts
def test_one_layout_vocabulary_with_option_and_stored_spellings():
    from colitools.converters import recipe

    assert [(lay.option, lay.stored) for lay in layouts.LAYOUTS] == [
        ("pairs", "pairs"), ("planar", "planar64-v8"), ("qpack", "qpack-v1")]  # fmt: skip
    assert recipe.LAYOUTS == ("pairs", "planar", "qpack") == layouts.OPTION_NAMES
    assert resolver.LAYOUTS == ("pairs", "planar64-v8", "qpack-v1") == layouts.STORED_NAMES
    assert planar.PLANAR_LAYOUT == layouts.PLANAR.stored and resolver.PAIRS_LAYOUT == layouts.PAIRS.stored


def test_format_choice_has_no_keeps_float():
    assert "keeps_float" not in {f.name for f in dataclasses.fields(registry.FormatChoice)}
    assert not hasattr(registry.FormatChoice, "keeps_float")


# ------------------------------------------------------------------------------------------- reasons
@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (lambda: resolver.resolve_format("t", 10, 4, 0, 5), ResolveReason.BAD_SHAPE),
        (lambda: resolver.resolve_format("t", 7, 4, 2, 5), ResolveReason.NO_LAYOUT),
        (lambda: resolver.resolve_format("t", 10, 12, 2, 5), ResolveReason.SCALE_MISMATCH),  # int8 bytes
        (lambda: resolver.resolve_format("t", 6, 12, 2, 10), ResolveReason.SCALE_MISMATCH),  # int2 bytes
        (lambda: resolver.resolve_format("t", 128, 12, 2, 128), ResolveReason.NO_GROUP_SIZE),
        (lambda: resolver.resolve_format("t", 10, 8, 2, 5, "nope"), ResolveReason.UNKNOWN_STAMP),
        (lambda: resolver.resolve_format("t", 10, 8, 2, 5, "int4-row"), ResolveReason.STAMP_MISMATCH),
        (lambda: resolver.resolve_mxfp4("t", 50, 3, 2, 50), ResolveReason.MXFP4_SHAPE),
        (lambda: resolver.resolve_mxfp4("t", 64, 3, 2, 64), ResolveReason.MXFP4_SHAPE),
        (lambda: resolver.stamp_for("t", "int3-g64", 4, 24), ResolveReason.COLLIDES),
        (lambda: resolver.stamp_for("t", "fp8-e4m3-b128", 1, 128, allow_stamp=False), ResolveReason.NEEDS_STAMP),
        (lambda: resolver.stamp_for("t", "int8-row", 4, 64, 64), ResolveReason.BAD_GROUP_SIZE),
        (lambda: resolver.stamp_for("t", "int9", 4, 64), ResolveReason.UNKNOWN_FORMAT),
        (lambda: resolver.check_roundtrip("t", "int8-row", None, 2, 5, None, nb=9, ns=8), ResolveReason.ROUNDTRIP),
        (lambda: resolver.parse_stamps({"colibri.fmt": "[1"}), ResolveReason.BAD_METADATA),
        (lambda: resolver.parse_layout({"colitools.layout": "planar"}), ResolveReason.BAD_METADATA),
        (lambda: registry.detect_group_size(2, 128, 12), ResolveReason.NO_GROUP_SIZE),
    ],
)
def test_resolve_error_carries_a_machine_readable_reason(call, reason):
    with pytest.raises(ResolveError) as info:
        call()
    assert info.value.reason is reason


def test_reason_detail_is_the_message_without_tensor_prefix_and_advice():
    with pytest.raises(ResolveError) as info:
        resolver.stamp_for("blk.0.w", "int3-g64", 4, 24)
    exc = info.value
    assert str(exc) == f"tensor blk.0.w: {exc.detail}; write int8-row instead"
    assert exc.detail == (
        "int3-g64 [4, 24] (weight bytes 96, scale bytes 16) would resolve as int8-row, which no stamp may settle"
    )
    with pytest.raises(EncodeError) as enc:
        Mxfp4.check_encodable(4, 100)
    assert enc.value.reason is ResolveReason.NOT_ENCODABLE and str(enc.value) == f"tensor ?: {enc.value.detail}"


# The fallback reasons the recipe writes into colitools.json, byte for byte as before the reasons were
# structured (computed with the pre-refactor code).
@pytest.mark.parametrize(
    ("option", "O", "I", "fp8", "reason"),
    [
        ("int3-g64", 4, 24, False,
         "int3-g64 [4, 24] (weight bytes 96, scale bytes 16) would resolve as int8-row, which no stamp may settle"),
        ("int3-g64", 4, 48, False,
         "int3-g64 [4, 48] (weight bytes 96, scale bytes 16) would resolve as int4-row, which no stamp may settle"),
        ("mxfp4", 4, 100, False, "mxfp4 needs I % 32 == 0, got I = 100"),
        ("fp8", 128, 256, False,
         "fp8 passthrough needs an FP8 source with 128x128 blocks; the source tensor is BF16"),
        ("fp8", 1, 128, True,
         "fp8-e4m3-b128 [1, 128] (weight bytes 128, scale bytes 4) needs a colibri.fmt stamp (int8-row has the "
         "same bytes), and this tensor may not be stamped"),
        ("int2-row", 4, 2, False,
         "int2-row [4, 2] (weight bytes 4, scale bytes 16) would resolve as int4-row, which no stamp may settle"),
        ("int4-row", 1, 196, False,  # issue 10: colibri's e8 branch refuses an int4-row stamp, resident or not
         "int4-row [1, 196] (weight bytes 98, scale bytes 4) would resolve as e8-iq3-lattice; colibri's e8 "
         "branch accepts no int4-row stamp there"),
    ],
)  # fmt: skip
def test_recipe_fallback_reasons_are_unchanged(option, O, I, fp8, reason):
    from colitools.converters.recipe import Role, SourceKind, choose_target

    source = SourceKind("F8_E4M3", (128, 128)) if fp8 else SourceKind("BF16")
    t = choose_target("m.layers.0.mlp.experts.0.up_proj.weight", Role.EXPERT, option, O, I, source)
    assert t.fmt == "int8-row" and t.fallback is not None
    assert t.fallback.reason == reason
