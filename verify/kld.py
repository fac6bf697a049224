"""``colitools verify quality --kld``: how far a converted model's next-token distributions are from its source's.

Both models run in the reference runtime, teacher-forced over the same tokens (one forward of the whole sequence,
``Model.forward(ids, all_logits=True)``): the *reference* is the source converted with the all-f32 recipe
(``F32_RECIPE``: every weight float32, natively quantized sources decoded) into a temporary folder, the *test* is
the converted folder. ``kld_stats`` turns the two logits arrays into the statistics ``llama-perplexity
--kl-divergence`` prints (the reference plays llama.cpp's "base" model, the test its quantized one).

Definitions (``kld_stats``; logits ``[T, V]`` of the tokens ``x_0 .. x_{T-1}``; position ``t`` predicts
``x_{t+1}``, so the scored positions are ``t = 0 .. T-2`` and the last row, which predicts nothing, is left out
of every statistic; ``P_t`` = softmax of the reference row, ``Q_t`` of the test row, computed in float64 as
log-softmax ``l - max(l) - log(sum(exp(l - max(l))))``):

* ``kld_t = KL(P_t || Q_t) = sum_v P_t(v) (log P_t(v) - log Q_t(v))`` in nats (llama.cpp's KLD: the base
  model's distribution against the quantized one); a term with ``P_t(v)`` = 0 (underflow) counts 0; a value below
  0 (only rounding: KL >= 0) is counted as 0. ``mean_kld``, ``median_kld``, ``p99_kld`` (linear interpolation
  between order statistics, numpy's default and llama.cpp's ``percentile``), ``max_kld`` over the positions.
* ``top1_agreement``: the fraction of positions where the two argmaxes are the same token, each the first
  maximum as the runtime's greedy decoding picks (llama.cpp's "Same top p").
* ``mean_abs_dp_top``: the mean of ``|P_t(a_t) - Q_t(a_t)|``, ``a_t`` the reference's argmax: how much
  probability the test model moves on the token the source would pick.
* ``mean_dp_target`` / ``rms_dp_target``: llama.cpp's "Mean Δp" / "RMS Δp": the mean and root mean square of
  ``Q_t(x_{t+1}) - P_t(x_{t+1})``, the change of the probability of the actual next token (signed: negative
  when the test model is less sure of the text).
* ``ppl_ref`` / ``ppl_test``: ``exp(mean_t(-log P_t(x_{t+1})))`` and the same with ``Q``: each model's perplexity
  on the next tokens (llama.cpp's ``PPL(base)`` / ``PPL(Q)``).
* ``positions``: ``T - 1``.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from colitools.formats.errors import ParameterError, RuntimeModelError, VerifyError

# The reference recipe: every role float32 (the converter decodes natively quantized sources).
F32_RECIPE = {"experts": "f32", "dense": "f32", "embed": "f32", "mtp": "f32"}
MIN_TOKENS = 2  # one scored position needs a token and the token after it


@dataclass
class KldReport:
    """The statistics of ``kld_stats`` (definitions in the module docstring); ``model_kld`` adds the folders."""

    positions: int
    mean_kld: float
    median_kld: float
    p99_kld: float
    max_kld: float
    top1_agreement: float
    mean_abs_dp_top: float
    mean_dp_target: float
    rms_dp_target: float
    ppl_ref: float
    ppl_test: float
    source: str | None = None
    output: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as JSON values (a non-finite number, e.g. an overflowing perplexity, as null)."""
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in self.__dict__.items()
        }


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kld_stats(ref_logits: np.ndarray, test_logits: np.ndarray, token_ids: Sequence[int]) -> KldReport:
    """The statistics of the module docstring for the logits ``[T, V]`` the reference and the test model gave
    teacher-forced over ``token_ids`` (length ``T >= 2``; position ``t`` predicts ``token_ids[t + 1]``).
    ParameterError for mismatched shapes, too few tokens or an id outside ``0..V-1``; VerifyError for logits
    that are not finite (a model that produced NaN / inf)."""
    ref = np.asarray(ref_logits)
    test = np.asarray(test_logits)
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ref.ndim != 2 or ref.shape != test.shape:
        raise ParameterError(
            f"`ref_logits` {tuple(ref.shape)} and `test_logits` {tuple(test.shape)} must both be [T, V]"
        )
    if ids.size < MIN_TOKENS:
        raise ParameterError(f"`token_ids`: {ids.size} token(s); at least {MIN_TOKENS} are needed")
    if ref.shape[0] != ids.size:
        raise ParameterError(f"`token_ids`: {ids.size} tokens for {ref.shape[0]} logits rows")
    vocab = ref.shape[1]
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if bad.size:
        raise ParameterError(
            f"`token_ids`: id {int(ids[bad[0]])} (position {int(bad[0])}) is outside 0..{vocab - 1}"
        )
    for name, rows in (("reference", ref), ("test", test)):
        nonfinite = np.flatnonzero(~np.isfinite(rows).all(axis=-1))
        if nonfinite.size:
            raise VerifyError(f"the {name} model's logits are not finite at position {int(nonfinite[0])}")
    lp = _log_softmax(ref[:-1])  # [N, V], N = T - 1 scored positions
    lq = _log_softmax(test[:-1])
    targets = ids[1:]
    rows = np.arange(targets.size)
    p = np.exp(lp)
    q = np.exp(lq)
    kld = np.maximum((p * (lp - lq)).sum(axis=-1), 0.0)
    top_ref = np.argmax(lp, axis=-1)  # first maximum, as the runtime's greedy decoding (np.argmax)
    top_test = np.argmax(lq, axis=-1)
    dp_target = q[rows, targets] - p[rows, targets]
    return KldReport(
        positions=int(targets.size),
        mean_kld=float(kld.mean()),
        median_kld=float(np.median(kld)),
        p99_kld=float(np.percentile(kld, 99)),
        max_kld=float(kld.max()),
        top1_agreement=float(np.mean(top_ref == top_test)),
        mean_abs_dp_top=float(np.mean(np.abs(p[rows, top_ref] - q[rows, top_ref]))),
        mean_dp_target=float(dp_target.mean()),
        rms_dp_target=float(np.sqrt(np.mean(dp_target**2))),
        ppl_ref=float(np.exp(-lp[rows, targets].mean())),
        ppl_test=float(np.exp(-lq[rows, targets].mean())),
    )


