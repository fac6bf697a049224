"""The CLI boundary (issue 24 items 11, 14, 18, 9; issue 23 step 9): option values outside their range or choices
are usage errors (exit 2), every command with ``--json`` prints one JSON object when it fails, library messages
name parameters and the CLI prints them as the command's flags, a Ctrl-C while the CLI is still importing is one
line, and the help and docs/CLI.md say what the commands accept.

Everything runs the real console script in a subprocess, with real files and real signals.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import COMMAND, cli_env, one_line_error, run_cli

REPO = Path(__file__).resolve().parents[2]
ORACLES = REPO / "oracles"
for sub in ("tests/converters", "tests/mirror"):
    if str(REPO / sub) not in sys.path:
        sys.path.insert(0, str(REPO / sub))

from mirror_builders import expert_tensors, write_config, write_history, write_shard  # noqa: E402
from tinyckpt import Tiny, make_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory) -> Path:
    return Path(shutil.copytree(ORACLES / "olmoe", tmp_path_factory.mktemp("olmoe") / "olmoe"))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny model with routed experts and a routing history, for the mirror and usage commands."""
    root = tmp_path_factory.mktemp("mirror_model") / "model"
    root.mkdir()
    for e in range(2):
        write_shard(root / f"s{e}.safetensors", expert_tensors(0, e, weight=1000, scale=0))
    write_config(root, n_layers=1, n_experts=2)
    write_history(root / ".coli_usage", {(0, 0): 5, (0, 1): 3}, n_layers=1, n_experts=2)
    return root


# ------------------------------------------------------------------------------------------ item 11
@pytest.mark.parametrize(
    "args, flag",
    [
        (["run", "{m}", "--prompt-ids", "1", "--ram-gb", "-1"], "--ram-gb"),
        (["run", "{m}", "--prompt-ids", "1", "--ram-gb", "0"], "--ram-gb"),
        (["run", "{m}", "--prompt-ids", "1", "--ram-gb", "nan"], "--ram-gb"),
        (["convert", "{m}", "{t}/o", "--group-size", "33"], "--group-size 33"),
        (["convert", "{m}", "{t}/o", "--experts", "foo"], "--experts"),
        (["convert", "{m}", "{t}/o", "--dense", "int4-g7"], "--dense"),
        (["convert", "{m}", "{t}/o", "--layout", "foo"], "--layout 'foo'"),
        (["convert", "{m}", "{t}/o", "--towers", "foo"], "--towers 'foo'"),
        (["convert", "{m}", "{t}/o", "--on-low-disk", "foo"], "--on-low-disk 'foo'"),
        (["convert", "{m}", "{t}/o", "--min-free-gb", "nan"], "--min-free-gb nan"),
    ],
)
def test_option_values_outside_their_range_or_choices_exit_2_naming_the_flag(olmoe, tmp_path, args, flag):
    line = one_line_error(run_cli(*(a.format(m=olmoe, t=tmp_path) for a in args), "--no-usage"
                                  if args[0] == "run" else "--no-progress"), flag, code=2)  # fmt: skip
    assert "`" not in line  # the library's parameter names are all the command's flags here
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["plan", "stage"])
@pytest.mark.parametrize(
    "args, words",
    [
        (["--mirror", "{t}/m", "--budget-gib", "1"], ["Missing option '--model'"]),
        (["--model", "{m}", "--budget-gib", "1"], ["Missing option '--mirror'"]),
        (["--model", "{m}", "--mirror", "{t}/m"], ["Missing option '--budget-gib'"]),
        (["--model", "{m}", "--mirror", "{t}/m", "--budget-gib", "0"], ["--budget-gib must be positive (got 0 GiB)"]),
        (["--model", "{m}", "--mirror", "{t}/m", "--budget-gib", "-3"], ["--budget-gib must be positive (got -3 GiB)"]),
        (["--model", "{m}", "--mirror", "{t}/m", "--budget-gib", "1e-12"], ["--budget-gib must be positive"]),
        (["--model", "{m}", "--mirror", "{t}/m", "--budget-gib", "nan"], ["--budget-gib", "nan"]),
        (["--model", "{m}", "--mirror", "{t}/m", "--budget-gib", "1e400"], ["--budget-gib must be less than"]),
        (["--model", "{m}", "--mirror", "{t}/m", "--budget-gib", "1", "--reserve-gib", "-5"],
         ["--reserve-gib cannot be negative (got -5 GiB)"]),
        (["--model", "{m}", "--mirror", "{t}/m", "--budget-gib", "1", "--disk-weights", "9"], ["--disk-weights", "'9'"]),
    ],
)  # fmt: skip
def test_mirror_options_missing_or_out_of_range_exit_2(model, tmp_path, command, args, words):
    line = one_line_error(
        run_cli("mirror", command, *(a.format(m=model, t=tmp_path) for a in args)), *words, code=2
    )
    assert "bytes" not in line  # GiB as given, not the byte count it became
    assert not (tmp_path / "m").exists()


