"""Attention: GQA (with the qk-norm variants, biases, clip_qkv, partial rotary, sliding windows), DeepSeek MLA
and the DSA lightning indexer (DeepSeek-V3.2, GLM-5). Each attention layer owns its KV cache.

Scores are ``q . k^T * scale + mask`` and ``softmax`` in float32 (transformers' eager attention); with attention
sinks (gpt-oss) a learned per-head logit joins every softmax denominator and takes no value. Positions are
absolute: a call with ``positions`` ``[p0, p0 + N)`` appends N keys to the cache, and query ``i`` sees keys
``j <= positions[i]`` (and ``j > positions[i] - window`` under a sliding window). A sliding layer's cache keeps
only the last ``window - 1`` keys between calls (transformers' ``DynamicSlidingWindowLayer``): no later query
can see an older one.
"""

from __future__ import annotations

import numpy as np

from colitools.formats.families import gqa_shapes, mla_shapes
from colitools.formats.names import module_path
from colitools.runtime.config import ModelArgs, mla_softmax_scale
from colitools.runtime.ops import Linear, layer_norm, norm_weight, rms_norm, sigmoid, softmax
from colitools.runtime.rope import Rope
from colitools.runtime.weights import Checkpoint

F32 = np.float32
NEG_INF = F32(-np.inf)


class KVBuffer:
    """A growable ``[T, ...]`` float32 buffer (capacity doubles)."""

    def __init__(self) -> None:
        self.data: np.ndarray | None = None
        self.length = 0

    def append(self, x: np.ndarray) -> np.ndarray:
        n = x.shape[0]
        if self.data is None:
            self.data = np.empty((max(64, 2 * n), *x.shape[1:]), dtype=F32)
        if self.length + n > self.data.shape[0]:
            grown = np.empty((2 * (self.length + n), *x.shape[1:]), dtype=F32)
            grown[: self.length] = self.data[: self.length]
            self.data = grown
        self.data[self.length : self.length + n] = x
        self.length += n
        return self.data[: self.length]

    def keep_last(self, n: int) -> int:
        """Drop all but the last ``n`` rows; returns how many were dropped."""
        drop = max(self.length - n, 0)
        if drop:
            self.data[:n] = self.data[drop : self.length].copy()
            self.length = n
        return drop

    def reset(self) -> None:
        self.data, self.length = None, 0


def causal_mask(positions: np.ndarray, T: int, window: int | None = None, first: int = 0) -> np.ndarray:
    """Boolean ``[N, T]``: query at ``positions[i]`` may see key ``j`` (cached keys hold the absolute positions
    ``first .. first + T - 1``)."""
    j = first + np.arange(T)[None, :]
    p = positions[:, None]
    allowed = j <= p
    if window:
        allowed &= j > p - window
    return allowed


