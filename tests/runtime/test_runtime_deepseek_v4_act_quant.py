"""``colitools run --act-quant official`` (issue 27 item 5): DeepSeek-V4's activation rounding as colibri's
c/deepseek_v4.c reproduces it (colitools/runtime/deepseek_v4_quant.py). The roundings are pinned on hand-worked
vectors here, and a row's logits are pinned to be the same whatever the batch (prefill = token-by-token decode,
as the engine evaluates every row); the whole-model agreement with the engine is measured by
bench/colibri_compat.py (docs/FORMATS.md §4, the engines table), which CI cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from oracle_refs import ORACLES, reference

from colitools.errors import ParameterError
from colitools.runtime import load_model
from colitools.runtime.config import RopeArgs
from colitools.runtime.deepseek_v4 import Compressor, TailRope
from colitools.runtime.deepseek_v4_hc import reference_mixes
from colitools.runtime.deepseek_v4_quant import (
    ActQuant,
    bf16,
    fma,
    fp4_qdq,
    fp8_qdq,
    hadamard,
    ordered_dot,
    ordered_mean_square,
)
from colitools.runtime.kernels import QTensor
from colitools.runtime.ops import Linear


def test_fp8_blocks_scale_by_a_power_of_two_and_round_to_nearest_even():
    # amax 896 = 448 * 2: the scale is exactly 2 (a power of two keeps its exponent); 0.15 / 2 = 0.075 -> e4m3
    # 0.078125 (0.0625 + 2 steps of 2^-7), times 2
    assert fp8_qdq(np.array([896.0, 1.0, 0.15, -2.5], np.float32), 4).tolist() == [896.0, 1.0, 0.15625, -2.5]
    # amax 1344 = 448 * 3: scale 2^ceil(log2 3) = 4; 1344 / 4 = 336 is halfway 320 / 352: ties to even (320)
    assert fp8_qdq(np.array([1344.0, 0.0, 0.0, 0.0], np.float32), 4).tolist() == [1280.0, 0.0, 0.0, 0.0]
    # two blocks of 2 are scaled apart; a zero block stays zero (amax floor 1e-4)
    assert fp8_qdq(np.array([[896.0, 0.15, 0.0, 0.0]], np.float32), 2).tolist() == [
        [896.0, 0.15625, 0.0, 0.0]
    ]
    assert fp8_qdq(np.array([1.0, 3.0, 7.0], np.float32), 2).tolist() == [1.0, 3.0, 7.0]  # padded last block


def test_fp4_blocks_take_the_nearest_code_ties_to_the_smaller_magnitude():
    assert fp4_qdq(np.array([6.0, 1.25, -0.25, 2.5], np.float32), 4).tolist() == [6.0, 1.0, 0.0, 2.0]
    # amax 12: scale 2; -5 / 2 = -2.5 -> -2 -> -4; 0.8 / 2 = 0.4 -> 0.5 -> 1; 7 / 2 = 3.5 -> 3 -> 6
    assert fp4_qdq(np.array([12.0, -5.0, 0.8, 7.0], np.float32), 4).tolist() == [12.0, -4.0, 1.0, 6.0]


def test_hadamard_is_the_butterfly_over_sqrt_n_in_bf16():
    assert hadamard(np.array([1.0, 2.0, 3.0, 4.0], np.float32)).tolist() == [5.0, -1.0, -2.0, 0.0]
    assert hadamard(np.eye(4, dtype=np.float32)[0]).tolist() == [0.5] * 4
    assert bf16(np.array([1.00390625], np.float32)).tolist() == [1.0]  # halfway: ties to even
    with pytest.raises(ValueError):
        hadamard(np.ones(6, np.float32))


# issue 45: the mean squares of the norms and the hyper-connections are summed in index order, one F32 rounding
# per addition, as colibri's engine loops (coli_v4_rmsnorm, coli_v4_hc_pre, final_hidden); numpy's pairwise mean
# gave another last bit at some rows of the 128-wide check, and the BF16 rounding after the norm a whole BF16 step
SMALL = 2.0**-12  # its square 2^-24 is half an F32 step of 1


def test_ordered_mean_square_adds_the_squares_in_index_order():
    # [1, s x 15]: 1 + 2^-24 is halfway between 1 and 1 + 2^-23, ties to even keep 1, fifteen times: 1 / 16
    first = np.array([1.0] + [SMALL] * 15, np.float32)
    assert ordered_mean_square(first).tolist() == [0.0625]
    # [s x 15, 1]: 15 * 2^-24 is exact, then 1 + 7.5 * 2^-23 is halfway 7 / 8 steps: even 8, 1 + 2^-20; / 16
    last = first[::-1].copy()
    assert ordered_mean_square(last).tolist() == [0.0625 + 2.0**-24]
    # rows are independent ([..., 1] kept for broadcasting)
    assert ordered_mean_square(np.stack([first, last])).tolist() == [[0.0625], [0.0625 + 2.0**-24]]
    # the pairwise mean numpy uses differs from both: the rule is not numpy's
    assert float(np.mean(np.square(first))) not in (0.0625, 0.0625 + 2.0**-24)


def test_official_rms_norm_and_hyper_mixes_use_the_ordered_mean_square():
    q = ActQuant()
    x = np.array([[1.0] + [SMALL] * 15], np.float32)
    off = q.rms_norm(x, None, 0.0)
    q.mode = "official"
    # mean square 1 / 16 exactly: rsqrt 4, so the first channel is 4 and the others 4 * 2^-12 = 2^-10
    assert q.rms_norm(x, None, 0.0).tolist() == [[4.0] + [2.0**-10] * 15]
    assert q.rms_norm(x, np.full(16, 0.5, np.float32), 0.0).tolist() == [[2.0] + [2.0**-11] * 15]
    assert not np.array_equal(off, q.rms_norm(x, None, 0.0))  # off: numpy's mean, another last bit
    # DeepSeek's hc_pre order: the raw streams times fn (products 1 and 2^-24 x 15: summed in order, 1), scaled
    # by rsqrt(mean square) = 4 afterwards
    assert reference_mixes(x, x.T, 0.0).tolist() == [[4.0]]


def test_ordered_dot_rounds_each_product_and_adds_them_in_index_order():
    first = np.array([1.0] + [SMALL] * 15, np.float32)
    last = first[::-1].copy()
    # products 1 and 2^-24: as the mean squares above, 1 first keeps 1, 1 last gives 1 + 2^-20
    assert ordered_dot(first[None], first[:, None]).tolist() == [[1.0]]
    assert ordered_dot(last[None], last[:, None]).tolist() == [[1.0 + 2.0**-20]]
    # each product rounded to F32 first: (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 -> 1 + 2^-11 (tie, even), plus
    # 2^-24 x 2 in order: two more ties to even, 1 + 2^-11
    x = np.array([[1.0 + SMALL, SMALL, SMALL]], np.float32)
    assert ordered_dot(x, x.T).tolist() == [[1.0 + 2.0**-11]]
    # two outputs, two rows: [N, K] @ [K, M]
    w_t = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert ordered_dot(np.array([[1.0, 1.0], [2.0, 0.5]], np.float32), w_t).tolist() == [
        [4.0, 6.0],
        [3.5, 6.0],
    ]


def test_fma_rounds_the_exact_multiply_add_once():
    a = np.float32(1.0 + SMALL)  # a * a = 1 + 2^-11 + 2^-24 exactly
    # minus 1: 2^-11 + 2^-24 exactly (F32 holds it); rounding the product first would lose the 2^-24
    assert fma(a, a, np.float32(-1.0)).tolist() == 2.0**-11 + 2.0**-24
    assert float(np.float32(a * a) - np.float32(1.0)) == 2.0**-11
    # the product is a tie between 1 + 2^-11 and 1 + 2^-11 + 2^-23: a tiny addend decides it, both ways (a sum
    # rounded to F64 first would lose the 2^-80 and then round the tie to even, 1 + 2^-11)
    assert fma(a, a, np.float32(2.0**-80)).tolist() == 1.0 + 2.0**-11 + 2.0**-23
    assert fma(a, a, np.float32(-(2.0**-80))).tolist() == 1.0 + 2.0**-11
    # element-wise with broadcasting, exact cases unchanged
    assert fma(np.array([2.0, 3.0], np.float32), np.float32(0.5), np.float32(1.0)).tolist() == [2.0, 2.5]


def _indexer_compressor(norm: list[float]) -> Compressor:
    """A real ``Compressor`` (rate 1, two channels, both roped, the indexer's rotated form) with identity ``wkv``,
    zero ``wgate`` / ``ape``: each token's entry is its own input, normed, roped at its position, rotated."""
    comp = object.__new__(Compressor)  # the checkpoint loader is not what this pins
    comp.d, comp.rate, comp.overlap, comp.eps, comp.rotated, comp.enabled = 2, 1, False, 1e-6, True, True
    comp.rope = TailRope(RopeArgs(theta=10000.0, dim=2, interleaved=True))  # pair 0: angle = position
    comp.quant = ActQuant()
    comp.quant.mode = "official"
    comp.wkv = Linear(QTensor("f32", np.eye(2, dtype=np.float32), None, 2, 2, None))
    comp.wgate = Linear(QTensor("f32", np.zeros((2, 2), np.float32), None, 2, 2, None))
    comp.ape, comp.norm = np.zeros((1, 2), np.float32), np.array(norm, np.float32)
    comp.reset()
    return comp


def test_indexer_keys_round_the_roped_channels_to_bf16_before_the_hadamard():
    """issue 45 (the 128-wide check, head_dim 32, seed 8): the engine's compressor rounds the roped channels to BF16
    (as DeepSeek's BF16 tensors are) before the indexer's Hadamard; colitools rotated the unrounded ones."""
    x = np.array([[-3.0, -3.0], [-3.0, -3.0]], np.float32)
    # normed: [-1, -1] * [0.75, 0.5] = [-0.75, -0.5] (BF16 exact)
    # position 0 (no rotation): Hadamard [-1.25, -0.25] / sqrt 2 -> BF16 [-0.8828125, -0.17675781]; amax 0.88:
    # scale 2^-2, [-3.53, -0.71] -> e2m1 [-4, -0.5] -> [-1.0, -0.125]
    # position 1 (1 rad): [-0.75 cos 1 + 0.5 sin 1, -0.5 cos 1 - 0.75 sin 1] = [0.0155088, -0.9012544] -> BF16
    # [0.01550293, -0.90234375]; Hadamard [-0.88684 / sqrt 2, 0.91785 / sqrt 2] -> BF16 [-0.62890625, 0.6484375];
    # scale 2^-3: [-5.03, 5.19] -> e2m1 [-6, 6] -> [-0.75, 0.75]. Unrounded, the first would be -0.625 / 2^-3 = -5,
    # a tie that goes to the smaller magnitude, -4 -> -0.5.
    assert _indexer_compressor([0.75, 0.5])(x).tolist() == [[-1.0, -0.125], [-0.75, 0.75]]


def test_official_rounding_changes_the_logits_and_the_default_does_not():
    ref = reference("deepseek_v4", "f32")
    ids = [int(t) for t in ref["teacher_forced"]["input_ids"]]
    logits = {}
    for mode in (None, "official", "official"):
        with load_model(ORACLES / "deepseek_v4", record_usage=False, act_quant=mode) as model:
            logits.setdefault(mode, []).append(model.forward(ids, all_logits=True))
    a, b1, b2 = logits[None][0], *logits["official"]
    assert np.array_equal(b1, b2)  # deterministic
    assert np.argmax(a, axis=-1).tolist() == [int(t) for t in ref["teacher_forced"]["argmax"]]
    assert (
        float(np.max(np.abs(a - b1))) > 1e-3
    )  # the rounding acts (its size is the engine's, not pinned here)


def test_official_rounding_gives_a_row_the_same_logits_whatever_the_batch():
    # numpy's multi-row matmuls sum in another order than one-row ones (~1e-6), which an emulated FP8 / BF16
    # rounding can magnify (0.003 on this fixture, an argmax on the 128-wide one): every row must see decode's
    # arithmetic, in one batch of 40, in two chunks, or one token at a time
    ids = [int(t) for t in reference("deepseek_v4", "f32")["teacher_forced"]["input_ids"]]
    assert len(ids) == 40
    with load_model(ORACLES / "deepseek_v4", record_usage=False, act_quant="official") as model:
        batched = model.forward(ids, all_logits=True)
        model.reset()
        chunked = np.concatenate(
            [model.forward(ids[:17], all_logits=True), model.forward(ids[17:], all_logits=True)]
        )
        model.reset()
        stepped = np.stack([model.forward([t]) for t in ids])
        model.reset()
        last = model.forward(ids)  # the last position only, as generate's prefill asks
    assert np.array_equal(batched, stepped)
    assert np.array_equal(chunked, stepped)
    assert np.array_equal(last, stepped[-1])


def test_a_family_without_the_mode_refuses_it_in_one_line(tmp_path):
    with pytest.raises(ParameterError, match=r"`act_quant=official`: model_type 'olmoe' has no such"):
        load_model(ORACLES / "olmoe", record_usage=False, act_quant="official")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli("run", ORACLES / "deepseek_v4", "--prompt-ids", "3,4", "--act-quant", "bf16", "--no-usage")
    one_line_error(r, "--act-quant bf16", "'deepseek_v4' has no such activation rounding", "official", code=2)
