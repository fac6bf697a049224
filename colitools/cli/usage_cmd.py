"""``colitools usage show FILE``: what a ``.coli_usage`` routing history holds; ``colitools usage pairs TRACE...``:
colibri's ``.coli_pairs`` co-activation table from ``ROUTE_TRACE`` streams (docs/FORMATS.md §6)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import usage_app
from colitools.cli.options import JsonOpt


def _lines(report, top: int) -> Iterator[str]:
    summary = report.summary
    yield f"file       {report.file}"
    origin = "the model" if report.geometry_from_model else "its records"
    kind = f"legacy headerless file, geometry from {origin}" if summary.headerless else "header"
    if summary.iku1:
        kind = "IKU1 dense binary header"
    yield f"geometry   {summary.n_layers} layers x {summary.n_experts} experts ({kind})"
    if summary.iku1:
        yield f"engine     {summary.engine!r}: colibri's inkling engine (IKU1 layout, no engine id)"
    elif summary.engine_id is None:
        yield "engine     unknown (no version header)"
    else:
        name = f" = {summary.engine!r}" if summary.engine else ""
        yield f"engine     id {summary.engine_id}{name}"
    if report.engine_matches_model is False:
        yield f"warning:   the model's engine is {report.model_type!r} (id {report.model_engine_id}), not this one"
    yield (
        f"totals     {summary.total_selections} selections, {summary.records} experts with records, "
        f"{summary.layers_with_records} layers with records"
    )
    if summary.skipped_records:
        yield f"skipped    {summary.skipped_records} record(s) outside the geometry (not counted)"
    if summary.hottest:
        yield ""
        yield f"hottest experts per layer (top {top}: expert=count, share of the layer)"
        for layer in sorted(summary.hottest):
            layer_total = summary.layer_totals[layer]
            items = "  ".join(f"{e}={n} ({n / layer_total:.1%})" for e, n in summary.hottest[layer])
            yield f"  layer {layer:>3}  {layer_total:>10}  {items}"
    yield ""
    basis = f"expert bytes from {report.model}" if summary.sizes_known else "experts assumed equal in size"
    yield f"coverage (share of selections served by the hottest X% of routed-expert bytes; {basis})"
    for percent, share in summary.coverage:
        yield f"  {percent:>3}%  {share:7.1%}"
    if report.mirror is not None:
        yield ""
        yield (
            f"mirror     {report.mirror.plan_file}: {len(report.mirror.files)} shard(s), "
            f"{len(report.on_mirror)} experts on the mirror"
            + (" (outlined in the heatmap)" if report.plot else "")
        )
    if report.plot is not None:
        yield ""
        yield f"heatmap    {report.plot}"


@usage_app.command("show")
def show_command(
    file: Annotated[Path, typer.Argument(help="The .coli_usage file.")],
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="Model directory for geometry and expert sizes (default: the file's directory when it holds "
            "shards), or a planned mirror (mirror stage's directory): its model, and the experts its plan put on "
            "the mirror (outlined in --plot).",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Hottest experts listed per layer.")] = 5,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="OUT.png",
            help="Also draw the history as a layer x expert heatmap (needs the extra: pip install "
            "'colitools[plot]').",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Geometry, engine, totals, the hottest experts per layer and the coverage curve."""
    from colitools.mirror.usage_report import usage_report

    report = usage_report(file, model=model, top=top, plot=plot)
    output.emit(as_json, report.to_json, _lines(report, top))


def _pairs_lines(table) -> Iterator[str]:
    for trace, n in table.positions.items():
        yield f"{trace}: {n} positions"
    yield f"wrote {table.out}: {len(table.entries)} conditioning entries"


@usage_app.command("pairs")
def pairs_command(
    traces: Annotated[list[Path], typer.Argument(help="ROUTE_TRACE files (colitools run --route-trace).")],
    out: Annotated[Path, typer.Option("--out", help="The .coli_pairs table to write (an existing file only if it is one).")],
    top: Annotated[
        int, typer.Option("--top", min=1, help="Co-activated experts kept per entry (route_pairs.py's M).")
    ] = 16,
    depth: Annotated[
        int, typer.Option("--depth", min=1, help="Layers ahead paired with each layer (route_pairs.py: 2).")
    ] = 2,
    as_json: JsonOpt = False,
) -> None:
    """Build the cross-layer co-activation table colibri's COUPLE= prefetcher reads, as route_pairs.py does."""
    from colitools.formats.route_trace import write_route_pairs

    table = write_route_pairs(traces, out, top=top, depth=depth)
    output.emit(as_json, table.to_json, _pairs_lines(table))