def sink_softmax(scores: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """``softmax([scores, sink])`` without the sink's column (transformers' gpt-oss eager attention): ``sinks``
    broadcasts against ``scores[..., :1]``."""
    m = np.maximum(np.max(scores, axis=-1, keepdims=True), sinks)
    e = np.exp(scores - m)
    return e / (np.sum(e, axis=-1, keepdims=True, dtype=F32) + np.exp(sinks - m))


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray, scale: float,
           sinks: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """``q[N, Hq, D]``, ``k[T, Hkv, D]``, ``v[T, Hkv, Dv]`` (GQA: kv head j serves query heads
    ``j*rep .. j*rep+rep-1``), ``allowed[N, T]``, optional ``sinks[Hq]`` -> ``[N, Hq * Dv]``."""
    N, Hq, D = q.shape
    T, Hkv, Dv = v.shape
    rep = Hq // Hkv
    qh = q.reshape(N, Hkv, rep, D).transpose(1, 2, 0, 3)  # [Hkv, rep, N, D]
    kh = k.transpose(1, 2, 0)[:, None]  # [Hkv, 1, D, T]
    scores = np.where(allowed[None, None], (qh @ kh) * F32(scale), NEG_INF)  # [Hkv, rep, N, T]
    if sinks is None:
        p = softmax(scores)
    else:
        p = sink_softmax(scores, sinks.astype(F32).reshape(Hkv, rep, 1, 1))
    out = p @ v.transpose(1, 0, 2)[:, None]  # [Hkv, rep, N, Dv]
    return np.ascontiguousarray(out.transpose(2, 0, 1, 3)).reshape(N, Hq * Dv)


class TokenMixer:
    """A decoder layer's token mixer (attention, linear attention): ``mix`` returns its output and what the layer
    hands the next one (``carry``; only MLA sets it, to its DSA key selection), ``reset()`` empties its cache."""

    def mix(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, carry):
        return self(x, positions, cos, sin), carry


class GQAAttention(TokenMixer):
    """Grouped-query attention with the per-family options (``args.attention``, ``config.AttentionArgs``).

    ``qk_norm``: ``None``, ``"full"`` (OLMoE: RMSNorm over the whole q / k projection before the head split) or
    ``"head"`` (Qwen3 / GLM: per-head RMSNorm of weight ``[head_dim]``). Biases are used when present; with
    ``sinks`` the per-head logits ``self_attn.sinks [heads]`` join the softmax (gpt-oss). ``output_gate``
    (Qwen3-Next, Qwen3.5): ``q_proj`` gives ``[query | gate]`` per head (twice as wide) and the attention output
    is multiplied by ``sigmoid(gate)`` before ``o_proj``. Shapes: ``formats/families.gqa_shapes``."""

    def __init__(self, args: ModelArgs, ckpt: Checkpoint, layer: int, rope: Rope):
        p, opts = module_path(layer, "self_attn"), args.attention
        H, D = args.hidden_size, args.head_dim
        self.nq, self.nkv, self.D = args.num_attention_heads, args.num_key_value_heads, D
        self.gated = opts.output_gate
        shapes = gqa_shapes(H, self.nq, self.nkv, D, self.gated)
        self.q, self.k, self.v, self.o = (
            Linear.load(ckpt, f"{p}.{leaf}", *shapes[leaf], bias=None)
            for leaf in ("q_proj", "k_proj", "v_proj", "o_proj")
        )
        qk_norm = opts.qk_norm
        self.qk_norm, self.eps = qk_norm, args.rms_norm_eps
        if qk_norm == "full":
            # transformers sizes OLMoE's k_norm as (hidden // heads) * kv_heads
            self.q_norm = ckpt.vector(f"{p}.q_norm.weight", self.nq * D)
            self.k_norm = ckpt.vector(f"{p}.k_norm.weight", (H // self.nq) * self.nkv)
        elif qk_norm == "head":
            self.q_norm = norm_weight(ckpt, f"{p}.q_norm.weight", D, args.zero_centred_norms)
            self.k_norm = norm_weight(ckpt, f"{p}.k_norm.weight", D, args.zero_centred_norms)
        self.clip = opts.clip_qkv
        self.sinks = ckpt.vector(f"{p}.sinks", self.nq) if opts.sinks else None
        self.window = opts.sliding_windows[layer]
        self.rope, self.scale = rope, D**-0.5
        self.kc, self.vc = KVBuffer(), KVBuffer()
        self.first = 0  # absolute position of the first cached key (a sliding layer drops older ones)

    @property
    def nbytes(self) -> int:
        n = self.q.nbytes + self.k.nbytes + self.v.nbytes + self.o.nbytes
        return n + (self.sinks.nbytes if self.sinks is not None else 0)

    def reset(self) -> None:
        self.kc.reset()
        self.vc.reset()
        self.first = 0

    def visible(self, positions: np.ndarray, T: int) -> np.ndarray:
        """Boolean ``[N, T]``: the cached keys each query attends (causal, sliding window; Qwen3.8's QSA
        narrows it to its indexer's selection)."""
        return causal_mask(positions, T, self.window, self.first)

    def __call__(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        N = x.shape[0]
        q, k, v = self.q(x), self.k(x), self.v(x)
        gate = None
        if self.gated:  # per head: D query values then D gate values
            qg = q.reshape(N, self.nq, 2 * self.D)
            q, gate = qg[..., : self.D].reshape(N, -1), qg[..., self.D :].reshape(N, -1)
        if self.qk_norm == "full":
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        if self.clip is not None:
            q, k, v = (np.clip(t, -self.clip, self.clip) for t in (q, k, v))
        q = q.reshape(N, self.nq, self.D)
        k = k.reshape(N, self.nkv, self.D)
        if self.qk_norm == "head":
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        q, k = self.rope.apply(q, cos, sin), self.rope.apply(k, cos, sin)
        K = self.kc.append(k)
        V = self.vc.append(v.reshape(N, self.nkv, self.D))
        allowed = self.visible(positions, K.shape[0])
        out = attend(q, K, V, allowed, self.scale, self.sinks)
        if gate is not None:
            out = out * sigmoid(gate)
        if self.window:  # later queries (positions > these) never see keys older than the last window - 1
            self.first += self.kc.keep_last(self.window - 1)
            self.vc.keep_last(self.window - 1)
        return self.o(out)


class DSAIndexer:
    """The DSA lightning indexer of DeepSeek-V3.2 and GLM-5: picks ``index_topk`` keys per query (transformers
    ``DeepseekV32Indexer`` / ``GlmMoeDsaIndexer``).

    ``q = wq_b(q_resid)`` and ``k = LayerNorm(wk(x))`` (eps 1e-6), rope on the first ``qk_rope_head_dim`` dims
    in ``rope``'s layout (half-split for V3.2, interleaved for GLM-5; ``deepseek_v3.INDEXER_ROPE_INTERLEAVED``
    says which); score ``sum_h w_h * relu(q_h . k * D^-0.5)`` with ``w = weights_proj(x) * Hi^-0.5``.

    Ties: a key whose every head score is negative gets an index score of exactly 0, so exact ties at the
    selection boundary are common once fewer than ``index_topk`` keys score above 0. Among tied keys this picks
    the earliest positions; transformers' CPU ``topk`` picks in libstdc++ introselect order (unspecified), so
    tied selections can differ from it. The oracles are seed-checked to have no tie at the boundary."""

    def __init__(self, args: ModelArgs, ckpt: Checkpoint, layer: int, rope: Rope):
        p, ix = module_path(layer, "self_attn.indexer"), args.indexer
        self.nh, self.D, self.topk = ix.n_heads, ix.head_dim, ix.topk
        self.wq_b = Linear.load(ckpt, f"{p}.wq_b", self.nh * self.D, args.mla.q_lora_rank)
        self.wk = Linear.load(ckpt, f"{p}.wk", self.D, args.hidden_size)
        self.k_norm_w = ckpt.vector(f"{p}.k_norm.weight", self.D)
        self.k_norm_b = ckpt.vector(f"{p}.k_norm.bias", self.D)
        self.weights_proj = Linear.load(ckpt, f"{p}.weights_proj", self.nh, args.hidden_size)
        self.rope = rope
        self.kc = KVBuffer()

    @property
    def nbytes(self) -> int:
        return self.wq_b.nbytes + self.wk.nbytes + self.weights_proj.nbytes

    def reset(self) -> None:
        self.kc.reset()

    def __call__(self, x, q_resid, positions, cos, sin) -> np.ndarray:
        """Boolean ``[N, T]`` of selected keys (causality still applies on top)."""
        N = x.shape[0]
        q = self.wq_b(q_resid).reshape(N, self.nh, self.D)
        k = layer_norm(self.wk(x), self.k_norm_w, self.k_norm_b, 1e-6).reshape(N, 1, self.D)
        q, k = self.rope.apply(q, cos, sin), self.rope.apply(k, cos, sin)
        K = self.kc.append(k.reshape(N, self.D))
        T = K.shape[0]
        scores = np.maximum((q @ K.T) * F32(self.D**-0.5), F32(0))  # [N, nh, T]
        w = self.weights_proj(x) * F32(self.nh**-0.5)  # [N, nh]
        index = (w[:, None, :] @ scores)[:, 0, :]  # [N, T]
        index = np.where(causal_mask(positions, T), index, NEG_INF)
        k_sel = min(self.topk, T)
        if k_sel >= T:
            return np.ones((N, T), dtype=bool)
        top = np.argsort(-index, axis=-1, kind="stable")[:, :k_sel]
        selected = np.zeros((N, T), dtype=bool)
        np.put_along_axis(selected, top, True, axis=-1)
        return selected


class MLAAttention(TokenMixer):
    """DeepSeek multi-head latent attention (optionally with GLM-5's DSA indexer); ``args.mla``
    (``config.MLAArgs``), shapes ``formats/families.mla_shapes``.

    The cache holds expanded per-head keys ``[T, H, nope + rope]`` and values ``[T, H, v]``: ``kv_b_proj`` is
    per position, so expanding once per token equals transformers' re-expansion of the cached latents."""

    def __init__(self, args: ModelArgs, ckpt: Checkpoint, layer: int, rope: Rope, indexer: DSAIndexer | None):
        p, mla = module_path(layer, "self_attn"), args.mla
        H, nh = args.hidden_size, args.num_attention_heads
        self.nh, self.nope, self.rd, self.vd = nh, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.q_lora, self.r = mla.q_lora_rank, mla.kv_lora_rank
        shapes = mla_shapes(H, nh, self.r, self.q_lora, self.nope, self.rd, self.vd)
        if self.q_lora:
            self.q_a = Linear.load(ckpt, f"{p}.q_a_proj", *shapes["q_a_proj"], bias=None)
            self.q_a_norm = ckpt.vector(f"{p}.q_a_layernorm.weight", self.q_lora)
            self.q_b = Linear.load(ckpt, f"{p}.q_b_proj", *shapes["q_b_proj"])
        else:
            self.q_proj = Linear.load(ckpt, f"{p}.q_proj", *shapes["q_proj"])
        self.kv_a = Linear.load(ckpt, f"{p}.kv_a_proj_with_mqa", *shapes["kv_a_proj_with_mqa"], bias=None)
        self.kv_a_norm = ckpt.vector(f"{p}.kv_a_layernorm.weight", self.r)
        self.kv_b = Linear.load(ckpt, f"{p}.kv_b_proj", *shapes["kv_b_proj"])
        self.o = Linear.load(ckpt, f"{p}.o_proj", *shapes["o_proj"], bias=None)
        self.rope, self.scale = rope, mla_softmax_scale(mla, args.rope)
        self.latent_eps = mla.latent_norm_eps
        self.indexer = indexer
        self.kc, self.vc = KVBuffer(), KVBuffer()

    @property
    def nbytes(self) -> int:
        mats = [self.kv_a, self.kv_b, self.o] + ([self.q_a, self.q_b] if self.q_lora else [self.q_proj])
        return sum(m.nbytes for m in mats) + (self.indexer.nbytes if self.indexer else 0)

    def reset(self) -> None:
        self.kc.reset()
        self.vc.reset()
        if self.indexer:
            self.indexer.reset()

    def mix(self, x, positions, cos, sin, carry):
        return self(x, positions, cos, sin, carry)

    def __call__(self, x, positions, cos, sin, shared_selection=None):
        """Returns ``(output, selection)``; ``selection`` is the DSA key selection (or None)."""
        N = x.shape[0]
        q_resid = None
        if self.q_lora:
            q_resid = rms_norm(self.q_a(x), self.q_a_norm, self.latent_eps)  # DeepSeek's q_a_layernorm: 1e-6
            q = self.q_b(q_resid)
        else:
            q = self.q_proj(x)
        q = q.reshape(N, self.nh, self.nope + self.rd)
        ckv = self.kv_a(x)
        latent = rms_norm(ckv[:, : self.r], self.kv_a_norm, self.latent_eps)  # kv_a_layernorm: eps 1e-6
        k_rot = self.rope.apply(ckv[:, None, self.r :], cos, sin)  # [N, 1, rope], shared by all heads
        q = np.concatenate([q[..., : self.nope], self.rope.apply(q[..., self.nope :], cos, sin)], axis=-1)
        kv = self.kv_b(latent).reshape(N, self.nh, self.nope + self.vd)
        k = np.concatenate([kv[..., : self.nope], np.broadcast_to(k_rot, (N, self.nh, self.rd))], axis=-1)
        K = self.kc.append(k)
        V = self.vc.append(kv[..., self.nope :])
        allowed = causal_mask(positions, K.shape[0])
        selection = shared_selection
        if self.indexer is not None:
            selection = self.indexer(x, q_resid, positions, cos, sin)
        if selection is not None:
            allowed = allowed & selection
        return self.o(attend(q, K, V, allowed, self.scale)), selection
