"""Qwen3-VL-MoE's text model (``qwen3_vl_moe``: Qwen3-VL-30B-A3B, 235B-A22B), run on text positions.

The decoder is Qwen3-MoE's: per-head q/k RMSNorm before RoPE, softmax top-k router always renormalised (its router
has no ``norm_topk_prob``), layer ``L`` MoE unless in ``mlp_only_layers`` or off the ``decoder_sparse_step``, no
shared expert. The vision tower (``model.visual.*``, DeepStack) is never run.

Multimodal RoPE on text: ``Qwen3VLMoeTextRotaryEmbedding`` takes three position rows (t, h, w) and, per frequency
``i``, the angle of row ``h`` for ``i % 3 == 1``, of row ``w`` for ``i % 3 == 2`` (below ``3 * mrope_section``),
else row ``t`` (``mrope_interleaved``; the sectioned layout picks whole ranges instead). A text-only input has
``t == h == w`` == the token position (``get_rope_index``: ``arange`` plus the cache length, ``rope_deltas`` 0), so
every pick is the same angle: the plain half-split RoPE over the whole ``head_dim``, whatever ``mrope_section``
says. The expert stacks are split by the converter (``formats/families.py`` ``QWEN3_VL_MOE``).
"""

from __future__ import annotations

from typing import Any

from colitools.runtime.config import ConfigKeys, GQAArgs, attention_args, rope_args, routing_args
from colitools.runtime.family import RuntimeFamily
from colitools.runtime.qwen_moe import moe_schedule

_DEFAULTS = {"rms_norm_eps": 1e-6, "decoder_sparse_step": 1}  # transformers 5.24 Qwen3VLMoeTextConfig


class Qwen3VLMoe(RuntimeFamily):
    defaults = {"qwen3_vl_moe": _DEFAULTS, "qwen3_vl_moe_text": _DEFAULTS}

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> GQAArgs:
        """Qwen3-MoE's layer schedule and per-head q/k norm; the router always renormalises; text-position RoPE."""
        n_layers = base["num_hidden_layers"]
        return GQAArgs(
            **{**base, "moe_layers": moe_schedule(c, n_layers)},
            attention=attention_args(c, n_layers, qk_norm="head"),
            routing=routing_args(c, norm_topk_prob=True),
            rope=rope_args(c, base["head_dim"]),
        )


FAMILY = Qwen3VLMoe()
