"""A stdout closed before the command writes (``colitools ... | head``) ends the command quietly with exit 1, as
README's exit-code paragraph says: no traceback, no ``Exception ignored`` line, no error line (issue 43 item 7)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_helpers import COMMAND, cli_env

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "olmoe"


@pytest.mark.parametrize(
    "args",
    [("formats",), ("inspect", str(FIXTURE), "--json"), ("inspect", str(FIXTURE)),
     ("run", str(FIXTURE), "--prompt-ids", "1,2", "--max-new-tokens", "2", "--no-usage", "--json")],
    ids=["formats", "inspect-json", "inspect", "run-json"],
)  # fmt: skip
def test_a_closed_stdout_ends_quietly_with_exit_1(args):
    proc = subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    proc.stdout.close()  # the reader is gone before the command writes a byte (it starts in far more than this)
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 1, stderr
    # quiet: what the command says on stderr anyway (run's figures), nothing about the pipe
    assert not [line for line in stderr.splitlines() if "rror" in line or "Exception" in line or "Traceback" in line]
