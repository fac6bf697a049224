"""Qwen3-Next (``qwen3_next``) and Qwen3.5/3.6-MoE (``qwen3_5_moe``, text type ``qwen3_5_moe_text``): hybrid
layers (transformers ``modeling_qwen3_next.py`` / ``modeling_qwen3_5_moe.py``).

* ``layer_types`` (default: full attention every ``full_attention_interval`` = 4th layer) picks per layer a
  Gated DeltaNet (``linear_attention.py``; Qwen3-Next's projections fused head-grouped as ``in_proj_qkvz`` /
  ``in_proj_ba``, Qwen3.5's separate ``in_proj_qkv/z/a/b``) or full attention with an output gate (``q_proj``
  twice as wide), per-head q/k RMSNorm and partial RoPE (``partial_rotary_factor``, default 0.25, half layout
  over the first rotary dims). Qwen3.5's multimodal RoPE is 1-D RoPE for text: its three position rows are
  equal without images.
* Every RMSNorm but the gated one is zero-centred: the checkpoint stores ``w``, the norm scales by ``1 + w``.
* MoE: softmax top-k (Qwen3-Next renormalises with ``norm_topk_prob``, Qwen3.5 always) plus a shared expert
  gated by ``sigmoid(x . shared_expert_gate^T)``. Qwen3-Next layer ``L`` is a dense MLP of
  ``intermediate_size`` when in ``mlp_only_layers`` or ``(L + 1) % decoder_sparse_step != 0``; every Qwen3.5
  layer is MoE.
* Qwen3.5's text model lives under ``model.language_model.`` (read under the canonical ``model.``); the vision
  tower is not run.
"""

from __future__ import annotations

from typing import Any

from colitools.errors import RuntimeModelError
from colitools.formats.families import family_of
from colitools.runtime.attention import GQAAttention
from colitools.runtime.config import ConfigKeys, LinearAttentionArgs
from colitools.runtime.linear_attention import GatedDeltaNet
from colitools.runtime.model import DecoderLayer, LayerContext

_COMMON = {  # transformers 5.24 Qwen3NextConfig / Qwen3_5MoeTextConfig
    "rms_norm_eps": 1e-6, "num_key_value_heads": 2, "head_dim": 256, "partial_rotary_factor": 0.25,
    "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "full_attention_interval": 4, "shared_expert_intermediate_size": 512,
}  # fmt: skip
DEFAULTS = {
    "qwen3_next": {**_COMMON, "norm_topk_prob": True, "decoder_sparse_step": 1},
    "qwen3_5_moe": dict(_COMMON),
    "qwen3_5_moe_text": dict(_COMMON),
}
LAYER_TYPES = ("linear_attention", "full_attention")


def family_args(c: ConfigKeys, base: dict[str, Any]) -> dict[str, Any]:
    """The hybrid layer schedule, the Gated DeltaNet geometry, the MoE schedule and the gated shared expert."""
    n_layers = base["num_hidden_layers"]
    types = c.get("layer_types")
    if types is None:
        interval = int(c["full_attention_interval"])
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    if len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
        raise RuntimeModelError(
            f"{c.where}: layer_types must list {n_layers} of {', '.join(LAYER_TYPES)}, got {types}"
        )
    la = LinearAttentionArgs(
        conv_kernel=int(c["linear_conv_kernel_dim"]),
        num_key_heads=int(c["linear_num_key_heads"]),
        num_value_heads=int(c["linear_num_value_heads"]),
        key_head_dim=int(c["linear_key_head_dim"]),
        value_head_dim=int(c["linear_value_head_dim"]),
        fused_projections=c.model_type == "qwen3_next",
    )
    if la.num_value_heads % la.num_key_heads:
        raise RuntimeModelError(
            f"{c.where}: {la.num_value_heads} linear value heads do not split into {la.num_key_heads} key heads"
        )
    if c.model_type == "qwen3_next":
        step = int(c["decoder_sparse_step"])
        only = set(c.get("mlp_only_layers") or [])
        moe_layers = [(i not in only) and (i + 1) % step == 0 for i in range(n_layers)]
        norm_topk = bool(c["norm_topk_prob"])
    else:
        moe_layers, norm_topk = [True] * n_layers, True  # Qwen3_5MoeTopKRouter always renormalises
    return dict(
        layer_types=list(types),
        linear_attention=la,
        attn_output_gate=family_of(c.model_type).gated_attention,
        zero_centred_norms=True,
        use_qk_norm=True,
        moe_layers=moe_layers,
        norm_topk_prob=norm_topk,
        shared_expert_intermediate_size=int(c["shared_expert_intermediate_size"]),
        shared_expert_gated=True,
    )


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    args = ctx.args
    if args.layer_types[layer] == "linear_attention":
        attn = GatedDeltaNet(args, ctx.ckpt, layer)
    else:
        attn = GQAAttention(args, ctx.ckpt, layer, qk_norm="head", rope=ctx.rope)
    ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
    return ctx.decoder_layer(layer, attn, ffn)
