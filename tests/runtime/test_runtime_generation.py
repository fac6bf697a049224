"""Generation mechanics: KV-cache decoding equals the full forward, masks, tied embeddings, FP8 sources,
name mapping, routers and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tinymodels import write_gqa_model

from colitools.errors import FormatError, ParameterError, RuntimeModelError
from colitools.formats import reference as ref
from colitools.runtime import generate, load_model
from colitools.runtime.attention import causal_mask
from colitools.runtime.moe import noaux_tc, softmax_topk
from colitools.runtime.weights import sanitize

IDS = [3, 17, 42, 5, 9, 11, 30, 2]


def cached_vs_full(model_dir):
    """Logits of each position computed step by step with the cache, and in one forward."""
    with load_model(model_dir, record_usage=False) as m:
        steps = [m.forward(IDS[:4], all_logits=True)] + [m.forward([t], all_logits=True) for t in IDS[4:]]
        m.reset()
        full = m.forward(IDS, all_logits=True)
    return np.concatenate(steps), full


@pytest.mark.parametrize("options", [{}, {"tie": True, "clip_qkv": 0.5}, {"sliding_window": 3}])
def test_kv_cache_decoding_equals_the_full_forward(tmp_path, options):
    mt = "mixtral" if "sliding_window" in options else "olmoe"
    steps, full = cached_vs_full(write_gqa_model(tmp_path / "m", mt, **options))
    np.testing.assert_allclose(steps, full, rtol=0, atol=1e-5)


def test_sliding_window_changes_attention_and_a_wide_window_does_not(tmp_path):
    _, plain = cached_vs_full(write_gqa_model(tmp_path / "a", "mixtral"))
    _, wide = cached_vs_full(write_gqa_model(tmp_path / "b", "mixtral", sliding_window=64))
    _, narrow = cached_vs_full(write_gqa_model(tmp_path / "c", "mixtral", sliding_window=2))
    assert np.array_equal(plain, wide)
    assert np.array_equal(plain[:2], narrow[:2]) and not np.allclose(plain[2:], narrow[2:])
    assert causal_mask(np.array([3]), 5, window=2).tolist() == [[False, False, True, True, False]]


def test_tied_embeddings_use_the_embedding_matrix(tmp_path):
    with load_model(write_gqa_model(tmp_path / "m", tie=True), record_usage=False) as m:
        assert m.lm_head.weight is m.embed.q


def test_bf16_and_fp8_sources_equal_their_float32_dequantization(tmp_path):
    f32 = write_gqa_model(tmp_path / "f32")
    bf16 = write_gqa_model(tmp_path / "bf16", dtype="BF16")
    fp8 = write_gqa_model(tmp_path / "fp8", fp8_block=(16, 8))  # non-128 blocks: dequantized at load
    for d in (bf16, fp8):
        with load_model(d, record_usage=False) as m:
            toks = generate(m, IDS, 6).generated_ids
            assert len(toks) == 6
    with load_model(fp8, record_usage=False) as m:
        st = m.stores[0].sources[0][0]
        assert st.form == "fp8-source" and st.fp8_block == (16, 8)
        data, scale = m.ckpt.read_stored(st)
        want = ref.dequant_fp8_block(np.frombuffer(data, np.uint8).reshape(16, 32),
                                     np.frombuffer(scale, np.float32), (16, 8))  # fmt: skip
        assert np.array_equal(m.stores[0].get(0).gate.codes, want)
    assert f32.exists()


def test_sanitize_maps_checkpoint_spellings():
    assert (
        sanitize("model.layers.1.block_sparse_moe.experts.3.w1.weight")
        == "model.layers.1.mlp.experts.3.gate_proj.weight"
    )
    assert (
        sanitize("model.layers.1.block_sparse_moe.experts.3.w2.weight.qs")
        == "model.layers.1.mlp.experts.3.down_proj.weight.qs"
    )
    assert (
        sanitize("model.layers.1.block_sparse_moe.experts.3.w3.weight_packed")
        == "model.layers.1.mlp.experts.3.up_proj.weight_packed"
    )
    assert sanitize("model.layers.1.block_sparse_moe.gate.weight") == "model.layers.1.mlp.gate.weight"
    assert (
        sanitize("model.layers.0.mlp.shared_expert.up_proj.weight")
        == "model.layers.0.mlp.shared_experts.up_proj.weight"
    )
    assert (
        sanitize("model.layers.0.mlp.experts.7.w1_extra.weight")
        == "model.layers.0.mlp.experts.7.w1_extra.weight"
    )


def test_softmax_router_renormalises_only_when_asked():
    logits = np.array([[0.0, 1.0, 2.0, -1.0]], dtype=np.float32)
    idx, w = softmax_topk(logits, 2, False)
    p = np.exp(logits) / np.exp(logits).sum()
    assert idx.tolist() == [[2, 1]] and np.allclose(w, p[:, [2, 1]])
    assert np.allclose(softmax_topk(logits, 2, True)[1].sum(), 1.0)


def test_noaux_tc_limits_experts_to_the_best_groups():
    # 4 groups of 2; group scores use the bias-corrected top-2; weights are the unbiased sigmoid scores
    logits = np.array([[5.0, -5.0, 0.1, 0.2, 0.3, 0.4, -1.0, 4.0]], dtype=np.float32)
    bias = np.array([0, 0, 0, 0, 0, 0, 0, 0.0], dtype=np.float32)
    idx, w = noaux_tc(logits, bias, 2, 4, 2, True, 2.5)
    s = 1 / (1 + np.exp(-logits[0]))
    groups = [s[0] + s[1], s[2] + s[3], s[4] + s[5], s[6] + s[7]]
    best = sorted(np.argsort(groups)[-2:])
    allowed = [e for g in best for e in (2 * g, 2 * g + 1)]
    top = sorted(allowed, key=lambda e: -s[e])[:2]
    assert sorted(idx[0].tolist()) == sorted(top)
    assert np.allclose(w[0], 2.5 * s[idx[0]] / (s[idx[0]].sum() + 1e-20))


def test_bad_inputs_are_clear_errors(tmp_path):
    d = write_gqa_model(tmp_path / "m")
    with load_model(d, record_usage=False) as m:
        with pytest.raises(RuntimeModelError, match="outside the vocabulary"):
            m.forward([0, 999])
    with pytest.raises(ParameterError, match="`cap` must be >= 1"):
        load_model(d, cap=0)
    (d / "model.safetensors").rename(d / "gone.bin")
    with pytest.raises(FormatError, match="no \\*.safetensors"):
        load_model(d)
    untied = write_gqa_model(tmp_path / "n", tie=True)
    cfg = json.loads((untied / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    with pytest.raises(RuntimeModelError, match="lm_head.weight"):
        load_model(untied)
