"""`colitools formats`: the format registry as a table (ordinal, name, the convert options that write it,
bits/weight, byte formulas)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt
from colitools.cli.render import render_table
from colitools.formats.format_names import GROUPED_PREFIXES, recipe_format_summary


def _options_text(options: tuple[str, ...]) -> str:
    """``f32, bf16``; a grouped family's options folded into ``int4-g{16..256}``; ``-`` when none writes it."""
    for prefix, _ in GROUPED_PREFIXES.values():
        grouped = [o for o in options if o.startswith(prefix)]
        if len(grouped) > 1:
            sizes = [o.removeprefix(prefix) for o in grouped]
            options = (f"{prefix}{{{sizes[0]}..{sizes[-1]}}}",)
    return ", ".join(options) or "-"


def _lines(rows) -> Iterator[str]:
    table = [
        [
            str(r.ord),
            r.name + ("" if r.written else " (read only)"),
            _options_text(r.options),
            f"{r.bits_per_weight:.4g}" + (" (gs 64)" if r.group_sizes else ""),
            r.weight_bytes,
            r.scale_bytes,
            r.scale_tensor,
        ]
        for r in rows
    ]
    headers = ["ord", "name", "convert options", "bits/weight", "weight bytes", "scale bytes", "scale tensor"]
    yield render_table(headers, table)
    grouped = next(r for r in rows if r.group_sizes)
    yield (
        f"\nint4-grouped group sizes: {', '.join(map(str, grouped.group_sizes or ()))}. "
        "Bits/weight include scales, at I = 4096. Formats are resolved from these byte counts "
        "(see docs/FORMATS.md).\nconvert --experts/--dense/--embed/--mtp take: "
        f"{recipe_format_summary()}; every command names formats by these options (floats by dtype: f32, bf16, "
        "f16)."
    )


@app.command("formats")
def formats_command(as_json: JsonOpt = False) -> None:
    """List the weight formats: ordinal, name, the convert options that write it, bits per weight and the
    weight/scale byte formulas for [O, I]."""
    from colitools.formats.inspect import describe_formats

    rows = describe_formats()
    output.emit(as_json, lambda: [asdict(r) for r in rows], _lines(rows))
