"""``run_model``: the library function behind ``colitools run`` (prompt in, greedy tokens and speed out)."""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from colitools.formats.errors import ColitoolsError, FormatError, ParameterError, RuntimeModelError
from colitools.formats.inspect import incomplete_conversion
from colitools.formats.jsonfile import load_json_object
from colitools.runtime.generate import GenerationResult, generate
from colitools.runtime.model import load_model


@dataclass
class RunReport:
    prompt_ids: list[int]
    generated_ids: list[int]
    text: str | None
    tok_per_s: float
    prefill_seconds: float
    decode_seconds: float
    load_seconds: float
    stats: dict = field(default_factory=dict)
    peak_rss_bytes: int = 0
    usage_note: str | None = None

    def to_json(self) -> dict:
        out = {"prompt_ids": self.prompt_ids, "generated_ids": self.generated_ids}
        if self.text is not None:
            out["text"] = self.text
        out.update(
            tok_per_s=round(self.tok_per_s, 3),
            expert_cache_hit_rate=self.stats.get("expert_cache_hit_rate"),
            prefill_s=round(self.prefill_seconds, 4),
            decode_s=round(self.decode_seconds, 4),
            load_s=round(self.load_seconds, 4),
            peak_rss_bytes=self.peak_rss_bytes,
            **{k: v for k, v in self.stats.items() if k != "expert_cache_hit_rate"},
        )
        if self.usage_note:
            out["usage_note"] = self.usage_note
        return out


def load_tokenizer(model_dir: Path):
    path = model_dir / "tokenizer.json"
    if not path.exists():
        raise RuntimeModelError(f"{model_dir}: no tokenizer.json (use `prompt_ids`)")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises plain Exceptions
        raise RuntimeModelError(f"{path}: cannot load the tokenizer ({exc})") from None


def _stop_ids(model_dir: Path, eos: list[int]) -> tuple[int, ...]:
    ids = set(eos)
    gen = model_dir / "generation_config.json"
    if gen.exists():
        try:
            value = load_json_object(gen).get("eos_token_id")
        except FormatError:  # unreadable, not JSON or not an object: no extra stop ids
            value = None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return tuple(sorted(ids))


def run_model(
    model_dir: str | Path,
    *,
    prompt_ids: list[int] | None = None,
    prompt: str | None = None,
    max_new_tokens: int = 32,
    cap: int | None = None,
    ram_gb: float | None = None,
    record_usage: bool = True,
    stop_at_eos: bool = True,
    progress: Callable[[int, GenerationResult, dict], None] | None = None,
    route_trace: str | os.PathLike | None = None,
    usage_decay: float = 1.0,
    act_quant: str | None = None,
) -> RunReport:
    """Load ``model_dir``, greedy-decode ``max_new_tokens`` after the prompt (ids, or text through the model's
    ``tokenizer.json``), record routing usage (the history times ``usage_decay`` at the save) and, with
    ``route_trace``, the ``ROUTE_TRACE`` stream to that file, and report tokens, text and speed; ``act_quant``
    a family's activation rounding (``load_model``)."""
    model_dir = Path(model_dir)
    if (prompt_ids is None) == (prompt is None):
        raise ParameterError("give exactly one of `prompt_ids` and `prompt`")  # a usage error (exit 2)
    not_complete = incomplete_conversion(model_dir)
    if not_complete:  # an interrupted conversion: no config.json yet, and units missing
        raise RuntimeModelError(not_complete)
    tokenizer = None
    if prompt is not None or (model_dir / "tokenizer.json").exists():
        try:
            tokenizer = load_tokenizer(model_dir)
        except RuntimeModelError:
            if prompt is not None:
                raise
    if prompt is not None:
        prompt_ids = tokenizer.encode(prompt).ids
        if not prompt_ids:
            raise RuntimeModelError(f"the prompt {prompt!r} encodes to no tokens")
    t0 = time.perf_counter()
    model = load_model(model_dir, cap=cap, ram_gb=ram_gb, record_usage=record_usage, route_trace=route_trace,
                       usage_decay=usage_decay, act_quant=act_quant)  # fmt: skip
    load_s = time.perf_counter() - t0
    try:
        check_prompt_ids(prompt_ids, model.args.vocab_size)
        if cap is None and ram_gb is not None:
            _check_ram_budget(model, ram_gb)
        stop = _stop_ids(model_dir, model.args.eos_token_ids) if stop_at_eos else ()
        cb = None
        if progress is not None:

            def cb(tok: int, res: GenerationResult) -> None:
                progress(tok, res, model.stats())

        res = generate(model, prompt_ids, max_new_tokens, stop_ids=stop, on_token=cb)
    finally:
        model.close()
    text = tokenizer.decode(res.generated_ids) if tokenizer is not None else None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return RunReport(
        prompt_ids=list(prompt_ids), generated_ids=res.generated_ids, text=text, tok_per_s=res.decode_tok_per_s,
        prefill_seconds=res.prefill_seconds, decode_seconds=res.decode_seconds, load_seconds=load_s,
        stats=model.stats(), peak_rss_bytes=peak, usage_note=model.usage_note,
    )  # fmt: skip


def check_prompt_ids(
    prompt_ids: Sequence[int], vocab_size: int, error: type[ColitoolsError] = RuntimeModelError
) -> None:
    """Every prompt id must be a token of the model (``0 <= id < vocab_size``): ``error`` naming the first that is
    not (``verify quality --kld`` passes its usage error)."""
    for i, tok in enumerate(prompt_ids):
        if not 0 <= tok < vocab_size:
            shown = str(tok) if abs(tok) < 10**30 else f"{str(tok)[:12]}... ({len(str(abs(tok)))} digits)"
            raise error(
                f"`prompt_ids`: id {shown} (position {i}) is outside the vocabulary: "
                f"ids must be 0..{vocab_size - 1} (vocab_size {vocab_size})"
            )


def _check_ram_budget(model, ram_gb: float) -> None:
    """Refuse a ``--ram-gb`` that cannot hold the resident weights plus one expert per MoE layer (it would
    otherwise run with a cap of 1 and use more memory than it was given)."""
    p = model.placement
    need = p.dense_bytes + p.expert_bytes * max(len(model.stores), 1)
    if ram_gb * 2**30 < need:
        raise RuntimeModelError(
            f"`ram_gb={ram_gb:g}`: the resident weights take {p.dense_bytes / 2**30:.3g} GiB and one cached "
            f"expert per layer {(need - p.dense_bytes) / 2**30:.3g} GiB more; give `ram_gb` >= "
            f"{need / 2**30:.3g} (or `cap=N`)"
        )
