"""Expert placement (the LRU cap) never changes a token or a logit; experts are read with positional reads,
one per expert where the layout puts its bytes back to back."""

from __future__ import annotations

import numpy as np
import pytest
from containers import build_container
from oracle_refs import ORACLES, reference

from colitools.runtime import generate, load_model


def run(model_dir, cap, ref):
    with load_model(model_dir, cap=cap, record_usage=False) as model:
        res = generate(model, ref["prompt_ids"], 16)
        argmax, last = model.score(ref["teacher_forced"]["input_ids"])
        stats = model.stats()
    return res.generated_ids, res.last_logits, argmax, last, stats


@pytest.mark.parametrize(
    "fixture,recipe", [("qwen2_moe", "default"), ("deepseek_v3", "mxfp4"), ("mixtral_bf16_fused", "f32"),
                       ("glm_moe_dsa_sparse", "planar"), ("deepseek_v3_fp8", "f32"), ("kimi_k25_tied", "default"),
                       ("deepseek_v32_sparse", "int3"), ("gpt_oss", "f32"), ("gpt_oss", "int3")]
)  # fmt: skip
def test_cap_1_2_all_give_identical_tokens_and_logits(fixture, recipe, tmp_path):
    ref = reference(fixture, recipe)
    model_dir = ORACLES / fixture
    if recipe != "f32":
        model_dir = build_container(
            model_dir, ref, tmp_path / "c", layout="planar" if recipe == "planar" else "pairs"
        )
    n_experts = {"mixtral": 6, "gpt_oss": 4}.get(fixture, 8)
    results = {cap: run(model_dir, cap, ref) for cap in (1, 2, None)}
    base = results[None]
    assert base[4]["cap"] == n_experts  # default budget holds every expert of these tiny models
    for cap in (1, 2):
        toks, step_logits, argmax, last, stats = results[cap]
        assert stats["cap"] == cap
        assert toks == base[0] and argmax == base[2]
        assert np.array_equal(step_logits, base[1]) and np.array_equal(last, base[3])
    # a smaller cache misses more
    assert results[1][4]["expert_cache_misses"] > results[None][4]["expert_cache_misses"]
    assert results[None][4]["expert_cache_hit_rate"] > results[1][4]["expert_cache_hit_rate"]


def test_pairs_layout_reads_each_expert_with_one_pread(tmp_path):
    ref = reference("olmoe", "default")
    out = build_container(ORACLES / "olmoe", ref, tmp_path / "c")
    with load_model(out, cap=1, record_usage=False) as model:
        generate(model, ref["prompt_ids"], 8)
        s = model.expert_stats()
    assert s.misses > 0 and s.reads == s.misses
    assert s.bytes_read == s.misses * model.stores[0].expert_nbytes(0)


def test_fused_float_experts_are_read_from_slices(tmp_path):
    ref = reference("mixtral_bf16_fused", "f32")
    with load_model(ORACLES / "mixtral_bf16_fused", cap=1, record_usage=False) as model:
        generate(model, ref["prompt_ids"], 4)
        s = model.expert_stats()
        store = model.stores[0]
    # gate and up rows of gate_up_proj are contiguous (one read); down_proj is another tensor
    assert s.reads == 2 * s.misses
    H, I = model.args.hidden_size, model.args.moe_intermediate_size
    assert s.bytes_read == s.misses * 3 * H * I * 2  # BF16 bytes
    assert store.expert_nbytes(0) == 3 * H * I * 4  # held as float32


def test_ram_budget_sets_the_cap():
    with load_model(ORACLES / "olmoe", ram_gb=1e-9, record_usage=False) as model:
        assert model.placement.cap == 1
    with load_model(ORACLES / "olmoe", ram_gb=64, record_usage=False) as model:
        assert model.placement.cap == model.args.num_experts
    with load_model(ORACLES / "olmoe", cap=100, record_usage=False) as model:
        assert model.placement.cap == model.args.num_experts
