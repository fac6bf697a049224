"""The typer application object and its sub-groups; command modules register on these."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="colitools",
    help="Convert MoE checkpoints into byte-addressable quantized containers, run and verify them, plan mirrors.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
verify_app = typer.Typer(help="Verify containers and oracle runs.", no_args_is_help=True)
mirror_app = typer.Typer(help="Dual-SSD mirrors: plan, stage, verify (driven by routing history).", no_args_is_help=True)
usage_app = typer.Typer(help="Routing usage history (.coli_usage).", no_args_is_help=True)
app.add_typer(verify_app, name="verify")
app.add_typer(mirror_app, name="mirror")
app.add_typer(usage_app, name="usage")
