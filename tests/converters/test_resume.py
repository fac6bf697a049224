"""Kill the converter (a real child process, SIGKILL) at several points; a rerun must finish with output
byte-identical to an uninterrupted run.

Test-only knobs (environment, read by the converter; documented in docs/INTERNALS.md):
``COLITOOLS_TEST_SLOW_TENSOR_SECONDS`` (sleep after each tensor: the kill lands mid-unit),
``COLITOOLS_TEST_SLOW_UNIT_SECONDS`` (sleep after each recorded unit: the kill lands between units),
``COLITOOLS_TEST_KILL_AT=published:N`` (the process SIGKILLs itself right after publishing its N-th file and
before recording it in the ledger). Compared for identity: every shard, the index, config and copied files, and
``colitools.json`` without its ``run`` section (see ``convcheck.snapshot``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from convcheck import listing, snapshot
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert

SPEC = Tiny(layers=3, experts=4, hidden=128, inter=64, shards=3)


def _cmd(src, out, *extra):
    return [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0", *extra]


def _start(src, out, env_extra, *extra):
    env = {**os.environ, **env_extra}
    return subprocess.Popen(
        _cmd(src, out, *extra), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _finished_units(out: Path) -> int:
    try:
        return len(json.loads((out / "colitools.json").read_text())["units"])
    except (OSError, ValueError, KeyError):
        return 0


def _wait_for(proc, cond, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        if proc.poll() is not None:
            pytest.fail(
                f"converter exited ({proc.returncode}) before the kill point: {proc.stderr.read().decode()}"
            )
        time.sleep(0.01)
    proc.kill()
    pytest.fail("kill point not reached")


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    proc.stderr.close()


def _rerun(src, out):
    subprocess.run(_cmd(src, out), check=True, capture_output=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    make_checkpoint(root / "src", SPEC)
    convert(str(root / "src"), root / "ref", ConvertOptions(min_free_gb=0))
    return root / "src", snapshot(root / "ref"), listing(root / "ref")


def test_kill_mid_unit_then_resume_is_byte_identical(reference, tmp_path):
    src, ref, names = reference
    out = tmp_path / "out"
    proc = _start(src, out, {"COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "0.02"})
    # one unit recorded, and the next unit's temporary file growing: the kill lands inside a unit
    _wait_for(
        proc, lambda: _finished_units(out) >= 1 and any(p.name.startswith(".model-") for p in out.iterdir())
    )
    _kill(proc)
    assert any(".tmp-" in p.name for p in out.iterdir())  # a partial file was left behind
    _rerun(src, out)
    assert snapshot(out) == ref and listing(out) == names


def test_kill_between_units_then_resume_is_byte_identical(reference, tmp_path):
    src, ref, names = reference
    out = tmp_path / "out"
    proc = _start(src, out, {"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "1.5"})
    _wait_for(proc, lambda: _finished_units(out) >= 1)
    _kill(proc)
    assert not any(".tmp-" in p.name for p in out.iterdir())
    _rerun(src, out)
    assert snapshot(out) == ref and listing(out) == names


def test_kill_after_publish_before_the_ledger_records_it(reference, tmp_path):
    src, ref, names = reference
    out = tmp_path / "out"
    done = subprocess.run(
        _cmd(src, out), env={**os.environ, "COLITOOLS_TEST_KILL_AT": "published:2"}, capture_output=True
    )
    assert done.returncode == -signal.SIGKILL
    # published, not recorded (the unit before it may be unrecorded too: recording follows publication)
    assert (out / "model-00002-of-00004.safetensors").exists() and _finished_units(out) <= 1
    _rerun(src, out)
    assert snapshot(out) == ref and listing(out) == names


def test_damaged_finished_file_is_redone(reference, tmp_path):
    src, ref, names = reference
    out = tmp_path / "out"
    _rerun(src, out)
    with open(out / "model-00003-of-00004.safetensors", "r+b") as fh:
        fh.truncate(100)
    again = convert(str(src), out, ConvertOptions(min_free_gb=0))
    assert again.units_redone == ["model.layers.1"] and again.units_converted == 1
    assert snapshot(out) == ref


def test_kill_during_a_download_then_resume(hub, tmp_path):
    folder = tmp_path / "repo"
    make_checkpoint(folder, SPEC)
    hub.add_repo("org/tiny", {"main": folder})
    convert("org/tiny", tmp_path / "ref", ConvertOptions(min_free_gb=0))
    ref = snapshot(tmp_path / "ref")
    assert listing(tmp_path / "ref") == listing(tmp_path / "ref")  # no .colitools-download left
    assert ".colitools-download" not in listing(tmp_path / "ref")

    shard = "model-00002-of-00003.safetensors"
    size = (folder / shard).stat().st_size
    hub.throttle(shard, 40_000)
    hub.reset_stats()
    out = tmp_path / "out"
    part = out / ".colitools-download" / (shard + ".part")
    proc = _start("org/tiny", out, {})
    _wait_for(proc, lambda: part.exists() and part.stat().st_size > 20_000)
    _kill(proc)
    have = part.stat().st_size
    assert 0 < have < size
    hub.throttle(shard, None)
    _rerun("org/tiny", out)
    assert snapshot(out) == ref and listing(out) == listing(tmp_path / "ref")
    ranges = hub.stats(shard).ranges
    # the rerun resumed the part with a Range request
    assert (have, size) in [tuple(r) for r in ranges], ranges
