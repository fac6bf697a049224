"""OLMoE (``olmoe``): q/k RMSNorm over the whole projection (before the head split and RoPE), optional
``clip_qkv``, softmax top-k router renormalised only with ``norm_topk_prob``; every layer is MoE."""

from __future__ import annotations

from typing import Any

from colitools.runtime.config import ConfigKeys, GQAArgs, attention_args, rope_args, routing_args
from colitools.runtime.family import RuntimeFamily


class Olmoe(RuntimeFamily):
    defaults = {"olmoe": {"rms_norm_eps": 1e-5, "norm_topk_prob": False}}  # transformers 5.24 OlmoeConfig

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> GQAArgs:
        """Every layer is MoE; experts are sized by ``intermediate_size``."""
        return GQAArgs(
            **{**base, "moe_intermediate_size": base["intermediate_size"]},
            attention=attention_args(c, base["num_hidden_layers"], qk_norm="full"),
            routing=routing_args(c),
            rope=rope_args(c, base["head_dim"]),
        )


FAMILY = Olmoe()
