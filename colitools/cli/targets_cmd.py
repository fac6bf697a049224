"""`colitools targets`: every `convert --target`, with the engine that reads it and its layout in full (the detail
`convert --help` leaves out: one line per target there)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt

_GRAIN = {"tensor": "per tensor", "expert": "per expert", "layer": "per layer", "uniform": "once for all of them"}


def _lines(targets) -> Iterator[str]:
    for i, t in enumerate(targets):
        if i:
            yield ""
        types = ", ".join(t.model_types) if t.model_types is not None else "any model type"
        yield f"{t.name}: colibri's {t.engine} ({types})"
        yield from textwrap.wrap(f"reads it: {t.loader}", 100, initial_indent="  ", subsequent_indent="    ")
        if t.help:
            yield from textwrap.wrap(t.help, 100, initial_indent="  ", subsequent_indent="  ")
        if t.refused:
            yield from textwrap.wrap(f"refused: {t.refused}", 100, initial_indent="  ", subsequent_indent="    ")
        yield f"  a size budget chooses the routed experts' formats {_GRAIN[t.expert_granularity]}"
    yield ""
    yield "convert --target NAME writes the layout; the default (no --target) is generic. See docs/FORMATS.md §4."


@app.command("targets")
def targets_command(as_json: JsonOpt = False) -> None:
    """List every convert --target: the colibri engine that reads it, the model types it runs, the functions
    that read the layout and what it writes."""
    from colitools.formats.targets import TARGETS

    targets = list(TARGETS.values())
    output.emit(as_json, lambda: [t.describe() for t in targets], _lines(targets))
