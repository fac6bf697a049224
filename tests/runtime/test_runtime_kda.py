"""KDA families (kimi_linear, glm5_next) beyond the oracle matrix: prefill split into pieces, chunks smaller
than the sequence, the cache reset, ``--cap 1``, the text-only ``glm5_next_text``, config spellings and refusals.

Expected tokens and logits are the transformers references of the committed fixtures (oracles/README.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from containers import build_container
from oracle_refs import LOGITS_ATOL, ORACLES, check_against_reference, reference, reference_logits

from colitools.errors import ColitoolsError, RuntimeModelError
from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors
from colitools.runtime import generate, load_model
from colitools.runtime.config import ModelArgs
from colitools.runtime.kda import KimiDeltaAttention

KDA_FIXTURES = ("kimi_linear", "glm5_next")


def _teacher_forced(model, ids, pieces=None):
    pieces = pieces or (len(ids),)
    bounds = np.cumsum((0, *pieces, len(ids) - sum(pieces)))
    rows = [model.forward(ids[a:b], all_logits=True) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    return np.concatenate(rows)


@pytest.mark.parametrize("fixture", KDA_FIXTURES)
@pytest.mark.parametrize("pieces", [(9, 1, 20), (1, 1, 3, 2), (39,)])
def test_prefill_in_pieces_equals_the_teacher_forced_reference(fixture, pieces):
    """Calls that start from a state (conv history + delta-rule state) and one-token recurrent steps in between
    give every position's argmax of transformers' single no-cache forward."""
    ref = reference(fixture, "f32")
    ids = ref["teacher_forced"]["input_ids"]
    with load_model(ORACLES / fixture, record_usage=False) as model:
        logits = _teacher_forced(model, ids, pieces)
    assert [int(i) for i in logits.argmax(-1)] == ref["teacher_forced"]["argmax"]
    np.testing.assert_allclose(logits[-1], reference_logits(fixture, ref)[1], rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("fixture", KDA_FIXTURES)
@pytest.mark.parametrize("chunk", [1, 8, 13])
def test_chunks_smaller_than_the_sequence_give_the_reference(fixture, chunk):
    """The fixtures' sequences fit in one chunk of 64; with small chunks the inter-chunk state passing (decay of
    the state per key channel, ``v_new``) runs and must still give transformers' logits."""
    ref = reference(fixture, "f32")
    ids = ref["teacher_forced"]["input_ids"]
    assert len(ids) > 2 * chunk
    with load_model(ORACLES / fixture, record_usage=False) as model:
        kda = [layer.attn for layer in model.layers if isinstance(layer.attn, KimiDeltaAttention)]
        assert kda
        for attn in kda:
            attn.chunk = chunk
        logits = _teacher_forced(model, ids)
    assert [int(i) for i in logits.argmax(-1)] == ref["teacher_forced"]["argmax"]
    np.testing.assert_allclose(logits[-1], reference_logits(fixture, ref)[1], rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("fixture", KDA_FIXTURES)
def test_reset_empties_the_kda_state(fixture):
    ref = reference(fixture, "f32")
    with load_model(ORACLES / fixture, record_usage=False) as model:
        first = generate(model, ref["prompt_ids"], 8).generated_ids
        model.reset()
        again = generate(model, ref["prompt_ids"], 8).generated_ids
    assert first == again == ref["generated_ids"][:8]


@pytest.mark.slow
@pytest.mark.parametrize("fixture", KDA_FIXTURES)
def test_cap_1_changes_no_token(fixture, tmp_path):
    ref = reference(fixture, "default")
    out = build_container(ORACLES / fixture, ref, tmp_path / "c", layout="pairs")
    check_against_reference(out, fixture, ref, cap=1)


def _kimi(**changes) -> dict:
    c = json.loads((ORACLES / "kimi_linear" / "config.json").read_text())
    c.update(changes)
    return {k: v for k, v in c.items() if v is not None}


def test_kimi_linear_reads_its_own_config_spellings():
    """KimiLinearConfig.attribute_map: num_experts_per_token, moe_renormalize, num_expert_group,
    num_shared_experts, model_max_length are the common keys."""
    a = ModelArgs.from_config(_kimi())
    r = a.routing
    assert (a.num_experts_per_tok, r.norm_topk_prob, r.n_group, r.topk_group) == (2, True, 4, 2)
    assert r.shared_expert_intermediate_size == 64 and a.max_position_embeddings == 512
    assert r.router == "noaux_tc" and r.routed_scaling_factor == pytest.approx(2.446)
    assert a.moe_layers == [False, True] and a.rope.dim == 0 and a.head_dim == 24
    b = ModelArgs.from_config(_kimi(moe_renormalize=False))
    assert not b.routing.norm_topk_prob


def test_kimi_linear_layer_schedule_from_a_hub_linear_attn_config():
    """Hub checkpoints give 1-based ``kda_layers`` / ``full_attn_layers`` and the geometry in
    ``linear_attn_config``; the transformers default is full attention on layers i > 0 with i % 4 == 0."""
    hub = _kimi(num_hidden_layers=4, layer_types=None, mlp_layer_types=None,
                linear_attn_config={"kda_layers": [1, 2, 4], "full_attn_layers": [3], "head_dim": 8,
                                    "num_heads": 2, "short_conv_kernel_size": 3})  # fmt: skip
    a = ModelArgs.from_config(hub)
    assert a.layer_types == ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
    assert (a.kda.head_dim, a.kda.num_heads, a.kda.conv_kernel) == (8, 2, 3)
    assert a.moe_layers == [False, True, True, True]  # first_k_dense_replace default 1
    b = ModelArgs.from_config(_kimi(num_hidden_layers=6, layer_types=None, mlp_layer_types=None))
    assert b.layer_types == ["linear_attention"] * 4 + ["full_attention", "linear_attention"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(layer_types=["linear_attention"]), "layer_types must list 2 of linear_attention, full_"),
        (dict(layer_types=["linear_attention", "indexed_attention"]), "layer_types must list 2"),
        (dict(layer_types=None, linear_attn_config={"kda_layers": [1], "full_attn_layers": [3]}),
         "linear_attn_config: layer 3 is not one of 1..2"),
        (dict(num_experts_per_token=9), "num_experts_per_tok is 9, more than the 8"),
    ],
)
def test_bad_kimi_linear_configs_are_refused_in_one_line(changes, message):
    with pytest.raises(ColitoolsError, match=message):  # RuntimeModelError; ConfigError of the config facts
        ModelArgs.from_config(_kimi(**changes))


