"""`colitools verify container DIR` and `colitools verify oracle ORACLE_DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli.app import verify_app

EXIT_NOT_OK = 4  # the check ran and found problems (1 is reserved for errors that stopped it)


@verify_app.command("container")
def verify_container_command(
    path: Annotated[Path, typer.Argument(help="A converted model directory (or one .safetensors file).")],
    no_hash: Annotated[bool, typer.Option("--no-hash", help="Check sizes only, skip sha256 of the shards.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON for scripts.")] = False,
) -> None:
    """Every shard valid, every tensor resolves, scales finite, manifest sizes and sha256 match.

    Exit 0 when sound, 4 when problems were found, 1 when the folder could not be read."""
    from colitools.formats.errors import FormatError
    from colitools.verify.container import ContainerReport, verify_container

    try:
        report = verify_container(path, hashes=not no_hash, progress=not as_json and sys.stderr.isatty())
    except FormatError as exc:  # nothing could be checked: exit 1 (the one error line), still a report for scripts
        if as_json:
            failed = ContainerReport(str(path), problems=[str(exc)])
            typer.echo(json.dumps({**failed.to_json(), "error": str(exc)}, indent=2))
        raise
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        formats = ", ".join(f"{n} {k}" for k, n in sorted(report.formats.items())) or "none"
        typer.echo(f"{report.path}: {report.shards} shard(s), {report.tensors} tensors ({formats})")
        if report.hashed_files:
            typer.echo(f"sha256 matched the manifest for {report.matched_files} of {report.hashed_files} file(s) "
                       f"hashed, {report.matched_bytes:,} bytes")  # fmt: skip
        for w in report.warnings:
            typer.echo(f"warning: {w}")
        for p in report.problems:
            typer.echo(f"PROBLEM: {p}")
        typer.echo("OK" if report.ok else f"NOT OK: {len(report.problems)} problem(s)")
    if not report.ok:
        raise typer.Exit(EXIT_NOT_OK)


@verify_app.command("oracle")
def verify_oracle_command(
    fixture: Annotated[Path, typer.Argument(help="An oracle fixture folder, e.g. oracles/olmoe.")],
    recipe: Annotated[
        list[str] | None,
        typer.Option("--recipe", "-r", help="Recipe to check (repeatable): f32, default, int3, mxfp4, planar; where the "
                     "fixture has them native and target-NAME (--target NAME). "
                     "Default: every recipe the fixture has a reference for."),
    ] = None,
    cap: Annotated[int | None, typer.Option("--cap", min=1, help="Experts cached per layer while running (default all).")] = None,
    atol: Annotated[float, typer.Option("--atol", min=0, help="Tolerance on the last-position logits (>= 0).")] = 1e-4,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON for scripts.")] = False,
) -> None:
    """Convert FIXTURE with each recipe, run it, and compare every greedy token, every teacher-forced position
    and the last logits with the committed transformers reference. Exit 0 when all match, 4 otherwise."""
    from colitools.cli.render import render_table
    from colitools.verify.oracle import (
        fixture_recipes,
        not_runnable_message,
        unsupported_model_type,
        verify_recipe,
    )

    names = recipe or fixture_recipes(fixture)
    mt = unsupported_model_type(fixture)
    if mt is not None:  # one line, before any work: a family the runtime does not run
        typer.echo(f"colitools: {not_runnable_message(fixture, mt)}", err=True)
        raise typer.Exit(EXIT_NOT_OK)
    results = []
    for name in names:
        res = verify_recipe(fixture, name, cap=cap, atol=atol)
        results.append(res)
        if not as_json:
            typer.echo(f"{res.fixture} / {name}: generated {' '.join(map(str, res.generated_ids))}", err=True)
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in results], indent=2))
    else:
        rows = [
            [r.fixture, r.recipe, f"{r.greedy_matched}/{r.greedy_total}", f"{r.forced_matched}/{r.forced_total}",
             str(len(r.near_ties)), f"{r.logits_max_abs_diff:.2e}", str(len(r.format_mismatches)),
             "MATCH" if r.ok else "MISMATCH"]
            for r in results
        ]  # fmt: skip
        typer.echo(render_table(
            ["fixture", "recipe", "greedy", "teacher-forced", "near-ties", "max |dlogit|", "format diffs", "verdict"],
            rows))  # fmt: skip
        for r in results:
            for line in (r.format_mismatches + r.container_problems)[:10]:
                typer.echo(f"  {r.fixture}/{r.recipe}: {line}")
            if r.first_greedy_mismatch is not None:
                typer.echo(f"  {r.fixture}/{r.recipe}: first greedy mismatch at step {r.first_greedy_mismatch}: "
                           f"got {r.generated_ids[r.first_greedy_mismatch:][:4]}, "
                           f"expected {r.expected_ids[r.first_greedy_mismatch:][:4]}")
    if not all(r.ok for r in results):
        raise typer.Exit(EXIT_NOT_OK)
