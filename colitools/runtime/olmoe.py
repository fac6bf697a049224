"""OLMoE (``olmoe``): q/k RMSNorm over the whole projection (before the head split and RoPE), optional
``clip_qkv``, softmax top-k router renormalised only with ``norm_topk_prob``; every layer is MoE."""

from __future__ import annotations

from typing import Any

from colitools.runtime.attention import GQAAttention
from colitools.runtime.config import ConfigKeys
from colitools.runtime.model import DecoderLayer, LayerContext

DEFAULTS = {"olmoe": {"rms_norm_eps": 1e-5, "norm_topk_prob": False}}  # transformers 5.24 OlmoeConfig


def family_args(c: ConfigKeys, base: dict[str, Any]) -> dict[str, Any]:
    """Every layer is MoE; experts are sized by ``intermediate_size``."""
    return dict(
        moe_layers=[True] * base["num_hidden_layers"], moe_intermediate_size=base["intermediate_size"]
    )


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    attn = GQAAttention(ctx.args, ctx.ckpt, layer, qk_norm="full", rope=ctx.rope)
    return ctx.decoder_layer(layer, attn, ctx.sparse_moe(layer))
