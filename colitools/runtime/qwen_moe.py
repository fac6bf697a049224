"""Qwen2-MoE (``qwen2_moe``) and Qwen3-MoE (``qwen3_moe``).

Qwen3: explicit ``head_dim``, per-head q/k RMSNorm after the head split (before RoPE), no biases.
Qwen2: q/k/v biases, no qk-norm, a shared expert gated by ``sigmoid(x . shared_expert_gate^T)``.
Both: softmax top-k router (renormalised with ``norm_topk_prob``); layer ``L`` is MoE iff it is not in
``mlp_only_layers`` and ``(L + 1) % decoder_sparse_step == 0``, else a dense MLP of ``intermediate_size``.
"""

from __future__ import annotations

from colitools.runtime.attention import GQAAttention
from colitools.runtime.model import DecoderLayer, LayerContext


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    qk_norm = "head" if ctx.args.model_type == "qwen3_moe" else None
    attn = GQAAttention(ctx.args, ctx.ckpt, layer, qk_norm=qk_norm, rope=ctx.rope)
    ffn = ctx.sparse_moe(layer) if ctx.args.moe_layers[layer] else ctx.dense_mlp(layer)
    return ctx.decoder_layer(layer, attn, ffn)
