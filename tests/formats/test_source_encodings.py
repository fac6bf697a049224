"""The registry of natively quantized source encodings (``formats/source_encodings/``, docs/FORMATS.md §5):
what each class declares, how it reads ``quantization_config`` and recognises its tensors from header entries
alone (as any reader of a source can), which format ``native`` keeps it in (§6), and that its decoder on the
kernels is its numpy reference, bit for bit, and its ``keep`` loses nothing.

Expected values are the spec's (§5, §6) or computed here from the codes and scales the test drew."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import source_encodings as se
from colitools.formats.errors import ConfigError, FormatError
from colitools.formats.registry import Int4Grouped, Int4Row, Mxfp4


@dataclass(frozen=True)
class H:
    """A header entry (dtype, shape): all recognition reads."""

    dtype: str
    shape: tuple[int, ...]


def test_the_registry_holds_the_spec_encodings_in_recognition_order():
    assert list(se.ENCODINGS) == ["fp8", "mxfp4", "mxfp4-pack", "int4", "nvfp4", "mxfp8", "fp8-channel", "fp8-ue8m0",
                                  "fp4-ue8m0"]  # fmt: skip
    # FP8 rides on .scale; MXFP4 pack-quantized before INT4, which claims every other .weight_packed
    assert se.PAIRED == (
        se.Mxfp4Blocks,
        se.Mxfp4PackQuantized,
        se.PackQuantizedInt4,
        se.Nvfp4,
        se.Mxfp8,
        se.Fp8Channel,
        se.Ue8m0Fp8,
        se.Ue8m0Fp4,
    )
    for enc in se.ENCODINGS.values():
        assert enc.parts[0].role == "data" and len({p.role for p in enc.parts}) == len(enc.parts)
        assert se.by_kind(enc.kind) is enc and enc.declared_by
    assert se.quant_methods() == ("fp8", "mxfp4", "compressed-tensors", "modelopt", "mxfp8")
    with pytest.raises(TypeError, match="registered twice"):

        class Again(se.SourceEncoding):  # noqa: F841
            kind, label, parts = "mxfp4", "X", ()


# ------------------------------------------------------------------------------- quantization_config
@pytest.mark.parametrize(
    ("qc", "want"),
    [
        ({"quant_method": "fp8", "weight_block_size": [1, 32]}, se.QuantScheme("fp8", (("fp8", se.Fp8Scheme((1, 32))),))),
        ({"quant_method": "fp8"}, se.QuantScheme("fp8", (("fp8", se.Fp8Scheme((128, 128))),))),
        # transformers' FineGrainedFP8Config(weight_block_size=[1, 32], scale_fmt="ue8m0"): MXFP8 (Inkling-2)
        ({"quant_method": "fp8", "weight_block_size": [1, 32], "scale_fmt": "ue8m0"},
         se.QuantScheme("fp8", (("fp8", se.Fp8Scheme((1, 32))), ("mxfp8", True)))),
        # DeepSeek's power-of-two F32 `_scale_inv` (fp8), or E8M0 `.scale` bytes on the same blocks (fp8-ue8m0)
        ({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
         se.QuantScheme("fp8", (("fp8", se.Fp8Scheme((128, 128))), ("fp8-ue8m0", se.Fp8Scheme((128, 128)))))),
        # DeepSeek-V4.1 Flash: E8M0 `.scale` bytes on 32x32 tiles
        ({"quant_method": "fp8", "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
         se.QuantScheme("fp8", (("fp8", se.Fp8Scheme((32, 32))), ("fp8-ue8m0", se.Fp8Scheme((32, 32)))))),
        ({"quant_method": "mxfp4"}, se.QuantScheme("mxfp4")),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, se.QuantScheme("modelopt")),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "MXFP8"}}, se.QuantScheme("modelopt")),
        (
            {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {
                "num_bits": 4, "type": "int", "group_size": 32, "symmetric": False, "actorder": "group"}}}},
            se.QuantScheme("compressed-tensors", (("int4", se.Int4Scheme(32, False, True)),)),
        ),
        (  # Kimi K3: compressed-tensors' own MXFP4 preset (QuantizationConfig.model_dump); no INT4 weights
            {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "config_groups": {"group_0": {
                "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "symmetric": True,
                "group_size": 32, "strategy": "group", "scale_dtype": "torch.uint8"}}}},
            se.QuantScheme("compressed-tensors", (("int4", se.Int4Scheme()),)),
        ),
        (  # both formats, one per group
            {"quant_method": "compressed-tensors", "config_groups": {
                "a": {"format": "mxfp4-pack-quantized", "weights": {"num_bits": 4, "type": "float", "group_size": 32}},
                "b": {"format": "pack-quantized", "weights": {"num_bits": 4, "type": "int", "group_size": 64}}}},
            se.QuantScheme("compressed-tensors", (("int4", se.Int4Scheme(64)),)),
        ),
        (  # Llama-4-Maverick-17B-128E-Instruct-FP8: FP8 weights per output channel, activations per token
            {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}},
            se.QuantScheme("compressed-tensors", (("int4", se.Int4Scheme()), ("fp8-channel", True))),
        ),
    ],
)  # fmt: skip
def test_each_encoding_reads_its_own_quantization_config(qc, want):
    got = se.read_quant_config({"quantization_config": qc})
    assert got == want
    assert got.fp8 == dict(want.schemes).get("fp8") and got.int4 == dict(want.schemes).get("int4")


@pytest.mark.parametrize(
    ("qc", "words"),
    [
        ({"quant_method": "awq"}, "quant_method 'awq' is not supported (supported: fp8, mxfp4, compressed-tensors, "
                                  "modelopt, mxfp8)"),
        ({"quant_method": "modelopt", "quant_algo": "W4A8"}, "quant_algo 'W4A8' of quant_method 'modelopt' is not "
                                                             "supported (only 'NVFP4', 'MXFP8')"),
        ({"quant_method": "modelopt", "quantization": "NVFP4"}, "quant_algo None of quant_method 'modelopt'"),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "quantization_config.fmt 'e5m2' is not supported (only 'e4m3')"),
        ({"quant_method": "compressed-tensors", "format": "marlin-24"}, "format 'marlin-24' of quant_method "
         "'compressed-tensors' is not supported (only 'pack-quantized', 'mxfp4-pack-quantized', 'float-quantized')"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {
            "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}},
         "float-quantized weights with num_bits 8 type 'float' strategy 'block' are not supported (only 8-bit float "
         "per 'channel' or per 'tensor')"),
        ({"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "config_groups": {"g": {"weights": {
            "num_bits": 4, "type": "float", "group_size": 16}}}},
         "mxfp4-pack-quantized weights with num_bits 4 type 'float' group_size 16 are not supported (only 4-bit "
         "float in groups of 32)"),
        ({"quant_method": "compressed-tensors", "config_groups": ["g"]}, "config_groups is a list, expected an object"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": 4}}},
         "config_groups.g.weights is a int, expected an object"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8}}}},
         "num_bits 8 type 'int' are not supported"),
    ],
)  # fmt: skip
def test_an_unreadable_quantization_config_is_one_config_error(qc, words):
    with pytest.raises(ConfigError) as exc:
        se.read_quant_config({"quantization_config": qc})
    assert words in str(exc.value) and "\n" not in str(exc.value)


# ------------------------------------------------------------------------------------------ recognition
def pair(tensors: dict[str, H], scheme: se.QuantScheme = se.QuantScheme(None)):
    return se.pair_tensors(tensors, scheme)


def test_each_encoding_is_recognised_from_header_entries_alone():
    tensors = {
        "a.experts.gate_up_proj_blocks": H("U8", (2, 8, 2, 16)),
        "a.experts.gate_up_proj_scales": H("U8", (2, 8, 2)),
        "b.weight_packed": H("I32", (4, 12)),  # I = 96, scales [4, 3]: g = 32
        "b.weight_scale": H("BF16", (4, 3)),
        "b.weight_shape": H("I64", (2,)),
        "c.weight": H("U8", (4, 16)),
        "c.weight_scale": H("F8_E4M3", (4, 2)),
        "c.weight_scale_2": H("F32", ()),
        "c.input_scale": H("F32", ()),
        "d.weight": H("F8_E4M3", (4, 40)),
        "d.weight_scale": H("U8", (4, 2)),
        "e.weight": H("F8_E4M3", (4, 40)),  # FP8 block-scaled: not paired
        "e.weight_scale_inv": H("F32", (1, 1)),
        "f.weight": H("BF16", (4, 4)),
        "g.weight_packed": H("U8", (4, 32)),  # MXFP4 pack-quantized: I = 64
        "g.weight_scale": H("U8", (4, 2)),
    }
    paired, consumed = pair(tensors)
    got = {n: (p.encoding, p.shape, p.group, p.exact, p.dropped) for n, p in paired.items()}
    assert got == {
        "a.experts.gate_up_proj": (se.Mxfp4Blocks, (2, 8, 64), 32, True, ()),
        "b.weight": (se.PackQuantizedInt4, (4, 96), 32, True, ()),
        "c.weight": (se.Nvfp4, (4, 32), 16, False, ("c.input_scale",)),
        "d.weight": (se.Mxfp8, (4, 40), 32, False, ()),
        "g.weight": (se.Mxfp4PackQuantized, (4, 64), 32, True, ()),
    }
    assert dict(paired["b.weight"].parts) == {"data": "b.weight_packed", "scale": "b.weight_scale",
                                              "shape": "b.weight_shape"}  # fmt: skip
    assert consumed == set(tensors) - {"e.weight", "e.weight_scale_inv", "f.weight"}


def test_mxfp8_expert_stacks_pair_with_scales_blocked_along_their_last_axis():
    """Inkling-2 as shipped (docs/FORMATS.md §5 "MXFP8 expert stacks"): 3-D ``w13_weight`` / ``w2_weight`` F8_E4M3 stacks with E8M0 scales
    ``[E, A, ceil(B/32)]`` (U8 as shipped, or F8_E8M0), a partial last block allowed; the logical shape is the
    stack's, split per expert later by the family's orientation."""
    tensors = {
        "l.experts.w13_weight": H("F8_E4M3", (8, 128, 64)),
        "l.experts.w13_weight_scale": H("U8", (8, 128, 2)),
        "l.experts.w2_weight": H("F8_E4M3", (8, 64, 96)),
        "l.experts.w2_weight_scale": H("F8_E8M0", (8, 64, 3)),
        "m.weight": H("F8_E4M3", (4, 40)),  # 2-D, partial last block, F8_E8M0 scale
        "m.weight_scale": H("F8_E8M0", (4, 2)),
    }
    paired, consumed = pair(tensors)
    assert {n: (p.encoding, p.shape, p.group, p.exact) for n, p in paired.items()} == {
        "l.experts.w13_weight": (se.Mxfp8, (8, 128, 64), 32, False),
        "l.experts.w2_weight": (se.Mxfp8, (8, 64, 96), 32, False),
        "m.weight": (se.Mxfp8, (4, 40), 32, False),
    }
    assert dict(paired["l.experts.w2_weight"].parts) == {"data": "l.experts.w2_weight",
                                                         "scale": "l.experts.w2_weight_scale"}  # fmt: skip
    assert consumed == set(tensors)
    # a scale of another dtype (F32: not E8M0) is not MXFP8's: the weight is left to the FP8 path, unpaired
    assert pair({"x": H("F8_E4M3", (4, 64)), "x_scale": H("F32", (4, 2))})[0] == {}


def test_mxfp8_decodes_f8_e8m0_scales_as_their_bytes():
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, (6, 40), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    scale = rng.integers(110, 140, (6, 2), dtype=np.uint8)
    want = (
        data.astype(np.float32).reshape(6, 40)
        * np.exp2(np.repeat(scale.astype(np.float64) - 127, 32, axis=1)[:, :40])
    ).astype(np.float32)
    want[np.isnan(data.astype(np.float32))] = np.nan  # e4m3fn 0x7F / 0xFF
    for fast in (False, True):
        for s in (scale, scale.view(ml_dtypes.float8_e8m0fnu)):
            got = se.Mxfp8.decode({"data": data, "scale": s}, 6, 40, fast=fast)
            np.testing.assert_array_equal(got, want)


def test_int4_group_size_and_exactness_come_from_the_config_and_the_companions():
    tensors = {"b.weight_packed": H("I32", (4, 8)), "b.weight_scale": H("F16", (4, 4))}
    assert pair(tensors)[0]["b.weight"].group == 16  # ceil(64 / 4): from the scale grid
    asym = se.QuantScheme("compressed-tensors", (("int4", se.Int4Scheme(16, symmetric=False)),))
    assert not pair(tensors, asym)[0]["b.weight"].exact
    zp = {**tensors, "b.weight_zero_point": H("I32", (1, 4))}
    assert not pair(zp)[0]["b.weight"].exact
    with pytest.raises(FormatError, match=r"tensor b.weight_scale: INT4 scale F16 \[4, 4\] does not fit b.weight_packed \[4, 8\] with group size 32 "
                       r"\(expected BF16 or F16 or F32 \[4, 2\]\)"):
        pair(tensors, se.QuantScheme("compressed-tensors", (("int4", se.Int4Scheme(32)),)))


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"x_blocks": H("U8", (4, 2, 16))}, "tensor x_blocks: MXFP4 blocks without its x_scales"),
        ({"x_blocks": H("U8", (4, 2, 16)), "x_scales": H("U8", (4, 3))},
         "tensor x_scales: MXFP4 scale U8 [4, 3] does not fit x_blocks [4, 2, 16] (expected U8 [4, 2])"),
        ({"x_scales": H("U8", (4, 2))}, "tensor x_scales: companion without its weight x_blocks"),
        ({"x.weight_shape": H("I64", (2,))}, "tensor x.weight_shape: companion without its weight x.weight_packed"),
        ({"x.weight_packed": H("I32", (4, 2))}, "tensor x.weight_packed: packed INT4 weight without its "
                                                "x.weight_scale"),
        ({"x.weight_packed": H("I8", (4, 2)), "x.weight_scale": H("BF16", (4, 1))},
         "tensor x.weight_packed: packed INT4 weight I8 [4, 2] (expected I32 [O, I/8])"),
        ({"x.weight_packed": H("U8", (4, 32)), "x.weight_scale": H("BF16", (4, 2))},  # U8 codes, float scales
         "tensor x.weight_packed: packed INT4 weight U8 [4, 32] (expected I32 [O, I/8])"),
        ({"x.weight_packed": H("U8", (4, 32)), "x.weight_scale": H("U8", (4, 3))},
         "tensor x.weight_scale: MXFP4 scale U8 [4, 3] does not fit x.weight_packed [4, 32] (expected U8 [4, 2])"),
        ({"x.weight_packed": H("U8", (4, 8)), "x.weight_scale": H("U8", (4, 1))},
         "tensor x.weight_packed: MXFP4 weight [4, 8] holds I = 16, not a multiple of 32"),
        ({"x": H("U8", (4, 16)), "x_scale": H("F8_E4M3", (4, 3)), "x_scale_2": H("F32", ())},
         "tensor x_scale: NVFP4 scale F8_E4M3 [4, 3] does not fit x [4, 16] (expected F8_E4M3 [4, 2])"),
        ({"x": H("U8", (4, 16)), "x_scale": H("F8_E4M3", (4, 2)), "x_scale_2": H("F32", (2,))},
         "tensor x_scale_2: NVFP4 scale_2 F32 [2] (expected F32 scalar)"),
        ({"x": H("F8_E4M3", (4, 40)), "x_scale": H("U8", (4, 1))},
         "tensor x_scale: MXFP8 scale U8 [4, 1] does not fit x [4, 40] (expected U8 or F8_E8M0 [4, 2])"),
        ({"x.w2_weight": H("F8_E4M3", (8, 64, 96)), "x.w2_weight_scale": H("U8", (8, 64, 2))},
         "tensor x.w2_weight_scale: MXFP8 scale U8 [8, 64, 2] does not fit x.w2_weight [8, 64, 96] (expected U8 or "
         "F8_E8M0 [8, 64, 3])"),
        ({"x.w2_weight": H("F8_E4M3", (8, 64, 96)), "x.w2_weight_scale": H("U8", (8, 3))},
         "tensor x.w2_weight_scale: MXFP8 scale U8 [8, 3] does not fit x.w2_weight [8, 64, 96] (expected U8 or "
         "F8_E8M0 [8, 64, 3])"),
        ({"x": H("F8_E4M3", (2, 4, 40, 8)), "x_scale": H("F8_E8M0", (2, 4, 40, 1))},
         "tensor x: MXFP8 weight F8_E4M3 [2, 4, 40, 8] (expected F8_E4M3 [O, I] or [E, O, I])"),
        ({"x_blocks": H("U8", (4, 2, 16)), "x_scales": H("U8", (4, 2)), "x": H("BF16", (4, 64))},
         "tensor x_blocks: its decoded name x is also a tensor of the source"),
    ],
)  # fmt: skip
def test_companions_that_do_not_fit_are_one_line_naming_both(tensors, message):
    with pytest.raises(FormatError) as exc:
        pair(tensors)
    assert str(exc.value) == message


# ------------------------------------------------------------------------------------------ native forms
@pytest.mark.parametrize(
    ("enc", "O", "I", "kw", "want"),
    [
        (se.Mxfp4Blocks, 8, 64, {}, se.NativeForm("mxfp4", copies=True)),
        (se.Mxfp4PackQuantized, 8, 64, {}, se.NativeForm("mxfp4", copies=True)),
        (se.PackQuantizedInt4, 8, 64, {"group": 32}, se.NativeForm("int4-grouped", 32, copies=True)),
        (se.PackQuantizedInt4, 8, 64, {"group": 128}, se.NativeForm("int4-row", copies=True)),  # I <= g
        (se.PackQuantizedInt4, 8, 96, {"group": 64}, se.NativeForm(
            "int8-row", fallback="INT4 group size 64 at I = 96 would not resolve back as int4-grouped; decoded")),
        (se.PackQuantizedInt4, 8, 64, {"group": 32, "exact": False},
         se.NativeForm(decoded="asymmetric or act-order INT4 source")),
        (se.Nvfp4, 8, 64, {}, se.NativeForm(decoded="NVFP4 source")),
        (se.Mxfp8, 8, 64, {}, se.NativeForm(decoded="MXFP8 source")),
        (se.Fp8Block, 256, 256, {"block": (128, 128)}, se.NativeForm("fp8-e4m3-b128")),
        (se.Fp8Block, 256, 256, {"block": (128, 128), "fused": True}, se.NativeForm()),
        (se.Fp8Block, 256, 256, {"block": (1, 32)}, se.NativeForm()),
        # DeepSeek's UE8M0 FP8 by its grid (rows, inputs per scale byte, Paired.rows): V4.1's tiles and engram rows
        (se.Ue8m0Fp8, 64, 64, {"group": 32, "block": (32, 32)}, se.NativeForm("fp8-e4m3-e8m0-t32", copies=True)),
        (se.Ue8m0Fp8, 64, 64, {"group": 32, "block": (1, 32)}, se.NativeForm("fp8-e4m3-e8m0-r32", copies=True)),
        (se.Ue8m0Fp8, 256, 256, {"group": 128, "block": (128, 128)},
         se.NativeForm("fp8-e4m3-e8m0", copies=True)),
        (se.Ue8m0Fp8, 256, 256, {"group": 64, "block": (64, 64)}, se.NativeForm(decoded="FP8 UE8M0 source")),
        (se.Ue8m0Fp8, 64, 64, {"group": 32, "block": (32, 32), "fused": True},
         se.NativeForm(decoded="FP8 UE8M0 source")),
    ],
)  # fmt: skip
def test_native_keeps_what_a_registered_format_holds_exactly(enc, O, I, kw, want):
    form = enc.native_form(O, I, **kw)
    assert form == want
    assert form.option == {"mxfp4": "mxfp4", "int4-grouped": f"int4-g{kw.get('group')}", "int4-row": "int4-row",
                           "int8-row": "int8-row", "fp8-e4m3-b128": "fp8", "fp8-e4m3-e8m0": "fp8-e8m0",
                           "fp8-e4m3-e8m0-t32": "fp8-e8m0-t32", "fp8-e4m3-e8m0-r32": "fp8-e8m0-r32",
                           None: None}[want.fmt]  # fmt: skip


# ----------------------------------------------------------------------------------- decoders and keep
E4M3 = ml_dtypes.float8_e4m3fn


def parts_of(enc: type[se.SourceEncoding], rng, O: int, I: int) -> dict[str, np.ndarray]:
    u8 = lambda *shape: rng.integers(0, 256, shape, dtype=np.uint8)  # noqa: E731
    if enc is se.Mxfp4Blocks:
        return {"data": u8(O, I // 32, 16), "scale": rng.integers(100, 150, (O, I // 32), dtype=np.uint8)}
    if enc is se.Mxfp4PackQuantized:
        return {"data": u8(O, I // 2), "scale": rng.integers(100, 150, (O, I // 32), dtype=np.uint8)}
    if enc is se.PackQuantizedInt4:
        data = rng.integers(-(2**31), 2**31, (O, I // 8), dtype=np.int64).astype(np.int32)
        return {"data": data, "scale": rng.random((O, I // 32)).astype(ml_dtypes.bfloat16)}
    if enc is se.Nvfp4:
        return {
            "data": u8(O, I // 2),
            "scale": u8(O, I // 16).view(E4M3),
            "scale_2": np.array(0.25, np.float32),
        }
    if enc is se.Mxfp8:
        return {"data": u8(O, I).view(E4M3), "scale": rng.integers(100, 150, (O, I // 32), dtype=np.uint8)}
    if enc is se.Fp8Channel:  # one BF16 scale per output row
        return {"data": u8(O, I).view(E4M3), "scale": rng.random((O, 1)).astype(ml_dtypes.bfloat16)}
    if enc is se.Ue8m0Fp8:  # 32x32 tiles, the last row of tiles partial
        return {"data": u8(O, I).view(E4M3), "scale": rng.integers(100, 150, (-(-O // 32), I // 32), dtype=np.uint8)}
    if enc is se.Ue8m0Fp4:
        return {"data": u8(O, I // 2).view(np.int8), "scale": rng.integers(100, 150, (O, I // 32), dtype=np.uint8)}
    return {"data": u8(O, I).view(E4M3), "scale": rng.random((-(-O // 128), -(-I // 128))).astype(np.float32)}


@pytest.mark.parametrize("enc", list(se.ENCODINGS.values()), ids=list(se.ENCODINGS))
def test_every_decoder_on_the_kernels_is_its_reference(enc):
    rng = np.random.default_rng(7)
    O, I = 130, 256
    parts = parts_of(enc, rng, O, I)
    kw = {"group": 32, "block": (128, 128)}
    fast = enc.decode(parts, O, I, fast=True, **kw)
    slow = enc.decode(parts, O, I, fast=False, **kw)
    assert fast.dtype == slow.dtype == np.float32 and fast.shape == (O, I)
    assert fast.tobytes() == slow.tobytes()


def test_keep_loses_nothing():
    rng = np.random.default_rng(3)
    O, I = 6, 64
    mx = parts_of(se.Mxfp4Blocks, rng, O, I)
    codes, scales = se.Mxfp4Blocks.keep(mx, O, I, None, name="w")
    want = se.Mxfp4Blocks.decode(mx, O, I, fast=False)
    assert Mxfp4.decode(codes, scales, O, I).tobytes() == want.tobytes()
    q = parts_of(se.PackQuantizedInt4, rng, O, I)
    codes, scales = se.PackQuantizedInt4.keep(q, O, I, 32, name="w")
    want = se.PackQuantizedInt4.decode(q, O, I, group=32, fast=False)
    assert Int4Grouped.decode(codes, scales, O, I, 32).tobytes() == want.tobytes()
    one = {"data": q["data"][:, :1], "scale": q["scale"][:, :1]}  # I = 8 in one group: int4-row
    codes, scales = se.PackQuantizedInt4.keep(one, O, 8, None, name="w")
    want = se.PackQuantizedInt4.decode(one, O, 8, group=8, fast=False)
    assert scales.shape == (O,) and Int4Row.decode(codes, scales, O, 8).tobytes() == want.tobytes()
    mx["scale"][2, 1] = 0xFF
    with pytest.raises(FormatError, match=r"tensor w: E8M0 scale byte 0xFF \(NaN\) in an MXFP4 source"):
        se.Mxfp4Blocks.keep(mx, O, I, None, name="w")


def test_mxfp4_pack_quantized_keep_is_the_mxfp4_format_byte_for_byte():
    """compressed-tensors mxfp4-pack-quantized ``weight_packed`` / ``weight_scale`` are mxfp4's own tensors
    (docs/FORMATS.md §2.7: ``<base>.weight_packed`` U8 ``[O, I/2]``, low nibble = even column, ``weight_scale``
    U8 E8M0 ``[O, I/32]``): ``keep`` returns the same bytes, which mxfp4 decodes to the source's values."""
    rng = np.random.default_rng(5)
    O, I = 6, 96
    mx = parts_of(se.Mxfp4PackQuantized, rng, O, I)
    codes, scales = se.Mxfp4PackQuantized.keep(mx, O, I, None, name="w")
    assert codes.tobytes() == mx["data"].tobytes() and scales.tobytes() == mx["scale"].tobytes()
    assert codes.shape == Mxfp4.weight_shape(O, I) and scales.shape == Mxfp4.scale_grid(O, I)
    want = se.Mxfp4PackQuantized.decode(mx, O, I, fast=False)
    assert Mxfp4.decode(codes, scales, O, I).tobytes() == want.tobytes()
    # byte 0x2F with scale byte 0x7E (2^-1): low nibble 15 = -6.0, high nibble 2 = 1.0 -> -3.0, 0.5 (§5)
    one = {"data": np.full((1, 16), 0x2F, np.uint8), "scale": np.array([[0x7E]], np.uint8)}
    assert se.Mxfp4PackQuantized.decode(one, 1, 32, fast=False)[0, :2].tolist() == [-3.0, 0.5]
    mx["scale"][0, 2] = 0xFF
    with pytest.raises(FormatError, match=r"tensor w: E8M0 scale byte 0xFF \(NaN\) in an MXFP4 source"):
        se.Mxfp4PackQuantized.keep(mx, O, I, None, name="w")


