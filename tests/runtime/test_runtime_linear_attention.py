"""Gated DeltaNet hybrids (qwen3_next, qwen3_5_moe, qwen3_5_moe_text) beyond the oracle matrix: prefill split
into pieces, the cache reset, ``--cap 1``, the text-only type, and the config schedule and refusals.

Expected tokens and logits are the transformers references of the committed fixtures (oracles/README.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from containers import build_container
from oracle_refs import LOGITS_ATOL, ORACLES, check_against_reference, reference, reference_logits

from colitools.errors import ColitoolsError
from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors
from colitools.runtime import generate, load_model
from colitools.runtime.config import ModelArgs
from colitools.runtime.linear_attention import CHUNK

HYBRIDS = ("qwen3_next", "qwen3_5_moe", "qwen3_next_long")


def test_long_fixture_crosses_a_chunk_in_prefill_and_teacher_forcing():
    ref = reference("qwen3_next_long", "f32")
    assert len(ref["prompt_ids"]) > CHUNK == 64
    assert len(ref["teacher_forced"]["input_ids"]) > CHUNK


@pytest.mark.parametrize("pieces", [(50, 1, 30), (1, 1, 63, 2), (64, 1)])
def test_prefill_in_pieces_equals_the_teacher_forced_reference(pieces):
    """Chunked calls that start from a state (conv history + delta-rule state) and one-token recurrent steps in
    between give every position's argmax of transformers' single no-cache forward."""
    ref = reference("qwen3_next_long", "f32")
    ids = ref["teacher_forced"]["input_ids"]
    want = reference_logits("qwen3_next_long", ref)[1]
    bounds = np.cumsum((0, *pieces, len(ids) - sum(pieces)))
    with load_model(ORACLES / "qwen3_next_long", record_usage=False) as model:
        rows = [model.forward(ids[a:b], all_logits=True) for a, b in zip(bounds, bounds[1:], strict=False)]
    logits = np.concatenate(rows)
    assert [int(i) for i in logits.argmax(-1)] == ref["teacher_forced"]["argmax"]
    np.testing.assert_allclose(logits[-1], want, rtol=0, atol=LOGITS_ATOL)


def test_reset_empties_the_linear_attention_state():
    ref = reference("qwen3_next", "f32")
    with load_model(ORACLES / "qwen3_next", record_usage=False) as model:
        first = generate(model, ref["prompt_ids"], 8).generated_ids
        model.reset()
        again = generate(model, ref["prompt_ids"], 8).generated_ids
    assert first == again == ref["generated_ids"][:8]


@pytest.mark.slow
@pytest.mark.parametrize("fixture", HYBRIDS)
def test_cap_1_changes_no_token(fixture, tmp_path):
    ref = reference(fixture, "default")
    out = build_container(ORACLES / fixture, ref, tmp_path / "c", layout="pairs")
    check_against_reference(out, fixture, ref, cap=1)


def test_text_only_type_runs_the_multimodal_reference(tmp_path):
    """``qwen3_5_moe_text`` (Qwen3_5MoeForCausalLM: text config at the top, names under ``model.``) is the same
    text model as the multimodal fixture without its tower."""
    src = ORACLES / "qwen3_5_moe"
    config = json.loads((src / "config.json").read_text())["text_config"]
    f = SafetensorsFile(src / "model.safetensors")
    tensors = {}
    for name in f.tensors:
        if name.startswith("model.visual."):
            continue
        tensors[name.replace("model.language_model.", "model.", 1)] = f.read(name)
    f.close()
    out = tmp_path / "text"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    write_safetensors(out / "model.safetensors", tensors)
    assert config["model_type"] == "qwen3_5_moe_text"
    check_against_reference(out, "qwen3_5_moe", reference("qwen3_5_moe", "f32"))


def _config(**changes) -> dict:
    c = json.loads((ORACLES / "qwen3_next" / "config.json").read_text())
    c.update(changes)
    return {k: v for k, v in c.items() if v is not None}


def test_layer_schedule_defaults_to_full_attention_every_fourth_layer():
    a = ModelArgs.from_config(_config(num_hidden_layers=8, layer_types=None, mlp_only_layers=None))
    assert a.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"]  # fmt: skip
    assert a.moe_layers == [True] * 8
    b = ModelArgs.from_config(_config(num_hidden_layers=4, layer_types=None, full_attention_interval=2))
    assert b.layer_types == ["linear_attention", "full_attention"] * 2
    assert b.moe_layers == [False, True, True, True]
    la = b.linear_attention
    assert (la.conv_kernel, la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim) == (
        4, 2, 4, 16, 16)  # fmt: skip
    assert la.fused_projections and b.attention.output_gate and b.zero_centred_norms and b.rope.dim == 4


def test_qwen3_5_always_renormalises_and_has_no_dense_layers():
    c = json.loads((ORACLES / "qwen3_5_moe" / "config.json").read_text())
    c["text_config"]["norm_topk_prob"] = False  # not a Qwen3.5 option: its router always renormalises
    a = ModelArgs.from_config(c)
    assert (
        a.routing.norm_topk_prob and a.moe_layers == [True, True] and not a.linear_attention.fused_projections
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(layer_types=["linear_attention"]), "layer_types must list 2 of linear_attention, full_"),
        (dict(layer_types=["linear_attention", "sliding_attention"]), "layer_types must list 2"),
        (dict(linear_num_value_heads=3), "3 linear value heads do not split into 2 key heads"),
        (dict(linear_conv_kernel_dim=0), "linear_conv_kernel_dim is 0"),
    ],
)
def test_bad_hybrid_configs_are_refused_in_one_line(changes, message):
    with pytest.raises(ColitoolsError, match=message) as exc:  # RuntimeModelError; ConfigError of the config facts
        ModelArgs.from_config(_config(**changes))
    assert "\n" not in str(exc.value)