def test_mirror_verify_without_mirror_exits_2_and_with_it_still_runs(model, tmp_path):
    one_line_error(run_cli("mirror", "verify", "--model", model), "Missing option '--mirror'", code=2)
    (tmp_path / "nothing-staged").mkdir()
    result = run_cli("mirror", "verify", "--mirror", tmp_path / "nothing-staged")
    assert result.returncode == 4 and "pass --model for a full-mirror check" in result.stdout, result.stdout


def test_the_cli_reserve_default_is_the_planners():
    from colitools.cli.options import DEFAULT_RESERVE_GIB
    from colitools.mirror.plan import DEFAULT_RESERVE_GIB as planner_default

    assert float(DEFAULT_RESERVE_GIB) == planner_default


# ------------------------------------------------------------------------------------------ step 7 / step 9
def test_a_library_error_names_the_parameter_and_the_cli_line_names_the_flag(olmoe, tmp_path):
    from colitools.converters.options import ConvertOptions
    from colitools.errors import ConvertError, ParameterError

    with pytest.raises(ParameterError) as info:
        ConvertOptions(group_size=33).recipe()
    assert str(info.value).startswith("`group_size=33` is not one of 16, 32") and "--" not in str(info.value)
    with pytest.raises(ConvertError) as contradiction:
        ConvertOptions(experts="int4-g32", group_size=64).recipe()
    assert str(contradiction.value) == "`experts=int4-g32` contradicts `group_size=64`"
    line = one_line_error(run_cli("convert", olmoe, tmp_path / "o", "--experts", "int4-g32", "--group-size", "64"),
                          code=1)  # fmt: skip
    assert line == "colitools: error: --experts int4-g32 contradicts --group-size 64"


# flags of the CLI that a library string may mention only inside a command line to run (`colitools kernels --build`)
_FLAG = re.compile(r"(?<![\w`-])--[a-z][a-z0-9-]+")
LIBRARY = [REPO / "formats", REPO / "converters", REPO / "verify", REPO / "colitools" / "runtime",
           REPO / "colitools" / "mirror"]  # fmt: skip


def _strings(tree: ast.AST):
    """Every string literal of a module except docstrings (f-string parts included)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_library_message_names_a_cli_flag():
    found = []
    for folder in LIBRARY:
        for path in sorted(folder.rglob("*.py")):
            for lineno, text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
                text = re.sub(r"`colitools [^`]*`", "", text)  # a command line to run is the CLI's own
                if _FLAG.search(text):
                    found.append(f"{path.relative_to(REPO)}:{lineno}: {text[:80]!r}")
    assert found == []


# ------------------------------------------------------------------------------------------ item 14
def _failure(result, code: int) -> dict:
    """The one JSON object a failing ``--json`` command prints: its error is the stderr line's message."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data, dict) and data["ok"] is False and data["exit_code"] == code, data
    line = result.stderr.splitlines()[-1]
    assert line.split(": ", 1)[0] == "colitools" and line.endswith(data["error"]), (line, data)
    return data


