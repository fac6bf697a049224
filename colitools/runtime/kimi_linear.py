"""Kimi-Linear (``kimi_linear``; transformers ``modeling_kimi_linear.py``): KDA linear-attention layers
(``kda.py``) interleaved with MLA full-attention layers, DeepSeek-style grouped routing.

* ``layer_types`` (``linear_attention`` | ``full_attention``; default full attention on layers
  ``i > 0, i % 4 == 0``). A hub config's ``linear_attn_config`` (1-based ``kda_layers`` /
  ``full_attn_layers``, the KDA geometry) is read as the common keys by ``formats/model_config.canonical_keys``.
* MLA without RoPE: ``q_proj`` (or ``q_a -> RMSNorm -> q_b``), the latent ``kv_a_proj_with_mqa``'s last
  ``qk_rope_head_dim`` values are a key slice shared by all heads, neither normalised nor rotated; softmax
  scale ``(qk_nope_head_dim + qk_rope_head_dim)^-0.5``; ``kv_a_layernorm`` eps 1e-6.
* MoE (``mlp_layer_types``, default the first ``first_k_dense_replace`` = 1 layer dense): ``noaux_tc``
  routing over ``num_expert_group`` groups, ``num_shared_experts`` shared experts; experts on disk as
  ``block_sparse_moe.experts.{E}.w1/w3/w2`` (read as ``mlp.experts.{E}.gate/up/down_proj``, ``formats/names.py``).
  The config spells shared keys its own way (``num_experts_per_token``, ``moe_renormalize``, ...:
  ``formats/families.py``: ``Family.key_aliases``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from colitools.formats.errors import RuntimeModelError
from colitools.runtime.attention import MLAAttention
from colitools.runtime.config import (
    ConfigKeys,
    KDAArgs,
    MLAArgs,
    ModelArgs,
    RopeArgs,
    mla_args,
    mla_head_dim,
    noaux_tc_args,
)
from colitools.runtime.family import DecoderLayer, LayerContext, RuntimeFamily
from colitools.runtime.kda import KimiDeltaAttention

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(kw_only=True)
class KimiLinearArgs(ModelArgs):
    """The hybrid layer schedule, the KDA geometry and MLA."""

    layer_types: list[str]  # per layer "linear_attention" (KDA) | the attention type
    kda: KDAArgs
    mla: MLAArgs


def kda_layer_types(c: ConfigKeys, n_layers: int, names: tuple[str, str], default: list[str]) -> list[str]:
    """``layer_types`` checked against ``names`` (the KDA type, the attention type), else ``default``."""
    types = c.get("layer_types") or default
    if len(types) != n_layers or any(t not in names for t in types):
        raise RuntimeModelError(f"{c.where}: layer_types must list {n_layers} of {', '.join(names)}, got {types}")
    return list(types)


class KimiLinear(RuntimeFamily):
    defaults = {  # transformers 5.24 KimiLinearConfig (common spellings)
        "kimi_linear": {
            "rms_norm_eps": 1e-5, "norm_topk_prob": True, "routed_scaling_factor": 2.446, "n_group": 1,
            "topk_group": 1, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
            "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
            "linear_head_dim": 128, "linear_num_heads": 32, "linear_conv_kernel_dim": 4,
            "max_position_embeddings": 1048576,
        },
    }  # fmt: skip

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> KimiLinearArgs:
        """The layer schedule, the KDA geometry, MLA dimensions (no RoPE) and the grouped routing."""
        n_layers = base["num_hidden_layers"]
        default = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n_layers)]
        moe_layers, routing = noaux_tc_args(c, base)
        types = kda_layer_types(c, n_layers, LAYER_TYPES, default)
        kda = KDAArgs(
            conv_kernel=int(c["linear_conv_kernel_dim"]),
            num_heads=int(c["linear_num_heads"]),
            head_dim=int(c["linear_head_dim"]),
            lower_bound=None,
            a_log_4d=True,
        )
        mla = mla_args(c, base)
        return KimiLinearArgs(
            **{**base, "moe_layers": moe_layers, "head_dim": mla_head_dim(mla)},
            layer_types=types, kda=kda, mla=mla, routing=routing,
            rope=RopeArgs(dim=0),  # no RoPE: the "rope" key slice passes through unrotated
        )  # fmt: skip

    def layer(self, ctx: LayerContext, layer: int) -> DecoderLayer:
        args = ctx.args
        if args.layer_types[layer] == "linear_attention":
            attn = KimiDeltaAttention(args, ctx.ckpt, layer)
        else:
            attn = MLAAttention(args, ctx.ckpt, layer, ctx.rope, None)
        ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
        return ctx.decoder_layer(layer, attn, ffn)


FAMILY = KimiLinear()
