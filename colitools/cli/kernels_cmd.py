"""`colitools kernels`: whether the codecs' kernels run compiled ahead of time here, and building them once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt


def _lines(status: dict) -> Iterator[str]:
    built = status.get("built_now")
    if built is not None:
        yield f"built {built['file']} in {built['seconds']} s"
    if status["loaded"]:
        yield f"kernels: compiled ahead of time ({status['file']})"
    else:
        yield f"kernels: numba JIT; compiled-ahead module {status['reason']}"


@app.command("kernels")
def kernels_command(
    build: Annotated[
        bool,
        typer.Option(
            "--build",
            help="Compile the kernels for this machine unless they are (~20 s; numba and a C compiler).",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="With --build: compile even when they are current.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show whether convert, verify and run use their kernels compiled ahead of time (no numba start-up,
    ~0.5 s per process) or numba's JIT (the same code). --build compiles them for these sources on this CPU
    into the installed package (or, when it is read-only, ~/.cache/colitools/kernels); ./dev does it after
    installing."""
    if force and not build:
        raise typer.BadParameter(
            "only with --build (it compiles even when the kernels are current)", param_hint="'--force'"
        )
    from colitools.formats.kernels import aot

    built = None
    if build and (force or aot.current() is None):
        started = time.monotonic()
        path = aot.build()
        built = {"file": path, "seconds": round(time.monotonic() - started, 1)}
    status = aot.status()
    if built is not None:
        status["built_now"] = built
    output.emit(as_json, lambda: status, _lines(status))
