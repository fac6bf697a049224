"""The model skeleton shared by every family, expert placement (``--cap`` / ``--ram-gb``) and ``load_model``.

```
x = embed[ids]
for each layer: x = x + Attn(RMSNorm_in(x)); x = x + FFN(RMSNorm_post(x))
logits = RMSNorm_final(x) @ lm_head.T
```
Each family file (``olmoe.py``, ``qwen_moe.py``, ``mixtral.py``, ``deepseek_v3.py``, ``glm4_moe.py``,
``qwen3_next.py``, found by ``model_type`` through ``config.FAMILY_MODULES``) parses its own config keys
(``family_args``) and says which token mixer ("Attn": attention or, in the hybrids, Gated DeltaNet linear
attention) and feed-forward a layer has (``build_layer``); ``LayerContext`` hands out the shared pieces. Each
token mixer owns its part of the cache (KV buffers, conv and delta-rule state); ``Model.reset`` empties them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from colitools.errors import ParameterError, RuntimeModelError
from colitools.formats.filenames import USAGE_FILE
from colitools.formats.names import (
    MXFP4_STACK_SUFFIXES,
    Orientation,
    expert_tensor_name,
    layer_path,
    module_path,
    stack_name,
    stack_names,
    stack_orientation,
)
from colitools.runtime.config import ModelArgs, family_module
from colitools.runtime.experts import Expert, ExpertStore, StoreStats
from colitools.runtime.moe import SparseMoE
from colitools.runtime.ops import MLP, Embedding, Linear, norm_weight, rms_norm
from colitools.runtime.rope import Rope
from colitools.runtime.weights import Checkpoint, Stored

F32 = np.float32



class DecoderLayer:
    """``x + Attn(norm_in(x))`` then ``x + FFN(norm_post(x))``."""

    def __init__(self, attn, ffn, norm_in: np.ndarray, norm_post: np.ndarray, eps: float):
        self.attn, self.ffn, self.norm_in, self.norm_post, self.eps = attn, ffn, norm_in, norm_post, eps

    def __call__(self, x, positions, cos, sin, selection):
        h = rms_norm(x, self.norm_in, self.eps)
        if hasattr(self.attn, "indexer"):  # MLA: returns the DSA key selection for the next shared layer
            a, selection = self.attn(h, positions, cos, sin, selection)
        else:
            a = self.attn(h, positions, cos, sin)
        x = x + a
        return x + self.ffn(rms_norm(x, self.norm_post, self.eps)), selection


class LayerContext:
    """What a family's ``build_layer`` needs: args, checkpoint, RoPE, and factories for the shared blocks."""

    def __init__(self, args: ModelArgs, ckpt: Checkpoint, rope: Rope, usage: np.ndarray | None):
        self.args, self.ckpt, self.rope, self.usage = args, ckpt, rope, usage
        self.stores: dict[int, ExpertStore] = {}

    def decoder_layer(self, layer: int, attn, ffn) -> DecoderLayer:
        p, H, zc = layer_path(layer), self.args.hidden_size, self.args.zero_centred_norms
        return DecoderLayer(
            attn,
            ffn,
            norm_weight(self.ckpt, f"{p}.input_layernorm.weight", H, zc),
            norm_weight(self.ckpt, f"{p}.post_attention_layernorm.weight", H, zc),
            self.args.rms_norm_eps,
        )

    def dense_mlp(self, layer: int) -> MLP:
        return MLP(self.ckpt, module_path(layer, "mlp"), self.args.hidden_size, self.args.intermediate_size)

    def sparse_moe(self, layer: int, biases: list[tuple[Stored, Stored, Stored]] | None = None,
                   make: type[Expert] | None = None) -> SparseMoE:  # fmt: skip
        """The layer's MoE block; ``biases`` / ``make``: per-expert biases and the family's expert class."""
        store = ExpertStore(
            self.ckpt, layer, expert_sources(self.args, self.ckpt, layer), self.args.num_experts,
            biases, make or Expert,
        )  # fmt: skip
        self.stores[layer] = store
        return SparseMoE(
            self.args, self.ckpt, layer, store, None if self.usage is None else self.usage[layer]
        )


# How (gate, up, down) sit in an interleaved or transposed expert stack: (start, step, transposed) per
# projection, for Checkpoint.stack_expert (orientation: names.stack_orientation, a fact of the family).
STACK_PICKS: dict[Orientation, tuple[tuple[int, int, bool], ...]] = {
    Orientation.ROWS_INTERLEAVED: ((0, 2, False), (1, 2, False), (0, 1, False)),
    Orientation.TRANSPOSED_INTERLEAVED: ((0, 2, True), (1, 2, True), (0, 1, True)),
}


