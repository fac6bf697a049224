"""``colitools usage show FILE``: what a ``.coli_usage`` routing history holds (docs/FORMATS.md §6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli.app import usage_app


@usage_app.command("show")
def show_command(
    file: Annotated[Path, typer.Argument(help="The .coli_usage file.")],
    model: Annotated[
        Path | None,
        typer.Option("--model", help="Model directory for geometry and expert sizes (default: the file's "
                     "directory when it holds shards)."),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Hottest experts listed per layer.")] = 5,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Geometry, engine, totals, the hottest experts per layer and the coverage curve."""
    from colitools.formats.usage import engine_id, read_usage
    from colitools.mirror.scan import discover_shards, model_geometry
    from colitools.mirror.usage_report import summarize_usage

    model_dir = model
    if model_dir is None and any(p.is_file() for p in file.parent.glob("*.safetensors")):
        model_dir = file.parent
    geometry = model_geometry(model_dir) if model_dir is not None else None
    history = read_usage(
        file,
        n_layers=geometry.n_layers if geometry else None,
        n_experts=geometry.n_experts if geometry else None,
        explicit=True,  # the user named the file: show it whatever engine wrote it
    )
    expert_bytes: dict[tuple[int, int], int] | None = None
    if model_dir is not None:
        expert_bytes = {}
        for shard in discover_shards([model_dir], None, geometry.n_experts if geometry else None):
            for key, n in shard.expert_bytes.items():
                expert_bytes[key] = expert_bytes.get(key, 0) + n
    summary = summarize_usage(history, expert_bytes, top=top)
    model_engine = geometry.engine if geometry else None

    if json_output:
        data = summary.to_json()
        data["file"] = str(file)
        data["model"] = str(model_dir) if model_dir is not None else None
        data["model_type"] = model_engine
        data["engine_matches_model"] = (
            None if model_engine is None or history.engine_id is None else history.engine_id == engine_id(model_engine)
        )
        print(json.dumps(data, indent=2))
        return

    print(f"file       {file}")
    kind = "legacy headerless file, geometry from " + ("the model" if geometry and geometry.n_layers else "its records") \
        if summary.headerless else "header"
    print(f"geometry   {summary.n_layers} layers x {summary.n_experts} experts ({kind})")
    if summary.engine_id is None:
        print("engine     unknown (no version header)")
    else:
        name = f" = {summary.engine!r}" if summary.engine else ""
        print(f"engine     id {summary.engine_id}{name}")
    if model_engine is not None and history.engine_id is not None and history.engine_id != engine_id(model_engine):
        print(f"warning:   the model's engine is {model_engine!r} (id {engine_id(model_engine)}), not this one")
    print(f"totals     {summary.total_selections} selections, {summary.records} experts with records, "
          f"{summary.layers_with_records} layers with records")
    if summary.skipped_records:
        print(f"skipped    {summary.skipped_records} record(s) outside the geometry (not counted)")
    if summary.hottest:
        print()
        print(f"hottest experts per layer (top {top}: expert=count, share of the layer)")
        for layer in sorted(summary.hottest):
            layer_total = summary.layer_totals[layer]
            items = "  ".join(f"{e}={n} ({n / layer_total:.1%})" for e, n in summary.hottest[layer])
            print(f"  layer {layer:>3}  {layer_total:>10}  {items}")
    print()
    basis = "expert bytes from " + str(model_dir) if summary.sizes_known else "experts assumed equal in size"
    print(f"coverage (share of selections served by the hottest X% of routed-expert bytes; {basis})")
    for percent, share in summary.coverage:
        print(f"  {percent:>3}%  {share:7.1%}")
