"""OLMoE (``olmoe``): q/k RMSNorm over the whole projection (before the head split and RoPE), optional
``clip_qkv``, softmax top-k router renormalised only with ``norm_topk_prob``; every layer is MoE."""

from __future__ import annotations

from colitools.runtime.attention import GQAAttention
from colitools.runtime.model import DecoderLayer, LayerContext


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    attn = GQAAttention(ctx.args, ctx.ckpt, layer, qk_norm="full", rope=ctx.rope)
    return ctx.decoder_layer(layer, attn, ctx.sparse_moe(layer))
