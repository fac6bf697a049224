"""Targets colitools knows but does not write (formats/targets.py ``refused``): colibri's Inkling engine
(``c/inkling.c`` ``model_init`` / ``expert_get``) reads transformers-style names and one fused expert stack per
layer. It is refused in one line, exit code 2, before any work, on its own fixture as on another family's, and
says what the loader reads and what to do instead. ``--target deepseek_v4`` is written now
(tests/converters/test_target_deepseek_v4.py); what stays refused of it is another family's source, in one line
with exit code 2 (``Target.check_model_type``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError

ORACLES = Path(__file__).resolve().parents[2] / "oracles"


REFUSED = [
    # (target, its own fixture, loader function named, a fact of what the loader reads, what to do instead)
    ("inkling", "inkling", "c/inkling.c (model_init, expert_get)",
     "mlp.experts.gate_up_proj [E, 2I rows, gate first]", "tools/convert_inkling_int4.py"),
]  # fmt: skip


@pytest.mark.parametrize(("target", "fixture", "says", "fact", "instead"), REFUSED)
@pytest.mark.parametrize("source", ["own", "olmoe"])
def test_refused_targets_are_one_line_before_work(tmp_path, target, fixture, says, fact, instead, source):
    folder = ORACLES / (fixture if source == "own" else "olmoe")
    with pytest.raises(ConvertError) as info:
        convert(str(folder), tmp_path / "out", ConvertOptions(target=target, progress=False))
    message = str(info.value)
    assert message.startswith(f"--target {target} is refused: {says}") and "\n" not in message
    assert fact in message and instead in message and "docs/FORMATS.md §4 Targets" in message
    assert info.value.exit_code == 2 and not (tmp_path / "out").exists()


def test_cli_refusal_exit_2(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli("convert", ORACLES / "olmoe", tmp_path / "out", "--target", "deepseek_v4")
    one_line_error(r, "--target deepseek_v4 is for model_type deepseek_v4", "c/deepseek_v4.c", "'olmoe'", code=2)
    assert not (tmp_path / "out").exists()
