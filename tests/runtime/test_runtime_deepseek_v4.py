"""DeepSeek-V4 pieces on their own, against hand-computed values and the fixture's own tables (the oracle tests
run the whole model): the trailing interleaved RoPE, hyper-connection weights, sqrtsoftplus and hash routing,
the clamped SwiGLU, the compressors' caches (entries emitted at the rate, the indexer's strict subset), the
``--cap 1`` run, and refusals."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from containers import build_container
from oracle_refs import ORACLES, check_against_reference, reference

from colitools.errors import RuntimeModelError
from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors
from colitools.runtime import generate, load_model
from colitools.runtime.config import RopeArgs
from colitools.runtime.deepseek_v4 import ClampedExpert, TailRope, softplus, visible
from colitools.runtime.deepseek_v4_hc import HyperConnection, HyperHead
from colitools.runtime.kernels import QTensor

F32 = np.float32
FIXTURE = ORACLES / "deepseek_v4"


@pytest.mark.parametrize("recipe", ["f32", "default"])
def test_cap_one_is_token_exact(recipe, tmp_path):
    ref = reference("deepseek_v4", recipe)
    model_dir = FIXTURE if recipe == "f32" else build_container(FIXTURE, ref, tmp_path / "c")
    check_against_reference(model_dir, "deepseek_v4", ref, cap=1)


def test_tail_rope_rotates_the_trailing_pairs_in_place():
    rope = TailRope(RopeArgs(theta=10000.0, dim=4, interleaved=True))
    x = np.arange(1, 7, dtype=F32).reshape(1, 1, 6)  # nope [1, 2], rope pairs (3, 4), (5, 6)
    a, b = 0.3, 0.3 * 10000.0**-0.5  # angle of pair i at position p: p * theta^(-2i/dim)
    cos, sin = np.array([[math.cos(a), math.cos(b)]], F32), np.array([[math.sin(a), math.sin(b)]], F32)
    got = rope.apply(x, cos, sin)[0, 0]
    want = [1, 2, 3 * math.cos(a) - 4 * math.sin(a), 4 * math.cos(a) + 3 * math.sin(a),
            5 * math.cos(b) - 6 * math.sin(b), 6 * math.cos(b) + 5 * math.sin(b)]  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(rope.cos_sin(np.array([0.3]))[0], cos, rtol=1e-6)  # positions are angles / freq
    np.testing.assert_allclose(rope.apply(rope.apply(x, cos, sin), cos, -sin), x, rtol=1e-6)  # -sin undoes it


def test_hyper_connection_weights_by_hand():
    n, H = 2, 3
    streams = np.array([[[1, 2, 3], [-1, 0, 2]]], F32)  # [N=1, n, H]
    fn = np.zeros(((2 + n) * n, n * H), F32)  # projection 0: pre / post / comb come from the biases alone
    base = np.array([0, 1, 0, -1, 2, 0, 0, 2], F32)
    hc = HyperConnection(fn, base, np.ones(3, F32), n, sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
    post, comb, collapsed = hc.collapse(streams)
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    pre = [sig(0) + 1e-6, sig(1) + 1e-6]
    np.testing.assert_allclose(collapsed[0], pre[0] * streams[0, 0] + pre[1] * streams[0, 1], rtol=1e-6)
    np.testing.assert_allclose(post[0], [2 * sig(0), 2 * sig(-1)], rtol=1e-6)
    # softmax rows of [[2, 0], [0, 2]] are symmetric, so Sinkhorn keeps them: doubly stochastic, diagonal e^2/(1+e^2)
    d = math.exp(2) / (1 + math.exp(2))
    np.testing.assert_allclose(comb[0], [[d, 1 - d], [1 - d, d]], rtol=1e-5)
    out = np.array([[10, 20, 30]], F32)
    mixed = HyperConnection.expand(streams, out, post, comb)
    want = post[0][:, None] * out + comb[0].T @ streams[0]
    np.testing.assert_allclose(mixed[0], want, rtol=1e-6)
    head = HyperHead(np.zeros((n, n * H), F32), np.array([0, 1], F32), np.ones(1, F32), 1e-6, 1e-6)
    np.testing.assert_allclose(head(streams)[0], collapsed[0], rtol=1e-6)  # same pre weights as above


def test_sqrtsoftplus_and_clamped_swiglu_by_hand():
    x = np.array([-30, 0, 2, 30], F32)
    np.testing.assert_allclose(softplus(x), [math.log1p(math.exp(-30)), math.log(2), math.log1p(math.exp(2)), 30],
                               rtol=1e-6)  # fmt: skip
    eye = QTensor("f32", np.eye(2, dtype=F32), None, 2, 2, None)
    e = ClampedExpert(eye, eye, eye, limit=10.0)
    got = e(np.array([[20, -30], [1, 2]], F32))
    silu = lambda v: v / (1 + math.exp(-v))  # noqa: E731
    want = [[silu(10) * 10, silu(-30) * -10], [silu(1) * 1, silu(2) * 2]]  # gate <= 10, |up| <= 10
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_hash_layer_routes_by_the_stored_table_and_the_others_by_score():
    f = SafetensorsFile(FIXTURE / "model.safetensors")
    table = f.read("model.layers.0.ffn.gate.tid2eid")
    f.close()
    ids = np.array([0, 7, 199, 42])
    with load_model(FIXTURE, record_usage=False) as m:
        x = np.random.default_rng(0).standard_normal((4, 64)).astype(F32)
        idx, w = m.layers[0].ffn.route(x, ids)
        assert np.array_equal(idx, table[ids])
        np.testing.assert_allclose(w.sum(-1), 1.5, rtol=1e-6)  # renormalised, times routed_scaling_factor
        idx1, _ = m.layers[1].ffn.route(x, ids)  # top-2 of sqrtsoftplus + bias, whatever the token
        assert not m.layers[1].ffn.hash and idx1.shape == (4, 2)
        assert np.array_equal(m.layers[1].ffn.route(x, ids[::-1])[0], idx1)


def test_compressor_caches_emit_at_the_rate_and_the_indexer_keeps_a_strict_subset():
    ref = reference("deepseek_v4", "f32")
    with load_model(FIXTURE, record_usage=False) as m:
        generate(m, ref["prompt_ids"], 32)  # prompt 8 + 31 fed back: positions 0..38
        csa, hca = m.layers[0].attn, m.layers[1].attn
        assert (csa.compressor.count, csa.indexer.compressor.count, hca.compressor.count) == (9, 9, 4)
        assert csa.compressor.pending_kv.shape[0] == 3 and hca.compressor.pending_kv.shape[0] == 7
        assert csa.kc.length == 7 and csa.first == 32  # sliding window 8: the last 7 keys stay
        m.reset()
        assert csa.compressor.count == 0 and csa.compressor.prev is None and csa.kc.length == 0
        ids = ref["teacher_forced"]["input_ids"]  # 40 tokens: 10 CSA entries
        x = np.random.default_rng(1).standard_normal((40, 64)).astype(F32)
        q_resid = np.random.default_rng(2).standard_normal((40, 48)).astype(F32)
        pos = np.arange(40)
        cos, sin = csa.rope.cos_sin(pos)
        sel = csa.indexer(x, q_resid, pos, cos, sin)
        assert sel.shape == (40, 10) and len(ids) == 40
        assert sel.sum(1).tolist() == [min((t + 1) // 4, 6) for t in range(40)]  # index_topk 6 of the visible
        assert not (sel & ~visible(pos, 10, 4)).any()


def test_visible_entries_by_hand():
    assert visible(np.array([0, 3, 4, 7, 8]), 3, 4).tolist() == [
        [False, False, False], [True, False, False], [True, False, False], [True, True, False],
        [True, True, False],
    ]  # fmt: skip


def _copy_with_config(tmp_path, **changes):
    d = tmp_path / "m"
    shutil.copytree(FIXTURE, d, ignore=shutil.ignore_patterns("reference"))
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"scoring_func": "sigmoid"}, "scoring_func 'sigmoid' is not supported"),
        ({"num_key_value_heads": 2}, "one shared K = V head"),
        ({"layer_types": ["compressed_sparse_attention"]}, "layer_types must list"),
        ({"mlp_layer_types": ["hash_moe", "dense"]}, "mlp_layer_types must list hash_moe / moe"),
        ({"o_groups": 3}, "do not split into o_groups = 3"),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path, changes, says):
    with pytest.raises(RuntimeModelError, match=says):
        load_model(_copy_with_config(tmp_path, **changes), record_usage=False)


def test_tid2eid_outside_the_experts_is_one_clear_error(tmp_path):
    d = _copy_with_config(tmp_path)
    f = SafetensorsFile(d / "model.safetensors")
    tensors = {n: f.read(n) for n in f.tensors}
    f.close()
    tensors["model.layers.0.ffn.gate.tid2eid"] = np.full((200, 2), 4, dtype=np.int64)  # 4 experts: 0..3
    write_safetensors(d / "model.safetensors", tensors)
    with pytest.raises(RuntimeModelError, match=r"tid2eid names an expert outside 0\.\.3"):
        load_model(d, record_usage=False)


def test_legacy_config_keys_give_the_same_model(tmp_path):
    """Older V4 configs spell the schedule the V3 way (transformers 5.24 folds them in): ``compress_ratios``,
    ``compress_rate_hca``, ``num_hash_layers``, ``qk_rope_head_dim`` and flat rope keys."""
    d = _copy_with_config(tmp_path, compress_ratios=[4, 128], compress_rate_hca=8, num_hash_layers=1)
    cfg = json.loads((d / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "compress_rates", "partial_rotary_factor", "rope_parameters"):
        del cfg[key]
    assert cfg["qk_rope_head_dim"] == 8 and cfg["compress_rope_theta"] == 160000.0
    (d / "config.json").write_text(json.dumps(cfg))
    check_against_reference(d, "deepseek_v4", reference("deepseek_v4", "f32"))


def _off(m, what: str) -> None:
    for layer in m.layers:
        a = layer.attn
        if what == "compressor" and a.compressor is not None:
            a.compressor.enabled = False
        elif what == "indexer" and a.indexer is not None:
            a.indexer.enabled = False
        elif what == "inverse rope":
            a.inverse_rope = False
        elif what == "sigmoid scores":
            layer.ffn.score_fn = "sigmoid"
        elif what == "hyper-connections":
            layer.hc_enabled = False


@pytest.mark.parametrize("what", ["compressor", "indexer", "inverse rope", "sigmoid scores", "hyper-connections"])
def test_each_component_changes_the_runtime_tokens(what):
    """The runtime's switches (the runtime side of oracles/mutation_check.py's V4 mutations): each component
    matters on this fixture, so the oracle match above really covers it."""
    ref = reference("deepseek_v4", "f32")
    with load_model(FIXTURE, record_usage=False) as m:
        _off(m, what)
        got = generate(m, ref["prompt_ids"], 32).generated_ids
    assert got != ref["generated_ids"]


def test_decoding_from_one_token_matches_the_batched_forward():
    """The indexer's compressor sees every token, also before the first compressed entry exists: a one-token prompt
    decoded token by token gives the batched forward's argmax at every position (it used to feed the indexer only
    once the attention's compressor had an entry, so its entries lagged and the masks no longer matched)."""
    tokens = reference("deepseek_v4", "f32")["teacher_forced"]["input_ids"][:20]
    with load_model(ORACLES / "deepseek_v4", record_usage=False) as model:
        batched = model.forward(tokens, all_logits=True)
        model.reset()
        stepped = np.stack([model.forward([t]) for t in tokens])
    assert np.array_equal(batched.argmax(-1), stepped.argmax(-1))
    assert np.allclose(batched, stepped, atol=1e-4)
