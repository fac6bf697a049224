"""ModelArgs absorbs the config spellings of transformers 5.x and of hub checkpoints; RoPE variants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from colitools.errors import ConfigError, RuntimeModelError
from colitools.runtime.config import ModelArgs, RopeArgs, mla_softmax_scale
from colitools.runtime.rope import Rope, inv_freq_and_scaling

BASE = dict(vocab_size=10, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_experts_per_tok=2)
MLA = dict(q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)


def test_expert_count_spellings():
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        a = ModelArgs.from_config({"model_type": "olmoe", key: 6, **BASE, "intermediate_size": 32})
        assert a.num_experts == 6


def test_head_dim_null_means_hidden_over_heads_and_kv_heads_default():
    a = ModelArgs.from_config({"model_type": "qwen3_moe", "num_experts": 4, "head_dim": None, **BASE,
                               "moe_intermediate_size": 16})  # fmt: skip
    assert a.head_dim == 16 and a.num_key_value_heads == 4 and a.moe_intermediate_size == 16


def test_hub_rope_scaling_equals_rope_parameters():
    yarn = {"factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
    common = {"model_type": "deepseek_v3", "n_routed_experts": 8, **BASE, **MLA, "intermediate_size": 32,
              "moe_intermediate_size": 16, "n_group": 1, "topk_group": 1}  # fmt: skip
    new = ModelArgs.from_config(
        {**common, "rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, **yarn}}
    )
    hub = ModelArgs.from_config({**common, "rope_theta": 500.0, "rope_scaling": {"type": "yarn", **yarn}})
    assert (
        new.rope == hub.rope and new.rope.rope_type == "yarn" and new.rope.dim == 8 and new.rope.interleaved
    )
    # mscale_all_dim scales the softmax scale by mscale^2
    m = 0.1 * math.log(4.0) + 1
    assert mla_softmax_scale(hub.mla, hub.rope) == pytest.approx(16**-0.5 * m * m)


def test_partial_rotary_and_layer_schedules():
    g = ModelArgs.from_config(
        {
            "model_type": "glm4_moe",
            "n_routed_experts": 8,
            **BASE,
            "head_dim": 24,
            "intermediate_size": 32,
            "moe_intermediate_size": 16,
            "first_k_dense_replace": 2,
        }
    )
    assert g.rope.dim == 12 and g.moe_layers == [False, False, True, True] and g.routing.router == "noaux_tc"
    q = ModelArgs.from_config({"model_type": "qwen2_moe", "num_experts": 8, **BASE, "intermediate_size": 32,
                               "moe_intermediate_size": 16, "decoder_sparse_step": 2, "mlp_only_layers": [3],
                               "shared_expert_intermediate_size": 24})  # fmt: skip
    assert q.moe_layers == [False, True, False, False] and q.routing.shared_expert_gated
    m = ModelArgs.from_config(
        {"model_type": "mixtral", "num_local_experts": 4, **BASE, "intermediate_size": 32}
    )
    assert m.routing.norm_topk_prob and m.rope.theta == 1e6 and m.moe_intermediate_size == 32


def test_glm5_indexer_types_from_pattern_or_frequency():
    common = {"model_type": "glm_moe_dsa", "n_routed_experts": 8, **BASE, **MLA, "intermediate_size": 32,
              "moe_intermediate_size": 16, "index_topk": 4, "index_head_dim": 16, "index_n_heads": 2}  # fmt: skip
    assert ModelArgs.from_config({**common, "index_topk_pattern": "FSSF"}).indexer.full == [
        True,
        False,
        False,
        True,
    ]
    a = ModelArgs.from_config({**common, "index_topk_freq": 2, "index_skip_topk_offset": 1})
    assert a.indexer.full == [True, False, True, False]
    assert ModelArgs.from_config(common).indexer.full == [True] * 4


def test_unsupported_model_type_is_a_clear_error():
    with pytest.raises(RuntimeModelError, match="model_type 'llama' is not supported"):
        ModelArgs.from_config({"model_type": "llama", **BASE})


def test_yarn_frequencies_follow_the_ramp():
    rope = RopeArgs(rope_type="yarn", theta=10000.0, dim=16, factor=4.0, original_max_position_embeddings=16,
                    mscale=1.0, mscale_all_dim=1.0)  # fmt: skip
    inv, scaling = inv_freq_and_scaling(rope)
    i = np.arange(8)
    extra = 10000.0 ** (-2 * i / 16)
    low = max(math.floor(16 * math.log(16 / (32 * 2 * math.pi)) / (2 * math.log(10000))), 0)
    high = min(math.ceil(16 * math.log(16 / (1 * 2 * math.pi)) / (2 * math.log(10000))), 15)
    ramp = np.clip((i - low) / (high - low), 0, 1)
    np.testing.assert_allclose(inv, extra / 4 * ramp + extra * (1 - ramp), rtol=2e-6)
    assert scaling == 1.0  # mscale == mscale_all_dim


def test_interleaved_and_half_rope_are_the_same_rotation_up_to_a_permutation():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)
    pos = np.arange(3)
    half = Rope(RopeArgs(dim=8))
    inter = Rope(RopeArgs(dim=8, interleaved=True))
    perm = np.r_[0:8:2, 1:8:2]  # interleaved pairs (2i, 2i+1) -> half pairs (i, i + 4)
    c, s = half.cos_sin(pos)
    np.testing.assert_allclose(inter.apply(q, c, s), half.apply(q[..., perm], c, s), rtol=1e-6)
    # dot products between positions are what RoPE is for
    qi, ki = inter.apply(q, c, s), inter.apply(k, c, s)
    qh, kh = half.apply(q[..., perm], c, s), half.apply(k[..., perm], c, s)
    np.testing.assert_allclose(
        np.einsum("nhd,mhd->nmh", qi, ki), np.einsum("nhd,mhd->nmh", qh, kh), atol=1e-5
    )


def test_partial_rope_leaves_the_tail_untouched():
    x = np.random.default_rng(2).standard_normal((2, 1, 24)).astype(np.float32)
    r = Rope(RopeArgs(dim=12))
    c, s = r.cos_sin(np.array([0, 5]))
    y = r.apply(x, c, s)
    assert np.array_equal(y[..., 12:], x[..., 12:]) and np.array_equal(y[0], x[0])  # position 0 = identity


def test_every_runnable_type_has_a_family_that_parses_its_own_arguments():
    """``formats/families.py`` names the runtime module of every runnable type; the module's ``FAMILY`` is a
    ``RuntimeFamily`` whose defaults cover the type, and those defaults are what its own ``ModelArgs`` subclass gets."""
    from colitools.formats.families import RUNNABLE_MODEL_TYPES, family_of
    from colitools.runtime.family import RuntimeFamily
    from colitools.runtime.family_registry import family_for

    assert set(RUNNABLE_MODEL_TYPES) >= {"olmoe", "qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "glm4_moe",
                                         "glm_moe_dsa", "kimi_k25", "deepseek_v32", "gpt_oss", "qwen3_next",
                                         "qwen3_5_moe", "qwen3_5_moe_text", "deepseek_v4"}  # fmt: skip
    for mt in RUNNABLE_MODEL_TYPES:
        family = family_for(mt)
        assert isinstance(family, RuntimeFamily) and type(family).__module__ == f"colitools.runtime.{family_of(mt).name}"
        assert mt in family.defaults
        cfg = {"model_type": mt, "num_experts": 8, **BASE, **MLA, "intermediate_size": 32,
               "moe_intermediate_size": 16, "n_group": 1, "topk_group": 1}  # fmt: skip
        if mt in ("glm5_next", "glm5_next_text"):  # MLA without RoPE: a rope slice is refused
            cfg["qk_rope_head_dim"] = 0
        if mt.startswith("inkling"):
            cfg["num_key_value_heads"] = 2  # Inkling's default of 8 does not divide BASE's 4 heads
        if mt == "kimi_k3":  # no transformers defaults: c/kimi_k3.c load_cfg requires these (req_num)
            cfg.update(linear_attn_config={"num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4,
                                           "kda_layers": [1, 2, 3]}, attn_res_block_size=2,
                       activation_situ_beta=4.0, activation_situ_linear_beta=25.0, routed_expert_hidden_size=32)  # fmt: skip
        if mt == "deepseek_v41":  # c/deepseek_v41.c cfg_load requires a ratio per layer; one K = V head
            cfg.update(compress_ratios=[0, 0, 0, 0], o_lora_rank=8, num_key_value_heads=1)
        if mt.startswith("qwen4_exp"):  # Qwen3.8: the runtime runs its QSA layers, whose indexer has no default
            cfg.update(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=4,
                       indexer_compress_ratio=2)  # fmt: skip
        a = ModelArgs.from_config(cfg)
        assert isinstance(a, ModelArgs) and a.model_type == mt
        assert a.rms_norm_eps == family.defaults[mt]["rms_norm_eps"] and len(a.moe_layers) == 4


def test_the_model_asks_its_family_through_the_protocol_only():
    """``model.py`` and ``family.py`` probe nothing (no ``hasattr`` / ``getattr`` on a family, a layer or a mixer):
    what a family provides is ``RuntimeFamily``'s methods, what a layer provides is ``Layer``'s."""
    import ast
    from pathlib import Path

    import colitools.runtime.family as family_module
    import colitools.runtime.model as model_module

    for module in (model_module, family_module):
        tree = ast.parse(Path(module.__file__).read_text())
        probes = [n.lineno for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("hasattr", "getattr")]  # fmt: skip
        assert probes == [], f"{module.__name__} probes at lines {probes}"


def test_mla_rope_uses_the_rope_slice_and_olmoe_mixtral_size_experts_by_intermediate_size():
    ds = ModelArgs.from_config({"model_type": "deepseek_v3", "n_routed_experts": 8, **BASE, **MLA,
                                "intermediate_size": 32, "moe_intermediate_size": 16, "n_group": 1,
                                "topk_group": 1, "rope_interleave": False})  # fmt: skip
    assert ds.rope.dim == 8 and not ds.rope.interleaved and ds.head_dim == 16
    assert ds.routing.shared_expert_intermediate_size == 16 and ds.moe_layers == [False, False, False, True]
    for mt in ("olmoe", "mixtral"):
        a = ModelArgs.from_config({"model_type": mt, "num_experts": 4, **BASE, "intermediate_size": 32,
                                   "moe_intermediate_size": 16})  # fmt: skip
        assert a.moe_intermediate_size == 32


def test_malformed_values_are_one_runtime_error_naming_the_key():
    for bad, shown in (({"num_hidden_layers": "two"}, 'num_hidden_layers is "two"'),
                       ({"num_attention_heads": 0}, "num_attention_heads is 0"),
                       ({"num_experts_per_tok": 9}, "more than the 8 routed experts")):  # fmt: skip
        with pytest.raises(ConfigError, match=shown):
            ModelArgs.from_config({"model_type": "olmoe", "num_experts": 8, **BASE, "intermediate_size": 32,
                                   **bad})  # fmt: skip
    with pytest.raises(RuntimeModelError, match="qk_rope_head_dim"):  # was a KeyError
        ModelArgs.from_config({"model_type": "deepseek_v3", "n_routed_experts": 8, **BASE, "n_group": 1,
                               **{k: v for k, v in MLA.items() if k != "qk_rope_head_dim"}})  # fmt: skip


# transformers 5.24 _compute_yarn_parameters for gpt-oss's RoPE over head_dim 16 (theta 150000, factor 32,
# original 4096, beta 32/1), printed from the oracle venv: truncate false keeps the fractional correction range
GPT_OSS_INV_FREQ = {
    False: [1.0, 0.22541800141334534, 0.05081327259540558, 0.006794959306716919, 0.0004564839182421565,
            1.818833698052913e-05, 4.099978468730114e-06, 9.242089618055616e-07],
    True: [1.0, 0.22541800141334534, 0.05081327259540558, 0.007755465339869261, 0.0009144543437287211,
           1.818833698052913e-05, 4.099978468730114e-06, 9.242089618055616e-07],
}  # fmt: skip
GPT_OSS = {"model_type": "gpt_oss", "num_local_experts": 4, **BASE, "head_dim": 16, "intermediate_size": 32}


def test_gpt_oss_defaults_are_transformers_config_defaults():
    a = ModelArgs.from_config(GPT_OSS)  # no rope_parameters, layer_types, sliding_window, swiglu_*
    assert a.rope.rope_type == "yarn" and a.rope.theta == 150000.0 and a.rope.factor == 32.0
    assert a.rope.original_max_position_embeddings == 4096 and a.rope.truncate is False and a.rope.dim == 16
    assert a.attention.sliding_windows == [128, None, 128, None]  # even layers slide (GptOssConfig layer_types)
    assert a.attention.sinks and a.routing.router == "topk_softmax" and (a.swiglu_alpha, a.swiglu_limit) == (1.702, 7.0)
    assert a.moe_intermediate_size == 32 and a.moe_layers == [True] * 4
    assert ModelArgs.from_config({**GPT_OSS, "head_dim": None}).head_dim == 64  # GptOssConfig.head_dim = 64
    types = ["full_attention", "sliding_attention", "full_attention", "full_attention"]
    b = ModelArgs.from_config({**GPT_OSS, "layer_types": types, "sliding_window": 8, "swiglu_limit": 5.0})
    assert b.attention.sliding_windows == [None, 8, None, None] and b.swiglu_limit == 5.0
    with pytest.raises(RuntimeModelError, match="layer_types"):
        ModelArgs.from_config({**GPT_OSS, "layer_types": ["sliding_attention"]})


@pytest.mark.parametrize("truncate", [False, True])
def test_gpt_oss_yarn_matches_transformers(truncate):
    yarn = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": truncate,
            "original_max_position_embeddings": 4096}  # fmt: skip
    new = ModelArgs.from_config({**GPT_OSS, "rope_parameters": {**yarn, "rope_theta": 150000.0}})
    hub = ModelArgs.from_config({**GPT_OSS, "rope_theta": 150000.0, "rope_scaling": yarn})  # hub config.json
    assert new.rope == hub.rope and new.rope.truncate is truncate
    inv, scaling = inv_freq_and_scaling(new.rope)
    np.testing.assert_allclose(inv, GPT_OSS_INV_FREQ[truncate], rtol=1e-6)
    assert math.isclose(scaling, 0.1 * math.log(32.0) + 1.0)
