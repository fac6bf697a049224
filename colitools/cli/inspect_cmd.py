"""`colitools inspect PATH`: every tensor of a file or model directory with its resolved format, and totals."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli.app import app
from colitools.cli.render import render_table


def _shape(dims: Sequence[int] | None) -> str:
    return "-" if dims is None else "[" + ", ".join(map(str, dims)) + "]"


@app.command("inspect")
def inspect_command(
    path: Annotated[
        Path, typer.Argument(help="A .safetensors file or a model directory.", show_default=False)
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON for scripts.")] = False,
    summary: Annotated[
        bool,
        typer.Option(
            "--summary",
            help="Only the shards, the totals and the formats per role (router, conv, routed experts, ...), "
            "no per-tensor rows.",
        ),
    ] = False,
) -> None:
    """Show every tensor's dtype, shape, bytes and resolved format (group size, stamp), totals per format, and
    formats per role (which format the routers, conv kernels, experts, attention ... got; --json:
    formats_per_role, the same counts as the converter's colitools.json)."""
    from colitools.formats.format_names import role_formats_line
    from colitools.formats.inspect import inspect_path, tensor_label

    report = inspect_path(path)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    n = len(report.shards)
    typer.echo(
        f"{report.path}: {n} shard{'s' * (n != 1)}, {len(report.tensors)} tensors, {report.total_bytes:,} bytes of "
        f"tensor data, layout {report.layout}"
        + (", index checked" if report.index else "")
        + (", shapes checked against config.json" if report.config_checked else "")
    )
    if not summary:
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
        typer.echo("")
        typer.echo(
            render_table(["tensor", "dtype", "shape", "[O, I]", "bytes", "format", "gs", "stamp"], rows)
        )
    if n > 1:
        typer.echo("")
        shard_rows = [[s.path, str(s.tensors), f"{s.data_bytes:,}", s.layout] for s in report.shards]
        typer.echo(render_table(["shard", "tensors", "bytes", "layout"], shard_rows))
    typer.echo("")
    typer.echo("formats per role:")
    for role, formats in report.formats_per_role.items():
        typer.echo(role_formats_line(role, formats))
    typer.echo("")
    total_rows = [[t.format, str(t.tensors), f"{t.bytes:,}"] for t in report.totals]
    typer.echo(render_table(["format", "weights", "bytes (with scales)"], total_rows))
    for warning in report.warnings:
        typer.echo(f"warning: {warning}", err=True)
