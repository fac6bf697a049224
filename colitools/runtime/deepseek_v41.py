"""DeepSeek V4.1 Flash (``deepseek_v41``): no transformers model; colibri's definition (``c/deepseek_v41.c`` and its
torch reference ``c/tools/dsv41_ref.py``, both transcribing the vendor's ``inference/model.py``), on the released
names (``layers.{L}.attn.wq_a``, ``ffn.experts.{E}.w1``, ``engram.embed``, ``embed.weight``, ``head.weight``).

* Residual: ``hc_mult`` hyper-connection streams (``hyper.HyperConnection``'s Sinkhorn mixing), but a sublayer's
  input collapses the streams with the ``pre`` the *previous* sublayer computed (the attention with the previous
  layer's FFN's, the first one with stream 0 alone), and the output with the last FFN's: no hyper head.
* Engram layers (``engram_layer_ids``), first in the layer: the n-gram hash rows of each position (the sidecar
  ``dsv41_engram.json``: ``EngramHash``) through ``engram.wkv`` into a key per stream and one value;
  ``h_i += sigmoid(ssqrt(<h_i q_w k_w, key_i> / (rms(h_i) rms(key_i) sqrt(H)))) value``.
* Attention (V4's, one K = V head): ``q = wq_b(RMSNorm(wq_a x))`` (no per-head norm), ``kv = RMSNorm(wkv x)``,
  interleaved RoPE on the trailing ``rope_head_dim`` channels (compressing layers: ``compress_rope_theta`` with
  YaRN when ``max_position_embeddings > original_seq_len``; window-only layers: ``rope_theta``, no YaRN); keys =
  the last ``sliding_window`` positions plus the compressed entries the indexer selected; sinks; the output's rope
  slice rotated back; the grouped low-rank output.
* KV shared across layers: a ``kv_source_layers`` layer compresses (``sum_j softmax_j(wgate x_j) wkv x_j`` over
  ``compress_ratio`` positions, RMSNorm, roped at the group's first position; ratio 1: ``RMSNorm(wkv x)``) and
  publishes its entries; the later compressing layers read the last published ones. An ``index_source_layers``
  layer scores the visible entries (``sum_h relu(q_h . k_j) w_h``) against the index keys published *last* (a
  KV source publishes its own when a group completes: on a decode step whose group is still filling, a layer
  reads another source's keys, as the release does) and keeps the top ``index_topk`` finite ones; the candidate
  source layer also keeps ``candidate_topk_blocks`` blocks (the newest always) that the later index layers score
  only (two-level top-k); the other compressing layers reuse the last selection. ``Published`` holds what is
  published, across forwards like the vendor's module-level ``shared_attn``. After the prefill a forward takes
  one token (the publication is per step).
* MoE: ``sqrt(softplus(gate x / gate_temp))``, top-k of score + ``gate.bias``, the scores at the picks renormalised
  and times ``routed_scaling_factor``; clamped SwiGLU routed and shared experts.
The DSpark draft stages (``mtp.``) and the vision tower are not part of this forward (converted, never read).
Components: ``engram.py`` (the hash and the gate), ``deepseek_v41_kv.py`` (``Published``, the compressor, the
indexer); V4's ``TailRope`` and clamped experts, ``hyper.HyperConnection``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.kernels import threads
from colitools.runtime.attention import KVBuffer, attend, causal_mask
from colitools.runtime.config import ConfigKeys, IndexerArgs, ModelArgs, RopeArgs, routing_args
from colitools.runtime.deepseek_v4 import ClampedExpert, TailRope, clamped_swiglu, softplus
from colitools.runtime.deepseek_v41_kv import (
    GroupCompressor,
    Published,
    SourceCache,
    V41Indexer,
    resident,
    role_shapes,
)
from colitools.runtime.engram import Engram, EngramArgs, load_engram_hash
from colitools.runtime.experts import ExpertStore
from colitools.runtime.family import LayerContext, ModelIO, RuntimeFamily
from colitools.runtime.hyper import HyperConnection
from colitools.runtime.ops import rms_norm
from colitools.runtime.weights import Checkpoint, sanitize

F32 = np.float32
NEG_INF = F32(-np.inf)

DEFAULTS = {  # c/deepseek_v41.c cfg_load's, for keys a config omits
    "rms_norm_eps": 1e-6, "num_key_value_heads": 1, "o_groups": 1, "n_shared_experts": 1, "norm_topk_prob": True,
    "routed_scaling_factor": 1.0, "gate_temp": 1.0, "swiglu_limit": 0.0, "sliding_window": 128,
    "compress_rope_theta": 40000.0, "rope_theta": 10000.0, "rope_factor": 1.0, "original_seq_len": 0,
    "beta_fast": 32, "beta_slow": 1, "candidate_source_layer_id": -1, "hc_mult": 1, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "max_position_embeddings": 4096, "score_func": "sqrtsoftplus", "kv_source_layer_ids": [],
    "index_source_layer_ids": [], "engram_layer_ids": [], "tie_word_embeddings": False,
}  # fmt: skip


@dataclass(kw_only=True)
class V41Args(ModelArgs):
    """What only DeepSeek-V4.1 has (``rope`` is the window layers' one)."""

    compress_ratios: tuple[int, ...]
    kv_sources: frozenset[int]
    index_sources: frozenset[int]
    candidate_source: int  # -1: one-level top-k
    candidate_blocks: int
    candidate_block_size: int
    compress_rope: RopeArgs
    hc_mult: int
    hc_iters: int
    hc_eps: float
    o_groups: int
    o_lora_rank: int
    q_lora_rank: int
    sliding_window: int
    indexer: IndexerArgs
    swiglu_limit: float
    gate_temp: float
    engram: EngramArgs


def _ints(c: ConfigKeys, key: str, n: int) -> tuple[int, ...]:
    value = c.get(key)
    if not isinstance(value, list) or any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n
                                          for v in value):  # fmt: skip
        raise RuntimeModelError(f"{c.where}: {key} {value!r} (expected a list of layer numbers 0..{n - 1})")
    return tuple(value)


