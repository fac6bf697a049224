"""Inkling-2 (``inkling2``, text type ``inkling2_text``), transformers 5.24 ``modeling_inkling2.py``; the text model
only (the vision tower is not run). Native names ``model.llm.*`` (read under ``model.``); what it shares with
Inkling (short convolutions with state, relative-position logits, log scaling, ``embed_norm``) is ``inkling.py``'s.

```
x = RMSNorm_embed(embed[ids]); blocks = []                 # block attention-residuals: blocks [N, B, H]
for layer L:
    inputs = x if L == 0 else res(blocks + [x], attn_queries.{L-1})   # 1 query (sliding) or 3 (q, k, v: full)
    a = sconv_attn(Attn(norms(inputs)))                  # sconv(y) = (y + conv(y)) / sqrt(K + 1)
    if L % n_layers_per_attn_res_block == 0: blocks += [x]; r = a   else: r = x + a
    x = r + sconv_mlp(MoE(RMSNorm_mlp(res(blocks + [r], mlp_queries.L))))
logits = softcap(RMSNorm_final(res(blocks + [x], output_query)) @ unembed.T, final_logit_softcapping)
```
* ``res(states, queries)``: per position, softmax over the unweighted-RMSNormed (eps 1e-6) states of
  ``query . s / sqrt(H)``, the same normed states as values; one output per query.
* Attention (sliding ``hybrid_sliding`` layers: ``swa_*`` heads, the last ``sliding_window_size`` positions;
  ``hybrid`` layers: full), scale ``head_dim^-0.5``: ``q = l2clip(wq_du(h) * q_l2_clip.scale)`` per head
  (threshold ``qk_l2_clip_threshold``: ``v * min(t / (|v| + 1e-6), 1)``), ``k = l2clip(sconv(wk_dv(h)))``,
  ``v = unweighted_rmsnorm(sconv(wv_dv(h)))``; the relative bias from ``l2clip(wr_du(h) * rel_l2_clip.scale)``
  (``rel_l2_clip_threshold``); full layers log-scale q and the relative states by ``tau`` (from
  ``log_scaling_n_floor``), take q / k / v from their own inputs (``q/k/v_input_norm``) and run **dynamic**
  short convolutions on k and v: taps ``static_w [K, C] + weight_proj(input) [heads, K]`` (shared within a
  kv head), ``(y + sum_lag taps * y[t - lag]) / sqrt(2K + 1)``. Per-head sink logits ``attn_sink_proj(h)``
  join every softmax denominator; the output is ``wo_ud(out * sigmoid(gate_attn(h)))``.
* MoE: sigmoid top-k of ``gate.weight`` plus the correction bias ``mlp.gate.bias``, weights renormalised times
  ``route_scale``; experts ``down(cap_g(g) * sigmoid(g) * cap_u(u))``, ``cap_c(x) = c * tanh(x / c)``
  (``mlp_gate_softcap`` / ``mlp_up_softcap``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.names import layer_path, module_path
from colitools.runtime.attention import KVBuffer, causal_mask
from colitools.runtime.config import ConfigKeys, RopeArgs, routing_args
from colitools.runtime.experts import Expert
from colitools.runtime.family import LayerContext, ModelIO, RuntimeFamily
from colitools.runtime.inkling import (
    HybridArgs,
    ShortConv,
    attend_biased,
    common_args,
    head_geometry,
    log_scale,
    optional,
    relative_bias,
)
from colitools.runtime.moe import SparseMoE, noaux_tc
from colitools.runtime.ops import Embedding, Linear, rms_norm, sigmoid, softmax
from colitools.runtime.weights import Checkpoint

F32 = np.float32

_TEXT = {  # transformers 5.24 Inkling2TextConfig
    "vocab_size": 201024, "unpadded_vocab_size": 200058, "hidden_size": 4608, "num_hidden_layers": 48,
    "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "swa_num_attention_heads": 48,
    "swa_num_key_value_heads": 8, "swa_head_dim": 128, "sliding_window_size": 1024, "d_rel": 16,
    "rel_extent": 1024, "log_scaling_n_floor": 128000, "log_scaling_alpha": 0.1, "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-6, "conv_kernel_size": 4, "moe_intermediate_size": 2304, "n_routed_experts": 384,
    "num_experts_per_tok": 8, "route_scale": 8.0, "qk_l2_clip_threshold": 22.627416997969522,
    "rel_l2_clip_threshold": 8.0, "n_layers_per_attn_res_block": 6, "mlp_gate_softcap": 4.0,
    "mlp_up_softcap": 25.0, "final_logit_softcapping": 30.0, "scoring_func": "sigmoid", "eos_token_id": 200006,
}  # fmt: skip
RES_EPS = 1e-6  # Inkling2BlockAttentionResidual's Inkling2UnweightedRMSNorm() default


@dataclass(kw_only=True)
class Inkling2Args(HybridArgs):
    """The Inkling-2 facts beyond what it reads like Inkling (``HybridArgs``)."""

    route_scale: float
    qk_clip: float
    rel_clip: float
    block: int  # n_layers_per_attn_res_block
    gate_cap: float
    up_cap: float
    logit_cap: float | None


def _inkling2_args(c: ConfigKeys, base: dict[str, Any]) -> Inkling2Args:
    n = base["num_hidden_layers"]
    types = c.get("layer_types") or ["hybrid" if (i + 1) % 6 == 0 else "hybrid_sliding" for i in range(n)]
    if c.get("scoring_func", "sigmoid") != "sigmoid":
        raise RuntimeModelError(f"{c.where}: scoring_func {c['scoring_func']!r} is not supported (sigmoid)")
    common = common_args(c, n, types)
    route_scale = float(c.get("routed_scaling_factor") or c["route_scale"])
    args = Inkling2Args(
        **base,
        **common,
        route_scale=route_scale,
        qk_clip=float(c["qk_l2_clip_threshold"]),
        rel_clip=float(c["rel_l2_clip_threshold"]),
        block=int(c["n_layers_per_attn_res_block"]),
        gate_cap=float(c["mlp_gate_softcap"]),
        up_cap=float(c["mlp_up_softcap"]),
        logit_cap=optional(c, "final_logit_softcapping", float),
        routing=routing_args(c, router="noaux_tc", norm_topk_prob=True, routed_scaling_factor=route_scale),
        rope=RopeArgs(dim=0),  # no RoPE: relative-position logits
    )
    if args.block < 1:
        raise RuntimeModelError(f"{c.where}: n_layers_per_attn_res_block must be >= 1, got {args.block}")
    return args


# ------------------------------------------------------------------------------------------- pieces
def unweighted_rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32)
    return x * (F32(1.0) / np.sqrt(var + F32(eps)))


def l2_clip(x: np.ndarray, threshold: float) -> np.ndarray:
    """``x * min(t / (|x| + 1e-6), 1)`` over the last axis (``Inkling2L2Clip``)."""
    norm = np.sqrt(np.sum(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32))
    return x * np.minimum(F32(threshold) / (norm + F32(1e-6)), F32(1))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return (np.tanh(x / F32(cap)) * F32(cap)).astype(F32)


class ScaledShortConv(ShortConv):
    """``(y + conv(y)) / sqrt(K + 1)`` (``Inkling2ShortConvolution``)."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return super().__call__(x) / F32(math.sqrt(self.K + 1))


