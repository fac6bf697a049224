"""``verify quality --kld`` (verify/kld.py): the statistics against values computed by hand, end to end on a
committed oracle fixture, and the refusals of the real CLI process."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.errors import ParameterError, RuntimeModelError, VerifyError
from colitools.verify.kld import F32_RECIPE, kld_stats, model_kld, teacher_forced_logits, text_token_ids

REPO = Path(__file__).resolve().parents[2]
ORACLES = REPO / "oracles"
sys.path.insert(0, str(REPO / "tests" / "colitools"))
from cli_helpers import one_line_error, run_cli  # noqa: E402

LN = math.log


# ----------------------------------------------------------------------------------- hand-made logit rows
def test_the_kld_of_two_hand_made_rows():
    # reference logits [0, ln 3] -> P = [1/4, 3/4]; test [0, 0] -> Q = [1/2, 1/2]; tokens [0, 1]: position 0
    # predicts token 1 (the second row predicts nothing and is not scored)
    ref = np.array([[0.0, LN(3)], [5.0, -5.0]])
    test = np.array([[0.0, 0.0], [-5.0, 5.0]])
    r = kld_stats(ref, test, [0, 1])
    kl = 0.25 * LN(0.25 / 0.5) + 0.75 * LN(0.75 / 0.5)  # = 1/4 ln(1/2) + 3/4 ln(3/2)
    assert r.positions == 1
    for value in (r.mean_kld, r.median_kld, r.p99_kld, r.max_kld):
        assert abs(value - kl) < 1e-12
    assert r.top1_agreement == 0.0  # reference argmax 1; the test's tie [1/2, 1/2] picks the first maximum, 0
    assert abs(r.mean_abs_dp_top - 0.25) < 1e-12  # |P(1) - Q(1)| = |3/4 - 1/2|
    assert abs(r.mean_dp_target - (0.5 - 0.75)) < 1e-12  # the next token is 1: Q(1) - P(1)
    assert abs(r.ppl_ref - 4 / 3) < 1e-12  # exp(-ln 3/4)
    assert abs(r.ppl_test - 2.0) < 1e-12


def test_every_statistic_of_three_positions_by_hand():
    # tokens [1, 1, 0, 1]: positions 0, 1, 2 predict 1, 0, 1; the last row (position 3) is not scored: it is
    # made wildly different so that counting it would change every statistic
    ref = np.array(
        [
            [0.0, LN(3)],  # P = [1/4, 3/4]
            [1000.0 + LN(4), 1000.0],  # P = [4/5, 1/5]; exp(1000) overflows: only a stable softmax gets it
            [0.0, 0.0],  # P = [1/2, 1/2]
            [100.0, 0.0],
        ]
    )
    test = np.array(
        [
            [0.0, 0.0],  # Q = [1/2, 1/2]
            [LN(2), 0.0],  # Q = [2/3, 1/3]
            [7.0, 7.0],  # Q = [1/2, 1/2]
            [0.0, 100.0],
        ]
    )
    r = kld_stats(ref, test, [1, 1, 0, 1])
    kl0 = 0.25 * LN(0.25 / 0.5) + 0.75 * LN(0.75 / 0.5)
    kl1 = 0.8 * LN(0.8 / (2 / 3)) + 0.2 * LN(0.2 / (1 / 3))
    kl2 = 0.0
    assert kl0 > kl1 > kl2
    assert r.positions == 3
    assert abs(r.mean_kld - (kl0 + kl1 + kl2) / 3) < 1e-12
    assert abs(r.median_kld - kl1) < 1e-12
    # 99th percentile of the sorted [kl2, kl1, kl0], linear between order statistics: rank 0.99 * 2 = 1.98
    assert abs(r.p99_kld - (kl1 + 0.98 * (kl0 - kl1))) < 1e-12
    assert abs(r.max_kld - kl0) < 1e-12
    # argmaxes: reference 1, 0, 0 (the tie's first); test 0 (tie), 0, 0 (tie)
    assert abs(r.top1_agreement - 2 / 3) < 1e-12
    # |P(a) - Q(a)| at the reference's argmax a: |3/4 - 1/2|, |4/5 - 2/3|, |1/2 - 1/2|
    assert abs(r.mean_abs_dp_top - (1 / 4 + 2 / 15 + 0) / 3) < 1e-12
    # Q(next) - P(next): next tokens 1, 0, 1
    dps = [0.5 - 0.75, 2 / 3 - 0.8, 0.5 - 0.5]
    assert abs(r.mean_dp_target - sum(dps) / 3) < 1e-12
    assert abs(r.rms_dp_target - math.sqrt(sum(d * d for d in dps) / 3)) < 1e-12
    # perplexities: exp of the mean NLL of the next tokens = (product of their probabilities) ** (-1/3)
    assert abs(r.ppl_ref - (0.75 * 0.8 * 0.5) ** (-1 / 3)) < 1e-12
    assert abs(r.ppl_test - (0.5 * (2 / 3) * 0.5) ** (-1 / 3)) < 1e-12


def test_identical_logits_give_exactly_zero():
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((9, 50)) * 4).astype(np.float32)
    ids = rng.integers(0, 50, 9)
    r = kld_stats(logits, logits.copy(), ids)
    assert (r.mean_kld, r.median_kld, r.p99_kld, r.max_kld) == (0.0, 0.0, 0.0, 0.0)
    assert r.top1_agreement == 1.0 and r.mean_abs_dp_top == 0.0 and r.mean_dp_target == 0.0
    assert r.ppl_ref == r.ppl_test
    # a different test row changes only the statistics of its own position
    other = logits.copy()
    other[3] = other[3][::-1]
    r2 = kld_stats(logits, other, ids)
    assert r2.max_kld > 0 and r2.median_kld == 0.0


def test_kld_stats_refuses_bad_input():
    a = np.zeros((3, 4))
    with pytest.raises(ParameterError, match=r"must both be \[T, V\]"):
        kld_stats(a, np.zeros((3, 5)), [0, 1, 2])
    with pytest.raises(ParameterError, match="at least 2"):
        kld_stats(a[:1], a[:1], [0])
    with pytest.raises(ParameterError, match="3 tokens for 2 logits rows"):
        kld_stats(a[:2], a[:2], [0, 1, 2])
    with pytest.raises(ParameterError, match=r"id 4 \(position 1\) is outside 0..3"):
        kld_stats(a, a, [0, 4, 1])
    bad = a.copy()
    bad[1, 2] = np.nan
    with pytest.raises(VerifyError, match="test model's logits are not finite at position 1"):
        kld_stats(a, bad, [0, 1, 2])


# ------------------------------------------------------------------------------- end to end on an oracle
def _convert(source: Path, out: Path, **options) -> Path:
    convert(str(source), out, ConvertOptions(**options, progress=False, min_free_gb=0.0))
    return out


IDS = [int(t) for t in np.random.default_rng(11).integers(0, 288, 48)]  # olmoe: vocab 288


def test_a_quantized_conversion_diverges_and_the_f32_recipe_against_itself_does_not(tmp_path):
    source = ORACLES / "olmoe"
    work = tmp_path / "work"
    work.mkdir()
    default = _convert(source, tmp_path / "default")
    r = model_kld(source, default, IDS, workdir=work)
    assert r.positions == len(IDS) - 1
    assert 0 < r.mean_kld < math.inf and r.median_kld <= r.p99_kld <= r.max_kld < math.inf
    assert 0 <= r.top1_agreement <= 1 and math.isfinite(r.ppl_ref) and math.isfinite(r.ppl_test)
    assert list(work.iterdir()) == []  # the reference conversion is removed
    assert not (default / ".coli_usage").exists()  # the converted folder is left as it was

    # the same statistics from logits computed here: the runtime runs the float32 source folder as it is (not
    # through model_kld's f32 conversion), and the converted folder
    ref_logits = teacher_forced_logits(source, IDS)
    test_logits = teacher_forced_logits(default, IDS)
    assert r.to_json() == {**kld_stats(ref_logits, test_logits, IDS).to_json(), "source": str(source),
                           "output": str(default)}  # fmt: skip

    # a second, independent conversion with the all-f32 recipe: the source found through its manifest
    f32 = _convert(source, tmp_path / "f32", **F32_RECIPE)
    z = model_kld(None, f32, IDS, workdir=work)
    assert z.source == str(source.resolve())
    assert (z.mean_kld, z.median_kld, z.p99_kld, z.max_kld) == (0.0, 0.0, 0.0, 0.0)
    assert z.top1_agreement == 1.0 and z.mean_abs_dp_top == 0.0
    assert z.ppl_ref == z.ppl_test == r.ppl_ref


def test_a_coarser_format_diverges_more(tmp_path):
    # the same model at int8-row experts and int2-row experts (other roles f32): 2 bits per weight lose more
    source = ORACLES / "qwen3_moe"
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 200, 64)]
    roles = {k: v for k, v in F32_RECIPE.items() if k != "experts"}
    fine = model_kld(source, _convert(source, tmp_path / "int8", experts="int8-row", **roles), ids)
    coarse = model_kld(source, _convert(source, tmp_path / "int2", experts="int2-row", **roles), ids)
    assert 0 < fine.mean_kld < coarse.mean_kld
    assert fine.top1_agreement >= coarse.top1_agreement


def test_text_tokens_are_the_tokenizers(tmp_path):
    from tokenizers import Tokenizer

    text = tmp_path / "t.txt"
    text.write_text("the router picks experts, and the experts pick the next token.")
    want = Tokenizer.from_file(str(ORACLES / "olmoe" / "tokenizer.json")).encode(text.read_text()).ids
    assert text_token_ids(ORACLES / "olmoe", text) == want and len(want) > 5
    with pytest.raises(RuntimeModelError, match="no tokenizer.json"):
        text_token_ids(ORACLES / "qwen3_moe", text)
    with pytest.raises(ParameterError, match="cannot read"):
        text_token_ids(ORACLES / "olmoe", tmp_path / "missing.txt")
    (tmp_path / "bin.txt").write_bytes(b"ok \xff\xfe")
    with pytest.raises(ParameterError, match=r"not UTF-8 text \(byte 3\)"):
        text_token_ids(ORACLES / "olmoe", tmp_path / "bin.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ParameterError, match="encodes to 0 token"):
        text_token_ids(ORACLES / "olmoe", tmp_path / "empty.txt")


def test_model_kld_refuses_before_converting(tmp_path):
    default = _convert(ORACLES / "olmoe", tmp_path / "default")
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(ParameterError, match="1 token"):
        model_kld(None, default, [5], workdir=work)
    with pytest.raises(ParameterError, match=r"id 288 \(position 2\) is outside the vocabulary"):
        model_kld(None, default, [1, 2, 288], workdir=work)
    not_runnable = tmp_path / "llama"
    not_runnable.mkdir()
    config = json.loads((ORACLES / "olmoe" / "config.json").read_text())
    (not_runnable / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(RuntimeModelError, match="model_type 'llama' is not supported"):
        model_kld(ORACLES / "olmoe", not_runnable, IDS, workdir=work)
    bare = tmp_path / "bare"
    shutil.copytree(default, bare)
    (bare / "colitools.json").unlink()
    with pytest.raises(VerifyError, match="no colitools.json to find the source in"):
        model_kld(None, bare, IDS, workdir=work)
    assert list(work.iterdir()) == []


# ------------------------------------------------------------------------------------------ the real CLI
@pytest.fixture(scope="module")
def olmoe_default(tmp_path_factory) -> Path:
    return _convert(ORACLES / "olmoe", tmp_path_factory.mktemp("kld-cli") / "default")


def test_cli_kld_json_and_text(olmoe_default, tmp_path):
    ids = IDS[:20]
    res = run_cli(
        "verify", "quality", olmoe_default, "--kld", "--prompt-ids", ",".join(map(str, ids)), "--json"
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    # in-process with the source given; the CLI found it in the manifest (the resolved path)
    want = model_kld(ORACLES / "olmoe", olmoe_default, ids).to_json()
    assert got == {**want, "source": str((ORACLES / "olmoe").resolve())}
    assert got["positions"] == 19 and got["mean_kld"] > 0

    text = tmp_path / "prompt.txt"
    text.write_text("the router picks experts")
    res = run_cli("verify", "quality", olmoe_default, "--kld", "--text", text)
    assert res.returncode == 0, res.stderr
    n = len(text_token_ids(olmoe_default, text))
    assert f"run at f32: {n - 1} positions" in res.stdout
    for label in ("mean KLD", "median KLD", "99th percentile KLD", "max KLD", "top-1 agreement",
                  "perplexity, source (f32)", "perplexity, converted"):  # fmt: skip
        assert label in res.stdout


def test_cli_kld_refusals_are_one_line(olmoe_default, tmp_path):
    def refused(*args, code, words):
        one_line_error(run_cli("verify", "quality", *args), *words, code=code)

    refused(olmoe_default, "--kld", "--prompt-ids", "1,x,3", code=1, words=["--prompt-ids", "entry 2 is 'x'"])
    refused(olmoe_default, "--kld", "--prompt-ids", "7", code=2, words=["--prompt-ids", "at least 2"])
    refused(
        olmoe_default, "--kld", "--prompt-ids", "1,2,288", code=2, words=["id 288 (position 2)", "0..287"]
    )
    refused(olmoe_default, "--kld", code=2, words=["exactly one of --prompt-ids and --text"])
    refused(olmoe_default, "--prompt-ids", "1,2", code=2, words=["options of --kld"])
    refused(olmoe_default, "--kld", "--text", tmp_path / "missing.txt", code=2, words=["--text: cannot read"])
    # a folder the runtime cannot run: model_type llama
    llama = tmp_path / "llama"
    llama.mkdir()
    config = json.loads((ORACLES / "olmoe" / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    refused(llama, "--source", ORACLES / "olmoe", "--kld", "--prompt-ids", "1,2,3", code=1,
            words=["model_type 'llama' is not supported"])  # fmt: skip
    # --text needs the model's tokenizer.json: qwen3_moe has none
    text = tmp_path / "t.txt"
    text.write_text("hello")
    qwen = _convert(ORACLES / "qwen3_moe", tmp_path / "qwen3_moe")
    refused(qwen, "--kld", "--text", text, code=1, words=["no tokenizer.json (use --prompt-ids)"])
