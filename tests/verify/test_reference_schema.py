"""A damaged oracle reference is one VerifyError naming the key at fault, before anything is converted
(the bad-input harness found a KeyError traceback for a reference without ``teacher_forced``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from colitools.errors import VerifyError
from colitools.verify.oracle import load_reference, reference_logits

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "olmoe"


def _damaged(tmp_path: Path, edit) -> Path:
    dest = tmp_path / "olmoe"
    shutil.copytree(FIXTURE, dest)
    path = dest / "reference" / "default.json"
    ref = json.loads(path.read_text())
    edit(ref)
    path.write_text(json.dumps(ref))
    return dest


def test_the_committed_reference_passes():
    ref = load_reference(FIXTURE, "default")
    assert reference_logits(FIXTURE, ref).shape[0] == 2


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda r: r.pop("teacher_forced"), "teacher_forced"),
        (lambda r: r.pop("prompt_ids"), "prompt_ids"),
        (lambda r: r.__setitem__("generated_ids", [1, "2"]), "generated_ids"),
        (lambda r: r["teacher_forced"].pop("argmax"), "teacher_forced.argmax"),
        (lambda r: r["teacher_forced"].__setitem__("input_ids", None), "teacher_forced.input_ids"),
        (lambda r: r["teacher_forced"].__setitem__("margins", [0.5]), "teacher_forced.margins"),
        (lambda r: r.__setitem__("logits", {"file": "../outside.npy.zst"}), "logits.file"),
        (lambda r: r.pop("logits"), "logits.file"),
    ],
)
def test_a_damaged_reference_names_its_key(tmp_path, edit, key):
    fixture = _damaged(tmp_path, edit)
    with pytest.raises(VerifyError) as err:
        load_reference(fixture, "default")
    assert f"default.json: {key} must be" in str(err.value)


def test_unreadable_logits_are_one_error(tmp_path):
    fixture = _damaged(tmp_path, lambda r: None)
    ref = load_reference(fixture, "default")
    (fixture / "reference" / ref["logits"]["file"]).write_bytes(b"not zstd")
    with pytest.raises(VerifyError, match="unreadable reference logits"):
        reference_logits(fixture, ref)