class DynamicShortConv:
    """``(y + sum_lag (static_w[lag] + weight_proj(u)[head, lag]) * y[t - lag]) / sqrt(2K + 1)`` with the last
    ``K - 1`` inputs as state (``Inkling2DynamicShortConvolution``; taps shared within each of ``heads``)."""

    def __init__(self, ckpt: Checkpoint, prefix: str, C: int, heads: int, K: int, H: int):
        self.static = ckpt.array(f"{prefix}.static_w", (K, C))
        self.proj = Linear(ckpt.resident(f"{prefix}.weight_proj", heads * K, H))
        self.C, self.heads, self.K = C, heads, K
        self.reset()

    @property
    def nbytes(self) -> int:
        return self.static.nbytes + self.proj.nbytes

    def reset(self) -> None:
        self.past = np.zeros((self.K - 1, self.C), dtype=F32)

    def __call__(self, y: np.ndarray, u: np.ndarray) -> np.ndarray:
        N, K = y.shape[0], self.K
        dyn = self.proj(u).reshape(N, self.heads, 1, K)  # [N, heads, 1, K]
        taps = self.static.T.reshape(self.heads, self.C // self.heads, K)[None] + dyn  # [N, heads, C/h, K]
        taps = taps.reshape(N, self.C, K)
        full = np.concatenate([self.past, y], axis=0)  # [K - 1 + N, C]
        out = np.zeros_like(y)
        for lag in range(K):  # token t - lag sits at full[K - 1 + t - lag]
            out = out + full[K - 1 - lag : K - 1 - lag + N] * taps[:, :, lag]
        self.past = full[N:].copy() if K > 1 else self.past
        return (out + y) / F32(math.sqrt(2 * K + 1))


def block_residual(states: np.ndarray, x: np.ndarray, queries: np.ndarray) -> list[np.ndarray]:
    """``Inkling2BlockAttentionResidual``: ``states [N, B, H]`` and the partial state ``x [N, H]``, queries
    ``[Q, H]`` -> Q outputs ``[N, H]``: per position, softmax over the B + 1 normed states."""
    s = unweighted_rms_norm(np.concatenate([states, x[:, None]], axis=1), RES_EPS)  # [N, B+1, H]
    H = s.shape[-1]
    scores = np.einsum("qh,nbh->nqb", queries, s) * F32(H**-0.5)
    out = softmax(scores) @ s  # [N, Q, H]
    return [np.ascontiguousarray(out[:, j]) for j in range(queries.shape[0])]


# ------------------------------------------------------------------------------------------- attention
class Inkling2Attention:
    """One Inkling-2 attention layer (sliding or full) with its KV cache and k / v convolution states."""

    def __init__(self, args: Inkling2Args, ckpt: Checkpoint, layer: int):
        ink = args
        p = module_path(layer, "attn")
        H = args.hidden_size
        self.sliding, self.nq, self.nkv, self.D = head_geometry(args, layer)
        nq, nkv, D, K = self.nq, self.nkv, self.D, ink.conv_kernel
        self.q = Linear.load(ckpt, f"{p}.wq_du", nq * D, H)
        self.k = Linear.load(ckpt, f"{p}.wk_dv", nkv * D, H)
        self.v = Linear.load(ckpt, f"{p}.wv_dv", nkv * D, H)
        self.r = Linear.load(ckpt, f"{p}.wr_du", nq * ink.d_rel, H)
        self.o = Linear.load(ckpt, f"{p}.wo_ud", H, nq * D)
        self.gate = Linear.load(ckpt, f"{p}.gate_attn", nq * D, H)
        self.sink = Linear.load(ckpt, f"{p}.attn_sink_proj", nq, H)
        self.q_scale = ckpt.array(f"{p}.q_l2_clip.scale", (nq, D))
        self.r_scale = ckpt.array(f"{p}.rel_l2_clip.scale", (nq, ink.d_rel))
        if self.sliding:
            self.k_conv = ScaledShortConv(ckpt.array(f"{p}.k_sconv.weight", (nkv * D, 1, K)))
            self.v_conv = ScaledShortConv(ckpt.array(f"{p}.v_sconv.weight", (nkv * D, 1, K)))
        else:
            self.k_conv = DynamicShortConv(ckpt, f"{p}.k_sconv", nkv * D, nkv, K, H)
            self.v_conv = DynamicShortConv(ckpt, f"{p}.v_sconv", nkv * D, nkv, K, H)
        extent = ink.window if self.sliding else ink.rel_extent
        self.proj = ckpt.dense(f"{p}.rel_logits_proj.proj", ink.d_rel, extent)
        self.window = ink.window if self.sliding else None
        self.log_floor = None if self.sliding else ink.log_scaling_n_floor
        self.alpha, self.eps, self.d_rel = ink.log_scaling_alpha, args.rms_norm_eps, ink.d_rel
        self.qk_clip, self.rel_clip = ink.qk_clip, ink.rel_clip
        self.scale = D**-0.5
        self.kc, self.vc = KVBuffer(), KVBuffer()
        self.first = 0

    @property
    def nbytes(self) -> int:
        mats = (self.q, self.k, self.v, self.r, self.o, self.gate, self.sink)
        convs = sum(
            c.nbytes if isinstance(c, DynamicShortConv) else c.w.nbytes for c in (self.k_conv, self.v_conv)
        )
        return (
            sum(m.nbytes for m in mats) + convs + self.proj.nbytes + self.q_scale.nbytes + self.r_scale.nbytes
        )

    def reset(self) -> None:
        for b in (self.kc, self.vc, self.k_conv, self.v_conv):
            b.reset()
        self.first = 0

    def __call__(self, hq: np.ndarray, hk: np.ndarray, hv: np.ndarray, positions: np.ndarray) -> np.ndarray:
        N = hq.shape[0]
        q = l2_clip(self.q(hq).reshape(N, self.nq, self.D) * self.q_scale, self.qk_clip)
        r = l2_clip(self.r(hq).reshape(N, self.nq, self.d_rel) * self.r_scale, self.rel_clip)
        if self.log_floor is not None:
            tau = log_scale(positions, self.log_floor, self.alpha)[:, None, None]
            q, r = q * tau, r * tau
        if self.sliding:
            k, v = self.k_conv(self.k(hk)), self.v_conv(self.v(hv))
        else:
            k, v = self.k_conv(self.k(hk), hk), self.v_conv(self.v(hv), hv)
        k = l2_clip(k.reshape(N, self.nkv, self.D), self.qk_clip)
        v = unweighted_rms_norm(v.reshape(N, self.nkv, self.D), self.eps)
        K, V = self.kc.append(k), self.vc.append(v)
        T = K.shape[0]
        bias = relative_bias(r, self.proj, positions, self.first, T)
        allowed = causal_mask(positions, T, self.window, self.first)
        out = attend_biased(q, K, V, allowed, self.scale, bias, sinks=self.sink(hq).T)
        if self.window:
            self.first += self.kc.keep_last(self.window - 1)
            self.vc.keep_last(self.window - 1)
        return self.o(out * sigmoid(self.gate(hq)))


# ------------------------------------------------------------------------------------------- MoE
class SoftcappedSwiGLUExpert(Expert):
    """``down(cap_g(g) * sigmoid(g) * cap_u(u))`` (``Inkling2SoftcappedSwiGLU``)."""

    __slots__ = ("gate_cap", "up_cap")

    def __init__(self, gate, up, down, biases, gate_cap: float, up_cap: float):
        super().__init__(gate, up, down, biases)
        self.gate_cap, self.up_cap = gate_cap, up_cap

    def __call__(self, x: np.ndarray) -> np.ndarray:
        g, u = self.gate.matmul(x), self.up.matmul(x)
        return self.down.matmul(softcap(g, self.gate_cap) * sigmoid(g) * softcap(u, self.up_cap))


class Inkling2MoE(SparseMoE):
    """Sigmoid top-k with the correction bias ``mlp.gate.bias`` (not a logit bias), softcapped SwiGLU experts."""

    def __init__(self, args: Inkling2Args, ckpt: Checkpoint, layer: int, ctx: LayerContext):
        p = module_path(layer, "mlp")
        E, H = args.num_experts, args.hidden_size

        def make(gate, up, down, biases=None):
            return SoftcappedSwiGLUExpert(gate, up, down, biases, args.gate_cap, args.up_cap)

        self.store = ctx.expert_store(layer, make=make)
        self.args, self.layer, self.usage = args, layer, ctx.layer_usage(layer)
        self.router = Linear(ckpt.resident(f"{p}.gate.weight", E, H))
        self.bias = ckpt.vector(f"{p}.gate.bias", E)
        self.shared = self.shared_gate = None

    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = self.args
        return noaux_tc(
            self.router(x), self.bias, a.num_experts_per_tok, 1, 1, True, a.routing.routed_scaling_factor
        )


# ------------------------------------------------------------------------------------------- layers
class Inkling2Layer:
    """A decoder layer with block attention-residual inputs; ``carry`` = the block states ``[N, B, H]``."""

    def __init__(self, ctx: LayerContext, layer: int):
        args, ckpt, p = ctx.args, ctx.ckpt, layer_path(layer)
        ink = args
        H, K = args.hidden_size, ink.conv_kernel
        self.attn = Inkling2Attention(args, ckpt, layer)
        self.ffn = Inkling2MoE(args, ckpt, layer, ctx)
        self.eps, self.boundary = args.rms_norm_eps, layer % ink.block == 0
        sliding = self.attn.sliding
        nq = 1 if sliding else 3
        self.attn_queries = (
            ckpt.array(f"model.attn_res.attn_queries.{layer - 1}", (H,) if sliding else (nq, H)).reshape(
                nq, H
            )
            if layer > 0
            else None
        )
        self.mlp_query = ckpt.vector(f"model.attn_res.mlp_queries.{layer}", H)[None]
        norms = ("attn_norm",) if sliding else ("q_input_norm", "k_input_norm", "v_input_norm")
        self.norms = [ckpt.vector(f"{p}.{n}.weight", H) for n in norms]
        self.norm_in = self.norms[0]
        self.norm_post = ckpt.vector(f"{p}.mlp_norm.weight", H)
        self.attn_conv = ScaledShortConv(ckpt.array(f"{p}.attn_sconv.weight", (H, 1, K)))
        self.mlp_conv = ScaledShortConv(ckpt.array(f"{p}.mlp_sconv.weight", (H, 1, K)))

    @property
    def nbytes(self) -> int:
        return self.norm_in.nbytes + self.norm_post.nbytes + self.attn.nbytes + self.ffn.nbytes

    def reset(self) -> None:
        self.attn.reset()
        self.attn_conv.reset()
        self.mlp_conv.reset()

    def __call__(self, x, positions, cos, sin, blocks):
        inputs = [x] * 3 if self.attn_queries is None else block_residual(blocks, x, self.attn_queries)
        if len(inputs) == 1:
            inputs = inputs * 3
        hq, hk, hv = (rms_norm(h, w, self.eps) for h, w in zip(inputs, self.norms * 3, strict=False))
        a = self.attn_conv(self.attn(hq, hk, hv, positions))
        if self.boundary:
            blocks, r = np.concatenate([blocks, x[:, None]], axis=1), a
        else:
            r = x + a
        h = block_residual(blocks, r, self.mlp_query)[0]
        return r + self.mlp_conv(self.ffn(rms_norm(h, self.norm_post, self.eps))), blocks


class Inkling2IO(ModelIO):
    """``embed_norm``; empty block states to start; the output query's block residual, the final norm,
    ``unembed`` and the final logit softcap."""

    def __init__(self, args: Inkling2Args, ckpt: Checkpoint):
        H, V = args.hidden_size, args.vocab_size
        self.embed = Embedding(ckpt, "model.embed.weight", V, H)
        self.embed_norm = ckpt.vector("model.embed_norm.weight", H)
        self.norm = ckpt.vector("model.norm.weight", H)
        self.output_query = ckpt.vector("model.attn_res.output_query", H)[None]
        self.lm_head = Linear.load(ckpt, "unembed", V, H)
        self.eps, self.cap, self.unpadded = args.rms_norm_eps, args.logit_cap, args.unpadded_vocab_size

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        return rms_norm(self.embed(ids), self.embed_norm, self.eps)

    def carry(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.zeros((x.shape[0], 0, x.shape[1]), dtype=F32)

    def logits(self, x: np.ndarray, blocks: np.ndarray, all_logits: bool) -> np.ndarray:
        if not all_logits:
            x, blocks = x[-1:], blocks[-1:]
        h = rms_norm(block_residual(blocks, x, self.output_query)[0], self.norm, self.eps)
        logits = self.lm_head(h)
        if self.unpadded is not None:
            logits = logits[:, : self.unpadded]
        return softcap(logits, self.cap) if self.cap is not None else logits


class Inkling2(RuntimeFamily):
    defaults = {"inkling2": dict(_TEXT), "inkling2_text": dict(_TEXT)}

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> Inkling2Args:
        return _inkling2_args(c, base)

    def layer(self, ctx: LayerContext, layer: int) -> Inkling2Layer:
        return Inkling2Layer(ctx, layer)

    def io(self, args: Inkling2Args, ckpt: Checkpoint) -> Inkling2IO:
        return Inkling2IO(args, ckpt)


FAMILY = Inkling2()