def test_int4_weight_shape_is_checked_against_the_codes():
    se.PackQuantizedInt4.check_parts("w", {"shape": np.array([4, 64])}, (4, 64))
    with pytest.raises(
        FormatError, match=r"tensor w: weight_shape \[4, 60\] does not match its packed codes"
    ):
        se.PackQuantizedInt4.check_parts("w", {"shape": np.array([4, 60])}, (4, 64))


@pytest.mark.parametrize(
    ("O", "I", "scale_shape", "fmt", "rows"),
    [(40, 64, (2, 2), "fp8-e4m3-e8m0-t32", 32), (40, 64, (40, 2), "fp8-e4m3-e8m0-r32", 1)],
)
def test_ue8m0_fp8_pairs_carry_their_grid_and_keep_their_bytes(O, I, scale_shape, fmt, rows):
    """``pair`` records the grid (``Paired.rows``) that ``native_form`` keeps; ``keep`` is the source's codes and
    E8M0 bytes, which the registry format decodes to the source's own values; a 0xFF (NaN) byte is refused."""
    from colitools.formats.registry import by_name

    rng = np.random.default_rng(O + I + rows)
    codes = rng.integers(0, 0x7E, (O, I), dtype=np.uint8)
    scale = rng.integers(100, 150, scale_shape, dtype=np.uint8)
    headers = {"w.weight": H("F8_E4M3", (O, I)), "w.scale": H("F8_E8M0", scale_shape)}
    p = se.Ue8m0Fp8.pair("w.weight", headers, se.Fp8Scheme((32, 32)))
    assert (p.rows, p.group, p.exact, p.shape) == (rows, 32, True, (O, I))
    assert se.Ue8m0Fp8.native_form(O, I, group=p.group, block=(p.rows, p.group)).fmt == fmt
    parts = {"data": codes.view(E4M3), "scale": scale.view(ml_dtypes.float8_e8m0fnu)}
    kept_codes, kept_scale = se.Ue8m0Fp8.keep(parts, O, I, None, name="w.weight")
    assert kept_codes.tobytes() == codes.tobytes() and kept_scale.tobytes() == scale.tobytes()
    want = se.Ue8m0Fp8.decode(parts, O, I, group=p.group, fast=False)
    assert by_name(fmt).decode(kept_codes, kept_scale, O, I).tobytes() == want.tobytes()
    scale[0, 0] = 0xFF
    with pytest.raises(FormatError, match="w.weight.*0xFF"):
        se.Ue8m0Fp8.keep({"data": parts["data"], "scale": scale}, O, I, None, name="w.weight")
