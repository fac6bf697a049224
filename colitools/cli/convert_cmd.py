"""``colitools convert SOURCE OUTDIR``: thin wrapper over ``colitools.converters.runner.convert``."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt, ProgressOpt
from colitools.formats import layouts
from colitools.formats.errors import ParameterError
from colitools.formats.format_names import recipe_format_summary
from colitools.formats.targets import GENERIC as targets_default
from colitools.formats.targets import TARGETS

_FMT = recipe_format_summary()
_LAYOUTS = " | ".join(
    layout.option + (f" ({layout.stored})" if layout.stored != layout.option else "")
    for layout in layouts.LAYOUTS
)
# one line per target (click keeps a paragraph that starts with \b as it is); `colitools targets` has the detail
_TARGET_HELP = "Whose engine reads the output (colitools targets: each in full):\n\n\b\n" + "\n".join(
    f"{t.name:<13}{t.engine}" + ("" if t.model_types else " (any model type)") for t in TARGETS.values()
)
_LAYOUT_HELP = (
    f"Expert layout: {_LAYOUTS}. planar writes the routed experts only to the experts-int4g64/ sidecar "
    "(int4 experts, hidden and expert width multiples of 64), read by colibri's qwen38 engine "
    "(Q38_INT4_DIR); colibri's other engines read pairs experts from the main container and find none there, "
    "so only the qwen38 target takes planar. qpack (the qwen36 target only) writes them as MLX-affine codes "
    "(--experts affine4-g64, the default, or affine4/affine8-g32/64/128) into a QPACK v1 container beside the "
    "snapshot, read by colibri's newer qwen36 engine (QWEN36_QPACK). "
    f"Default {layouts.PAIRS.option} (the qwen38 target: planar)."
)
_QUANTIZER_HELP = (
    "How int8-row / int4 / int3-g64 / int2-row scales are chosen: rtn (amax / qmax, colibri's own converters' "
    "bytes; the default) or mse (per group the scale of least squared error, never worse than rtn; negative "
    "scales only where the target's engine was run on them: generic with the pairs layout, olmoe, inkling). "
    "Same bytes per weight either way."
)
_TOWERS_HELP = (
    "Multimodal towers: keep (source dtype, unchanged; the default unless the target drops them) or drop (listed "
    "in the manifest)."
)
_EXPERTS_DOWN_HELP = (
    "The routed experts' down projections in another format than --experts (default: the same). With --target "
    "qwen36 and int4 experts, int8-row writes colibri's mixed slab (convert_qwen36.py --down-bits 8); the other "
    "merged and fused targets read one format per expert."
)
_BUDGET_HELP = (
    "instead of --experts / --dense / --embed / --mtp: every tensor's format chosen among those the target reads, "
    "to least squared error (measured on the source first, cached in OUTDIR) within the budget "
    "(docs/FORMATS.md §12)."
)
_TargetSizeOpt = Annotated[
    str | None,
    typer.Option("--target-size", help=f"Output tensor bytes at most SIZE (25GiB, 380GB, 1.5TB, bytes), {_BUDGET_HELP}"),
]
_TargetBpwOpt = Annotated[
    float | None, typer.Option("--target-bpw", help=f"Output bits per weight at most BITS, {_BUDGET_HELP}")
]
_UsageOpt = Annotated[
    str | None,
    typer.Option("--usage", help="With a budget: a routing history (.coli_usage, IKU1 or a route trace) weighting "
                 "each routed expert by its share of its layer's selections."),
]  # fmt: skip
_KEEP_SOURCE_HELP = "Keep downloaded source shards (a Hub source)."
_DEFAULT_STREAMS = 12  # converters/options.py DEFAULT_DOWNLOAD_STREAMS (tests/converters/test_download_streams.py)
_STREAMS_HELP = "Parallel HTTP Range streams per downloaded Hub file (each resumable; 1: one stream per file)."
_UPLOAD_HELP = (
    "Once the output is complete, upload it to this Hugging Face model repo (org/name) with a model card, as "
    "`colitools upload OUTDIR REPO_ID` does (the same --token). The repo id and the token are checked first."
)
_StreamUploadOpt = Annotated[
    bool,
    typer.Option("--stream-upload", help="With --upload-repo: upload each unit's files as soon as they are "
                 "written and delete them here once the Hub holds them (local disk: about one unit); main gets "
                 "the whole output in one commit at the end."),
]  # fmt: skip
_DRY_RUN_HELP = (
    "Print the plan (units, bytes, peak disk, formats per role: which format the routers, conv "
    "kernels, experts, attention ... get) and exit."
)


# options declared once here (the command's signature stays short)
_MinFreeOpt = Annotated[
    float, typer.Option("--min-free-gb", min=0, help="Free space to keep on the output volume (GB, >= 0).")
]
_OnLowDiskOpt = Annotated[str, typer.Option("--on-low-disk", help="Below the floor: wait (poll) | stop (exit 3).")]
_WorkersOpt = Annotated[int, typer.Option("--workers", min=1, max=1024, help="Units converted in parallel processes.")]
_StreamsOpt = Annotated[int, typer.Option("--download-streams", min=1, max=64, help=_STREAMS_HELP)]
_ReplaceOpt = Annotated[
    bool,
    typer.Option("--replace", help="OUTDIR holds another conversion of this source (another budget, recipe or "
                 "quantizer): convert it again with these options, copying every tensor whose source, format and "
                 "options are unchanged from it, replacing its files one unit at a time (docs/FORMATS.md §10)."),
]  # fmt: skip
_PartOpt = Annotated[
    str | None,
    typer.Option("--part", metavar="K/N", help="Convert only part K of N (1-based) of the units into OUTDIR, "
                 "downloading only their shards; `colitools merge` puts the N part folders together."),
]  # fmt: skip


@app.command("convert")
def convert_command(
    source: Annotated[str, typer.Argument(help="A local model folder, or a Hugging Face repo id (org/name).")],
    # a str, not a Path: Path("") is ".", and an empty path is a usage error of `convert`, not the current folder
    outdir: Annotated[str, typer.Argument(help="Output folder (created; a rerun resumes in it).")],
    experts: Annotated[
        str | None, typer.Option("--experts", help=f"Routed experts (int4-g64, MXFP4/INT4: native): {_FMT}.")
    ] = None,
    dense: Annotated[str | None, typer.Option("--dense", help="Other 2-D weights (default int8-row).")] = None,
    embed: Annotated[
        str | None, typer.Option("--embed", help="embed_tokens / lm_head (default int8-row).")
    ] = None,
    mtp: Annotated[
        str | None, typer.Option("--mtp", help="MTP layers, index >= num_hidden_layers (default int8-row).")
    ] = None,
    experts_down: Annotated[str | None, typer.Option("--experts-down", help=_EXPERTS_DOWN_HELP)] = None,
    group_size: Annotated[
        int | None, typer.Option("--group-size", help="Group size of int4-grouped choices.")
    ] = None,
    layout: Annotated[str | None, typer.Option("--layout", help=_LAYOUT_HELP)] = None,
    towers: Annotated[str | None, typer.Option("--towers", help=_TOWERS_HELP)] = None,
    target: Annotated[str | None, typer.Option("--target", help=_TARGET_HELP)] = None,
    quantizer: Annotated[str, typer.Option("--quantizer", help=_QUANTIZER_HELP)] = "rtn",
    target_size: _TargetSizeOpt = None,
    target_bpw: _TargetBpwOpt = None,
    usage: _UsageOpt = None,
    min_free_gb: _MinFreeOpt = 5.0,
    on_low_disk: _OnLowDiskOpt = "wait",
    keep_source: Annotated[
        bool, typer.Option("--keep-source/--no-keep-source", help=_KEEP_SOURCE_HELP)
    ] = False,
    workers: _WorkersOpt = 1,
    download_streams: _StreamsOpt = _DEFAULT_STREAMS,
    token: Annotated[
        str | None, typer.Option("--token", help="Hugging Face token (default: HF_TOKEN / login).")
    ] = None,
    revision: Annotated[
        str | None, typer.Option("--revision", help="Hub branch, tag or commit (default main).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help=_DRY_RUN_HELP)] = False,
    replace: _ReplaceOpt = False,
    upload_repo: Annotated[str | None, typer.Option("--upload-repo", help=_UPLOAD_HELP)] = None,
    stream_upload: _StreamUploadOpt = False,
    part: _PartOpt = None,
    as_json: JsonOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Convert a float (BF16, F16, F32), FP8 or natively quantized (MXFP4, INT4 compressed-tensors, NVFP4,
    MXFP8, DeepSeek-V4.1's FP8 / FP4 UE8M0) checkpoint into quantized byte-addressable safetensors, resumably."""
    _one_blas_thread()
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert

    options = ConvertOptions(
        experts=experts, dense=dense, embed=embed, mtp=mtp, experts_down=experts_down, group_size=group_size,
        layout=layout, towers=towers,
        target=target if target is not None else targets_default, quantizer=quantizer,
        target_size=target_size, target_bpw=target_bpw, usage=usage,
        min_free_gb=min_free_gb, on_low_disk=on_low_disk, keep_source=keep_source, workers=workers, replace=replace,
        download_streams=download_streams, upload_repo=upload_repo, stream_upload=stream_upload,
        token=token, revision=revision, dry_run=dry_run, progress=progress, part=part,
    )  # fmt: skip
    if upload_repo is not None and part is not None:  # before any work
        raise ParameterError("`upload_repo` uploads a whole output: merge the parts, then `colitools upload`")
    _report(convert(source, outdir, options), options, outdir, as_json=as_json)


