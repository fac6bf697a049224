"""``colitools convert SOURCE OUTDIR``: thin wrapper over ``colitools.converters.runner.convert``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from colitools.cli.app import app
from colitools.formats import layouts
from colitools.formats.format_names import recipe_format_summary
from colitools.formats.targets import help_text as targets_help

_FMT = recipe_format_summary()
_LAYOUTS = " | ".join(
    layout.option + (f" ({layout.stored})" if layout.stored != layout.option else "") for layout in layouts.LAYOUTS
)


@app.command("convert")
def convert_command(
    source: str = typer.Argument(..., help="A local model folder, or a Hugging Face repo id (org/name)."),
    outdir: Path = typer.Argument(..., help="Output folder (created; a rerun resumes in it)."),
    experts: str | None = typer.Option(
        None, "--experts", help=f"Routed experts format (default int4-g64): {_FMT}."
    ),
    dense: str | None = typer.Option(None, "--dense", help="Other 2-D weights (default int8-row)."),
    embed: str | None = typer.Option(None, "--embed", help="embed_tokens / lm_head (default int8-row)."),
    mtp: str | None = typer.Option(
        None, "--mtp", help="MTP layers, index >= num_hidden_layers (default int8-row)."
    ),
    group_size: int | None = typer.Option(None, "--group-size", help="Group size of int4-grouped choices."),
    layout: str = typer.Option(
        layouts.PAIRS.option,
        "--layout",
        help=f"Expert layout: {_LAYOUTS}. planar writes the routed experts only to the experts-int4g64/ sidecar "
        "(int4 experts, hidden and expert width multiples of 64), read by colibri's qwen38 engine "
        "(Q38_INT4_DIR); colibri's other engines read pairs experts from the main container and find none there.",
    ),
    towers: str | None = typer.Option(
        None, "--towers", help="Multimodal towers: keep (source dtype, unchanged; the default unless the target "
        "drops them) or drop (listed in the manifest)."
    ),
    target: str = typer.Option("generic", "--target", help=targets_help()),
    min_free_gb: float = typer.Option(
        5.0, "--min-free-gb", min=0, help="Free space to keep on the output volume (GB, >= 0)."
    ),
    on_low_disk: str = typer.Option(
        "wait", "--on-low-disk", help="Below the floor: wait (poll) | stop (exit 3)."
    ),
    keep_source: bool = typer.Option(
        False, "--keep-source/--no-keep-source", help="Keep downloaded source shards (a Hub source)."
    ),
    workers: int = typer.Option(1, "--workers", min=1, max=1024, help="Units converted in parallel processes."),
    token: str | None = typer.Option(None, "--token", help="Hugging Face token (default: HF_TOKEN / login)."),
    revision: str | None = typer.Option(None, "--revision", help="Hub branch, tag or commit (default main)."),
    dry_run: bool = typer.Option(
        False, "--dry-run",
        help="Print the plan (units, bytes, peak disk, formats per role: which format the routers, conv "
        "kernels, experts, attention ... get) and exit.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    progress: bool | None = typer.Option(
        None, "--progress/--no-progress", help="Progress bars on stderr (default: when stderr is a terminal)."
    ),
) -> None:
    """Convert a BF16/FP8 checkpoint into quantized byte-addressable safetensors, resumably."""
    # The converter multiplies no float matrices: OpenBLAS's thread pool would only cost start-up (~60 ms of
    # numpy's import) and a core spinning beside the encoders. Set before numpy's first import (no command
    # module imports it at module level); --workers processes inherit it.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert

    options = ConvertOptions(
        experts=experts, dense=dense, embed=embed, mtp=mtp, group_size=group_size, layout=layout, towers=towers,
        target=target,
        min_free_gb=min_free_gb, on_low_disk=on_low_disk, keep_source=keep_source, workers=workers,
        token=token, revision=revision, dry_run=dry_run, progress=progress,
    )  # fmt: skip
    summary = convert(source, outdir, options)
    for warning in summary.warnings:
        typer.echo(f"colitools: warning: {warning}", err=True)
    if json_out:
        typer.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        typer.echo(summary.text())
