"""GLM-4.5-MoE (``glm4_moe``): GQA with explicit ``head_dim``, q/k/v biases with ``attention_bias``, per-head
q/k RMSNorm with ``use_qk_norm``, partial rotary (the first ``head_dim * partial_rotary_factor`` dims of each
head, half layout), DeepSeek-style ``noaux_tc`` routing with a shared expert, dense first layers."""

from __future__ import annotations

from typing import Any

from colitools.runtime.attention import GQAAttention
from colitools.runtime.config import ConfigKeys, noaux_tc_args
from colitools.runtime.model import DecoderLayer, LayerContext

DEFAULTS = {  # transformers 5.24 Glm4MoeConfig
    "glm4_moe": {
        "rms_norm_eps": 1e-5, "norm_topk_prob": True, "routed_scaling_factor": 1.0, "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1, "partial_rotary_factor": 0.5,
    },
}  # fmt: skip


def family_args(c: ConfigKeys, base: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-style routing and layer schedule; RoPE is the default (half layout, partial rotary)."""
    return noaux_tc_args(c, base)


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    args = ctx.args
    attn = GQAAttention(args, ctx.ckpt, layer, qk_norm="head" if args.use_qk_norm else None, rope=ctx.rope)
    ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
    return ctx.decoder_layer(layer, attn, ffn)