def expert_sources(args: ModelArgs, ckpt: Checkpoint, layer: int) -> list[tuple[Stored, Stored, Stored]]:
    """Stored (gate, up, down) of every routed expert of a layer: per-expert tensors, or slices of the fused
    ``experts.gate_up_proj [E, 2I, H]`` (gate rows first) and ``experts.down_proj [E, H, I]``, or of a stack in
    the family's interleaved / transposed orientation (gpt-oss ``[E, H, 2I]`` gate = even columns, ``[E, I, H]``)."""
    p = module_path(layer, "mlp.experts")
    H, I, E = args.hidden_size, args.moe_intermediate_size, args.num_experts
    blocks, scales = MXFP4_STACK_SUFFIXES
    gate_up, down = (  # the spelling present (Inkling's native w13_weight / w2_weight), else transformers'
        next((n for n in stack_names(p, proj) if ckpt.has(n) or ckpt.has(n + blocks)), stack_name(p, proj))
        for proj in ("gate_up", "down")
    )
    orientation = stack_orientation(args.model_type, leaf=gate_up.rpartition(".")[2]) or Orientation.ROWS
    picks = STACK_PICKS.get(orientation)
    if ckpt.has(expert_tensor_name(p, 0, "gate")):  # per-expert tensors, or the parts of a target's fused stack
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


@dataclass
class Placement:
    cap: int
    dense_bytes: int
    expert_bytes: int  # one expert as held in the cache (largest layer)
    ram_gb: float | None


