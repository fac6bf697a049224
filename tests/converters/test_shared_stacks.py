"""Stacked shared experts (Inkling native ``mlp.shared_experts.shared_w13_weight [n, 2I, H]`` with gate and up rows
interleaved, ``shared_w2_weight [n, H, I]``; transformers' ``shared_experts.gate_proj [n, I, H]`` stacks) are split
along their first axis into ``mlp.shared_experts.{k}.{gate,up,down}_proj.weight`` under ``--dense``
(docs/FORMATS.md "Stacked shared experts"). Expected values are slices of the source written here by hand
(transformers' loader de-interleaves ``shared_w13_weight`` with gate = even rows, up = odd rows)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError
from colitools.formats.safetensors_io import SafetensorsFile, SafetensorsWriter
from colitools.verify.container import verify_container

INKLING = Path(__file__).resolve().parents[2] / "oracles" / "inkling"
P = "model.llm.layers.1.mlp.shared_experts"


def read_all(folder: Path) -> dict[str, np.ndarray]:
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        f = SafetensorsFile(shard)
        out.update({n: f.read(n) for n in f.tensors})
        f.close()
    return out


def test_inkling_shared_w13_is_split_per_shared_expert_with_interleaved_rows(tmp_path):
    src = read_all(INKLING)
    w13, w2 = src[f"{P}.shared_w13_weight"], src[f"{P}.shared_w2_weight"]  # [2, 128, 64], [2, 64, 64]
    convert(str(INKLING), tmp_path / "o", ConvertOptions(experts="f32", dense="f32", embed="f32", progress=False))
    assert verify_container(tmp_path / "o").problems == []
    out = read_all(tmp_path / "o")
    assert not any(n.endswith(("shared_w13_weight", "shared_w2_weight")) for n in out)
    for k in range(2):
        assert np.array_equal(out[f"{P}.{k}.gate_proj.weight"], w13[k][0::2])
        assert np.array_equal(out[f"{P}.{k}.up_proj.weight"], w13[k][1::2])
        assert np.array_equal(out[f"{P}.{k}.down_proj.weight"], w2[k])
    manifest = json.loads((tmp_path / "o" / "colitools.json").read_text())
    assert manifest["formats_per_role"]["shared experts"] == {"f32": 2 * 2 * 3}


def test_shared_stacks_get_the_dense_format(tmp_path):
    convert(str(INKLING), tmp_path / "o", ConvertOptions(progress=False))  # default: --dense int8-row
    manifest = json.loads((tmp_path / "o" / "colitools.json").read_text())
    assert manifest["formats_per_role"]["shared experts"] == {"int8-row": 2 * 2 * 3}
    assert manifest["fallbacks"] == []


def _write(folder: Path, config: dict, tensors: dict[str, np.ndarray]) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    entries = [(n, "F32", tuple(v.shape)) for n, v in tensors.items()]
    w = SafetensorsWriter(folder / "model.safetensors", entries, {"format": "pt"})
    for n, v in tensors.items():
        w.write(n, memoryview(np.ascontiguousarray(v).reshape(-1).view(np.uint8)))
    w.close()


def test_separate_shared_stacks_split_along_the_first_axis(tmp_path):
    # transformers' InklingSharedExperts parameters as a save_original_format=False export writes them
    rng = np.random.default_rng(3)
    H, I, n = 64, 64, 2
    t = {
        "model.layers.0.mlp.shared_experts.gate_proj": rng.standard_normal((n, I, H)).astype(np.float32),
        "model.layers.0.mlp.shared_experts.up_proj": rng.standard_normal((n, I, H)).astype(np.float32),
        "model.layers.0.mlp.shared_experts.down_proj": rng.standard_normal((n, H, I)).astype(np.float32),
        "model.layers.0.input_layernorm.weight": np.ones(H, np.float32),
    }
    cfg = {"model_type": "inkling_text", "hidden_size": H, "num_hidden_layers": 1, "vocab_size": 8}
    _write(tmp_path / "src", cfg, t)
    convert(str(tmp_path / "src"), tmp_path / "o", ConvertOptions(dense="f32", progress=False))
    out = read_all(tmp_path / "o")
    for k in range(n):
        for proj in ("gate", "up", "down"):
            assert np.array_equal(out[f"model.layers.0.mlp.shared_experts.{k}.{proj}_proj.weight"],
                                  t[f"model.layers.0.mlp.shared_experts.{proj}_proj"][k])  # fmt: skip


def test_a_stacked_shared_gate_up_of_an_unknown_family_is_refused_before_work(tmp_path):
    rng = np.random.default_rng(4)
    t = {"model.llm.layers.0.mlp.shared_experts.shared_w13_weight": rng.standard_normal((2, 128, 64)).astype(np.float32),
         "model.llm.layers.0.attn_norm.weight": np.ones(64, np.float32)}  # fmt: skip
    cfg = {"model_type": "inkling_remix", "hidden_size": 64, "num_hidden_layers": 1, "vocab_size": 8}
    _write(tmp_path / "src", cfg, t)
    with pytest.raises(ConvertError) as err:
        convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dry_run=True, progress=False))
    msg = str(err.value)
    assert "\n" not in msg and "'inkling_remix'" in msg and "shared_w13_weight" in msg, msg
    assert not (tmp_path / "out").exists()
    cfg["model_type"] = "inkling_text"  # the family fixes it: converts
    (tmp_path / "src" / "config.json").write_text(json.dumps(cfg))
    convert(str(tmp_path / "src"), tmp_path / "o", ConvertOptions(dense="f32", progress=False))
    out = read_all(tmp_path / "o")
    w = t["model.llm.layers.0.mlp.shared_experts.shared_w13_weight"]
    assert np.array_equal(out["model.llm.layers.0.mlp.shared_experts.1.up_proj.weight"], w[1][1::2])
