"""GLM-4.5-MoE (``glm4_moe``): GQA with explicit ``head_dim``, q/k/v biases with ``attention_bias``, per-head
q/k RMSNorm with ``use_qk_norm``, partial rotary (the first ``head_dim * partial_rotary_factor`` dims of each
head, half layout), DeepSeek-style ``noaux_tc`` routing with a shared expert, dense first layers."""

from __future__ import annotations

from colitools.runtime.attention import GQAAttention
from colitools.runtime.model import DecoderLayer, LayerContext


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    args = ctx.args
    attn = GQAAttention(args, ctx.ckpt, layer, qk_norm="head" if args.use_qk_norm else None, rope=ctx.rope)
    ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
    return ctx.decoder_layer(layer, attn, ffn)
