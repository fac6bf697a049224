"""A clean stop (Ctrl-C, SIGTERM, SIGHUP, the disk floor) leaves no ``.colitools.lock`` and no temporary of the unit in
flight; a SIGKILL leaves both, and the next run takes them over. Real processes, real signals, real files."""

from __future__ import annotations

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
from colitools.converters.runner import LOCKFILE, convert

SPEC = Tiny(layers=3, experts=4, hidden=128, inter=64, shards=3)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("clean-stop")
    make_checkpoint(root / "src", SPEC)
    convert(str(root / "src"), root / "ref", ConvertOptions(min_free_gb=0))
    return root / "src", root / "ref"


def _command(src: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0", *extra]


def _stopped_mid_unit(
    src: Path, out: Path, signum: int, *extra: str, group: bool = False
) -> subprocess.CompletedProcess[str]:
    """Start a conversion that sleeps after every tensor, send ``signum`` once a unit's temporary exists (to its
    whole process group with ``group``, as a terminal does)."""
    env = {**os.environ, "COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "0.05"}
    proc = subprocess.Popen(
        _command(src, out, *extra), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=group,
    )
    deadline = time.monotonic() + 120  # a hang guard; nothing here measures time
    while not (out.is_dir() and any(".tmp-" in p.name for p in out.iterdir())):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the conversion never started writing a unit"
        time.sleep(0.01)
    assert (out / LOCKFILE).exists()  # held while it works
    (os.killpg if group else os.kill)(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize(
    "signum, code, said",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)"),
     (signal.SIGHUP, 129, "hung up (SIGHUP)")],
    ids=["ctrl-c", "sigterm", "sighup"],
)  # fmt: skip
def test_a_signal_mid_unit_stops_cleanly_leaving_no_lock_and_no_temporary(
    reference, tmp_path, signum, code, said
):
    src, ref = reference
    out = tmp_path / "out"
    stopped = _stopped_mid_unit(src, out, signum)
    assert stopped.returncode == code, stopped.stderr
    assert stopped.stderr.splitlines() == [
        f"colitools: {said}; rerun the same command to resume (finished units are kept)"
    ]
    left = listing(out)
    assert LOCKFILE not in left and not [n for n in left if ".tmp-" in n], left
    done = subprocess.run(_command(src, out), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert snapshot(out) == snapshot(ref) and listing(out) == listing(ref)


def test_a_hangup_of_the_whole_process_group_with_workers_stops_as_cleanly(reference, tmp_path):
    """A closed terminal (an ssh drop) hangs up every process of the group: the workers ignore it (as a Ctrl-C),
    the parent keeps what they finish and stops with its one line."""
    src, ref = reference
    out = tmp_path / "out"
    stopped = _stopped_mid_unit(src, out, signal.SIGHUP, "--workers", "2", group=True)
    assert stopped.returncode == 129, stopped.stderr
    assert stopped.stderr.splitlines() == [
        "colitools: hung up (SIGHUP); rerun the same command to resume (finished units are kept)"
    ]
    left = listing(out)
    assert LOCKFILE not in left and not [n for n in left if ".tmp-" in n], left
    done = subprocess.run(_command(src, out), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert snapshot(out) == snapshot(ref) and listing(out) == listing(ref)


def test_a_sigkill_leaves_the_lock_and_the_temporary_and_the_next_run_takes_them_over(reference, tmp_path):
    src, ref = reference
    out = tmp_path / "out"
    killed = _stopped_mid_unit(src, out, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    left = listing(out)
    assert LOCKFILE in left and [n for n in left if ".tmp-" in n], left
    done = subprocess.run(_command(src, out), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert snapshot(out) == snapshot(ref) and listing(out) == listing(ref)


def test_a_stop_at_the_disk_floor_leaves_no_lock(reference, tmp_path):
    src, ref = reference
    out = tmp_path / "out"
    free = tmp_path / "free"
    free.write_text("1000")  # below any floor of a GB
    env = {**os.environ, "COLITOOLS_FAKE_FREE_BYTES_FILE": str(free)}
    stopped = subprocess.run(
        _command(src, out, "--min-free-gb", "1", "--on-low-disk", "stop"),
        capture_output=True,
        text=True,
        env=env,
    )
    assert stopped.returncode == 3, stopped.stderr
    assert out.is_dir() and LOCKFILE not in listing(out) and not [n for n in listing(out) if ".tmp-" in n]


def test_a_conversion_failing_mid_way_removes_its_lock(tmp_path):
    from colitools.formats.safetensors_io import SafetensorsFile

    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    name = "model.layers.2.mlp.experts.0.up_proj.weight"  # the last layer: earlier units are published first
    shard = next(p for p in sorted(src.glob("*.safetensors")) if name in SafetensorsFile(p).tensors)
    with SafetensorsFile(shard) as f:
        begin = f.tensors[name].begin
    with open(shard, "r+b") as fh:  # one BF16 NaN: int4 experts refuse it when the unit is encoded
        fh.seek(begin)
        fh.write(b"\xc0\x7f")
    result = subprocess.run(_command(src, out), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stderr.startswith("colitools: error: "), result.stderr
    assert name in result.stderr, result.stderr
    left = listing(out)
    assert "colitools.json" in left and LOCKFILE not in left and not [n for n in left if ".tmp-" in n], left
