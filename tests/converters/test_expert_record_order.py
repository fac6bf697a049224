"""docs/FORMATS.md §4 "pairs" layout (issue 25 item 5): an expert's record is its
codes (gate, up, down), then its scales (gate, up, down), then its biases (gate, up, down). Pinned by the bytes
of a hand-built source whose int8-row encoding is exact (every row's largest magnitude is 127, so its scale is
1.0 and its codes are the values themselves)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tinyckpt import write_tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.safetensors_io import read_header

H, I, E = 4, 2, 2
PROJ = ("gate", "up", "down")


def _weight(rng, O: int, In: int) -> np.ndarray:
    w = rng.integers(-126, 127, size=(O, In)).astype(np.float32)
    w[np.arange(O), rng.integers(0, In, size=O)] = 127.0  # row max |w| = 127 -> int8-row scale exactly 1
    return w


def _experts(rng) -> dict[str, np.ndarray]:
    """Every expert's projection weights and biases, by their per-expert names."""
    out = {}
    for e in range(E):
        for proj in PROJ:
            O, In = (H, I) if proj == "down" else (I, H)
            base = f"model.layers.0.mlp.experts.{e}.{proj}_proj"
            out[f"{base}.weight"] = _weight(rng, O, In)
            out[f"{base}.bias"] = rng.standard_normal(O).astype(np.float32)
    return out


def _source(folder, rng):
    """Per-expert tensors (a qwen3_moe layout with per-expert biases)."""
    tensors = {
        "model.layers.0.mlp.gate.weight": rng.standard_normal((E, H)).astype(np.float32),
        **_experts(rng),
    }
    config = {"model_type": "qwen3_moe", "hidden_size": H, "moe_intermediate_size": I, "num_experts": E,
              "num_experts_per_tok": 1, "num_hidden_layers": 1, "vocab_size": 8}  # fmt: skip
    _save(folder, tensors, config)
    return tensors


def _gpt_oss_source(folder, rng):
    """The same experts as gpt-oss stacks them: ``gate_up_proj [E, H, 2I]`` transposed, gate / up columns
    interleaved, ``down_proj [E, I, H]`` transposed, biases ``gate_up_proj_bias [E, 2I]`` (interleaved) and
    ``down_proj_bias [E, H]``."""
    want = _experts(rng)
    p = "model.layers.0.mlp.experts"
    gate_up, gate_up_bias = np.zeros((E, H, 2 * I), np.float32), np.zeros((E, 2 * I), np.float32)
    for e in range(E):
        gate_up[e][:, 0::2], gate_up[e][:, 1::2] = (
            want[f"{p}.{e}.gate_proj.weight"].T,
            want[f"{p}.{e}.up_proj.weight"].T,
        )
        gate_up_bias[e][0::2], gate_up_bias[e][1::2] = (
            want[f"{p}.{e}.gate_proj.bias"],
            want[f"{p}.{e}.up_proj.bias"],
        )
    tensors = {
        "model.layers.0.mlp.router.weight": rng.standard_normal((E, H)).astype(np.float32),
        f"{p}.gate_up_proj": gate_up, f"{p}.gate_up_proj_bias": gate_up_bias,
        f"{p}.down_proj": np.stack([want[f"{p}.{e}.down_proj.weight"].T for e in range(E)]),
        f"{p}.down_proj_bias": np.stack([want[f"{p}.{e}.down_proj.bias"] for e in range(E)]),
    }  # fmt: skip
    config = {"model_type": "gpt_oss", "hidden_size": H, "intermediate_size": I, "num_local_experts": E,
              "num_experts_per_tok": 1, "num_hidden_layers": 1, "vocab_size": 8}  # fmt: skip
    _save(folder, tensors, config)
    return want


def _save(folder, tensors, config) -> None:
    folder.mkdir()
    write_tensors(folder, tensors, 1)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("make", [_source, _gpt_oss_source], ids=["per-expert", "gpt-oss-stacks"])
def test_pairs_record_is_codes_then_scales_then_biases_each_gate_up_down(tmp_path, make):
    tensors = make(tmp_path / "src", np.random.default_rng(25))
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="int8-row", min_free_gb=0))
    (shard,) = sorted((tmp_path / "out").glob("model-*.safetensors"))
    header = read_header(shard)
    data = shard.read_bytes()
    for e in range(E):
        base = f"model.layers.0.mlp.experts.{e}"
        codes = [tensors[f"{base}.{p}_proj.weight"].astype(np.int8).tobytes() for p in PROJ]
        scales = [np.ones(tensors[f"{base}.{p}_proj.weight"].shape[0], np.float32).tobytes() for p in PROJ]
        biases = [tensors[f"{base}.{p}_proj.bias"].tobytes() for p in PROJ]
        record = b"".join(codes + scales + biases)
        first = header.tensors[f"{base}.gate_proj.weight"].begin
        assert data[first : first + len(record)] == record, f"expert {e}"
        names = [f"{base}.{p}_proj.weight" for p in PROJ] + [f"{base}.{p}_proj.weight.qs" for p in PROJ]
        names += [f"{base}.{p}_proj.bias" for p in PROJ]
        order = [n for n in header.tensors if n.startswith(base + ".")]
        assert order == names
