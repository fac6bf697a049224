"""What ``convert`` checks about its output folder before it writes anything, and what it says about a model
``colitools run`` will not execute: the real console script in subprocesses (exit code, one line, no traceback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from convcheck import listing, snapshot
from tinyckpt import BF16, Tiny, make_checkpoint

from colitools.formats.families import RUNNABLE_MODEL_TYPES
from colitools.formats.safetensors_io import write_safetensors

SPEC = Tiny(layers=2, experts=4, hidden=128, inter=64, shards=2)
EXE = str(Path(sys.executable).parent / "colitools")


def _convert(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "convert", *args, "--min-free-gb", "0"], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("colitools: error: ")
    assert proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def _state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry with its size and mtime, and the folder's own mtime (a file created and removed in it, like a
    lock file, changes that)."""
    entries = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}
    entries["."] = (0, folder.stat().st_mtime_ns)
    return entries


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("outchecks")
    make_checkpoint(root / "src", SPEC)
    done = _convert(str(root / "src"), str(root / "out"))
    assert done.returncode == 0, done.stderr
    return root / "src", root / "out"


# -- 11: --dry-run reads the output folder -------------------------------------------------------------------------
def test_dry_run_on_a_complete_output_reports_every_unit_skipped_and_no_peak(converted):
    src, out = converted
    before = _state(out)
    proc = _convert(str(src), str(out), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["units_skipped"] == summary["units_total"] > 0
    assert summary["peak_disk_bytes"] == 0 and summary["plan"]["peak_disk_bytes"] == 0
    assert all(u["finished"] for u in summary["plan"]["units"])
    assert _state(out) == before


def test_dry_run_on_a_partial_output_plans_only_what_is_left(converted, tmp_path):
    src, out = converted
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    manifest = json.loads((partial / "colitools.json").read_text())
    last = list(manifest["units"])[-1]
    del manifest["units"][last]
    manifest["state"] = "converting"
    (partial / "colitools.json").write_text(json.dumps(manifest))
    (partial / ".model-00001-of-00003.safetensors.tmp-999999").write_bytes(b"partial")  # a crashed writer's
    full = json.loads(_convert(str(src), str(tmp_path / "fresh"), "--dry-run", "--json").stdout)
    before = _state(partial)
    summary = json.loads(_convert(str(src), str(partial), "--dry-run", "--json").stdout)
    assert summary["units_skipped"] == summary["units_total"] - 1
    assert [u["unit"] for u in summary["plan"]["units"] if not u["finished"]] == [last]
    assert 0 < summary["peak_disk_bytes"] < full["peak_disk_bytes"]
    assert _state(partial) == before  # the temporary is still there: a dry run deletes nothing
    assert not (tmp_path / "fresh").exists()


def test_dry_run_json_top_level_bytes_are_what_the_real_run_read_and_wrote(converted, tmp_path):
    """Issue 25 item 6: ``bytes_in`` / ``bytes_out`` of ``--dry-run --json`` are the plan's figures for this run
    (they were 0), equal to what the real conversion of the same source counted (its manifest's ``run``), and
    only the pending units' on a partial output."""
    src, out = converted
    run = json.loads((out / "colitools.json").read_text())["run"]
    fresh = json.loads(_convert(str(src), str(tmp_path / "fresh"), "--dry-run", "--json").stdout)
    assert (fresh["bytes_in"], fresh["bytes_out"]) == (run["bytes_in"], run["bytes_out"])
    assert run["bytes_in"] > 0 and run["bytes_out"] > 0
    assert (fresh["bytes_in"], fresh["bytes_out"]) == (fresh["plan"]["in_bytes"], fresh["plan"]["out_bytes"])
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    manifest = json.loads((partial / "colitools.json").read_text())
    last = list(manifest["units"])[-1]
    del manifest["units"][last]
    manifest["state"] = "converting"
    (partial / "colitools.json").write_text(json.dumps(manifest))
    left = json.loads(_convert(str(src), str(partial), "--dry-run", "--json").stdout)
    unit = next(u for u in left["plan"]["units"] if u["unit"] == last)
    assert (left["bytes_in"], left["bytes_out"]) == (unit["in_bytes"], unit["out_bytes"])
    assert 0 < left["bytes_out"] < fresh["bytes_out"]
    done = json.loads(_convert(str(src), str(out), "--dry-run", "--json").stdout)
    assert (done["bytes_in"], done["bytes_out"]) == (0, 0)  # nothing left to do


def test_dry_run_refuses_another_recipe_as_the_real_run_does(converted):
    src, out = converted
    before = _state(out)
    real = _one_error_line(_convert(str(src), str(out), "--experts", "int8-row"))
    dry = _one_error_line(_convert(str(src), str(out), "--experts", "int8-row", "--dry-run"))
    assert "another recipe" in dry and dry == real
    assert _state(out) == before


# -- 14: the output folder -----------------------------------------------------------------------------------------
def test_rerun_on_a_complete_output_touches_nothing(converted):
    src, out = converted
    before, manifest = _state(out), (out / "colitools.json").read_bytes()
    proc = _convert(str(src), str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["units_converted"] == 0 and summary["units_skipped"] == summary["units_total"]
    assert _state(out) == before and (out / "colitools.json").read_bytes() == manifest


def test_rerun_on_a_complete_output_on_a_read_only_filesystem(converted, tmp_path):
    """A real read-only mount: a tmpfs in a private mount namespace (root in a container), remounted ro."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): cannot make a read-only mount")
    src, _ = converted
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (f'mount -t tmpfs none "{mnt}" || exit 97; "{EXE}" convert "{src}" "{mnt}/out" --min-free-gb 0 '
              f'>/dev/null || exit 98; mount -o remount,ro "{mnt}" || exit 97; touch "{mnt}/probe" 2>/dev/null '
              f'&& exit 96; exec "{EXE}" convert "{src}" "{mnt}/out" --min-free-gb 0')  # fmt: skip
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True)  # fmt: skip
    if (
        proc.returncode in (97, 96)
        or "unshare failed" in proc.stderr
        or "Operation not permitted" in proc.stderr
    ):
        pytest.skip(
            f"cannot make a read-only tmpfs mount here (unshare/mount refused: {proc.stderr.strip()[:200]})"
        )
    assert proc.returncode == 0, proc.stderr
    assert "already done" in proc.stdout and "Traceback" not in proc.stderr


def test_output_that_is_the_source_or_inside_it_is_refused_before_anything_is_written(converted, tmp_path):
    src, _ = converted
    copy = tmp_path / "src"
    shutil.copytree(src, copy)
    before = _state(copy)
    for out in (copy, copy / "converted"):
        line = _one_error_line(_convert(str(copy), str(out)))
        assert "source folder" in line
        assert _state(copy) == before and not (copy / ".colitools.lock").exists()


def test_output_path_that_is_a_file_is_one_line(converted, tmp_path):
    src, _ = converted
    target = tmp_path / "a-file"
    target.write_text("x")
    for out in (target, target / "below"):
        line = _one_error_line(_convert(str(src), str(out)))
        assert "is a file, not a folder" in line and "File exists" not in line


@pytest.mark.parametrize("dry_run", [False, True], ids=["convert", "dry-run"])
def test_a_folder_that_holds_a_users_files_but_no_ledger_is_refused_and_left_as_it_was(
    converted, tmp_path, dry_run
):
    src, _ = converted
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    (out / "tokenizer.json").write_text("{}")
    before = _state(out)
    line = _one_error_line(_convert(str(src), str(out), *(["--dry-run"] if dry_run else [])))
    assert (
        f"{out}: not empty (config.json and 1 more) and not a colitools output (no colitools.json)" in line
    ), line
    assert _state(out) == before  # nothing written, not even a lock file created and removed
    assert (out / "config.json").read_text() == '{"mine": true}'


def test_a_folder_holding_only_what_a_killed_conversion_leaves_before_its_ledger_is_converted_into(
    converted, tmp_path
):
    src, ref = converted
    out = tmp_path / "out"
    (out / ".colitools-download").mkdir(parents=True)
    (out / ".colitools.lock").write_text("")
    (out / ".config.json.tmp-4242").write_text("{")
    done = _convert(str(src), str(out))
    assert done.returncode == 0, done.stderr
    assert snapshot(out) == snapshot(ref) and listing(out) == listing(ref)


def test_an_empty_output_path_is_a_usage_error_and_nothing_is_written(converted, tmp_path):
    src, _ = converted
    here = tmp_path / "cwd"
    here.mkdir()
    proc = subprocess.run([EXE, "convert", str(src), "", "--min-free-gb", "0"], capture_output=True, text=True,
                          cwd=here)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("colitools: error: "), proc.stderr
    assert "an empty path" in proc.stderr and "Traceback" not in proc.stderr
    assert list(here.iterdir()) == []
    from colitools.converters.runner import convert
    from colitools.errors import ParameterError

    with pytest.raises(ParameterError, match="^`outdir`: an empty path"):  # the library's refusal, exit code 2
        convert(str(src), "")
    assert list(here.iterdir()) == []


# -- 14: models `colitools run` will not execute ---------------------------------------------------------------------
def test_runnable_model_types_are_the_runtime_families():
    from colitools.runtime.family_registry import family_for

    assert all(family_for(mt).defaults.get(mt) is not None for mt in RUNNABLE_MODEL_TYPES)


def test_unknown_model_type_converts_with_one_warning(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, SPEC)
    config = json.loads((src / "config.json").read_text())
    config["model_type"] = "someone_elses_moe"
    (src / "config.json").write_text(json.dumps(config))
    proc = _convert(str(src), str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("colitools: warning: ")]
    assert len(warnings) == 1 and "someone_elses_moe" in warnings[0] and "colitools run" in warnings[0]
    assert json.loads(proc.stdout)["warnings"] == [warnings[0].removeprefix("colitools: warning: ")]
    manifest = json.loads((tmp_path / "out" / "colitools.json").read_text())
    assert manifest["warnings"] == json.loads(proc.stdout)["warnings"]


def test_dense_model_converts_with_a_warning(tmp_path):
    rng = np.random.default_rng(0)
    H, V = 64, 96
    src = tmp_path / "dense"
    src.mkdir()
    tensors = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "model.norm.weight": (H,),
               "model.layers.0.self_attn.q_proj.weight": (H, H), "model.layers.0.mlp.gate_proj.weight": (2 * H, H),
               "model.layers.0.mlp.up_proj.weight": (2 * H, H), "model.layers.0.mlp.down_proj.weight": (H, 2 * H),
               "model.layers.0.input_layernorm.weight": (H,)}  # fmt: skip
    write_safetensors(src / "model.safetensors",
                      {n: (rng.standard_normal(s) * 0.05).astype(BF16) for n, s in tensors.items()})  # fmt: skip
    (src / "config.json").write_text(json.dumps(
        {"model_type": "deepseek_v3", "hidden_size": H, "vocab_size": V, "num_hidden_layers": 1}))  # fmt: skip
    proc = _convert(str(src), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("colitools: warning: ")]
    assert len(warnings) == 1 and "dense" in warnings[0] and "colitools run" in warnings[0]


def test_runnable_moe_converts_without_a_warning(converted):
    src, out = converted
    assert json.loads((out / "colitools.json").read_text())["warnings"] == []
    assert snapshot(out) and ".colitools.lock" not in listing(out)
