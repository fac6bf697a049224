"""``colitools convert SOURCE OUTDIR``: thin wrapper over ``colitools.converters.runner.convert``."""

from __future__ import annotations

import json
import os

import typer

from colitools.cli.app import app
from colitools.formats import layouts
from colitools.formats.format_names import recipe_format_summary
from colitools.formats.targets import TARGETS

_FMT = recipe_format_summary()
_TARGETS = "; ".join(f"{t.name} ({t.loader})" for t in TARGETS.values())
_LAYOUTS = " | ".join(
    layout.option + (f" ({layout.stored})" if layout.stored != layout.option else "") for layout in layouts.LAYOUTS
)


def _output_folder(value: str) -> str:
    if value == "":  # as a Path it would be ".": a conversion into the current folder
        raise typer.BadParameter("an empty path; give the folder to convert into")
    return value


@app.command("convert")
def convert_command(
    source: str = typer.Argument(..., help="A local model folder, or a Hugging Face repo id (org/name)."),
    outdir: str = typer.Argument(
        ..., help="Output folder (created; a rerun resumes in it).", callback=_output_folder
    ),
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
    towers: str = typer.Option(
        "keep", "--towers", help="Multimodal towers: keep (source dtype, unchanged) or drop (listed in the manifest)."
    ),
    target: str = typer.Option(
        "generic", "--target", help=f"Whose loader reads the output: {_TARGETS}. olmoe: merged int8 experts "
        "(...experts.{E}.merged_weight + .qs), dense tensors f32 or bf16; model_type olmoe only. qwen36: merged "
        "int8-row / int4-row / int4-g{gs} experts (signed nibbles), float dense tensors renamed "
        "model.language_model. -> model., flat config.json, qwen36_meta.json; model_type qwen3_5_moe only. "
        "kimi_k3: mxfp4 experts in the engine's slot order, f32_load tensors kept float, int8-row or int4-g64 "
        "(I % 64 == 0) projections; model_type kimi_k3 only. glm53: int4-g64 experts in the engine's slot "
        "order, float or int4-g64 projections; model_type glm5_next only. deepseek_v4: the released "
        "checkpoint's names and dtypes (fp8-e8m0 projections: F8_E4M3 + F8_E8M0 .scale per 128x128 block, mxfp4 "
        "experts as I8 .weight + F8_E8M0 .scale, BF16 norms / router / compressor, F32 sinks and hc_*), "
        "config.json with compress_ratios / num_hash_layers; model_type deepseek_v4 only. inkling: the text "
        "names c/inkling.c looks up, one fused expert stack per layer (gate_up_proj / down_proj: int4-row or "
        "int8-row U8 rows + .qs, or f32 / bf16), shared experts as float stacks, towers and MTP left out; "
        "model_type inkling_mm_model only. See docs/FORMATS.md §4 Targets.",
    ),
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
