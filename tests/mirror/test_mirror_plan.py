"""`mirror plan` on generated containers: expected selections are worked out by hand in each test.

Every shard is ``HEADER (4096) + tensor bytes``; a pairs expert of ``expert_tensors`` is 3 * 1000 + 3 * 40 =
3120 bytes, a K3 expert 3 * 512 + 3 * 32 = 1632 bytes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from mirror_builders import (
    HEADER,
    expert_tensors,
    k3_expert_tensors,
    run_cli,
    write_config,
    write_history,
    write_shard,
)

from colitools.errors import MirrorError, ParameterError, UsageFileError
from colitools.formats.usage import engine_id
from colitools.mirror.plan import SCHEMA, plan_mirror

EXPERT = 3 * 1000 + 3 * 40
K3 = 3 * 512 + 3 * 32


@pytest.fixture
def model(tmp_path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    write_config(d, n_layers=2, n_experts=4)
    return d


def plan(model: Path, budget: int, **kwargs):
    return plan_mirror(model, model.parent / "mirror", budget_bytes=budget, reserve_bytes=0, **kwargs)


def picked(p) -> list[tuple[str, int, int]]:
    return [(f.name, f.weighted_expert_bytes, f.activated_experts) for f in p.files]


@pytest.fixture
def ranked(model) -> Path:
    """a: experts (0,0),(0,1); b: (0,2),(0,3); c: layer 1; d: globals only."""
    write_shard(model / "a.safetensors", expert_tensors(0, 0) + expert_tensors(0, 1))
    write_shard(model / "b.safetensors", expert_tensors(0, 2) + expert_tensors(0, 3))
    write_shard(model / "c.safetensors", [t for e in range(4) for t in expert_tensors(1, e)])
    write_shard(model / "d.safetensors", [("model.embed_tokens.weight", 5000)])
    write_history(model / ".coli_usage", {(0, 0): 10, (0, 2): 1, (0, 3): 1, (1, 0): 3, (1, 1): 3},
                  n_layers=2, n_experts=4)
    return model


SIZE_A = SIZE_B = HEADER + 2 * EXPERT  # 10336
SIZE_C = HEADER + 4 * EXPERT  # 16576
# benefits: a = 10 * 3120 = 31200 (3.02 per byte), c = 6 * 3120 = 18720 (1.13), b = 2 * 3120 = 6240 (0.60), d = 0
A, B, C = ("a.safetensors", 31200, 2), ("b.safetensors", 6240, 2), ("c.safetensors", 18720, 4)


@pytest.mark.parametrize(
    "budget, expected",
    [
        (10**12, [A, C, B]),  # everything with a benefit; d (no experts) never
        (SIZE_A + SIZE_C, [A, C]),
        (SIZE_A + SIZE_B, [A, B]),  # after a, c (16576) no longer fits, b does exactly
        (SIZE_A + SIZE_B - 1, [A]),
        (SIZE_C, [A]),  # a first by benefit per byte; then 6240 left, nothing fits
        (SIZE_A, [A]),
        (SIZE_A - 1, []),
    ],
)
def test_selection_by_benefit_per_byte_within_the_budget(ranked, budget, expected):
    p = plan(ranked, budget)
    assert [os.path.getsize(ranked / n) for n in ("a.safetensors", "c.safetensors")] == [SIZE_A, SIZE_C]
    assert picked(p) == expected
    assert p.admitted == bool(expected)
    assert p.reason == (None if expected else "no_usage_ranked_shards_fit_the_budget")
    assert p.selected_bytes == sum(os.path.getsize(ranked / n) for n, _, _ in expected)


def split_expert_model(model: Path, pair: bool = True) -> tuple[int, int, int]:
    """Expert (0,0) split: its routed tensor in x, the rest in y (with expert (0,1)); z holds (1,0)."""
    if pair:
        sx = write_shard(model / "x.safetensors", expert_tensors(0, 0, projs=("gate_proj",)))
        sy = write_shard(model / "y.safetensors",
                         expert_tensors(0, 0, projs=("up_proj", "down_proj")) + expert_tensors(0, 1))
        sz = write_shard(model / "z.safetensors", expert_tensors(1, 0))
    else:
        k3 = k3_expert_tensors
        sx = write_shard(model / "x.safetensors", k3(0, 0, projs=("w1",)))
        sy = write_shard(model / "y.safetensors", k3(0, 0, projs=("w3", "w2")) + k3(0, 1))
        sz = write_shard(model / "z.safetensors", k3(1, 0))
    return sx, sy, sz


def test_expert_counts_only_once_its_routed_tensor_is_chosen(model):
    sx, sy, sz = split_expert_model(model)
    assert (sx, sy, sz) == (HEADER + 1040, HEADER + 2080 + EXPERT, HEADER + EXPERT)  # 5136, 9296, 7216
    write_history(model / ".coli_usage", {(0, 0): 10, (0, 1): 1, (1, 0): 4}, n_layers=2, n_experts=4)
    # before anything is chosen: x = 10 * 1040 = 10400 (2.02/B), z = 4 * 3120 = 12480 (1.73/B),
    # y = 1 * 3120 = 3120 (0.34/B: expert (0,0) does not count, its gate_proj is elsewhere).
    # x first; then y = 3120 + 10 * 2080 = 23920 (2.57/B) beats z; budget x + y leaves nothing for z.
    p = plan(model, sx + sy)
    assert picked(p) == [("x.safetensors", 10400, 1), ("y.safetensors", 23920, 1)]
    # budget x + z: x first, then y (9296 bytes) no longer fits and z (7216) does
    assert picked(plan(model, sx + sz)) == [("x.safetensors", 10400, 1), ("z.safetensors", 12480, 1)]


def test_k3_weight_packed_experts_route_by_w1_weight_packed(model):
    sx, sy, sz = split_expert_model(model, pair=False)
    assert (sx, sy, sz) == (HEADER + 544, HEADER + 1088 + K3, HEADER + K3)  # 4640, 6816, 5728
    write_history(model / ".coli_usage", {(0, 0): 10, (0, 1): 1, (1, 0): 3}, n_layers=2, n_experts=4)
    # x = 10 * 544 = 5440 (1.17/B); z = 3 * 1632 = 4896 (0.85/B); y = 1632 (0.24/B) until x is chosen,
    # then 1632 + 10 * 1088 = 12512 (1.84/B)
    assert picked(plan(model, sx + sy)) == [("x.safetensors", 5440, 1), ("y.safetensors", 12512, 1)]
    assert picked(plan(model, sx + sy + sz)) == [
        ("x.safetensors", 5440, 1), ("y.safetensors", 12512, 1), ("z.safetensors", 4896, 1)]


def test_planar_declared_shards_plan_like_pairs(model):
    def planar_layer(layer: int) -> list[tuple[str, int]]:
        out = []
        for e in range(4):  # one contiguous record per expert: gate|up|down codes, then gate|up|down scales
            base = f"model.layers.{layer}.mlp.experts.{e}"
            out += [(f"{base}.{p}.weight", 1024) for p in ("gate_proj", "up_proj", "down_proj")]
            out += [(f"{base}.{p}.weight.qs", 64) for p in ("gate_proj", "up_proj", "down_proj")]
        return out

    meta = {"colitools.layout": "planar64-v8"}
    s0 = write_shard(model / "layer0.safetensors", planar_layer(0), meta)
    s1 = write_shard(model / "layer1.safetensors", planar_layer(1), meta)
    write_shard(model / "globals.safetensors", [("model.embed_tokens.weight", 2048)])
    assert s0 == s1 == HEADER + 4 * 3264
    write_history(model / ".coli_usage", {(0, 0): 1, (0, 1): 2, (1, 3): 5}, n_layers=2, n_experts=4)
    # layer1 = 5 * 3264 = 16320, layer0 = 3 * 3264 = 9792
    p = plan(model, s0)
    assert picked(p) == [("layer1.safetensors", 16320, 4)]
    assert {s.name: s.layout for s in p.shards}["layer1.safetensors"] == "planar64-v8"
    assert picked(plan(model, 2 * s0)) == [("layer1.safetensors", 16320, 4), ("layer0.safetensors", 9792, 4)]


def expert_bytes_tensors(layer: int, expert: int) -> list[tuple[str, int]]:
    """An unquantized-style expert of exactly 4096 bytes (no scale tensors)."""
    base = f"model.layers.{layer}.mlp.experts.{expert}"
    return [(f"{base}.gate_proj.weight", 2048), (f"{base}.up_proj.weight", 1024), (f"{base}.down_proj.weight", 1024)]


def test_equal_benefit_per_byte_prefers_the_larger_benefit(model):
    # z_p: 4096 expert bytes + 8192 other bytes = 16384, count 6 -> 24576 (1.5/B)
    # a_q: 4096 expert bytes = 8192, count 3 -> 12288 (1.5/B); the name alone would pick a_q
    write_shard(model / "z_p.safetensors", expert_bytes_tensors(0, 0) + [("model.layers.0.self_attn.o.weight", 8192)])
    write_shard(model / "a_q.safetensors", expert_bytes_tensors(0, 1))
    write_history(model / ".coli_usage", {(0, 0): 6, (0, 1): 3}, n_layers=2, n_experts=4)
    assert picked(plan(model, 16384)) == [("z_p.safetensors", 24576, 1)]
    assert picked(plan(model, 16384 + 8192)) == [("z_p.safetensors", 24576, 1), ("a_q.safetensors", 12288, 1)]


def test_complete_tie_is_broken_by_name(model):
    write_shard(model / "m1.safetensors", expert_bytes_tensors(0, 0))
    write_shard(model / "m0.safetensors", expert_bytes_tensors(0, 1))
    write_history(model / ".coli_usage", {(0, 0): 3, (0, 1): 3}, n_layers=2, n_experts=4)
    assert picked(plan(model, 8192)) == [("m0.safetensors", 12288, 1)]


def test_benefit_per_byte_is_compared_exactly_not_in_floating_point(model):
    m = 2**50
    # p: 8192 bytes, count 8192 m -> ratio 4096 m exactly
    # a_q: 8193 bytes (one extra byte), count 8193 m - 1 -> ratio 4096 m - 4096/8193: smaller, but the same
    # double; a float comparison would fall through to "larger benefit" and pick a_q.
    write_shard(model / "p.safetensors", expert_bytes_tensors(0, 0))
    write_shard(model / "a_q.safetensors", expert_bytes_tensors(0, 1) + [("model.norm.weight", 1)])
    cp, cq = 8192 * m, 8193 * m - 1
    assert (cp * 4096) / 8192 == (cq * 4096) / 8193  # float division cannot tell them apart
    write_history(model / ".coli_usage", {(0, 0): cp, (0, 1): cq}, n_layers=2, n_experts=4)
    assert picked(plan(model, 8193)) == [("p.safetensors", cp * 4096, 1)]


def test_no_usage_history_is_not_admitted(model):
    write_shard(model / "a.safetensors", expert_tensors(0, 0))
    p = plan(model, 10**9)
    assert (p.admitted, p.reason, p.files, p.usage_history_present) == (False, "usage_history_missing", [], False)
    (model / ".coli_usage").write_bytes(b"")  # an empty history is no history either
    assert plan(model, 10**9).reason == "usage_history_missing"


def test_reserve_refusal(ranked):
    p = plan_mirror(ranked, ranked.parent / "mirror", budget_bytes=10**12, reserve_bytes=2**60)
    assert (p.admitted, p.reason) == (False, "free_space_reserve")
    assert [f.name for f in p.files] == ["a.safetensors", "c.safetensors", "b.safetensors"]
    assert p.projected_free_bytes == p.free_bytes - (2 * SIZE_A + SIZE_C)


def test_existing_same_size_targets_are_not_counted_as_to_copy(ranked):
    mirror = ranked.parent / "mirror"
    mirror.mkdir()
    shutil.copy(ranked / "a.safetensors", mirror / "a.safetensors")
    (mirror / "c.safetensors").write_bytes(b"short")
    p = plan_mirror(ranked, mirror, budget_bytes=10**12, reserve_bytes=0)
    assert p.remaining_copy_bytes == SIZE_B + SIZE_C


def test_same_device_warning(ranked):
    p = plan(ranked, 10**9)
    assert any("same filesystem device" in w for w in p.warnings)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a second filesystem")
def test_no_same_device_warning_on_another_filesystem(ranked, tmp_path):
    if os.stat("/dev/shm").st_dev == os.stat(ranked).st_dev:
        pytest.skip("/dev/shm is on the same device here")
    p = plan_mirror(ranked, f"/dev/shm/colitools-test-{os.getpid()}/mirror", budget_bytes=10**9, reserve_bytes=0)
    assert not any("same filesystem device" in w for w in p.warnings)
    assert not os.path.exists(f"/dev/shm/colitools-test-{os.getpid()}")  # planning creates nothing


def test_missing_mirror_directory_uses_the_nearest_existing_parent_and_is_not_created(ranked):
    mirror = ranked.parent / "not" / "yet" / "there"
    p = plan_mirror(ranked, mirror, budget_bytes=10**9, reserve_bytes=0)
    assert p.admitted and p.free_bytes > 0
    assert not (ranked.parent / "not").exists()


def test_mirror_equal_to_model_or_a_source_dir_is_an_error(ranked, tmp_path):
    with pytest.raises(MirrorError, match="must differ"):
        plan_mirror(ranked, ranked, budget_bytes=1)
    extra = tmp_path / "extra"
    extra.mkdir()
    with pytest.raises(MirrorError, match="must differ"):
        plan_mirror(ranked, extra, budget_bytes=1, source_dirs=[extra])


@pytest.mark.parametrize("budget", [0, -1])
def test_budget_must_be_positive(ranked, budget):
    with pytest.raises(ParameterError, match="`budget_bytes` must be positive"):
        plan(ranked, budget)


def test_shards_of_extra_source_dirs_are_planned(ranked, tmp_path):
    extra = tmp_path / "split"
    extra.mkdir()
    shutil.move(ranked / "c.safetensors", extra / "c.safetensors")
    p = plan(ranked, 10**12, source_dirs=[extra])
    assert picked(p) == [A, C, B]
    assert p.files[1].source == extra / "c.safetensors"


def test_another_engines_history_refused_by_default_accepted_when_named(ranked):
    write_history(ranked / ".coli_usage", {(0, 0): 1}, n_layers=2, n_experts=4, engine="deepseek_v3")
    with pytest.raises(UsageFileError, match="engine id"):
        plan(ranked, 10**9)
    p = plan(ranked, 10**9, usage=ranked / ".coli_usage")
    assert p.admitted and any("engine id" in w for w in p.warnings)


def test_history_with_another_geometry_is_refused(ranked):
    write_history(ranked / ".coli_usage", {(0, 0): 1}, n_layers=3, n_experts=4)
    with pytest.raises(UsageFileError, match="geometry"):
        plan(ranked, 10**9)


def test_prediction_for_a_partial_mirror(model):
    # layer 1: experts 0,1 in l1a, experts 2,3 in l1b; indices 4..7 have buckets 221, 21, 76, 132
    write_shard(model / "l1a.safetensors", expert_tensors(1, 0) + expert_tensors(1, 1))
    write_shard(model / "l1b.safetensors", expert_tensors(1, 2) + expert_tensors(1, 3))
    write_history(model / ".coli_usage", {(1, 0): 1, (1, 1): 2, (1, 2): 3, (1, 3): 4}, n_layers=2, n_experts=4)
    # l1b (7 * 3120) beats l1a (3 * 3120); budget for one shard
    p = plan(model, HEADER + 2 * EXPERT, disk_weights=[1, 1])
    assert [f.name for f in p.files] == ["l1b.safetensors"]
    pr = p.prediction
    # cuts 128: (1,0) [221] and (1,3) [132] are mirror experts; only (1,3) is on the mirror: 4 of 10 reads
    assert (pr.mirror_bytes, pr.expert_bytes_read) == (4 * EXPERT, 10 * EXPERT)
    # the test's mirror is on the model's own device: no gain, whatever the split (issue 9, item 5) ...
    assert pr.same_device and pr.bandwidth_gain == 1.0 and pr.full_mirror_gain == 1.0
    # ... on a drive of its own the same split would gain
    pr = dataclasses.replace(pr, same_device=False)
    assert pr.bandwidth_gain == pytest.approx(1 / 0.6)
    assert pr.full_mirror_gain == pytest.approx(2.0)  # (1 + 4) of 10 with a full mirror
    # weights 9,3 (cuts 192): only (1,0) [221] would be read from the mirror, and it is not there
    p = plan(model, HEADER + 2 * EXPERT, disk_weights=[9, 3])
    assert p.prediction.mirror_bytes == 0 and p.prediction.bandwidth_gain == 1.0
    assert p.to_json()["prediction"]["cuts"] == [192, 256]


def test_plan_json_schema_has_every_field(ranked):
    data = plan(ranked, SIZE_A + SIZE_C, disk_weights=[9, 3]).to_json()
    assert data["schema"] == SCHEMA
    for key in ("model_root", "mirror_root", "usage_file", "usage_history_present", "usage_selections",
                "budget_bytes", "reserve_bytes", "free_bytes", "selected_bytes", "remaining_copy_bytes",
                "projected_free_bytes", "admitted", "reason", "warnings", "files", "prediction", "source_dirs"):
        assert key in data
    assert data["usage_selections"] == 18 and data["selected_bytes"] == SIZE_A + SIZE_C
    assert data["files"][0] == {"name": "a.safetensors", "size": SIZE_A, "weighted_expert_bytes": 31200,
                                "activated_experts": 2}
    for key in ("primary_share", "mirror_share", "bandwidth_gain", "disk_weights", "disk_weights_source"):
        assert key in data["prediction"]


def test_cli_plan_exit_codes_and_json(ranked):
    mirror = str(ranked.parent / "mirror")
    budget = str((SIZE_A + SIZE_C) / 2**30)
    r = run_cli("mirror", "plan", "--model", str(ranked), "--mirror", mirror, "--budget-gib", budget,
                "--reserve-gib", "0", "--json", "--disk-weights", "9,3")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [f["name"] for f in data["files"]] == ["a.safetensors", "c.safetensors"]
    assert data["prediction"]["disk_weights"] == [9.0, 3.0] and data["prediction"]["disk_weights_source"] == "option"
    r = run_cli("mirror", "plan", "--model", str(ranked), "--mirror", mirror, "--budget-gib", budget,
                "--reserve-gib", "0")
    assert r.returncode == 0 and "a.safetensors" in r.stdout and "admitted: yes" in r.stdout
    assert "predicted read bandwidth" in r.stdout
    r = run_cli("mirror", "plan", "--model", str(ranked), "--mirror", mirror, "--budget-gib", budget,
                "--reserve-gib", "1000000")
    assert r.returncode == 2 and "free_space_reserve" in r.stdout
    r = run_cli("mirror", "plan", "--model", str(ranked), "--mirror", str(ranked), "--budget-gib", "1")
    assert r.returncode == 1 and r.stderr.startswith("colitools: error:") and "Traceback" not in r.stderr
    r = run_cli("mirror", "plan", "--model", str(ranked), "--mirror", mirror, "--budget-gib", "0")
    assert r.returncode == 2  # a value outside the option's range, and a required option missing: usage errors
    r = run_cli("mirror", "plan", "--model", str(ranked), "--mirror", mirror)
    assert r.returncode == 2 and "--budget-gib" in r.stderr
    r = run_cli("mirror", "plan", "--model", str(ranked), "--mirror", mirror, "--budget-gib", "1",
                "--disk-weights", "9,3", "--probe")
    assert r.returncode == 1 and "mutually exclusive" in r.stderr


def test_cli_plan_without_history_exits_2(model):
    write_shard(model / "a.safetensors", expert_tensors(0, 0))
    r = run_cli("mirror", "plan", "--model", str(model), "--mirror", str(model.parent / "m"), "--budget-gib", "1",
                "--reserve-gib", "0", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["reason"] == "usage_history_missing"


def test_disk_weights_default_to_the_engines_environment_setting(ranked, monkeypatch):
    monkeypatch.setenv("COLI_DISK_WEIGHTS", "9,3")
    p = plan(ranked, 10**9)
    assert p.disk_weights_source == "COLI_DISK_WEIGHTS" and p.prediction.cuts == (192, 256)
    monkeypatch.delenv("COLI_DISK_WEIGHTS")
    assert plan(ranked, 10**9).prediction.cuts == (128, 256)
    assert engine_id("olmoe") == plan(ranked, 10**9).usage.engine_id
