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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.families import v4_shapes, v41_shapes
from colitools.formats.kernels import threads
from colitools.formats.targets import V41_ENGRAM_FILE
from colitools.runtime.attention import KVBuffer, attend, causal_mask
from colitools.runtime.config import ConfigKeys, IndexerArgs, ModelArgs, RopeArgs, routing_args
from colitools.runtime.deepseek_v4 import ClampedExpert, TailRope, clamped_swiglu, softplus
from colitools.runtime.experts import ExpertStore
from colitools.runtime.family import Family, LayerContext, ModelIO
from colitools.runtime.hyper import HyperConnection
from colitools.runtime.ops import Embedding, Linear, rms_norm, sigmoid
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


@dataclass(frozen=True)
class EngramArgs:
    layers: tuple[int, ...]  # engram_layer_ids: table t belongs to layers[t]
    max_ngram: int
    heads: int
    head_dim: int

    @property
    def cols(self) -> int:
        """Rows looked up per position and table: one per n-gram order above 1 and head."""
        return (self.max_ngram - 1) * self.heads


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


# ------------------------------------------------------------------------------------------------- engram
class EngramHash:
    """The n-gram hash of colibri's sidecar ``dsv41_engram.json`` (``c/deepseek_v41.c`` ``engram_hash``): position
    ``p``'s compressed ids ``c_s = token_map[id(p - s)]``, ``s < max_ngram`` (the sidecar's ``pad_id`` from the first
    position before 0 on); ``r = c_0 m_0``, then for each order ``i >= 1`` ``r ^= c_i m_i`` and one row per head
    ``r mod primes[t][i-1][h] + offsets[t][col]``. The multipliers are decimal strings (past a double's 53 bits)."""

    def __init__(self, side: dict, e: EngramArgs, vocab: int, where: str):
        try:
            self.token_map = np.asarray(side["token_map"], dtype=np.int64)
            self.pad = int(side["pad_id"])
            self.primes = np.asarray(side["primes"], dtype=np.int64).reshape(
                len(e.layers), e.max_ngram - 1, e.heads
            )
            self.offsets = np.asarray(side["offsets"], dtype=np.int64).reshape(len(e.layers), e.cols)
            if any(not isinstance(v, str) for row in side["multipliers"] for v in row):
                raise ValueError("multipliers must be decimal strings (a JSON number may have been rounded)")
            self.mult = np.array([[int(v, 10) for v in row] for row in side["multipliers"]], dtype=np.int64)
            geometry = [side["layer_ids"], side["max_ngram_size"], side["n_heads"], side["head_dim"]]
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise RuntimeModelError(f"{where}: not an engram sidecar ({type(exc).__name__}: {exc})") from None
        if geometry != [list(e.layers), e.max_ngram, e.heads, e.head_dim]:
            raise RuntimeModelError(f"{where}: layer_ids / max_ngram_size / n_heads / head_dim {geometry} do not "
                                    f"match config.json's {[list(e.layers), e.max_ngram, e.heads, e.head_dim]}")  # fmt: skip
        if self.mult.shape != (len(e.layers), e.max_ngram) or self.token_map.shape != (vocab,):
            raise RuntimeModelError(f"{where}: multipliers {list(self.mult.shape)} / token_map of {self.token_map.size}"
                                    f" (expected [{len(e.layers)}, {e.max_ngram}] / {vocab} ids)")  # fmt: skip
        top = max(int(self.token_map.max(initial=0)), self.pad)
        if (
            self.token_map.min(initial=0) < 0
            or (self.primes <= 0).any()
            or int(self.mult.max()) > (2**63 - 1) // max(top, 1)
        ):
            raise RuntimeModelError(
                f"{where}: negative ids, non-positive primes or multipliers that overflow int64"
            )
        self.n, self.heads = e.max_ngram, e.heads

    def compress(self, ids: np.ndarray) -> np.ndarray:
        return self.token_map[ids]

    def rows(self, history: np.ndarray, positions: np.ndarray, table: int) -> np.ndarray:
        """``[N, cols]`` row ids of table ``table`` at ``positions`` (``history``: compressed ids by position)."""
        at = positions[:, None] - np.arange(self.n)[None, :]  # [N, n]: the position s back
        tokens = np.where(at >= 0, history[np.maximum(at, 0)], self.pad)
        terms = tokens * self.mult[table][None, :]
        rolling, out = terms[:, 0], []
        for i in range(1, self.n):
            rolling = rolling ^ terms[:, i]
            out.append(rolling[:, None] % self.primes[table, i - 1][None, :])
        return np.concatenate(out, axis=1) + self.offsets[table][None, :]


