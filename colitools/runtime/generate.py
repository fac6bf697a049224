"""Greedy decoding with the KV cache, teacher-forced scoring, and the routing usage record.

``generate`` prefills the prompt in one forward, then decodes one token at a time; ``score`` runs a whole
sequence in one forward (no cache reuse) and returns the argmax at every position, as transformers'
teacher-forced pass does. Greedy picks the first maximum (``argmax``), like ``torch.argmax``/``topk``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from colitools.formats.errors import UsageFileError
from colitools.formats.usage import UsageHistory, decay_usage, engine_id, read_usage, write_usage
from colitools.runtime.config import ModelArgs


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    generated_ids: list[int] = field(default_factory=list)
    last_logits: np.ndarray | None = None  # logits whose argmax is generated_ids[-1]
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def decode_tok_per_s(self) -> float:
        """Tokens per second of the one-token decode steps (the first token comes from the prefill)."""
        n = len(self.generated_ids) - 1
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0


def generate(
    model,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    stop_ids: Sequence[int] = (),
    on_token: Callable[[int, GenerationResult], None] | None = None,
) -> GenerationResult:
    """Greedy-decode up to ``max_new_tokens`` after ``prompt_ids`` (stopping early at a token in ``stop_ids``)."""
    prompt = [int(t) for t in prompt_ids]
    res = GenerationResult(prompt)
    if max_new_tokens <= 0:
        return res
    model.reset()
    t0 = time.perf_counter()
    logits = model.forward(prompt)
    res.prefill_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    while True:
        tok = int(np.argmax(logits))
        res.generated_ids.append(tok)
        res.last_logits = logits
        if on_token is not None:
            res.decode_seconds = time.perf_counter() - t1
            on_token(tok, res)
        if len(res.generated_ids) >= max_new_tokens or tok in stop_ids:
            break
        logits = model.forward([tok])
    res.decode_seconds = time.perf_counter() - t1
    return res


def score(model, ids: Sequence[int]) -> tuple[list[int], np.ndarray]:
    """Teacher-forced pass over ``ids``: (argmax at every position, float32 logits of the last position)."""
    model.reset()
    logits = model.forward([int(t) for t in ids], all_logits=True)
    model.reset()
    return [int(a) for a in np.argmax(logits, axis=-1)], logits[-1]


def record_usage(path: Path, args: ModelArgs, counts: np.ndarray, *, routed_layers: Sequence[int] | None = None,
                 decay: float = 1.0) -> str | None:  # fmt: skip
    """Add this run's router selections to ``path`` (docs/FORMATS.md §6, engine = ``model_type``), atomically.

    An existing history of the same engine and geometry is extended; one that cannot be extended (another
    engine or geometry, malformed) is left untouched. ``routed_layers``: the layers that route; a record of
    any other layer in the old history is neither counted nor written back (colibri's ``rt_drop_row``).
    ``decay`` multiplies the whole history before the write (``decay_usage``). Returns a note for the user
    when nothing was written."""
    n_layers, n_experts = counts.shape
    engine = engine_id(args.model_type)
    history = UsageHistory(n_layers, n_experts, engine)
    if path.exists():
        try:
            history = read_usage(
                path,
                n_layers=n_layers,
                n_experts=n_experts,
                engine=args.model_type,
                routed_layers=routed_layers,
            )
            history.engine_id = engine
        except UsageFileError as exc:
            return f"usage history not updated: {exc}"
    for layer, expert in zip(*np.nonzero(counts), strict=True):
        history.add(int(layer), int(expert), int(counts[layer, expert]))
    decay_usage(history, decay)
    try:
        write_usage(path, history)
    except (OSError, UsageFileError) as exc:
        return f"usage history not written to {path}: {exc}"
    return None
