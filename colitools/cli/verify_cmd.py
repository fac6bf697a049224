"""`colitools verify container DIR`, `colitools verify oracle ORACLE_DIR` and `colitools verify quality DIR`."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import verify_app
from colitools.cli.options import JsonOpt, ProgressOpt, TokenOpt
from colitools.cli.render import render_table
from colitools.formats.errors import EXIT_NOT_OK


def _container_lines(report) -> Iterator[str]:
    formats = ", ".join(f"{n} {k}" for k, n in sorted(report.formats.items())) or "none"
    yield f"{report.path}: {report.shards} shard(s), {report.tensors} tensors ({formats})"
    if report.hashed_files:
        yield (f"sha256 matched the manifest for {report.matched_files} of {report.hashed_files} file(s) "
               f"hashed, {report.matched_bytes:,} bytes")  # fmt: skip
    for p in report.problems:
        yield f"PROBLEM: {p}"
    yield "OK" if report.ok else f"NOT OK: {len(report.problems)} problem(s)"


@verify_app.command("container")
def verify_container_command(
    path: Annotated[Path, typer.Argument(help="A converted model directory (or one .safetensors file).")],
    no_hash: Annotated[
        bool, typer.Option("--no-hash", help="Check sizes only, skip sha256 of the shards.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Every shard valid, every tensor resolves, scales finite, manifest sizes and sha256 match.

    Exit 0 when sound, 4 when problems were found, 1 when the folder could not be read."""
    from colitools.verify.container import ContainerReport, verify_container

    # nothing could be checked (exit 1, the one error line): the failure object is still a report
    output.failure_fields(lambda error: ContainerReport(str(path), problems=[error]).to_json())
    report = verify_container(path, hashes=not no_hash, progress=not as_json and sys.stderr.isatty())
    output.emit(as_json, report.to_json, _container_lines(report))
    output.warn_each(report.warnings, as_json=as_json)
    if not report.ok:
        raise typer.Exit(EXIT_NOT_OK)


def _oracle_lines(report) -> Iterator[str]:
    rows = [
        [r.fixture, r.recipe, f"{r.greedy_matched}/{r.greedy_total}", f"{r.forced_matched}/{r.forced_total}",
         str(len(r.near_ties)), f"{r.logits_max_abs_diff:.2e}", str(len(r.format_mismatches)),
         "MATCH" if r.ok else "MISMATCH"]
        for r in report.results
    ]  # fmt: skip
    headers = [
        "fixture",
        "recipe",
        "greedy",
        "teacher-forced",
        "near-ties",
        "max |dlogit|",
        "format diffs",
        "verdict",
    ]
    yield render_table(headers, rows)
    for r in report.results:
        for line in (r.format_mismatches + r.container_problems)[:10]:
            yield f"  {r.fixture}/{r.recipe}: {line}"
        step = r.first_greedy_mismatch
        if step is not None:
            yield (f"  {r.fixture}/{r.recipe}: first greedy mismatch at step {step}: got "
                   f"{r.generated_ids[step:][:4]}, expected {r.expected_ids[step:][:4]}")  # fmt: skip


@verify_app.command("oracle")
def verify_oracle_command(
    fixture: Annotated[Path, typer.Argument(help="An oracle fixture folder, e.g. oracles/olmoe.")],
    recipe: Annotated[
        list[str] | None,
        typer.Option(
            "--recipe",
            "-r",
            help="Recipe to check (repeatable): f32, default, int3, mxfp4, planar; where the fixture has them "
            "native and target-NAME (--target NAME). Default: every recipe the fixture has a reference for.",
        ),
    ] = None,
    cap: Annotated[
        int | None, typer.Option("--cap", min=1, help="Experts cached per layer while running (default all).")
    ] = None,
    atol: Annotated[
        float, typer.Option("--atol", min=0, help="Tolerance on the last-position logits (>= 0).")
    ] = 1e-4,
    as_json: JsonOpt = False,
) -> None:
    """Convert FIXTURE with each recipe, run it, and compare every greedy token, every teacher-forced position
    and the last logits with the committed transformers reference. Exit 0 when all match, 4 otherwise."""
    from colitools.verify.oracle import verify_oracle

    def progress(r) -> None:
        if not as_json:
            output.echo(
                f"{r.fixture} / {r.recipe}: generated {' '.join(map(str, r.generated_ids))}", err=True
            )

    report = verify_oracle(fixture, recipe, cap=cap, atol=atol, progress=progress)
    if report.not_runnable is not None:  # one line, before any work: a family the runtime does not run
        raise typer.Exit(output.fail(report.not_runnable, EXIT_NOT_OK, prefix="colitools: "))
    output.emit(as_json, report.to_json, _oracle_lines(report))
    if not report.ok:
        raise typer.Exit(EXIT_NOT_OK)


def _figures(s) -> list[str]:
    """rel error, cosine, SQNR and max |error| of an ``ErrorStats`` as table cells."""
    rel = "0" if s.sse == 0 else f"{s.rel_error:.4g}"
    sqnr = "inf" if s.sse == 0 else f"{s.sqnr_db:.2f}"
    return [rel, f"{s.cosine:.6f}", sqnr, f"{s.max_abs:.4g}"]


