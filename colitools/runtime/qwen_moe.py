"""Qwen2-MoE (``qwen2_moe``) and Qwen3-MoE (``qwen3_moe``).

Qwen3: explicit ``head_dim``, per-head q/k RMSNorm after the head split (before RoPE), no biases.
Qwen2: q/k/v biases, no qk-norm, a shared expert gated by ``sigmoid(x . shared_expert_gate^T)``.
Both: softmax top-k router (renormalised with ``norm_topk_prob``); layer ``L`` is MoE iff it is not in
``mlp_only_layers`` and ``(L + 1) % decoder_sparse_step == 0``, else a dense MLP of ``intermediate_size``.
"""

from __future__ import annotations

from typing import Any

from colitools.runtime.config import ConfigKeys, GQAArgs, attention_args, rope_args, routing_args
from colitools.runtime.family import RuntimeFamily


class QwenMoe(RuntimeFamily):
    defaults = {  # transformers 5.24 Qwen2MoeConfig / Qwen3MoeConfig
        "qwen2_moe": {"rms_norm_eps": 1e-6, "norm_topk_prob": False, "decoder_sparse_step": 1},
        "qwen3_moe": {"rms_norm_eps": 1e-6, "norm_topk_prob": False, "decoder_sparse_step": 1},
    }

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> GQAArgs:
        """The MoE layer schedule, Qwen2's gated shared expert, Qwen3's per-head q/k norm, the sliding windows."""
        n_layers = base["num_hidden_layers"]
        qwen2 = c.model_type == "qwen2_moe"
        shared = dict(shared_expert_intermediate_size=int(c.get("shared_expert_intermediate_size", 0)),
                      shared_expert_gated=True) if qwen2 else {}  # fmt: skip
        return GQAArgs(
            **{**base, "moe_layers": moe_schedule(c, n_layers)},
            attention=attention_args(
                c, n_layers, qk_norm=None if qwen2 else "head", sliding_windows=_sliding_windows(c, n_layers)
            ),  # fmt: skip
            routing=routing_args(c, **shared),
            rope=rope_args(c, base["head_dim"]),
        )


def moe_schedule(c: ConfigKeys, n_layers: int) -> list[bool]:
    """Per layer: MoE iff not in ``mlp_only_layers`` and ``(L + 1) % decoder_sparse_step == 0`` (Qwen2/3-MoE,
    Qwen3-VL-MoE)."""
    step = int(c.get("decoder_sparse_step") or 1)
    only = set(c.get("mlp_only_layers") or [])
    return [(i not in only) and (i + 1) % step == 0 for i in range(n_layers)]


def _sliding_windows(c: ConfigKeys, n_layers: int) -> list[int | None]:
    """Qwen3: one window for every layer with ``use_sliding_window``. Qwen2: windows on the
    ``sliding_attention`` layers of ``layer_types`` (default: odd layers below ``max_window_layers``)."""
    window = c.get("sliding_window")
    if c.model_type == "qwen3_moe":
        on = bool(c.get("use_sliding_window")) and window
        return [int(window) if on else None] * n_layers
    if c.get("use_sliding_window") and window:
        types = c.get("layer_types") or [
            "sliding_attention"
            if (i + 1) % 2 and i < int(c.get("max_window_layers", 28))
            else "full_attention"
            for i in range(n_layers)
        ]
        return [int(window) if t == "sliding_attention" else None for t in types]
    return [None] * n_layers


FAMILY = QwenMoe()
