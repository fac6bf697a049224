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

from dataclasses import dataclass
from typing import Any

from colitools.formats.errors import RuntimeModelError
from colitools.formats.families import family_of
from colitools.runtime.attention import GQAAttention
from colitools.runtime.config import (
    ConfigKeys,
    GQAArgs,
    LinearAttentionArgs,
    attention_args,
    rope_args,
    routing_args,
)
from colitools.runtime.family import DecoderLayer, LayerContext, RuntimeFamily
from colitools.runtime.linear_attention import GatedDeltaNet

_COMMON = {  # transformers 5.24 Qwen3NextConfig / Qwen3_5MoeTextConfig
    "rms_norm_eps": 1e-6, "num_key_value_heads": 2, "head_dim": 256, "partial_rotary_factor": 0.25,
    "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "full_attention_interval": 4, "shared_expert_intermediate_size": 512,
}  # fmt: skip
LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(kw_only=True)
class Qwen3NextArgs(GQAArgs):
    """The hybrid layer schedule and the Gated DeltaNet geometry."""

    layer_types: list[str]  # per layer "linear_attention" | "full_attention"
    linear_attention: LinearAttentionArgs


def _layer_types(c: ConfigKeys, n_layers: int) -> list[str]:
    types = c.get("layer_types")
    if types is None:
        interval = int(c["full_attention_interval"])
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    if len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
        raise RuntimeModelError(
            f"{c.where}: layer_types must list {n_layers} of {', '.join(LAYER_TYPES)}, got {types}"
        )
    return list(types)


class Qwen3Next(RuntimeFamily):
    defaults = {
        "qwen3_next": {**_COMMON, "norm_topk_prob": True, "decoder_sparse_step": 1},
        "qwen3_5_moe": dict(_COMMON),
        "qwen3_5_moe_text": dict(_COMMON),
    }

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> Qwen3NextArgs:
        """The hybrid layer schedule, the Gated DeltaNet geometry, the MoE schedule and the gated shared expert."""
        n_layers = base["num_hidden_layers"]
        types = _layer_types(c, n_layers)
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
        gate = family_of(c.model_type).gated_attention  # the family's geometry: q_proj is [query | gate]
        return Qwen3NextArgs(
            **{**base, "moe_layers": moe_layers, "zero_centred_norms": True},
            layer_types=types,
            linear_attention=la,
            attention=attention_args(c, n_layers, qk_norm="head", output_gate=gate),
            routing=routing_args(
                c,
                norm_topk_prob=norm_topk,
                shared_expert_gated=True,
                shared_expert_intermediate_size=int(c["shared_expert_intermediate_size"]),
            ),  # fmt: skip
            rope=rope_args(c, base["head_dim"]),
        )

    def layer(self, ctx: LayerContext, layer: int) -> DecoderLayer:
        args = ctx.args
        if args.layer_types[layer] == "linear_attention":
            attn = GatedDeltaNet(args, ctx.ckpt, layer)
        else:
            attn = GQAAttention(args, ctx.ckpt, layer, rope=ctx.rope)
        ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
        return ctx.decoder_layer(layer, attn, ffn)


FAMILY = Qwen3Next()
