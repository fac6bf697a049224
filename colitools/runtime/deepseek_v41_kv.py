"""DeepSeek-V4.1 Flash's KV shared across layers (colibri ``c/deepseek_v41.c`` ``compressor_run`` /
``indexer_run`` / ``candidate_blocks``, the vendor's ``shared_attn``): what a KV source layer compresses and a
index source selects, published for the later layers and kept across forwards (``Published``); the compressor,
the indexer with its two-level top-k. ``deepseek_v41.py`` is the family that uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.families import v4_shapes, v41_shapes
from colitools.runtime.attention import KVBuffer
from colitools.runtime.deepseek_v4 import TailRope
from colitools.runtime.engram import EngramHash
from colitools.runtime.ops import Linear, rms_norm
from colitools.runtime.weights import Checkpoint, sanitize

if TYPE_CHECKING:
    from colitools.runtime.deepseek_v41 import V41Args

F32 = np.float32
NEG_INF = F32(-np.inf)


class SourceCache:
    """A KV source layer's compressed entries (roped) and, when it indexes too, its index keys (roped)."""

    def __init__(self) -> None:
        self.entries, self.keys = KVBuffer(), KVBuffer()

    def reset(self) -> None:
        self.entries.reset()
        self.keys.reset()


class Published:
    """What the layers publish for the later ones, kept across forwards (the vendor's module-level
    ``shared_attn``): the last KV source's entries, the last index keys published, the last index source's
    selection ``[N, T]``, the candidate blocks ``[N, T]``; the engram history (compressed ids by position)."""

    def __init__(self) -> None:
        self.caches: dict[int, SourceCache] = {}
        self.hash: EngramHash | None = None
        self.own_keys = (
            False  # True: each indexer reads its own KV source's keys (a mutation switch for tests)
        )
        self.reset()

    def reset(self) -> None:
        for cache in self.caches.values():
            cache.reset()
        self.entries_of: int | None = None
        self.keys_of: int | None = None
        self.selection: np.ndarray | None = None
        self.candidates: np.ndarray | None = None
        self.history = np.zeros(0, dtype=np.int64)

    def observe(self, ids: np.ndarray, positions: np.ndarray) -> None:
        """The chunk's compressed ids into the history (idempotent: every engram layer calls it)."""
        if self.hash is not None and self.history.size != positions[-1] + 1:
            self.history = np.concatenate([self.history[: positions[0]], self.hash.compress(ids)])


# ------------------------------------------------------------------------------------------------ shapes
def role_shapes(args: V41Args) -> dict[tuple[str, str], tuple[int, int]]:
    """``formats/families.v4_shapes`` and ``v41_shapes`` of these arguments."""
    ix, e = args.indexer, args.engram
    out = v4_shapes(args.hidden_size, args.num_attention_heads, args.head_dim, args.q_lora_rank, args.o_groups,
                    args.o_lora_rank, ix.n_heads, ix.head_dim)  # fmt: skip
    return {
        **out,
        **v41_shapes(args.hidden_size, args.head_dim, ix.head_dim, args.hc_mult, e.cols, e.head_dim),
    }


def resident(ckpt: Checkpoint, prefix: str, dims: tuple[int, int]) -> Linear:
    """The resident ``{prefix}.weight`` (a released name, looked up by its canonical spelling)."""
    return Linear(ckpt.resident(sanitize(f"{prefix}.weight"), *dims))


