"""The free-space floor: ``--on-low-disk wait`` prints one [WAIT] line and continues when space appears;
``stop`` exits cleanly (code 3) with a resume hint, and a rerun finishes byte-identical.

The real disk cannot be filled in a test, so the free-space probe reads the injection point
``COLITOOLS_FAKE_FREE_BYTES_FILE`` (a file holding the free byte count, re-read at every probe);
``COLITOOLS_DISK_POLL_SECONDS`` shortens the polling interval."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from convcheck import listing, snapshot
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.diskfloor import DiskFloor, free_bytes
from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import DiskFloorStop

GB = 1_000_000_000


def _set(free, text: str) -> None:
    """Change the injected free-byte count atomically: the converter re-reads the file while it polls."""
    tmp = free.with_name(free.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, free)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    make_checkpoint(tmp_path / "src", Tiny(layers=2, experts=2, hidden=128, inter=64, shards=2))
    convert(str(tmp_path / "src"), tmp_path / "ref", ConvertOptions(min_free_gb=0))
    free = tmp_path / "free"
    _set(free, str(100 * GB))
    monkeypatch.setenv("COLITOOLS_FAKE_FREE_BYTES_FILE", str(free))
    monkeypatch.setenv("COLITOOLS_DISK_POLL_SECONDS", "0.05")
    return tmp_path, free


def test_probe_reads_the_injection_point(setup):
    tmp_path, free = setup
    _set(free, "12345\n")
    assert free_bytes(tmp_path) == 12345


def test_wait_prints_one_line_then_continues(setup):
    tmp_path, free = setup
    _set(free, str(GB // 2))  # below the 1 GB floor
    cmd = [sys.executable, "-m", "colitools", "convert", str(tmp_path / "src"), str(tmp_path / "out"),
           "--min-free-gb", "1", "--on-low-disk", "wait"]  # fmt: skip
    log = tmp_path / "stderr"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=os.environ.copy())
        deadline = time.monotonic() + 60
        while "[WAIT]" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.3)  # several polls happen while waiting ...
        assert proc.poll() is None
        _set(free, str(2 * GB))  # ... space appears
        assert proc.wait(60) == 0
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("[WAIT]")]
    assert len(lines) == 1, text  # one [WAIT] line with the numbers, however many polls
    assert (
        "500.00 MB free" in lines[0] and "floor 1.00 GB" in lines[0] and "needed for unit globals" in lines[0]
    )
    assert "continuing: 2.00 GB free" in text
    assert snapshot(tmp_path / "out") == snapshot(tmp_path / "ref")


def test_stop_then_resume(setup):
    tmp_path, free = setup
    plan = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dry_run=True, min_free_gb=1))
    first = plan.plan["units"][0]["out_bytes"]
    _set(free, str(GB + first))  # enough for the first unit only
    cmd = [sys.executable, "-m", "colitools", "convert", str(tmp_path / "src"), str(tmp_path / "out"),
           "--min-free-gb", "1", "--on-low-disk", "stop"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    message = done.stderr.strip().splitlines()
    assert len(message) == 1 and message[0].startswith("colitools: error: low disk: ")
    assert "needed for unit model.layers.0" in message[0] and "to resume" in message[0]
    assert (tmp_path / "out/model-00001-of-00003.safetensors").exists()
    assert not (tmp_path / "out/model-00002-of-00003.safetensors").exists()
    _set(free, str(100 * GB))
    again = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(min_free_gb=1))
    assert (again.units_skipped, again.units_converted) == (1, 2)
    assert snapshot(tmp_path / "out") == snapshot(tmp_path / "ref")
    assert listing(tmp_path / "out") == listing(tmp_path / "ref")


def test_floor_object_waits_and_stops(tmp_path, setup):
    _, free = setup
    _set(free, "100")
    out = open(tmp_path / "log", "w+")
    naps = []

    def nap(seconds):
        naps.append(seconds)
        if len(naps) == 3:
            _set(free, "1000")

    floor = DiskFloor(tmp_path, 500, "wait", out=out, poll_seconds=7, sleep=nap)
    floor.ensure(400, "unit x")
    assert naps == [7, 7, 7] and floor.waits == 1
    out.seek(0)
    assert out.read().count("[WAIT] 100 B free") == 1
    with pytest.raises(
        DiskFloorStop, match="floor 500 B \\+ 600 B needed for unit y; stopped cleanly. rerun"
    ):
        DiskFloor(tmp_path, 500, "stop", resume_hint="rerun").ensure(600, "unit y")


def test_floor_applies_before_a_download(setup, hub):
    tmp_path, free = setup
    hub.add_repo("org/tiny", {"main": tmp_path / "src"})
    plan = convert("org/tiny", tmp_path / "hf", ConvertOptions(dry_run=True, min_free_gb=1))
    _set(free, str(GB + plan.plan["units"][0]["out_bytes"]))  # the unit fits, its 100+ kB shard does not
    with pytest.raises(DiskFloorStop, match="needed for downloading model-00001-of-00002.safetensors"):
        convert("org/tiny", tmp_path / "hf", ConvertOptions(min_free_gb=1, on_low_disk="stop"))
    assert not list((tmp_path / "hf").glob("*.safetensors"))
    _set(free, str(100 * GB))
    convert("org/tiny", tmp_path / "hf", ConvertOptions(min_free_gb=1))
    ref, got = snapshot(tmp_path / "ref"), snapshot(tmp_path / "hf")
    for snap in (ref, got):  # the manifest names the source: local folder vs hf repo
        snap.pop("colitools.json without run")
    assert got == ref