@pytest.mark.parametrize(
    "args, code",
    [
        (["convert", "{m}", "{t}/o", "--experts", "foo"], 2),
        (["convert", "{t}/none", "{t}/o"], 1),
        (["convert", "{m}", "{t}/o", "--no-such-option"], 2),
        (["run", "{m}", "--prompt-ids", "1,,2"], 1),
        (["run", "{m}", "--prompt-ids", "1", "--ram-gb", "0"], 2),
        (["run", "{t}/none", "--prompt-ids", "1"], 1),
        (["inspect", "{t}/none"], 1),
        (["formats", "--bogus"], 2),
        (["kernels", "--force"], 2),
        (["verify", "container", "{t}/none"], 1),
        (["verify", "oracle", "{t}/none"], 1),
        (["mirror", "plan", "--model", "{t}/none", "--mirror", "{t}/m", "--budget-gib", "1"], 1),
        (["mirror", "stage", "--model", "{m}", "--mirror", "{t}/m"], 2),
        (["mirror", "verify", "--mirror", "{m}/config.json"], 1),
        (["usage", "show", "{t}/none"], 1),
    ],
)
def test_every_json_command_prints_one_failure_object(olmoe, tmp_path, args, code):
    _failure(run_cli(*(a.format(m=olmoe, t=tmp_path) for a in args), "--json"), code)


SPEC = Tiny(layers=3, experts=4, hidden=128, inter=64, shards=3)


def test_convert_json_at_the_disk_floor_prints_the_failure_object(tmp_path):
    make_checkpoint(tmp_path / "src", SPEC)
    (tmp_path / "free").write_text("1000\n")  # far below the 1 GB floor
    result = run_cli("convert", tmp_path / "src", tmp_path / "out", "--min-free-gb", "1", "--on-low-disk", "stop",
                     "--json", env={"COLITOOLS_FAKE_FREE_BYTES_FILE": str(tmp_path / "free")})  # fmt: skip
    data = _failure(result, 3)
    assert data["error"].startswith("low disk: ") and "resume" in data["error"]


def _interrupt(args: list[str], ready, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Start ``colitools ARGS``, send SIGINT once ``ready(pid)`` holds, return what it printed."""
    proc = subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(env))  # fmt: skip
    deadline = time.monotonic() + 120
    while not ready(proc.pid):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the command never got going"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # ignored: fail without leaving a run of 10^6 tokens behind
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_convert_json_interrupted_prints_the_failure_object_with_the_resume_hint(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)

    def mid_unit(pid: int) -> bool:
        return out.is_dir() and any(p.name.startswith(".model-") for p in out.iterdir())

    result = _interrupt(["convert", str(src), str(out), "--min-free-gb", "0", "--json"], mid_unit,
                        env={"COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "0.05"})  # fmt: skip
    data = _failure(result, 130)
    assert data["error"] == "interrupted; rerun the same command to resume (finished units are kept)"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_run_json_interrupted_prints_the_failure_object(olmoe, tmp_path):
    # 2 CPU seconds: well past the imports (~0.3) and the load of the tiny model, into the generation
    result = _interrupt(["run", str(olmoe), "--prompt-ids", "1,2,3", "--max-new-tokens", "1000000", "--ignore-eos",
                         "--no-usage", "--json"], lambda pid: _cpu_seconds(pid) > 2)  # fmt: skip
    assert _failure(result, 130)["error"] == "interrupted"


# ------------------------------------------------------------------------------------------ item 9 (imports)
def test_ctrl_c_while_the_cli_is_still_importing_is_one_line_exit_130():
    """``-X importtime`` reports each import as it finishes: the SIGINT lands while typer (imported after the
    entry point's handler is in place) is still loading, before any command runs."""
    for extra in ([], ["--json"]):
        proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "colitools", "formats", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())  # fmt: skip
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line.rstrip().endswith("| typer._click") or " typer._click." in line:
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=60)
        lines = [ln for ln in err.splitlines() if not ln.startswith("import time:")]
        assert proc.returncode == 130, (seen[-3:], err[-2000:])
        assert lines == ["colitools: interrupted"] and "Traceback" not in err
        if extra:
            assert json.loads(out) == {"ok": False, "error": "interrupted", "exit_code": 130}
        else:
            assert out == ""  # the command never ran


# ------------------------------------------------------------------------------------------ item 18
def test_kernels_force_without_build_is_a_usage_error():
    one_line_error(run_cli("kernels", "--force"), "--force", "--build", code=2)


