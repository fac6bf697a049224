"""Refusals every written target makes before any work (formats/targets/): a source of another family
(``Target.check_model_type``) is one line naming the loader, the target's model types and the source's, and an
option value the target cannot honour (its ``reads`` declaration: ``--towers keep`` for a target whose converter
drops the towers, issue 24 item 12) one line naming the option and the target; exit code 2, nothing written. Since issue 10 every colibri engine the project knows has a written target
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
    assert {"olmoe", "qwen36", "kimi_k3", "glm53", "deepseek_v4", "inkling", "qwen38", "deepseek_v41"} <= set(
        FAMILY_TARGETS
    )
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
    assert (
        str(info.value) == "`target=x` is refused: c/x.c (f) reads layout L, which colitools does not write"
    )


def test_cli_refusal_exit_2(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli("convert", ORACLES / "olmoe", tmp_path / "out", "--target", "deepseek_v4")
    one_line_error(
        r, "--target deepseek_v4 is for model_type deepseek_v4", "c/deepseek_v4.c", "'olmoe'", code=2
    )
    assert not (tmp_path / "out").exists()


# issue 24 item 12: an option a target cannot honour is refused before work starts (its own declaration,
# ``Target.reads``), never silently replaced: ``--target qwen36 --towers keep`` dropped the towers.
CANDIDATES = {
    "towers": ("keep", "drop"),
    "layout": ("pairs", "planar"),
    **dict.fromkeys(
        ("experts", "dense", "embed", "mtp", "experts_down"),
        ("f32", "bf16", "int8-row", "int4-row", "int4-g64", "int4-g32", "int3-g64", "mxfp4", "fp8-e8m0"),
    ),
}


def _narrowed() -> list[tuple[str, str, str]]:
    """(target, option, value) for every option a target narrows and every candidate value it does not read."""
    out = []
    for name, t in TARGETS.items():
        for option, allowed in t.reads:
            out += [(name, option, v) for v in CANDIDATES[option] if v not in allowed]
    return out


def test_every_target_declares_what_it_cannot_honour():
    narrowed = _narrowed()
    assert ("qwen36", "towers", "keep") in narrowed and ("inkling", "towers", "keep") in narrowed
    # inkling leaves MTP modules out: --mtp f32 cannot be honoured
    assert ("inkling", "mtp", "f32") in narrowed
    assert {n for n, _, _ in narrowed} == {*FAMILY_TARGETS, "generic"}  # every engine narrows something
    # c/colibri.c never opens the experts-int4g64/ sidecar (issue 45): the named generic target reads pairs only
    assert [(o, v) for n, o, v in narrowed if n == "generic"] == [("layout", "planar")]


@pytest.mark.parametrize(("target", "option", "value"), _narrowed())
def test_an_option_the_target_cannot_honour_is_one_line_exit_2(target, option, value):
    kwargs = {option.replace("-", "_"): value}
    ConvertOptions(**kwargs).recipe()  # the generic target takes it: the refusal below is the target's own
    with pytest.raises(ConvertError) as info:
        ConvertOptions(target=target, **kwargs).recipe()
    message = str(info.value)
    assert message.startswith(f"`target={target}`: `{option}={value}` is refused: ") and "\n" not in message
    assert info.value.exit_code == 2


def test_the_value_a_target_forces_is_its_default_and_accepted():
    for name in ("qwen36", "inkling"):
        assert ConvertOptions(target=name).recipe().towers == "drop"
        assert ConvertOptions(target=name, towers="drop").recipe().towers == "drop"
    # c/glm53.c reads the vision tower
    assert ConvertOptions(target="glm53", towers="keep").recipe().towers == "keep"
    assert ConvertOptions().recipe().towers == "keep"


def test_cli_towers_keep_with_qwen36_is_refused_before_work(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli(
        "convert", ORACLES / "qwen3_5_moe", tmp_path / "out", "--target", "qwen36", "--towers", "keep"
    )
    one_line_error(r, "--target qwen36: --towers keep is refused", "c/qwen36.c", "--towers drop", code=2)
    assert not (tmp_path / "out").exists()


# issue 27: what each engine cannot run is refused in one line before any work
def test_olmoe_refuses_grouped_query_attention_it_would_read_past(tmp_path):
    """c/olmoe.c multiplies k_proj / v_proj as [hidden, hidden]: the olmoe fixture's 4:2 heads are refused."""
    with pytest.raises(TargetRefused) as info:
        convert(str(ORACLES / "olmoe"), tmp_path / "out", ConvertOptions(target="olmoe", progress=False))
    assert str(info.value) == (
        "`target=olmoe`: the source is refused: num_key_value_heads 2 != num_attention_heads 4: c/olmoe.c "
        "multiplies k_proj / v_proj as [hidden, hidden] (it reads no num_key_value_heads)"
    )
    assert info.value.exit_code == 2 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("fixture", "options", "fmt"), [
    ("qwen3_moe", {"experts": "mxfp4"}, "mxfp4"),
    ("qwen3_moe", {"dense": "fp8-e8m0"}, "fp8-e4m3-e8m0"),
    ("gpt_oss_mxfp4", {"experts": "native"}, "mxfp4"),
])  # fmt: skip
def test_generic_refuses_a_format_colibri_c_has_no_reader_for(tmp_path, fixture, options, fmt):
    """``--target generic`` is c/colibri.c's: no mxfp4 (no qt_resolve_fmt branch), no fp8-e4m3-e8m0 (``.scale``
    names qt_from_disk never looks up); without ``--target`` they are written for colitools' own readers."""
    with pytest.raises(TargetRefused) as info:
        convert(str(ORACLES / fixture), tmp_path / "out", ConvertOptions(target="generic", progress=False,
                                                                          **options))  # fmt: skip
    message = str(info.value)
    assert message.startswith("`target=generic`: tensor ") and f" would be written as {fmt}, " in message
    assert "c/colibri.c" in message and "\n" not in message and not (tmp_path / "out").exists()
    ConvertOptions(**options).recipe()  # the default target writes it
    plan = convert(
        str(ORACLES / fixture), tmp_path / "dry", ConvertOptions(dry_run=True, progress=False, **options)
    )
    assert plan.units_total > 0