def test_glm5_next_text_runs_the_multimodal_reference(tmp_path):
    """``glm5_next_text`` (text config at the top, names under ``model.``) is the multimodal fixture's text model
    without its tower."""
    src = ORACLES / "glm5_next"
    config = json.loads((src / "config.json").read_text())["text_config"]
    f = SafetensorsFile(src / "model.safetensors")
    tensors = {n.replace("model.language_model.", "model.", 1): f.read(n) for n in f.tensors
               if not n.startswith("model.visual.")}  # fmt: skip
    f.close()
    out = tmp_path / "text"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    write_safetensors(out / "model.safetensors", tensors)
    assert config["model_type"] == "glm5_next_text"
    check_against_reference(out, "glm5_next", reference("glm5_next", "f32"))


def _glm(**changes) -> dict:
    c = json.loads((ORACLES / "glm5_next" / "config.json").read_text())
    c["text_config"].update(changes)
    c["text_config"] = {k: v for k, v in c["text_config"].items() if v is not None}
    return c


def test_glm5_next_config():
    a = ModelArgs.from_config(_glm())
    assert a.layer_types == ["linear_attention", "indexed_attention"] and a.moe_layers == [False, True]
    assert (a.hyper.mult, a.hyper.sinkhorn_iters, a.indexer.kpool, a.indexer.kpool_tail) == (2, 20, 4, True)
    assert a.kda.lower_bound == -5.0 and not a.kda.a_log_4d and a.mla.latent_norm_eps == 1e-5
    assert a.swiglu_limit == 2.0 and a.head_dim == 16 and a.rope.dim == 0
    b = ModelArgs.from_config(_glm(num_hidden_layers=4, layer_types=None, mlp_layer_types=None,
                                   indexer_types=None))  # fmt: skip
    assert b.layer_types == ["linear_attention"] * 3 + ["indexed_attention"]
    assert b.moe_layers == [False, False, False, True]
    c = ModelArgs.from_config(_glm(layer_types=["linear_attention", "full_attention"]))
    assert c.layer_types == ["linear_attention", "indexed_attention"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(layer_types=["linear_attention", "sliding_attention"]), "layer_types must list 2 of linear_"),
        (dict(index_topk=18), "index_topk 18 is not a multiple of index_kpool 4"),
        (dict(qk_rope_head_dim=8), "has no RoPE, got qk_rope_head_dim 8"),
        (dict(hc_mult=0), "hc_mult and hc_sinkhorn_iters must be >= 1"),
    ],
)
def test_bad_glm5_next_configs_are_refused_in_one_line(changes, message):
    with pytest.raises(RuntimeModelError, match=message):
        ModelArgs.from_config(_glm(**changes))
