"""The model families (formats/families.py): model types, stack orientation, config spellings, geometry."""

from __future__ import annotations

from colitools.formats import families, model_config
from colitools.formats.names import Orientation as O

BASE = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10, "num_experts": 8,
        "num_experts_per_tok": 2}  # fmt: skip
MLA = {"q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12}


def test_stack_orientation_is_a_fact_of_the_family():
    assert families.stack_orientation("gpt_oss") is O.TRANSPOSED_INTERLEAVED
    assert families.stack_orientation("inkling2") is O.ROWS_INTERLEAVED
    assert families.stack_orientation("qwen3_5_moe") is O.ROWS
    assert families.stack_orientation("llama") is None and families.stack_orientation(None) is None
    # gate_up [E, H, 2I] with gate = the first I columns (chunk(2, dim=-1)), down [E, I, H]
    for t in ("llama4", "llama4_text", "qwen3_vl_moe", "qwen3_vl_moe_text"):
        assert families.stack_orientation(t) is O.TRANSPOSED
    assert families.stack_orientation("llama4", "mxfp4") is None  # codes by rows: not this family's layout
    # natively quantized stacks: codes by rows; gpt-oss MXFP4 blocks interleave gate / up rows (transformers'
    # Mxfp4GptOssExperts), other encodings of a transposed family are not fixed; row families keep theirs
    assert families.stack_orientation("gpt_oss", "mxfp4") is O.ROWS_INTERLEAVED
    assert families.stack_orientation("gpt_oss", "int4") is None
    assert families.stack_orientation("qwen3_moe", "mxfp4") is O.ROWS
    assert families.stack_orientation("inkling2", "mxfp4") is O.ROWS_INTERLEAVED
    # Inkling's text stack gate_up_proj holds the gate rows first; its native w13_weight interleaves them
    for t in ("inkling", "inkling_mm_model", "inkling_text"):
        assert families.stack_orientation(t, leaf="gate_up_proj") is O.ROWS
        assert families.stack_orientation(t, leaf="w13_weight") is O.ROWS_INTERLEAVED
    assert families.stack_orientation("inkling2", leaf="gate_up_proj") is O.ROWS_INTERLEAVED
    assert families.native_stack_orientations() == [("gpt_oss", "mxfp4")]


def test_model_types_run_and_only_converted():
    """Every type the runtime runs has a family; colibri's ``inkling`` type is converted (its orientation is
    known) but not run."""
    assert families.RUNNABLE_MODEL_TYPES[:4] == ("olmoe", "qwen2_moe", "qwen3_moe", "mixtral")
    assert (
        "inkling" not in families.RUNNABLE_MODEL_TYPES and families.family_of("inkling") is families.INKLING
    )
    assert families.known_model_types() == sorted([*families.RUNNABLE_MODEL_TYPES, "inkling"])
    assert families.family_of("deepseek_v41") is families.DEEPSEEK_V41  # DeepSeek-V4.1 Flash: converted and run
    assert families.family_of("llama") is None and families.family_of(None) is None
    assert families.family_of("kimi_k25") is families.family_of("deepseek_v3")


def test_a_family_claims_the_roles_of_its_blocks_only():
    """DeepSeek-V3 is MLA: no GQA projections, whatever else the config holds; a block whose keys are missing
    claims nothing (no guess)."""
    shapes = model_config.linear_shapes({"model_type": "deepseek_v3", **BASE, **MLA, "head_dim": 16})
    assert shapes[("self_attn", "q_b_proj")] == (4 * 12, 16) and shapes[
        ("self_attn", "kv_a_proj_with_mqa")
    ] == (12, 64)
    assert shapes[("self_attn", "o_proj")] == (64, 48) and ("self_attn", "k_proj") not in shapes
    no_latent = model_config.linear_shapes({"model_type": "deepseek_v3", **BASE})
    assert not any(module == "self_attn" for module, _ in no_latent) and no_latent[("mlp", "gate")] == (8, 64)
    assert model_config.linear_shapes({"model_type": "inkling_mm_model", **BASE}) == {}  # native geometry
    assert model_config.linear_shapes({"model_type": "llama", **BASE}) == {}


def test_gated_attention_doubles_q_proj_and_kimi_spellings_are_read_as_the_common_keys():
    q = model_config.linear_shapes({"model_type": "qwen3_next", **BASE, "head_dim": 8})[
        ("self_attn", "q_proj")
    ]
    assert q == (2 * 4 * 8, 64) and families.family_of("qwen3_next").gated_attention
    kimi = {"model_type": "kimi_linear", **BASE, **MLA, "num_experts_per_token": 2,
            "linear_attn_config": {"num_heads": 2, "head_dim": 8, "kda_layers": [1], "full_attn_layers": [2]}}  # fmt: skip
    keys = model_config.canonical_keys(kimi, "kimi_linear")
    assert keys["num_experts_per_tok"] == 2 and keys["layer_types"] == ["linear_attention", "full_attention"]
    per_layer = model_config.layer_linear_shapes(kimi)
    assert list(per_layer) == [0] and per_layer[0][("self_attn", "f_b_proj")] == (16, 8)


def test_qwen38_geometry_claims_every_linear_shape_transformers_wrote():
    """The Qwen3.8 family's blocks (gated attention, Gated DeltaNet, QSA indexer, gated residuals, PLE projections
    and n-gram table shards) against the shapes transformers' own save_pretrained wrote (oracles/qwen38)."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    from colitools.formats.names import MODULE_ALIASES, parse_name

    fixture = Path(__file__).resolve().parents[2] / "oracles" / "qwen38"
    config = json.loads((fixture / "config.json").read_text())
    family = families.family_of(config["model_type"])
    assert family is families.family_of("qwen4_exp_text") is families.QWEN38
    assert {"qwen4_exp", "qwen4_exp_text"} <= set(families.RUNNABLE_MODEL_TYPES)
    text = model_config.canonical_keys(config["text_config"], "qwen4_exp")
    shapes = family.linear_shapes(text, text["num_experts"])
    per_layer = family.layer_linear_shapes(text)
    assert set(per_layer) == {0}  # ple_layer_ids [1] is one-based
    claimed = set()
    with safe_open(str(fixture / "model.safetensors"), framework="np") as f:
        for name in f.keys():
            p = parse_name(name)
            shape = tuple(f.get_slice(name).get_shape())
            skip = p.expert is not None or p.suffix != "weight" or len(shape) != 2
            if skip or p.role.value in ("embed", "head") or name.startswith("model.visual."):
                continue
            if p.layer is None and not p.module:  # lm_head and the like: not a family block's
                continue
            key = (".".join(MODULE_ALIASES.get(m, m) for m in p.module.split(".")), p.leaf)
            want = per_layer.get(p.layer, {}).get(key) or shapes.get(key)
            assert want == shape, (name, want, shape)
            claimed.add(key)
    # the Gated DeltaNet block claims Qwen3-Next's fused spelling too
    qwen3_next_spelling = {("linear_attn", "in_proj_qkvz"), ("linear_attn", "in_proj_ba")}
    assert claimed == (set(shapes) | set(per_layer[0])) - qwen3_next_spelling
    # the n-gram moduli: primes from ngram_vocab_size_base on, as the fixture's own hash buffers hold them
    assert families.ngram_head_vocab_sizes(31, 4, 0) == [31, 37, 41, 43]
    assert families.ngram_head_vocab_sizes(31, 4, 1) == [47, 53, 59, 61]


def test_transposed_orientation_is_transposed_and_not_interleaved():
    assert O.TRANSPOSED.transposed and not O.TRANSPOSED.interleaved
    assert O.TRANSPOSED_INTERLEAVED.transposed and O.TRANSPOSED_INTERLEAVED.interleaved
    assert not O.ROWS.transposed and not O.ROWS.interleaved and O.ROWS_INTERLEAVED.interleaved


def test_qwen3_vl_moe_stacks_are_told_apart_by_shape():
    """Published [E, H, 2I] / [E, I, H] against transformers 5.24's save [E, 2I, H] / [E, H, I] (H 64, I 32)."""
    published = {"gate_up": (4, 64, 64), "down": (4, 32, 64)}  # 2I == H: gate_up is square, down decides
    assert families.shaped_orientation("qwen3_vl_moe", published, 64, 32) is O.TRANSPOSED
    saved = {"gate_up": (4, 64, 64), "down": (4, 64, 32)}
    assert families.shaped_orientation("qwen3_vl_moe", saved, 64, 32) is O.ROWS
    # H == I: down is square, gate_up decides
    assert (
        families.shaped_orientation("qwen3_vl_moe", {"gate_up": (4, 64, 128), "down": (4, 64, 64)}, 64, 64)
        is O.TRANSPOSED
    )
    assert (
        families.shaped_orientation("qwen3_vl_moe", {"gate_up": (4, 128, 64), "down": (4, 64, 64)}, 64, 64)
        is O.ROWS
    )
    assert families.shaped_orientation("qwen3_vl_moe_text", {"gate_up": (4, 128, 64)}, 64, 64) is O.ROWS


def test_a_square_stack_alone_is_read_in_the_published_layout():
    """The rule for a square ambiguity with no other stack to decide (or shapes fitting neither layout): the
    family's published orientation (the shape check then names what it expected)."""
    assert families.shaped_orientation("qwen3_vl_moe", {"gate_up": (4, 64, 64)}, 64, 32) is O.TRANSPOSED
    assert families.shaped_orientation("qwen3_vl_moe", {"down": (4, 64, 64)}, 64, 64) is O.TRANSPOSED
    assert families.shaped_orientation("qwen3_vl_moe", {"gate_up": (4, 7, 9)}, 64, 32) is O.TRANSPOSED
    # families with one layout are not decided by shape
    assert families.shaped_orientation("llama4", {"gate_up": (4, 64, 128)}, 64, 64) is None
    assert families.shaped_orientation("qwen3_moe", {"gate_up": (4, 128, 64)}, 64, 64) is None


def test_llama4_geometry_reads_its_dense_and_expert_widths():
    text = {"model_type": "llama4_text", **BASE, "num_local_experts": 4, "head_dim": 16, "num_key_value_heads": 2,
            "intermediate_size": 32, "intermediate_size_mlp": 96}  # fmt: skip
    text.pop("num_experts")
    shapes = model_config.linear_shapes(text)
    assert shapes[("mlp", "gate_proj")] == (96, 64) and shapes[("mlp", "down_proj")] == (64, 96)
    assert shapes[("mlp.shared_experts", "up_proj")] == (32, 64) and shapes[("mlp", "gate")] == (4, 64)
    assert shapes[("self_attn", "k_proj")] == (32, 64)
