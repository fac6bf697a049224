"""GLM-4.5-MoE (``glm4_moe``): GQA with explicit ``head_dim``, q/k/v biases with ``attention_bias``, per-head
q/k RMSNorm with ``use_qk_norm``, partial rotary (the first ``head_dim * partial_rotary_factor`` dims of each
head, half layout), DeepSeek-style ``noaux_tc`` routing with a shared expert, dense first layers."""

from __future__ import annotations

from typing import Any

from colitools.runtime.config import ConfigKeys, GQAArgs, attention_args, noaux_tc_args, rope_args
from colitools.runtime.family import RuntimeFamily


class Glm4Moe(RuntimeFamily):
    defaults = {  # transformers 5.24 Glm4MoeConfig
        "glm4_moe": {
            "rms_norm_eps": 1e-5, "norm_topk_prob": True, "routed_scaling_factor": 1.0, "n_group": 1,
            "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1, "partial_rotary_factor": 0.5,
        },
    }  # fmt: skip

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> GQAArgs:
        """DeepSeek-style routing and layer schedule; RoPE is the default (half layout, partial rotary)."""
        moe_layers, routing = noaux_tc_args(c, base)
        qk_norm = "head" if c.get("use_qk_norm", False) else None
        return GQAArgs(
            **{**base, "moe_layers": moe_layers},
            attention=attention_args(c, base["num_hidden_layers"], qk_norm=qk_norm),
            routing=routing,
            rope=rope_args(c, base["head_dim"]),
        )


FAMILY = Glm4Moe()
