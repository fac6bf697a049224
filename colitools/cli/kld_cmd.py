"""``colitools verify quality --kld``: the model-level half of ``verify quality`` (verify/kld.py), called by the
command in ``verify_cmd.py``: the tokens (``--prompt-ids`` as ``run`` reads them, or ``--text FILE`` through the
model's tokenizer.json), the comparison, the one small table or ``--json`` report.

Exit codes: 0 the divergence was measured (it is a measurement: no threshold); 2 a usage error (neither or both
of ``--prompt-ids`` / ``--text``, fewer than 2 tokens, an id outside the vocabulary, a text file that cannot be
read or is not UTF-8, ``--prompt-ids`` / ``--text`` / ``--cap`` without ``--kld``, ``--plot`` with it); 1 anything else that stopped it (malformed ``--prompt-ids``, as ``run``; no
tokenizer.json for ``--text``; a model the runtime cannot run; a source it cannot convert; no source given and
none in the manifest).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from colitools.cli import output
from colitools.cli.render import render_table


def _lines(report) -> Iterator[str]:
    yield f"{report.output} against {report.source} run at f32: {report.positions} positions"
    rows = [
        ["mean KLD", f"{report.mean_kld:.6f}"],
        ["median KLD", f"{report.median_kld:.6f}"],
        ["99th percentile KLD", f"{report.p99_kld:.6f}"],
        ["max KLD", f"{report.max_kld:.6f}"],
        ["top-1 agreement", f"{100 * report.top1_agreement:.2f}%"],
        ["mean |dp| of the source's top token", f"{report.mean_abs_dp_top:.6f}"],
        ["mean dp of the next token", f"{report.mean_dp_target:+.6f}"],
        ["RMS dp of the next token", f"{report.rms_dp_target:.6f}"],
        ["perplexity, source (f32)", f"{report.ppl_ref:.4f}"],
        ["perplexity, converted", f"{report.ppl_test:.4f}"],
    ]
    yield render_table(["statistic", "value"], rows)


def kld_command(
    output_dir: Path, source: str | None, *, kld: bool, prompt_ids: str | None, text: Path | None, cap: int | None,
    revision: str | None, token: str | None, plot: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """Measure the KL divergence of ``output_dir`` against ``source`` (None: the manifest's) over the tokens of
    ``prompt_ids`` or ``text`` and print the report. Called for ``kld`` and for any of its options: one given
    without ``kld`` (or ``plot``, a weight-level option, with it) is refused rather than ignored."""
    from colitools.cli.run_cmd import _parse_ids
    from colitools.formats.errors import ParameterError
    from colitools.verify.kld import model_kld, text_token_ids

    if not kld:
        raise ParameterError(
            "`prompt_ids`, `text` and `cap` are options of `kld` (the model-level comparison)"
        )
    if plot is not None:
        raise ParameterError("`plot` draws the weight-level figures; it does not apply with `kld`")
    if (prompt_ids is None) == (text is None):
        raise ParameterError(
            "give exactly one of `prompt_ids` and `text` (the tokens both models are run on)"
        )
    ids = _parse_ids(prompt_ids) if prompt_ids is not None else text_token_ids(output_dir, text)
    report = model_kld(source, output_dir, ids, cap=cap, revision=revision, token=token)
    output.emit(as_json, report.to_json, _lines(report))
