"""Mixtral (``mixtral``): plain GQA with half-layout RoPE (optional sliding window), softmax top-k router always
renormalised. Checkpoint experts ``block_sparse_moe.experts.{E}.w1/w3/w2`` (gate/up/down) and router
``block_sparse_moe.gate`` are mapped onto the canonical ``mlp.*`` names by ``weights.sanitize``."""

from __future__ import annotations

from typing import Any

from colitools.runtime.attention import GQAAttention
from colitools.runtime.config import ConfigKeys
from colitools.runtime.model import DecoderLayer, LayerContext

DEFAULTS = {"mixtral": {"rms_norm_eps": 1e-5, "norm_topk_prob": True, "rope_theta": 1e6}}  # MixtralConfig


def family_args(c: ConfigKeys, base: dict[str, Any]) -> dict[str, Any]:
    """Every layer is MoE, experts sized by ``intermediate_size``; the router always renormalises; one
    ``sliding_window`` (or none) for every layer."""
    n_layers, window = base["num_hidden_layers"], c.get("sliding_window")
    return dict(
        moe_layers=[True] * n_layers,
        moe_intermediate_size=base["intermediate_size"],
        norm_topk_prob=True,
        sliding_windows=[int(window) if window else None] * n_layers,
    )


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    attn = GQAAttention(ctx.args, ctx.ckpt, layer, qk_norm=None, rope=ctx.rope)
    return ctx.decoder_layer(layer, attn, ctx.sparse_moe(layer))
