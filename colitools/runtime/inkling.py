"""Inkling (``inkling_mm_model``, text type ``inkling_text``), transformers 5.24 ``modeling_inkling.py``; the text
model only (the audio and vision towers are not run). Native names: ``model.llm.*`` (read under ``model.``).

```
x = RMSNorm_embed(embed[ids])
for each layer:
    x = x + sconv_attn(Attn(RMSNorm_attn(x)))
    x = x + sconv_mlp(MoE(RMSNorm_mlp(x)))
logits = (RMSNorm_final(x) / logits_mup_width_multiplier) @ unembed.T
```
* Short convolutions: ``sconv(y) = y + causal_depthwise_conv1d(y)`` (kernel ``[C, 1, K]``, no bias, float32), on
  the attention's k and v projections (``attn.k_sconv`` / ``v_sconv``) and on the attention and MLP outputs
  (``attn_sconv`` / ``mlp_sconv``); each keeps its last ``K - 1`` inputs as state in the runtime cache.
* Attention, no RoPE: ``layer_types`` ``hybrid_sliding`` layers (``swa_num_attention_heads`` x ``swa_head_dim``,
  ``swa_num_key_value_heads``; the last ``sliding_window_size`` positions) and ``hybrid`` (global) layers
  (``num_attention_heads`` x ``head_dim``, ``num_key_value_heads``). Per-head RMSNorm of q and k, softmax scale
  ``1 / head_dim``, plus a relative-position bias: ``r = wr_du(x)`` per head ``[d_rel]`` times
  ``rel_logits_proj.proj [d_rel, extent]`` gives one logit per backward distance ``0 .. extent - 1`` (zero beyond;
  extent = ``rel_extent``, a sliding layer's = its window). Global layers with ``log_scaling_n_floor`` scale q and
  the bias by ``tau = 1 + log_scaling_alpha * log(max((pos + 1) / n_floor, 1))``.
* MoE: router ``mlp.gate.weight [E + n_shared, H]``: the bias-corrected (``mlp.gate.bias``) sigmoid top-k of the
  first E rows picks the routed experts; the weights are the log-sigmoid logits of the k picks and the n_shared
  extra rows normalised together (``exp(l - logsumexp(l))``), times ``route_scale * gate.global_scale``; the last
  n_shared weights scale the shared experts (``shared_experts.{k}.*`` as converted, or the native stacks
  ``shared_w13_weight [n, 2I, H]`` gate/up rows interleaved / ``shared_w2_weight [n, H, I]``). Routed stacks
  ``experts.w13_weight`` / ``w2_weight`` are read in place (``formats/families.py``: rows-interleaved).
  Dense layers (``mlp_layer_types`` ``dense``): ``global_scale * down(silu(gate(x)) * up(x))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.families import stack_orientation
from colitools.formats.names import (
    CANONICAL_PROJECTION,
    expert_tensor_name,
    layer_path,
    module_path,
)
from colitools.runtime.attention import KVBuffer, causal_mask
from colitools.runtime.config import ConfigKeys, ModelArgs, RopeArgs
from colitools.runtime.experts import STACK_PICKS
from colitools.runtime.family import LayerContext, ModelIO, RuntimeFamily
from colitools.runtime.kernels import QTensor
from colitools.runtime.linear_attention import ConvState
from colitools.runtime.moe import SparseMoE, _topk
from colitools.runtime.ops import MLP, Embedding, Linear, rms_norm, sigmoid, silu, softmax
from colitools.runtime.weights import Checkpoint, Stored, qtensor

F32 = np.float32
NEG_INF = F32(-np.inf)

_TEXT = {  # transformers 5.24 InklingTextConfig
    "vocab_size": 201024, "hidden_size": 6144, "num_hidden_layers": 66, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "swa_num_attention_heads": 64, "swa_num_key_value_heads": 16,
    "swa_head_dim": 128, "sliding_window_size": 512, "d_rel": 16, "rel_extent": 1024, "log_scaling_alpha": 0.1,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "conv_kernel_size": 4, "intermediate_size": 24576,
    "moe_intermediate_size": 3072, "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 2,
    "route_scale": 8.0, "logits_mup_width_multiplier": 24.0,
}  # fmt: skip
LAYER_TYPES = ("hybrid_sliding", "hybrid")


@dataclass(kw_only=True)
class HybridArgs(ModelArgs):
    """What Inkling and Inkling-2 read alike (``common_args``)."""

    layer_types: tuple[str, ...]  # per layer "hybrid_sliding" | "hybrid"
    swa_heads: int
    swa_kv_heads: int
    swa_head_dim: int
    window: int  # sliding_window_size (also the sliding layers' rel_extent)
    d_rel: int
    rel_extent: int
    log_scaling_n_floor: int | None
    log_scaling_alpha: float
    conv_kernel: int
    unpadded_vocab_size: int | None


@dataclass(kw_only=True)
class InklingArgs(HybridArgs):
    """Inkling's shared experts (weighted by the router's extra rows) and its logit divisor."""

    n_shared: int
    route_scale: float
    mup: float  # logits_mup_width_multiplier


def optional(c: ConfigKeys, key: str, kind=int):
    """``kind(c[key])``, or None when the config has no (or a null) ``key``."""
    return kind(c[key]) if c.get(key) is not None else None


def common_args(c: ConfigKeys, n: int, types: list[str]) -> dict[str, Any]:
    """The config facts Inkling and Inkling-2 (``HybridArgs``) read alike, checked: ``n`` layer types
    of ``LAYER_TYPES``, the sliding attention's geometry (its heads split into its kv heads), the relative
    positions, the log scaling, the short convolutions' kernel and the unpadded vocabulary."""
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise RuntimeModelError(
            f"{c.where}: layer_types must list {n} of {', '.join(LAYER_TYPES)}, got {types}"
        )
    heads, kv_heads = int(c["swa_num_attention_heads"]), int(c["swa_num_key_value_heads"])
    if heads % kv_heads:
        raise RuntimeModelError(f"{c.where}: {heads} sliding attention heads do not split into {kv_heads} kv heads")
    return dict(
        layer_types=tuple(types),
        swa_heads=heads,
        swa_kv_heads=kv_heads,
        swa_head_dim=int(c["swa_head_dim"]),
        window=int(c["sliding_window_size"]),
        d_rel=int(c["d_rel"]),
        rel_extent=int(c["rel_extent"]),
        log_scaling_n_floor=optional(c, "log_scaling_n_floor"),
        log_scaling_alpha=float(c["log_scaling_alpha"]),
        conv_kernel=int(c.get("sconv_kernel_size") or c["conv_kernel_size"]),
        unpadded_vocab_size=optional(c, "unpadded_vocab_size"),
    )


