"""Llama-4's text model (``llama4``: Scout, Maverick; transformers 5.24 ``modeling_llama4.py``).

```
x = x + o(attend(q, k, v))         RoPE layers: q, k rotated (pairs 2i, 2i+1), then L2-normed (no weight);
                                   chunked causal mask (key j seen by query p iff j <= p, j // C == p // C)
                                   NoPE layers: full causal mask, q *= log1p(floor((p + 1) / floor_scale)) *
                                   attn_scale + 1 (attention temperature tuning)
x = x + FFN(x)                     MoE layers: shared(x) + sum_e expert_e(x * sigmoid(l_e)) over the top-k
                                   router logits l (the gate scales the expert's input, not its output);
                                   dense layers: an MLP of intermediate_size_mlp
```
Layer schedules from config.json: ``moe_layers`` (else every ``interleave_moe_layer_step``-th layer),
``no_rope_layers`` (1 = RoPE; else every ``no_rope_layer_interval``-th layer NoPE), ``layer_types``
(``chunked_attention`` | ``full_attention``; else the RoPE layers are chunked when ``attention_chunk_size`` is set).
Checkpoint names ``feed_forward.{router, experts, shared_expert}`` are read as ``mlp.{gate, experts,
shared_experts}`` (``formats/names.py``); the stacks ``[E, H, 2I]`` are split by the converter. The vision tower
is never run. RoPE frequencies: ``rope_args`` (the published Scout's ``llama3`` scaling, ``rope.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats import model_config
from colitools.formats.names import module_path
from colitools.runtime.attention import GQAAttention, attend, causal_mask
from colitools.runtime.config import ConfigKeys, GQAArgs, attention_args, rope_args, routing_args
from colitools.runtime.family import LayerContext, RuntimeFamily
from colitools.runtime.moe import SparseMoE, _topk
from colitools.runtime.ops import MLP, rms_norm, sigmoid
from colitools.runtime.rope import Rope
from colitools.runtime.weights import Checkpoint

F32 = np.float32
_DEFAULTS = {  # transformers 5.24 Llama4TextConfig
    "rms_norm_eps": 1e-5, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "no_rope_layer_interval": 4,
    "use_qk_norm": True, "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
    "rope_theta": 500000.0,
}  # fmt: skip
_CHUNK_DEFAULT = 8192  # attention_chunk_size when config.json leaves it out (null: no chunking)


@dataclass(kw_only=True)
class Llama4Args(GQAArgs):
    rope_layers: list[bool]  # per layer: RoPE (True) or NoPE
    chunks: list[int | None]  # per layer: the attention chunk size, None for full attention
    l2_qk_norm: bool  # RoPE layers L2-normalise q and k after the rotation
    temperature: tuple[float, float] | None  # NoPE layers' (floor_scale, attn_scale); None: off
    intermediate_size_mlp: int  # the dense layers' MLP width


def _layer_lists(c: ConfigKeys, n: int, chunk: int | None) -> tuple[list[bool], list[bool], list[int | None]]:
    """The MoE, RoPE and chunk schedules (``Llama4TextConfig.__post_init__``)."""
    step = int(c["interleave_moe_layer_step"])
    moe = set(c.get("moe_layers") or range(step - 1, n, step))
    rope = c.get("no_rope_layers") or [int((i + 1) % int(c["no_rope_layer_interval"]) != 0) for i in range(n)]
    types = c.get("layer_types") or [
        "chunked_attention" if r and chunk is not None else "full_attention" for r in rope
    ]  # fmt: skip
    chunks = [int(chunk) if t == "chunked_attention" and chunk else None for t in types]
    return [i in moe for i in range(n)], [bool(r) for r in rope], chunks


class Llama4(RuntimeFamily):
    defaults = {"llama4": _DEFAULTS, "llama4_text": _DEFAULTS}

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> Llama4Args:
        """The layer schedules, the q/k L2 norm, temperature tuning; RoPE by interleaved pairs; experts (and the
        shared expert) of ``intermediate_size``, dense layers of ``intermediate_size_mlp``."""
        n_layers = base["num_hidden_layers"]
        # a null attention_chunk_size turns chunking off, an absent one is transformers' default
        chunk = model_config.text_config(base["raw"]).get("attention_chunk_size", _CHUNK_DEFAULT)
        moe, rope, chunks = _layer_lists(c, n_layers, chunk)
        tuning = bool(c["attn_temperature_tuning"])
        return Llama4Args(
            **{**base, "moe_layers": moe},
            attention=attention_args(c, n_layers),
            routing=routing_args(c, shared_expert_intermediate_size=base["moe_intermediate_size"]),
            rope=rope_args(c, base["head_dim"], interleaved=True),
            rope_layers=rope,
            chunks=chunks,
            l2_qk_norm=bool(c["use_qk_norm"]),
            temperature=(float(c["floor_scale"]), float(c["attn_scale"])) if tuning else None,
            intermediate_size_mlp=int(c.get("intermediate_size_mlp") or base["intermediate_size"]),
        )

    def layer(self, ctx: LayerContext, layer: int):
        args = ctx.args
        attn = Llama4Attention(args, ctx.ckpt, layer, ctx.rope)
        if args.moe_layers[layer]:
            ffn = Llama4MoE(args, ctx.ckpt, layer, ctx.expert_store(layer), ctx.layer_usage(layer))
        else:
            ffn = MLP(ctx.ckpt, module_path(layer, "mlp"), args.hidden_size, args.intermediate_size_mlp)
        return ctx.decoder_layer(layer, attn, ffn)


class Llama4Attention(GQAAttention):
    """GQA with Llama-4's per-layer options (``Llama4Args``): RoPE + L2 q/k norm + chunked mask, or NoPE +
    temperature tuning. A chunked layer's cache keeps only the keys of the current chunk between calls."""

    def __init__(self, args: Llama4Args, ckpt: Checkpoint, layer: int, rope: Rope):
        super().__init__(args, ckpt, layer, rope)
        self.use_rope, self.chunk = args.rope_layers[layer], args.chunks[layer]
        self.l2 = args.l2_qk_norm and self.use_rope
        self.temperature = args.temperature if not self.use_rope else None

    def __call__(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        N = x.shape[0]
        q = self.q(x).reshape(N, self.nq, self.D)
        k = self.k(x).reshape(N, self.nkv, self.D)
        if self.use_rope:
            q, k = self.rope.apply(q, cos, sin), self.rope.apply(k, cos, sin)
        if self.l2:  # Llama4TextL2Norm: x * rsqrt(mean(x^2) + eps), no weight
            q, k = rms_norm(q, F32(1.0), self.eps), rms_norm(k, F32(1.0), self.eps)
        if self.temperature is not None:
            floor_scale, attn_scale = self.temperature
            p = positions.astype(F32) + F32(1.0)
            scales = np.log1p(np.floor(p / F32(floor_scale))) * F32(attn_scale) + F32(1.0)
            q = q * scales.astype(F32)[:, None, None]
        K = self.kc.append(k)
        V = self.vc.append(self.v(x).reshape(N, self.nkv, self.D))
        allowed = causal_mask(positions, K.shape[0], None, self.first)
        if self.chunk:
            keys = self.first + np.arange(K.shape[0])
            allowed &= keys[None, :] // self.chunk == positions[:, None] // self.chunk
        out = attend(q, K, V, allowed, self.scale)
        if self.chunk:  # the next query (positions[-1] + 1) sees only keys of its own chunk
            self.first += self.kc.keep_last((int(positions[-1]) + 1) % self.chunk)
            self.vc.keep_last((int(positions[-1]) + 1) % self.chunk)
        return self.o(out)


class Llama4MoE(SparseMoE):
    """``Llama4TextMoe``: the top-k router logits (``mlp.gate``) give gates ``sigmoid(l)`` that scale each chosen
    expert's *input*; the shared expert (``mlp.shared_experts``) of every token is added."""

    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits = self.router(x)
        idx = _topk(logits, self.args.num_experts_per_tok)
        return idx, sigmoid(np.take_along_axis(logits.astype(F32), idx, axis=-1)).astype(F32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        idx, w = self.route(x)
        if self.usage is not None:
            self.usage.record(idx, w)
        out = np.zeros_like(x)
        for e in (int(e) for e in np.unique(idx)):  # ascending, as Llama4TextExperts sums them
            tok, pos = np.nonzero(idx == e)
            out[tok] += self.store.get(e)(x[tok] * w[tok, pos][:, None])
        return self.shared(x) + out


FAMILY = Llama4()
