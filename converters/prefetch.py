"""Download ahead (issue 42): a Hub conversion's shards download on a background thread while units convert.

``ShardPrefetch`` walks the pending units' shards in the order the units first need them, each downloaded with
``--download-streams`` Range streams (``HubSource.ensure_local``: resumable, sha256-checked) on a thread of its
own. The runner asks ``paths(index, unit)`` for a unit's shards and waits only for those not downloaded yet.

* Overlap: a file starts in the tail of the one before (``IN_FLIGHT``, ``_beside_flying``): once that one's
  streams have asked for its last chunk (``on_last_chunk``), and only when the room above the floor holds both
  whole; else after it. One file at a time left the link idle while a file's last streams ended, its sha256
  was finished and it was published, and while the next file's streams connected: ~0.1 s per file at 200 MB/s
  (bench/README.md, ``download_ahead.py``).

* The disk floor: a shard needed by the unit the runner is preparing (or one in flight) downloads at once,
  under the floor's own check as before (``--on-low-disk wait|stop``). A shard needed *later* (ahead) starts
  only when the output volume keeps ``--min-free-gb`` free after its bytes and after the outputs of every unit
  up to the one that reads it (``reserve``): held-ahead shards never take the room a unit's output needs. When
  there is no such room the thread waits until the runner moves on or space appears. ``peak_disk`` is the
  same rule as a plan figure (``--dry-run``'s peak disk counts the shards held ahead).
* Release: shards no pending unit needs are deleted by the runner as before; the thread never downloads one
  (it walks the pending units' shards only).
* Errors: the walk stops at its first error (a download in flight beside it ends); the runner raises it (the
  same one line) when a unit needs a shard neither delivered nor in flight, i.e. at the unit that needs the
  failed shard; the units before it convert and are recorded. A stop of the runner (an error, Ctrl-C) cancels
  the downloads in flight at their next write (``_Cancelled`` from the progress hook): their ``.part`` and range
  log stay for the rerun, nothing is fetched twice.
* The small files the output copies (tokenizer, generation config) come last, in the last shard's tail;
  the runner waits for them (``wait_all``) before it writes the output's files.

Local folders and offline Hub sources (``HF_HUB_OFFLINE``) have nothing to download: no thread, the runner reads
them as before. Online, a shard already in the Hugging Face cache is checked (hashed) by the thread in its turn,
ahead of its unit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colitools.converters.diskfloor import DiskFloor
from colitools.converters.output import copied_files
from colitools.converters.planner import ConversionPlan, Unit, outputs_at
from colitools.converters.sources import Source

if TYPE_CHECKING:
    from colitools.converters.options import ConvertOptions

BAR_BYTES = 1 << 20  # files this large or larger get a progress bar
POLL_SECONDS = 0.25  # how often a held-back shard looks at the free space again (and a waiter at the thread)
IN_FLIGHT = 2  # files downloading at once: the next one starts in the tail of the one before (_beside_flying)


class _Cancelled(BaseException):
    """The runner stopped: each download in flight ends at its next write (not an error of anyone's)."""


class _CancellableProgress:
    """A download's progress bar that raises ``_Cancelled`` once the prefetch is closed."""

    def __init__(self, bar: Any, stopping: threading.Event):
        self.bar, self.stopping = bar, stopping

    def update(self, n: int | float = 1) -> None:
        if self.stopping.is_set():
            raise _Cancelled
        if self.bar is not None:
            self.bar.update(n)


def download_order(units: Sequence[Unit]) -> list[tuple[str, int]]:
    """Every shard the units read, with the index of the first unit that reads it, in that order."""
    first: dict[str, int] = {}
    for i, unit in enumerate(units):
        for shard in unit.shards:
            first.setdefault(shard, i)
    return list(first.items())


class ShardPrefetch:
    """The pending units' shards, downloaded in need order on one background thread (module docstring)."""

    def __init__(self, src: Source, pending: Sequence[Unit], floor: DiskFloor, workers: int,
                 bar: Callable[[int, str], Any]) -> None:  # fmt: skip
        self.src, self.floor, self.workers, self.bar = src, floor, max(workers, 1), bar
        self.out_bytes = [u.out_bytes for u in pending]
        self.index = {u.key: i for i, u in enumerate(pending)}
        # the files copied to the output (tokenizer, generation config) last, while the last unit converts
        last = len(pending) - 1
        self.order = download_order(pending) + [(name, last) for name in copied_files(list(src.files()))]
        self.sizes = {name: f.size for name, f in src.files().items()}
        self.current = 0  # the unit the runner prepares (or converts) now
        self.ready: dict[str, Path] = {}
        self.error: BaseException | None = None
        self.flying: dict[str, bool] = {}  # the files downloading: has each asked for its last chunk
        self.downloads: list[threading.Thread] = []
        self.done = False
        self.stopping = threading.Event()
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="download-ahead", daemon=True)

    def start(self) -> ShardPrefetch:
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop: a shard held back stays undownloaded, those in flight end at their next write."""
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
        # a download ends within one write; a floor wait (``--on-low-disk wait``) or a stalled read may take
        # longer: the thread is a daemon, and what it leaves on disk is a resumable part
        self.thread.join(timeout=5.0)

    def paths(self, unit: Unit) -> dict[str, Path]:
        """``unit``'s shards on disk (the runner prepares it: the shards of the units up to it may now download
        whatever the room); raises the background download's error when one of them could not be had."""
        with self.cond:
            self.current = max(self.current, self.index[unit.key])
            self.cond.notify_all()
            while True:
                if all(s in self.ready for s in unit.shards):
                    return {s: self.ready[s] for s in unit.shards}
                if self.error is not None and not any(s in self.flying for s in unit.shards):
                    raise self.error
                if self.done:  # pragma: no cover - a shard outside the walk would be a bug
                    raise RuntimeError(f"internal: shard of unit {unit.key} not downloaded")
                self.cond.wait(POLL_SECONDS)

    def wait_all(self) -> None:
        """Return once every file is downloaded (the runner, before it copies files to the output); raises the
        background download's error."""
        with self.cond:
            while not self.done:
                self.cond.wait(POLL_SECONDS)
            if self.error is not None:
                raise self.error

    def reserve(self, first: int) -> int:
        """Output bytes still to come of the units in flight and of every unit up to ``first``."""
        return sum(self.out_bytes[max(self.current - self.workers, 0) : first + 1])

    def _turn(self, shard: str, first: int) -> bool:
        """Wait until ``shard`` may download: needed now, or room for it above the floor (False: stopping)."""
        with self.cond:
            while not self.stopping.is_set():
                if first <= self.current:  # the runner needs it now
                    return True
                if self.floor.has_room(self.sizes[shard] + self.reserve(first)):
                    return True
                self.cond.wait(POLL_SECONDS)
        return False

    def _run(self) -> None:
        try:
            for shard, first in self.order:
                if not self._turn(shard, first) or not self._beside_flying(shard, first):
                    return
                path = self.src.local_copy(shard)  # downloaded by an earlier run, or the HF cache
                if path is None:
                    self._start(shard)
                else:
                    self._finish(shard, path)
        except BaseException as exc:  # noqa: BLE001 - raised in the runner's thread, where the unit needs it
            self._finish(None, None, exc)
        finally:
            for thread in list(self.downloads):
                thread.join()
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def _beside_flying(self, shard: str, first: int) -> bool:
        """Wait until ``shard`` may start beside the downloads in flight: none, or one whose streams have asked
        for its every chunk (they are ending: the link would idle in the file's tail and its publication) while
        the room above the floor holds both files whole. False: stopping, or a download failed."""
        with self.cond:
            while not self.stopping.is_set() and self.error is None:
                if not self.flying:
                    return True
                both = self.sizes[shard] + sum(self.sizes[s] for s in self.flying) + self.reserve(first)
                if len(self.flying) < IN_FLIGHT and all(self.flying.values()) and self.floor.has_room(both):
                    return True
                self.cond.wait(POLL_SECONDS)
        return False

    def _start(self, shard: str) -> None:
        self.floor.downloading = shard
        with self.cond:
            self.flying[shard] = False  # True once its last chunk is asked for
        thread = threading.Thread(target=self._fetch, args=(shard,), name=f"download-ahead-{shard}", daemon=True)
        self.downloads.append(thread)
        thread.start()

    def _fetch(self, shard: str) -> None:
        """One file's download (a thread of its own, so that the next file may start in its tail)."""
        def last_chunk() -> None:
            with self.cond:
                self.flying[shard] = True
                self.cond.notify_all()

        size = self.sizes[shard]  # a small file (tokenizer, generation config) gets no bar
        try:
            with self.bar(size, f"download {shard}") if size >= BAR_BYTES else nullcontext() as bar:
                progress = _CancellableProgress(bar, self.stopping)
                self._finish(shard, self.src.ensure_local(shard, progress=progress, on_last_chunk=last_chunk))
        except _Cancelled:
            self._finish(shard, None)
        except BaseException as exc:  # noqa: BLE001 - raised in the runner's thread, where the unit needs it
            self._finish(shard, None, exc)

    def _finish(self, shard: str | None, path: Path | None, error: BaseException | None = None) -> None:
        """``shard`` delivered at ``path`` (None: not delivered), or the first ``error``: the walk stops."""
        with self.cond:
            self.flying.pop(shard, None)
            if path is not None:
                self.ready[shard] = path
            if error is not None and self.error is None:
                self.error = error
            self.cond.notify_all()


