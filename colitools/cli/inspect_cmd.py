"""`colitools inspect PATH`: every tensor of a file or model directory with its resolved format, and totals."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt
from colitools.cli.render import render_table


def _shape(dims: Sequence[int] | None) -> str:
    return "-" if dims is None else "[" + ", ".join(map(str, dims)) + "]"


def _tensor_rows(report) -> list[list[str]]:
    from colitools.formats.inspect import tensor_label

    rows = []
    for t in report.tensors:
        if t.kind == "scale":
            fmt, gs = "(scale)", "-"
        elif t.format is None:
            fmt, gs = "-", "-"
        else:
            fmt, gs = tensor_label(t) or "-", str(t.format.group_size or "-")
        rows.append(
            [
                t.name,
                t.dtype,
                _shape(t.shape),
                _shape(t.logical_shape),
                f"{t.nbytes:,}",
                fmt,
                gs,
                t.stamp or "-",
            ]
        )
    return rows


def _lines(report, summary: bool) -> Iterator[str]:
    from colitools.formats.format_names import role_formats_line

    n = len(report.shards)
    yield (
        f"{report.path}: {n} shard{'s' * (n != 1)}, {len(report.tensors)} tensors, {report.total_bytes:,} bytes of "
        f"tensor data, layout {report.layout}"
        + (", index checked" if report.index else "")
        + (", shapes checked against config.json" if report.config_checked else "")
    )
    if not summary:
        yield ""
        yield render_table(
            ["tensor", "dtype", "shape", "[O, I]", "bytes", "format", "gs", "stamp"], _tensor_rows(report)
        )
    if n > 1:
        yield ""
        shard_rows = [[s.path, str(s.tensors), f"{s.data_bytes:,}", s.layout] for s in report.shards]
        yield render_table(["shard", "tensors", "bytes", "layout"], shard_rows)
    yield ""
    yield "formats per role:"
    for role, formats in report.formats_per_role.items():
        yield role_formats_line(role, formats)
    if report.source_encodings:  # a source checkpoint: its natively quantized weights, companions included
        yield ""
        yield "source encodings per role:"
        for role, encodings in report.source_encodings.items():
            counts = "; ".join(f"{c['tensors']} x {e} ({c['bytes']:,} bytes)" for e, c in encodings.items())
            yield f"  {role:<16} {counts}"
    yield ""
    total_rows = [[t.format, str(t.tensors), f"{t.bytes:,}"] for t in report.totals]
    yield render_table(["format", "weights", "bytes (with scales)"], total_rows)


def _summary_json(report) -> dict:
    """``--json --summary``: the report without its per-tensor rows (their count instead)."""
    data = report.to_json()
    data["tensor_count"] = len(data.pop("tensors"))
    return data


@app.command("inspect")
def inspect_command(
    path: Annotated[
        Path, typer.Argument(help="A .safetensors file or a model directory.", show_default=False)
    ],
    as_json: JsonOpt = False,
    summary: Annotated[
        bool,
        typer.Option(
            "--summary",
            help="Only the shards, the totals and the formats per role (router, conv, routed experts, ...), "
            "no per-tensor rows (with --json too).",
        ),
    ] = False,
) -> None:
    """Show every tensor's dtype, shape, bytes and resolved format (group size, stamp), totals per format, and
    formats per role (which format the routers, conv kernels, experts, attention ... got; --json:
    formats_per_role, the same counts as the converter's colitools.json)."""
    from colitools.formats.inspect import inspect_path

    report = inspect_path(path)
    output.emit(
        as_json, (lambda: _summary_json(report)) if summary else report.to_json, _lines(report, summary)
    )
    output.warn_each(report.warnings, as_json=as_json)
