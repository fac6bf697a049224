"""Qwen3.8 (``qwen4_exp``, text type ``qwen4_exp_text``; transformers 5.24 ``modeling_qwen4_exp.py``, colibri
``c/qwen38.c``).

The residual is ``hc = hc_count`` streams ``X [N, hc*H]`` (stream ``s`` at columns ``s*H ..``; the embedding enters
as ``hc`` copies). Every block reads them through a gated residual (``Qwen4ExpTextGatedResidual``)::

    Xn  = RMSNorm_per_stream(X) * (1 + w)                     # hc_norm, groups of H
    mix = sigmoid(silu(Xn @ down^T / hc) @ up^T)              # input_mix_weight_down [r, hc*H] / up [hc*H, r]
    h   = mean_s(mix_s * Xn_s)                                 # the block input [N, H]
    inj = 2 sigmoid(Xn @ inject^T / hc)                        # block_inject_weight [hc, hc*H]
    X  += inj_s * block(h)   for every stream s

No per-layer norms and no final norm: ``hyper_connection_mixer`` (the same residual without injection) gives the
head's input. Layers (``layer_types``; ``full_attention`` and ``qwen_sparse_attention`` are read as
``indexed_attention``: the family's ``layer_type_aliases``, formats/families.py):

* ``linear_attention``: the Gated DeltaNet of Qwen3.5 (``linear_attention.py``) whose gated norm multiplies by
  ``output_gate_type`` (``sigmoid`` here, ``silu`` by default) of ``z``;
* ``indexed_attention``: Qwen3.5's gated GQA (per-head q/k norm, partial RoPE) restricted to the QSA selection
  (``QSAIndexer``);
* on the ``ple_layer_ids`` (1-based) a PLE injection before the layer (``PLE``): hashed n-gram embeddings gate a
  value into every stream, plus a dilated depthwise convolution.

MoE: softmax top-k renormalised plus a sigmoid-gated shared expert, every layer. The text model is read under
``model.language_model.`` (as ``model.``); the vision tower is not run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.families import gated_residual_shapes, ngram_head_vocab_sizes
from colitools.formats.names import layer_path, module_path
from colitools.runtime.attention import GQAAttention, causal_mask
from colitools.runtime.config import (
    ConfigKeys,
    GQAArgs,
    LinearAttentionArgs,
    attention_args,
    rope_args,
    routing_args,
)
from colitools.runtime.family import LayerContext, ModelIO, RuntimeFamily
from colitools.runtime.linear_attention import GatedDeltaNet
from colitools.runtime.ops import Embedding, Linear, norm_weight, rms_norm, sigmoid, silu
from colitools.runtime.rope import Rope
from colitools.runtime.weights import Checkpoint

F32 = np.float32
LAYER_TYPES = ("linear_attention", "indexed_attention")
_TEXT = {  # transformers 5.24 Qwen4ExpTextConfig
    "rms_norm_eps": 1e-6, "num_key_value_heads": 2, "head_dim": 256, "partial_rotary_factor": 1.0,
    "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "shared_expert_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10, "hc_count": 4,
    "hc_lowrank": 320, "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 8,
    "ngram_vocab_size_base": 20_000_000, "make_ngram_vocab_size_divisible_by": 128, "seed": 1234,
    "split_ngram_parts": 512, "hidden_act": "silu",
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class QSAArgs:
    n_heads: int
    head_dim: int
    budget: int  # tokens kept from complete blocks (budget / ratio blocks)
    ratio: int  # tokens per pooled key block


@dataclass(frozen=True, kw_only=True)
class PLEArgs:
    layers: list[int]  # 0-based decoder layers with PLE, in ple_layer_ids order
    embed_dim: int
    conv_kernel: int
    ngram_size: int
    heads_per_ngram: int
    vocab_base: int
    vocab_divisor: int
    parts: int
    seed: int
    eos: int


@dataclass(kw_only=True)
class Qwen38Args(GQAArgs):
    layer_types: list[str]
    linear_attention: LinearAttentionArgs
    output_gate: str  # the Gated DeltaNet norm's gate activation
    hc: int
    hc_rank: int
    qsa: QSAArgs
    ple: PLEArgs | None


def _layer_types(c: ConfigKeys, n: int) -> list[str]:
    types = c.get("layer_types") or ["indexed_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                     for i in range(n)]  # fmt: skip
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise RuntimeModelError(
            f"{c.where}: layer_types must list {n} of {', '.join(LAYER_TYPES)}, got {types}"
        )
    return types


def _ple_args(c: ConfigKeys, n: int, hidden: int, types: list[str]) -> PLEArgs | None:
    ids = c.get("ple_layer_ids") or []
    if not ids:
        return None
    if any(not isinstance(i, int) or not 1 <= i <= n or types[i - 1] != "linear_attention" for i in ids):
        raise RuntimeModelError(
            f"{c.where}: ple_layer_ids {ids} must be 1-based linear_attention layers of 1..{n}"
        )
    eos = c.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if not isinstance(eos, int):
        raise RuntimeModelError(f"{c.where}: eos_token_id must be set when ple_layer_ids are")
    return PLEArgs(layers=[i - 1 for i in sorted(set(ids))], embed_dim=int(c.get("ple_embed_dim") or hidden),
                   conv_kernel=int(c["ple_conv_kernel_size"]), ngram_size=int(c["ngram_size"]),
                   heads_per_ngram=int(c["heads_per_ngram"]), vocab_base=int(c["ngram_vocab_size_base"]),
                   vocab_divisor=int(c["make_ngram_vocab_size_divisible_by"]), parts=int(c["split_ngram_parts"]),
                   seed=int(c["seed"]), eos=eos)  # fmt: skip


# ------------------------------------------------------------------------------------------ gated residual
class GatedResidual:
    """One ``*_hyper_connection`` (or the final ``hyper_connection_mixer``, ``inject=False``)."""

    def __init__(
        self, ckpt: Checkpoint, prefix: str, hidden: int, hc: int, rank: int, eps: float, inject: bool
    ):
        shapes = gated_residual_shapes(hidden, hc, rank)
        self.H, self.hc, self.eps = hidden, hc, eps
        self.norm = norm_weight(ckpt, f"{prefix}.hc_norm.weight", hc * hidden, True).reshape(hc, hidden)
        self.down, self.up = (Linear.load(ckpt, f"{prefix}.{k}", *shapes[k])
                              for k in ("input_mix_weight_down", "input_mix_weight_up"))  # fmt: skip
        self.inject = Linear.load(ckpt, f"{prefix}.block_inject_weight", *shapes["block_inject_weight"]) \
            if inject else None  # fmt: skip

    @property
    def nbytes(self) -> int:
        return (
            self.norm.nbytes + self.down.nbytes + self.up.nbytes + (self.inject.nbytes if self.inject else 0)
        )

    def __call__(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(block input [N, H], injection weights [N, hc] or None)``."""
        N = X.shape[0]
        Xn = rms_norm(X.reshape(N, self.hc, self.H), self.norm, self.eps).reshape(N, -1)
        mix = sigmoid(self.up(silu(self.down(Xn) / F32(self.hc)))).reshape(N, self.hc, self.H)
        h = np.mean(mix * Xn.reshape(N, self.hc, self.H), axis=1, dtype=F32)
        inj = None if self.inject is None else F32(2) * sigmoid(self.inject(Xn) / F32(self.hc))
        return h, inj

    def step(self, X: np.ndarray, block) -> np.ndarray:
        h, inj = self(X)
        out = block(h)
        return X + (inj[:, :, None] * out[:, None, :]).reshape(X.shape)


