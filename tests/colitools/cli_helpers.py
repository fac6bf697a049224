"""Driving the real ``colitools`` console script in a subprocess, for the CLI tests of this folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(sys.executable).with_name("colitools")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "colitools"]
# wide, plain output: help texts and tables are not wrapped or coloured differently per terminal
CLI_ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, **CLI_ENV, **(extra or {})}


def run_cli(
    *args: str | os.PathLike[str], env: dict[str, str] | None = None, timeout: float = 300,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``colitools ARGS...``, output captured as text."""
    return subprocess.run(
        [*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=cli_env(env), cwd=cwd
    )


def colitools(*args: str | os.PathLike[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``run_cli`` with extra environment variables as keywords: ``colitools("convert", src, out,
    HF_HUB_OFFLINE="1")``."""
    return run_cli(*args, env=env)


def one_line_error(result: subprocess.CompletedProcess[str], *words: str, code: int | None = None) -> str:
    """The refusal is exactly one ``colitools: error:`` line containing ``words``, no traceback, and the exit
    code ``code`` (any non-zero code when None); returns the line."""
    if code is None:
        assert result.returncode != 0, result.stdout
    else:
        assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("colitools: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
