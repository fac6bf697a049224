"""Mixtral (``mixtral``): plain GQA with half-layout RoPE (optional sliding window), softmax top-k router always
renormalised. Checkpoint experts ``block_sparse_moe.experts.{E}.w1/w3/w2`` (gate/up/down) and router
``block_sparse_moe.gate`` are mapped onto the canonical ``mlp.*`` names by ``weights.sanitize``."""

from __future__ import annotations

from typing import Any

from colitools.runtime.config import ConfigKeys, GQAArgs, attention_args, rope_args, routing_args
from colitools.runtime.family import RuntimeFamily


class Mixtral(RuntimeFamily):
    defaults = {"mixtral": {"rms_norm_eps": 1e-5, "norm_topk_prob": True, "rope_theta": 1e6}}  # MixtralConfig

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> GQAArgs:
        """Every layer is MoE, experts sized by ``intermediate_size``; the router always renormalises; one
        ``sliding_window`` (or none) for every layer."""
        n_layers, window = base["num_hidden_layers"], c.get("sliding_window")
        return GQAArgs(
            **{**base, "moe_intermediate_size": base["intermediate_size"]},
            attention=attention_args(
                c, n_layers, sliding_windows=[int(window) if window else None] * n_layers
            ),
            routing=routing_args(c, norm_topk_prob=True),
            rope=rope_args(c, base["head_dim"]),
        )


FAMILY = Mixtral()
