"""Routing usage recording (.coli_usage, docs/FORMATS.md §6) and the ``colitools run`` command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from oracle_refs import ORACLES, reference

from colitools.formats.usage import UsageHistory, engine_id, read_usage, write_usage
from colitools.runtime import generate, load_model

_SCRIPT = Path(sys.executable).with_name("colitools")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "colitools"]


def run_cli(*args) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture
def olmoe(tmp_path) -> Path:
    return Path(shutil.copytree(ORACLES / "olmoe", tmp_path / "olmoe"))


def test_usage_is_recorded_per_selection_and_accumulates(olmoe):
    ids = reference("olmoe", "f32")["prompt_ids"]
    for _ in range(2):
        with load_model(olmoe) as m:
            generate(m, ids, 4)
    h = read_usage(olmoe / ".coli_usage", n_layers=2, n_experts=6, engine="olmoe")
    tokens = len(ids) + 3  # prompt + the 3 tokens fed back
    assert h.engine_id == engine_id("olmoe") and h.total == 2 * 2 * tokens * 2  # 2 runs, 2 layers, top-2
    assert all(t == 2 * tokens * 2 for t in h.layer_totals().values())


def test_no_usage_writes_nothing_and_another_engines_history_is_left_alone(olmoe):
    with load_model(olmoe, record_usage=False) as m:
        generate(m, [1, 2, 3], 2)
    assert not (olmoe / ".coli_usage").exists()
    other = UsageHistory(2, 6, engine_id("mixtral"), {(0, 1): 5})
    write_usage(olmoe / ".coli_usage", other)
    before = (olmoe / ".coli_usage").read_bytes()
    with load_model(olmoe) as m:
        generate(m, [1, 2, 3], 2)
    assert m.usage_note and "not updated" in m.usage_note
    assert (olmoe / ".coli_usage").read_bytes() == before


def test_dense_layers_have_no_usage_records(tmp_path):
    d = Path(shutil.copytree(ORACLES / "qwen3_moe", tmp_path / "q"))  # layer 1 is dense (mlp_only_layers)
    with load_model(d) as m:
        generate(m, [1, 2, 3], 2)
    h = read_usage(d / ".coli_usage", n_layers=2, n_experts=8, engine="qwen3_moe")
    assert set(h.layer_totals()) == {0}


def test_run_json_with_prompt_ids(olmoe):
    ref = reference("olmoe", "f32")
    ids = ",".join(map(str, ref["prompt_ids"]))
    r = run_cli("run", olmoe, "--prompt-ids", ids, "--max-new-tokens", "32", "--cap", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_ids"] == ref["prompt_ids"] and out["generated_ids"] == ref["generated_ids"]
    assert out["cap"] == 2 and 0 <= out["expert_cache_hit_rate"] <= 1 and out["tok_per_s"] > 0
    assert isinstance(out["text"], str)
    assert "tok/s" in r.stderr and "expert cache hit" in r.stderr
    assert (olmoe / ".coli_usage").stat().st_size > 0


def test_run_with_prompt_text_uses_the_models_tokenizer(olmoe):
    ref = reference("olmoe", "f32")
    r = run_cli("run", olmoe, "--prompt", ref["prompt_text"], "--max-new-tokens", "8", "--no-usage", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_ids"] == ref["prompt_ids"] and out["generated_ids"] == ref["generated_ids"][:8]
    assert not (olmoe / ".coli_usage").exists()


@pytest.mark.parametrize(
    "args,words,code",
    [
        (["--prompt-ids", "1,x"], ["--prompt-ids"], None),
        (["--prompt-ids", "1,100000"], ["outside the vocabulary"], None),
        ([], ["exactly one of --prompt-ids and --prompt"], 2),  # no prompt: a usage error (docs/CLI.md)
    ],
)
def test_run_errors_are_one_line(olmoe, args, words, code):
    r = run_cli("run", olmoe, *args)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert code is None or r.returncode == code, r.returncode
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("colitools: error: ")
    assert all(w in lines[0] for w in words)


def test_run_prompt_text_without_tokenizer_is_an_error(olmoe):
    (olmoe / "tokenizer.json").unlink()
    r = run_cli("run", olmoe, "--prompt", "hello")
    assert r.returncode != 0 and "no tokenizer.json" in r.stderr
