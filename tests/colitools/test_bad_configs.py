"""Malformed ``config.json`` values, driven through the real console script (issue 9 item 6).

Every command that reads the model config (``run``, ``convert``, ``usage show``) validates it once, through the
config facts (``formats/model_config.py``): exit code != 0, exactly one stderr line ``colitools: error: ...``
naming config.json, the key and the value, never a traceback, and never a silent run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "oracles" / "olmoe"  # a tiny float OLMoE checkpoint, 6 experts, 2 layers

# (case id, config.json changes, key and value the error line must show)
BAD = [
    ("layers-a-word", {"num_hidden_layers": "two"}, ("num_hidden_layers", '"two"')),
    ("zero-heads", {"num_attention_heads": 0}, ("num_attention_heads", "0")),
    ("eos-not-ids", {"eos_token_id": [0, "x"]}, ("eos_token_id", '[0, "x"]')),
    ("zero-experts-per-token", {"num_experts_per_tok": 0}, ("num_experts_per_tok", "0")),
    ("more-experts-per-token-than-experts", {"num_experts_per_tok": 7}, ("num_experts_per_tok", "7", "6")),
    ("bool-for-int", {"hidden_size": True}, ("hidden_size", "true")),
    ("huge-int", {"num_hidden_layers": 10**40}, ("num_hidden_layers", "41 digits")),
    ("negative-expert-count", {"num_experts": -6}, ("num_experts", "-6")),
    ("float-for-int", {"vocab_size": 288.5}, ("vocab_size", "288.5")),
    ("eps-a-word", {"rms_norm_eps": "small"}, ("rms_norm_eps", '"small"')),
    ("rope-theta-a-word", {"rope_parameters": {"rope_type": "default", "rope_theta": "x"}},
     ("rope_parameters.rope_theta", '"x"')),
    ("conflicting-expert-counts", {"n_routed_experts": 8}, ("n_routed_experts = 8", "num_experts = 6")),
]  # fmt: skip


colitools = run_cli  # the real console script (cli_helpers)


def model_with(tmp_path: Path, changes: dict) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    for name in ("model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE / name, model / name)
    config = {**json.loads((FIXTURE / "config.json").read_text()), **changes}
    (model / "config.json").write_text(json.dumps(config))
    return model


def assert_config_error(result: subprocess.CompletedProcess[str], words: tuple[str, ...]) -> None:
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("colitools: error: "), lines[0]
    assert "config.json" in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("changes, words", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_run_refuses_a_malformed_config_in_one_line(tmp_path, changes, words):
    model = model_with(tmp_path, changes)
    assert_config_error(colitools("run", model, "--prompt-ids", "1,2", "--max-new-tokens", "1"), words)


@pytest.mark.parametrize("changes, words", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_convert_refuses_a_malformed_config_in_one_line(tmp_path, changes, words):
    model = model_with(tmp_path, changes)
    out = tmp_path / "out"
    assert_config_error(colitools("convert", model, out, "--min-free-gb", "0"), words)
    assert not list(out.glob("*.safetensors"))  # refused before any work


@pytest.mark.parametrize(
    "changes, words", [BAD[0][1:], BAD[4][1:], BAD[7][1:]], ids=[BAD[0][0], BAD[4][0], BAD[7][0]]
)
def test_usage_show_refuses_a_malformed_model_config_in_one_line(tmp_path, changes, words):
    model = model_with(tmp_path, changes)
    (model / ".coli_usage").write_bytes(b"")  # never read: the model's config is refused first
    assert_config_error(colitools("usage", "show", model / ".coli_usage", "--model", model), words)


def test_the_unchanged_fixture_runs_and_converts(tmp_path):
    """The same harness with a valid config succeeds (the refusals above are about the values)."""
    model = model_with(tmp_path, {})
    ok = colitools("run", model, "--prompt-ids", "1,2", "--max-new-tokens", "1", "--no-usage")
    assert ok.returncode == 0, ok.stderr
    done = colitools("convert", model, tmp_path / "out", "--min-free-gb", "0")
    assert done.returncode == 0, done.stderr
