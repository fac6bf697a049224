"""Issue 9 (items 5-9, 12): every bad input and every option error is one line with a documented exit code,
Ctrl-C stops a conversion with the resume hint, and the mirror planner neither promises a gain it cannot give
nor refuses a budget it could partly fill.

Everything runs the real console script (``.venv/bin/colitools``) in a subprocess, with real files and a real
SIGINT; the out-of-space cases mount a small tmpfs (skipped where mounting is not allowed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
for sub in ("tests/converters", "tests/mirror"):
    if str(REPO / sub) not in sys.path:
        sys.path.insert(0, str(REPO / sub))

from cli_helpers import COMMAND, run_cli  # noqa: E402
from cli_helpers import one_line_error as _one_line_error  # noqa: E402
from mirror_builders import expert_tensors, write_config, write_history, write_shard  # noqa: E402
from tinyckpt import Tiny, make_checkpoint  # noqa: E402

from colitools.formats.safetensors_io import SafetensorsFile  # noqa: E402
from colitools.formats.usage import UsageHistory, write_usage  # noqa: E402
from colitools.mirror.fileops import TEMP_SUFFIX  # noqa: E402

ORACLES = REPO / "oracles"


cli = run_cli


def one_line_error(result, code: int, *words: str) -> str:
    return _one_line_error(result, *words, code=code)


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory) -> Path:
    return Path(shutil.copytree(ORACLES / "olmoe", tmp_path_factory.mktemp("olmoe") / "olmoe"))


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs: a real drive that runs out of space."""
    mnt = tmp_path / "small-drive"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ------------------------------------------------------------------------------------------ item 7


@pytest.mark.parametrize(
    "args, words",
    [
        (["run", "{m}", "--prompt-ids", "1", "--max-new-tokens", "0"], ["--max-new-tokens"]),
        (["run", "{m}", "--prompt-ids", "1", "--cap", "0"], ["--cap"]),
        (["usage", "show", "{m}/.coli_usage", "--top", "0"], ["--top"]),
        (["no-such-command"], ["no-such-command"]),
        (["convert", "{m}", "{m}-out", "--no-such-option"], ["--no-such-option"]),
        (["convert", "{m}", "{m}-out", "--keep-source", "true"], ["true"]),
    ],
)
def test_option_errors_are_one_line_with_exit_2(olmoe, args, words):
    one_line_error(cli(*(a.format(m=olmoe) for a in args)), 2, *words)