def _ropes(c: ConfigKeys, rd: int) -> tuple[RopeArgs, RopeArgs]:
    """(window rope, compress rope): ``rope_theta`` plain; ``compress_rope_theta`` with YaRN when the table is
    longer than ``original_seq_len`` (colibri ``rope_table``; ``rope_scaling`` overrides the flat keys)."""
    scaling = c.get("rope_scaling") if isinstance(c.get("rope_scaling"), dict) else {}
    factor = float(scaling.get("factor", c["rope_factor"]))
    original = int(scaling.get("original_max_position_embeddings", c["original_seq_len"]))
    fast, slow = (
        float(scaling.get("beta_fast", c["beta_fast"])),
        float(scaling.get("beta_slow", c["beta_slow"])),
    )
    window = RopeArgs(theta=float(c["rope_theta"]), dim=rd, interleaved=True)
    if 0 < original < int(c["max_position_embeddings"]):
        compress = RopeArgs(rope_type="yarn", theta=float(c["compress_rope_theta"]), dim=rd, interleaved=True,
                            factor=factor, original_max_position_embeddings=original, beta_fast=fast,
                            beta_slow=slow, attention_factor=1.0)  # fmt: skip
    else:
        compress = RopeArgs(theta=float(c["compress_rope_theta"]), dim=rd, interleaved=True)
    return window, compress