def test_cli_without_target_writes_mxfp4_and_with_generic_refuses_it(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli(
        "convert", ORACLES / "qwen3_moe", tmp_path / "out", "--target", "generic", "--experts", "mxfp4"
    )
    one_line_error(r, "--target generic: tensor ", "would be written as mxfp4", "c/colibri.c", code=2)
    assert not (tmp_path / "out").exists()
    r = run_cli("convert", ORACLES / "qwen3_moe", tmp_path / "out", "--experts", "mxfp4", "--dry-run")
    assert r.returncode == 0, r.stderr


def test_cli_generic_planar_is_refused_before_work_and_the_default_writes_it(tmp_path):
    """issue 45: c/colibri.c reads routed experts only from the model folder's own shards, as pairs tensors; a
    ``--layout planar`` output holds them only in the experts-int4g64/ sidecar, so ``--target generic`` refuses
    it in one line (exit 2, nothing written), while no ``--target`` (colitools' readers) still plans it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli(
        "convert", ORACLES / "qwen3_moe", tmp_path / "out", "--target", "generic", "--layout", "planar"
    )
    one_line_error(r, "--target generic: --layout planar is refused: c/colibri.c reads routed experts only as "
                   "pairs tensors", "experts-int4g64/ sidecar", code=2)  # fmt: skip
    assert not (tmp_path / "out").exists()
    r = run_cli("convert", ORACLES / "qwen3_moe", tmp_path / "out", "--layout", "planar", "--dry-run")
    assert r.returncode == 0, r.stderr
    r = run_cli("convert", ORACLES / "qwen3_moe", tmp_path / "out", "--target", "generic", "--dry-run")
    assert r.returncode == 0, r.stderr
