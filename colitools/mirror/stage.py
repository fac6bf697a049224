"""``mirror stage``: copy the planned shards to the mirror, verified, atomic and resumable (docs/CLI.md "mirror" (stage)).

Order of work: recompute the plan and refuse (nothing copied) without usage history, without a selection or
when copying would leave less than the reserve free; take the mirror's lock and remove temporary files a killed
stage left behind; hash each source whose target already has the right size and keep targets whose sha256
matches; check the reserve again with the exact bytes to copy; write the plan (``.colibri-mirror-plan.json``);
copy the rest (``fileops.copy_verified``, two or more files at once), enforcing the reserve during the copy;
write the receipt ``.colibri-mirror.json`` atomically; verify. Files of the mirror the plan did not select are
never touched, except that shards of the model a mirror holds but the plan no longer selects (``unselected``:
the engine would still read them) are listed, and removed with ``prune``.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

from tqdm import tqdm

from colitools.formats.atomic import parse_temp_name, write_json_atomic
from colitools.formats.container import shard_name_problem
from colitools.formats.errors import MirrorError, MirrorReserveStop
from colitools.formats.lockfile import held_lock
from colitools.mirror.fileops import TEMP_SUFFIX, copy_verified, sha256_file, temp_path_for
from colitools.mirror.plan import (
    DEFAULT_RESERVE_GIB,
    GIB,
    PLAN_FILE,
    REASON_NO_USAGE,
    REASON_NOTHING_FITS,
    REASON_RESERVE,
    SCHEMA,
    MirrorPlan,
    PlannedFile,
    plan_mirror,
)
from colitools.mirror.verify import RECEIPT, MirrorVerification, StatSignature, stat_signature, verify_mirror

__all__ = ["LOCK_FILE", "MirrorReserveStop", "StageResult", "StagedFile", "stage_mirror"]

LOCK_FILE = ".colibri-mirror.lock"
MAX_WORKERS = 4  # concurrent copies at most (each is one thread: read -> sha256 -> write, then re-hash)


@dataclass(frozen=True)
class StagedFile:
    """A planned shard after staging: its sha256 and whether it was copied or an existing copy was kept."""

    file: PlannedFile
    sha256: str
    action: str  # "copied" or "kept"

    def receipt_entry(self) -> dict:
        return {**self.file.to_json(), "sha256": self.sha256}


@dataclass
class StageResult:
    """What ``stage_mirror`` did. ``staged`` is False when it refused (``reason`` says why, nothing copied)."""

    plan: MirrorPlan
    staged: bool = False
    reason: str | None = None
    files: list[StagedFile] = field(default_factory=list)
    receipt: Path | None = None
    verification: MirrorVerification | None = None
    # shards of the model on the mirror that the plan does not select (the engine reads them all the same);
    # ``pruned``: those of them removed (``prune``)
    unselected: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    # phase -> (wall seconds, CPU seconds of the whole process): plan, check (hashing kept targets), copy,
    # receipt, verify. For benchmarks; not part of the JSON.
    timings: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.staged and self.verification is not None and self.verification.ready

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "staged": self.staged,
            "reason": self.reason,
            "ready": self.ready,
            "receipt": str(self.receipt) if self.receipt else None,
            "copied": [f.file.name for f in self.files if f.action == "copied"],
            "kept": [f.file.name for f in self.files if f.action == "kept"],
            "copied_bytes": sum(f.file.size for f in self.files if f.action == "copied"),
            "unselected": list(self.unselected),
            "pruned": list(self.pruned),
            "plan": self.plan.to_json(),
            "verify": self.verification.to_json() if self.verification else None,
        }


def _mirror_lock(mirror: Path) -> AbstractContextManager[None]:
    """One stage per mirror (``lockfile.held_lock``): a second one fails at once; the lock file is removed when
    the stage ends (done, failed or stopped cleanly), a SIGKILL leaves it for the next stage to take."""
    return held_lock(
        mirror / LOCK_FILE,
        lambda: MirrorError(f"another stage is running on {mirror} (lock {LOCK_FILE} is held)"),
    )


def _remove_stale_temporaries(mirror: Path) -> None:
    """Temporary files of a killed stage (only ours: hidden, with our suffixes). Called under the lock."""
    for path in mirror.iterdir():
        name = path.name
        temp = parse_temp_name(name)
        ours = (name.startswith(".") and name.endswith(".safetensors" + TEMP_SUFFIX)) or (
            temp is not None and (temp.is_temp_of(RECEIPT) or temp.is_temp_of(PLAN_FILE))
        )
        if ours and path.is_file() and not path.is_symlink():
            path.unlink()


def _progress_bar(total: int, desc: str, progress: bool | None) -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        leave=False,
        disable=None if progress is None else not progress,
        dynamic_ncols=True,
    )


def stage_mirror(
    model: str | os.PathLike,
    mirror: str | os.PathLike,
    *,
    budget_bytes: int,
    reserve_bytes: int = DEFAULT_RESERVE_GIB * GIB,
    usage: str | os.PathLike | None = None,
    source_dirs: Sequence[str | os.PathLike] = (),
    disk_weights: Sequence[float | int | Fraction] | None = None,
    probe: bool = False,
    progress: bool | None = None,
    reread_from_device: bool = False,
    workers: int | None = None,
    prune: bool = False,
) -> StageResult:
    """Plan, then copy the chosen shards to ``mirror`` (see the module docstring), write the receipt, verify.

    Returns a refused ``StageResult`` (``staged`` False) when the plan is not admitted. Raises
    ``MirrorReserveStop`` (exit code 2) if free space falls below the reserve during the copy, ``MirrorError``
    on bad input. Safe to rerun after an interruption at any point. ``progress``: tqdm bars on stderr (None:
    only on a terminal). ``reread_from_device``: re-hash each copy from the mirror device instead of through
    the page cache (stronger, slower: see ``fileops``). ``workers``: files copied at once (default: the usable
    CPUs, at most 4; each copy is CPU-bound by sha256). ``prune``: remove ``StageResult.unselected``.
    """
    clock = _PhaseClock()
    plan = plan_mirror(model, mirror, budget_bytes=budget_bytes, reserve_bytes=reserve_bytes, usage=usage,
                       source_dirs=source_dirs, disk_weights=disk_weights, probe=probe)  # fmt: skip
    result = StageResult(plan, timings=clock.times)
    clock.lap("plan")
    workers = workers if workers is not None else _default_workers()
    if workers < 1:
        raise MirrorError(f"workers must be >= 1, got {workers}")
    if plan.reason in (REASON_NO_USAGE, REASON_NOTHING_FITS, REASON_RESERVE):
        result.reason = plan.reason
        return result
    root = plan.mirror_root
    root.mkdir(parents=True, exist_ok=True)
    trusted: dict[str, tuple[StatSignature, str]] = {}

    with _mirror_lock(root):
        _remove_stale_temporaries(root)
        kept = _kept_targets(plan, root, trusted, progress, workers)
        clock.lap("check")
        to_copy = [f for f in plan.files if f.name not in kept]
        to_copy_bytes = sum(f.size for f in to_copy)
        free = shutil.disk_usage(root).free
        plan.free_bytes, plan.remaining_copy_bytes = free, to_copy_bytes
        if free - to_copy_bytes < plan.reserve_bytes:
            plan.reason = result.reason = REASON_RESERVE
            return result
        _write_on_mirror(root / PLAN_FILE, plan.to_json(), root, to_copy_bytes)

        copied = _copy_all(to_copy, root, plan.reserve_bytes, trusted, progress,
                           reread_from_device=reread_from_device, workers=workers)  # fmt: skip
        clock.lap("copy")

        result.files = [
            StagedFile(f, kept[f.name], "kept") if f.name in kept else StagedFile(f, copied[f.name], "copied")
            for f in plan.files
        ]
        result.receipt, result.staged = _write_receipt(plan, root, result.files), True
        result.unselected = _unselected(plan, root)
        result.pruned = _prune(root, result.unselected) if prune else []
        clock.lap("receipt")

    with _progress_bar(2 * plan.selected_bytes, "verifying", progress) as bar:
        result.verification = verify_mirror(root, plan.model_root, source_dirs=plan.source_dirs[1:],
                                            progress=bar.update, trusted_digests=trusted)  # fmt: skip
    clock.lap("verify")
    return result


def _kept_targets(
    plan: MirrorPlan,
    root: Path,
    trusted: dict[str, tuple[StatSignature, str]],
    progress: bool | None,
    workers: int,
) -> dict[str, str]:
    """Planned files whose target on the mirror already has the source's sha256 (name -> sha256): the targets
    of the right size are hashed, with their sources, ``workers`` files at once."""
    kept: dict[str, str] = {}
    to_check = [f for f in plan.files if _same_size_file(root / f.name, f.size)]
    jobs = [job for f in to_check for job in ((f.source, False), (root / f.name, True))]
    with (
        _progress_bar(2 * sum(f.size for f in to_check), "hashing", progress) as bar,
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="colitools-hash") as pool,
    ):
        update = _locked(bar.update)
        digests = list(
            pool.map(lambda job: _hash_recording(job[0], trusted, update, from_device=job[1]), jobs)
        )
    for f, source_sha, target_sha in zip(to_check, digests[0::2], digests[1::2], strict=True):
        if source_sha == target_sha:
            kept[f.name] = source_sha
    return kept


def _unselected(plan: MirrorPlan, root: Path) -> list[str]:
    """Shards of the model the mirror holds (a file, a symlink, anything by that name) that the plan does not
    select: an earlier, larger selection's copies, which the engine reads when their header matches."""
    chosen = {f.name for f in plan.files}
    return sorted(
        s.name
        for s in plan.shards
        if s.name not in chosen and shard_name_problem(s.name) is None and os.path.lexists(root / s.name)
    )