def _schedule(c: ConfigKeys, n: int) -> dict[str, Any]:
    """Compress ratios, KV / index sources, the candidate source: each compressing layer needs a KV source and an
    index source at or before it (the ones it reads)."""
    ratios = c.need("compress_ratios")
    if (
        not isinstance(ratios, list)
        or len(ratios) < n
        or any(not isinstance(r, int) or r < 0 for r in ratios[:n])
    ):
        raise RuntimeModelError(
            f"{c.where}: compress_ratios must give a ratio >= 0 for each of the {n} layers"
        )
    ratios = tuple(ratios[:n])
    kv, ix = frozenset(_ints(c, "kv_source_layer_ids", n)), frozenset(_ints(c, "index_source_layer_ids", n))
    for layer in sorted(kv | ix):
        if not ratios[layer]:
            raise RuntimeModelError(f"{c.where}: source layer {layer} does not compress (compress_ratios 0)")
    for layer in (i for i in range(n) if ratios[i]):
        if not any(s <= layer for s in kv) or not any(s <= layer for s in ix):
            raise RuntimeModelError(
                f"{c.where}: layer {layer} compresses with no KV and index source at or before it"
            )
    cand = int(c["candidate_source_layer_id"])
    if cand >= 0 and cand not in ix:
        raise RuntimeModelError(f"{c.where}: candidate_source_layer_id {cand} is not an index source layer")
    return dict(compress_ratios=ratios, kv_sources=kv, index_sources=ix, candidate_source=cand,
                candidate_blocks=int(c.need("candidate_topk_blocks")) if cand >= 0 else 0,
                candidate_block_size=int(c.need("candidate_block_size")) if cand >= 0 else 1)  # fmt: skip


def _engram(c: ConfigKeys, n: int) -> EngramArgs:
    layers = _ints(c, "engram_layer_ids", n)
    if not layers:
        return EngramArgs((), 2, 0, 0)
    e = EngramArgs(layers, int(c.need("engram_max_ngram_size")), int(c.need("engram_n_heads")),
                   int(c.need("engram_head_dim")))  # fmt: skip
    if e.max_ngram < 2 or e.heads < 1 or e.head_dim < 1:
        raise RuntimeModelError(
            f"{c.where}: engram_max_ngram_size >= 2, engram_n_heads and engram_head_dim >= 1"
        )
    return e