class NoPrefetch:
    """What the runner holds when there is nothing to download ahead: it reads every shard itself."""

    def paths(self, unit: Unit) -> dict[str, Path]:
        return {}

    def wait_all(self) -> None:
        pass

    def close(self) -> None:
        pass


def start_prefetch(src: Source, pending: Sequence[Unit], floor: DiskFloor, workers: int,
                   bar: Callable[[int, str], Any]) -> ShardPrefetch | NoPrefetch:  # fmt: skip
    """The download ahead of a Hub source's shards, started (``NoPrefetch`` for a local folder or an offline Hub
    source, ``HF_HUB_OFFLINE``: nothing to download; the runner reads them, and checks the Hugging Face cache
    ahead, as before)."""
    if not src.is_remote or getattr(src, "offline", False):
        return NoPrefetch()
    return ShardPrefetch(src, pending, floor, workers, bar).start()


def peak_disk_ahead(plan: ConversionPlan, transient: Sequence[str], kept: Sequence[str], options: ConvertOptions,
                    out: Path) -> int:  # fmt: skip
    """The peak disk of converting ``plan``'s units into ``out`` (``--dry-run``, the summary): with downloaded
    shards, those held ahead within the room above ``--min-free-gb`` now (``peak_disk``)."""
    if not transient and not kept:
        return plan.peak_disk(transient, kept, options.workers, options.stream_upload)
    room = DiskFloor(out, options.min_free_bytes, options.on_low_disk).room()
    return peak_disk(plan, transient, kept, options.workers, room, options.stream_upload)


