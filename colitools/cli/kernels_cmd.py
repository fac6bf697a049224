"""`colitools kernels`: whether the kernels (codecs, runtime) run compiled ahead of time here, and building them
once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import app
from colitools.cli.options import JsonOpt


def _lines(status: dict) -> Iterator[str]:
    for built in status.get("built_now", ()):
        yield f"built {built['file']} in {built['seconds']} s"
    for s in status["sets"]:
        if s["loaded"]:
            yield f"kernels ({s['set']}): compiled ahead of time ({s['file']})"
        else:
            yield f"kernels ({s['set']}): numba JIT; compiled-ahead module {s['reason']}"


@app.command("kernels")
def kernels_command(
    build: Annotated[
        bool,
        typer.Option(
            "--build",
            help="Compile the kernels (codecs, runtime) for this machine unless they are (~30 s; numba and a C "
            "compiler).",
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
    from colitools.runtime import kernels as _runtime  # noqa: F401  (declares the runtime's kernel set)

    built = aot.build_missing(force=force) if build else []
    status = aot.status()
    if built:
        status["built_now"] = built
    output.emit(as_json, lambda: status, _lines(status))