def _prune(root: Path, names: list[str]) -> list[str]:
    """Remove ``names`` from the mirror (regular files and symlinks only; never a directory)."""
    removed = []
    for name in names:
        path = root / name
        if path.is_symlink() or path.is_file():
            path.unlink()
            removed.append(name)
    return removed


def _write_receipt(plan: MirrorPlan, root: Path, files: list[StagedFile]) -> Path:
    """Write the receipt (``_receipt``) on the mirror, atomically; returns its path."""
    receipt = _receipt(plan, root, files)
    _write_on_mirror(root / RECEIPT, receipt, root, len(json.dumps(receipt)))
    return root / RECEIPT


def _receipt(plan: MirrorPlan, root: Path, files: list[StagedFile]) -> dict:
    """The receipt ``.colibri-mirror.json`` of a finished stage (schema ``SCHEMA``)."""
    return {
        "schema": SCHEMA,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "model_root": str(plan.model_root),
        "source_dirs": [str(d) for d in plan.source_dirs],
        "mirror_root": str(root),
        "usage_file": str(plan.usage_file),
        "budget_bytes": plan.budget_bytes,
        "reserve_bytes": plan.reserve_bytes,
        "files": [f.receipt_entry() for f in files],
    }


def _write_on_mirror(path: Path, obj: dict, root: Path, need: int) -> None:
    """``write_json_atomic`` on the mirror drive; a full drive is ``_out_of_space`` (``need`` bytes to write)."""
    try:
        write_json_atomic(path, obj)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise _out_of_space(path, root, need) from None


