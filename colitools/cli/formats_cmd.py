"""`colitools formats`: the format registry as a table (ordinal, name, bits/weight, byte formulas)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from colitools.cli.app import app
from colitools.cli.render import render_table


@app.command("formats")
def formats_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON for scripts.")] = False,
) -> None:
    """List the weight formats: ordinal, name, bits per weight and the weight/scale byte formulas for [O, I]."""
    from colitools.formats.inspect import describe_formats

    rows = describe_formats()
    if as_json:
        typer.echo(json.dumps([asdict(r) for r in rows], indent=2))
        return
    table = [
        [
            str(r.ord),
            r.name + ("" if r.written else " (read only)"),
            f"{r.bits_per_weight:.4g}" + (" (gs 64)" if r.group_sizes else ""),
            r.weight_bytes,
            r.scale_bytes,
            r.scale_tensor,
        ]
        for r in rows
    ]
    typer.echo(
        render_table(["ord", "name", "bits/weight", "weight bytes", "scale bytes", "scale tensor"], table)
    )
    grouped = next(r for r in rows if r.group_sizes)
    typer.echo(
        f"\nint4-grouped group sizes: {', '.join(map(str, grouped.group_sizes or ()))}. "
        "Bits/weight include scales, at I = 4096. Formats are resolved from these byte counts "
        "(see docs/FORMATS.md)."
    )
