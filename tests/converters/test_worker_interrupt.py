"""Ctrl-C while ``convert --workers 2`` starts its workers (issue 24 item 9): the terminal sends SIGINT to the
whole process group, workers still importing included. The workers ignore it (they start with SIGINT blocked,
then ignore it); the parent stops, keeps what the workers finish and prints its one line. Real processes, a
real SIGINT to the process group, a real rerun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tinyckpt import Tiny, make_checkpoint

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "colitools"))
from cli_helpers import COMMAND, cli_env, run_cli  # noqa: E402

SPEC = Tiny(layers=3, experts=4, hidden=128, inter=64, shards=3)
INTERRUPTED = "colitools: interrupted; rerun the same command to resume (finished units are kept)"


def _children(pid: int) -> dict[int, str]:
    """pid -> command line of the processes whose parent is ``pid``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(") ", 1)[1].split()[1]) == pid:
            found[int(entry)] = cmdline
    return found


def _group_alive(pgid: int) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.getpgid(int(entry)) == pgid:
                alive.append(int(entry))
        except OSError:
            continue
    return alive


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("workers") / "src"
    make_checkpoint(src, SPEC)
    return src


@pytest.fixture(scope="module")
def uninterrupted(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "out"
    assert run_cli("convert", source, out, "--min-free-gb", "0", "--no-progress").returncode == 0
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("after", [0.0, 0.05, 0.2])  # seconds after the first worker process appears
def test_ctrl_c_while_workers_start_prints_one_line_and_a_rerun_gives_the_same_output(
    source, uninterrupted, tmp_path, after
):
    out = tmp_path / "out"
    args = ["convert", str(source), str(out), "--min-free-gb", "0", "--no-progress", "--workers", "2"]
    env = cli_env({"COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "0.02"})  # it outlasts the workers' start
    proc = subprocess.Popen([*COMMAND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not any("spawn_main" in cmd for cmd in _children(proc.pid).values()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no worker was ever started"
        time.sleep(0.002)
    time.sleep(after)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.splitlines() == [INTERRUPTED]  # no worker traceback, no KeyboardInterrupt
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid):  # the workers end with their parent
        assert time.monotonic() < deadline, _group_alive(proc.pid)
        time.sleep(0.05)
    done = run_cli(*args[:-2])
    assert done.returncode == 0, done.stderr
    for shard in sorted(uninterrupted.glob("model-*.safetensors")):
        assert (out / shard.name).read_bytes() == shard.read_bytes(), shard.name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sigkill_with_workers_leaves_no_leaked_semaphore_noise_and_a_rerun_gives_the_same_output(
    source, uninterrupted, tmp_path
):
    """SIGKILL of ``convert --workers 2`` while its workers run (issue 43 item 7): the workers die with it (a
    parent-death signal), multiprocessing's resource tracker unlinks their semaphores without a word (it printed
    "There appear to be N leaked semaphore objects" on the terminal), and a rerun finishes the same output."""
    out = tmp_path / "out"
    args = ["convert", str(source), str(out), "--min-free-gb", "0", "--no-progress", "--workers", "2"]
    env = cli_env({"COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "0.02"})
    proc = subprocess.Popen([*COMMAND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120  # a hang guard; nothing here measures time
    while sum("spawn_main" in cmd for cmd in _children(proc.pid).values()) < 2:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the workers were never started"
        time.sleep(0.005)
    time.sleep(0.3)  # the workers are converting units
    proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)  # to EOF: every process holding the pipe (tracker, workers) ended
    assert proc.returncode == -signal.SIGKILL
    assert "leaked" not in stderr and "resource_tracker" not in stderr, stderr
    done = run_cli("convert", source, out, "--min-free-gb", "0", "--no-progress")
    assert done.returncode == 0, done.stderr
    for name in ("model.safetensors.index.json", *(p.name for p in uninterrupted.glob("*.safetensors"))):
        assert (out / name).read_bytes() == (uninterrupted / name).read_bytes(), name
