"""DeepSeek V4 Flash (``deepseek_v4``), transformers 5.24 ``modeling_deepseek_v4.py``, on its native names
(``attn.wq_a``, ``ffn.experts.{E}.w1``, ``ffn.gate.weight``, ``head.weight``, ``hc_attn_fn`` ...).

* Residual: ``hc_mult`` hyper-connection streams (``deepseek_v4_hc.py``) mixed before and after each block;
  the hyper head collapses them before the final norm.
* Attention (one shared K = V head, ``head_dim`` wide): ``q = RMS(wq_b(RMSNorm(wq_a x)))`` per head (unweighted),
  ``kv = RMSNorm(wkv x)``; interleaved partial RoPE on the *trailing* ``head_dim x partial_rotary_factor``
  channels (``compress`` rope for CSA / HCA layers, ``main`` for sliding-only ones); keys = the last
  ``sliding_window`` tokens plus the layer compressor's entries; a learned per-head sink ``attn_sink``; the
  output's rope slice rotated back (``-sin``, at the query position), then the grouped low-rank projection
  ``wo_b(concat_g wo_a_g(out_g))`` (``o_groups`` groups, ``o_lora_rank`` each).
* Compressors (``Compressor``): every ``rate`` tokens one entry ``RMSNorm(sum_j softmax_j(gate_j + ape_j) kv_j)``
  roped at position ``i * rate``. Heavily compressed attention (HCA, rate ``compress_rates[hca]``) pools one
  window; compressed sparse attention (CSA, rate 4) pools the previous window's ``Ca`` half with the current
  window's ``Cb`` half (two series, ``2 * head_dim`` projections), and its lightning indexer (an own compressor
  at ``index_head_dim``; ``sum_h w_h relu(q_h . k) / sqrt(d)``) keeps the top ``index_topk`` entries per query.
  Query ``t`` sees entry ``w`` only when ``w < (t + 1) // rate``. The pending tokens, the last window's ``Ca``
  and the entries are the compressor's cache, so prefill and decode compute the same entries.
* MoE: ``sqrtsoftplus`` scores of ``ffn.gate.weight``; ``hash_moe`` layers pick the experts of
  ``ffn.gate.tid2eid[token]`` (I64, read from the container), the others the top-k of ``scores + ffn.gate.bias``;
  weights = scores at the picks, renormalised, times ``routed_scaling_factor``. Routed and shared experts are
  clamped SwiGLU (``min(gate, limit)``, ``clip(up, +-limit)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.families import v4_shapes
from colitools.formats.kernels import threads
from colitools.runtime.attention import KVBuffer, attend, causal_mask
from colitools.runtime.config import ConfigKeys, IndexerArgs, ModelArgs, RopeArgs, rope_args, routing_args
from colitools.runtime.deepseek_v4_hc import HyperHead, V4HyperConnection
from colitools.runtime.deepseek_v4_quant import MODES, ActQuant, QuantizedInput, attend_bf16
from colitools.runtime.experts import Expert, ExpertStore
from colitools.runtime.family import LayerContext, ModelIO, RuntimeFamily
from colitools.runtime.ops import Linear, silu
from colitools.runtime.rope import Rope
from colitools.runtime.weights import Checkpoint, sanitize

F32 = np.float32
NEG_INF = F32(-np.inf)
CSA, HCA, SLIDING = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"

DEFAULTS = {  # transformers 5.24 DeepseekV4Config
    "rms_norm_eps": 1e-6, "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024,
    "num_experts_per_tok": 6, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "compress_rates": {CSA: 4, HCA: 128}, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "swiglu_limit": 10.0, "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "tie_word_embeddings": False,
}  # fmt: skip
DEFAULT_HASH_LAYERS = 3  # DeepseekV4Config.default_num_hash_layers
DEFAULT_PARTIAL_ROTARY = (
    64 / 512
)  # DeepseekV4Config.default_partial_rotary_factor (qk_rope_head_dim / head_dim)
# the legacy per-layer ``compress_ratios`` (older V4 configs) -> layer type (transformers 5.24)
COMPRESS_RATIO_TO_LAYER_TYPE = {0: SLIDING, 4: CSA, 128: HCA}


@dataclass(kw_only=True)
class V4Args(ModelArgs):
    """What only DeepSeek-V4 has, parsed from the config (``v4_fields``): ``rope`` is the ``main`` one."""

    layer_types: tuple[str, ...]
    hash_layers: tuple[bool, ...]
    compress_rates: dict[str, int]
    main_rope: RopeArgs
    compress_rope: RopeArgs
    hc_mult: int
    hc_iters: int
    hc_eps: float
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    q_lora_rank: int
    indexer: IndexerArgs  # the CSA layers' (every entry is an own indexer: ``full`` unused)
    swiglu_limit: float
    act_quant: ActQuant = field(default_factory=ActQuant)  # ``run --act-quant`` (deepseek_v4_quant.py)


def v4_fields(c: ConfigKeys, n_layers: int, head_dim: int) -> dict[str, Any]:
    """The ``V4Args`` fields only DeepSeek-V4 has: layer and MLP types, compress rates, the two ropes, hc, o_groups."""
    where = c.where
    if c.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
        raise RuntimeModelError(
            f"{where}: scoring_func {c.get('scoring_func')!r} is not supported (sqrtsoftplus)"
        )
    # explicit keys, else the legacy V3-flavoured ones transformers folds in (compress_ratios, num_hash_layers,
    # compress_rate_csa / _hca, qk_rope_head_dim), else the defaults
    ratios = c.get("compress_ratios")
    if not c.get("layer_types") and ratios is not None:
        if not isinstance(ratios, list) or any(r not in COMPRESS_RATIO_TO_LAYER_TYPE for r in ratios):
            raise RuntimeModelError(f"{where}: compress_ratios {ratios!r} (expected 0 / 4 / 128 per layer)")
        ratios = [COMPRESS_RATIO_TO_LAYER_TYPE[r] for r in ratios][:n_layers]
    types = (
        c.get("layer_types")
        or ratios
        or ([HCA] * min(n_layers, 2) + [CSA if i % 2 else HCA for i in range(max(n_layers - 2, 0))])
    )
    if len(types) != n_layers or set(types) - {CSA, HCA, SLIDING}:
        raise RuntimeModelError(
            f"{where}: layer_types must list {CSA} / {HCA} / {SLIDING} for {n_layers} layers"
        )
    n_hash = int(c.get("num_hash_layers", DEFAULT_HASH_LAYERS))
    mlp = c.get("mlp_layer_types") or (
        ["hash_moe"] * min(n_layers, n_hash) + ["moe"] * max(0, n_layers - n_hash)
    )
    if len(mlp) != n_layers or set(mlp) - {"hash_moe", "moe"}:
        raise RuntimeModelError(f"{where}: mlp_layer_types must list hash_moe / moe for {n_layers} layers")
    rates = {**DEFAULTS["compress_rates"], **(c.get("compress_rates") or {})}
    for key, kind in (("compress_rate_csa", CSA), ("compress_rate_hca", HCA)):
        if c.get(key) is not None:
            rates[kind] = c[key]
    if any(not isinstance(r, int) or r < 1 for r in rates.values()):
        raise RuntimeModelError(f"{where}: bad compress_rates {rates!r}")
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    partial = c.get("partial_rotary_factor")
    if partial is None:
        partial = (
            int(c["qk_rope_head_dim"]) / head_dim if c.get("qk_rope_head_dim") else DEFAULT_PARTIAL_ROTARY
        )
    partial = float(partial)
    ropes = {}
    for label, theta_key in (("main", "rope_theta"), ("compress", "compress_rope_theta")):
        sub = params.get(label) if isinstance(params.get(label), dict) else None
        if sub is None:  # flat rope_parameters: main is plain, compress takes the (yarn) rest
            flat = (
                {k: v for k, v in params.items() if k not in ("main", "compress")}
                if label == "compress"
                else {}
            )
            sub = {**flat, "rope_theta": float(c[theta_key])}
            sub["rope_type"] = sub.pop("type", None) or sub.get("rope_type") or "default"
            sub.setdefault("partial_rotary_factor", partial)
            if sub.get("rope_type") == "yarn":
                sub.setdefault("attention_factor", 1.0)
        keys = ConfigKeys(c.model_type, {**c, "rope_parameters": sub, "partial_rotary_factor": None}, where)
        ropes[label] = rope_args(keys, head_dim, interleaved=True)
    groups, rank = int(c["o_groups"]), int(c["o_lora_rank"])
    heads = int(c.need("num_attention_heads"))
    if (heads * head_dim) % groups:
        raise RuntimeModelError(f"{where}: {heads} heads x {head_dim} do not split into o_groups = {groups}")
    return dict(
        layer_types=tuple(types), hash_layers=tuple(t == "hash_moe" for t in mlp), compress_rates=rates,
        main_rope=ropes["main"], compress_rope=ropes["compress"], hc_mult=int(c["hc_mult"]),
        hc_iters=int(c["hc_sinkhorn_iters"]), hc_eps=float(c["hc_eps"]), o_groups=groups, o_lora_rank=rank,
        sliding_window=int(c["sliding_window"]),
    )  # fmt: skip


def _linear(ckpt: Checkpoint, prefix: str, O: int, I: int) -> Linear:
    """The resident ``[O, I]`` weight ``{prefix}.weight`` (a native name, looked up by its canonical spelling)."""
    return Linear(ckpt.resident(sanitize(f"{prefix}.weight"), O, I))


def _fp8_linear(ckpt: Checkpoint, prefix: str, O: int, I: int, quant: ActQuant) -> QuantizedInput:
    """A projection DeepSeek-V4 releases in FP8: its input rounded first under ``--act-quant``."""
    return QuantizedInput(_linear(ckpt, prefix, O, I), quant)


# ------------------------------------------------------------------------------------------------ RoPE
class TailRope:
    """V4's interleaved RoPE on the trailing ``dim`` channels, written in place (pairs ``(2i, 2i + 1)`` of the
    slice stay where they are: values carry the rope slice too, so no permutation is allowed)."""

    def __init__(self, rope: RopeArgs):
        self.rope = Rope(rope)
        self.dim = rope.dim

    def cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.rope.cos_sin(np.asarray(positions))

    def apply(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """``x [N, h, D]``, ``cos`` / ``sin`` ``[N, dim/2]``."""
        d = self.dim
        if d == 0:
            return x
        c, s = cos[:, None, :], sin[:, None, :]
        rot = x[..., x.shape[-1] - d :]
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = np.array(x, dtype=F32, copy=True)
        tail = out[..., x.shape[-1] - d :]
        tail[..., 0::2] = x1 * c - x2 * s
        tail[..., 1::2] = x2 * c + x1 * s
        return out


# ---------------------------------------------------------------------------------------------- compressor
class Compressor:
    """One compressor (``attn.compressor`` or ``attn.indexer.compressor``): ``wkv`` / ``wgate`` ``[c d, H]``,
    ``ape [rate, c d]``, ``norm [d]``; ``c`` = 2 (overlapping CSA windows: ``Ca = [:d]``, ``Cb = [d:]``) or 1.

    Cache: the pending projections of the current window, the last full window's ``Ca`` (kv, gate) and the
    emitted entries (roped at ``i * rate``)."""

    def __init__(self, ckpt: Checkpoint, prefix: str, H: int, d: int, rate: int, overlap: bool,
                 rope: TailRope, eps: float, quant: ActQuant, rotated: bool = False):  # fmt: skip
        c = 2 if overlap else 1
        self.d, self.rate, self.overlap, self.rope, self.eps = d, rate, overlap, rope, eps
        self.quant, self.rotated = (
            quant,
            rotated,
        )  # rotated: the indexer's (Hadamard + e2m1 under --act-quant)
        self.wkv = _linear(ckpt, f"{prefix}.wkv", c * d, H)
        self.wgate = _linear(ckpt, f"{prefix}.wgate", c * d, H)
        self.ape = ckpt.array(f"{prefix}.ape", (rate, c * d))
        self.norm = ckpt.vector(f"{prefix}.norm.weight", d)
        self.enabled = True  # False: no entries (a mutation switch for tests)
        self.reset()

    @property
    def nbytes(self) -> int:
        return self.wkv.nbytes + self.wgate.nbytes + self.ape.nbytes + self.norm.nbytes

    def reset(self) -> None:
        self.pending_kv = self.pending_gate = None  # projections of the current, unfinished window
        self.prev: tuple[np.ndarray, np.ndarray] | None = None  # last window's (Ca kv, Ca gate) [rate, d]
        self.entries = KVBuffer()
        self.count = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Feed ``x [N, H]`` (the next positions); returns every entry emitted so far ``[T, d]``."""
        kv, gate = self.wkv(x), self.wgate(x)
        if self.pending_kv is not None and self.pending_kv.shape[0]:
            kv = np.concatenate([self.pending_kv, kv])
            gate = np.concatenate([self.pending_gate, gate])
        m, d = self.rate, self.d
        usable = (kv.shape[0] // m) * m
        self.pending_kv, self.pending_gate = kv[usable:], gate[usable:]
        n_win = usable // m
        if n_win:
            ckv = kv[:usable].reshape(n_win, m, -1)
            cgate = gate[:usable].reshape(n_win, m, -1) + self.ape
            if self.overlap:
                pkv = np.zeros((n_win, 2 * m, d), F32)
                pgate = np.full((n_win, 2 * m, d), NEG_INF, F32)
                pkv[:, m:], pgate[:, m:] = ckv[..., d:], cgate[..., d:]
                pkv[1:, :m], pgate[1:, :m] = ckv[:-1, :, :d], cgate[:-1, :, :d]
                if self.prev is not None:
                    pkv[0, :m], pgate[0, :m] = self.prev
                self.prev = (ckv[-1, :, :d].copy(), cgate[-1, :, :d].copy())
                ckv, cgate = pkv, pgate
            e = np.exp(cgate - np.max(cgate, axis=1, keepdims=True))
            w = e / np.sum(e, axis=1, keepdims=True, dtype=F32)
            r = self.quant.round_bf16  # --act-quant: the pooled entry in BF16, before and after its norm
            pooled = r(self.quant.rms_norm(r(np.sum(ckv * w, axis=1, dtype=F32)), self.norm, self.eps))
            positions = (self.count + np.arange(n_win)) * m
            cos, sin = self.rope.cos_sin(positions)
            q = self.quant  # --act-quant: the roped channels in BF16 too, before the indexer's Hadamard as well
            entries = q.round_bf16(self.rope.apply(pooled[:, None, :], cos, sin)[:, 0, :])
            self.entries.append(q.rotated_fp4(entries) if self.rotated else q.nope(entries, self.rope.dim))
            self.count += n_win
        if self.entries.data is None or not self.enabled:
            return np.zeros((0, d), F32)
        return self.entries.data[: self.entries.length]


def visible(positions: np.ndarray, T: int, rate: int) -> np.ndarray:
    """``[N, T]``: query at ``positions[i]`` may see entry ``w`` iff ``w < (positions[i] + 1) // rate``."""
    return np.arange(T)[None, :] < ((positions + 1) // rate)[:, None]


class Indexer:
    """The CSA lightning indexer: its own compressor at ``index_head_dim``, ``q = wq_b(q_resid)`` roped at the
    query position (compress rope), score ``sum_h (w_h / sqrt(Hi)) relu(q_h . k) / sqrt(d)``, top
    ``index_topk`` of the visible entries (ties: the earliest entry; the oracle has no tie at the boundary)."""

    def __init__(self, args: V4Args, ckpt: Checkpoint, prefix: str, rate: int, rope: TailRope):
        ix, shapes = args.indexer, _attention_shapes(args)
        self.nh, self.d, self.topk, self.rate = ix.n_heads, ix.head_dim, ix.topk, rate
        self.quant = args.act_quant
        self.wq_b = _fp8_linear(ckpt, f"{prefix}.wq_b", *shapes[("attn.indexer", "wq_b")], self.quant)
        self.weights_proj = _linear(ckpt, f"{prefix}.weights_proj", *shapes[("attn.indexer", "weights_proj")])
        self.compressor = Compressor(ckpt, f"{prefix}.compressor", args.hidden_size, self.d, rate, True, rope,
                                     args.rms_norm_eps, self.quant, rotated=True)  # fmt: skip
        self.rope = rope
        self.enabled = True  # False: every visible entry (a mutation switch for tests)

    @property
    def nbytes(self) -> int:
        return self.wq_b.nbytes + self.weights_proj.nbytes + self.compressor.nbytes

    def reset(self) -> None:
        self.compressor.reset()

    def __call__(self, x, q_resid, positions, cos, sin) -> np.ndarray:
        """Boolean ``[N, T]`` of the selected (visible) entries."""
        K = self.compressor(x)
        N, T = x.shape[0], K.shape[0]
        q = self.wq_b(q_resid).reshape(N, self.nh, self.d)
        q = self.quant.rotated_fp4(self.quant.round_bf16(self.rope.apply(q, cos, sin)))
        scores = np.maximum(q @ K.T, F32(0)) * F32(self.d**-0.5)  # [N, nh, T]
        w = self.weights_proj(x) * F32(self.nh**-0.5)
        index = np.sum(scores * w[:, :, None], axis=1, dtype=F32)
        seen = visible(positions, T, self.rate)
        if not self.enabled or T <= self.topk:
            return seen
        index = np.where(seen, index, NEG_INF)
        top = np.argsort(-index, axis=-1, kind="stable")[:, : self.topk]
        selected = np.zeros((N, T), dtype=bool)
        np.put_along_axis(selected, top, True, axis=-1)
        return selected & seen


# ---------------------------------------------------------------------------------------------- attention
def _attention_shapes(args: V4Args) -> dict[tuple[str, str], tuple[int, int]]:
    """``formats/families.v4_shapes`` of these arguments."""
    ix = args.indexer
    return v4_shapes(args.hidden_size, args.num_attention_heads, args.head_dim, args.q_lora_rank, args.o_groups,
                     args.o_lora_rank, ix.n_heads, ix.head_dim)  # fmt: skip


class V4Attention:
    def __init__(self, args: V4Args, ckpt: Checkpoint, layer: int):
        p, v4, shapes = f"model.layers.{layer}.attn", args, _attention_shapes(args)
        H, D, nh, ql = args.hidden_size, args.head_dim, args.num_attention_heads, args.q_lora_rank
        self.nh, self.D, self.eps, self.groups = nh, D, args.rms_norm_eps, v4.o_groups
        self.type = v4.layer_types[layer]
        self.rope = TailRope(v4.main_rope if self.type == SLIDING else v4.compress_rope)
        self.quant = q8 = v4.act_quant
        self.wq_a = _fp8_linear(ckpt, f"{p}.wq_a", *shapes[("attn", "wq_a")], q8)
        self.q_norm = ckpt.vector(sanitize(f"{p}.q_norm.weight"), ql)
        self.wq_b = _fp8_linear(ckpt, f"{p}.wq_b", *shapes[("attn", "wq_b")], q8)
        self.wkv = _fp8_linear(ckpt, f"{p}.wkv", *shapes[("attn", "wkv")], q8)
        self.kv_norm = ckpt.vector(sanitize(f"{p}.norm.weight"), D)
        self.rank = v4.o_lora_rank
        self.wo_a = _fp8_linear(ckpt, f"{p}.wo_a", *shapes[("attn", "wo_a")], q8)
        self.wo_b = _fp8_linear(ckpt, f"{p}.wo_b", *shapes[("attn", "wo_b")], q8)
        self.sinks = ckpt.vector(sanitize(f"{p}.attn_sink"), nh)
        self.window = v4.sliding_window
        self.compressor = self.indexer = None
        if self.type != SLIDING:
            self.rate = v4.compress_rates[self.type]
            self.compressor = Compressor(ckpt, f"{p}.compressor", H, D, self.rate, self.type == CSA, self.rope,
                                         self.eps, q8)  # fmt: skip
            if self.type == CSA:
                self.indexer = Indexer(args, ckpt, f"{p}.indexer", self.rate, self.rope)
        self.inverse_rope = True  # False: skip the output's inverse rotation (a mutation switch for tests)
        self.kc = KVBuffer()
        self.first = 0

    @property
    def nbytes(self) -> int:
        mats = (self.wq_a, self.wq_b, self.wkv, self.wo_a, self.wo_b, self.compressor, self.indexer)
        return sum(m.nbytes for m in mats if m is not None) + self.q_norm.nbytes + self.kv_norm.nbytes

    def reset(self) -> None:
        self.kc.reset()
        self.first = 0
        for part in (self.compressor, self.indexer):
            if part is not None:
                part.reset()

    def __call__(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        N, nh, D = x.shape[0], self.nh, self.D
        cos, sin = self.rope.cos_sin(positions)
        r = self.quant.round_bf16  # identities without --act-quant
        norm = self.quant.rms_norm
        q_resid = r(norm(self.wq_a(x), self.q_norm, self.eps))
        q = r(norm(self.wq_b(q_resid).reshape(N, nh, D), None, self.eps))
        q = r(self.rope.apply(q, cos, sin))
        kv = self.rope.apply(r(norm(self.wkv(x), self.kv_norm, self.eps)).reshape(N, 1, D), cos, sin)
        kv = self.quant.nope(kv, self.rope.dim)
        K = self.kc.append(kv)
        allowed = causal_mask(positions, K.shape[0], self.window, self.first)
        if self.compressor is not None:
            C = self.compressor(x)
            seen = visible(positions, C.shape[0], self.rate)
            # every token reaches the indexer, also before an entry exists: its own compressor keeps state
            if self.indexer is not None:
                seen = self.indexer(x, q_resid, positions, cos, sin)
            K = np.concatenate([K, C[:, None, :]])
            allowed = np.concatenate([allowed, seen[:, : C.shape[0]]], axis=1)
        if self.quant.on:
            out = attend_bf16(q, K[:, 0, :], allowed, D**-0.5, self.sinks).reshape(N, nh, D)
        else:
            out = attend(q, K, K, allowed, D**-0.5, self.sinks).reshape(N, nh, D)
        if self.inverse_rope:
            out = r(self.rope.apply(out, cos, -sin))
        self.first += self.kc.keep_last(self.window - 1)
        g = self.groups
        parts = out.reshape(N, g, -1).transpose(1, 0, 2).reshape(g * N, -1)  # group-major rows
        y = self.wo_a(parts).reshape(g, N, g, self.rank)  # every group's rows through every block ...
        grouped = np.stack([y[i, :, i] for i in range(g)], axis=1).reshape(
            N, g * self.rank
        )  # ... keep its own
        return self.wo_b(grouped)


# ---------------------------------------------------------------------------------------------------- MoE
def clamped_swiglu(gate: np.ndarray, up: np.ndarray, limit: np.float32) -> np.ndarray:
    return silu(np.minimum(gate, limit)) * np.clip(up, -limit, limit)


class ClampedExpert(Expert):
    """A routed V4 expert: ``w2(silu(min(w1 x, limit)) * clip(w3 x, -limit, limit))``."""

    __slots__ = ("limit", "quant")

    def __init__(self, gate, up, down, limit: float, quant: ActQuant | None = None):
        super().__init__(gate, up, down)
        self.limit, self.quant = F32(limit), quant or ActQuant()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.down.matmul(clamped_swiglu(self.gate.matmul(x), self.up.matmul(x), self.limit))

    def weighted(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """``--act-quant``: the expert times its routing weights ``w [n]``, rounded as the engine does (the
        weight applied before ``w2``)."""
        q = self.quant
        x = q.matvec_input(x)
        gate, up = q.round_bf16(self.gate.matmul(x)), q.round_bf16(self.up.matmul(x))
        h = q.round_bf16(clamped_swiglu(gate, up, self.limit) * w[:, None])
        return q.round_bf16(self.down.matmul(q.matvec_input(h)))


def softplus(x: np.ndarray) -> np.ndarray:
    """``torch.nn.functional.softplus`` (beta 1, threshold 20)."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, F32(20))))).astype(F32)


class V4MoE:
    def __init__(self, args: V4Args, ckpt: Checkpoint, layer: int, ctx: LayerContext):
        p = f"model.layers.{layer}.ffn"
        H, I, E = args.hidden_size, args.moe_intermediate_size, args.num_experts
        self.k, self.usage = args.num_experts_per_tok, ctx.layer_usage(layer)
        self.scaling = F32(args.routing.routed_scaling_factor)
        self.limit = F32(args.swiglu_limit)
        self.router = _linear(ckpt, f"{p}.gate", E, H)
        self.hash = args.hash_layers[layer]
        self.tid2eid = self.bias = None
        if self.hash:
            self.tid2eid = ckpt.int_array(sanitize(f"{p}.gate.tid2eid"), (args.vocab_size, self.k))
            if self.tid2eid.size and (self.tid2eid.min() < 0 or self.tid2eid.max() >= E):
                raise RuntimeModelError(f"{ckpt.dir}: {p}.gate.tid2eid names an expert outside 0..{E - 1}")
        else:
            self.bias = ckpt.vector(sanitize(f"{p}.gate.bias"), E)
        self.score_fn = "sqrtsoftplus"  # "sigmoid": a mutation switch for tests
        sources = [
            tuple(ckpt.stored(sanitize(f"{p}.experts.{e}.{w}.weight"), O, In)
                  for w, O, In in (("w1", I, H), ("w3", I, H), ("w2", H, I)))
            for e in range(E)
        ]  # fmt: skip
        limit, quant = args.swiglu_limit, args.act_quant
        self.quant = quant
        self.store = ExpertStore(
            ckpt, layer, sources, E, None, lambda g, u, d: ClampedExpert(g, u, d, limit, quant)
        )
        ctx.stores[layer] = self.store
        S = args.routing.shared_expert_intermediate_size
        self.shared = None
        if S:
            self.shared = tuple(_fp8_linear(ckpt, f"{p}.shared_experts.{w}", O, In, quant)
                                for w, O, In in (("w1", S, H), ("w3", S, H), ("w2", H, S)))  # fmt: skip

    @property
    def nbytes(self) -> int:
        return self.router.nbytes + sum(m.nbytes for m in self.shared or ())

    def route(self, x: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits = self.router(x)
        if self.score_fn == "sigmoid":
            scores = (F32(1) / (F32(1) + np.exp(-logits))).astype(F32)
        else:
            scores = np.sqrt(softplus(logits)).astype(F32)
        if self.hash:
            idx = self.tid2eid[ids]
        else:
            idx = np.argsort(-(scores + self.bias), axis=-1, kind="stable")[:, : self.k]
        w = np.take_along_axis(scores, idx, axis=-1)
        w = w / (np.sum(w, axis=-1, keepdims=True, dtype=F32) + F32(1e-20))
        return idx, (w * self.scaling).astype(F32)

    def __call__(self, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        idx, w = self.route(x, ids)
        if self.usage is not None:
            self.usage.record(idx, w)
        hit = [int(e) for e in np.unique(idx)]  # ascending, like transformers' expert loop
        experts = [self.store.get(e) for e in hit]

        official = self.quant.on

        def run(i: int) -> tuple[np.ndarray, np.ndarray]:
            tok, pos = np.nonzero(idx == hit[i])
            if official:
                return tok, experts[i].weighted(x[tok], w[tok, pos])
            return tok, experts[i](x[tok]) * w[tok, pos][:, None]

        out = np.zeros_like(x)
        for tok, y in threads.parallel_map(run, range(len(hit))):
            out[tok] += y
        if self.shared is not None:
            g, u, d = self.shared
            out = out + d(self.quant.round_bf16(clamped_swiglu(g(x), u(x), self.limit)))
        return self.quant.round_bf16(out)


# ------------------------------------------------------------------------------------------------ layers
class V4Layer:
    """``streams -> mHC(attn(attn_norm(pre-collapse))) -> mHC(ffn(ffn_norm(pre-collapse)))``."""

    def __init__(self, attn: V4Attention, ffn: V4MoE, attn_hc: V4HyperConnection, ffn_hc: V4HyperConnection,
                 norm_in: np.ndarray, norm_post: np.ndarray, eps: float):  # fmt: skip
        self.attn, self.ffn, self.attn_hc, self.ffn_hc = attn, ffn, attn_hc, ffn_hc
        self.norm_in, self.norm_post, self.eps = norm_in, norm_post, eps
        self.hc_enabled = True  # False: streams averaged in, output added to each (a mutation switch)

    @property
    def nbytes(self) -> int:
        parts = (self.attn, self.ffn, self.attn_hc, self.ffn_hc, self.norm_in, self.norm_post)
        return sum(p.nbytes for p in parts)

    def _site(self, hc: V4HyperConnection, streams: np.ndarray, block) -> np.ndarray:
        if not self.hc_enabled:
            return streams + block(np.mean(streams, axis=1))[:, None, :]
        r = self.attn.quant.round_bf16  # --act-quant: BF16 states
        post, comb, collapsed = hc.collapse(streams)
        return r(hc.expand(streams, block(r(collapsed)), post, comb))

    def reset(self) -> None:
        self.attn.reset()

    def __call__(self, streams, positions, cos, sin, ids):
        """``streams [N, hc, H]``; the carry is the token ids (hash routing). Under ``--act-quant`` one row at a
        time (``ActQuant.row_by_row``: prefill = decode bit for bit; ``cos`` / ``sin`` are unused)."""
        return self.attn.quant.row_by_row(self._rows, streams, positions, ids)

    def _rows(self, streams, positions, ids):
        r, norm = self.attn.quant.round_bf16, self.attn.quant.rms_norm  # --act-quant: BF16 normed inputs
        streams = self._site(
            self.attn_hc, streams, lambda h: self.attn(r(norm(h, self.norm_in, self.eps)), positions)
        )
        return self._site(
            self.ffn_hc, streams, lambda h: self.ffn(r(norm(h, self.norm_post, self.eps)), ids)
        ), ids


class V4IO(ModelIO):
    """The embedding copied into ``hc_mult`` streams, the token ids carried to every layer (hash routing), the
    hyper head collapsing the streams before ``model.norm``, the head ``head.weight``."""

    head_name = "head"

    def __init__(self, args: V4Args, ckpt: Checkpoint):
        super().__init__(args, ckpt)
        n, H = args.hc_mult, args.hidden_size
        self.hc_mult, self.quant = n, args.act_quant
        self.hyper_head = HyperHead(
            ckpt.array(sanitize("model.hc_head.hc_fn"), (n, n * H)),
            ckpt.vector(sanitize("model.hc_head.hc_base"), n),
            ckpt.vector(sanitize("model.hc_head.hc_scale"), 1),
            args.hc_eps, args.rms_norm_eps, args.act_quant,
        )  # fmt: skip

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        return np.repeat(self.embed(ids)[:, None, :], self.hc_mult, axis=1)

    def carry(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        return ids

    def logits(self, x: np.ndarray, carry, all_logits: bool) -> np.ndarray:
        """The head's logits; row by row under ``--act-quant`` (``ActQuant.row_by_row``), as the layers."""
        return self.quant.row_by_row(self._head, x if all_logits else x[-1:])

    def _head(self, x: np.ndarray) -> np.ndarray:
        r = self.quant.round_bf16  # --act-quant: streams collapsed, then normed, each in BF16 (final_hidden)
        return self.lm_head(r(self.quant.rms_norm(r(self.hyper_head(x)), self.norm, self.eps)))


class DeepseekV4(RuntimeFamily):
    defaults = {"deepseek_v4": DEFAULTS}

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> V4Args:
        """Every layer is MoE (sqrtsoftplus, hash or biased top-k) with ``n_shared_experts`` clamped shared
        experts; one K = V head; the low-rank query; the indexer sizes; the sliding window; the ``main`` rope."""
        n, D = base["num_hidden_layers"], base["head_dim"]
        v4 = v4_fields(c, n, D)
        if base["num_key_value_heads"] != 1:
            raise RuntimeModelError(
                f"{c.where}: deepseek_v4 has one shared K = V head (num_key_value_heads 1)"
            )
        routing = routing_args(c, router="sqrtsoftplus", routed_scaling_factor=float(c["routed_scaling_factor"]),
                               shared_expert_intermediate_size=base["moe_intermediate_size"]
                               * int(c.get("n_shared_experts") or 0))  # fmt: skip
        return V4Args(
            **base, **v4, routing=routing, swiglu_limit=float(c["swiglu_limit"]),
            q_lora_rank=int(c.need("q_lora_rank")),
            indexer=IndexerArgs(topk=int(c["index_topk"]), head_dim=int(c["index_head_dim"]),
                                n_heads=int(c["index_n_heads"])),
            rope=v4["main_rope"],
        )  # fmt: skip

    def layer(self, ctx: LayerContext, layer: int) -> V4Layer:
        args, ckpt = ctx.args, ctx.ckpt
        p, H, n = f"model.layers.{layer}", args.hidden_size, args.hc_mult

        def hc(site: str) -> V4HyperConnection:
            conn = V4HyperConnection.load(ckpt, sanitize(f"{p}.hc_{site}"), H, n, args.hc_iters, args.hc_eps,
                                          args.rms_norm_eps)  # fmt: skip
            conn.quant = args.act_quant
            return conn

        return V4Layer(
            V4Attention(args, ckpt, layer), V4MoE(args, ckpt, layer, ctx), hc("attn"), hc("ffn"),
            ckpt.vector(sanitize(f"{p}.attn_norm.weight"), H), ckpt.vector(sanitize(f"{p}.ffn_norm.weight"), H),
            args.rms_norm_eps,
        )  # fmt: skip

    def io(self, args: V4Args, ckpt: Checkpoint) -> V4IO:
        return V4IO(args, ckpt)

    act_quant_modes = MODES

    def set_act_quant(self, args: V4Args, mode: str | None) -> None:
        """``run --act-quant official``: DeepSeek's activation rounding (deepseek_v4_quant.py), or None."""
        args.act_quant.mode = mode


FAMILY = DeepseekV4()
