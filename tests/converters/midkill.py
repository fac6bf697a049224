"""SIGKILL a running conversion while one of its temporary files exists, for the tests that assert a partial
file was left behind.

Seeing a temporary file and then sending SIGKILL is a race: on a loaded machine the converter can finish and
publish that file in between (it did on CI). So the process is frozen first (SIGSTOP stops every thread at
once; Linux, single-process conversions: ``--workers 1``), the condition checked again, and the process killed
frozen, or let go (SIGCONT) until the condition holds next. The same for a kill between units."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from colitools.formats.atomic import parse_temp_name


def temporaries(folder: Path, prefix: str) -> list[str]:
    """Names of the temporaries in ``folder`` (as ``atomic.parse_temp_name`` reads them) of final names that
    start with ``prefix``."""
    try:
        names = [p.name for p in folder.iterdir()]
    except FileNotFoundError:
        return []
    return [n for n in names if (t := parse_temp_name(n)) is not None and t.stem.startswith(prefix)]


def _until_stopped(pid: int) -> None:
    """SIGSTOP is delivered asynchronously: wait until /proc says the process is stopped (state T)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + 30
    while (state := stat.read_text().rsplit(")", 1)[1].split()[0]) not in ("T", "t"):
        assert state != "Z", "the converter exited before it could be stopped"
        assert time.monotonic() < deadline, "the converter did not stop on SIGSTOP"
        time.sleep(0.001)


def sigkill_when(proc: subprocess.Popen, holds: Callable[[], bool], timeout: float = 120.0) -> None:
    """SIGKILL ``proc`` at a moment ``holds()`` is true: checked once it seems so, again with the process frozen.
    Fails the calling test if the process exits first."""
    deadline = time.monotonic() + timeout  # a hang guard; nothing here measures time
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                said = proc.stderr.read() if proc.stderr else ""
                raise AssertionError(
                    f"the converter exited ({proc.returncode}) before the kill point: {said!r}"
                )
            if holds():
                proc.send_signal(signal.SIGSTOP)
                _until_stopped(proc.pid)
                if holds():
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(30)
                    assert proc.returncode == -signal.SIGKILL, proc.returncode
                    return
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.005)
        raise AssertionError(f"the kill point was not reached within {timeout:.0f} s")
    finally:
        if proc.poll() is None:  # never leave a frozen or running converter behind a failed test
            proc.kill()
            proc.wait(30)


def sigkill_mid_file(
    proc: subprocess.Popen, folder: Path, prefix: str, ready: Callable[[], bool] = lambda: True
) -> list[str]:
    """SIGKILL ``proc`` at a moment ``ready()`` holds and ``folder`` holds a temporary of a file whose name
    starts with ``prefix`` (not, say, the ledger's); return the temporaries left behind."""
    sigkill_when(proc, lambda: ready() and bool(temporaries(folder, prefix)))
    return temporaries(folder, prefix)
