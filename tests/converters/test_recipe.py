"""The recipe of docs/FORMATS.md §5: roles, names (§4), target formats, fallbacks with reasons, fingerprint."""

from __future__ import annotations

import pytest

from colitools.converters import recipe as rc
from colitools.converters.recipe import Recipe, Role, SourceKind, choose_target
from colitools.errors import ConvertError, ParameterError

BF16 = SourceKind("BF16")
FP8 = SourceKind("F8_E4M3", (128, 128))


@pytest.mark.parametrize(
    ("name", "ndim", "role"),
    [
        ("model.layers.3.mlp.gate.weight", 2, Role.FLOAT),
        ("model.layers.3.block_sparse_moe.gate.weight", 2, Role.FLOAT),
        ("model.layers.3.mlp.shared_expert_gate.weight", 2, Role.FLOAT),
        ("model.layers.3.mlp.gate.e_score_correction_bias", 1, Role.FLOAT),
        ("model.layers.3.input_layernorm.weight", 1, Role.FLOAT),
        ("model.layers.3.self_attn.q_proj.bias", 1, Role.FLOAT),
        ("model.layers.61.mlp.experts.3.gate_proj.weight", 2, Role.MTP),
        ("model.layers.61.embed_tokens.weight", 2, Role.MTP),
        ("model.layers.61.mlp.gate.weight", 2, Role.FLOAT),  # rule 1 beats the MTP rule
        ("model.embed_tokens.weight", 2, Role.EMBED),
        ("lm_head.weight", 2, Role.EMBED),
        ("model.layers.3.mlp.experts.7.down_proj.weight", 2, Role.EXPERT),
        ("model.layers.3.block_sparse_moe.experts.7.w2.weight", 2, Role.EXPERT),
        ("model.layers.3.mlp.experts.gate_up_proj", 3, Role.EXPERT),
        ("model.layers.3.mlp.experts.down_proj", 3, Role.EXPERT),
        ("model.layers.3.mlp.shared_experts.up_proj.weight", 2, Role.DENSE),
        ("model.layers.3.self_attn.indexer.wk.weight", 2, Role.DENSE),
        ("model.layers.3.some.unknown.thing", 2, Role.DENSE),
    ],
)
def test_classify_follows_rule_order(name, ndim, role):
    assert rc.classify(name, ndim, num_hidden_layers=61) is role


def test_classify_puts_a_3d_tensor_that_is_not_an_expert_stack_in_rule_2():
    # issue 11: conv kernels [C, 1, K], A_log of any rank are F32 (docs/FORMATS.md §5 rule 2)
    assert rc.classify("model.layers.0.conv.weight", 3, 4) is Role.FLOAT
    assert rc.classify("model.layers.0.self_attn.A_log", 4, 4) is Role.FLOAT


def test_mtp_rule_needs_num_hidden_layers():
    assert rc.classify("model.layers.61.mlp.experts.0.up_proj.weight", 2, None) is Role.EXPERT


def test_expert_names_order_gate_up_down_for_both_spellings():
    names = ["x.experts.2.down_proj.weight", "x.experts.2.up_proj.weight", "x.experts.2.gate_proj.weight"]
    assert sorted(names, key=lambda n: rc.expert_of(n).order) == names[::-1]
    mixtral = ["m.experts.0.w2.weight", "m.experts.0.w3.weight", "m.experts.0.w1.weight"]
    assert [rc.expert_of(n).proj for n in sorted(mixtral, key=lambda n: rc.expert_of(n).order)] == [
        "w1.weight", "w3.weight", "w2.weight"]  # fmt: skip
    assert rc.expert_of("model.layers.0.mlp.shared_experts.gate_proj.weight") is None


def test_split_fused_names_and_rows():
    gu = rc.split_fused("model.layers.2.mlp.experts.gate_up_proj", (3, 10, 8))
    assert [(s.out_name, s.expert, s.row0, s.row1) for s in gu[:2]] == [
        ("model.layers.2.mlp.experts.0.gate_proj.weight", 0, 0, 5),
        ("model.layers.2.mlp.experts.0.up_proj.weight", 0, 5, 10),
    ]
    assert len(gu) == 6
    down = rc.split_fused("model.layers.2.mlp.experts.down_proj", (3, 8, 5))
    assert [s.out_name for s in down] == [
        f"model.layers.2.mlp.experts.{e}.down_proj.weight" for e in range(3)
    ]
    with pytest.raises(ConvertError, match="even row count"):
        rc.split_fused("a.experts.gate_up_proj", (2, 7, 4))


def test_recipe_defaults_and_group_size():
    r = Recipe.from_options()
    assert (r.experts, r.dense, r.embed, r.mtp, r.layout) == (
        "int4-g64",
        "int8-row",
        "int8-row",
        "int8-row",
        "pairs",
    )
    assert Recipe.from_options(group_size=128).experts == "int4-g128"
    assert Recipe.from_options(experts="int4-g32", group_size=32).experts == "int4-g32"
    with pytest.raises(ConvertError, match="`experts=int4-g32` contradicts `group_size=64`"):
        Recipe.from_options(experts="int4-g32", group_size=64)
    with pytest.raises(ParameterError, match="`dense`: unknown format 'int5'"):
        Recipe.from_options(dense="int5")
    with pytest.raises(ParameterError, match="`group_size=65`"):
        Recipe.from_options(group_size=65)
    with pytest.raises(ParameterError, match="`layout='interleaved'`"):
        Recipe.from_options(layout="interleaved")


