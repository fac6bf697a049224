"""Qwen3.8's PLE hash comes from config.json; a checkpoint whose saved hash buffers disagree is refused in one line
(exit 1), not run with other n-gram ids. The token-exact oracle checks are tests/runtime's per-fixture ones."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from colitools.runtime.qwen38 import ngram_multipliers

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "qwen38"
BUFFER = "model.language_model.layers.0.ple.ple_embedding.layer_multipliers"


def _saved_multipliers() -> np.ndarray:
    blob = (FIXTURE / "model.safetensors").read_bytes()
    n = int.from_bytes(blob[:8], "little")
    a, b = json.loads(blob[8 : 8 + n])[BUFFER]["data_offsets"]
    return np.frombuffer(blob[8 + n + a : 8 + n + b], dtype="<i8")


def test_hash_multipliers_from_the_config_are_the_ones_transformers_saved():
    cfg = json.loads((FIXTURE / "config.json").read_text())["text_config"]
    got = ngram_multipliers(cfg["vocab_size"], cfg["ngram_size"], 0, cfg["seed"])
    assert np.array_equal(got, _saved_multipliers())


def test_a_checkpoint_with_other_hash_buffers_is_one_line(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FIXTURE, src, ignore=shutil.ignore_patterns("reference"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["text_config"]["seed"] += 1  # the config now implies other multipliers than the saved ones
    (src / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "colitools", "run", str(src), "--prompt-ids", "5,6,7", "--max-new-tokens",
                        "2"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("colitools: error: ") and "layer_multipliers" in lines[0]
    ), lines