class _PhaseClock:
    def __init__(self) -> None:
        self.times: dict[str, tuple[float, float]] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self, name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.times[name] = (wall - self._wall, cpu - self._cpu)
        self._wall, self._cpu = wall, cpu


def _default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


def _locked(update: Callable[[int], object]) -> Callable[[int], None]:
    lock = threading.Lock()

    def locked(n: int) -> None:  # tqdm is called from several threads
        with lock:
            update(n)

    return locked


def _on_drive(target: Path, reported: int) -> int:
    """Bytes of a copy in flight that already occupy the drive: what it reported, or more when its temporary
    file (or, once renamed, the target) is already larger."""
    sizes = [reported]
    for path in (temp_path_for(target), target):
        try:
            sizes.append(os.stat(path).st_size)
        except OSError:
            pass
    return max(sizes)


class _Cancelled(Exception):
    """Raised in a copy when another one failed: stop early, the other copy's error is the one reported."""


def _copy_all(
    to_copy: list[PlannedFile],
    root: Path,
    reserve: int,
    trusted: dict[str, tuple[StatSignature, str]],
    progress: bool | None,
    *,
    reread_from_device: bool,
    workers: int,
) -> dict[str, str]:
    """Copy the files, ``workers`` at once, each one verified and published on its own (``copy_verified``).

    Copies are CPU-bound (two sha256 passes), so two copies at once use two cores; each file is still renamed
    only after its own fsync and re-hash matched. Returns name -> sha256. The reserve is checked before each
    file and every 256 MiB during a copy, counting the bytes every copy in flight has still to write. After a
    failure no new copy starts, copies in flight stop at their next check, and the first error is raised;
    files already published stay (a rerun keeps them).
    """
    copies = _Copies(root, reserve, trusted, sum(f.size for f in to_copy), reread_from_device)
    with (
        _progress_bar(2 * copies.total, "copying+verifying", progress) as bar,
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="colitools-copy") as pool,
    ):
        copies.advance = _locked(bar.update)
        futures = []
        try:  # submitting too: an interrupt right after the first submit must stop that copy as well
            for f in to_copy:
                futures.append(pool.submit(copies.copy_one, f))
            pending = set(futures)
            while pending:  # timed: a Ctrl-C the kernel delivered to a copy thread is handled here at once
                # (CPython runs signal handlers in the main thread, which an untimed wait keeps asleep)
                _, pending = wait(pending, timeout=0.1)
            for future in futures:
                future.result()
        except BaseException:  # e.g. KeyboardInterrupt here: copies in flight stop at their next check
            copies.stop.set()
            raise
    if copies.errors:
        raise copies.errors[0]
    return copies.copied


