"""Mixtral (``mixtral``): plain GQA with half-layout RoPE (optional sliding window), softmax top-k router always
renormalised. Checkpoint experts ``block_sparse_moe.experts.{E}.w1/w3/w2`` (gate/up/down) and router
``block_sparse_moe.gate`` are mapped onto the canonical ``mlp.*`` names by ``weights.sanitize``."""

from __future__ import annotations

from colitools.runtime.attention import GQAAttention
from colitools.runtime.model import DecoderLayer, LayerContext


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    attn = GQAAttention(ctx.args, ctx.ckpt, layer, qk_norm=None, rope=ctx.rope)
    return ctx.decoder_layer(layer, attn, ctx.sparse_moe(layer))
