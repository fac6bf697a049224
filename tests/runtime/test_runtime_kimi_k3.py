"""Kimi K3 (``kimi_k3``) beyond the oracle matrix: its own checkpoint (MXFP4 pack-quantized experts, BF16 rest)
run without conversion, prefill in pieces, config spellings and refusals, and the two K3 pieces written out.

Expected tokens and logits are the committed fixture's references (oracles/k3_reference.py, oracles/README.md);
the pieces' expected values are computed here with ``math`` from their definitions."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from oracle_refs import LOGITS_ATOL, ORACLES, reference, reference_logits

from colitools.errors import RuntimeModelError
from colitools.formats import model_config
from colitools.runtime import load_model
from colitools.runtime.config import ModelArgs
from colitools.runtime.kimi_k3 import attn_res, situ_glu

FIXTURE = ORACLES / "kimi_k3"
CONFIG = json.loads((FIXTURE / "config.json").read_text())


@pytest.mark.parametrize("pieces", [(9, 1, 20), (1, 1, 3, 2), (40,)])
def test_its_own_checkpoint_runs_as_shipped_and_in_pieces(pieces):
    """The fixture as K3 ships it (no conversion: mxfp4-pack-quantized experts read as mxfp4, BF16 as float) is
    the f32 recipe's values: every position's argmax and the last logits of its reference, whether the prompt is
    one call or pieces that start from the KDA / MLA caches and attention-residual inputs of the calls before."""
    ref = reference("kimi_k3", "f32")
    ids = ref["teacher_forced"]["input_ids"]
    bounds = np.cumsum((0, *pieces, len(ids) - sum(pieces)))
    with load_model(FIXTURE, record_usage=False) as model:
        rows = [
            model.forward(ids[a:b], all_logits=True)
            for a, b in zip(bounds, bounds[1:], strict=False)
            if b > a
        ]
    logits = np.concatenate(rows)
    assert [int(i) for i in logits.argmax(-1)] == ref["teacher_forced"]["argmax"]
    np.testing.assert_allclose(logits[-1], reference_logits("kimi_k3", ref)[1], rtol=0, atol=LOGITS_ATOL)


def test_k3_reads_its_config_spellings():
    args = ModelArgs.from_config(CONFIG)
    assert args.layer_types == ["linear_attention", "linear_attention", "full_attention"]
    assert (args.kda.num_heads, args.kda.head_dim, args.kda.conv_kernel, args.kda.lower_bound) == (
        2,
        32,
        4,
        -5.0,
    )
    assert args.moe_layers == [False, True, True] and args.num_experts_per_tok == 2  # num_experts_per_token
    assert (args.res_block, args.situ, args.latent, args.shared_inter) == (2, (4.0, 25.0), 64, 64)
    assert (
        args.mla.latent_norm_eps == args.rms_norm_eps == 1e-5
    )  # q_a / kv_a norms: rms_norm_eps (c/kimi_k3.c)
    # kda_layers alone (c/kimi_k3.c reads no full_attn_layers): the other layers are MLA
    cfg = copy.deepcopy(CONFIG)
    del cfg["text_config"]["linear_attn_config"]["full_attn_layers"]
    assert ModelArgs.from_config(cfg).layer_types == args.layer_types


def test_kimi_linear_still_needs_both_layer_lists():
    """Kimi-Linear's nested lists are read as transformers' KimiLinearConfig reads them: both or neither."""
    text = {"num_hidden_layers": 3, "linear_attn_config": {"kda_layers": [1, 2]}}
    assert "layer_types" not in model_config.canonical_keys(text, "kimi_linear")
    assert model_config.canonical_keys(text, "kimi_k3")["layer_types"] == [
        "linear_attention", "linear_attention", "full_attention"]  # fmt: skip


def test_k3_geometry_claims_its_gates_and_latent_projections():
    shapes = model_config.linear_shapes(CONFIG)
    assert shapes[("self_attn", "g_proj")] == (2 * 16, 128)  # MLA: heads * v_head_dim
    assert shapes[("mlp", "routed_expert_down_proj")] == (64, 128)
    assert shapes[("mlp", "routed_expert_up_proj")] == (128, 64)
    kda = model_config.layer_linear_shapes(CONFIG)
    assert set(kda) == {0, 1} and kda[0][("self_attn", "g_proj")] == (64, 128)  # KDA: heads * head_dim
    assert ("self_attn", "g_a_proj") not in kda[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("activation_situ_beta"), "kimi_k3 config has no 'activation_situ_beta'"),
        (lambda t: t.pop("attn_res_block_size"), "kimi_k3 config has no 'attn_res_block_size'"),
        (lambda t: t["linear_attn_config"].update(num_heads=64), "A_log is stored [head_dim]: 64 KDA heads"),
        (
            lambda t: t.update(attn_res_block_size=0),
            "text_config.attn_res_block_size is 0 (expected an integer in [1, 65536])",
        ),
    ],
)
def test_bad_k3_configs_are_refused_in_one_line(change, message):
    cfg = copy.deepcopy(CONFIG)
    change(cfg["text_config"])
    with pytest.raises(Exception) as exc:
        ModelArgs.from_config(cfg)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert isinstance(exc.value, RuntimeModelError | model_config.ConfigError)


def test_situ_glu_is_its_definition():
    g = np.array([1.0, -3.0, 9.0], np.float32)
    u = np.array([2.0, 40.0, -0.5], np.float32)
    want = [
        4 * math.tanh(a / 4) / (1 + math.exp(-a)) * 25 * math.tanh(b / 25) for a, b in zip(g, u, strict=True)
    ]
    np.testing.assert_allclose(situ_glu(g, u, 4.0, 25.0), want, rtol=1e-6)


def test_attention_residual_mixes_the_raw_states_by_their_normed_scores():
    s = np.array([[[3.0, 4.0]]], np.float32)  # one block state, RMS sqrt(12.5)
    x = np.array([[1.0, 0.0]], np.float32)  # the partial state, RMS sqrt(0.5)
    q = np.array([0.5, -1.0], np.float32)
    a = (3 * 0.5 - 4) / math.sqrt(12.5 + 1e-5)
    b = 0.5 / math.sqrt(0.5 + 1e-5)
    p = math.exp(a) / (math.exp(a) + math.exp(b))
    np.testing.assert_allclose(attn_res(s, x, q, 1e-5), [[3 * p + (1 - p), 4 * p]], rtol=1e-6)
