"""NaN / inf anywhere is refused at conversion, the F32 tensors of rule 2 too (routers, norms, biases), and
``verify container`` reports a non-finite value in an output float tensor (issue 43 item 2)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import one_line_error, run_cli  # noqa: E402
from tinyckpt import Tiny, make_checkpoint, write_tensors  # noqa: E402

ROUTER = "model.layers.1.mlp.gate.weight"  # rule 2: F32 always
NORM = "model.layers.0.post_attention_layernorm.weight"
BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"
FINAL_NORM = "model.norm.weight"


def _poison(tensors, name, flat, value):
    a = np.array(tensors[name])
    a.reshape(-1)[flat] = value
    tensors[name] = a


CASES = {  # tensor, flat index, value -> the index the error line names
    "router-nan": (ROUTER, 70, np.nan, "[1, 6]"),
    "norm-inf": (NORM, 5, np.inf, "[5]"),
    "bias-nan": (BIAS, 2, np.nan, "[2]"),
    "final-norm-ninf": (FINAL_NORM, 0, -np.inf, "[0]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("recipe", [(), ("--experts", "f32", "--dense", "f32", "--embed", "f32")], ids=["default", "f32"])
def test_non_finite_f32_tensor_is_refused_naming_tensor_index_and_count(tmp_path, case, recipe):
    name, flat, value, index = CASES[case]
    src = tmp_path / "src"
    tensors = make_checkpoint(src, Tiny(layers=2))
    _poison(tensors, name, flat, value)
    _poison(tensors, name, flat + 1, value)  # two of them: the count is the tensor's
    (src / "model.safetensors").unlink()
    write_tensors(src, tensors, 1)
    out = tmp_path / "out"
    result = run_cli("convert", src, out, "--min-free-gb", "0", "--no-progress", *recipe)
    one_line_error(result, f"tensor {name}: non-finite value", f"at {index}", "(2 non-finite in total)", code=1)
    assert not (out / "config.json").exists()  # not marked complete: nothing of it is a model


def test_verify_container_reports_a_non_finite_float_tensor(tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(layers=2))
    out = tmp_path / "out"
    assert run_cli("convert", tmp_path / "src", out, "--min-free-gb", "0", "--no-progress").returncode == 0
    assert run_cli("verify", "container", out).returncode == 0
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    shard = bad / index["weight_map"][FINAL_NORM]
    data = bytearray(shard.read_bytes())
    n = int.from_bytes(data[:8], "little")
    begin, _ = json.loads(data[8 : 8 + n])[FINAL_NORM]["data_offsets"]
    at = 8 + n + begin + 4 * 3  # its fourth value (F32)
    data[at : at + 4] = np.array([np.nan], np.float32).tobytes()
    shard.write_bytes(bytes(data))
    result = run_cli("verify", "container", bad)
    assert result.returncode == 4 and "Traceback" not in result.stderr, result.stdout + result.stderr
    problems = [line for line in result.stdout.splitlines() if line.startswith("PROBLEM")]
    assert any(f"float tensor {FINAL_NORM} has 1 non-finite value(s), first at flat index 3" in p for p in problems), (
        result.stdout
    )
