"""Expert mapping of shards: which tensors are routed experts, which one the engine routes by."""

from __future__ import annotations

import json

import pytest
from mirror_builders import HEADER, expert_tensors, k3_expert_tensors, write_shard

from colitools.mirror.scan import (
    ExpertTensor,
    classify_expert_tensor,
    discover_shards,
    model_geometry,
    scan_shard,
)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("model.layers.3.mlp.experts.17.gate_proj.weight", ExpertTensor(3, 17, True)),
        ("model.layers.3.mlp.experts.17.gate_proj.weight.qs", ExpertTensor(3, 17, False)),
        ("model.layers.3.mlp.experts.17.up_proj.weight", ExpertTensor(3, 17, False)),
        ("model.layers.3.mlp.experts.17.down_proj.weight.qs", ExpertTensor(3, 17, False)),
        ("model.layers.3.mlp.experts.17.gate_proj.weight_packed", ExpertTensor(3, 17, True)),
        ("model.layers.3.mlp.experts.17.gate_proj.weight_scale", ExpertTensor(3, 17, False)),
        ("model.layers.0.mlp.experts.2.down_proj.weight_scale_inv", ExpertTensor(0, 2, False)),
        ("model.layers.1.block_sparse_moe.experts.5.w1.weight", ExpertTensor(1, 5, True)),
        ("model.layers.1.block_sparse_moe.experts.5.w1", ExpertTensor(1, 5, True)),
        ("model.layers.1.block_sparse_moe.experts.5.w1.weight.qs", ExpertTensor(1, 5, False)),
        ("model.layers.1.block_sparse_moe.experts.5.w2.weight", ExpertTensor(1, 5, False)),
        ("model.layers.1.block_sparse_moe.experts.5.w3", ExpertTensor(1, 5, False)),
        ("language_model.model.layers.60.block_sparse_moe.experts.383.w1.weight_packed",
         ExpertTensor(60, 383, True)),
        ("language_model.model.layers.60.block_sparse_moe.experts.383.w1.weight_scale",
         ExpertTensor(60, 383, False)),
        ("language_model.model.layers.60.block_sparse_moe.experts.383.w2.weight_packed",
         ExpertTensor(60, 383, False)),
        # not routed experts
        ("model.layers.3.mlp.shared_experts.gate_proj.weight", None),
        ("model.layers.3.mlp.shared_experts.gate_proj.weight.qs", None),
        ("model.layers.3.mlp.shared_expert.gate_proj.weight", None),
        ("model.layers.3.mlp.shared_expert_gate.weight", None),
        ("model.layers.3.mlp.gate.weight", None),
        ("model.layers.3.mlp.gate.e_score_correction_bias", None),
        ("model.layers.1.block_sparse_moe.gate.weight", None),
        ("model.layers.3.mlp.experts.gate_up_proj", None),  # fused, not per expert
        ("model.layers.3.mlp.gate_proj.weight", None),  # dense MLP
        ("model.layers.3.mlp.experts.4.gate_proj", None),
        ("model.embed_tokens.weight", None),
    ],
)
def test_classify_expert_tensor(name, expected):
    assert classify_expert_tensor(name) == expected


def test_scan_sums_bytes_per_expert_including_scales(tmp_path):
    tensors = expert_tensors(0, 0) + expert_tensors(0, 1, weight=500, scale=20)
    tensors += [("model.layers.0.mlp.shared_experts.gate_proj.weight", 777), ("model.layers.0.mlp.gate.weight", 64)]
    size = write_shard(tmp_path / "a.safetensors", tensors)
    shard = scan_shard(tmp_path / "a.safetensors")
    assert shard.size == size == HEADER + 3 * 1040 + 3 * 520 + 777 + 64
    assert shard.expert_bytes == {(0, 0): 3 * 1000 + 3 * 40, (0, 1): 3 * 500 + 3 * 20}
    assert shard.routed == {(0, 0), (0, 1)}
    assert shard.layout == "pairs"


def test_scan_routed_tensor_only_where_gate_proj_weight_is(tmp_path):
    write_shard(tmp_path / "gate.safetensors", expert_tensors(2, 5, projs=("gate_proj",)))
    write_shard(tmp_path / "rest.safetensors", expert_tensors(2, 5, projs=("up_proj", "down_proj")))
    gate, rest = scan_shard(tmp_path / "gate.safetensors"), scan_shard(tmp_path / "rest.safetensors")
    assert gate.routed == {(2, 5)} and gate.expert_bytes == {(2, 5): 1040}
    assert rest.routed == frozenset() and rest.expert_bytes == {(2, 5): 2080}


def test_scan_k3_weight_packed_experts(tmp_path):
    write_shard(tmp_path / "k3.safetensors", k3_expert_tensors(7, 1) + k3_expert_tensors(7, 2, packed=256, scale=16))
    shard = scan_shard(tmp_path / "k3.safetensors")
    assert shard.expert_bytes == {(7, 1): 3 * 512 + 3 * 32, (7, 2): 3 * 256 + 3 * 16}
    assert shard.routed == {(7, 1), (7, 2)}


def test_scan_reports_a_declared_planar_layout(tmp_path):
    write_shard(tmp_path / "p.safetensors", expert_tensors(0, 0), {"colitools.layout": "planar64-v8"})
    assert scan_shard(tmp_path / "p.safetensors").layout == "planar64-v8"


def test_discover_skips_hidden_and_other_files_and_first_directory_wins(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_shard(a / "s1.safetensors", expert_tensors(0, 0))
    write_shard(b / "s1.safetensors", expert_tensors(0, 1))
    write_shard(b / "s2.safetensors", expert_tensors(0, 2))
    write_shard(a / ".hidden.safetensors", expert_tensors(0, 3))
    (a / "notes.txt").write_text("x")
    warnings: list[str] = []
    shards = discover_shards([a, b], warnings)
    assert [(s.name, s.path.parent) for s in shards] == [("s1.safetensors", a), ("s2.safetensors", b)]
    assert shards[0].routed == {(0, 0)}
    assert len(warnings) == 1 and "duplicate shard s1.safetensors" in warnings[0]


def test_model_geometry_reads_the_config_spellings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral", "num_hidden_layers": 32,
                                                      "num_local_experts": 8}))
    g = model_geometry(tmp_path)
    assert (g.engine, g.n_layers, g.n_experts) == ("mixtral", 32, 8)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": {
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "n_routed_experts": 384}}))
    g = model_geometry(tmp_path)
    assert (g.engine, g.n_layers, g.n_experts) == ("kimi_k25", 61, 384)
    assert model_geometry(tmp_path / "nowhere") == type(g)()
