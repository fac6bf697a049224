"""gpt-oss (``gpt_oss``), transformers 5.24 ``modeling_gpt_oss.py``.

* Attention: GQA with q/k/v/o biases, half-layout RoPE over ``head_dim`` (YaRN by default: factor 32,
  ``truncate: false``, ``attention_factor`` 0.1 ln 32 + 1 on cos/sin), a learned per-head sink logit
  ``self_attn.sinks`` in every softmax denominator, ``layer_types``: ``sliding_attention`` layers see the last
  ``sliding_window`` positions (themselves included), ``full_attention`` layers everything.
* Router ``mlp.router.{weight, bias}`` (canonical ``mlp.gate.*``): top-k of the biased logits, weights = softmax
  over those k logits.
* Experts: ``gate = min(x Wg + bg, limit)``, ``up = clip(x Wu + bu, -limit, limit)``,
  ``out = ((up + 1) * gate * sigmoid(alpha * gate)) Wd + bd`` (``swiglu_alpha`` 1.702, ``swiglu_limit`` 7).
  The checkpoint's stacks ``experts.gate_up_proj [E, H, 2I]`` (gate = even columns, up = odd) and
  ``down_proj [E, I, H]`` with ``gate_up_proj_bias [E, 2I]`` / ``down_proj_bias [E, H]`` are read in place
  (``formats/families.py``: transposed-interleaved), and so are openai's native MXFP4 stacks ``gate_up_proj_blocks`` / ``_scales``
  (gate = even rows; kept as mxfp4 codes); a converted container has per-expert
  ``experts.{E}.{gate,up,down}_proj.weight`` in any format plus F32 ``.bias`` vectors, read and cached with
  their expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.names import STACK_BIASES, expert_tensor_name, module_path
from colitools.runtime.attention import GQAAttention
from colitools.runtime.config import ConfigKeys, GQAArgs, attention_args, rope_args, routing_args
from colitools.runtime.experts import Expert
from colitools.runtime.family import DecoderLayer, LayerContext, RuntimeFamily
from colitools.runtime.ops import sigmoid
from colitools.runtime.weights import Checkpoint, Stored

F32 = np.float32

# transformers 5.24 GptOssConfig (its rope_parameters default when a config has none, rope_theta 150000)
DEFAULT_ROPE = {
    "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
    "original_max_position_embeddings": 4096,
}  # fmt: skip


@dataclass(kw_only=True)
class GptOssArgs(GQAArgs):
    """gpt-oss's clamped SwiGLU experts."""

    swiglu_limit: float
    swiglu_alpha: float


class ClampedSwiGLUExpert(Expert):
    """A gpt-oss expert: clamped SwiGLU with ``(up + 1)`` and biases on all three projections."""

    __slots__ = ("alpha", "limit")

    def __init__(self, gate, up, down, biases, alpha: float, limit: float):
        super().__init__(gate, up, down, biases)
        self.alpha, self.limit = F32(alpha), F32(limit)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        bg, bu, bd = self.biases
        gate = np.minimum(self.gate.matmul(x) + bg, self.limit)
        up = np.clip(self.up.matmul(x) + bu, -self.limit, self.limit)
        glu = gate * sigmoid(gate * self.alpha)
        return self.down.matmul((up + F32(1)) * glu) + bd


def expert_biases(args, ckpt: Checkpoint, layer: int) -> list[tuple[Stored, Stored, Stored]]:
    """The (gate, up, down) biases of every expert: per-expert ``experts.{E}.{proj}.bias`` (converted
    containers), else entries of the stack biases (gate / up interleaved like the stack's columns)."""
    p = module_path(layer, "mlp.experts")
    H, I, E = args.hidden_size, args.moe_intermediate_size, args.num_experts
    if ckpt.has(expert_tensor_name(p, 0, "gate", "bias")):
        return [
            tuple(ckpt.vector_stored(expert_tensor_name(p, e, proj, "bias"), n)
                  for proj, n in (("gate", I), ("up", I), ("down", H)))
            for e in range(E)
        ]  # fmt: skip
    gate_up, down = (
        f"{p}.{next(k for k, v in STACK_BIASES.items() if v == proj)}" for proj in ("gate_up", "down")
    )
    for name in (gate_up, down):
        if not ckpt.has(name):
            raise RuntimeModelError(f"{ckpt.dir}: missing tensor {name} (gpt-oss expert biases)")
    return [
        (ckpt.stack_bias(gate_up, e, E, 0, 2, I), ckpt.stack_bias(gate_up, e, E, 1, 2, I),
         ckpt.stack_bias(down, e, E, 0, 1, H))
        for e in range(E)
    ]  # fmt: skip


class GptOss(RuntimeFamily):
    defaults = {
        "gpt_oss": {
            "rms_norm_eps": 1e-5, "head_dim": 64, "sliding_window": 128, "rope_theta": 150000.0,
            "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "max_position_embeddings": 131072,
        },
    }  # fmt: skip

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> GptOssArgs:
        """Every layer is MoE with experts of ``intermediate_size``; sliding windows from ``layer_types`` (default:
        even layers sliding); sinks; the top-k-then-softmax router; clamped SwiGLU; RoPE (YaRN by default)."""
        n_layers = base["num_hidden_layers"]
        types = c.get("layer_types") or [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)
        ]
        if len(types) != n_layers or set(types) - {"sliding_attention", "full_attention"}:
            raise RuntimeModelError(
                f"{c.where}: layer_types must list sliding_attention / full_attention for each of {n_layers} layers"
            )
        window = c.get("sliding_window")
        windows = [int(window) if t == "sliding_attention" and window else None for t in types]
        if not (c.get("rope_parameters") or c.get("rope_scaling")):
            c = ConfigKeys(c.model_type, {**c, "rope_parameters": DEFAULT_ROPE}, c.where)
        return GptOssArgs(
            **{**base, "moe_intermediate_size": base["intermediate_size"]},
            attention=attention_args(c, n_layers, sliding_windows=windows, sinks=True),
            routing=routing_args(c, router="topk_softmax"),
            swiglu_limit=float(c["swiglu_limit"]),
            swiglu_alpha=float(c["swiglu_alpha"]),
            rope=rope_args(c, base["head_dim"]),
        )

    def layer(self, ctx: LayerContext, layer: int) -> DecoderLayer:
        args = ctx.args
        attn = GQAAttention(args, ctx.ckpt, layer, rope=ctx.rope)
        alpha, limit = args.swiglu_alpha, args.swiglu_limit

        def make(gate, up, down, biases):
            return ClampedSwiGLUExpert(gate, up, down, biases, alpha, limit)

        return ctx.decoder_layer(
            layer, attn, ctx.sparse_moe(layer, expert_biases(args, ctx.ckpt, layer), make)
        )


FAMILY = GptOss()
