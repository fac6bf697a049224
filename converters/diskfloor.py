"""The free-space floor of a conversion (``--min-free-gb``, ``--on-low-disk wait|stop``).

Before every unit and every download request the output volume must keep ``min_free`` bytes free *after* the
step's own bytes. When it would not: ``wait`` prints one ``[WAIT]`` line with the numbers and polls until space
appears; ``stop`` raises ``DiskFloorStop`` (exit code 3) with a resume hint. Published units are never lost
either way.

Injection point: tests cannot fill the real disk, so the probe reads the
free byte count from the file named by ``COLITOOLS_FAKE_FREE_BYTES_FILE`` when that variable is set (re-read at
every probe, so a test can change it while the converter waits). ``COLITOOLS_DISK_POLL_SECONDS`` sets the
polling interval (default 10 s).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from colitools.formats.errors import ConvertError, DiskFloorStop, ParameterError

FAKE_FREE_ENV = "COLITOOLS_FAKE_FREE_BYTES_FILE"
POLL_ENV = "COLITOOLS_DISK_POLL_SECONDS"
DEFAULT_POLL_SECONDS = 10.0
MODES = ("wait", "stop")
GB = 1_000_000_000


def free_bytes(path: Path) -> int:
    """Free bytes on the volume of ``path`` (or the injected value, see the module docstring)."""
    fake = os.environ.get(FAKE_FREE_ENV)
    if fake:
        try:
            return int(Path(fake).read_text().strip())
        except (OSError, ValueError) as exc:
            raise ConvertError(f"{FAKE_FREE_ENV}={fake}: cannot read a byte count ({exc})") from None
    return shutil.disk_usage(path).free


def gb(n: int | float) -> str:
    """Bytes for people: GB with two decimals, or MB / kB / B for small numbers."""
    for unit, size in (("GB", GB), ("MB", 1_000_000), ("kB", 1_000)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


class DiskFloor:
    """Checks the floor; ``ensure(needed, what)`` returns when there is room, waiting or stopping per ``mode``."""

    def __init__(
        self,
        path: Path,
        min_free_bytes: int,
        mode: str = "wait",
        *,
        resume_hint: str = "",
        out: TextIO | None = None,
        poll_seconds: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if mode not in MODES:
            raise ParameterError(f"`on_low_disk={mode!r}`: choose wait or stop")
        self.path = Path(path)
        self.min_free = int(min_free_bytes)
        self.mode = mode
        self.resume_hint = resume_hint
        self.out = out if out is not None else sys.stderr
        env_poll = os.environ.get(POLL_ENV)
        self.poll = (
            poll_seconds
            if poll_seconds is not None
            else float(env_poll)
            if env_poll
            else DEFAULT_POLL_SECONDS
        )
        self.sleep = sleep
        self.waits = 0  # [WAIT] episodes, for the summary

    def _probe_path(self) -> Path:
        p = self.path
        while not p.exists() and p.parent != p:
            p = p.parent
        return p

    def room(self) -> int:
        """Free bytes above the floor right now (negative below it)."""
        return free_bytes(self._probe_path()) - self.min_free

    def has_room(self, needed: int) -> bool:
        """Whether ``needed`` bytes fit above the floor right now (no waiting, no output)."""
        return free_bytes(self._probe_path()) >= self.min_free + needed

    def ensure(self, needed: int, what: str) -> None:
        """Return once ``free >= min_free + needed``; else wait (one ``[WAIT]`` line) or raise DiskFloorStop."""
        announced = False
        while True:
            free = free_bytes(self._probe_path())
            if free >= self.min_free + needed:
                if announced:
                    print(f"continuing: {gb(free)} free on {self.path}", file=self.out, flush=True)
                return
            numbers = (
                f"{gb(free)} free on {self.path}, floor {gb(self.min_free)} + {gb(needed)} needed for {what}"
            )
            if self.mode == "stop":
                raise DiskFloorStop(f"low disk: {numbers}; stopped cleanly. {self.resume_hint}".strip())
            if not announced:
                print(f"[WAIT] {numbers}; polling every {self.poll:g}s (Ctrl-C stops; a rerun resumes)",
                      file=self.out, flush=True)  # fmt: skip
                announced = True
                self.waits += 1
            self.sleep(self.poll)

    downloading: str = "a download"

    def download_check(self, needed: int) -> None:
        """The ``disk_check(needed_bytes)`` hook of ``download_file`` (``downloading`` names the file)."""
        self.ensure(int(needed), f"downloading {self.downloading}")
