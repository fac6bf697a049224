"""DeepSeek V4.1 Flash (``deepseek_v41``) beyond the oracle matrix: each of its mechanisms changes the tokens of the
fixture (the runtime side of oracles/mutation_check.py's V4.1 mutations), the release's index-key publication (a
decode step reads the keys published last; a prefill its own), the engram hash by hand, and the refusals.

The fixture is ``oracles/deepseek_v41`` (made by ``oracles/make_deepseek_v41.py``, reference
``oracles/dsv41_reference.py``); the references used here are its committed ``f32`` ones.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from oracle_refs import ORACLES, reference, reference_logits

from colitools.errors import RuntimeModelError
from colitools.formats.targets import V41_ENGRAM_FILE
from colitools.runtime import generate, load_model
from colitools.runtime.deepseek_v4 import TailRope
from colitools.runtime.engram import EngramArgs, EngramHash

FIXTURE = ORACLES / "deepseek_v41"


def _copy(tmp_path, edit_text=None, sidecar=True):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").symlink_to(FIXTURE / "model.safetensors")
    cfg = json.loads((FIXTURE / "config.json").read_text())
    if edit_text is not None:
        edit_text(cfg["text_config"])
    (d / "config.json").write_text(json.dumps(cfg))
    if sidecar:
        shutil.copy(FIXTURE / V41_ENGRAM_FILE, d / V41_ENGRAM_FILE)
    return d


def _off(m, what: str) -> None:
    for layer in m.layers:
        a = layer.attn
        if what == "engram" and layer.engram is not None:
            layer.engram.enabled = False
        elif what == "previous pre":
            layer.previous_pre = False
        elif what == "compressor gate" and a.compressor is not None:
            a.compressor.gated = False
        elif what == "two-level top-k" and a.indexer is not None:
            a.indexer.two_level = False
        elif what == "YaRN on window layers" and not a.ratio:
            a.rope = TailRope(m.args.compress_rope)
        elif what == "published keys":
            layer.pub.own_keys = True


MECHANISMS = ["engram", "previous pre", "compressor gate", "two-level top-k", "YaRN on window layers",
              "published keys"]  # fmt: skip


@pytest.mark.parametrize("what", MECHANISMS)
def test_each_mechanism_changes_the_runtime_output(what):
    """Switched off (or read the V4 way), each mechanism changes the greedy tokens or moves a reference logit row by
    more than 1e-4: the oracle match really covers it."""
    ref = reference("deepseek_v41", "f32")
    want = reference_logits("deepseek_v41", ref)
    with load_model(FIXTURE, record_usage=False) as m:
        _off(m, what)
        res = generate(m, ref["prompt_ids"], 32)
        argmax, last = m.score(ref["teacher_forced"]["input_ids"])
    moved = max(np.abs(res.last_logits - want[0]).max(), np.abs(last - want[1]).max())
    assert res.generated_ids != ref["generated_ids"] or argmax != ref["teacher_forced"]["argmax"] or moved > 1e-4


def test_decode_steps_read_the_keys_published_last():
    """A prefill publishes every layer's own keys before its indexer runs, so each indexer reading its own KV
    source's keys changes nothing there; on a decode step whose ratio-2 group is still filling, layer 1 reads the
    keys layer 3 published a step before (as the release does), and reading its own instead changes the output."""
    ref = reference("deepseek_v41", "f32")
    want = reference_logits("deepseek_v41", ref)
    with load_model(FIXTURE, record_usage=False) as m:
        _off(m, "published keys")
        argmax, last = m.score(ref["teacher_forced"]["input_ids"])
        res = generate(m, ref["prompt_ids"], 32)
    assert argmax == ref["teacher_forced"]["argmax"]
    np.testing.assert_allclose(last, want[1], rtol=0, atol=1e-4)
    assert res.generated_ids != ref["generated_ids"] or np.abs(res.last_logits - want[0]).max() > 1e-4


def test_the_engram_hash_by_hand():
    """Position 0 of a sequence: the 2- and 3-gram look back past the start, so both use the sidecar's pad id:
    ``r = c m0``, ``r ^= pad m1`` -> rows ``r mod p[0][h] + offset``, ``r ^= pad m2`` -> ``r mod p[1][h] + ...``
    (Python's arbitrary-precision integers, the sidecar's decimal-string multipliers)."""
    side = json.loads((FIXTURE / V41_ENGRAM_FILE).read_text())
    text = json.loads((FIXTURE / "config.json").read_text())["text_config"]
    e = EngramArgs(tuple(side["layer_ids"]), side["max_ngram_size"], side["n_heads"], side["head_dim"])
    h = EngramHash(side, e, text["vocab_size"], "sidecar")
    token, table = 77, 1
    c, pad, m = side["token_map"][token], side["pad_id"], [int(v) for v in side["multipliers"][table]]
    want, r = [], c * m[0]
    for i in (1, 2):
        r ^= pad * m[i]
        for head in range(side["n_heads"]):
            col = (i - 1) * side["n_heads"] + head
            want.append(r % side["primes"][table][i - 1][head] + side["offsets"][table][col])
    got = h.rows(h.compress(np.array([token])), np.array([0]), table)
    assert got.tolist() == [want]
    # one position later: the 2-gram is (token, token), the 3-gram still reaches the pad
    r = (c * m[0]) ^ (c * m[1])
    two = [r % p + side["offsets"][table][k] for k, p in enumerate(side["primes"][table][0])]
    got = h.rows(h.compress(np.array([token, token])), np.array([1]), table)
    assert got[0, : side["n_heads"]].tolist() == two


def test_a_missing_engram_sidecar_is_one_clear_error(tmp_path):
    d = _copy(tmp_path, sidecar=False)
    with pytest.raises(RuntimeModelError, match=rf"engram layers \[1, 4\] need {V41_ENGRAM_FILE}"):
        load_model(d, record_usage=False)


def test_a_sidecar_for_another_geometry_is_refused(tmp_path):
    d = _copy(tmp_path)
    side = json.loads((d / V41_ENGRAM_FILE).read_text())
    side["n_heads"] = 3
    (d / V41_ENGRAM_FILE).write_text(json.dumps(side))
    with pytest.raises(RuntimeModelError, match=r"do not match config\.json"):
        load_model(d, record_usage=False)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda t: t.update(kv_source_layer_ids=[3]), "layer 1 compresses with no KV and index source"),
        (lambda t: t.update(candidate_source_layer_id=2), "candidate_source_layer_id 2 is not an index source"),
        (lambda t: t.update(compress_ratios=[0, 2]), "compress_ratios must give a ratio"),
        (lambda t: t.update(index_source_layer_ids=[0, 1, 3, 4]), "source layer 0 does not compress"),
        (lambda t: t.update(score_func="softmax"), "score_func 'softmax' is not supported"),
    ],
)
def test_a_schedule_the_engine_cannot_follow_is_refused(tmp_path, edit, says):
    with pytest.raises(RuntimeModelError, match=says):
        load_model(_copy(tmp_path, edit), record_usage=False)


def test_a_chunk_after_the_prefill_is_refused():
    with load_model(FIXTURE, record_usage=False) as m:
        m.forward([5, 6, 7])
        with pytest.raises(RuntimeModelError, match="after the prefill a forward takes one token"):
            m.forward([8, 9])
