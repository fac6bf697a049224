"""``colitools merge PART_DIR... OUT``: thin wrapper over ``colitools.converters.merge.merge``."""

from __future__ import annotations

from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt, ProgressOpt


@app.command("merge")
def merge_command(
    folders: Annotated[
        list[str],
        typer.Argument(
            metavar="PART_DIR... OUT",
            help="The folders of `convert --part 1/N` .. `N/N`, then the folder to create (absent or empty).",
        ),
    ],
    as_json: JsonOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Put the part folders of `colitools convert ... --part K/N` together into OUT, byte-identical to one
    machine's output: every part's manifest checked (same recipe, source, plan and N; each part once, none
    missing, each finished), every file's sha256 checked, files moved (one filesystem) or copied, OUT published
    whole or not at all. Refused: one line naming the folder and what differs, exit 1."""
    from colitools.converters.merge import merge
    from colitools.formats.errors import ParameterError

    if len(folders) < 2:
        raise ParameterError("give the part folders, then OUT (the folder to create)")
    report = merge(folders[:-1], folders[-1], progress=progress)
    output.emit(as_json, report.to_json, report.text())