def test_version_prints_the_package_version():
    result = cli("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"colitools {version('colitools')}\n", "")


def test_help_shows_flags_without_bool_metavars_and_keep_source_is_a_real_flag():
    text = cli("convert", "--help").stdout
    assert "<bool>" not in text and "--keep-source / --no-keep-source" in text.replace("--keep-source/", "--keep-source / ")
    assert "--progress" in text and "--no-progress" in text
    assert "<bool>" not in cli("run", "--help").stdout


SPEC = Tiny(layers=3, experts=4, hidden=128, inter=64, shards=3)


def test_ctrl_c_during_a_conversion_exits_130_with_the_resume_hint_and_a_rerun_finishes(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    env = {**os.environ, "COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "0.05"}
    args = ["convert", str(src), str(out), "--min-free-gb", "0", "--workers", "1"]
    proc = subprocess.Popen([*COMMAND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out.is_dir() and any(p.name.startswith(".model-") for p in out.iterdir())):  # mid-unit
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the conversion never started writing"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.splitlines() == ["colitools: interrupted; rerun the same command to resume (finished units are kept)"]
    for path in out.glob("model-*.safetensors"):  # a file under its final name is complete
        SafetensorsFile(path).close()
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert cli("verify", "container", out).returncode == 0


# ------------------------------------------------------------------------------------------ item 9


def test_a_local_conversion_shows_no_download_bars_and_progress_can_be_forced(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, Tiny(shards=3))
    result = cli("convert", src, tmp_path / "out", "--min-free-gb", "0", "--progress", "--no-keep-source")
    assert result.returncode == 0, result.stderr
    assert "convert" in result.stderr  # the forced conversion bar
    assert "download" not in result.stderr
    quiet = cli("convert", src, tmp_path / "out2", "--min-free-gb", "0", "--no-progress")
    assert quiet.returncode == 0
    # no bar at all; the only lines are the run warnings (the tiny checkpoint has no routed experts)
    assert all(line.startswith("colitools: warning:") for line in quiet.stderr.splitlines()), quiet.stderr


def test_mirror_stage_out_of_space_names_the_file_and_the_bytes(tmp_path, tmpfs):
    model = tmp_path / "model"
    model.mkdir()
    # 1020 KiB shard: with the 4 KiB plan file the 1 MiB drive is full, and the receipt finds no room
    write_shard(model / "a.safetensors", expert_tensors(0, 0, weight=(1016 << 10) // 3, scale=0))
    write_config(model, n_layers=1, n_experts=1)
    write_history(model / ".coli_usage", {(0, 0): 5}, n_layers=1, n_experts=1)
    result = cli("mirror", "stage", "--model", model, "--mirror", tmpfs / "m", "--budget-gib", "1",
                 "--reserve-gib", "0")  # fmt: skip
    line = one_line_error(result, 2, str(tmpfs / "m"), "no space left", "bytes still to write", "bytes free")
    assert "rerun" in line


# ------------------------------------------------------------------------------------------ item 6


def test_usage_show_with_a_5000_digit_count_is_one_line(tmp_path):
    usage = tmp_path / ".coli_usage"
    write_usage(usage, UsageHistory(2, 4, None))
    usage.write_text(usage.read_text() + "0 1 " + "9" * 5000 + "\n")
    one_line_error(cli("usage", "show", usage), 1, str(usage), "5000-digit")


def test_run_with_a_prompt_id_beyond_the_vocabulary_names_the_value_and_the_vocab_size(olmoe):
    vocab = json.loads((olmoe / "config.json").read_text())["vocab_size"]
    line = one_line_error(cli("run", olmoe, "--prompt-ids", "99999999999999999999", "--no-usage"), 1)
    assert "99999999999999999999" in line and f"vocab_size {vocab}" in line
    one_line_error(cli("run", olmoe, "--prompt-ids", f"1,{vocab}", "--no-usage"), 1, str(vocab))
    one_line_error(cli("run", olmoe, "--prompt-ids", "9" * 5000, "--no-usage"), 1, "--prompt-ids")


def test_mirror_verify_on_a_receipt_nested_100000_deep_is_one_line(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / ".colibri-mirror.json").write_text("[" * 100_000 + "]" * 100_000)
    result = cli("mirror", "verify", "--mirror", mirror)
    assert result.returncode == 4 and "Traceback" not in result.stderr, result.stderr
    assert "nested too deeply" in result.stdout


# ------------------------------------------------------------------------------------------ item 8


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["convert", "{m}", "{t}/o", "--min-free-gb", "-5"], 2, ["--min-free-gb"]),
        (["convert", "{m}", "{t}/o", "--experts", "int3-g64", "--group-size", "32"], 1, ["--group-size 32"]),
        (["convert", "{m}", "{t}/o", "--experts", "int8-row", "--group-size", "32"], 1, ["--group-size 32"]),
        (["verify", "oracle", "{m}", "--atol", "-1"], 2, ["--atol"]),
        (["run", "{m}", "--prompt-ids", "1,,2", "--no-usage"], 1, ["--prompt-ids", "entry 2"]),
        (["run", "{m}", "--prompt-ids", "1,2", "--ram-gb", "0.000001", "--no-usage"], 1, ["--ram-gb", "resident"]),
    ],
)
def test_unchecked_values_are_refused_in_one_line(olmoe, tmp_path, args, code, words):
    one_line_error(cli(*(a.format(m=olmoe, t=tmp_path) for a in args)), code, *words)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------ items 5, 12


def _mirror_model(root: Path, n: int, weight: int) -> Path:
    model = root / "model"
    model.mkdir()
    for e in range(n):
        write_shard(model / f"s{e}.safetensors", expert_tensors(0, e, weight=weight, scale=0))
    write_config(model, n_layers=1, n_experts=n)
    write_history(model / ".coli_usage", {(0, e): 10 - e for e in range(n)}, n_layers=1, n_experts=n)
    return model


def test_mirror_on_the_same_device_predicts_no_gain(tmp_path):
    model = _mirror_model(tmp_path, 4, 1000)
    result = cli("mirror", "plan", "--model", model, "--mirror", tmp_path / "mirror", "--budget-gib", "1",
                 "--reserve-gib", "0", "--disk-weights", "1,3", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    prediction = json.loads(result.stdout)["prediction"]
    assert prediction["same_device"] is True
    assert prediction["bandwidth_gain"] == 1.0 and prediction["full_mirror_bandwidth_gain"] == 1.0
    text = cli("mirror", "plan", "--model", model, "--mirror", tmp_path / "mirror", "--budget-gib", "1",
               "--reserve-gib", "0", "--disk-weights", "1,3").stdout  # fmt: skip
    assert "x1.000 of the primary alone" in text


def test_probe_prints_readable_weights_and_probes_both_drives_with_the_same_sample(tmp_path):
    model = _mirror_model(tmp_path, 2, 1000)
    result = cli("mirror", "plan", "--model", model, "--mirror", tmp_path / "mirror", "--budget-gib", "1",
                 "--reserve-gib", "0", "--probe")  # fmt: skip
    assert result.returncode == 0, result.stderr
    weights = next(line for line in result.stdout.splitlines() if line.startswith("predicted expert reads"))
    assert "MB/s" in weights and "e+" not in weights
    assert "x1.000 of the primary alone" in result.stdout
    data = json.loads(cli("mirror", "plan", "--model", model, "--mirror", tmp_path / "mirror", "--budget-gib",
                          "1", "--reserve-gib", "0", "--probe", "--json").stdout)  # fmt: skip
    probes = data["prediction"]["probes"]
    assert len(probes) == 2 and probes[0]["bytes_read"] == probes[1]["bytes_read"] > 0


def test_plan_and_stage_fill_what_fits_above_the_reserve(tmp_path, tmpfs):
    model = _mirror_model(tmp_path, 3, (400 << 10) // 3)  # three 404 KiB shards, a 1 MiB drive
    args = ["--model", model, "--mirror", tmpfs / "m", "--budget-gib", "1", "--reserve-gib", "0"]
    result = cli("mirror", "plan", *args, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["admitted"] and data["budget_limited_by_free_space"]
    assert [f["name"] for f in data["files"]] == ["s0.safetensors", "s1.safetensors"]
    assert data["effective_budget_bytes"] <= data["free_bytes"]
    assert any("fills what fits" in w for w in data["warnings"])
    staged = cli("mirror", "stage", *args)
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert sorted(p.name for p in (tmpfs / "m").glob("*.safetensors")) == ["s0.safetensors", "s1.safetensors"]


def test_ctrl_c_during_mirror_stage_exits_130_with_the_resume_hint_and_a_rerun_finishes(tmp_path):
    model = _mirror_model(tmp_path, 1, 1 << 20)
    args = ["mirror", "stage", "--model", str(model), "--mirror", str(tmp_path / "m"), "--budget-gib", "1",
            "--reserve-gib", "0"]  # fmt: skip
    env = {**os.environ, "COLITOOLS_MIRROR_TEST_STALL_AFTER_BYTES": "100000"}  # the copy stops mid-file
    proc = subprocess.Popen([*COMMAND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(TEMP_SUFFIX in p.name for p in (tmp_path / "m").glob(".*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the copy never started"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err.splitlines() == ["colitools: interrupted; rerun the same command to resume (verified copies are kept)"]
    assert not (tmp_path / "m" / "s0.safetensors").exists()  # nothing half-copied under its final name
    done = cli(*args)
    assert done.returncode == 0 and "ready: yes" in done.stdout, done.stdout + done.stderr
