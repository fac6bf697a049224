"""Issue 24 items 5, 6, 7 and 16 through the real console script: the MXFP8 source fixture is read by every
reader, a huge declared usage geometry is one line, a lone surrogate in a tensor name is one line for every
command, and an interrupted conversion is named as such by ``run`` and ``inspect``."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import COMMAND, cli_env, one_line_error, run_cli

from colitools.formats.safetensors_io import write_safetensors

REPO = Path(__file__).resolve().parents[2]
MXFP8 = REPO / "oracles" / "qwen3_moe_mxfp8"
OLMOE = REPO / "oracles" / "olmoe"


# ------------------------------------------------------------------------------------------ item 5: MXFP8
def test_inspect_and_verify_container_read_the_mxfp8_fixture_as_fp8_values_with_e8m0_scales():
    result = run_cli("inspect", MXFP8, "--json")
    assert result.returncode == 0, result.stderr
    tensors = {t["name"]: t for t in json.loads(result.stdout)["tensors"]}
    experts = [n for n in tensors if ".experts." in n and n.endswith(".weight")]
    assert len(experts) == 48
    for name in experts:  # F8_E4M3 values [O, I] + their U8 scale [O, I/32]: a source pair, no format
        weight, scale = tensors[name], tensors[name + "_scale"]
        kinds = (weight["dtype"], weight["kind"], scale["dtype"], scale["kind"])
        assert kinds == ("F8_E4M3", "other", "U8", "other")
        assert scale["shape"] == [weight["shape"][0], -(-weight["shape"][1] // 32)]
    verify = run_cli("verify", "container", MXFP8)
    assert verify.returncode == 0 and verify.stdout.splitlines()[-1] == "OK", verify.stdout


def test_run_on_the_mxfp8_source_gives_the_tokens_of_transformers_on_its_decoded_weights():
    # transformers' tokens on the dequantized weights (the fixture's f32 reference)
    reference = json.loads((MXFP8 / "reference" / "f32.json").read_text())
    prompt = ",".join(map(str, reference["prompt_ids"]))
    n = len(reference["generated_ids"])
    result = run_cli("run", MXFP8, "--prompt-ids", prompt, "--max-new-tokens", n, "--no-usage", "--json",
                     "--ignore-eos")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["generated_ids"] == reference["generated_ids"]


def _mxfp8_file(path: Path, shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> Path:
    """``w.weight`` F8_E4M3 ``shape`` (finite e4m3 bytes) with its E8M0 ``w.weight_scale`` U8 ``scale_shape``."""
    q = np.random.default_rng(0).integers(0, 0x7E, int(np.prod(shape)), dtype=np.uint8).reshape(shape)
    scale = np.full(scale_shape, 127, dtype=np.uint8)
    write_safetensors(path, {"w.weight": q.view(ml_dtypes.float8_e4m3fn), "w.weight_scale": scale})
    return path


@pytest.mark.parametrize(
    ("shape", "scale_shape"),
    [((64, 64), (64, 2)), ((64, 48), (64, 2)), ((4, 8, 48), (4, 8, 2)), ((4, 48, 8), (4, 48, 1))],
)
def test_an_mxfp8_pair_with_one_scale_per_32_values_of_the_last_axis_is_read(tmp_path, shape, scale_shape):
    path = _mxfp8_file(tmp_path / "m.safetensors", shape, scale_shape)  # 2-D, a partial block, 3-D stacks
    result = run_cli("inspect", path)
    assert result.returncode == 0, result.stderr
    # a source's MXFP8 weight counts once, as its encoding, its scale with it (issue 25 item 3: not "other")
    assert "mxfp8" in result.stdout and "other (" not in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("shape", "scale_shape"), [((64, 64), (64, 3)), ((4, 8, 48), (4, 2, 8)), ((64, 64), (2,))]
)
def test_an_mxfp8_scale_that_does_not_fit_its_weight_is_one_line_naming_both(tmp_path, shape, scale_shape):
    path = _mxfp8_file(tmp_path / "m.safetensors", shape, scale_shape)
    want = [*shape[:-1], -(-shape[-1] // 32)]
    for argv in (("inspect", path), ("verify", "container", path)):
        result = run_cli(*argv)
        assert "Traceback" not in result.stderr and result.returncode != 0, result.stdout + result.stderr
        text = result.stdout + result.stderr
        assert f"MXFP8 scale w.weight_scale is {list(scale_shape)}, expected {want}" in text, text
    one_line_error(run_cli("inspect", path), "w.weight_scale", code=1)


# ----------------------------------------------------------------------------- item 6: declared geometry
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("-1 100000 100000\n0 1 5\n", ["100000 layers x 100000 experts", "1048576"]),
        ("-1 1 4000000000\n0 1 5\n", ["1 layers x 4000000000 experts", "1048576"]),
        ("0 4000000000 5\n", ["its records imply", "4000000001 experts"]),  # a legacy headerless file
    ],
)
def test_usage_show_refuses_a_huge_declared_geometry_in_one_line(tmp_path, text, words):
    path = tmp_path / ".coli_usage"
    path.write_text(text)
    result = run_cli("usage", "show", path, timeout=120)  # it used to run until killed (memory per expert)
    one_line_error(result, str(path), *words, code=1)


def test_usage_show_reads_the_largest_geometry_allowed(tmp_path):
    path = tmp_path / ".coli_usage"
    path.write_text("-1 1024 1024\n0 3 5\n")  # 2**20 experts: MAX_EXPERT_SLOTS
    result = run_cli("usage", "show", path, "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["n_layers"], data["n_experts"], data["total_selections"]) == (1024, 1024, 5)


# ---------------------------------------------------------------------------- item 7: lone surrogates
@pytest.fixture(scope="module")
def surrogate_named(tmp_path_factory) -> Path:
    """The OLMoE fixture whose ``model.norm.weight`` is named ``model.norm.weight\\udfff`` (a JSON escape)."""
    src = tmp_path_factory.mktemp("surrogate") / "src"
    shutil.copytree(OLMOE, src)
    raw = (src / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].replace(b'"model.norm.weight"', b'"model.norm.weight\\udfff"', 1)
    assert header != raw[8 : 8 + n]
    (src / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n :])
    return src


@pytest.mark.parametrize(
    "argv",
    [
        ("inspect", "{src}"),
        ("inspect", "{src}", "--json"),
        ("run", "{src}", "--prompt-ids", "1", "--max-new-tokens", "1", "--no-usage"),
        ("convert", "{src}", "{out}", "--min-free-gb", "0", "--no-progress"),
        ("convert", "{src}", "{out}", "--min-free-gb", "0", "--dry-run"),
        ("mirror", "plan", "--model", "{src}", "--mirror", "{out}", "--budget-gib", "1"),
    ],
)
def test_a_lone_surrogate_in_a_tensor_name_is_refused_in_one_line(surrogate_named, tmp_path, argv):
    args = [a.format(src=surrogate_named, out=tmp_path / "out") for a in argv]
    line = one_line_error(run_cli(*args))
    assert f"{surrogate_named / 'model.safetensors'}" in line


def test_verify_container_reports_a_lone_surrogate_as_a_problem_shown_escaped(surrogate_named):
    result = run_cli("verify", "container", surrogate_named)
    assert result.returncode == 4 and "Traceback" not in result.stderr, result.stderr
    assert '"model.norm.weight\\udfff" is not Unicode text' in result.stdout


# ------------------------------------------------------------------------ item 16: interrupted conversion
@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> tuple[Path, Path]:
    """An OLMoE conversion stopped by a real SIGINT after its first unit was recorded."""
    root = tmp_path_factory.mktemp("interrupted")
    out = root / "out"
    args = ["convert", str(OLMOE), str(out), "--min-free-gb", "0", "--no-progress"]
    env = cli_env({"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "5"})  # a window after each recorded unit
    proc = subprocess.Popen([*COMMAND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    manifest = out / "colitools.json"
    deadline = time.monotonic() + 120
    while not (manifest.is_file() and json.loads(manifest.read_text())["units"]):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130 and not (out / "config.json").exists()
    return out, root


def test_run_on_an_interrupted_conversion_says_it_is_not_complete_and_a_rerun_makes_it_runnable(interrupted):
    out, root = interrupted
    run = ("run", out, "--prompt-ids", "1,2", "--max-new-tokens", "1", "--no-usage")
    line = one_line_error(run_cli(*run), code=1)
    assert line == (f"colitools: error: {out}: the conversion is not complete (colitools.json state "
                    "'converting'): rerun convert to finish")  # fmt: skip
    inspect = run_cli("inspect", out)
    assert inspect.returncode == 0, inspect.stderr
    assert f"warning: {out}: the conversion is not complete" in inspect.stdout + inspect.stderr
    assert "not complete" in " ".join(json.loads(run_cli("inspect", out, "--json").stdout)["warnings"])
    copy = root / "copy"
    shutil.copytree(out, copy)
    assert run_cli("convert", OLMOE, copy, "--min-free-gb", "0", "--no-progress").returncode == 0
    assert run_cli(*run[:1], copy, *run[2:]).returncode == 0
    assert "not complete" not in run_cli("inspect", copy).stdout + run_cli("inspect", copy).stderr


def test_a_folder_without_a_manifest_runs_as_before():
    result = run_cli("run", MXFP8, "--prompt-ids", "1", "--max-new-tokens", "1", "--no-usage")
    assert result.returncode == 0 and "not complete" not in result.stderr, result.stderr