# ---------------------------------------------------------------------------------------------- attention
class V41Attention:
    """V4's attention on one K = V head with the layer's window and, on a compressing layer, the published entries
    its (or the last) indexer selected."""

    def __init__(self, args: V41Args, ckpt: Checkpoint, layer: int, pub: Published):
        p, shapes = f"layers.{layer}.attn", role_shapes(args)
        self.nh, self.D, self.eps, self.groups, self.rank = (
            args.num_attention_heads,
            args.head_dim,
            args.rms_norm_eps,
            args.o_groups,
            args.o_lora_rank,
        )
        self.layer, self.ratio, self.pub, self.window = (
            layer,
            args.compress_ratios[layer],
            pub,
            args.sliding_window,
        )
        self.rope = TailRope(args.compress_rope if self.ratio else args.rope)
        self.wq_a, self.wq_b, self.wkv, self.wo_a, self.wo_b = (
            resident(ckpt, f"{p}.{leaf}", shapes[("attn", leaf)]) for leaf in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")
        )  # fmt: skip
        self.q_norm = ckpt.vector(sanitize(f"{p}.q_norm.weight"), args.q_lora_rank)
        self.kv_norm = ckpt.vector(sanitize(f"{p}.kv_norm.weight"), self.D)
        self.sinks = ckpt.vector(sanitize(f"{p}.attn_sink"), self.nh)
        self.compressor = self.indexer = None
        if layer in args.kv_sources:
            self.compressor = GroupCompressor(ckpt, f"{p}.compressor", shapes, self.ratio, self.eps)
            pub.caches[layer] = SourceCache()
        if layer in args.index_sources:
            self.indexer = V41Indexer(args, ckpt, f"{p}.indexer", layer, self.rope, pub)
        self.kc, self.first = KVBuffer(), 0

    @property
    def nbytes(self) -> int:
        mats = (self.wq_a, self.wq_b, self.wkv, self.wo_a, self.wo_b, self.compressor, self.indexer)
        return sum(m.nbytes for m in mats if m is not None) + self.q_norm.nbytes + self.kv_norm.nbytes

    def reset(self) -> None:
        self.kc.reset()
        self.first = 0
        if self.compressor is not None:
            self.compressor.reset()

    def compressed(self, x, q_resid, positions) -> tuple[np.ndarray, np.ndarray]:
        """(entries ``[T, D]`` of the last KV source, selection ``[N, T]``) for this chunk's queries."""
        pub, ratio, N = self.pub, self.ratio, x.shape[0]
        T = int(positions[-1] + 1) // ratio
        groups, entries = np.zeros(0, np.int64), None
        if self.compressor is not None:
            groups, entries = self.compressor(x, positions)
            pub.entries_of = self.layer
        if self.indexer is not None:
            if self.indexer.wk is not None and groups.size:
                pub.caches[self.layer].keys.append(self.indexer.keys(entries, groups * ratio))
                pub.keys_of = self.layer
            pub.selection = (
                self.indexer.select(x, q_resid, positions, ratio, T) if T else np.zeros((N, 0), bool)
            )
        if groups.size:
            roped = self.rope.apply(entries[:, None, :], *self.rope.cos_sin(groups * ratio))[:, 0]
            pub.caches[self.layer].entries.append(roped)
        source = pub.caches[pub.entries_of].entries
        if source.length < T or pub.selection is None or pub.selection.shape[0] != N:
            raise RuntimeModelError(
                f"layer {self.layer}: no published compressed entries for these positions"
            )
        seen = np.zeros((N, T), dtype=bool)
        w = min(T, pub.selection.shape[1])
        seen[:, :w] = pub.selection[:, :w]
        return source.data[:T], seen

    def __call__(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        N, nh, D = x.shape[0], self.nh, self.D
        if positions[0] > 0 and N > 1:
            raise RuntimeModelError("deepseek_v41: after the prefill a forward takes one token (the index keys a "
                                    "layer reads are published per step)")  # fmt: skip
        cos, sin = self.rope.cos_sin(positions)
        q_resid = rms_norm(self.wq_a(x), self.q_norm, self.eps)
        q = self.rope.apply(self.wq_b(q_resid).reshape(N, nh, D), cos, sin)
        kv = self.rope.apply(rms_norm(self.wkv(x), self.kv_norm, self.eps).reshape(N, 1, D), cos, sin)
        K = self.kc.append(kv)
        allowed = causal_mask(positions, K.shape[0], self.window, self.first)
        if self.ratio:
            C, seen = self.compressed(x, q_resid, positions)
            K = np.concatenate([K, C[:, None, :]])
            allowed = np.concatenate([allowed, seen], axis=1)
        out = self.rope.apply(attend(q, K, K, allowed, D**-0.5, self.sinks).reshape(N, nh, D), cos, -sin)
        self.first += self.kc.keep_last(self.window - 1)
        g = self.groups
        parts = out.reshape(N, g, -1).transpose(1, 0, 2).reshape(g * N, -1)  # group-major rows
        y = self.wo_a(parts).reshape(g, N, g, self.rank)  # every group's rows through every block ...
        grouped = np.stack([y[i, :, i] for i in range(g)], axis=1).reshape(
            N, g * self.rank
        )  # ... keep its own
        return self.wo_b(grouped)


# ---------------------------------------------------------------------------------------------------- MoE
class V41MoE:
    """``sqrt(softplus(gate x / gate_temp))``; top-k of score + ``gate.bias``; weights the scores at the picks,
    renormalised with ``norm_topk_prob`` (``sum + 1e-20``), times ``routed_scaling_factor``; clamped SwiGLU
    routed experts plus the shared experts."""

    def __init__(self, args: V41Args, ckpt: Checkpoint, layer: int, ctx: LayerContext):
        p, H, I, E = f"layers.{layer}.ffn", args.hidden_size, args.moe_intermediate_size, args.num_experts
        self.k, self.usage, self.limit = (
            args.num_experts_per_tok,
            ctx.layer_usage(layer),
            F32(args.swiglu_limit),
        )
        self.renorm, self.scaling = args.routing.norm_topk_prob, F32(args.routing.routed_scaling_factor)
        self.temp = F32(args.gate_temp)
        self.router = resident(ckpt, f"{p}.gate", (E, H))
        self.bias = ckpt.vector(sanitize(f"{p}.gate.bias"), E)
        sources = [tuple(ckpt.stored(sanitize(f"{p}.experts.{e}.{w}.weight"), O, In)
                         for w, O, In in (("w1", I, H), ("w3", I, H), ("w2", H, I))) for e in range(E)]  # fmt: skip
        limit = args.swiglu_limit
        self.store = ExpertStore(ckpt, layer, sources, E, None, lambda g, u, d: ClampedExpert(g, u, d, limit))
        ctx.stores[layer] = self.store
        S = args.routing.shared_expert_intermediate_size
        self.shared = tuple(resident(ckpt, f"{p}.shared_experts.{w}", dims)
                            for w, dims in (("w1", (S, H)), ("w3", (S, H)), ("w2", (H, S))))  if S else None  # fmt: skip

    @property
    def nbytes(self) -> int:
        return self.router.nbytes + self.bias.nbytes + sum(m.nbytes for m in self.shared or ())

    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scores = np.sqrt(softplus(self.router(x) / self.temp)).astype(F32)
        idx = np.argsort(-(scores + self.bias), axis=-1, kind="stable")[:, : self.k]
        w = np.take_along_axis(scores, idx, axis=-1)
        if self.renorm and self.k > 1:
            w = w / (np.sum(w, axis=-1, keepdims=True, dtype=F32) + F32(1e-20))
        return idx, (w * self.scaling).astype(F32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        idx, w = self.route(x)
        if self.usage is not None:
            self.usage.record(idx, w)
        hit = [int(e) for e in np.unique(idx)]
        experts = [self.store.get(e) for e in hit]

        def run(i: int) -> tuple[np.ndarray, np.ndarray]:
            tok, pos = np.nonzero(idx == hit[i])
            return tok, experts[i](x[tok]) * w[tok, pos][:, None]

        out = np.zeros_like(x)
        for tok, y in threads.parallel_map(run, range(len(hit))):
            out[tok] += y
        if self.shared is not None:
            g, u, d = self.shared
            out = out + d(clamped_swiglu(g(x), u(x), self.limit))
        return out


# ------------------------------------------------------------------------------------------------- layers
class V41Layer:
    """``engram -> attention -> MoE`` on the streams; each sublayer's input collapsed with the ``pre`` of the one
    before it (the carry ``(ids, pre)``), its own ``pre`` handed on."""

    def __init__(self, engram: Engram | None, attn: V41Attention, ffn: V41MoE, attn_hc: HyperConnection,
                 ffn_hc: HyperConnection, norms: tuple[np.ndarray, np.ndarray], eps: float, pub: Published):  # fmt: skip
        self.engram, self.attn, self.ffn, self.attn_hc, self.ffn_hc = engram, attn, ffn, attn_hc, ffn_hc
        self.norm_in, self.norm_post = norms
        self.eps, self.pub = eps, pub
        self.previous_pre = (
            True  # False: each sublayer collapses with its own pre, V4's rule (a mutation switch)
        )

    @property
    def nbytes(self) -> int:
        parts = (self.engram, self.attn, self.ffn, self.attn_hc, self.ffn_hc, self.norm_in, self.norm_post)
        return sum(p.nbytes for p in parts if p is not None)

    def reset(self) -> None:
        self.attn.reset()
        self.pub.reset()

    def __call__(self, streams, positions, cos, sin, carry):
        ids, pre = carry
        if self.engram is not None:
            self.pub.observe(ids, positions)
            streams = self.engram(streams, positions)
        a_pre, post, comb = self.attn_hc.weights(streams)
        x = np.sum((pre if self.previous_pre else a_pre)[:, :, None] * streams, axis=1, dtype=F32)
        out = self.attn(rms_norm(x, self.norm_in, self.eps), positions)
        streams = HyperConnection.expand(streams, out, post, comb)
        f_pre, post, comb = self.ffn_hc.weights(streams)
        x = np.sum((a_pre if self.previous_pre else f_pre)[:, :, None] * streams, axis=1, dtype=F32)
        streams = HyperConnection.expand(streams, self.ffn(rms_norm(x, self.norm_post, self.eps)), post, comb)
        return streams, (ids, f_pre)


class V41IO(ModelIO):
    """The embedding copied into ``hc_mult`` streams; the carry ``(token ids, pre)`` starts with stream 0 alone;
    the last layer's FFN ``pre`` collapses the streams before ``norm`` and ``head``."""

    head_name = "head"

    def __init__(self, args: V41Args, ckpt: Checkpoint):
        super().__init__(args, ckpt)
        self.hc_mult = args.hc_mult

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        return np.repeat(self.embed(ids)[:, None, :], self.hc_mult, axis=1)

    def carry(self, ids: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pre = np.zeros((ids.size, self.hc_mult), F32)
        pre[:, 0] = 1
        return ids, pre

    def logits(self, x: np.ndarray, carry, all_logits: bool) -> np.ndarray:
        h = np.sum(carry[1][:, :, None] * x, axis=1, dtype=F32)
        return self.lm_head(rms_norm(h if all_logits else h[-1:], self.norm, self.eps))


class DeepseekV41(RuntimeFamily):
    defaults = {"deepseek_v41": DEFAULTS}

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> V41Args:
        """Every layer MoE (sqrtsoftplus + bias top-k, ``n_shared_experts`` clamped shared experts), one K = V head,
        the compress / KV-source / index-source schedule, the two ropes, hc, the engram geometry."""
        n, where = base["num_hidden_layers"], c.where
        if c["score_func"] != "sqrtsoftplus":
            raise RuntimeModelError(
                f"{where}: score_func {c['score_func']!r} is not supported (sqrtsoftplus)"
            )
        if base["num_key_value_heads"] != 1:
            raise RuntimeModelError(
                f"{where}: deepseek_v41 has one shared K = V head (num_key_value_heads 1)"
            )
        heads, D, groups = base["num_attention_heads"], base["head_dim"], int(c["o_groups"])
        if (heads * D) % groups:
            raise RuntimeModelError(f"{where}: {heads} heads x {D} do not split into o_groups = {groups}")
        window, compress = _ropes(c, int(c.need("qk_rope_head_dim")))
        routing = routing_args(c, norm_topk_prob=bool(c["norm_topk_prob"]),
                               routed_scaling_factor=float(c["routed_scaling_factor"]),
                               shared_expert_intermediate_size=base["moe_intermediate_size"] * int(c["n_shared_experts"]))  # fmt: skip
        return V41Args(
            **base, **_schedule(c, n), rope=window, compress_rope=compress, routing=routing,
            hc_mult=int(c["hc_mult"]), hc_iters=int(c["hc_sinkhorn_iters"]), hc_eps=float(c["hc_eps"]),
            o_groups=groups, o_lora_rank=int(c.need("o_lora_rank")), q_lora_rank=int(c.need("q_lora_rank")),
            sliding_window=int(c["sliding_window"]), swiglu_limit=float(c["swiglu_limit"]),
            gate_temp=float(c["gate_temp"]), engram=_engram(c, n),
            indexer=IndexerArgs(topk=int(c.get("index_topk", 0)), head_dim=int(c.get("index_head_dim", 0)),
                                n_heads=int(c.get("index_n_heads", 0))),
        )  # fmt: skip

    def layer(self, ctx: LayerContext, layer: int) -> V41Layer:
        args, ckpt = ctx.args, ctx.ckpt
        pub = ctx.shared.setdefault("published", Published())
        p, H, n = f"layers.{layer}", args.hidden_size, args.hc_mult

        def hc(site: str) -> HyperConnection:
            return HyperConnection.load(ckpt, sanitize(f"{p}.hc_{site}"), H, n, args.hc_iters, args.hc_eps,
                                        args.rms_norm_eps)  # fmt: skip

        engram = None
        if layer in args.engram.layers:
            if pub.hash is None:
                pub.hash = load_engram_hash(ckpt.dir, args.engram, args.vocab_size)
            engram = Engram(ckpt, layer, args.engram, H, n, args.rms_norm_eps, pub)
        norms = (
            ckpt.vector(sanitize(f"{p}.attn_norm.weight"), H),
            ckpt.vector(sanitize(f"{p}.ffn_norm.weight"), H),
        )
        return V41Layer(engram, V41Attention(args, ckpt, layer, pub), V41MoE(args, ckpt, layer, ctx), hc("attn"),
                        hc("ffn"), norms, args.rms_norm_eps, pub)  # fmt: skip

    def io(self, args: V41Args, ckpt: Checkpoint) -> V41IO:
        return V41IO(args, ckpt)


FAMILY = DeepseekV41()
