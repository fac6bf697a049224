"""gpt-oss pieces on their own, against hand-computed values (the oracle tests run the whole model): the
sliding-window mask and cache, attention sinks, the top-k-then-softmax router, the clamped SwiGLU expert, the
checkpoint's transposed-interleaved stacks, usage recording and refusals."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from containers import build_container, dequant_mxfp4_stack
from oracle_refs import ORACLES, check_against_reference, reference

from colitools.errors import RuntimeModelError
from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors
from colitools.formats.usage import read_usage
from colitools.runtime import generate, load_model
from colitools.runtime.attention import attend, causal_mask, sink_softmax
from colitools.runtime.gpt_oss import ClampedSwiGLUExpert
from colitools.runtime.kernels import QTensor
from colitools.runtime.moe import topk_softmax

F32 = np.float32
FIXTURE = ORACLES / "gpt_oss"


def test_sliding_window_mask_by_hand():
    T, F = True, False
    # window 3: position p sees p-2, p-1, p
    want = np.array([
        [T, F, F, F, F, F],
        [T, T, F, F, F, F],
        [T, T, T, F, F, F],
        [F, T, T, T, F, F],
        [F, F, T, T, T, F],
        [F, F, F, T, T, T],
    ])  # fmt: skip
    assert np.array_equal(causal_mask(np.arange(6), 6, window=3), want)
    assert np.array_equal(causal_mask(np.arange(6), 6), np.tril(np.ones((6, 6), dtype=bool)))
    # decode at position 6 with every key cached, and with only the last two (positions 4, 5) plus itself
    assert causal_mask(np.array([6]), 7, window=3).tolist() == [[F, F, F, F, T, T, T]]
    assert causal_mask(np.array([6]), 3, window=3, first=4).tolist() == [[T, T, T]]
    # a decode step past a wider cache: keys 2..6 cached, window 3 still sees only 4, 5, 6
    assert causal_mask(np.array([6]), 5, window=3, first=2).tolist() == [[F, F, T, T, T]]


def test_sliding_layer_keeps_window_minus_one_keys_and_full_layer_keeps_all():
    ref = reference("gpt_oss", "f32")
    with load_model(FIXTURE, record_usage=False) as m:
        assert m.args.attention.sliding_windows == [4, None]
        generate(m, ref["prompt_ids"], 32)  # prompt 8 + 31 tokens fed back = positions 0..38
        sliding, full = m.layers[0].attn, m.layers[1].attn
        assert (sliding.kc.length, sliding.vc.length, sliding.first) == (3, 3, 36)
        assert (full.kc.length, full.first) == (39, 0)
        m.reset()
        assert (sliding.kc.length, sliding.first) == (0, 0)


def test_sink_softmax_by_hand():
    ln2 = math.log(2.0)
    scores = np.array([[0.0, ln2, -np.inf]], dtype=F32)
    # exp: 1, 2, 0 and the sink exp(0) = 1 in the denominator only
    np.testing.assert_allclose(
        sink_softmax(scores, np.array([[0.0]], dtype=F32)), [[0.25, 0.5, 0.0]], rtol=1e-6
    )
    # a sink of ln 3 takes half the mass: 1/6, 2/6
    got = sink_softmax(scores, np.array([[math.log(3.0)]], dtype=F32))
    np.testing.assert_allclose(got, [[1 / 6, 2 / 6, 0.0]], rtol=1e-6)
    # a sink far above every score (the max is the sink's): weights ~ exp(s - sink)
    got = sink_softmax(np.array([[0.0, 0.0]], dtype=F32), np.array([[20.0]], dtype=F32))
    np.testing.assert_allclose(got, [[math.exp(-20.0)] * 2], rtol=1e-5)


def test_attend_with_sinks_scales_values_by_what_the_sink_leaves():
    # one head, two keys with equal scores: each gets 1/(2 + e^s); values 1 and 3
    q = np.zeros((1, 1, 2), dtype=F32)
    k = np.zeros((2, 1, 2), dtype=F32)
    v = np.array([[[1.0]], [[3.0]]], dtype=F32)
    allowed = np.ones((1, 2), dtype=bool)
    sink = math.log(2.0)  # e^s = 2
    out = attend(q, k, v, allowed, 1.0, np.array([sink], dtype=F32))
    np.testing.assert_allclose(out, [[(1 + 3) / 4]], rtol=1e-6)
    np.testing.assert_allclose(attend(q, k, v, allowed, 1.0), [[2.0]], rtol=1e-6)


def test_router_softmax_over_the_top_k_logits():
    logits = np.array([[1.0, 3.0, 2.0, 0.0], [0.5, -1.0, 0.5 + math.log(3.0), 4.0]], dtype=F32)
    idx, w = topk_softmax(logits, 2)
    assert idx.tolist() == [[1, 2], [3, 2]]
    e = math.e
    np.testing.assert_allclose(w[0], [e / (e + 1), 1 / (e + 1)], rtol=1e-6)
    d = 4.0 - (0.5 + math.log(3.0))
    np.testing.assert_allclose(w[1], [1 / (1 + math.exp(-d)), math.exp(-d) / (1 + math.exp(-d))], rtol=1e-6)


def _f32(w) -> QTensor:
    w = np.asarray(w, dtype=F32)
    return QTensor("f32", w, None, *w.shape, None)


def test_clamped_swiglu_expert_by_hand():
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    eye = np.eye(2)
    biases = (np.array([0.0, 0.0], F32), np.array([0.0, 1.0], F32), np.array([0.5, -0.25], F32))
    ex = ClampedSwiGLUExpert(_f32(eye), _f32(3 * eye), _f32(eye), biases, alpha=1.702, limit=7.0)
    x = np.array([[-8.0, 3.0], [10.0, -0.5]], dtype=F32)
    got = ex(x)
    a = 1.702
    # row 0: gate = (-8, 3) (no lower clamp on gate); up = (-24, 10) -> clipped (-7, 7)
    # row 1: gate = (10 -> 7, -0.5); up = (30 -> 7, -0.5)
    want = [
        [(-7 + 1) * (-8 * sig(-8 * a)) + 0.5, (7 + 1) * (3 * sig(3 * a)) - 0.25],
        [(7 + 1) * (7 * sig(7 * a)) + 0.5, (-0.5 + 1) * (-0.5 * sig(-0.5 * a)) - 0.25],
    ]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_stacks_are_split_the_way_transformers_reads_them():
    """The checkpoint's ``gate_up_proj [E, H, 2I]`` (``x @ W``, gate = even columns) and ``down_proj [E, I, H]``
    read in place give each expert ``[O, I]`` weights equal to the numpy split of the tensors here."""
    f = SafetensorsFile(FIXTURE / "model.safetensors")
    try:
        gu = f.read("model.layers.1.mlp.experts.gate_up_proj")
        dn = f.read("model.layers.1.mlp.experts.down_proj")
        gub = f.read("model.layers.1.mlp.experts.gate_up_proj_bias")
        dnb = f.read("model.layers.1.mlp.experts.down_proj_bias")
    finally:
        f.close()
    with load_model(FIXTURE, cap=1, record_usage=False) as m:
        store = m.stores[1]
        for e in range(4):
            ex = store.get(e)
            assert np.array_equal(ex.gate.codes, gu[e][:, 0::2].T) and np.array_equal(
                ex.up.codes, gu[e][:, 1::2].T
            )
            assert np.array_equal(ex.down.codes, dn[e].T)
            bg, bu, bd = ex.biases
            assert np.array_equal(bg, gub[e][0::2]) and np.array_equal(bu, gub[e][1::2])
            assert np.array_equal(bd, dnb[e])
        assert store.expert_nbytes(0) == (3 * 64 * 64 + 3 * 64) * 4


def test_usage_is_recorded(tmp_path):
    d = shutil.copytree(FIXTURE, tmp_path / "g")
    ids = reference("gpt_oss", "f32")["prompt_ids"]
    with load_model(d) as m:
        generate(m, ids, 4)
    h = read_usage(d / ".coli_usage", n_layers=2, n_experts=4, engine="gpt_oss")
    tokens = len(ids) + 3
    assert h.total == 2 * tokens * 2 and all(t == tokens * 2 for t in h.layer_totals().values())


def test_missing_expert_biases_are_one_clear_error(tmp_path):
    d = shutil.copytree(FIXTURE, tmp_path / "g")
    f = SafetensorsFile(d / "model.safetensors")
    tensors = {n: f.read(n) for n in f.tensors if n != "model.layers.0.mlp.experts.down_proj_bias"}
    f.close()
    write_safetensors(d / "model.safetensors", tensors, {})
    with pytest.raises(
        RuntimeModelError, match=r"missing tensor model\.layers\.0\.mlp\.experts\.down_proj_bias"
    ):
        load_model(d, record_usage=False)


def test_native_mxfp4_stacks_run_as_their_transformers_dequantization(tmp_path):
    """A gpt-oss checkpoint as openai ships it (``gate_up_proj_blocks [E, 2I, H/32, 16]`` + ``_scales``, rows =
    outputs, gate / up rows interleaved) runs on its mxfp4 codes and gives the tokens and logits of the float
    checkpoint holding transformers' dequantization of the same bytes; the test containers read such a source
    too (an oracle fixture with native stacks runs through tests/runtime/containers.py)."""
    from colitools.formats.registry import by_name

    f = SafetensorsFile(FIXTURE / "model.safetensors")
    tensors = {n: f.read(n) for n in f.tensors}
    f.close()
    native, dequant = {}, {}
    for name, a in tensors.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            native[name] = dequant[name] = a
            continue
        w = np.swapaxes(a, 1, 2)  # [E, out, in]: the rows the blocks run along
        E, O, I = w.shape
        enc = [
            by_name("mxfp4").encode(np.ascontiguousarray(w[e]), None, name=name, fast=False) for e in range(E)
        ]
        blocks = np.stack([np.asarray(c, dtype=np.uint8).reshape(O, I // 32, 16) for c, _ in enc])
        scales = np.stack([np.asarray(s, dtype=np.uint8).reshape(O, I // 32) for _, s in enc])
        native[name + "_blocks"], native[name + "_scales"] = blocks, scales
        dequant[name] = dequant_mxfp4_stack(blocks, scales)
        assert dequant[name].shape == a.shape
    dirs = {}
    for label, ts in (("native", native), ("dequant", dequant)):
        d = dirs[label] = tmp_path / label
        d.mkdir()
        shutil.copy(FIXTURE / "config.json", d / "config.json")
        write_safetensors(d / "model.safetensors", ts, {})
    ref = reference("gpt_oss", "f32")
    results = {}
    for label, d in dirs.items():
        with load_model(d, cap=1, record_usage=False) as m:
            res = generate(m, ref["prompt_ids"], 32)
            argmax, last = m.score(ref["teacher_forced"]["input_ids"])
            st = m.stores[0].sources[1]
            results[label] = (res.generated_ids, argmax, res.last_logits, last, [s.form for s in st])
            if label == "native":  # gate = even rows of expert 1's blocks, kept as codes
                # held: gate / up / down 64 x 64 codes (half a byte each) + one E8M0 byte per 32, + F32 biases
                assert m.stores[0].expert_nbytes(1) == 3 * (64 * 32 + 64 * 2) + 3 * 64 * 4
                assert m.stores[0].expert_nbytes(1) == m.stores[0].get(1).nbytes
                codes = m.stores[0].get(1).gate.codes
                assert np.array_equal(
                    codes.reshape(64, -1),
                    native["model.layers.0.mlp.experts.gate_up_proj_blocks"][1, 0::2].reshape(64, -1),
                )
    n, q = results["native"], results["dequant"]
    assert n[4] == ["mxfp4"] * 3 and q[4] == ["float"] * 3
    assert n[0] == q[0] and n[1] == q[1]
    np.testing.assert_allclose(n[2], q[2], rtol=0, atol=1e-4)
    np.testing.assert_allclose(n[3], q[3], rtol=0, atol=1e-4)
    assert n[0] != ref["generated_ids"]  # 4-bit experts change the tokens: not the float model run twice
    # the blocks hold the mxfp4 recipe's codes (mxfp4 is row-wise, so interleaving the rows changes no code):
    # split and re-encoded with the recipe's formats (int8-row dense), it is transformers' mxfp4 reference
    mx = reference("gpt_oss", "mxfp4")
    check_against_reference(build_container(dirs["native"], mx, tmp_path / "c"), "gpt_oss", mx, cap=1)


@pytest.mark.parametrize(
    "drop", ["model.layers.1.mlp.experts.down_proj", "model.layers.0.mlp.experts.gate_up_proj_scales"]
)
def test_an_incomplete_stack_is_one_clear_error(tmp_path, drop):
    d = tmp_path / "g"
    d.mkdir()
    shutil.copy(FIXTURE / "config.json", d / "config.json")
    f = SafetensorsFile(FIXTURE / "model.safetensors")
    tensors = {n: f.read(n) for n in f.tensors}
    f.close()
    if drop.endswith("_scales"):  # a native stack without its scales
        del tensors["model.layers.0.mlp.experts.gate_up_proj"]
        tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"] = np.zeros((4, 128, 2, 16), dtype=np.uint8)
    else:
        del tensors[drop]
    write_safetensors(d / "model.safetensors", tensors, {})
    with pytest.raises(RuntimeModelError, match=f"missing tensor {drop}$"):
        load_model(d, record_usage=False)