class _Copies:
    """The state the copies of one stage share (under ``lock``): bytes written per file, what is published,
    the first errors, and ``stop``, which every copy checks at its next guard."""

    def __init__(self, root: Path, reserve: int, trusted: dict, total: int, reread_from_device: bool):
        self.root, self.reserve, self.trusted, self.total = root, reserve, trusted, total
        self.reread_from_device = reread_from_device
        self.advance: Callable[[int], None] | None = None  # the progress bar, thread-safe
        self.copied: dict[str, str] = {}
        self.written: dict[str, int] = {}  # name -> bytes written so far (the size once published)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def copy_one(self, f: PlannedFile) -> None:
        if self.stop.is_set():
            return
        try:
            before = stat_signature(f.source)
            guard = functools.partial(self.guard, f.name)
            sha = copy_verified(f.source, self.root / f.name, f.size, progress=self.advance, guard=guard,
                                reread_from_device=self.reread_from_device)  # fmt: skip
            with self.lock:
                self.written[f.name] = f.size
                self.copied[f.name] = sha
                if before is not None and before == stat_signature(f.source):
                    self.trusted[str(f.source)] = (before, sha)
                after = stat_signature(self.root / f.name)
                if after is not None:
                    self.trusted[str(self.root / f.name)] = (after, sha)
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                with self.lock:
                    still = self.total - sum(self.written.values())
                exc = _out_of_space(self.root / f.name, self.root, still)
            with self.lock:
                if not isinstance(exc, _Cancelled):
                    self.errors.append(exc)
            self.stop.set()

    def guard(self, name: str, n: int) -> None:
        """Called by a copy every ``guard_every`` bytes: stop when told to, or when the reserve is reached."""
        if self.stop.is_set():
            raise _Cancelled
        with self.lock:
            self.written[name] = n
            # a copy in flight reports its bytes only every guard_every, but they are on the drive
            # already: count them from its temporary (and, just renamed, final) file
            still = self.total - sum(
                size if other in self.copied else _on_drive(self.root / other, size)
                for other, size in self.written.items()
            )
        free = shutil.disk_usage(self.root).free
        if free - still < self.reserve:
            raise MirrorReserveStop(
                f"free space on the mirror drive fell to {free} bytes with {still} still to copy "
                f"(reserve {self.reserve}); stopped, rerun when there is room"
            )


def _out_of_space(target: Path, root: Path, need: int) -> MirrorReserveStop:
    """ENOSPC as one line naming the file and the numbers (as ``convert`` does), and a rerun hint."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = 0
    return MirrorReserveStop(
        f"{target}: no space left on the mirror drive ({need} bytes still to write, {free} bytes free); "
        "free space or lower `budget_bytes`, then rerun (verified copies are kept)"
    )


def _same_size_file(path: Path, size: int) -> bool:
    sig = stat_signature(path)  # regular files only: a symlink or directory is replaced, never trusted
    return sig is not None and sig[2] == size


def _hash_recording(
    path: Path, trusted: dict[str, tuple[StatSignature, str]], update, *, from_device: bool = False
) -> str:
    before = stat_signature(path)
    sha = sha256_file(path, progress=update, from_device=from_device)
    if before is not None and before == stat_signature(path):
        trusted[str(path)] = (before, sha)
    return sha
