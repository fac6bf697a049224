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
from colitools.runtime.deepseek_v4_quant import bf16, fp4_qdq, fp8_qdq, hadamard


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