def _quality_lines(report) -> Iterator[str]:
    from colitools.verify.quality import worst

    source = f"recomputed from {report.source}" if report.source else "as recorded at conversion"
    quantizer = f", quantizer {report.quantizer}" if report.quantizer else ""
    yield f"{report.path}: {len(report.tensors)} tensors, figures {source}{quantizer}"
    head = ["rel error", "cosine", "SQNR dB", "max |err|", "tensors"]
    for title, table, n in (
        ("role", report.per_role, Counter(t.role for t in report.tensors)),
        ("format", report.per_format, Counter(t.format for t in report.tensors)),
        ("layer", report.per_layer, Counter(t.layer for t in report.tensors)),
    ):
        yield ""
        rows = [["global" if k is None else str(k), *_figures(s), str(n[k])] for k, s in table.items()]
        yield render_table([title, *head], rows)
    yield ""
    yield render_table(["whole model", *head], [["all", *_figures(report.whole), str(len(report.tensors))]])
    top = worst(report)
    if top:
        yield ""
        yield render_table(["highest relative error", "format", *head[:4]],
                           [[t.name, t.format, *_figures(t.stats)] for t in top])  # fmt: skip
    if report.not_compared:
        yield ""
        yield f"not compared: {len(report.not_compared)} tensor(s), e.g. {report.not_compared[0][0]} ({report.not_compared[0][1]})"
    if report.plot:
        yield f"plot       {report.plot}"
    if report.source and report.recorded:
        yield (f"recorded figures: {report.recorded} tensors; {len(report.disagreements)} disagree with the "
               "recomputed ones")  # fmt: skip
        for d in report.disagreements[:20]:
            yield f"DISAGREE: {d.name}: {d.why}"
    elif report.source:
        yield "recorded figures: none in the manifest (nothing to compare)"
    if report.source and report.recorded:
        yield "OK" if report.ok else f"NOT OK: {len(report.disagreements)} tensor(s) disagree"


# verify quality's longer options, declared once here (the command's signature stays short)
_PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        metavar="OUT.png",
        help="Also draw the relative error per layer, one panel per role, one line per format (needs the "
        "extra: pip install 'colitools[plot]').",
    ),
]
_KldOpt = Annotated[
    bool,
    typer.Option(
        "--kld",
        help="Compare the models instead of the weights: the source (--source, default the manifest's) "
        "converted to f32 and this folder, both run teacher-forced over --prompt-ids or --text; KL divergence "
        "mean / median / p99 / max, top-1 agreement, |dp| of the source's top token, both perplexities.",
    ),
]
_TextOpt = Annotated[
    Path | None,
    typer.Option("--text", metavar="FILE", help="With --kld: a UTF-8 text file, tokenised by the model's tokenizer.json."),
]


@verify_app.command("quality")
def verify_quality_command(
    path: Annotated[Path, typer.Argument(help="A converted model directory (colitools convert's output).")],
    source: Annotated[
        str | None,
        typer.Option(
            "--source",
            help="The checkpoint it was converted from (a local folder or a Hugging Face repo id, as convert "
            "takes it): recompute every figure and compare with the recorded ones. Without it, the figures the "
            "conversion recorded in colitools.json.",
        ),
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option("--revision", help="Hub source revision (default: the commit the manifest recorded)."),
    ] = None,
    token: TokenOpt = None,
    plot: _PlotOpt = None,
    progress: ProgressOpt = None,
    kld: _KldOpt = False,
    prompt_ids: Annotated[
        str | None, typer.Option("--prompt-ids", help="With --kld: the token ids, e.g. 3,17,42 (at least 2).")
    ] = None,
    text: _TextOpt = None,
    cap: Annotated[
        int | None, typer.Option("--cap", min=1, help="With --kld: experts cached per layer.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """What the conversion lost, per tensor, role, layer and format: relative Frobenius error ||W'-W||/||W||,
    cosine, SQNR (dB) and max |error|; lossless tensors report 0.

    Exit 0 when reported, 4 when the recorded figures disagree with the recomputed ones (--source), 1 on errors
    (not a complete colitools conversion, a source that is not its source, no recorded figures and no
    --source), 2 on a usage error (--plot not *.png). With --kld: exit 0 when measured, 2 on usage errors (no
    tokens, fewer than 2, an id outside the vocabulary), 1 on errors (a model the runtime cannot run, no
    tokenizer.json for --text)."""
    if kld or prompt_ids is not None or text is not None or cap is not None:
        from colitools.cli.kld_cmd import kld_command

        return kld_command(path, source, kld=kld, prompt_ids=prompt_ids, text=text, cap=cap, revision=revision,
                           token=token, plot=plot, as_json=as_json)  # fmt: skip
    from colitools.verify.quality import weight_quality

    show = progress if progress is not None else (not as_json and sys.stderr.isatty())
    report = weight_quality(path, source, revision=revision, token=token, plot=plot, progress=show)
    output.emit(as_json, report.to_json, _quality_lines(report))
    output.warn_each(report.warnings, as_json=as_json)
    if not report.ok:
        raise typer.Exit(EXIT_NOT_OK)
