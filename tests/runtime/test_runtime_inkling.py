"""Inkling (inkling_mm_model, inkling_text) and Inkling-2 (inkling2, inkling2_text) beyond the oracle matrix:
``--cap 1``, prefill split into pieces (the short-convolution states, static and dynamic, the sliding window and
the relative-position bias across calls), the cache reset, the text-only types, and config refusals.

Expected tokens and logits are the transformers references of the committed fixture (oracles/README.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from containers import build_container
from oracle_refs import LOGITS_ATOL, ORACLES, check_against_reference, reference, reference_logits

from colitools.errors import RuntimeModelError
from colitools.runtime import generate, load_model
from colitools.runtime.config import ModelArgs

FIXTURE = ORACLES / "inkling"
FIXTURES = ("inkling", "inkling2", "inkling2_blocks")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["default", "int3", "mxfp4"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_cap_1_changes_no_token(fixture, recipe, tmp_path):
    ref = reference(fixture, recipe)
    check_against_reference(build_container(ORACLES / fixture, ref, tmp_path / "c"), fixture, ref, cap=1)


@pytest.mark.parametrize("pieces", [(3, 1, 9), (1, 1, 1, 1, 20), (16, 1)])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_prefill_in_pieces_equals_the_teacher_forced_reference(fixture, pieces):
    """Calls that start from cached keys and conv states (past the window of 8 and the rel_extent of 16)."""
    ref = reference(fixture, "f32")
    ids = ref["teacher_forced"]["input_ids"]
    want = reference_logits(fixture, ref)[1]
    bounds = np.cumsum((0, *pieces, len(ids) - sum(pieces)))
    with load_model(ORACLES / fixture, record_usage=False) as model:
        rows = [model.forward(ids[a:b], all_logits=True) for a, b in zip(bounds, bounds[1:], strict=False)]
    logits = np.concatenate(rows)
    assert [int(i) for i in logits.argmax(-1)] == ref["teacher_forced"]["argmax"]
    np.testing.assert_allclose(logits[-1], want, rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_reset_empties_the_caches_and_conv_states(fixture):
    ref = reference(fixture, "f32")
    with load_model(ORACLES / fixture, record_usage=False) as model:
        first = generate(model, ref["prompt_ids"], 10).generated_ids
        model.reset()
        again = generate(model, ref["prompt_ids"], 10).generated_ids
    assert first == again == ref["generated_ids"][:10]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_text_only_type_runs_the_multimodal_reference(fixture, tmp_path):
    """``inkling_text`` / ``inkling2_text`` (the text config at the top) is the same text model; the towers are
    not read."""
    config = json.loads((ORACLES / fixture / "config.json").read_text())["text_config"]
    assert config["model_type"] in ("inkling_text", "inkling2_text")
    out = tmp_path / "text"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").symlink_to(ORACLES / fixture / "model.safetensors")
    check_against_reference(out, fixture, reference(fixture, "f32"))


def _config(**changes) -> dict:
    c = json.loads((FIXTURE / "config.json").read_text())
    c["text_config"].update(changes)
    return c


def test_default_layer_schedule_is_five_sliding_then_one_global():
    a = ModelArgs.from_config(_config(num_hidden_layers=12, layer_types=None, mlp_layer_types=None))
    assert a.layer_types == (("hybrid_sliding",) * 5 + ("hybrid",)) * 2 and a.window == 8
    assert a.moe_layers == [True] * 12
    assert (a.d_rel, a.rel_extent, a.n_shared, a.mup) == (4, 16, 2, 2.0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(layer_types=["hybrid"]), "layer_types must list 2 of hybrid_sliding, hybrid"),
        (dict(layer_types=["hybrid", "sliding_attention"]), "layer_types must list 2"),
        (dict(swa_num_key_value_heads=3), "2 sliding attention heads do not split into 3 kv heads"),
        (dict(mlp_layer_types=["sparse", "moe"]), "mlp_layer_types must be dense / sparse"),
    ],
)
def test_bad_inkling_configs_are_refused_in_one_line(changes, message):
    with pytest.raises(RuntimeModelError, match=message) as exc:
        ModelArgs.from_config(_config(**changes))
    assert "\n" not in str(exc.value)


def _config2(**changes) -> dict:
    c = json.loads((ORACLES / "inkling2" / "config.json").read_text())
    c["text_config"].update(changes)
    return c


def test_inkling2_defaults_and_schedule():
    a = ModelArgs.from_config(_config2(num_hidden_layers=12, layer_types=None))
    assert a.layer_types == (("hybrid_sliding",) * 5 + ("hybrid",)) * 2
    assert (
        a.routing.router == "noaux_tc"
        and a.routing.routed_scaling_factor == 8.0
        and a.moe_layers == [True] * 12
    )
    i = a
    assert (i.qk_clip, i.rel_clip, i.gate_cap, i.up_cap, i.logit_cap, i.block) == (6.0, 3.0, 2.0, 4.0, 5.0, 1)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(layer_types=["hybrid", "full_attention"]), "layer_types must list 2 of hybrid_sliding, hybrid"),
        (dict(scoring_func="softmax"), "scoring_func 'softmax' is not supported"),
        (dict(n_layers_per_attn_res_block=0), "n_layers_per_attn_res_block"),
        (dict(swa_num_key_value_heads=3), "4 sliding attention heads do not split into 3 kv heads"),
    ],
)
def test_bad_inkling2_configs_are_refused_in_one_line(changes, message):
    with pytest.raises(RuntimeModelError, match=message) as exc:
        ModelArgs.from_config(_config2(**changes))
    assert "\n" not in str(exc.value)
