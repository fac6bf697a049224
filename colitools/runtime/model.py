"""The model: ``Model`` (forward, the generation API, statistics), expert placement (``--cap`` / ``--ram-gb``) and
``load_model``.

``load_model`` finds the family of the config's ``model_type`` (``family_registry.family_for``), parses its arguments
(``ModelArgs.from_config``: the family's ``args``), builds every decoder layer with the family's ``layer`` and the
model's two ends with its ``io`` (``family.ModelIO``); ``Model.forward`` runs ``io.tokens`` -> the layers ->
``io.logits``, whatever the family. Each layer owns its part of the cache (KV buffers, conv and delta-rule state);
``Model.reset`` empties them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from colitools.formats import model_config
from colitools.formats.errors import ParameterError, RuntimeModelError
from colitools.formats.filenames import CONFIG_FILE, USAGE_FILE
from colitools.formats.route_trace import RouteTraceWriter
from colitools.formats.usage import check_usage_decay
from colitools.runtime.config import ModelArgs
from colitools.runtime.experts import ExpertStore, StoreStats
from colitools.runtime.family import Layer, LayerContext, ModelIO
from colitools.runtime.family_registry import family_for
from colitools.runtime.moe import RouteRecord
from colitools.runtime.rope import Rope
from colitools.runtime.weights import Checkpoint


@dataclass
class Placement:
    cap: int
    dense_bytes: int
    expert_bytes: int  # one expert as held in the cache (largest layer)
    ram_gb: float | None


class Model:
    """A loaded model: ``forward`` plus the generation API (see ``generate.py``) and statistics."""

    def __init__(self, model_dir: Path, args: ModelArgs, ckpt: Checkpoint, layers: list[Layer],
                 stores: dict[int, ExpertStore], rope: Rope, routes: RouteRecord, io: ModelIO):  # fmt: skip
        self.dir, self.args, self.ckpt, self.rope = model_dir, args, ckpt, rope
        self.layers, self.stores, self.io = layers, stores, io
        # the selection counts [layers, experts] (None: not recording) and the ROUTE_TRACE stream (None: off)
        self.usage, self.trace = routes.counts, routes.trace
        self.usage_decay = 1.0  # COLI_USAGE_DECAY: the multiplier of the whole history at the save
        self.usage_note: str | None = None
        self.position = 0  # tokens in the KV cache
        self.tokens_processed = 0
        self.placement: Placement | None = None
        self.closed = False

    @property
    def embed(self):
        return self.io.embed

    @property
    def lm_head(self):
        return self.io.lm_head

    # ------------------------------------------------------------------------------------------- forward
    def reset(self) -> None:
        """Empty every KV cache and linear-attention state (the expert cache is kept: it never changes
        results)."""
        for layer in self.layers:
            layer.reset()
        self.position = 0

    def forward(self, ids: list[int] | np.ndarray, *, all_logits: bool = False) -> np.ndarray:
        """Append ``ids`` after the cached positions; return logits ``[V]`` of the last position, or
        ``[N, V]`` of every new position with ``all_logits``."""
        ids = self.checked_ids(ids)
        positions = self.position + np.arange(ids.size)
        cos, sin = self.rope.cos_sin(positions)
        x = self.io.tokens(ids)
        carry = self.io.carry(ids, x)  # what a layer hands the next (DSA selection, block states, token ids)
        for layer in self.layers:
            x, carry = layer(x, positions, cos, sin, carry)
        self.position += ids.size
        self.tokens_processed += ids.size
        logits = self.io.logits(x, carry, all_logits)  # of the last position unless all_logits
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
        """Write the routing usage (``.coli_usage``) when recording, close the route trace, release the files."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.trace is not None:
                self.trace.close()
            if self.usage is not None and self.usage.any():
                from colitools.runtime.generate import record_usage

                self.usage_note = record_usage(
                    self.dir / USAGE_FILE, self.args, self.usage, routed_layers=sorted(self.stores),
                    decay=self.usage_decay,
                )  # fmt: skip
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
               record_usage: bool = True, route_trace: str | os.PathLike | None = None,
               usage_decay: float = 1.0, act_quant: str | None = None) -> Model:  # fmt: skip
    """Load a converted container or a float / FP8 checkpoint for execution.

    Dense weights are decoded into memory; routed experts are read on demand into a per-layer LRU cache of
    ``cap`` experts. Without ``cap``, the cap is the number of experts per layer that fits ``ram_gb`` GiB
    (default: 80% of the available memory) after the dense weights. ``record_usage`` counts router selections
    and writes them to ``<model_dir>/.coli_usage`` on ``close()``, the whole history times ``usage_decay`` (colibri's
    ``COLI_USAGE_DECAY``, in ``(0, 1]``); ``route_trace`` names a file for the ``ROUTE_TRACE`` stream;
    ``act_quant`` a family's activation rounding (``official``: DeepSeek-V4's, runtime/deepseek_v4_quant.py)."""
    model_dir = Path(model_dir)
    args = ModelArgs.from_dir(model_dir)
    if cap is not None and cap < 1:
        raise ParameterError(f"`cap` must be >= 1, got {cap}")
    if ram_gb is not None and not (0 < ram_gb < float("inf")):  # also refuses nan
        raise ParameterError(f"`ram_gb` must be a finite number > 0, got {ram_gb}")
    check_usage_decay(usage_decay)
    family = family_for(args.model_type)
    if act_quant is not None and act_quant not in family.act_quant_modes:
        modes = ", ".join(family.act_quant_modes) or "none"
        raise ParameterError(  # a value outside the option's choices for this model: a usage error (exit 2)
            f"`act_quant={act_quant}`: model_type {args.model_type!r} has no such activation rounding (its modes: "
            f"{modes})"
        )
    ckpt = Checkpoint(model_dir, args.raw)
    trace = None
    try:
        _check_decoder_layers(model_dir, args, ckpt)
        rope = Rope(args.rope)
        usage = np.zeros((args.num_hidden_layers, args.num_experts), dtype=np.int64) if record_usage else None
        trace = RouteTraceWriter(route_trace) if route_trace is not None else None
        routes = RouteRecord(usage, trace)
        ctx = LayerContext(args, ckpt, rope, routes)
        layers = [family.layer(ctx, i) for i in range(args.num_hidden_layers)]
        family.set_act_quant(args, act_quant)
        model = Model(model_dir, args, ckpt, layers, ctx.stores, rope, routes, family.io(args, ckpt))
        model.usage_decay = usage_decay
    except BaseException:
        if trace is not None:
            trace.close()
        ckpt.close()
        raise
    dense = model.io.nbytes + sum(layer.nbytes for layer in layers)
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


def _check_decoder_layers(model_dir: Path, args: ModelArgs, ckpt: Checkpoint) -> None:
    """Refuse a checkpoint with decoder layers past ``num_hidden_layers`` and its MTP layers: they would be left
    out of the run without a word (``model_config.check_decoder_layers``)."""
    model_config.check_decoder_layers(args.raw, ckpt.infos, str(model_dir / CONFIG_FILE))