# ---------------------------------------------------------------------------------------------- compressor
class GroupCompressor:
    """A KV source's compressor: ``wkv`` (and ``wgate`` when ``ratio > 1``) ``[head_dim, H]``, ``norm``: every
    ``ratio`` positions one entry ``RMSNorm(sum_j softmax_j(wgate x_j) wkv x_j)`` (per channel; ratio 1:
    ``RMSNorm(wkv x)``). The group still filling is its cache."""

    def __init__(self, ckpt: Checkpoint, p: str, shapes, ratio: int, eps: float):
        self.ratio, self.eps = ratio, eps
        self.wkv = resident(ckpt, f"{p}.wkv", shapes[("attn.compressor", "wkv")])
        self.wgate = resident(ckpt, f"{p}.wgate", shapes[("attn.compressor", "wgate")]) if ratio > 1 else None
        D = shapes[("attn.compressor", "wkv")][0]
        self.norm = ckpt.vector(sanitize(f"{p}.norm.weight"), D)
        self.gated = True  # False: the plain mean of the group (a mutation switch for tests)
        self.reset()

    @property
    def nbytes(self) -> int:
        return self.wkv.nbytes + (self.wgate.nbytes if self.wgate is not None else 0) + self.norm.nbytes

    def reset(self) -> None:
        D = self.norm.shape[0]
        self.kv, self.gate = np.zeros((self.ratio, D), F32), np.full((self.ratio, D), NEG_INF, F32)

    def __call__(self, x: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(groups ``[n]``, pre-RoPE entries ``[n, D]``) that the chunk completes."""
        kv = self.wkv(x)
        if self.ratio == 1:
            return positions.copy(), rms_norm(kv, self.norm, self.eps)
        gate, groups, pooled = self.wgate(x), [], []
        for i, pos in enumerate(positions):
            slot = int(pos) % self.ratio
            self.kv[slot], self.gate[slot] = kv[i], gate[i]
            if (pos + 1) % self.ratio:
                continue
            g = self.gate if self.gated else np.zeros_like(self.gate)
            e = np.exp(g - np.max(g, axis=0, keepdims=True))
            pooled.append(
                np.sum(self.kv * (e / np.sum(e, axis=0, keepdims=True, dtype=F32)), axis=0, dtype=F32)
            )
            groups.append(int(pos) // self.ratio)
        if not groups:
            return np.zeros(0, np.int64), np.zeros((0, self.norm.shape[0]), F32)
        return np.asarray(groups, np.int64), rms_norm(np.stack(pooled), self.norm, self.eps)


# ------------------------------------------------------------------------------------------------ indexer
def candidate_blocks(scores: np.ndarray, lens: np.ndarray, want: int, size: int) -> np.ndarray:
    """Boolean ``[N, T]``: per row the block holding entry ``lens - 1`` and the ``want - 1`` other blocks of
    ``size`` entries with the highest best score (blocks with no finite score never; colibri
    ``candidate_blocks``, the vendor's ``select_candidate_blocks``)."""
    N, T = scores.shape
    nb = -(-T // size)
    padded = np.full((N, nb * size), NEG_INF, F32)
    padded[:, :T] = scores
    best = padded.reshape(N, nb, size).max(axis=-1)
    last = (lens - 1) // size
    rows = np.nonzero((last >= 0) & (last < nb))[0]
    best[rows, last[rows]] = np.inf
    order = np.argsort(-best, axis=-1, kind="stable")[:, : min(want, nb)]
    keep = np.zeros((N, nb), dtype=bool)
    np.put_along_axis(keep, order, np.take_along_axis(best, order, axis=-1) > NEG_INF, axis=-1)
    return np.repeat(keep, size, axis=1)[:, :T]


class V41Indexer:
    """An index source: ``indexer.wq_b [heads d, q_lora]``, ``weights_proj [heads, H]``; on a KV source also the
    key path ``wk [d, head_dim]`` + ``k_norm``. Scores ``sum_h relu(q_h . k_j) w_h``, ``w = weights_proj(x) /
    sqrt(d heads)``, the queries roped at their positions (trailing ``rope_head_dim``)."""

    def __init__(self, args: V41Args, ckpt: Checkpoint, p: str, layer: int, rope: TailRope, pub: Published):
        shapes, ix = role_shapes(args), args.indexer
        self.nh, self.d, self.topk, self.rope, self.pub, self.layer = (
            ix.n_heads,
            ix.head_dim,
            ix.topk,
            rope,
            pub,
            layer,
        )
        self.eps, self.args = args.rms_norm_eps, args
        self.wq_b = resident(ckpt, f"{p}.wq_b", shapes[("attn.indexer", "wq_b")])
        self.weights_proj = resident(ckpt, f"{p}.weights_proj", shapes[("attn.indexer", "weights_proj")])
        self.wk = self.k_norm = None
        if layer in args.kv_sources:
            self.wk = resident(ckpt, f"{p}.wk", shapes[("attn.indexer", "wk")])
            self.k_norm = ckpt.vector(sanitize(f"{p}.k_norm.weight"), self.d)
        self.two_level = True  # False: the candidate blocks ignored (a mutation switch for tests)

    @property
    def nbytes(self) -> int:
        parts = (self.wq_b, self.weights_proj, self.wk)
        return sum(m.nbytes for m in parts if m is not None) + (
            self.k_norm.nbytes if self.k_norm is not None else 0
        )

    def keys(self, entries: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Roped index keys ``[n, d]`` of pre-RoPE entries first-positioned at ``starts``."""
        k = rms_norm(self.wk(entries), self.k_norm, self.eps).reshape(-1, 1, self.d)
        return self.rope.apply(k, *self.rope.cos_sin(starts))[:, 0]

    def published_keys(self, T: int) -> np.ndarray:
        """``[T, d]`` of the keys published last (rows never written read as zeros, as in the release)."""
        args, owner = self.args, self.pub.keys_of
        if self.pub.own_keys:
            owner = max(s for s in args.kv_sources if s <= self.layer)
        if owner is None:
            raise RuntimeModelError(f"layer {self.layer}: no index keys published yet")
        buf = self.pub.caches[owner].keys
        out = np.zeros((T, self.d), F32)
        m = min(T, buf.length)
        if m:
            out[:m] = buf.data[:m]
        return out

    def select(
        self, x: np.ndarray, q_resid: np.ndarray, positions: np.ndarray, ratio: int, T: int
    ) -> np.ndarray:
        """Boolean ``[N, T]`` of the entries kept for each query."""
        N = x.shape[0]
        q = self.rope.apply(self.wq_b(q_resid).reshape(N, self.nh, self.d), *self.rope.cos_sin(positions))
        w = self.weights_proj(x) * F32(self.d**-0.5 * self.nh**-0.5)
        scores = np.sum(np.maximum(q @ self.published_keys(T).T, F32(0)) * w[:, :, None], axis=1, dtype=F32)
        lens = (positions + 1) // ratio
        scores = np.where(np.arange(T)[None, :] < lens[:, None], scores, NEG_INF)
        a, pub = self.args, self.pub
        if self.layer == a.candidate_source:
            pub.candidates = candidate_blocks(scores, lens, a.candidate_blocks, a.candidate_block_size)
        elif 0 <= a.candidate_source < self.layer and pub.candidates is not None and self.two_level:
            keep = np.ones((N, T), dtype=bool)
            w_c = min(T, pub.candidates.shape[1])
            keep[:, :w_c] = pub.candidates[:, :w_c]
            scores = np.where(keep, scores, NEG_INF)
        k = min(self.topk, T)
        top = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
        selected = np.zeros((N, T), dtype=bool)
        np.put_along_axis(selected, top, True, axis=-1)
        return selected & np.isfinite(scores)  # a masked entry is never taken (c/deepseek_v41.c indexer_run)