def test_inspect_json_summary_is_the_report_without_tensor_rows(olmoe):
    full = json.loads(run_cli("inspect", olmoe, "--json").stdout)
    result = run_cli("inspect", olmoe, "--json", "--summary")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert "tensors" not in summary and summary["tensor_count"] == len(full["tensors"]) > 0
    assert summary == {
        **{k: v for k, v in full.items() if k != "tensors"},
        "tensor_count": len(full["tensors"]),
    }


def test_convert_help_names_every_kind_of_source():
    text = " ".join(run_cli("convert", "--help").stdout.split())
    assert "BF16/FP8 checkpoint" not in text
    for kind in ("BF16", "FP8", "natively quantized", "MXFP4", "INT4 compressed-tensors", "NVFP4", "MXFP8"):
        assert kind in text, kind


def test_cli_reference_lists_every_format_option_and_the_natively_quantized_sources():
    from colitools.formats.format_names import RECIPE_FORMAT_NAMES

    reference = (REPO / "docs" / "CLI.md").read_text(encoding="utf-8")
    convert = reference[reference.index("## `convert`") : reference.index("## `inspect`")]
    for name in RECIPE_FORMAT_NAMES:
        spelled = "int4-g{16,32,48,64,96,128,192,256}" if name.startswith("int4-g") else name
        assert f"`{spelled}`" in convert, name
    assert "--experts native" in convert
    for kind in ("MXFP4", "INT4", "compressed-tensors", "NVFP4", "MXFP8", "FP8"):
        assert kind in convert, kind
    assert '{"ok": false, "error": ' in reference  # the --json failure object
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "(docs/CLI.md)" in readme  # the front door links the reference


# ------------------------------------------------------------------------------------------ step 9
def test_usage_show_is_the_library_report(model):
    from colitools.mirror.usage_report import usage_report

    result = run_cli("usage", "show", model / ".coli_usage", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data == json.loads(json.dumps(usage_report(model / ".coli_usage").to_json()))
    assert (data["total_selections"], data["model"], data["expert_sizes_known"]) == (8, str(model), True)


def test_verify_oracle_reports_each_recipe_and_refuses_an_unknown_family_before_work(tmp_path):
    from colitools.verify.oracle import verify_oracle

    seen = []
    report = verify_oracle(ORACLES / "olmoe", ["f32"], progress=seen.append)
    expected = json.loads((ORACLES / "olmoe" / "reference" / "f32.json").read_text())["generated_ids"]
    assert report.ok and seen == report.results and seen[0].generated_ids == expected
    future = Path(shutil.copytree(ORACLES / "olmoe", tmp_path / "future"))
    config = json.loads((future / "config.json").read_text())
    (future / "config.json").write_text(json.dumps({**config, "model_type": "olmoe_next"}))
    refused = verify_oracle(future, progress=seen.append)
    assert refused.results == [] and not refused.ok and "olmoe_next is not supported" in refused.not_runnable
    assert len(seen) == 1
    result = run_cli("verify", "oracle", future, "--json")
    assert _failure(result, 4)["error"] == refused.not_runnable


def test_every_json_option_is_the_shared_one():
    import typer

    from colitools.cli import boundary

    def commands(group, path=()):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from commands(command, (*path, name))
            else:
                yield (*path, name), command

    helps = {}
    for path, command in commands(typer.main.get_command(boundary.app)):
        for param in command.params:
            if "--json" in param.opts:
                helps[path] = (param.name, param.help)
    assert len(helps) == 16 and len(set(helps.values())) == 1, helps  # targets is the 15th, merge the 16th


def test_a_conversion_through_the_cli_still_converts(tmp_path):
    """The success path through the new boundary, end to end: the summary, then a container that verifies."""
    make_checkpoint(tmp_path / "src", Tiny(hidden=128))
    done = run_cli("convert", tmp_path / "src", tmp_path / "out", "--min-free-gb", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["units_converted"] == 3
    assert run_cli("verify", "container", tmp_path / "out").returncode == 0
    assert os.listdir(tmp_path / "out")