# ------------------------------------------------------------------------------------------- the tokens
def check_token_ids(token_ids: Sequence[int], vocab_size: int) -> list[int]:
    """``token_ids`` as ints: at least ``MIN_TOKENS``, each ``0 <= id < vocab_size``; else ParameterError."""
    ids = [int(t) for t in token_ids]
    if len(ids) < MIN_TOKENS:
        raise ParameterError(
            f"`prompt_ids`: {len(ids)} token(s); the divergence needs at least {MIN_TOKENS} (a token and the "
            f"token after it)"
        )
    from colitools.runtime.run import check_prompt_ids

    check_prompt_ids(ids, vocab_size, ParameterError)  # the runtime's rule, as a usage error here
    return ids


def text_token_ids(model_dir: str | os.PathLike[str], text_file: str | os.PathLike[str]) -> list[int]:
    """The ids of the UTF-8 text in ``text_file`` through ``model_dir``'s ``tokenizer.json`` (RuntimeModelError
    when the folder has none; ParameterError for a file that cannot be read, is not UTF-8 text or encodes to
    fewer than ``MIN_TOKENS`` tokens)."""
    from colitools.runtime.run import load_tokenizer

    tokenizer = load_tokenizer(Path(model_dir))
    path = Path(text_file)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ParameterError(f"`text`: cannot read {path} ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ParameterError(f"`text`: {path} is not UTF-8 text (byte {exc.start})") from None
    ids = [int(t) for t in tokenizer.encode(text).ids]
    if len(ids) < MIN_TOKENS:
        raise ParameterError(
            f"`text`: {path} encodes to {len(ids)} token(s); the divergence needs at least {MIN_TOKENS}"
        )
    return ids


# ------------------------------------------------------------------------------------------- the models
def manifest_source(output_dir: str | os.PathLike[str]) -> tuple[str, str | None]:
    """(source, revision) recorded in ``output_dir``'s ``colitools.json``: a local folder's path, or a Hub repo id
    and its commit. VerifyError when the folder has no manifest or it records no source."""
    from colitools.converters.manifest import Manifest
    from colitools.formats.errors import ManifestError
    from colitools.formats.filenames import MANIFEST_FILE

    path = Path(output_dir) / MANIFEST_FILE
    if not path.is_file():
        raise VerifyError(f"{output_dir}: no {MANIFEST_FILE} to find the source in; give `source`")
    try:
        source = Manifest.load(path).data.get("source")
    except (OSError, ManifestError) as exc:
        raise VerifyError(f"{path}: unreadable manifest ({exc}); give `source`") from None
    if isinstance(source, dict) and source.get("kind") == "local" and isinstance(source.get("path"), str):
        return source["path"], None
    if isinstance(source, dict) and source.get("kind") == "hf" and isinstance(source.get("repo_id"), str):
        rev = source.get("revision")
        return source["repo_id"], rev if isinstance(rev, str) else None
    raise VerifyError(f"{path}: records no source folder or repo; give `source`")


def teacher_forced_logits(model_dir: str | os.PathLike[str], token_ids: Sequence[int], *,
                          cap: int | None = None) -> np.ndarray:  # fmt: skip
    """The float32 logits ``[T, V]`` of every position of ``token_ids`` in one forward from an empty cache
    (no routing usage recorded: the folder is left as it was)."""
    from colitools.runtime.model import load_model

    with load_model(model_dir, cap=cap, record_usage=False) as model:
        model.reset()
        logits = model.forward([int(t) for t in token_ids], all_logits=True)
        model.reset()
    return np.asarray(logits, dtype=np.float32)


def model_kld(
    source: str | os.PathLike[str] | None, output_dir: str | os.PathLike[str], token_ids: Sequence[int], *,
    cap: int | None = None, revision: str | None = None, token: str | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> KldReport:  # fmt: skip
    """``kld_stats`` of ``output_dir`` (the test) against ``source`` converted with ``F32_RECIPE`` into a
    temporary folder under ``workdir`` (the reference; removed before the test model runs), both teacher-forced
    over ``token_ids`` by the reference runtime with ``cap`` experts cached per layer. ``source`` None: the
    source ``output_dir``'s manifest records; a Hub source is read at ``revision`` (default: the commit the
    manifest recorded for that repo) with ``token``. RuntimeModelError for a folder the runtime cannot run,
    ParameterError for fewer than 2 ids or one outside the vocabulary (both checked before anything is
    converted)."""
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert
    from colitools.formats.filenames import MANIFEST_FILE
    from colitools.formats.inspect import incomplete_conversion
    from colitools.runtime.config import ModelArgs

    output_dir = Path(output_dir)
    not_complete = incomplete_conversion(output_dir)
    if not_complete:
        raise RuntimeModelError(not_complete)
    args = ModelArgs.from_dir(output_dir)  # RuntimeModelError: no config, a family the runtime does not run
    ids = check_token_ids(token_ids, args.vocab_size)
    if cap is not None and cap < 1:
        raise ParameterError(f"`cap` must be >= 1, got {cap}")
    if source is None:
        source, recorded = manifest_source(output_dir)
        revision = revision if revision is not None else recorded
    elif revision is None and (output_dir / MANIFEST_FILE).is_file():
        with contextlib.suppress(VerifyError):  # no usable manifest: no recorded commit to default to
            recorded_source, recorded = manifest_source(output_dir)
            if recorded is not None and recorded_source == str(source):
                revision = recorded
    options = ConvertOptions(
        **F32_RECIPE, revision=revision, token=token, progress=False, min_free_gb=0.0, on_low_disk="stop"
    )
    with tempfile.TemporaryDirectory(prefix="colitools-kld-", dir=workdir) as tmp:
        reference = Path(tmp) / "reference"
        convert(str(source), reference, options)
        ref_logits = teacher_forced_logits(reference, ids, cap=cap)
    test_logits = teacher_forced_logits(output_dir, ids, cap=cap)
    if ref_logits.shape != test_logits.shape:
        raise VerifyError(
            f"{output_dir}: logits {tuple(test_logits.shape)}, the source's {tuple(ref_logits.shape)}: not a "
            f"conversion of {source}"
        )
    report = kld_stats(ref_logits, test_logits, ids)
    report.source, report.output = str(source), str(output_dir)
    return report
