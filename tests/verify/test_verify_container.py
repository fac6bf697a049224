"""`colitools verify container`: a sound conversion passes; each kind of damage is reported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.safetensors_io import SafetensorsFile
from colitools.verify.container import verify_container

ORACLES = Path(__file__).resolve().parents[2] / "oracles"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("conv") / "qwen2"
    convert(str(ORACLES / "qwen2_moe"), out, ConvertOptions(progress=False, min_free_gb=0.0))
    return out


@pytest.fixture
def copy(converted, tmp_path) -> Path:
    dest = tmp_path / "model"
    shutil.copytree(converted, dest)
    return dest


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colitools", "verify", "container", *args],
                          capture_output=True, text=True)  # fmt: skip


def test_sound_conversion_passes(converted):
    report = verify_container(converted)
    assert report.ok, report.problems
    assert report.hashed_files == len(list(converted.glob("*.safetensors")))
    assert report.formats.get("int8-row", 0) > 0 and report.formats.get("int4-row", 0) > 0
    proc = _cli(str(converted), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


def _first_scale(model: Path) -> tuple[Path, int]:
    for shard in sorted(model.glob("*.safetensors")):
        f = SafetensorsFile(shard)
        for name, info in f.tensors.items():
            if name.endswith(".qs"):
                return shard, info.begin
    raise AssertionError("no .qs tensor")


def test_flipped_data_byte_is_a_sha256_mismatch(copy):
    shard = sorted(copy.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    report = verify_container(copy)
    assert any("sha256" in p and shard.name in p for p in report.problems), report.problems
    proc = _cli(str(copy))
    assert proc.returncode == 4 and "NOT OK" in proc.stdout


def test_nan_scale_is_reported_with_its_tensor(copy):
    shard, offset = _first_scale(copy)
    data = bytearray(shard.read_bytes())
    data[offset : offset + 4] = np.array([np.nan], np.float32).tobytes()
    shard.write_bytes(bytes(data))
    problems = verify_container(copy).problems
    assert any("non-finite" in p and ".qs" in p for p in problems), problems


def test_unfinished_conversion_is_not_ok(copy):
    manifest = json.loads((copy / "colitools.json").read_text())
    manifest["state"] = "converting"
    (copy / "colitools.json").write_text(json.dumps(manifest))
    assert any("not 'complete'" in p for p in verify_container(copy, hashes=False).problems)


def test_truncated_shard_is_a_problem_exit_4(copy):
    shard = sorted(copy.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-10])
    proc = _cli(str(copy))
    assert proc.returncode == 4 and proc.stderr == ""
    problems = [line for line in proc.stdout.splitlines() if line.startswith("PROBLEM: ")]
    assert len(problems) == 1 and shard.name in problems[0]


def _damage_three_shards(copy: Path) -> list[str]:
    """A missing, a truncated and a header-corrupted shard; returns their names."""
    names = sorted(p.name for p in copy.glob("model-*.safetensors"))
    assert len(names) >= 3, names
    missing, truncated, corrupted = names[0], names[1], names[-1]
    (copy / missing).unlink()
    data = (copy / truncated).read_bytes()
    (copy / truncated).write_bytes(data[: len(data) // 2])
    data = bytearray((copy / corrupted).read_bytes())
    data[8:10] = b"[["  # the header's JSON is no longer an object
    (copy / corrupted).write_bytes(bytes(data))
    return [missing, truncated, corrupted]


def test_every_damaged_shard_is_reported_exit_4(copy):
    damaged = _damage_three_shards(copy)
    proc = _cli(str(copy))
    assert proc.returncode == 4 and "Traceback" not in proc.stderr + proc.stdout
    problems = [line for line in proc.stdout.splitlines() if line.startswith("PROBLEM: ")]
    for name in damaged:
        assert sum(name in p for p in problems) == 1, (name, problems)


def test_damaged_shards_with_json_print_the_report_exit_4(copy):
    damaged = _damage_three_shards(copy)
    proc = _cli(str(copy), "--json")
    assert proc.returncode == 4 and proc.stderr == ""
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert all(any(name in p for p in report["problems"]) for name in damaged)


def test_sha256_line_counts_files_that_matched(copy):
    shard = sorted(copy.glob("model-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # tensor data, not the header: the shard still opens
    shard.write_bytes(bytes(data))
    proc = _cli(str(copy))
    assert proc.returncode == 4
    hashed = len(json.loads((copy / "colitools.json").read_text())["shards"])
    assert f"sha256 matched the manifest for {hashed - 1} of {hashed} file(s) hashed" in proc.stdout


def test_unreadable_folder_with_json_still_prints_a_report_exit_1(tmp_path):
    proc = _cli(str(tmp_path / "nothing"), "--json")
    assert proc.returncode == 1
    assert proc.stderr.startswith("colitools: error:") and proc.stderr.count("\n") == 1
    assert json.loads(proc.stdout)["ok"] is False
