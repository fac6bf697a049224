"""The tensor-name map: every spelling of its tables parses as pinned, builders round-trip, roots are transparent."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colitools.formats import names
from colitools.formats.names import TensorRole as R
from colitools.formats.names import (
    canonical_name,
    expert_tensor_name,
    layer_path,
    module_path,
    natural_key,
    parse_name,
    stack_name,
)


def fields(name: str) -> tuple:
    p = parse_name(name)
    return (p.root, p.layer_prefix, p.layer, p.module, p.expert, p.leaf, p.projection, p.role, p.suffix)


CASES = [
    # projections (PROJECTIONS), per expert
    ("model.layers.3.mlp.experts.7.gate_proj.weight",
     ("model.", "model.layers", 3, "mlp.experts", 7, "gate_proj", "gate", R.EXPERT, "weight")),
    ("model.layers.3.mlp.experts.7.up_proj.weight",
     ("model.", "model.layers", 3, "mlp.experts", 7, "up_proj", "up", R.EXPERT, "weight")),
    ("model.layers.3.mlp.experts.7.down_proj.weight",
     ("model.", "model.layers", 3, "mlp.experts", 7, "down_proj", "down", R.EXPERT, "weight")),
    ("model.layers.1.block_sparse_moe.experts.5.w1.weight",
     ("model.", "model.layers", 1, "block_sparse_moe.experts", 5, "w1", "gate", R.EXPERT, "weight")),
    ("model.layers.1.block_sparse_moe.experts.5.w3.weight",
     ("model.", "model.layers", 1, "block_sparse_moe.experts", 5, "w3", "up", R.EXPERT, "weight")),
    ("model.layers.1.block_sparse_moe.experts.5.w2.weight",
     ("model.", "model.layers", 1, "block_sparse_moe.experts", 5, "w2", "down", R.EXPERT, "weight")),
    ("model.layers.1.block_sparse_moe.experts.5.w1",
     ("model.", "model.layers", 1, "block_sparse_moe.experts", 5, "w1", "gate", R.EXPERT, "")),
    # suffixes of a per-expert tensor: everything after its leaf
    ("model.layers.3.mlp.experts.7.gate_proj.weight.qs",
     ("model.", "model.layers", 3, "mlp.experts", 7, "gate_proj", "gate", R.EXPERT, "weight.qs")),
    ("model.layers.3.mlp.experts.7.gate_proj.weight_packed",
     ("model.", "model.layers", 3, "mlp.experts", 7, "gate_proj", "gate", R.EXPERT, "weight_packed")),
    ("model.layers.0.mlp.experts.2.down_proj.weight_scale_inv",
     ("model.", "model.layers", 0, "mlp.experts", 2, "down_proj", "down", R.EXPERT, "weight_scale_inv")),
    ("model.layers.0.mlp.experts.7.w1_extra.weight",
     ("model.", "model.layers", 0, "mlp.experts", 7, "w1_extra", None, R.EXPERT, "weight")),
    # merged per-expert blobs (MERGED_EXPERTS) and their scales
    ("model.layers.3.mlp.experts.7.merged_weight",
     ("model.", "model.layers", 3, "mlp.experts", 7, "merged_weight", "gate_up_down", R.EXPERT, "")),
    ("model.layers.3.mlp.experts.7.qs",
     ("model.", "model.layers", 3, "mlp.experts", 7, "qs", None, R.EXPERT, "")),
    # expert stacks (EXPERT_STACKS)
    ("model.layers.3.mlp.experts.gate_up_proj",
     ("model.", "model.layers", 3, "mlp.experts", None, "gate_up_proj", "gate_up", R.EXPERT_STACK, "")),
    ("model.layers.3.mlp.experts.down_proj.weight",
     ("model.", "model.layers", 3, "mlp.experts", None, "down_proj", "down", R.EXPERT_STACK, "weight")),
    ("model.layers.3.mlp.experts.down_proj.bias",  # not a stack spelling: only [.weight] follows a stack
     ("model.", "model.layers", 3, "mlp.experts", None, "down_proj", "down", R.OTHER, "bias")),
    # routers (ROUTERS)
    ("model.layers.3.mlp.gate.weight",
     ("model.", "model.layers", 3, "mlp", None, "gate", None, R.ROUTER, "weight")),
    ("model.layers.3.block_sparse_moe.gate.weight",
     ("model.", "model.layers", 3, "block_sparse_moe", None, "gate", None, R.ROUTER, "weight")),
    ("model.layers.3.mlp.shared_expert_gate.weight",
     ("model.", "model.layers", 3, "mlp", None, "shared_expert_gate", None, R.ROUTER, "weight")),
    ("model.layers.3.mlp.gate.e_score_correction_bias",
     ("model.", "model.layers", 3, "mlp.gate", None, "e_score_correction_bias", None, R.ROUTER, "")),
    # embeddings and heads (EMBEDDINGS, HEADS)
    ("model.embed_tokens.weight", ("model.", None, None, "", None, "embed_tokens", None, R.EMBED, "weight")),
    ("lm_head.weight", ("", None, None, "", None, "lm_head", None, R.HEAD, "weight")),
    ("lm_head.weight_packed", ("", None, None, "", None, "lm_head", None, R.HEAD, "weight_packed")),
    ("model.layers.61.embed_tokens.weight",
     ("model.", "model.layers", 61, "", None, "embed_tokens", None, R.EMBED, "weight")),
    ("xlm_head.weight", ("", None, None, "", None, "xlm_head", None, R.OTHER, "weight")),  # whole components
    # shared experts (SHARED_EXPERT_MODULES), dense MLPs, norms, attention
    ("model.layers.3.mlp.shared_experts.up_proj.weight",
     ("model.", "model.layers", 3, "mlp.shared_experts", None, "up_proj", "up", R.SHARED_EXPERT, "weight")),
    ("model.layers.0.mlp.shared_expert.down_proj.weight",
     ("model.", "model.layers", 0, "mlp.shared_expert", None, "down_proj", "down", R.SHARED_EXPERT, "weight")),
    ("model.layers.0.mlp.gate_proj.weight",
     ("model.", "model.layers", 0, "mlp", None, "gate_proj", "gate", R.OTHER, "weight")),
    ("model.layers.3.input_layernorm.weight",
     ("model.", "model.layers", 3, "", None, "input_layernorm", None, R.NORM, "weight")),
    ("model.norm.weight", ("model.", None, None, "", None, "norm", None, R.NORM, "weight")),
    ("model.layers.3.self_attn.q_proj.bias",
     ("model.", "model.layers", 3, "self_attn", None, "q_proj", None, R.OTHER, "bias")),
    ("model.layers.3.self_attn.indexer.wk.weight",
     ("model.", "model.layers", 3, "self_attn.indexer", None, "wk", None, R.OTHER, "weight")),
    ("model.layers.3.self_attn.q_proj.weight.qs",
     ("model.", "model.layers", 3, "self_attn", None, "q_proj", None, R.OTHER, "weight.qs")),
    ("model.layers.3.self_attn.o_proj.weight_scale",
     ("model.", "model.layers", 3, "self_attn", None, "o_proj", None, R.OTHER, "weight_scale")),
    # text roots (TEXT_ROOTS), longest first
    ("model.language_model.layers.2.mlp.experts.1.up_proj.weight",
     ("model.language_model.", "model.language_model.layers", 2, "mlp.experts", 1, "up_proj", "up",
      R.EXPERT, "weight")),
    ("language_model.model.layers.60.block_sparse_moe.experts.383.w1.weight_packed",
     ("language_model.model.", "language_model.model.layers", 60, "block_sparse_moe.experts", 383, "w1",
      "gate", R.EXPERT, "weight_packed")),
    ("language_model.lm_head.weight", ("language_model.", None, None, "", None, "lm_head", None, R.HEAD,
                                       "weight")),
    ("model.text_model.embed_tokens.weight",
     ("model.text_model.", None, None, "", None, "embed_tokens", None, R.EMBED, "weight")),
    ("model.llm.layers.0.self_attn.k_proj.weight",
     ("model.llm.", "model.llm.layers", 0, "self_attn", None, "k_proj", None, R.OTHER, "weight")),
    # issue 11: the current generation's spellings
    ("model.layers.0.mlp.experts.w13_weight",
     ("model.", "model.layers", 0, "mlp.experts", None, "w13_weight", "gate_up", R.EXPERT_STACK, "")),
    ("model.layers.0.mlp.experts.w2_weight",
     ("model.", "model.layers", 0, "mlp.experts", None, "w2_weight", "down", R.EXPERT_STACK, "")),
    ("model.llm.layers.0.mlp.experts.gate_proj",
     ("model.llm.", "model.llm.layers", 0, "mlp.experts", None, "gate_proj", "gate", R.EXPERT_STACK, "")),
    ("model.llm.layers.0.mlp.experts.up_proj",
     ("model.llm.", "model.llm.layers", 0, "mlp.experts", None, "up_proj", "up", R.EXPERT_STACK, "")),
    ("model.layers.0.mlp.experts.gate_up_proj_bias",
     ("model.", "model.layers", 0, "mlp.experts", None, "gate_up_proj_bias", "gate_up", R.STACK_BIAS, "")),
    ("model.layers.0.mlp.experts.down_proj_bias",
     ("model.", "model.layers", 0, "mlp.experts", None, "down_proj_bias", "down", R.STACK_BIAS, "")),
    ("model.layers.0.mlp.router.weight",
     ("model.", "model.layers", 0, "mlp", None, "router", None, R.ROUTER, "weight")),
    ("model.layers.0.mlp.router.bias",
     ("model.", "model.layers", 0, "mlp", None, "router", None, R.ROUTER, "bias")),
    ("model.layers.0.mlp.gate.bias", ("model.", "model.layers", 0, "mlp", None, "gate", None, R.ROUTER, "bias")),
    ("model.layers.0.ffn.gate.weight", ("model.", "model.layers", 0, "ffn", None, "gate", None, R.ROUTER, "weight")),
    # Llama-4: feed_forward (MOE_BLOCKS), its router, stacks and shared expert
    ("language_model.model.layers.1.feed_forward.router.weight",
     ("language_model.model.", "language_model.model.layers", 1, "feed_forward", None, "router", None, R.ROUTER,
      "weight")),
    ("language_model.model.layers.1.feed_forward.experts.gate_up_proj",
     ("language_model.model.", "language_model.model.layers", 1, "feed_forward.experts", None, "gate_up_proj",
      "gate_up", R.EXPERT_STACK, "")),
    ("language_model.model.layers.1.feed_forward.shared_expert.gate_proj.weight",
     ("language_model.model.", "language_model.model.layers", 1, "feed_forward.shared_expert", None, "gate_proj",
      "gate", R.SHARED_EXPERT, "weight")),
    ("model.layers.0.ffn.gate.bias", ("model.", "model.layers", 0, "ffn", None, "gate", None, R.ROUTER, "bias")),
    ("model.layers.0.ffn.experts.3.w1.weight",
     ("model.", "model.layers", 0, "ffn.experts", 3, "w1", "gate", R.EXPERT, "weight")),
    ("embed.weight", ("", None, None, "", None, "embed", None, R.EMBED, "weight")),
    ("head.weight", ("", None, None, "", None, "head", None, R.HEAD, "weight")),
    ("unembed.weight", ("", None, None, "", None, "unembed", None, R.HEAD, "weight")),
    # unknown names: role other, never an error
    ("model.layers.3.some.unknown.thing",
     ("model.", "model.layers", 3, "some.unknown", None, "thing", None, R.OTHER, "")),
    ("model.layers.3", ("model.", None, None, "layers", None, "3", None, R.OTHER, "")),  # no layer: nothing after
]  # fmt: skip


@pytest.mark.parametrize(("name", "want"), CASES)
def test_parse_pins_every_table_spelling(name, want):
    assert fields(name) == want


def test_every_table_row_is_pinned_by_a_case():
    # a spelling added to a table needs its own parse case above (this keeps the tables and the tests in step)
    pinned = [parse_name(name) for name, _ in CASES]
    seen = {p.root for p in pinned} | {p.leaf for p in pinned} | {p.suffix for p in pinned}
    seen |= {p.module.split(".")[-1] for p in pinned} | {p.module.split(".")[0] for p in pinned}
    seen |= {".".join(p.name.split(".")[-k:]) for p in pinned for k in (1, 2, 3)}
    for table in (names.TEXT_ROOTS, names.PROJECTIONS, names.EXPERT_STACKS, names.STACK_BIASES, names.ROUTERS,
                  names.MERGED_EXPERTS,
                  names.EMBEDDINGS, names.HEADS, names.MOE_BLOCKS, names.SHARED_EXPERT_MODULES,
                  names.SUFFIXES):  # fmt: skip
        for spelling in table:
            assert spelling in seen, spelling


def test_expert_layer_and_root_are_the_last_and_longest_matches():
    p = parse_name("a.experts.1.b.experts.3.")  # the last experts.{E}. followed by something
    assert (p.expert, p.expert_base, p.expert_tensor) == (1, "a.experts", "b.experts.3.")
    p = parse_name("model.layers.3.foo.layers.2.x")
    assert (p.layer_prefix, p.layer) == ("model.layers.3.foo.layers", 2)
    assert parse_name("model.").root == ""  # a root leaves at least one component
    assert parse_name("experts.3.w1.weight").expert_base == "experts"


@pytest.mark.parametrize("root", sorted(names.TEXT_ROOTS))
@pytest.mark.parametrize(
    "bare",
    [
        "model.layers.3.mlp.experts.7.w1.weight.qs",
        "model.layers.3.mlp.experts.gate_up_proj",
        "model.layers.3.mlp.gate.weight",
        "model.layers.3.mlp.shared_experts.down_proj.weight",
        "model.layers.3.self_attn.q_proj.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.lm_head.weight",
    ],
)
def test_a_text_root_parses_like_the_bare_name(root, bare):
    rooted = root + bare[len("model.") :]
    a, b = parse_name(bare), parse_name(rooted)
    assert b.root == root
    assert (a.layer, a.module, a.expert, a.projection, a.role, a.suffix) == (
        b.layer, b.module, b.expert, b.projection, b.role, b.suffix)  # fmt: skip
    if a.layer is not None:
        assert b.layer_prefix == f"{root}layers"


@pytest.mark.parametrize("projection", names.PROJECTION_ORDER)
@pytest.mark.parametrize("suffix", ["weight", "weight.qs", "weight_packed", ""])
def test_expert_tensor_name_round_trips_through_the_parser(projection, suffix):
    base = module_path(5, "mlp.experts")
    name = expert_tensor_name(base, 11, projection, suffix)
    p = parse_name(name)
    assert (p.layer, p.module, p.expert, p.expert_base, p.projection, p.role, p.suffix) == (
        5, "mlp.experts", 11, base, projection, R.EXPERT, suffix)  # fmt: skip
    assert canonical_name(name) == name


@pytest.mark.parametrize("projection", ["gate_up", "down"])
def test_stack_name_round_trips_through_the_parser(projection):
    name = stack_name(module_path(2, "mlp.experts"), projection)
    p = parse_name(name)
    assert (p.layer, p.expert, p.expert_base, p.projection, p.role) == (
        2, None, "model.layers.2.mlp.experts", projection, R.EXPERT_STACK)  # fmt: skip


def test_layer_builders():
    assert layer_path(4) == "model.layers.4"
    assert module_path(4, "self_attn") == "model.layers.4.self_attn"
    assert layer_path(4, "model.language_model.") == "model.language_model.layers.4"
    p = parse_name(module_path(4, "self_attn") + ".q_proj.weight")
    assert (p.layer_prefix, p.layer, p.module) == ("model.layers", 4, "self_attn")


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("model.layers.1.block_sparse_moe.experts.3.w1.weight", "model.layers.1.mlp.experts.3.gate_proj.weight"),
        ("model.layers.1.block_sparse_moe.experts.3.w3.weight_packed",
         "model.layers.1.mlp.experts.3.up_proj.weight_packed"),
        ("model.layers.1.block_sparse_moe.experts.3.w2.weight.qs",
         "model.layers.1.mlp.experts.3.down_proj.weight.qs"),
        ("model.layers.1.block_sparse_moe.experts.3.w1", "model.layers.1.mlp.experts.3.w1"),  # needs a suffix
        ("model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.mlp.gate.weight"),
        ("model.layers.0.mlp.shared_expert.up_proj.weight", "model.layers.0.mlp.shared_experts.up_proj.weight"),
        ("model.layers.0.mlp.shared_expert_gate.weight", "model.layers.0.mlp.shared_expert_gate.weight"),
        ("model.layers.0.mlp.experts.7.w1_extra.weight", "model.layers.0.mlp.experts.7.w1_extra.weight"),
        ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj"),
        ("block_sparse_moe.x", "block_sparse_moe.x"),  # the first component is never a module alias
        # other text roots are spelled under model. (an output head at the top); towers keep their names
        ("model.language_model.layers.0.mlp.shared_expert.up_proj.weight",
         "model.layers.0.mlp.shared_experts.up_proj.weight"),
        ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("language_model.model.layers.1.block_sparse_moe.experts.3.w1.weight.qs",
         "model.layers.1.mlp.experts.3.gate_proj.weight.qs"),
        ("language_model.lm_head.weight", "lm_head.weight"),
        ("model.visual.blocks.0.attn.qkv.weight", "model.visual.blocks.0.attn.qkv.weight"),
        # Llama-4's feed_forward: its router, experts, shared expert and dense MLP under the runtime's mlp names
        ("language_model.model.layers.1.feed_forward.router.weight", "model.layers.1.mlp.gate.weight"),
        ("language_model.model.layers.1.feed_forward.experts.0.gate_proj.weight.qs",
         "model.layers.1.mlp.experts.0.gate_proj.weight.qs"),
        ("language_model.model.layers.1.feed_forward.shared_expert.up_proj.weight",
         "model.layers.1.mlp.shared_experts.up_proj.weight"),
        ("language_model.model.layers.0.feed_forward.down_proj.weight", "model.layers.0.mlp.down_proj.weight"),
    ],
)  # fmt: skip
def test_canonical_name_maps_module_and_projection_spellings(name, canonical):
    assert canonical_name(name) == canonical


def test_natural_key_compares_numbers_as_numbers():
    assert sorted(["model.layers.10.a", "model.layers.2.a"], key=natural_key) == [
        "model.layers.2.a", "model.layers.10.a"]  # fmt: skip


def test_towers_mtp_modules_and_small_params():
    assert names.is_tower("model.visual.blocks.0.attn.qkv.weight")
    assert names.is_tower("vision_tower.encoder.patch_embed.proj.weight")
    assert names.is_tower("model.mm_projector.in_proj.weight") and names.is_tower("mm_projector.proj.0.weight")
    assert not names.is_tower("model.language_model.layers.0.self_attn.q_proj.weight")
    assert not names.is_tower("language_model.model.layers.0.mlp.gate.weight")
    assert names.is_mtp_module("model.mtp.0.ffn.experts.1.w1.weight") and not names.is_mtp_module("model.layers.0.mtp_gate.weight")
    for n in ("model.layers.0.hc_attn_fn", "model.hc_head.hc_fn", "model.layers.0.attn.compressor.ape",
              "model.layers.0.self_attn.sinks", "model.layers.0.attn.attn_sink", "model.layers.0.linear_attn.dt_bias",
              "model.layers.0.self_attn.A_log",
              "model.language_model.layers.3.self_attn.indexer.index_kpool_compress_ape"):  # fmt: skip
        assert names.is_small_param(n), n
    assert not names.is_small_param("model.layers.0.self_attn.q_proj.weight")


def test_detail_role_of_written_names():
    """The finer roles formats per role count by (docs/FORMATS.md §6), on names as the converter writes them."""
    role = names.detail_role
    assert role("model.layers.0.linear_attn.conv1d.weight", 3) == "conv"
    assert role("model.layers.0.linear_attn.A_log", 1) == "ssm params"
    assert role("model.layers.0.linear_attn.dt_bias", 1) == "ssm params"
    assert role("model.layers.1.mlp.router.bias", 1) == "router"
    assert role("model.layers.1.mlp.gate.weight", 2) == "router"
    assert role("model.layers.1.self_attn.sinks", 1) == "sinks"
    assert role("model.layers.1.mlp.experts.3.gate_proj.bias", 1) == "routed experts"
    assert role("model.layers.1.mlp.experts.3.gate_proj.weight_packed", 2) == "routed experts"
    assert role("model.layers.1.mlp.shared_expert.up_proj.weight", 2) == "shared experts"
    assert role("model.layers.1.self_attn.q_norm.weight", 1) == "norm/1-D"
    assert role("model.layers.1.self_attn.q_proj.weight", 2) == "attention"
    assert role("model.layers.0.mlp.down_proj.weight", 2) == "dense mlp"
    assert role("model.embed_tokens.weight", 2) == "embed" and role("lm_head.weight", 2) == "head"
    assert role("model.layers.2.self_attn.q_proj.weight", 2, num_hidden_layers=2) == "mtp"
    assert role("model.layers.2.self_attn.q_proj.weight", 2) == "attention"  # no config: no MTP rule
    assert role("model.visual.blocks.0.attn.qkv.weight", 2) == "tower"
    assert role("model.layers.0.ffn.gate.tid2eid", 2, copied=True) == "copied non-float"
    assert role("model.hc_head.hc_fn", 2) == "hc"
    assert set(names.order_role_formats({"attention": {"b": 1, "a": 2}, "conv": {"f32": 1}})) == {"conv", "attention"}
    assert list(names.order_role_formats({"attention": {"b": 1, "a": 2}, "conv": {"f32": 1}})) == ["conv", "attention"]


def test_stacked_shared_experts_audio_tower_and_static_taps():
    s = names.shared_stack("model.llm.layers.0.mlp.shared_experts.shared_w13_weight")
    assert s == names.SharedStack("model.llm.layers.0.mlp.shared_experts", "gate_up")
    assert s.expert_name(1, "up") == "model.llm.layers.0.mlp.shared_experts.1.up_proj.weight"
    assert names.shared_stack("model.layers.0.mlp.shared_experts.shared_w2_weight").projection == "down"
    assert names.shared_stack("model.layers.0.mlp.shared_experts.gate_proj").projection == "gate"
    for not_a_stack in ("model.layers.0.mlp.shared_experts.gate_proj.weight",  # DeepSeek's 2-D shared expert
                        "model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.gate_proj"):  # fmt: skip
        assert names.shared_stack(not_a_stack) is None, not_a_stack
    # a split shared expert is still a shared expert
    assert parse_name("model.llm.layers.0.mlp.shared_experts.1.up_proj.weight").role is R.SHARED_EXPERT
    assert names.is_tower("model.audio.encoder.weight") and not names.is_tower("model.llm.audio.weight")
    assert names.is_small_param("model.llm.layers.1.attn.k_sconv.static_w")
    assert not names.is_small_param("model.llm.layers.1.attn.k_sconv.weight_proj")


def test_deepseek_v4_released_names_map_both_ways_and_leave_other_names_alone():
    # transformers 5.24's saved spelling (oracles/deepseek_v4) -> the released checkpoint's (c/deepseek_v4.c
    # coli_v4_layer_plan add_spec: "layers.%d.%s"; embed.weight, head.weight, norm.weight, hc_head_fn ...)
    pairs = {
        "model.embed_tokens.weight": "embed.weight",
        "head.weight": "head.weight",
        "model.norm.weight": "norm.weight",
        "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base",
        "model.hc_head.hc_scale": "hc_head_scale",
        "model.layers.0.attn.norm.weight": "layers.0.attn.kv_norm.weight",
        "model.layers.0.attn.compressor.norm.weight": "layers.0.attn.compressor.norm.weight",
        "model.layers.12.ffn.experts.3.w2.weight": "layers.12.ffn.experts.3.w2.weight",
        "model.layers.1.hc_attn_fn": "layers.1.hc_attn_fn",
        "model.mtp.0.attn.norm.weight": "mtp.0.attn.kv_norm.weight",
    }
    for saved, released in pairs.items():
        assert names.deepseek_v4_released_name(saved) == released
        assert names.deepseek_v4_saved_name(released) == saved
        assert names.canonical_name(released) == names.canonical_name(saved)
    for other in ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight", "model.language_model.norm.weight"):
        assert names.deepseek_v4_saved_name(other) is None  # not a released name: canonical_name unchanged
    assert names.canonical_name("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj.weight"


_component = st.sampled_from(
    ["model", "layers", "0", "12", "mtp", "mtpx", "xmtp", "hc_head", "hc_", "xhc_", "attn_res", "attn_resx",
     "rel_logits_proj", "self_attn", "q_proj", "weight", "bias", "", "hc", "attn.res"]
)  # fmt: skip


@settings(max_examples=2000, deadline=None)
@given(parts=st.lists(_component, min_size=1, max_size=6))
def test_module_tests_are_the_per_component_rule(parts):
    """``is_mtp_module`` / ``is_small_param`` search the name once; the rule they implement, spelled out per
    component (every component but the last): an MTP module, a small-param module or prefix."""
    name = ".".join(parts)
    modules = name.split(".")[:-1]
    assert names.is_mtp_module(name) == any(p in names.MTP_MODULES for p in modules)
    leaf = names.parse_name(name).leaf
    prefixes = tuple(names.SMALL_PARAM_PREFIXES)
    assert names.is_small_param(name) == (
        leaf in names.SMALL_PARAMS
        or leaf.startswith(prefixes)
        or leaf.endswith(tuple(names.SMALL_PARAM_SUFFIXES))
        or any(p.startswith(prefixes) or p in names.SMALL_PARAM_MODULES for p in modules)
    )


@settings(max_examples=500, deadline=None)
@given(name=st.text(st.sampled_from(list("ab._0179") + ["\u0663", "\u00b2"]), max_size=12))
def test_natural_key_is_the_name_with_every_digit_run_a_number(name):
    # the text between digit runs as text, every run of decimal digits (Unicode's too) as its number
    runs = re.split(r"(\d+)", name)
    assert natural_key(name) == tuple(int(p) if i % 2 else p for i, p in enumerate(runs))
