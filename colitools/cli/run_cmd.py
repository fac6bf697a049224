"""``colitools run MODEL_DIR``: greedy generation with the reference runtime."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt

# A bound, not a model limit: a mistyped count is a usage error rather than a run that never ends.
MAX_NEW_TOKENS = 1_000_000


def _parse_ids(text: str) -> list[int]:
    from colitools.formats.errors import RuntimeModelError

    fields = text.replace(" ", "").split(",")
    if fields == [""]:
        raise RuntimeModelError("--prompt-ids is empty")
    ids = []
    for i, field in enumerate(fields):
        # digits only, and fewer than Python's int-string limit (4300): a huge id is then refused by the
        # runtime, naming the vocabulary size
        if not re.fullmatch(r"[+-]?[0-9]{1,4000}", field):
            what = "an empty entry" if field == "" else f"{field[:24]!r}" + ("..." if len(field) > 24 else "")
            raise RuntimeModelError(
                f"--prompt-ids must be comma-separated integers (e.g. 3,17,42); entry {i + 1} is {what}"
            )
        ids.append(int(field))
    return ids


def _lines(report) -> Iterator[str]:
    yield "generated_ids " + ",".join(map(str, report.generated_ids))
    if report.text is not None:
        yield "text " + json.dumps(report.text, ensure_ascii=False)


UsageDecayOpt = Annotated[
    float,
    typer.Option(
        "--usage-decay",
        metavar="F",
        help="Multiply the whole usage history by F in (0, 1] at the save (colibri's COLI_USAGE_DECAY; "
        "1 = no decay).",
    ),
]
RouteTraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--route-trace",
        metavar="FILE",
        help="Write colibri's ROUTE_TRACE stream to FILE: one line per MoE call and batch row, "
        "'call row layer expert:gate ...' (an existing FILE only if it is a route trace).",
    ),
]


def _progress(max_new_tokens: int, tty: bool):
    """The per-token progress line on a terminal's stderr."""

    def progress(tok: int, res, stats: dict) -> None:
        if tty:
            output.echo(
                f"\r{len(res.generated_ids)}/{max_new_tokens} tokens  {res.decode_tok_per_s:.2f} tok/s  "
                f"expert cache hit {100 * stats['expert_cache_hit_rate']:.1f}%",
                err=True,
                end="",
            )

    return progress


def _summary(report, tty: bool) -> str:
    s = report.stats
    return (
        ("\r" if tty else "") + f"{len(report.generated_ids)} tokens  {report.tok_per_s:.2f} tok/s decode  "
        f"prefill {report.prefill_seconds:.2f}s  expert cache hit {100 * s['expert_cache_hit_rate']:.1f}% "
        f"(cap {s['cap']}/layer)  peak RSS {report.peak_rss_bytes / 2**20:.0f} MiB"
    )


@app.command("run")
def run_command(
    model_dir: Annotated[
        Path, typer.Argument(help="A converted container or a float / FP8 checkpoint directory.")
    ],
    prompt_ids: Annotated[
        str | None, typer.Option("--prompt-ids", help="Prompt token ids, e.g. 3,17,42.")
    ] = None,
    prompt: Annotated[
        str | None, typer.Option("--prompt", help="Prompt text (needs the model's tokenizer.json).")
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, max=MAX_NEW_TOKENS, help="Tokens to generate.")
    ] = 32,
    cap: Annotated[int | None, typer.Option("--cap", min=1, help="Experts cached per layer.")] = None,
    ram_gb: Annotated[
        float | None,
        typer.Option("--ram-gb", help="Memory budget in GiB (> 0; sets the cap when --cap is not given)."),
    ] = None,
    no_usage: Annotated[
        bool,
        typer.Option(
            "--no-usage",
            help="Do not record routing usage: .coli_usage is left untouched (colibri's USAGE_SAVE=0).",
        ),
    ] = False,
    usage_decay: UsageDecayOpt = 1.0,
    route_trace: RouteTraceOpt = None,
    ignore_eos: Annotated[
        bool, typer.Option("--ignore-eos", help="Do not stop at the end-of-sequence token.")
    ] = False,
    act_quant: Annotated[
        str | None,
        typer.Option(
            "--act-quant",
            help="Round activations as a family's own inference does: official (deepseek_v4: DeepSeek's "
            "UE8M0 e4m3 / e2m1 activation blocks, as colibri's c/deepseek_v4.c). Default: float activations.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Generate greedily; a progress / speed line goes to stderr.

    With --json the report is one line on stdout."""
    from colitools.runtime.run import run_model

    ids = _parse_ids(prompt_ids) if prompt_ids is not None else None
    tty = sys.stderr.isatty()
    report = run_model(
        model_dir,
        prompt_ids=ids,
        prompt=prompt,
        max_new_tokens=max_new_tokens,
        cap=cap,
        ram_gb=ram_gb,
        record_usage=not no_usage,
        stop_at_eos=not ignore_eos,
        progress=_progress(max_new_tokens, tty),
        route_trace=route_trace,
        usage_decay=usage_decay,
        act_quant=act_quant,
    )
    output.echo(_summary(report, tty), err=True)
    if report.usage_note:
        output.warn(report.usage_note)
    output.emit(as_json, report.to_json, _lines(report), one_line=True)
