"""Refusals every written target makes before any work (formats/targets.py): a source of another family
(``Target.check_model_type``) is one line naming the loader, the target's model types and the source's, exit
code 2, and nothing is written. Since issue 10 every colibri engine the project knows has a written target
(``--target deepseek_v4``: tests/converters/test_target_deepseek_v4.py, ``--target inkling``:
tests/converters/test_target_inkling.py); ``Target.refused`` stays for an engine that could not be followed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError, TargetRefused
from colitools.formats.targets import TARGETS, Target

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
FAMILY_TARGETS = sorted(name for name, t in TARGETS.items() if t.model_types is not None)


def test_every_family_engine_has_a_written_target():
    assert {"olmoe", "qwen36", "kimi_k3", "glm53", "deepseek_v4", "inkling"} <= set(FAMILY_TARGETS)
    assert [name for name, t in TARGETS.items() if t.refused is not None] == []


@pytest.mark.parametrize("target", FAMILY_TARGETS)
def test_another_familys_source_is_one_line_before_work(tmp_path, target):
    fixture = "qwen3_moe" if target == "olmoe" else "olmoe"
    with pytest.raises(ConvertError) as info:
        convert(str(ORACLES / fixture), tmp_path / "out", ConvertOptions(target=target, progress=False))
    message = str(info.value)
    assert message.startswith(f"`target={target}` is for model_type ") and "\n" not in message
    assert TARGETS[target].loader in message and f"{fixture!r}" in message
    assert info.value.exit_code == 2 and not (tmp_path / "out").exists()


def test_a_refused_target_says_why_in_one_line():
    t = Target("x", "c/x.c (f)", refused="c/x.c (f) reads layout L, which colitools does not write")
    with pytest.raises(TargetRefused) as info:
        t.check_writable()
    assert str(info.value) == "`target=x` is refused: c/x.c (f) reads layout L, which colitools does not write"


def test_cli_refusal_exit_2(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli("convert", ORACLES / "olmoe", tmp_path / "out", "--target", "deepseek_v4")
    one_line_error(r, "--target deepseek_v4 is for model_type deepseek_v4", "c/deepseek_v4.c", "'olmoe'", code=2)
    assert not (tmp_path / "out").exists()
