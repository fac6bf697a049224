"""Routed experts read on demand: positional reads into a per-layer LRU cache of ``cap`` experts.

An expert is three stored projections (gate, up, down). Their byte ranges (codes and scales) are coalesced per
file: in the "pairs" and planar layouts an expert's codes and scales are one contiguous record, so an expert is
one ``pread``. The cached expert keeps the stored codes and runs the kernels on them (``QTensor``); only float
sources are held as float32. Per-expert biases (gpt-oss, F32 vectors in the container) are read with their
expert and cached with it. What is cached never changes what is computed, so the cap cannot change a token.
``expert_sources`` describes a layer's experts however the checkpoint stores them (per expert, fused or
interleaved stacks in the family's orientation, native MXFP4 stacks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.families import shaped_orientation, stack_orientation
from colitools.formats.names import (
    MXFP4_STACK_SUFFIXES,
    Orientation,
    expert_tensor_name,
    module_path,
    stack_name,
    stack_names,
)
from colitools.runtime.config import ModelArgs
from colitools.runtime.kernels import QTensor
from colitools.runtime.ops import silu
from colitools.runtime.weights import Checkpoint, Stored, decode_stored, qtensor

F32 = np.float32


class Expert:
    """One routed expert: ``down(silu(gate(x)) * up(x))`` on stored codes. ``biases``: the (gate, up, down)
    float32 bias vectors of a family whose experts have them (used by its own ``Expert`` subclass)."""

    __slots__ = ("gate", "up", "down", "biases", "nbytes")

    def __init__(
        self, gate: QTensor, up: QTensor, down: QTensor, biases: tuple[np.ndarray, ...] | None = None
    ):
        self.gate, self.up, self.down, self.biases = gate, up, down, biases
        self.nbytes = gate.nbytes + up.nbytes + down.nbytes + sum(b.nbytes for b in biases or ())

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.down.matmul(silu(self.gate.matmul(x)) * self.up.matmul(x))


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    reads: int = 0  # pread calls
    bytes_read: int = 0
    evictions: int = 0

    def add(self, other: StoreStats) -> None:
        for k in ("hits", "misses", "reads", "bytes_read", "evictions"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class ExpertStore:
    """The routed experts of one MoE layer; ``get(e)`` returns a cached or freshly read ``Expert``.

    ``biases`` (optional): per expert the stored (gate, up, down) bias vectors (``Stored`` of ``[n, 1]``), read
    in the same positional reads as the weights; ``make`` builds the expert (the family's ``Expert`` class)."""

    def __init__(self, ckpt: Checkpoint, layer: int, sources: list[tuple[Stored, Stored, Stored]], cap: int,
                 biases: list[tuple[Stored, Stored, Stored]] | None = None,
                 make: Callable[..., Expert] = Expert):  # fmt: skip
        if cap < 1:
            raise RuntimeModelError(f"expert cache capacity must be >= 1, got {cap}")
        self.ckpt, self.layer, self.sources, self.cap = ckpt, layer, sources, cap
        self.biases, self.make = biases, make
        self.cache: OrderedDict[int, Expert] = OrderedDict()
        self.stats = StoreStats()

    @property
    def n_experts(self) -> int:
        return len(self.sources)

    def expert_nbytes(self, e: int) -> int:
        n = sum(st.resident_nbytes for st in self.sources[e])
        return n + (sum(st.resident_nbytes for st in self.biases[e]) if self.biases else 0)

    def get(self, e: int) -> Expert:
        hit = self.cache.get(e)
        if hit is not None:
            self.cache.move_to_end(e)
            self.stats.hits += 1
            return hit
        self.stats.misses += 1
        expert = self._read(e)
        self.cache[e] = expert
        while len(self.cache) > self.cap:
            self.cache.popitem(last=False)
            self.stats.evictions += 1
        return expert

    def _read(self, e: int) -> Expert:
        """Fetch every byte range of expert ``e`` with as few positional reads as the layout allows."""
        sts = self.sources[e]
        bias_sts = self.biases[e] if self.biases else ()
        ranges = [(st.path, *st.data) for st in (*sts, *bias_sts)]
        ranges += [(st.path, *st.scale) for st in sts if st.scale]
        views: dict[tuple[str, int, int], memoryview] = {}
        for path, begin, end, members in _coalesce(ranges):
            buf = memoryview(self.ckpt.pread(path, begin, end))
            self.stats.reads += 1
            self.stats.bytes_read += end - begin
            for b, t in members:
                views[(path, b, t)] = buf[b - begin : t - begin]
        q = [qtensor(st, views[(st.path, *st.data)], views[(st.path, *st.scale)] if st.scale else None)
             for st in sts]  # fmt: skip
        if not bias_sts:
            return self.make(*q)
        biases = tuple(decode_stored(st, views[(st.path, *st.data)], None).reshape(-1) for st in bias_sts)
        return self.make(*q, biases)

    def clear(self) -> None:
        self.cache.clear()


def _coalesce(ranges: list[tuple[str, int, int]]):
    """Group byte ranges into runs that touch (per file): yields ``(path, begin, end, [(b, e), ...])``."""
    runs: list[tuple[str, int, int, list[tuple[int, int]]]] = []
    for path, b, e in sorted(set(ranges)):
        if runs and runs[-1][0] == path and b <= runs[-1][2]:
            p, rb, re_, members = runs[-1]
            members.append((b, e))
            runs[-1] = (p, rb, max(re_, e), members)
        else:
            runs.append((path, b, e, [(b, e)]))
    return runs


# How (gate, up, down) sit in an interleaved or transposed expert stack: (start, step, transposed) per
# projection, for Checkpoint.stack_expert (orientation: ``families.stack_orientation``, a fact of the family).
STACK_PICKS: dict[Orientation, tuple[tuple[int, int, bool], ...]] = {
    Orientation.ROWS_INTERLEAVED: ((0, 2, False), (1, 2, False), (0, 1, False)),
    Orientation.TRANSPOSED_INTERLEAVED: ((0, 2, True), (1, 2, True), (0, 1, True)),
}


def expert_sources(args: ModelArgs, ckpt: Checkpoint, layer: int) -> list[tuple[Stored, Stored, Stored]]:
    """Stored (gate, up, down) of every routed expert of a layer: per-expert tensors, or slices of the fused
    ``experts.gate_up_proj [E, 2I, H]`` (gate rows first) and ``experts.down_proj [E, H, I]``, or of a stack in
    the family's interleaved / transposed orientation (gpt-oss ``[E, H, 2I]`` gate = even columns, ``[E, I, H]``;
    Qwen3-VL-MoE and Llama-4 ``[E, H, 2I]`` gate = the first I columns)."""
    p = module_path(layer, "mlp.experts")
    H, I, E = args.hidden_size, args.moe_intermediate_size, args.num_experts
    blocks, scales = MXFP4_STACK_SUFFIXES
    gate_up, down = (  # the spelling present (Inkling's native w13_weight / w2_weight), else transformers'
        next((n for n in stack_names(p, proj) if ckpt.has(n) or ckpt.has(n + blocks)), stack_name(p, proj))
        for proj in ("gate_up", "down")
    )
    orientation = stack_orientation(args.model_type, leaf=gate_up.rpartition(".")[2]) or Orientation.ROWS
    stacks = {proj: tuple(ckpt.infos[n][1].shape) for proj, n in (("gate_up", gate_up), ("down", down))
              if n in ckpt.infos}  # fmt: skip
    orientation = shaped_orientation(args.model_type, stacks, H, I) or orientation
    picks = STACK_PICKS.get(orientation)
    if orientation is Orientation.TRANSPOSED:  # gate = the first I columns of [H, 2I], up = the last I
        picks = ((0, 1, True), (I, 1, True), (0, 1, True))
    if ckpt.has(
        expert_tensor_name(p, 0, "gate")
    ):  # per-expert tensors, or the parts of a target's fused stack
        return _per_expert(ckpt, p, E, H, I)
    if ckpt.has(gate_up + blocks):  # native MXFP4 stacks: rows = outputs, gate / up rows interleaved
        if not picks:
            raise RuntimeModelError(
                f"{ckpt.dir}: native MXFP4 expert stacks of a {orientation} family ({args.model_type}) are not "
                "supported (only interleaved gate / up rows, gpt-oss)"
            )
        g, u = (0, 2), (1, 2)
        return [
            (ckpt.mxfp4_stack_expert(gate_up + blocks, gate_up + scales, e, E, g, I, H),
             ckpt.mxfp4_stack_expert(gate_up + blocks, gate_up + scales, e, E, u, I, H),
             ckpt.mxfp4_stack_expert(down + blocks, down + scales, e, E, (0, 1), H, I))
            for e in range(E)
        ]  # fmt: skip
    if ckpt.has(gate_up) and picks:
        g, u, d = picks
        return [
            (ckpt.stack_expert(gate_up, e, E, g, I, H), ckpt.stack_expert(gate_up, e, E, u, I, H),
             ckpt.stack_expert(down, e, E, d, H, I))
            for e in range(E)
        ]  # fmt: skip
    if ckpt.has(gate_up):
        return [
            (ckpt.fused_expert(gate_up, e, E, slice(0, I), I, H),
             ckpt.fused_expert(gate_up, e, E, slice(I, 2 * I), I, H),
             ckpt.fused_expert(down, e, E, slice(0, H), H, I))
            for e in range(E)
        ]  # fmt: skip
    return _per_expert(ckpt, p, E, H, I)


def _per_expert(ckpt: Checkpoint, p: str, E: int, H: int, I: int) -> list[tuple[Stored, Stored, Stored]]:
    return [
        (ckpt.stored(expert_tensor_name(p, e, "gate"), I, H), ckpt.stored(expert_tensor_name(p, e, "up"), I, H),
         ckpt.stored(expert_tensor_name(p, e, "down"), H, I))
        for e in range(E)
    ]  # fmt: skip
