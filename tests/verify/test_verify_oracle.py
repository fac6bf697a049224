"""Every committed oracle fixture x recipe converts and runs token-exactly (the CI gate of issue 4)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colitools.verify.oracle import fixture_recipes, unsupported_model_type, verify_recipe

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
ALL_FIXTURES = sorted(p.name for p in ORACLES.iterdir() if (p / "reference").is_dir())
# The fixtures of families the runtime runs (all of them today: tests/test_oracle_fixtures.py checks it).
FIXTURES = [f for f in ALL_FIXTURES if unsupported_model_type(ORACLES / f) is None]
CASES = [(f, r) for f in FIXTURES for r in fixture_recipes(ORACLES / f)]


def test_every_fixture_has_all_five_recipes():
    assert len(FIXTURES) >= 10
    for f in ALL_FIXTURES:
        assert set(fixture_recipes(ORACLES / f)) >= {"f32", "default", "int3", "mxfp4", "planar"}, f


@pytest.mark.parametrize(("fixture", "recipe"), CASES, ids=[f"{f}-{r}" for f, r in CASES])
def test_fixture_recipe_is_token_exact(fixture, recipe, tmp_path):
    res = verify_recipe(ORACLES / fixture, recipe, workdir=tmp_path)
    assert res.format_mismatches == []
    assert res.container_problems == []
    assert res.generated_ids == res.expected_ids
    assert res.forced_matched == res.forced_total and res.near_ties == []
    assert res.logits_max_abs_diff <= 1e-4
    assert res.ok


@pytest.mark.parametrize("cap", [1, 2])
def test_expert_cache_placement_never_changes_tokens(cap, tmp_path):
    for fixture in ("deepseek_v3", "qwen2_moe"):
        res = verify_recipe(ORACLES / fixture, "default", cap=cap, workdir=tmp_path)
        assert res.ok, (fixture, cap, res.to_json())


def _copy_fixture(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copytree(ORACLES / name, dest)
    return dest


def test_a_wrong_reference_token_is_reported_as_mismatch_with_exit_4(tmp_path):
    fixture = _copy_fixture(tmp_path, "olmoe")
    ref_path = fixture / "reference" / "f32.json"
    ref = json.loads(ref_path.read_text())
    ref["generated_ids"][5] = (ref["generated_ids"][5] + 1) % 288
    ref_path.write_text(json.dumps(ref))
    proc = subprocess.run(
        [sys.executable, "-m", "colitools", "verify", "oracle", str(fixture), "--recipe", "f32"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 4, proc.stderr
    assert "MISMATCH" in proc.stdout
    assert "first greedy mismatch at step 5" in proc.stdout


def test_perturbed_reference_logits_fail_the_tolerance(tmp_path):
    import io

    import numpy as np
    import zstandard

    fixture = _copy_fixture(tmp_path, "qwen3_moe")
    path = fixture / "reference" / "f32.logits.zst"
    logits = np.load(io.BytesIO(zstandard.ZstdDecompressor().decompress(path.read_bytes())))
    logits[1, 3] += 1e-3  # tokens unchanged, logits off by 10x the tolerance
    buf = io.BytesIO()
    np.save(buf, logits)
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    res = verify_recipe(fixture, "f32", workdir=tmp_path)
    assert res.generated_ids == res.expected_ids
    assert not res.ok and res.logits_max_abs_diff > 1e-4


def test_unknown_recipe_is_one_clear_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "colitools", "verify", "oracle", str(ORACLES / "olmoe"), "--recipe", "int9"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert "no reference for recipe 'int9'" in proc.stderr and "Traceback" not in proc.stderr
