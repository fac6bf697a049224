"""A tiny Kimi K3 checkpoint (``model_type`` ``kimi_k3``), built from the names and shapes colibri's K3 engine
loads (``c/kimi_k3.c`` ``load_cfg`` / ``model_init`` / ``expert_table_init``, read for facts only): one KDA layer
with a dense MLP (``first_k_dense_replace`` 1) and one gated-MLA layer with the LatentMoE block (router,
``routed_expert_norm``, latent ``routed_expert_down_proj`` / ``routed_expert_up_proj``, shared experts, routed
experts ``block_sparse_moe.experts.{E}.w1/w2/w3`` in the ``routed_expert_hidden_size`` latent), AttnRes
``*_res_norm`` / ``*_res_proj`` vectors, all under ``language_model.``. BF16 values, one shard. No transformers
class exists for it; this checkpoint is a conversion source only (the token-exact oracle is
``oracles/kimi_k3``, referenced by ``oracles/k3_reference.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from tinyckpt import write_tensors

H, V, DENSE_I = 64, 96, 96  # hidden, vocab, dense MLP width
HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V_HEAD = 2, 32, 32, 16, 16, 16  # gated MLA
KDA_HEADS, KDA_HD, CONV_K = 2, 32, 4  # KDA: projections P = 64
P = KDA_HEADS * KDA_HD
E, TOPK, MOE_I, LATENT, N_SHARED = 4, 2, 64, 32, 1  # LatentMoE: experts in the 32-wide latent
PREFIX = "language_model."


def text_config() -> dict:
    return {
        "model_type": "kimi_linear",
        "hidden_size": H, "num_hidden_layers": 2, "vocab_size": V, "first_k_dense_replace": 1,
        "intermediate_size": DENSE_I, "num_attention_heads": HEADS, "q_lora_rank": Q_LORA,
        "kv_lora_rank": KV_LORA, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": V_HEAD,
        "num_experts": E, "num_experts_per_token": TOPK, "moe_intermediate_size": MOE_I,
        "routed_expert_hidden_size": LATENT, "num_shared_experts": N_SHARED, "attn_res_block_size": 2,
        "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "rms_norm_eps": 1e-5,
        "linear_attn_config": {"num_heads": KDA_HEADS, "head_dim": KDA_HD, "short_conv_kernel_size": CONV_K,
                               "kda_layers": [1], "full_attn_layers": [2]},
    }  # fmt: skip


def shapes() -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H),
        "model.output_attn_res_norm.weight": (H,), "model.output_attn_res_proj.weight": (H,),
    }  # fmt: skip
    for i in range(2):
        L = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
                  "self_attention_res_proj", "mlp_res_norm", "mlp_res_proj"):  # fmt: skip
            out[L + n + ".weight"] = (H,)
    a = "model.layers.0.self_attn."  # KDA
    out.update({a + f"{p}.weight": (P, H) for p in ("q_proj", "k_proj", "v_proj", "g_proj")})
    out.update({a + f"{p}_conv1d.weight": (P, 1, CONV_K) for p in ("q", "k", "v")})
    out.update({a + "o_proj.weight": (H, P), a + "f_a_proj.weight": (KDA_HD, H), a + "f_b_proj.weight": (P, KDA_HD),
                a + "b_proj.weight": (KDA_HEADS, H), a + "dt_bias": (P,), a + "o_norm.weight": (KDA_HD,),
                a + "A_log": (KDA_HD,)})  # fmt: skip
    m = "model.layers.0.mlp."
    out.update({m + "gate_proj.weight": (DENSE_I, H), m + "up_proj.weight": (DENSE_I, H),
                m + "down_proj.weight": (H, DENSE_I)})  # fmt: skip
    a = "model.layers.1.self_attn."  # gated MLA
    out.update({
        a + "q_a_proj.weight": (Q_LORA, H), a + "q_b_proj.weight": (HEADS * (NOPE + ROPE), Q_LORA),
        a + "kv_a_proj_with_mqa.weight": (KV_LORA + ROPE, H), a + "kv_b_proj.weight": (HEADS * (NOPE + V_HEAD), KV_LORA),
        a + "o_proj.weight": (H, HEADS * V_HEAD), a + "g_proj.weight": (HEADS * V_HEAD, H),
        a + "q_a_layernorm.weight": (Q_LORA,), a + "kv_a_layernorm.weight": (KV_LORA,),
    })  # fmt: skip
    b = "model.layers.1.block_sparse_moe."
    out.update({
        b + "gate.weight": (E, H), b + "gate.e_score_correction_bias": (E,), b + "routed_expert_norm.weight": (LATENT,),
        b + "routed_expert_down_proj.weight": (LATENT, H), b + "routed_expert_up_proj.weight": (H, LATENT),
        b + "shared_experts.gate_proj.weight": (MOE_I * N_SHARED, H),
        b + "shared_experts.up_proj.weight": (MOE_I * N_SHARED, H),
        b + "shared_experts.down_proj.weight": (H, MOE_I * N_SHARED),
    })  # fmt: skip
    for e in range(E):
        x = f"{b}experts.{e}."
        out.update({x + "w1.weight": (MOE_I, LATENT), x + "w2.weight": (LATENT, MOE_I), x + "w3.weight": (MOE_I, LATENT)})
    return {PREFIX + name: shape for name, shape in out.items()}


def make_k3(folder: Path, seed: int = 7) -> dict[str, np.ndarray]:
    """Write the checkpoint to ``folder``; returns every tensor's float32 value (BF16-exact)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes().items():
        w = rng.standard_normal(shape).astype(np.float32) * np.float32(0.1)
        tensors[name] = w.astype(ml_dtypes.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    write_tensors(folder, tensors, 1)
    config = {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"], "text_config": text_config()}
    (folder / "config.json").write_text(json.dumps(config))
    return {n: t.astype(np.float32) for n, t in tensors.items()}
