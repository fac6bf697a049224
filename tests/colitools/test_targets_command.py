"""Issue 43 item 10: `convert --help` keeps one line per target; `colitools targets` has each one in full."""

from __future__ import annotations

import json
import re

from cli_helpers import run_cli

from colitools.formats.targets import TARGETS


def _target_help(width: int) -> list[str]:
    """The lines of `convert --help`'s --target entry, at a terminal ``width`` columns wide."""
    result = run_cli("convert", "--help", env={"COLUMNS": str(width)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("--target "))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("--"))
    return lines[start:end]


def test_convert_help_has_one_line_per_target_and_no_loader_functions():
    for width in (80, 200):
        entry = _target_help(width)
        text = "\n".join(entry)
        for t in TARGETS.values():
            engine = t.loader.split()[0]  # the engine's source file, c/olmoe.c
            rows = [line for line in entry if re.match(rf"\s+{t.name}\s+{re.escape(engine)}", line)]
            assert len(rows) == 1, (t.name, text)
            loader_detail = t.loader.removeprefix(engine).strip()
            assert loader_detail not in text and t.help not in text
        assert all(len(line) <= width for line in entry), text
        assert len(entry) <= len(TARGETS) + 4, text


def test_targets_lists_every_target_in_full():
    result = run_cli("targets")
    assert result.returncode == 0, result.stderr
    flat = " ".join(result.stdout.split())
    for t in TARGETS.values():
        assert f"{t.name}: colibri's {t.engine}" in flat
        assert f"reads it: {' '.join(t.loader.split())}" in flat and " ".join(t.help.split()) in flat
    data = json.loads(run_cli("targets", "--json").stdout)
    assert data == [t.describe() for t in TARGETS.values()]
    assert [d["name"] for d in data] == list(TARGETS) and data[0]["model_types"] is None
    assert all(d["engine"].startswith("c/") and d["loader"].startswith(d["engine"]) for d in data)
