"""Llama-4 and Qwen3-VL-MoE arguments: layer schedules, chunking, llama3 RoPE frequencies (the oracle fixtures
``oracles/llama4`` and ``oracles/qwen3_vl_moe`` check the whole forward token by token)."""

from __future__ import annotations

import math

import numpy as np

from colitools.runtime.config import ModelArgs, RopeArgs
from colitools.runtime.rope import inv_freq_and_scaling

TEXT = {"model_type": "llama4_text", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 8,
        "vocab_size": 10, "num_local_experts": 4, "intermediate_size": 32, "intermediate_size_mlp": 96}  # fmt: skip


def _args(**over):
    return ModelArgs.from_config({"model_type": "llama4", "text_config": {**TEXT, **over}})


def test_llama4_schedules_follow_transformers_defaults():
    """Every layer MoE (step 1), every 4th layer NoPE and unchunked, RoPE layers chunked at 8192, top-1."""
    a = _args()
    assert a.moe_layers == [True] * 8 and a.num_experts_per_tok == 1
    assert a.rope_layers == [True, True, True, False] * 2
    assert a.chunks == [8192, 8192, 8192, None] * 2
    assert a.l2_qk_norm and a.temperature == (8192.0, 0.1) and a.intermediate_size_mlp == 96
    assert a.rope.interleaved and a.rope.theta == 500000.0 and a.moe_intermediate_size == 32


def test_llama4_explicit_schedules_and_null_chunk_size():
    a = _args(interleave_moe_layer_step=2, no_rope_layers=[1, 0] * 4, attention_chunk_size=None,
              attn_temperature_tuning=False)  # fmt: skip
    assert a.moe_layers == [False, True] * 4 and a.rope_layers == [True, False] * 4
    assert a.chunks == [None] * 8 and a.temperature is None  # null: no chunking (absent: transformers' 8192)
    b = _args(
        moe_layers=[5], layer_types=["full_attention"] * 7 + ["chunked_attention"], attention_chunk_size=16
    )
    assert b.moe_layers == [i == 5 for i in range(8)] and b.chunks == [None] * 7 + [16]


def test_qwen3_vl_moe_always_renormalises_and_reads_mrope_as_text_rope():
    text = {"model_type": "qwen3_vl_moe_text", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 10, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "head_dim": 16, "mlp_only_layers": [1],
            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
            "rope_theta": 5e6}  # fmt: skip
    a = ModelArgs.from_config({"model_type": "qwen3_vl_moe", "text_config": text})
    assert a.routing.norm_topk_prob and a.moe_layers == [True, False] and a.attention.qk_norm == "head"
    assert (
        a.rope.rope_type == "default" and a.rope.dim == 16 and not a.rope.interleaved and a.rope.theta == 5e6
    )


def test_llama3_frequencies_scale_the_long_wavelengths_and_interpolate_the_band():
    """transformers ``_compute_llama3_parameters`` written out in float64 (Meta's ``apply_scaling``)."""
    rope = RopeArgs(rope_type="llama3", theta=500000.0, dim=128, factor=8.0, original_max_position_embeddings=8192,
                    low_freq_factor=1.0, high_freq_factor=4.0)  # fmt: skip
    inv, scaling = inv_freq_and_scaling(rope)
    base = 500000.0 ** (-np.arange(0, 128, 2) / 128)
    want = []
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4:
            want.append(f)
        elif wavelen > 8192 / 1:
            want.append(f / 8)
        else:
            s = (8192 / wavelen - 1) / (4 - 1)
            want.append((1 - s) * f / 8 + s * f)
    np.testing.assert_allclose(inv, want, rtol=3e-6)
    assert scaling == 1.0 and inv[0] == np.float32(1.0) and inv[-1] < base[-1] / 7.9
    assert ((base > 2 * math.pi / 8192) & (base < 4 * 2 * math.pi / 8192)).any()  # the band is populated
