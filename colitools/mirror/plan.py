"""``mirror plan``: choose the shards worth copying to a second drive (docs/CLI.md "mirror" (plan)).

The benefit of a shard is the usage-weighted bytes of the routed experts it would serve from the mirror:
``sum(count(layer, expert) * bytes_of_that_expert_in_the_shard)``, counting an expert only once its routed
tensor (the one the engine assigns drives by) is in this shard or in one already chosen. A greedy knapsack over
whole shards picks, while something with positive benefit fits the remaining budget, the shard with the highest
benefit per byte (exact rationals; ties: larger benefit, smaller size, then name).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from colitools.formats.container import shard_name_problem
from colitools.formats.errors import MirrorError, ParameterError
from colitools.formats.filenames import USAGE_FILE
from colitools.formats.usage import UsageHistory, engine_id, read_usage
from colitools.mirror.probe import ProbeResult, nearest_existing, probe_drives
from colitools.mirror.routing import ReadPrediction, env_disk_weights, predict_reads
from colitools.mirror.scan import ExpertKey, ShardExperts, discover_shards, model_geometry

__all__ = [
    "GIB",
    "PLAN_FILE",
    "SCHEMA",
    "MirrorPlan",
    "PlannedFile",
    "format_bytes",
    "gib_to_bytes",
    "plan_mirror",
    "select_shards",
]

SCHEMA = "colibri.partial-mirror.v1"  # shared with the engine's own mirror tool and its receipts
PLAN_FILE = ".colibri-mirror-plan.json"
GIB = 1 << 30
MAX_BYTES = 1 << 63  # a GiB option's bound (8 EiB: beyond any drive, and int64 in the engines)
DEFAULT_RESERVE_GIB = 10

# `reason` values of a plan that is not admitted
REASON_NO_USAGE = "usage_history_missing"
REASON_NOTHING_FITS = "no_usage_ranked_shards_fit_the_budget"
REASON_RESERVE = "free_space_reserve"


@dataclass(frozen=True)
class PlannedFile:
    """A shard chosen for the mirror, with the benefit it had when chosen."""

    name: str
    source: Path
    size: int
    weighted_expert_bytes: int
    activated_experts: int  # experts whose routed tensor this shard brought onto the mirror

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "size": self.size,
            "weighted_expert_bytes": self.weighted_expert_bytes,
            "activated_experts": self.activated_experts,
        }


def select_shards(
    shards: Sequence[ShardExperts],
    counts: dict[ExpertKey, int],
    budget_bytes: int,
    *,
    room_bytes: int | None = None,
    present: frozenset[str] = frozenset(),
) -> list[PlannedFile]:
    """The greedy knapsack of the mirror plan (docs/CLI.md "mirror") over whole shards, in the order they are chosen.

    ``room_bytes`` (optional) also bounds the bytes still to copy (free space above the reserve); shards named
    in ``present`` are already on the mirror and cost no room.

    Benefits are kept up to date incrementally: when a chosen shard brings an expert's routed tensor onto the
    mirror, every other shard holding bytes of that expert gains ``count * bytes`` from then on.
    """
    holders: dict[ExpertKey, list[int]] = {}
    for i, shard in enumerate(shards):
        for key in shard.expert_bytes:
            holders.setdefault(key, []).append(i)
    active: set[ExpertKey] = set()
    benefit = [
        sum(counts.get(key, 0) * nbytes for key, nbytes in shard.expert_bytes.items() if key in shard.routed)
        for shard in shards
    ]
    remaining = set(range(len(shards)))
    left = budget_bytes
    room = room_bytes
    chosen: list[PlannedFile] = []
    while True:
        best, best_key = None, None
        for i in remaining:
            shard = shards[i]
            if benefit[i] <= 0 or shard.size > left:
                continue
            if room is not None and shard.name not in present and shard.size > room:
                continue
            # highest benefit per byte (exact), then larger benefit, smaller size, name
            key = (-Fraction(benefit[i], shard.size), -benefit[i], shard.size, shard.name)
            if best_key is None or key < best_key:
                best, best_key = i, key
        if best is None:
            return chosen
        shard = shards[best]
        newly = shard.routed - active
        chosen.append(PlannedFile(shard.name, shard.path, shard.size, benefit[best], len(newly)))
        remaining.discard(best)
        left -= shard.size
        if room is not None and shard.name not in present:
            room -= shard.size
        active |= newly
        for key in newly:
            n = counts.get(key, 0)
            if n <= 0:
                continue
            for j in holders[key]:
                if j in remaining and key not in shards[j].routed:
                    benefit[j] += n * shards[j].expert_bytes[key]


@dataclass
class MirrorPlan:
    """Everything ``mirror plan`` decides and reports; ``to_json`` is the schema of the plan output."""

    model_root: Path
    mirror_root: Path
    source_dirs: list[Path]
    usage_file: Path
    usage_history_present: bool
    usage_selections: int
    budget_bytes: int
    reserve_bytes: int
    free_bytes: int
    files: list[PlannedFile]
    remaining_copy_bytes: int
    reason: str | None
    warnings: list[str] = field(default_factory=list)
    prediction: ReadPrediction | None = None
    disk_weights_source: str = "default"
    probes: list[ProbeResult] = field(default_factory=list)
    # the budget the selection actually used: smaller than ``budget_bytes`` when the free space above the
    # reserve could not take the requested budget (the plan then fills what fits)
    effective_budget_bytes: int | None = None
    usage: UsageHistory | None = None
    shards: list[ShardExperts] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        return self.reason is None

    @property
    def selected_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def projected_free_bytes(self) -> int:
        return self.free_bytes - self.remaining_copy_bytes

    def to_json(self) -> dict:
        prediction = self.prediction.to_json() if self.prediction else None
        if prediction is not None:
            prediction["disk_weights_source"] = self.disk_weights_source
            prediction["probes"] = [p.to_json() for p in self.probes]
        return {
            "schema": SCHEMA,
            "model_root": str(self.model_root),
            "source_dirs": [str(p) for p in self.source_dirs],
            "mirror_root": str(self.mirror_root),
            "usage_file": str(self.usage_file),
            "usage_history_present": self.usage_history_present,
            "usage_selections": self.usage_selections,
            "budget_bytes": self.budget_bytes,
            "effective_budget_bytes": self.effective_budget_bytes
            if self.effective_budget_bytes is not None
            else self.budget_bytes,
            "budget_limited_by_free_space": self.effective_budget_bytes is not None,
            "reserve_bytes": self.reserve_bytes,
            "free_bytes": self.free_bytes,
            "selected_bytes": self.selected_bytes,
            "remaining_copy_bytes": self.remaining_copy_bytes,
            "projected_free_bytes": self.projected_free_bytes,
            "admitted": self.admitted,
            "reason": self.reason,
            "warnings": list(self.warnings),
            "files": [f.to_json() for f in self.files],
            "prediction": prediction,
        }


def gib_to_bytes(gib: float | str, parameter: str, *, positive: bool = False) -> int:
    """GiB (as given on the command line) to whole bytes, rounding down; exact for decimal input. ParameterError
    naming ``parameter`` for anything but a number, a negative one, one of 2**63 bytes or more (no drive holds
    that; inf), and with ``positive`` one below a byte."""
    try:
        value = Fraction(str(gib))
    except (ValueError, ZeroDivisionError):
        raise ParameterError(f"`{parameter}`: expected a number of GiB, got {gib!r}") from None
    n = math.floor(value * GIB)
    shown = f"{gib:g}" if isinstance(gib, float) else str(gib).strip()
    if positive and n <= 0:
        raise ParameterError(f"`{parameter}` must be positive (got {shown} GiB)")
    if n < 0:
        raise ParameterError(f"`{parameter}` cannot be negative (got {shown} GiB)")
    if n >= MAX_BYTES:
        raise ParameterError(f"`{parameter}` must be less than {MAX_BYTES // GIB} GiB (got {shown} GiB)")
    return n


def format_bytes(n: int) -> str:
    """Bytes for people, in the largest binary unit that keeps the number >= 1 (a 7.5 MiB shard is
    "7.50 MiB", not "0.01 GiB"); below a KiB, whole bytes."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n} B"


