"""The typer application object and its sub-groups; command modules register on these.

``rich_markup_mode=None`` everywhere: help is plain click text (no boxes, no ``<bool>`` after flags), and
usage errors reach ``colitools.cli.main``, which prints them as one line.
"""

from __future__ import annotations

from typing import Annotated

import typer

from colitools.cli import output

_PLAIN = {"rich_markup_mode": None, "add_completion": False, "pretty_exceptions_enable": False}

app = typer.Typer(
    name="colitools",
    help="Convert MoE checkpoints into byte-addressable quantized containers, run and verify them, plan mirrors.",
    no_args_is_help=True,
    **_PLAIN,
)
verify_app = typer.Typer(help="Verify containers and oracle runs.", no_args_is_help=True, **_PLAIN)
mirror_app = typer.Typer(
    help="Dual-SSD mirrors: plan, stage, verify (driven by routing history).", no_args_is_help=True, **_PLAIN
)
usage_app = typer.Typer(help="Routing usage history (.coli_usage).", no_args_is_help=True, **_PLAIN)
app.add_typer(verify_app, name="verify")
app.add_typer(mirror_app, name="mirror")
app.add_typer(usage_app, name="usage")


def package_version() -> str:
    """The installed distribution's version (package metadata), else the source tree's ``__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("colitools")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree that is not installed
        from colitools import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        output.echo(f"colitools {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    """Convert MoE checkpoints into byte-addressable quantized containers, run and verify them, plan mirrors."""