def _report(summary, options, outdir: str, *, as_json: bool) -> None:
    """The summary's warnings, then the summary (and what was streamed), or the upload after the conversion."""
    for warning in summary.warnings:
        output.warn(warning)
    if options.upload_repo is None or options.dry_run or options.stream_upload:
        from colitools.converters.publish import report_line

        uploaded = [report_line(summary.upload)] if summary.upload else []
        output.emit(as_json, summary.to_dict, [*summary.text().splitlines(), *uploaded])
        return
    _upload_after(summary, outdir, options.upload_repo, token=options.token, as_json=as_json,
                  progress=options.progress)  # fmt: skip


def _one_blas_thread() -> None:
    """The converter multiplies no float matrices: OpenBLAS's thread pool would only cost start-up (~60 ms of
    numpy's import) and a core spinning beside the encoders. Set before numpy's first import (no command module
    imports it at module level); --workers processes inherit it."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _upload_after(summary, outdir: str, repo_id: str, *, token, as_json: bool, progress: bool | None) -> None:
    """``--upload-repo``: the finished output goes to the Hub; one report holds both results."""
    from colitools.converters.publish import upload_output

    bars = progress if progress is not None else (not as_json and sys.stderr.isatty())
    report = upload_output(outdir, repo_id, token=token, progress=bars)
    output.emit(
        as_json, lambda: {**summary.to_dict(), "upload": report.to_json()},
        [*summary.text().splitlines(), report.text()],
    )  # fmt: skip