def load_engram_hash(ckpt: Checkpoint, args: V41Args) -> EngramHash:
    path = ckpt.dir / V41_ENGRAM_FILE
    if not path.is_file():
        raise RuntimeModelError(f"{ckpt.dir}: engram layers {list(args.engram.layers)} need {V41_ENGRAM_FILE} beside "
                                "config.json (colibri's c/tools/prepare_dsv41.py writes it)")  # fmt: skip
    try:
        side = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RuntimeModelError(f"{path}: unreadable ({exc})") from None
    if not isinstance(side, dict):
        raise RuntimeModelError(f"{path}: not a JSON object")
    return EngramHash(side, args.engram, args.vocab_size, str(path))


class Engram:
    """One engram layer: table ``engram.embed [rows, head_dim]``, ``engram.wkv [H (hc + 1), cols head_dim]``,
    ``q_weight`` / ``k_weight [hc, H]``."""

    def __init__(self, args: V41Args, ckpt: Checkpoint, layer: int, pub: Published):
        p, e, H, n = f"layers.{layer}.engram", args.engram, args.hidden_size, args.hc_mult
        self.table_index, self.pub, self.H, self.hc, self.eps = (
            e.layers.index(layer),
            pub,
            H,
            n,
            args.rms_norm_eps,
        )
        name = sanitize(f"{p}.embed.weight")
        if name not in ckpt.infos:
            raise RuntimeModelError(f"{ckpt.dir}: missing tensor {name}")
        res = ckpt.infos[name][2]
        self.table = Embedding(ckpt, name, (res.logical_shape or res.shape)[0], e.head_dim)
        self.wkv = Linear(ckpt.resident(sanitize(f"{p}.wkv.weight"), *_shapes(args)[("engram", "wkv")]))
        self.weight = ckpt.array(sanitize(f"{p}.q_weight"), (n, H)) * ckpt.array(
            sanitize(f"{p}.k_weight"), (n, H)
        )
        self.enabled = True  # False: the layer skips its engram (a mutation switch for tests)

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.wkv.nbytes + self.weight.nbytes

    def __call__(self, streams: np.ndarray, positions: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return streams
        ids = self.pub.hash.rows(self.pub.history, positions, self.table_index)
        if (ids < 0).any() or (ids >= self.table.V).any():
            raise RuntimeModelError(
                f"engram table {self.table_index}: a hash row past its {self.table.V} rows"
            )
        N = streams.shape[0]
        kv = self.wkv(self.table(ids.reshape(-1)).reshape(N, -1))
        key, value = kv[:, : self.hc * self.H].reshape(N, self.hc, self.H), kv[:, self.hc * self.H :]
        ms = np.mean(np.square(streams), axis=-1, dtype=F32) + F32(self.eps)
        mk = np.mean(np.square(key), axis=-1, dtype=F32) + F32(self.eps)
        dot = np.sum(streams * self.weight * key, axis=-1, dtype=F32) / np.sqrt(ms * mk) * F32(self.H**-0.5)
        root = np.sqrt(np.maximum(np.abs(dot), F32(1e-6)))
        gate = sigmoid(np.where(dot < 0, -root, root))  # the signed square root
        return (streams + gate[..., None] * value[:, None, :]).astype(F32)


# ---------------------------------------------------------------------------------------------- published
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
def _shapes(args: V41Args) -> dict[tuple[str, str], tuple[int, int]]:
    """``formats/families.v4_shapes`` and ``v41_shapes`` of these arguments."""
    ix, e = args.indexer, args.engram
    out = v4_shapes(args.hidden_size, args.num_attention_heads, args.head_dim, args.q_lora_rank, args.o_groups,
                    args.o_lora_rank, ix.n_heads, ix.head_dim)  # fmt: skip
    return {
        **out,
        **v41_shapes(args.hidden_size, args.head_dim, ix.head_dim, args.hc_mult, e.cols, e.head_dim),
    }


def _linear(ckpt: Checkpoint, prefix: str, dims: tuple[int, int]) -> Linear:
    """The resident ``{prefix}.weight`` (a released name, looked up by its canonical spelling)."""
    return Linear(ckpt.resident(sanitize(f"{prefix}.weight"), *dims))


# ---------------------------------------------------------------------------------------------- compressor
class GroupCompressor:
    """A KV source's compressor: ``wkv`` (and ``wgate`` when ``ratio > 1``) ``[head_dim, H]``, ``norm``: every
    ``ratio`` positions one entry ``RMSNorm(sum_j softmax_j(wgate x_j) wkv x_j)`` (per channel; ratio 1:
    ``RMSNorm(wkv x)``). The group still filling is its cache."""

    def __init__(self, ckpt: Checkpoint, p: str, shapes, ratio: int, eps: float):
        self.ratio, self.eps = ratio, eps
        self.wkv = _linear(ckpt, f"{p}.wkv", shapes[("attn.compressor", "wkv")])
        self.wgate = _linear(ckpt, f"{p}.wgate", shapes[("attn.compressor", "wgate")]) if ratio > 1 else None
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
        shapes, ix = _shapes(args), args.indexer
        self.nh, self.d, self.topk, self.rope, self.pub, self.layer = (
            ix.n_heads,
            ix.head_dim,
            ix.topk,
            rope,
            pub,
            layer,
        )
        self.eps, self.args = args.rms_norm_eps, args
        self.wq_b = _linear(ckpt, f"{p}.wq_b", shapes[("attn.indexer", "wq_b")])
        self.weights_proj = _linear(ckpt, f"{p}.weights_proj", shapes[("attn.indexer", "weights_proj")])
        self.wk = self.k_norm = None
        if layer in args.kv_sources:
            self.wk = _linear(ckpt, f"{p}.wk", shapes[("attn.indexer", "wk")])
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


# ---------------------------------------------------------------------------------------------- attention
class V41Attention:
    """V4's attention on one K = V head with the layer's window and, on a compressing layer, the published entries
    its (or the last) indexer selected."""

    def __init__(self, args: V41Args, ckpt: Checkpoint, layer: int, pub: Published):
        p, shapes = f"layers.{layer}.attn", _shapes(args)
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
            _linear(ckpt, f"{p}.{leaf}", shapes[("attn", leaf)]) for leaf in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")
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
        self.router = _linear(ckpt, f"{p}.gate", (E, H))
        self.bias = ckpt.vector(sanitize(f"{p}.gate.bias"), E)
        sources = [tuple(ckpt.stored(sanitize(f"{p}.experts.{e}.{w}.weight"), O, In)
                         for w, O, In in (("w1", I, H), ("w3", I, H), ("w2", H, I))) for e in range(E)]  # fmt: skip
        limit = args.swiglu_limit
        self.store = ExpertStore(ckpt, layer, sources, E, None, lambda g, u, d: ClampedExpert(g, u, d, limit))
        ctx.stores[layer] = self.store
        S = args.routing.shared_expert_intermediate_size
        self.shared = tuple(_linear(ckpt, f"{p}.shared_experts.{w}", dims)
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


class DeepseekV41(Family):
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
        width = (2 + n) * n

        def hc(site: str) -> HyperConnection:
            return HyperConnection(
                ckpt.array(sanitize(f"{p}.hc_{site}_fn"), (width, n * H)),
                ckpt.vector(sanitize(f"{p}.hc_{site}_base"), width),
                ckpt.vector(sanitize(f"{p}.hc_{site}_scale"), 3),
                n, args.hc_iters, args.hc_eps, args.rms_norm_eps,
            )  # fmt: skip

        engram = None
        if layer in args.engram.layers:
            if pub.hash is None:
                pub.hash = load_engram_hash(ckpt, args)
            engram = Engram(args, ckpt, layer, pub)
        norms = (
            ckpt.vector(sanitize(f"{p}.attn_norm.weight"), H),
            ckpt.vector(sanitize(f"{p}.ffn_norm.weight"), H),
        )
        return V41Layer(engram, V41Attention(args, ckpt, layer, pub), V41MoE(args, ckpt, layer, ctx), hc("attn"),
                        hc("ffn"), norms, args.rms_norm_eps, pub)  # fmt: skip

    def io(self, args: V41Args, ckpt: Checkpoint) -> V41IO:
        return V41IO(args, ckpt)


FAMILY = DeepseekV41()