# ------------------------------------------------------------------------------------------------ QSA
class QSAIndexer:
    """Which keys each query attends (transformers ``Qwen4ExpTextQSAIndexer``): ``index_qk_proj`` gives ``n``
    query heads and one key head of ``d``; the keys of every complete block of ``ratio`` visible tokens are
    averaged, ``k_layernorm``-ed and rotated at the block's first position; a query scores block ``b`` as
    ``sum_h relu(q_h . k_b) / sqrt(d)`` (``q`` ``q_layernorm``-ed and rotated at its position) and keeps the top
    ``budget / ratio`` blocks' tokens plus its incomplete tail. Ties: lower block first (the oracle is
    seed-checked to have none at the boundary)."""

    def __init__(self, args: Qwen38Args, ckpt: Checkpoint, layer: int, rope: Rope):
        p, ix = module_path(layer, "self_attn.indexer"), args.qsa
        self.n, self.d, self.ratio, self.select = ix.n_heads, ix.head_dim, ix.ratio, ix.budget // ix.ratio
        self.qk = Linear.load(ckpt, f"{p}.index_qk_proj", (self.n + 1) * self.d, args.hidden_size)
        self.q_norm = norm_weight(ckpt, f"{p}.q_layernorm.weight", self.d, True)
        self.k_norm = norm_weight(ckpt, f"{p}.k_layernorm.weight", self.d, True)
        self.rope, self.eps = rope, args.rms_norm_eps
        self.keys: list[np.ndarray] = []

    @property
    def nbytes(self) -> int:
        return self.qk.nbytes

    def reset(self) -> None:
        self.keys = []

    def __call__(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Boolean ``[N, T]`` over the cached keys (absolute positions ``0 .. T - 1``)."""
        N, n, d, r = x.shape[0], self.n, self.d, self.ratio
        qk = self.qk(x)
        q = self.rope.apply(rms_norm(qk[:, : n * d].reshape(N, n, d), self.q_norm, self.eps), cos, sin)
        self.keys.append(qk[:, n * d :])
        keys = np.concatenate(self.keys)
        T = keys.shape[0]
        allowed = causal_mask(positions, T)
        blocks = T // r
        if blocks == 0:
            return allowed
        pooled = rms_norm(
            np.mean(keys[: blocks * r].reshape(blocks, r, d), axis=1, dtype=F32), self.k_norm, self.eps
        )
        bcos, bsin = self.rope.cos_sin(np.arange(blocks) * r)
        kb = self.rope.apply(pooled[:, None, :], bcos, bsin)[:, 0]  # [blocks, d]
        scores = np.sum(np.maximum(np.einsum("nhd,bd->nbh", q, kb), F32(0)), axis=-1) / F32(math.sqrt(d))
        keep = np.zeros((N, T), dtype=bool)
        for i, p in enumerate(positions):
            seen = (int(p) + 1) // r  # complete blocks among the visible tokens
            order = np.argsort(-scores[i, :seen], kind="stable")[: self.select]
            for b in order:
                keep[i, b * r : (b + 1) * r] = True
            keep[i, seen * r : int(p) + 1] = True  # the incomplete tail
        return allowed & keep


class QSAAttention(GQAAttention):
    """Qwen3.5's gated GQA over the keys the layer's :class:`QSAIndexer` keeps."""

    def __init__(self, args: Qwen38Args, ckpt: Checkpoint, layer: int, rope: Rope):
        super().__init__(args, ckpt, layer, rope)
        self.indexer = QSAIndexer(args, ckpt, layer, rope)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.indexer.nbytes

    def reset(self) -> None:
        super().reset()
        self.indexer.reset()

    def __call__(self, x, positions, cos, sin):
        self.selection = self.indexer(x, positions, cos, sin)
        return super().__call__(x, positions, cos, sin)

    def visible(self, positions: np.ndarray, T: int) -> np.ndarray:
        return self.selection


# ------------------------------------------------------------------------------------------------ PLE
_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (value ^ (value >> 31)) & _MASK64


def ngram_multipliers(vocab: int, ngram_size: int, ple_index: int, seed: int) -> np.ndarray:
    """The odd hash multipliers of one PLE layer (transformers ``_build_layer_multipliers``)."""
    half = max(1, ((1 << 63) - 1) // max(vocab, 1) // 2)
    base = seed + 10007 * ple_index
    out = [
        2 * (_splitmix64((base + 0x9E3779B97F4A7C15 * (i + 1)) & _MASK64) % half) + 1
        for i in range(ngram_size)
    ]
    return np.array(out, dtype=np.int64)


class PLE:
    """A Per-Layer Embedding injection (transformers ``Qwen4ExpTextPLELayer``) with its token history and conv
    state. Hash: with ``tok_s`` the token ``s`` back (``eos`` past the start or an earlier ``eos``), the
    ``n``-gram id of head ``h`` is ``(xor_{s<n} tok_s * mult_s) mod vocab_h + offset_h`` (int64 wrap-around);
    the table rows (``ngram_embedding.shard_k``, ``rows / parts`` each) of all heads concatenated make ``e``::

        key = RMSNorm_per_stream(key_proj e);  value = value_proj e;  q = RMSNorm_per_stream(X)
        g   = sum_H(key * q) / sqrt(H);  g = sign(g) sqrt(max(|g|, 1e-6))
        v   = sigmoid(g) * value  (per stream);  X += v + silu(dilated_conv(RMSNorm_per_stream(v)))

    the convolution depthwise, kernel ``ple_conv_kernel_size``, dilation ``ngram_size``."""

    def __init__(self, args: Qwen38Args, ckpt: Checkpoint, layer: int):
        a, H, hc = args.ple, args.hidden_size, args.hc
        p = f"{layer_path(layer)}.ple"
        index = a.layers.index(layer)
        self.heads = (a.ngram_size - 1) * a.heads_per_ngram
        sizes = ngram_head_vocab_sizes(a.vocab_base, self.heads, index)
        self.vocab = np.array(sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.mult = ngram_multipliers(args.vocab_size, a.ngram_size, index, a.seed)
        self._check_buffers(ckpt, f"{p}.ple_embedding")
        rows = -(-sum(sizes) // a.vocab_divisor) * a.vocab_divisor
        self.rows_per_part, dph = rows // a.parts, a.embed_dim // self.heads
        self.parts = [Embedding(ckpt, f"{p}.ple_embedding.ngram_embedding.shard_{k}.weight", self.rows_per_part, dph)
                      for k in range(a.parts)]  # fmt: skip
        self.key = Linear.load(ckpt, f"{p}.key_proj", hc * H, a.embed_dim)
        self.value = Linear.load(ckpt, f"{p}.value_proj", H, a.embed_dim)
        self.norms = [norm_weight(ckpt, f"{p}.{k}.weight", hc * H, True).reshape(hc, H)
                      for k in ("norm_key", "norm_query", "norm_conv")]  # fmt: skip
        self.conv_w = ckpt.array(f"{p}.conv1d.weight", (hc * H, 1, a.conv_kernel))[:, 0, :].T.copy()  # [K, C]
        self.dilation, self.order, self.eos = a.ngram_size, a.ngram_size, a.eos
        self.H, self.hc, self.eps = H, hc, args.rms_norm_eps
        self.reset()

    def _check_buffers(self, ckpt: Checkpoint, p: str) -> None:
        """The hash buffers a checkpoint carries (transformers saves them) must be the ones the config implies."""
        for leaf, want in (("layer_multipliers", self.mult), ("ngram_heads_vocab_sizes", self.vocab),
                           ("ngram_heads_offsets", self.offsets)):  # fmt: skip
            if ckpt.has(f"{p}.{leaf}") and not np.array_equal(
                ckpt.int_array(f"{p}.{leaf}", want.shape), want
            ):
                raise RuntimeModelError(
                    f"{ckpt.dir}: {p}.{leaf} differs from the n-gram hash config.json implies (vocab_size, ngram_*, seed)"
                )

    @property
    def nbytes(self) -> int:
        return self.key.nbytes + self.value.nbytes + sum(e.nbytes for e in self.parts) + self.conv_w.nbytes

    def reset(self) -> None:
        self.history = np.full(self.order - 1, self.eos, dtype=np.int64)
        self.conv_past = np.zeros(
            ((self.conv_w.shape[0] - 1) * self.dilation, self.conv_w.shape[1]), dtype=F32
        )

    def ngram_ids(self, ids: np.ndarray) -> np.ndarray:
        """``[N, heads]`` table rows of the new tokens ``ids`` (after the kept history)."""
        ctx = len(self.history)
        tokens = np.concatenate([self.history, ids])
        self.history = tokens[-ctx:]
        t = np.arange(tokens.size)
        last_eos = np.maximum.accumulate(np.where(tokens == self.eos, t, -1))
        start = np.concatenate([[0], last_eos[:-1] + 1])  # the segment after the last eos strictly before t
        blocks = []
        mixed = tokens * self.mult[0]
        per = self.heads // (self.order - 1)
        for n in range(2, self.order + 1):
            s = n - 1
            shifted = np.where((t - start >= s) & (t >= s), tokens[np.maximum(t - s, 0)], self.eos)
            mixed = np.bitwise_xor(mixed, shifted * self.mult[s])
            h = slice((n - 2) * per, (n - 1) * per)
            blocks.append(np.remainder(mixed[:, None], self.vocab[None, h]) + self.offsets[None, h])
        return np.concatenate(blocks, axis=1)[ctx:]

    def _embed(self, rows: np.ndarray) -> np.ndarray:
        flat = rows.reshape(-1)
        part, row = flat // self.rows_per_part, flat % self.rows_per_part
        out = np.empty((flat.size, self.parts[0].H), dtype=F32)
        for k in np.unique(part):
            out[part == k] = self.parts[k](row[part == k])
        return out.reshape(rows.shape[0], -1)

    def _conv(self, x: np.ndarray) -> np.ndarray:
        N, K = x.shape[0], self.conv_w.shape[0]
        full = np.concatenate([self.conv_past, x])
        out = sum(full[j * self.dilation : j * self.dilation + N] * self.conv_w[j] for j in range(K))
        self.conv_past = full[N:]
        return out.astype(F32)

    def __call__(self, X: np.ndarray, ids: np.ndarray) -> np.ndarray:
        N, hc, H = X.shape[0], self.hc, self.H
        e = self._embed(self.ngram_ids(ids))
        nk, nq, nc = self.norms
        key = rms_norm(self.key(e).reshape(N, hc, H), nk, self.eps)
        q = rms_norm(X.reshape(N, hc, H), nq, self.eps)
        g = np.sum(key * q, axis=-1, keepdims=True, dtype=F32) / F32(math.sqrt(H))
        g = np.sqrt(np.maximum(np.abs(g), F32(1e-6))) * np.sign(g)
        v = sigmoid(g) * self.value(e)[:, None, :]  # [N, hc, H]
        conv = silu(self._conv(rms_norm(v, nc, self.eps).reshape(N, -1)))
        return X + v.reshape(N, -1) + conv


# ------------------------------------------------------------------------------------------------ layers
class Qwen38Layer:
    """PLE (when the layer has it), then attention and the MoE block, each through its gated residual."""

    def __init__(self, mixer, ffn, attn_res: GatedResidual, mlp_res: GatedResidual, ple: PLE | None):
        self.mixer, self.ffn, self.attn_res, self.mlp_res, self.ple = mixer, ffn, attn_res, mlp_res, ple

    @property
    def nbytes(self) -> int:
        n = self.mixer.nbytes + self.ffn.nbytes + self.attn_res.nbytes + self.mlp_res.nbytes
        return n + (self.ple.nbytes if self.ple else 0)

    def reset(self) -> None:
        self.mixer.reset()
        if self.ple is not None:
            self.ple.reset()

    def __call__(self, X, positions, cos, sin, ids):
        if self.ple is not None:
            X = self.ple(X, ids)
        X = self.attn_res.step(X, lambda h: self.mixer(h, positions, cos, sin))
        return self.mlp_res.step(X, self.ffn), ids


class Qwen38IO(ModelIO):
    """``embed_tokens`` into ``hc`` stream copies; the final ``hyper_connection_mixer`` into ``lm_head``."""

    def __init__(self, args: Qwen38Args, ckpt: Checkpoint):
        H, V = args.hidden_size, args.vocab_size
        self.hc = args.hc
        self.embed = Embedding(ckpt, "model.embed_tokens.weight", V, H)
        self.mixer = GatedResidual(ckpt, "model.hyper_connection_mixer", H, args.hc, args.hc_rank,
                                   args.rms_norm_eps, inject=False)  # fmt: skip
        self.lm_head = Linear.load(ckpt, self.head_name, V, H)

    @property
    def nbytes(self) -> int:
        return self.embed.nbytes + self.mixer.nbytes + self.lm_head.nbytes

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        return np.tile(self.embed(ids), (1, self.hc))

    def carry(self, ids: np.ndarray, x: np.ndarray) -> Any:
        return ids

    def logits(self, x: np.ndarray, carry: Any, all_logits: bool) -> np.ndarray:
        return self.lm_head(self.mixer(x if all_logits else x[-1:])[0])


class Qwen38(RuntimeFamily):
    defaults = {"qwen4_exp": dict(_TEXT), "qwen4_exp_text": dict(_TEXT)}

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> Qwen38Args:
        n, H = base["num_hidden_layers"], base["hidden_size"]
        types = _layer_types(c, n)
        la = LinearAttentionArgs(conv_kernel=int(c["linear_conv_kernel_dim"]), num_key_heads=int(c["linear_num_key_heads"]),
                                 num_value_heads=int(c["linear_num_value_heads"]), key_head_dim=int(c["linear_key_head_dim"]),
                                 value_head_dim=int(c["linear_value_head_dim"]), fused_projections=False)  # fmt: skip
        gate = c.get("output_gate_type") or c["hidden_act"]
        if gate not in ("sigmoid", "silu"):
            raise RuntimeModelError(f"{c.where}: output_gate_type {gate!r} is not sigmoid or silu")
        qsa = QSAArgs(n_heads=int(c.need("indexer_n_heads")), head_dim=int(c.need("indexer_head_dim")),
                      budget=int(c.need("indexer_budget")), ratio=int(c.need("indexer_compress_ratio")))  # fmt: skip
        return Qwen38Args(
            **{**base, "moe_layers": [True] * n, "zero_centred_norms": True},
            layer_types=types, linear_attention=la, output_gate=gate, hc=int(c["hc_count"]),
            hc_rank=int(c["hc_lowrank"]), qsa=qsa, ple=_ple_args(c, n, H, types),
            attention=attention_args(c, n, qk_norm="head", output_gate=True),
            routing=routing_args(c, norm_topk_prob=True, shared_expert_gated=True,
                                 shared_expert_intermediate_size=int(c["shared_expert_intermediate_size"])),
            rope=rope_args(c, base["head_dim"]),
        )  # fmt: skip

    def layer(self, ctx: LayerContext, layer: int) -> Qwen38Layer:
        args, ckpt = ctx.args, ctx.ckpt
        if args.layer_types[layer] == "linear_attention":
            mixer = GatedDeltaNet(args, ckpt, layer)
            mixer.gate = sigmoid if args.output_gate == "sigmoid" else silu
        else:
            mixer = QSAAttention(args, ckpt, layer, ctx.rope)
        res = (GatedResidual(ckpt, f"{layer_path(layer)}.{k}_hyper_connection", args.hidden_size, args.hc,
                             args.hc_rank, args.rms_norm_eps, inject=True) for k in ("attn", "mlp"))  # fmt: skip
        ple = PLE(args, ckpt, layer) if args.ple and layer in args.ple.layers else None
        return Qwen38Layer(mixer, ctx.sparse_moe(layer), *res, ple)

    def io(self, args: Qwen38Args, ckpt: Checkpoint) -> Qwen38IO:
        return Qwen38IO(args, ckpt)


FAMILY = Qwen38()