def short_conv(ckpt: Checkpoint, name: str, C: int, K: int) -> ShortConv:
    return ShortConv(ckpt.array(name, (C, 1, K)))


class ShortConv(ConvState):
    """``y + causal_depthwise_conv1d(y)`` with the last ``K - 1`` inputs as state (``InklingShortConvolution``)."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return super().__call__(x) + x


def relative_bias(r: np.ndarray, proj: np.ndarray, positions: np.ndarray, first: int, T: int) -> np.ndarray:
    """``[H, N, T]``: ``(r[n, h] @ proj)[distance]`` for ``0 <= distance = positions[n] - key < extent``, else 0
    (``r [N, H, d_rel]``, ``proj [d_rel, extent]``; keys at absolute positions ``first .. first + T - 1``)."""
    extent = proj.shape[1]
    table = (r @ proj).transpose(1, 0, 2)  # [H, N, extent]
    dist = positions[:, None] - (first + np.arange(T))[None, :]  # [N, T]
    inside = (dist >= 0) & (dist < extent)
    gathered = np.take_along_axis(
        table, np.clip(dist, 0, extent - 1)[None].repeat(table.shape[0], 0), axis=-1
    )
    return np.where(inside[None], gathered, F32(0))


def log_scale(positions: np.ndarray, n_floor: int, alpha: float) -> np.ndarray:
    """``tau [N] = 1 + alpha * log(max((pos + 1) / n_floor, 1))`` (float32, transformers' log scaling)."""
    eff = (positions + 1).astype(F32) / F32(n_floor)
    return (F32(1) + F32(alpha) * np.log(np.maximum(eff, F32(1)))).astype(F32)


def attend_biased(q, k, v, allowed, scale, bias, sinks=None) -> np.ndarray:
    """``softmax(q . k^T * scale + bias + mask) @ v`` per head (``q [N, Hq, D]``, ``k [T, Hkv, D]``,
    ``v [T, Hkv, Dv]``, ``bias [Hq, N, T]``; optional ``sinks [Hq, N]``: a per-head, per-query logit in every
    denominator that takes no value) -> ``[N, Hq * Dv]``."""
    N, Hq, D = q.shape
    T, Hkv, Dv = v.shape
    rep = Hq // Hkv
    qh = q.reshape(N, Hkv, rep, D).transpose(1, 2, 0, 3)  # [Hkv, rep, N, D]
    kh = k.transpose(1, 2, 0)[:, None]  # [Hkv, 1, D, T]
    scores = (qh @ kh) * F32(scale) + bias.reshape(Hkv, rep, N, T)
    scores = np.where(allowed[None, None], scores, NEG_INF)
    if sinks is None:
        p = softmax(scores)
    else:
        s = sinks.reshape(Hkv, rep, N, 1)
        m = np.maximum(np.max(scores, axis=-1, keepdims=True), s)
        e = np.exp(scores - m)
        p = e / (np.sum(e, axis=-1, keepdims=True, dtype=F32) + np.exp(s - m))
    out = p @ v.transpose(1, 0, 2)[:, None]  # [Hkv, rep, N, Dv]
    return np.ascontiguousarray(out.transpose(2, 0, 1, 3)).reshape(N, Hq * Dv)


def head_geometry(args: HybridArgs, layer: int) -> tuple[bool, int, int, int]:
    """``(sliding, query heads, kv heads, head dim)`` of layer ``layer``: sliding layers (``hybrid_sliding``) have
    their own heads (``swa_*``), the others the config's (Inkling and Inkling-2)."""
    if args.layer_types[layer] == "hybrid_sliding":
        return True, args.swa_heads, args.swa_kv_heads, args.swa_head_dim
    return False, args.num_attention_heads, args.num_key_value_heads, args.head_dim


class InklingAttention:
    """One Inkling attention layer with its KV cache and its k / v short-convolution states."""

    def __init__(self, args: InklingArgs, ckpt: Checkpoint, layer: int):
        ink = args
        p = module_path(layer, "attn")
        H = args.hidden_size
        self.sliding, self.nq, self.nkv, self.D = head_geometry(args, layer)
        nq, nkv, D = self.nq, self.nkv, self.D
        self.q = Linear.load(ckpt, f"{p}.wq_du", nq * D, H)
        self.k = Linear.load(ckpt, f"{p}.wk_dv", nkv * D, H)
        self.v = Linear.load(ckpt, f"{p}.wv_dv", nkv * D, H)
        self.r = Linear.load(ckpt, f"{p}.wr_du", nq * ink.d_rel, H)
        self.o = Linear.load(ckpt, f"{p}.wo_ud", H, nq * D)
        self.k_conv = short_conv(ckpt, f"{p}.k_sconv.weight", nkv * D, ink.conv_kernel)
        self.v_conv = short_conv(ckpt, f"{p}.v_sconv.weight", nkv * D, ink.conv_kernel)
        self.q_norm = ckpt.vector(f"{p}.q_norm.weight", D)
        self.k_norm = ckpt.vector(f"{p}.k_norm.weight", D)
        extent = ink.window if self.sliding else ink.rel_extent
        self.proj = ckpt.dense(f"{p}.rel_logits_proj.proj", ink.d_rel, extent)
        self.window = ink.window if self.sliding else None
        self.log_floor = None if self.sliding else ink.log_scaling_n_floor
        self.alpha, self.eps, self.d_rel = ink.log_scaling_alpha, args.rms_norm_eps, ink.d_rel
        self.scale = 1.0 / D  # q and k are RMS-normalised per head
        self.kc, self.vc = KVBuffer(), KVBuffer()
        self.first = 0

    @property
    def nbytes(self) -> int:
        mats = (self.q, self.k, self.v, self.r, self.o)
        return sum(m.nbytes for m in mats) + self.k_conv.w.nbytes + self.v_conv.w.nbytes + self.proj.nbytes

    def reset(self) -> None:
        self.kc.reset()
        self.vc.reset()
        self.k_conv.reset()
        self.v_conv.reset()
        self.first = 0

    def __call__(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        N = x.shape[0]
        q = rms_norm(self.q(x).reshape(N, self.nq, self.D), self.q_norm, self.eps)
        k = rms_norm(self.k_conv(self.k(x)).reshape(N, self.nkv, self.D), self.k_norm, self.eps)
        v = self.v_conv(self.v(x)).reshape(N, self.nkv, self.D)
        r = self.r(x).reshape(N, self.nq, self.d_rel)
        K, V = self.kc.append(k), self.vc.append(v)
        T = K.shape[0]
        bias = relative_bias(r, self.proj, positions, self.first, T)
        if self.log_floor is not None:
            tau = log_scale(positions, self.log_floor, self.alpha)
            q = q * tau[:, None, None]
            bias = bias * tau[None, :, None]
        allowed = causal_mask(positions, T, self.window, self.first)
        out = attend_biased(q, K, V, allowed, self.scale, bias)
        if self.window:  # later queries never see keys older than the last window - 1
            self.first += self.kc.keep_last(self.window - 1)
            self.vc.keep_last(self.window - 1)
        return self.o(out)


class InklingMoE(SparseMoE):
    """Routed experts weighted by the extra-row router, plus the shared experts weighted by its last rows."""

    def __init__(self, args: InklingArgs, ckpt: Checkpoint, layer: int, ctx: LayerContext):
        ink = args
        p = module_path(layer, "mlp")
        H, E, I, S = args.hidden_size, args.num_experts, args.moe_intermediate_size, ink.n_shared
        self.store = ctx.expert_store(layer)
        self.args, self.layer, self.usage = args, layer, ctx.layer_usage(layer)
        self.router = Linear(ckpt.resident(f"{p}.gate.weight", E + S, H))
        self.bias = ckpt.vector(f"{p}.gate.bias", E)
        self.global_scale = float(ckpt.vector(f"{p}.gate.global_scale", 1)[0])
        self.n_shared, self.route_scale = S, ink.route_scale
        self.shared_gate = None
        self.shared_mlps = shared_experts(args, ckpt, layer, S, I, H)
        self.shared = None
        self.gammas: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.router.nbytes + sum(m.nbytes for m in self.shared_mlps)

    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, E = self.args, self.args.num_experts
        logits = self.router(x).astype(F32)
        idx = _topk(sigmoid(logits[:, :E]) + self.bias, a.num_experts_per_tok)
        picked = np.concatenate([np.take_along_axis(logits[:, :E], idx, axis=-1), logits[:, E:]], axis=-1)
        lp = log_sigmoid(picked)
        m = np.max(lp, axis=-1, keepdims=True)
        lse = m + np.log(np.sum(np.exp(lp - m), axis=-1, keepdims=True, dtype=F32))
        w = np.exp(lp - lse) * F32(self.route_scale) * F32(self.global_scale)
        k = a.num_experts_per_tok
        self.gammas = w[:, k:]
        return idx, w[:, :k].astype(F32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = super().__call__(x)  # routed experts (route() leaves the shared weights in self.gammas)
        shared = np.zeros_like(x)
        for s, mlp in enumerate(self.shared_mlps):
            shared += mlp.down(silu(mlp.gate(x)) * mlp.up(x) * self.gammas[:, s : s + 1])
        return out + shared


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """``log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))`` (float32)."""
    return (np.minimum(x, F32(0)) - np.log1p(np.exp(-np.abs(x)))).astype(F32)


def shared_experts(args: ModelArgs, ckpt: Checkpoint, layer: int, S: int, I: int, H: int) -> list[MLP]:
    """The shared experts as MLPs: converted ``shared_experts.{k}.{gate,up,down}_proj.weight``, or slices of the
    native stacks ``shared_w13_weight [S, 2I, H]`` (gate / up rows interleaved) / ``shared_w2_weight [S, H, I]``."""
    p = module_path(layer, "mlp.shared_experts")
    if ckpt.has(expert_tensor_name(p, 0, "gate")):
        return [MLP(ckpt, f"{p}.{k}", H, I) for k in range(S)]
    text = tuple(f"{p}.{CANONICAL_PROJECTION[proj]}" for proj in ("gate", "up", "down"))
    if all(ckpt.has(n) for n in text):  # the text stacks [S, I, H] / [S, H, I] (--target inkling, colibri's converter)
        whole = (0, 1, False)  # every row of shared expert k's slab
        mlps = []
        for k in range(S):
            m = MLP.__new__(MLP)
            m.gate, m.up, m.down = (
                Linear(_resident(ckpt, ckpt.stack_expert(name, k, S, whole, O, In)))
                for name, O, In in ((text[0], I, H), (text[1], I, H), (text[2], H, I))
            )
            mlps.append(m)
        return mlps
    w13, w2 = f"{p}.shared_w13_weight", f"{p}.shared_w2_weight"
    if not (ckpt.has(w13) and ckpt.has(w2)):
        raise RuntimeModelError(f"{ckpt.dir}: missing tensor {expert_tensor_name(p, 0, 'gate')} (or {w13})")
    g, u, d = STACK_PICKS[stack_orientation(args.model_type)]
    mlps = []
    for k in range(S):
        m = MLP.__new__(MLP)
        m.gate, m.up, m.down = (
            Linear(_resident(ckpt, ckpt.stack_expert(name, k, S, pick, O, In)))
            for name, pick, O, In in ((w13, g, I, H), (w13, u, I, H), (w2, d, H, I))
        )
        mlps.append(m)
    return mlps


def _resident(ckpt: Checkpoint, st: Stored) -> QTensor:
    data, scale = ckpt.read_stored(st)
    return qtensor(st, memoryview(data), memoryview(scale) if scale is not None else None)


class InklingDense:
    """A dense layer: ``global_scale * down(silu(gate(x)) * up(x))`` (``InklingMLP``)."""

    def __init__(self, ctx: LayerContext, layer: int):
        self.mlp = ctx.dense_mlp(layer)
        self.scale = F32(ctx.ckpt.vector(module_path(layer, "mlp.global_scale"), 1)[0])

    @property
    def nbytes(self) -> int:
        return self.mlp.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.mlp(x) * self.scale


class InklingLayer:
    """``x + sconv_attn(Attn(norm_attn(x)))`` then ``x + sconv_mlp(FFN(norm_mlp(x)))``."""

    def __init__(self, ctx: LayerContext, layer: int, attn, ffn):
        args, ckpt, p = ctx.args, ctx.ckpt, layer_path(layer)
        H, K = args.hidden_size, args.conv_kernel
        self.attn, self.ffn, self.eps = attn, ffn, args.rms_norm_eps
        self.norm_in = ckpt.vector(f"{p}.attn_norm.weight", H)
        self.norm_post = ckpt.vector(f"{p}.mlp_norm.weight", H)
        self.attn_conv = short_conv(ckpt, f"{p}.attn_sconv.weight", H, K)
        self.mlp_conv = short_conv(ckpt, f"{p}.mlp_sconv.weight", H, K)

    @property
    def nbytes(self) -> int:
        return self.norm_in.nbytes + self.norm_post.nbytes + self.attn.nbytes + self.ffn.nbytes

    def reset(self) -> None:
        self.attn.reset()
        self.attn_conv.reset()
        self.mlp_conv.reset()

    def __call__(self, x, positions, cos, sin, carry):
        x = x + self.attn_conv(self.attn(rms_norm(x, self.norm_in, self.eps), positions))
        return x + self.mlp_conv(self.ffn(rms_norm(x, self.norm_post, self.eps))), carry


class InklingIO(ModelIO):
    """Embedding with ``embed_norm``, final norm, ``/ logits_mup_width_multiplier``, ``unembed`` (native names)."""

    def __init__(self, args: InklingArgs, ckpt: Checkpoint):
        H, V = args.hidden_size, args.vocab_size
        self.embed = Embedding(ckpt, "model.embed.weight", V, H)
        self.embed_norm = ckpt.vector("model.embed_norm.weight", H)
        self.norm = ckpt.vector("model.norm.weight", H)
        self.lm_head = Linear.load(ckpt, "unembed", V, H)
        self.eps, self.mup = args.rms_norm_eps, F32(args.mup)
        self.unpadded = args.unpadded_vocab_size

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        return rms_norm(self.embed(ids), self.embed_norm, self.eps)

    def logits(self, x: np.ndarray, carry, all_logits: bool) -> np.ndarray:
        x = x if all_logits else x[-1:]
        logits = self.lm_head(rms_norm(x, self.norm, self.eps) / self.mup)
        return logits[:, : self.unpadded] if self.unpadded is not None else logits


class Inkling(RuntimeFamily):
    defaults = {"inkling_mm_model": dict(_TEXT), "inkling_text": dict(_TEXT)}

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> InklingArgs:
        """Layer types (default: every 6th layer global), dense / sparse MLPs, the shared experts, no RoPE."""
        n = base["num_hidden_layers"]
        types = c.get("layer_types")
        if types is None:
            local = set(c["local_layer_ids"]) if c.get("local_layer_ids") is not None else {
                i for i in range(n) if (i + 1) % 6}  # fmt: skip
            types = ["hybrid_sliding" if i in local else "hybrid" for i in range(n)]
        mlp_types = c.get("mlp_layer_types") or ["sparse"] * n
        if any(t not in ("dense", "sparse") for t in mlp_types):
            raise RuntimeModelError(f"{c.where}: mlp_layer_types must be dense / sparse, got {mlp_types}")
        return InklingArgs(
            **{**base, "moe_layers": [t == "sparse" for t in mlp_types]},
            **common_args(c, n, types),
            n_shared=int(c["n_shared_experts"]),
            route_scale=float(c["route_scale"]),
            mup=float(c["logits_mup_width_multiplier"]),
            rope=RopeArgs(dim=0),  # no RoPE: relative-position logits
        )

    def layer(self, ctx: LayerContext, layer: int) -> InklingLayer:
        args = ctx.args
        ffn = InklingMoE(args, ctx.ckpt, layer, ctx) if args.moe_layers[layer] else InklingDense(ctx, layer)
        return InklingLayer(ctx, layer, InklingAttention(args, ctx.ckpt, layer), ffn)

    def io(self, args: InklingArgs, ckpt: Checkpoint) -> InklingIO:
        return InklingIO(args, ckpt)


FAMILY = Inkling()