def _same_size_file(path: Path, size: int) -> bool:
    return path.is_file() and not path.is_symlink() and path.stat().st_size == size


def _same_path(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _plan_usage(
    model: Path, usage_file: Path | None, warnings: list[str]
) -> tuple[Path, UsageHistory | None]:
    explicit = usage_file is not None
    path = Path(usage_file) if explicit else model / USAGE_FILE
    if not path.is_file():
        if explicit:
            raise MirrorError(f"usage history not found: {path}")
        return path, None
    geometry = model_geometry(model)
    history = read_usage(
        path,
        n_layers=geometry.n_layers,
        n_experts=geometry.n_experts,
        engine=geometry.engine,
        explicit=explicit,
    )
    if geometry.engine and history.engine_id is not None and history.engine_id != engine_id(geometry.engine):
        warnings.append(
            f"usage history engine id {history.engine_id} is not {geometry.engine!r} "
            f"({engine_id(geometry.engine)}); used because it was named explicitly"
        )
    if history.skipped_records:
        warnings.append(
            f"{history.skipped_records} usage record(s) outside the model geometry were not counted"
        )
    return path, history


def plan_mirror(
    model: str | os.PathLike,
    mirror: str | os.PathLike,
    *,
    budget_bytes: int,
    reserve_bytes: int = DEFAULT_RESERVE_GIB * GIB,
    usage: str | os.PathLike | None = None,
    source_dirs: Sequence[str | os.PathLike] = (),
    disk_weights: Sequence[float | int | Fraction] | None = None,
    probe: bool = False,
    probe_seconds: float = 2.0,
) -> MirrorPlan:
    """Plan a partial mirror of ``model`` in ``mirror`` within ``budget_bytes``.

    ``usage`` defaults to ``model/.coli_usage`` (another engine's history is refused unless named here).
    Weights for the read prediction: ``disk_weights``, or measured with ``probe``, or ``COLI_DISK_WEIGHTS``,
    or equal. Free space is that of the mirror directory (or its nearest existing parent), and the plan is
    admitted only if copying leaves at least ``reserve_bytes`` free. Raises ``MirrorError`` on bad input.
    """
    model_root = Path(os.path.abspath(model))
    mirror_root = Path(os.path.abspath(mirror))
    if budget_bytes <= 0:
        raise ParameterError(f"`budget_bytes` must be positive (got {budget_bytes} bytes)")
    if reserve_bytes < 0:
        raise ParameterError(f"`reserve_bytes` cannot be negative (got {reserve_bytes} bytes)")
    if disk_weights is not None and probe:
        raise MirrorError("`disk_weights` and `probe` are mutually exclusive")
    directories = _shard_directories(model_root, mirror_root, source_dirs)

    warnings: list[str] = []
    shards = discover_shards(directories, warnings, model_geometry(model_root).n_experts)
    selectable = _selectable(shards, warnings)
    usage_path, history = _plan_usage(model_root, Path(usage) if usage is not None else None, warnings)
    counts = history.counts if history is not None else {}

    free, shared = _mirror_drive(mirror_root, directories, warnings)
    # a same-size regular file is presumed good here; `stage` hashes it before deciding
    present = frozenset(s.name for s in shards if _same_size_file(mirror_root / s.name, s.size))
    room = _Room(free, reserve_bytes, present)
    files, effective_budget = _select(selectable, counts, budget_bytes, room, warnings)
    remaining = room.to_copy(files)
    weights, weights_source, probes = _read_weights(model_root, mirror_root, disk_weights, probe, probe_seconds,
                                                    warnings)  # fmt: skip
    prediction = None
    if history is not None:
        prediction = _predict(shards, files, history, weights, same_device=shared)

    return MirrorPlan(
        model_root=model_root,
        mirror_root=mirror_root,
        source_dirs=directories,
        usage_file=Path(os.path.abspath(usage_path)),
        usage_history_present=bool(counts),
        usage_selections=history.total if history is not None else 0,
        budget_bytes=budget_bytes,
        reserve_bytes=reserve_bytes,
        free_bytes=free,
        files=files,
        remaining_copy_bytes=remaining,
        reason=_reason(counts, files, room.fits(remaining)),
        warnings=warnings,
        prediction=prediction,
        disk_weights_source=weights_source,
        probes=probes,
        effective_budget_bytes=effective_budget,
        usage=history,
        shards=shards,
    )


def _shard_directories(
    model_root: Path, mirror_root: Path, source_dirs: Sequence[str | os.PathLike]
) -> list[Path]:
    """The model's shard directories (the model first, then the distinct ``source_dirs``), checked against the
    mirror: it must be another directory, and a directory if it exists."""
    if not model_root.is_dir():
        raise MirrorError(f"model directory does not exist: {model_root}")
    directories = [model_root]
    for extra in source_dirs:
        extra = Path(os.path.abspath(extra))
        if not any(_same_path(extra, d) for d in directories):
            directories.append(extra)
    for d in directories:
        if _same_path(d, mirror_root):
            raise MirrorError(f"the mirror directory must differ from the model's shard directories: {d}")
    if mirror_root.exists() and not mirror_root.is_dir():
        raise MirrorError(f"mirror path exists and is not a directory: {mirror_root}")
    return directories


def _mirror_drive(mirror_root: Path, directories: list[Path], warnings: list[str]) -> tuple[int, bool]:
    """Free bytes of the mirror's drive (of its nearest existing folder), and whether it is the filesystem
    device of a shard directory (then it adds no read bandwidth: warned)."""
    probe_at = nearest_existing(mirror_root)
    mirror_dev = probe_at.stat().st_dev
    shared = [d for d in directories if d.stat().st_dev == mirror_dev]
    if shared:
        warnings.append(
            f"the mirror ({mirror_root}) is on the same filesystem device as {shared[0]}: "
            "it adds no read bandwidth"
        )
    return shutil.disk_usage(probe_at).free, bool(shared)


def _selectable(shards: list[ShardExperts], warnings: list[str]) -> list[ShardExperts]:
    """The shards a receipt can name: plain shard files only (no path separators). The planar sidecar's layer
    files (experts-int4g64/, FORMATS §4) count as expert bytes of the model but cannot be mirrored; colibri's
    qwen38 engine reads them from its own Q38_INT4_DIR."""
    sidecar = [s for s in shards if shard_name_problem(s.name) is not None]
    if sidecar:
        warnings.append(
            f"the planar sidecar ({len(sidecar)} file(s), {format_bytes(sum(s.size for s in sidecar))} of routed experts) "
            "is not mirrored: a mirror receipt names plain shard files only"
        )
    return [s for s in shards if shard_name_problem(s.name) is None]


@dataclass(frozen=True)
class _Room:
    """The mirror drive's free space, the reserve to keep, and the shards already there (which cost no room)."""

    free: int
    reserve: int
    present: frozenset[str]

    def to_copy(self, chosen: list[PlannedFile]) -> int:
        return sum(f.size for f in chosen if f.name not in self.present)

    def fits(self, to_copy: int) -> bool:
        return self.free - to_copy >= self.reserve


def _select(
    selectable: list[ShardExperts], counts: dict, budget_bytes: int, room: _Room, warnings: list[str]
) -> tuple[list[PlannedFile], int | None]:
    """The shards chosen within the budget and, when those do not fit above the reserve, within what fits
    (``effective_budget`` then says how much: the plan fills what fits instead of refusing it all)."""
    files = select_shards(selectable, counts, budget_bytes) if counts else []
    if not files or room.fits(room.to_copy(files)):
        return files, None
    free, reserve = room.free, room.reserve
    space = max(0, free - reserve)
    fitted = select_shards(selectable, counts, budget_bytes, room_bytes=space, present=room.present)
    if not fitted:
        smallest = min((s.size for s in selectable if s.name not in room.present), default=0)
        warnings.append(
            f"the mirror drive has {format_bytes(free)} free and keeps a reserve of {format_bytes(reserve)}: room for "
            f"{format_bytes(space)}, and no selectable shard is that small (the smallest needs {format_bytes(smallest)}); "
            "free space or lower `reserve_bytes`"
        )
        return files, None
    warnings.append(
        f"the mirror drive has {format_bytes(free)} free and keeps a reserve of {format_bytes(reserve)}: "
        f"the requested budget ({format_bytes(budget_bytes)}, {len(files)} shard(s)) does not fit, so the plan "
        f"fills what fits ({len(fitted)} shard(s), {format_bytes(sum(f.size for f in fitted))})"
    )
    return fitted, min(budget_bytes, space + sum(f.size for f in fitted if f.name in room.present))


def _reason(counts: dict, files: list[PlannedFile], fits: bool) -> str | None:
    """Why the plan is not admitted (None: admitted)."""
    if not counts:
        return REASON_NO_USAGE
    if not files:
        return REASON_NOTHING_FITS
    return None if fits else REASON_RESERVE


def _read_weights(
    model_root: Path,
    mirror_root: Path,
    disk_weights: Sequence[float | int | Fraction] | None,
    probe: bool,
    probe_seconds: float,
    warnings: list[str],
) -> tuple[Sequence, str, list[ProbeResult]]:
    """The read-prediction weights (primary, mirror, ...), where they came from, and the probes if measured."""
    probes: list[ProbeResult] = []
    if probe:
        probes = list(probe_drives(model_root, mirror_root, seconds=probe_seconds))
        weights: Sequence = [p.bytes_per_second for p in probes]
        if any(w <= 0 for w in weights):
            raise MirrorError("the bandwidth probe read nothing; pass `disk_weights` instead")
        weights_source = "probe"
        warnings.extend(p.note for p in probes if p.note)
    elif disk_weights is not None:
        weights, weights_source = list(disk_weights), "option"
    elif (env := env_disk_weights()) is not None:
        weights, weights_source = env, "COLI_DISK_WEIGHTS"
    else:
        weights, weights_source = [1, 1], "default (equal)"
    if len(weights) < 2:
        raise MirrorError(f"need at least two disk weights (primary, mirror), got {list(weights)}")
    return weights, weights_source, probes


def _predict(
    shards: list[ShardExperts],
    files: list[PlannedFile],
    history: UsageHistory,
    weights: Sequence,
    *,
    same_device: bool = False,
) -> ReadPrediction:
    chosen = {f.name for f in files}
    expert_bytes: dict[ExpertKey, int] = {}
    mirrored: dict[ExpertKey, int] = {}
    routed: set[ExpertKey] = set()
    for shard in shards:
        on_mirror = shard.name in chosen
        if on_mirror:
            routed |= shard.routed
        for key, nbytes in shard.expert_bytes.items():
            expert_bytes[key] = expert_bytes.get(key, 0) + nbytes
            if on_mirror:
                mirrored[key] = mirrored.get(key, 0) + nbytes
    # The routing hash uses the model's experts per layer. A headerless history read without a config has only
    # the geometry its records imply, which the shards may exceed.
    n_experts = history.n_experts
    if history.headerless:
        n_experts = max(n_experts, 1 + max((key[1] for key in expert_bytes), default=0))
    return predict_reads(
        history.counts, n_experts, expert_bytes, mirrored, routed, weights, same_device=same_device
    )
