"""docs/FORMATS.md §5 rule 2 (issue 25 item 5): the small linear weights whose output
only selects or gates, like a router (Inkling-2's per-head sink projection ``attn_sink_proj``, GLM-5.3's k-pool
``index_kpool_compress_gate``), are F32 whatever ``--dense`` says, with their values unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
from convcheck import stored_tensors
from tinyckpt import write_tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.recipe import Role, classify
from colitools.converters.runner import convert

SELECTING = (
    "model.layers.0.attn.attn_sink_proj.weight",  # Inkling-2 [heads, H]
    "model.layers.0.self_attn.indexer.index_kpool_compress_gate",  # GLM-5.3-Flash [index_head_dim, H]
)


NEIGHBOURS = ("model.layers.0.attn.o_proj.weight", "model.layers.0.self_attn.indexer.wk.weight")  # rule 6


@pytest.mark.parametrize(("name", "neighbour"), list(zip(SELECTING, NEIGHBOURS, strict=True)))
def test_selecting_linear_is_rule_2(name, neighbour):
    assert classify(name, 2, 1, "BF16") is Role.FLOAT
    assert classify(neighbour, 2, 1, "BF16") is Role.DENSE


@pytest.mark.parametrize("dense", ["int8-row", "int4-g64", "bf16"])
def test_selecting_linears_are_written_f32_unchanged(tmp_path, dense):
    rng = np.random.default_rng(6)
    tensors = {n: rng.standard_normal((4, 64)).astype(np.float32) for n in SELECTING}
    tensors["model.layers.0.attn.o_proj.weight"] = rng.standard_normal((64, 64)).astype(np.float32)
    (tmp_path / "src").mkdir()
    write_tensors(tmp_path / "src", tensors, 1)
    config = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 1, "vocab_size": 8}
    (tmp_path / "src" / "config.json").write_text(json.dumps(config))
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dense=dense, min_free_gb=0))
    stored = stored_tensors(tmp_path / "out")
    for name in SELECTING:
        dtype, shape, values = stored[name]
        assert (dtype, shape) == ("F32", (4, 64)) and np.array_equal(values, tensors[name])
    assert stored["model.layers.0.attn.o_proj.weight"][0] != "F32"  # --dense applies to the other linears