def peak_disk(plan: ConversionPlan, transient: Iterable[str], kept: Iterable[str], workers: int,
              room: int, streamed: bool = False) -> int:  # fmt: skip
    """``plan.peak_disk`` with the shards a download ahead holds: before each unit, the shards of the units in
    flight, then the next shards in need order while each fits in ``room`` (the free bytes above the floor)
    with its bytes and the outputs of the units up to its own (``ShardPrefetch._turn``'s rule)."""
    units, sizes = plan.units, plan.inventory.shard_sizes
    transient, kept = set(transient), set(kept)
    last = {s: i for i, u in enumerate(units) for s in u.shards}
    order = [(s, j) for s, j in download_order(units) if s in transient or s in kept]
    workers = max(workers, 1)
    peak, done, held = 0, 0, 0
    for i in range(len(units)):
        window = min(i + workers, len(units)) - 1
        out_now = outputs_at(units, i, window, done, workers, streamed)  # streamed: --stream-upload
        while held < len(order) and order[held][1] <= window:
            held += 1

        def used(upto: int, i: int = i, out_now: int = out_now) -> int:
            return out_now + sum(sizes.get(s, 0) for s, _ in order[:upto] if s in kept or last[s] >= i)

        while held < len(order):
            shard, first = order[held]
            later = sum(u.out_bytes for u in units[window + 1 : first + 1])
            if used(held) + sizes.get(shard, 0) + later > room:
                break
            held += 1
        peak = max(peak, used(held))
        done += units[i].out_bytes
    return peak
