"""Issue 25 item 2: a natively quantized source is never quantized a second time without the user seeing it
(docs/FORMATS.md §5 ``native``). With no ``--experts`` (nor ``--group-size``), routed experts in an encoding a
registered format holds exactly (MXFP4, symmetric compressed-tensors INT4) are kept (``native``) and the choice is
in the summary and the manifest; where no format holds them (NVFP4, MXFP8) the default int4-g64 is written and one
``colitools: warning:`` line names ``--experts native``. An explicit ``--experts`` is honoured without a word."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_native import E, assert_lossless, decoded_output, make_int4, make_mxfp4, make_mxfp8, make_nvfp4
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert

EXE = str(Path(sys.executable).parent / "colitools")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "convert", *args, "--min-free-gb", "0"], capture_output=True, text=True)


def _manifest(out: Path) -> dict:
    return json.loads((out / "colitools.json").read_text())


def test_mxfp4_experts_are_kept_by_default_and_the_choice_recorded(tmp_path):
    values = make_mxfp4(tmp_path / "src")
    proc = _cli(str(tmp_path / "src"), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    assert (
        "experts: native (the default for MXFP4 routed experts: kept byte for byte as mxfp4)" in proc.stdout
    )
    assert_lossless(tmp_path / "out", values, "mxfp4")  # the source's own values, bit for bit
    manifest = _manifest(tmp_path / "out")
    assert manifest["recipe"]["experts"] == "native"
    assert manifest["experts_choice"] == {
        "experts": "native",
        "by": "native",
        "sources": ["MXFP4"],
        "kept": ["mxfp4"],
    }


@pytest.mark.parametrize("g", [32, 128])
def test_int4_experts_are_kept_by_default(tmp_path, g):
    values = make_int4(tmp_path / "src", g=g)
    s = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(min_free_gb=0))
    assert s.recipe["experts"] == "native" and s.experts_choice["by"] == "native" and s.warnings == []
    assert_lossless(tmp_path / "out", values, lambda I: "int4-row" if I <= g else f"int4-g{g}")


@pytest.mark.parametrize(("make", "label"), [(make_nvfp4, "NVFP4"), (make_mxfp8, "MXFP8")])
def test_experts_no_format_holds_are_requantized_with_one_warning_line(tmp_path, make, label):
    make(tmp_path / "src")
    proc = _cli(str(tmp_path / "src"), str(tmp_path / "out"), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("colitools: warning:")]
    assert len(warnings) == 1 and f"{3 * E} {label} tensors as int4-row" in warnings[0], proc.stderr
    assert "--experts native" in warnings[0] and "`" not in warnings[0]  # the flag, as the CLI names it
    summary = json.loads(proc.stdout)
    assert summary["recipe"]["experts"] == "int4-g64"
    assert summary["experts_choice"]["by"] == "default" and summary["experts_choice"]["kept"] == []
    assert summary["warnings"] and label in summary["warnings"][0]


def test_an_explicit_experts_option_is_honoured_without_a_warning(tmp_path):
    make_mxfp4(tmp_path / "src")
    proc = _cli(str(tmp_path / "src"), str(tmp_path / "out"), "--experts", "int4-g64")
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    assert "experts: int4-g64 (as given)" in proc.stdout
    got = decoded_output(tmp_path / "out")
    assert {label for n, (label, *_) in got.items() if ".experts." in n} == {"int4-row"}  # I <= 64
    assert _manifest(tmp_path / "out")["experts_choice"]["by"] == "given"


def test_group_size_counts_as_a_choice_of_experts(tmp_path):
    make_mxfp4(tmp_path / "src")
    s = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(group_size=32, dry_run=True))
    assert s.recipe["experts"] == "int4-g32" and s.experts_choice["by"] == "given" and s.warnings == []


def test_a_float_source_keeps_the_default_and_prints_no_choice_line(tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(layers=1, experts=2, hidden=64, inter=32))
    s = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(min_free_gb=0))
    assert s.recipe["experts"] == "int4-g64" and s.experts_choice["by"] == "default" and s.warnings == []
    assert "experts:" not in s.text()


def test_planar_layout_keeps_the_int4_default_and_says_why(tmp_path):
    """planar64-v8 holds int4-row / int4-g64 experts only: MXFP4 experts get the default, with the warning."""
    src = (
        Path(__file__).resolve().parents[2] / "oracles" / "gpt_oss_mxfp4"
    )  # I = H = 64: planar-eligible widths
    s = convert(str(src), tmp_path / "out", ConvertOptions(layout="planar", min_free_gb=0))
    assert s.recipe["experts"] == "int4-g64" and s.experts_choice["by"] == "default"
    assert (
        len(s.warnings) == 1 and "`experts=native` keeps them as mxfp4 with `layout=pairs`" in s.warnings[0]
    )


def test_a_named_generic_target_keeps_the_default_for_mxfp4_experts_and_says_why(tmp_path):
    """``--target generic`` is c/colibri.c's loader, which has no mxfp4: MXFP4 experts get the default there."""
    src = Path(__file__).resolve().parents[2] / "oracles" / "gpt_oss_mxfp4"
    s = convert(str(src), tmp_path / "out", ConvertOptions(target="generic", dry_run=True))
    assert s.recipe["experts"] == "int4-g64" and s.experts_choice["by"] == "default"
    assert len(s.warnings) == 1 and "does not read mxfp4; convert without `target` to keep them" in s.warnings[0]