def test_fingerprint_changes_with_any_option_and_differences_name_it():
    a, b = Recipe.from_options(), Recipe.from_options(dense="int4-row")
    assert a.fingerprint() == Recipe.from_options().fingerprint()
    assert a.fingerprint() != b.fingerprint()
    assert b.differences(a.as_dict()) == ["`dense=int8-row` (recorded) vs int4-row (now)"]


def test_int4_group_size_follows_the_writer_rule():
    assert choose_target("w", Role.EXPERT, "int4-g64", 8, 256, BF16) == rc.Target("int4-grouped", 64)
    assert choose_target("w", Role.EXPERT, "int4-g64", 8, 96, BF16) == rc.Target("int4-grouped", 48)
    assert choose_target("w", Role.EXPERT, "int4-g64", 8, 64, BF16) == rc.Target("int4-row")
    assert choose_target("w", Role.EXPERT, "int4-g64", 8, 64, BF16).label == "int4-row"


def test_routers_and_float_options():
    assert choose_target("r", Role.FLOAT, "int4-g64", 4, 64, BF16).fmt == "f32"
    assert choose_target("e", Role.EMBED, "bf16", 4, 64, BF16).fmt == "bf16"
    assert choose_target("e", Role.EMBED, "f32", 4, 64, FP8).tensor_names("e") == ("e", None)


def test_mxfp4_names_and_fallback_when_width_is_not_a_multiple_of_32():
    t = choose_target("a.experts.0.up_proj.weight", Role.EXPERT, "mxfp4", 8, 64, BF16)
    assert (t.fmt, t.fallback) == ("mxfp4", None)
    assert t.tensor_names("a.experts.0.up_proj.weight") == (
        "a.experts.0.up_proj.weight_packed", "a.experts.0.up_proj.weight_scale")  # fmt: skip
    fb = choose_target("a.experts.0.down_proj.weight", Role.EXPERT, "mxfp4", 8, 48, BF16)
    assert fb.fmt == "int8-row"
    assert fb.fallback.requested == "mxfp4" and "I % 32" in fb.fallback.reason


@pytest.mark.parametrize("I", [24, 47, 48, 95, 96, 143, 144])
def test_int3_at_a_colliding_width_falls_back_to_int8(I):
    t = choose_target("w", Role.DENSE, "int3-g64", 4, I, BF16)
    assert t.fmt == "int8-row" and t.fallback is not None and "int3-g64" in t.fallback.reason


def test_int3_at_a_free_width_is_kept():
    assert choose_target("w", Role.DENSE, "int3-g64", 4, 128, BF16) == rc.Target("int3-g64")


def test_fp8_passthrough_needs_an_fp8_source_with_128_blocks():
    assert choose_target("w", Role.DENSE, "fp8", 256, 256, FP8) == rc.Target("fp8-e4m3-b128")
    t = choose_target("w", Role.DENSE, "fp8", 256, 256, BF16)
    assert t.fmt == "int8-row" and "BF16" in t.fallback.reason
    t = choose_target("w", Role.DENSE, "fp8", 256, 256, SourceKind("F8_E4M3", (64, 64)))
    assert t.fmt == "int8-row" and "64x64" in t.fallback.reason


def test_ambiguous_fp8_is_stamped_but_an_expert_falls_back():
    # O == nblk: [2, 200] has ceil(2/128) * ceil(200/128) == 2 scale blocks == O row scales.
    assert choose_target("w", Role.DENSE, "fp8", 2, 200, FP8) == rc.Target(
        "fp8-e4m3-b128", stamp="fp8-e4m3-b128"
    )
    t = choose_target("m.experts.0.up_proj.weight", Role.EXPERT, "fp8", 2, 200, FP8)
    assert t.fmt == "int8-row" and t.stamp is None and "stamp" in t.fallback.reason


def test_option_for_roles():
    r = Recipe.from_options(experts="mxfp4", dense="int4-row", embed="bf16", mtp="int3-g64")
    assert [r.option_for(x) for x in Role] == ["source", "source", "f32", "int3-g64", "bf16", "mxfp4", "int4-row"]


def test_one_row_expert_at_width_98_falls_back_to_f32():
    # [1, 98]: mxfp4 needs I % 32 == 0 -> int8-row fallback, whose 98 weight bytes + 4 scale bytes equal
    # e8-iq3-lattice's signature (1 * ceil(98/256) * 98, scale [1]). colibri's routed-expert loader consults
    # no stamp, so a routed expert is never stamped: its int8-row bytes are ambiguous too -> F32 (§3 "Stamps").
    t = choose_target("m.experts.0.up_proj.weight", Role.EXPERT, "mxfp4", 1, 98, BF16)
    assert t.fmt == "f32" and t.stamp is None and t.fallback is not None
    assert t.fallback.written == "f32" and "would need a stamp" in t.fallback.reason
    dense = choose_target("w", Role.DENSE, "mxfp4", 1, 98, BF16)
    assert dense.fmt == "int8-row" and dense.stamp == "int8-row"


def test_rule7_int8_row_stamped_resident_and_f32_for_routed_experts():
    # ceil(8/128) * ceil(4096/128) == 32 == 4 * 8: colibri's UE8M0-FP8 signature (§3 rule 7).
    assert choose_target("w", Role.DENSE, "int8-row", 8, 4096, BF16) == rc.Target(
        "int8-row", stamp="int8-row"
    )
    t = choose_target("m.experts.0.up_proj.weight", Role.EXPERT, "int8-row", 8, 4096, BF16)
    assert t.fmt == "f32" and t.stamp is None and t.fallback.requested == "int8-row"
