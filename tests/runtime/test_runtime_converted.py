"""End to end with the real converter: ``colitools convert`` output runs token-exactly against the oracle
reference of its recipe (one recipe per fixture, rotating, so every recipe and every fixture is covered;
``colitools verify oracle`` runs the full matrix)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from oracle_refs import ORACLES, RECIPES, check_against_reference, fixtures, native_fixtures, reference

_SCRIPT = Path(sys.executable).with_name("colitools")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "colitools"]
OPTIONS = {
    "f32": ["--experts", "f32", "--dense", "f32", "--embed", "f32"],
    "default": ["--experts", "int4-g64"],  # its reference's recipe (no option: MXFP4 experts are kept)
    "int3": ["--experts", "int3-g64"],
    "mxfp4": ["--experts", "mxfp4"],
    "planar": ["--layout", "planar"],
    "native": ["--experts", "native"],
}
CASES = [(fx, RECIPES[(i + 1) % len(RECIPES)]) for i, fx in enumerate(fixtures())]
CASES += [(fx, "native") for fx in native_fixtures()]  # every natively quantized source: its own recipe


@pytest.mark.slow
@pytest.mark.parametrize("fixture,recipe", CASES)
def test_converted_container_runs_token_exact(fixture, recipe, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "NO_COLOR": "1"}
    cmd = [*COMMAND, "convert", str(ORACLES / fixture), str(out), "--min-free-gb", "0", *OPTIONS[recipe]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    check_against_reference(out, fixture, reference(fixture, recipe), cap=2)
