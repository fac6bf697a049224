"""Option declarations shared by several commands (typer ``Annotated`` aliases, one help text each).

A command declares an option of its own inline, in the same ``Annotated`` style. An option's Python name is the
library parameter it is passed to (``budget_bytes`` for ``--budget-gib``): a library message naming that
parameter then prints as the flag (``output.with_flags``). Module level imports typer only (``--help`` stays
fast); a parser imports its library function when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JSON_HELP = 'Print the result as JSON on stdout for scripts; a failure too, as {"ok": false, "error": ..., "exit_code": N}.'


def _gib(parameter: str, *, positive: bool):
    """A parser of a GiB option into whole bytes (``mirror.plan.gib_to_bytes``, exact for decimal input)."""

    def parse(text: str) -> int:
        from colitools.mirror.plan import gib_to_bytes

        return gib_to_bytes(text, parameter, positive=positive)

    return parse


JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
ProgressOpt = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress", help="Progress bars on stderr (default: when stderr is a terminal)."
    ),
]

# upload | convert --upload-repo
RepoIdArg = Annotated[
    str, typer.Argument(help="Hugging Face model repo id (org/name); created when missing.")
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", help="Hugging Face token (default: HF_TOKEN / hf auth login).")
]

# mirror plan | stage | verify
ModelOpt = Annotated[Path, typer.Option("--model", help="Primary model directory (the shards).")]
MirrorOpt = Annotated[Path, typer.Option("--mirror", help="Mirror directory on the second drive.")]
UsageOpt = Annotated[
    Path | None,
    typer.Option(
        "--usage",
        help="Routing history (default MODEL/.coli_usage); naming it accepts another engine's history.",
    ),
]
BudgetOpt = Annotated[
    int,
    typer.Option(
        "--budget-gib",
        metavar="GIB",
        parser=_gib("budget_bytes", positive=True),
        help="Most GiB to copy (> 0).",
    ),
]
ReserveOpt = Annotated[
    int,
    typer.Option(
        "--reserve-gib", metavar="GIB", parser=_gib("reserve_bytes", positive=False),
        help="GiB to leave free on the mirror drive (>= 0).",
    ),
]  # fmt: skip
DEFAULT_RESERVE_GIB = "10"  # mirror.plan.DEFAULT_RESERVE_GIB, as typed (the parser turns it into bytes)
SourceDirOpt = Annotated[
    list[Path] | None,
    typer.Option("--source-dir", help="Extra shard directory of a split model (repeatable)."),
]
WeightsOpt = Annotated[
    str | None, typer.Option("--disk-weights", help="Read-bandwidth weights primary,mirror (e.g. 9,3).")
]
ProbeOpt = Annotated[bool, typer.Option("--probe", help="Measure both drives' sequential read bandwidth.")]