class Model:
    """A loaded model: ``forward`` plus the generation API (see ``generate.py``) and statistics. A family whose
    model differs (DeepSeek-V4's hyper-connection streams) names a subclass as ``MODEL_CLASS`` in its module."""

    head_name = "lm_head"  # the output head's weight prefix (DeepSeek-V4 native names: ``head``)

    def __init__(self, model_dir: Path, args: ModelArgs, ckpt: Checkpoint, layers: list[DecoderLayer],
                 stores: dict[int, ExpertStore], rope: Rope, usage: np.ndarray | None):  # fmt: skip
        self.dir, self.args, self.ckpt, self.rope = model_dir, args, ckpt, rope
        self.layers, self.stores = layers, stores
        H, V = args.hidden_size, args.vocab_size
        # a family with its own embedding / output head (Inkling's embed_norm and mup divisor) has a ModelIO
        io = getattr(family_module(args.model_type), "ModelIO", None)
        self.io = io(args, ckpt) if io else None
        if self.io:
            self.embed, self.lm_head = self.io.embed, self.io.lm_head
        else:
            self.embed = Embedding(ckpt, "model.embed_tokens.weight", V, H)
            self.norm = norm_weight(ckpt, "model.norm.weight", H, args.zero_centred_norms)
            if ckpt.has(f"{self.head_name}.weight"):
                self.lm_head = Linear.load(ckpt, self.head_name, V, H)
            elif args.tie_word_embeddings:
                self.lm_head = Linear(self.embed.q)
            else:
                raise RuntimeModelError(
                    f"{model_dir}: missing tensor {self.head_name}.weight (and tie_word_embeddings is false)"
                )
        self.usage = usage
        self.streams = None  # hyper-connection streams (hyper.HyperStreams) of a family with build_streams
        self.usage_note: str | None = None
        self.position = 0  # tokens in the KV cache
        self.tokens_processed = 0
        self.placement: Placement | None = None
        self.closed = False

    # ------------------------------------------------------------------------------------------- forward
    def reset(self) -> None:
        """Empty every KV cache and linear-attention state (the expert cache is kept: it never changes
        results)."""
        for layer in self.layers:
            getattr(layer, "reset", layer.attn.reset)()  # a family's layer may hold more state than its attn
        self.position = 0

    def forward(self, ids: list[int] | np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        """Append ``ids`` after the cached positions; return logits ``[V]`` of the last position, or
        ``[N, V]`` of every new position with ``all_logits``."""
        ids = self.checked_ids(ids)
        positions = self.position + np.arange(ids.size)
        cos, sin = self.rope.cos_sin(positions)
        x = self.io.tokens(ids) if self.io else self.embed(ids)
        if self.streams is not None:
            x = self.streams.expand(x)
        selection = self.io.carry(x) if self.io else None  # what a layer hands the next (DSA selection, ...)
        for layer in self.layers:
            x, selection = layer(x, positions, cos, sin, selection)
        if self.streams is not None:
            x = self.streams.head(x)
        self.position += ids.size
        self.tokens_processed += ids.size
        if self.io:
            logits = self.io.logits(x, selection, all_logits)  # of the last position unless all_logits
        else:
            h = rms_norm(x if all_logits else x[-1:], self.norm, self.args.rms_norm_eps)
            logits = self.lm_head(h)
        return logits if all_logits else logits[0]

    def checked_ids(self, ids: list[int] | np.ndarray) -> np.ndarray:
        """``ids`` as int64 ``[N]``; RuntimeModelError for none or one outside the vocabulary."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise RuntimeModelError("forward needs at least one token id")
        bad = ids[(ids < 0) | (ids >= self.args.vocab_size)]
        if bad.size:
            raise RuntimeModelError(
                f"token id {int(bad[0])} is outside the vocabulary (0..{self.args.vocab_size - 1})"
            )
        return ids

    # ------------------------------------------------------------------------------------------ the API
    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] = ()
    ) -> list[int]:
        """Greedy decoding with the KV cache; the generated ids (prompt excluded)."""
        from colitools.runtime.generate import generate

        return generate(self, prompt_ids, max_new_tokens, stop_ids=stop_ids).generated_ids

    def score(self, ids: list[int]) -> tuple[list[int], np.ndarray]:
        """Teacher-forced scoring of ``ids`` in one forward: (argmax per position, logits of the last position)."""
        from colitools.runtime.generate import score

        return score(self, ids)

    def expert_stats(self) -> StoreStats:
        total = StoreStats()
        for store in self.stores.values():
            total.add(store.stats)
        return total

    def stats(self) -> dict:
        s = self.expert_stats()
        p = self.placement
        return {
            "model_type": self.args.model_type,
            "cap": p.cap if p else None,
            "ram_gb": p.ram_gb if p else None,
            "dense_bytes": p.dense_bytes if p else None,
            "expert_bytes": p.expert_bytes if p else None,
            "expert_cache_hits": s.hits,
            "expert_cache_misses": s.misses,
            "expert_cache_hit_rate": round(s.hit_rate, 6),
            "expert_reads": s.reads,
            "expert_bytes_read": s.bytes_read,
            "tokens_processed": self.tokens_processed,
        }

    def close(self) -> None:
        """Write the routing usage (``.coli_usage``) when recording, and release the files."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.usage is not None and self.usage.any():
                from colitools.runtime.generate import record_usage

                self.usage_note = record_usage(self.dir / USAGE_FILE, self.args, self.usage)
        finally:
            self.ckpt.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _available_ram_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load_model(model_dir: str | Path, cap: int | None = None, ram_gb: float | None = None, *,
               record_usage: bool = True) -> Model:  # fmt: skip
    """Load a converted container or a float / FP8 checkpoint for execution.

    Dense weights are decoded into memory; routed experts are read on demand into a per-layer LRU cache of
    ``cap`` experts. Without ``cap``, the cap is the number of experts per layer that fits ``ram_gb`` GiB
    (default: 80% of the available memory) after the dense weights. ``record_usage`` counts router selections
    and writes them to ``<model_dir>/.coli_usage`` on ``close()``."""
    model_dir = Path(model_dir)
    args = ModelArgs.from_dir(model_dir)
    if cap is not None and cap < 1:
        raise ParameterError(f"`cap` must be >= 1, got {cap}")
    if ram_gb is not None and not (0 < ram_gb < float("inf")):  # also refuses nan
        raise ParameterError(f"`ram_gb` must be a finite number > 0, got {ram_gb}")
    family = family_module(args.model_type)
    ckpt = Checkpoint(model_dir, args.raw)
    try:
        rope = Rope(args.rope)
        usage = np.zeros((args.num_hidden_layers, args.num_experts), dtype=np.int64) if record_usage else None
        ctx = LayerContext(args, ckpt, rope, usage)
        layers = [family.build_layer(ctx, i) for i in range(args.num_hidden_layers)]
        model_class = getattr(family, "MODEL_CLASS", Model)
        model = model_class(model_dir, args, ckpt, layers, ctx.stores, rope, usage)
        if hasattr(family, "build_streams"):  # hyper-connections (hyper.py): streams in, head out
            model.streams = family.build_streams(ctx)
    except BaseException:
        ckpt.close()
        raise
    dense = (
        model.embed.nbytes
        + (model.lm_head.nbytes if model.lm_head.weight is not model.embed.q else 0)
        + sum(_layer_nbytes(layer) for layer in layers)
    )
    expert = max((s.expert_nbytes(0) for s in ctx.stores.values()), default=0)
    if cap is None:
        budget = (ram_gb * 2**30 if ram_gb is not None else 0.8 * _available_ram_bytes()) - dense
        n = max(len(ctx.stores), 1) * max(expert, 1)
        cap = int(max(budget, 0) // n)
    cap = max(1, min(cap, args.num_experts))
    for store in ctx.stores.values():
        store.cap = cap
    model.placement = Placement(cap, int(dense), int(expert), ram_gb)
    return model


def _layer_nbytes(layer: DecoderLayer) -> int:
    if hasattr(layer, "nbytes"):  # a family's own layer (DeepSeek-V4) counts itself
        return layer.nbytes
    n = layer.norm_in.nbytes + layer.norm_post.nbytes + layer.attn.nbytes
    return n + layer.ffn.nbytes + getattr(layer, "extra_nbytes", 0)
