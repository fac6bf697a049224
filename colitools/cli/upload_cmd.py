"""``colitools upload OUTDIR REPO_ID``: thin wrapper over ``colitools.converters.publish.upload_output``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt, ProgressOpt, RepoIdArg, TokenOpt


@app.command("upload")
def upload_command(
    outdir: Annotated[
        Path, typer.Argument(help="A complete colitools output folder (convert wrote colitools.json).")
    ],
    repo_id: RepoIdArg,
    revision: Annotated[
        str | None,
        typer.Option("--revision", help="Branch to commit to (default main; created when missing)."),
    ] = None,
    private: Annotated[
        bool, typer.Option("--private", help="Create the repo private (a new repo only).")
    ] = False,
    create_pr: Annotated[bool, typer.Option("--create-pr", help="Open a pull request against main.")] = False,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Upload a converted folder to a Hugging Face model repo with a generated README.md model card (source repo
    and commit, recipe, formats, fallbacks, engine, sizes). Refuses an incomplete conversion or a file whose
    size differs from colitools.json; the Hub checks every file against the manifest's sha256. A rerun after an
    interruption sends only what the Hub does not have yet."""
    from colitools.converters.publish import upload_output

    report = upload_output(
        outdir, repo_id, revision=revision, private=private, create_pr=create_pr, token=token,
        progress=_bars(progress, as_json),
    )  # fmt: skip
    output.emit(as_json, report.to_json, [report.text()])


def _bars(progress: bool | None, as_json: bool) -> bool:
    """huggingface_hub's bars: as asked, else on a terminal and not with --json."""
    import sys

    return progress if progress is not None else (not as_json and sys.stderr.isatty())
