"""Routers (softmax top-k, DeepSeek's group-limited ``noaux_tc`` sigmoid, gpt-oss's softmax over the top-k
logits), the one routing record every MoE block reports its choice to (usage counts, ``ROUTE_TRACE``), and the
sparse MoE block.

The block sums expert outputs per token in ascending expert order, as transformers' expert loop does
(``index_add_`` over the experts that were hit, lowest index first), then adds the shared expert.
"""

from __future__ import annotations

import numpy as np

from colitools.formats.kernels import threads
from colitools.formats.names import module_path
from colitools.formats.route_trace import RouteTraceWriter
from colitools.runtime.config import ModelArgs
from colitools.runtime.experts import ExpertStore
from colitools.runtime.ops import MLP, Linear, sigmoid, softmax
from colitools.runtime.weights import Checkpoint

F32 = np.float32


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values per row, largest first (ties: lower index first)."""
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def softmax_topk(logits: np.ndarray, k: int, renormalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """``softmax(logits)`` -> top-k -> optionally divide by the sum of the kept probabilities."""
    probs = softmax(logits.astype(F32))
    idx = _topk(probs, k)
    w = np.take_along_axis(probs, idx, axis=-1)
    if renormalize:
        w = w / np.sum(w, axis=-1, keepdims=True, dtype=F32)
    return idx, w.astype(F32)


def topk_softmax(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """gpt-oss: top-k of the logits, weights = softmax over those k logits."""
    idx = _topk(logits, k)
    return idx, softmax(np.take_along_axis(logits.astype(F32), idx, axis=-1)).astype(F32)


def noaux_tc(
    logits: np.ndarray,
    bias: np.ndarray,
    k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    scaling: float,
) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-V3 routing: sigmoid scores, bias-corrected choice within the best ``topk_group`` of ``n_group``
    groups (group score = sum of its top-2 corrected scores), weights = the unbiased scores at the chosen experts,
    renormalised (``/ (sum + 1e-20)``) if asked, always times ``routed_scaling_factor``."""
    n, E = logits.shape
    scores = sigmoid(logits.astype(F32))
    choice = scores + bias
    grouped = choice.reshape(n, n_group, E // n_group)
    top2 = -np.sort(-grouped, axis=-1)[..., :2]
    group_scores = top2[..., 0] + top2[..., 1]
    keep = _topk(group_scores, topk_group)
    mask = np.zeros((n, n_group), dtype=bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    masked = np.where(np.repeat(mask, E // n_group, axis=-1), choice, F32(-np.inf))
    idx = _topk(masked, k)
    w = np.take_along_axis(scores, idx, axis=-1)
    if renormalize:
        w = w / (np.sum(w, axis=-1, keepdims=True, dtype=F32) + F32(1e-20))
    return idx, (w * F32(scaling)).astype(F32)


class RouteRecord:
    """What the runtime records of routing: per-expert selection counts ``[layers, experts]`` (``.coli_usage``)
    and the ``ROUTE_TRACE`` stream, either optional. Every MoE block calls ``layer(L).record(ids, gates)`` once
    per call with the selected ids ``[rows, k]`` and the gates it applies (colibri's ``rt_route``)."""

    def __init__(self, counts: np.ndarray | None, trace: RouteTraceWriter | None):
        self.counts, self.trace = counts, trace

    def layer(self, layer: int) -> LayerRoutes | None:
        """The record of one layer, None when nothing is recorded."""
        if self.counts is None and self.trace is None:
            return None
        return LayerRoutes(self, layer)


class LayerRoutes:
    """One layer's view of the ``RouteRecord``."""

    def __init__(self, record: RouteRecord, layer: int):
        self.counts = record.counts[layer] if record.counts is not None else None
        self.trace, self.layer = record.trace, layer

    def record(self, ids: np.ndarray, gates: np.ndarray) -> None:
        if self.counts is not None:
            np.add.at(self.counts, ids.ravel(), 1)
        if self.trace is not None:
            self.trace.record(self.layer, ids, gates)


class SparseMoE:
    """Router + routed experts (from an ``ExpertStore``) + optional shared expert (optionally sigmoid-gated), as
    ``args.routing`` (``config.RoutingArgs``) says."""

    def __init__(
        self, args: ModelArgs, ckpt: Checkpoint, layer: int, store: ExpertStore, usage: LayerRoutes | None
    ):
        p = module_path(layer, "mlp")
        H, E = args.hidden_size, args.num_experts
        self.args, self.layer, self.store, self.usage = args, layer, store, usage
        router_bias = ckpt.vector(f"{p}.gate.bias", E) if ckpt.has(f"{p}.gate.bias") else None  # gpt-oss
        self.router = Linear(ckpt.resident(f"{p}.gate.weight", E, H), router_bias)
        routing = args.routing
        self.bias = (
            ckpt.vector(f"{p}.gate.e_score_correction_bias", E) if routing.router == "noaux_tc" else None
        )
        self.shared = None
        self.shared_gate = None
        if routing.shared_expert_intermediate_size:
            self.shared = MLP(ckpt, f"{p}.shared_experts", H, routing.shared_expert_intermediate_size)
            if routing.shared_expert_gated:
                self.shared_gate = Linear(ckpt.resident(f"{p}.shared_expert_gate.weight", 1, H))

    @property
    def nbytes(self) -> int:
        n = self.router.nbytes + (self.shared.nbytes if self.shared else 0)
        return n + (self.shared_gate.nbytes if self.shared_gate else 0)

    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r, k = self.args.routing, self.args.num_experts_per_tok
        logits = self.router(x)
        if r.router == "noaux_tc":
            return noaux_tc(
                logits, self.bias, k, r.n_group, r.topk_group, r.norm_topk_prob, r.routed_scaling_factor
            )
        if r.router == "topk_softmax":
            return topk_softmax(logits, k)
        return softmax_topk(logits, k, r.norm_topk_prob)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        idx, w = self.route(x)
        if self.usage is not None:
            self.usage.record(idx, w)
        hit = [int(e) for e in np.unique(idx)]  # ascending, like transformers' expert loop
        experts = [self.store.get(e) for e in hit]  # reads and LRU bookkeeping stay on this thread

        def run(i: int) -> tuple[np.ndarray, np.ndarray]:
            tok, pos = np.nonzero(idx == hit[i])
            return tok, experts[i](x[tok]) * w[tok, pos][:, None]

        out = np.zeros_like(x)
        for tok, y in threads.parallel_map(run, range(len(hit))):  # summed in expert order: deterministic
            out[tok] += y
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = sigmoid(self.shared_gate(x)) * s
            out = out + s
        return out
