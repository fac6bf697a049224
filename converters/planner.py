"""The conversion plan: output units, their files, tensors, byte sizes and the disk peak, all before any work.

* One **unit** per decoder layer (``...layers.{N}``) plus one for the global tensors (embeddings, final norm,
  head), processed globals first, then layers in (prefix, index) order. A unit knows the source shards it
  reads and the exact bytes it writes (byte arithmetic of the format registry + the writer's header rule).
* A unit writes one file; with ``--layout planar`` a layer with routed experts writes two: the layer's other
  tensors, then its **planar64-v8 experts shard** (``colitools.layout`` metadata), one MoE layer per shard.
* Tensor order in a file: non-expert tensors by name (natural order), each weight followed by its scale; then
  experts in expert order, each expert's weights back to back (gate, up, down) followed by their scales in the
  same order (docs/FORMATS.md §4, the same order the planar record uses).
* Files are named ``model-{k:05d}-of-{n:05d}.safetensors`` in processing order.
"""

# ruff: noqa: E741  (O and I are the spec's names for out_features and in_features)
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from colitools.converters import recipe as rc
from colitools.converters.inventory import Inventory, SourceTensor, natural_key
from colitools.errors import ConvertError
from colitools.formats.dtypes import itemsize
from colitools.formats.filenames import shard_file_name
from colitools.formats.layouts import PLANAR
from colitools.formats.planar import PLANAR_LAYOUT
from colitools.formats.safetensors_io import SafetensorsWriter

GLOBALS = "globals"
Entry = tuple[str, str, tuple[int, ...]]


@dataclass(frozen=True)
class TensorJob:
    """One output tensor (weight plus scale) made from one source tensor, or one expert slab of a fused one."""

    out_name: str
    source: SourceTensor
    role: rc.Role
    target: rc.Target
    O: int
    I: int
    shape: tuple[int, ...]  # output float shape (1-D tensors keep theirs; 2-D is (O, I))
    expert: int | None = None  # expert index when the tensor is a per-expert projection
    expert_base: str | None = None
    fused_rows: tuple[int, int, int] | None = None  # (expert, row0, row1) of a fused [E, rows, cols] tensor

    @cached_property
    def weight_entry(self) -> Entry:
        wname, _ = self.target.tensor_names(self.out_name)
        if self.target.is_float:
            return (wname, "BF16" if self.target.is_bf16 else "F32", self.shape)
        return (wname, "U8", self.target.format_class.weight_shape(self.O, self.I, self.target.gs))

    @cached_property
    def scale_entry(self) -> Entry | None:
        _, sname = self.target.tensor_names(self.out_name)
        if sname is None:
            return None
        fmt = self.target.format_class
        return (sname, fmt.scale_dtype, fmt.scale_shape(self.O, self.I, self.target.gs))

    @cached_property
    def in_bytes(self) -> int:
        """Source bytes this job reads (its slab of a fused tensor, plus the scale)."""
        if self.fused_rows is None:
            return self.source.nbytes + self.source.scale_nbytes
        _, r0, r1 = self.fused_rows
        E, rows, cols = self.source.shape
        share = self.source.scale_nbytes * (r1 - r0) // max(E * rows, 1)
        return (r1 - r0) * cols * itemsize(self.source.dtype) + share

    @cached_property
    def out_bytes(self) -> int:
        return sum(_entry_nbytes(e) for e in (self.weight_entry, self.scale_entry) if e is not None)

    @cached_property
    def shards(self) -> set[str]:
        s = {self.source.shard}
        if self.source.scale is not None:
            s.add(self.source.scale.shard)
        return s


def _entry_nbytes(entry: Entry) -> int:
    n = itemsize(entry[1])
    for d in entry[2]:
        n *= d
    return n


@dataclass(frozen=True)
class OutputGroup:
    """Tensors written back to back: their weights, then their scales in the same order (one expert, or a
    single non-expert tensor)."""

    jobs: tuple[TensorJob, ...]

    @property
    def entries(self) -> list[Entry]:
        return [j.weight_entry for j in self.jobs] + [j.scale_entry for j in self.jobs if j.scale_entry]


@dataclass(frozen=True)
class OutputFile:
    """One output shard: its final name, tensor groups, ``__metadata__`` and exact size."""

    name: str
    groups: tuple[OutputGroup, ...]
    metadata: dict[str, str]
    planar: bool = False

    @cached_property
    def entries(self) -> list[Entry]:
        return [e for g in self.groups for e in g.entries]

    @cached_property
    def jobs(self) -> list[TensorJob]:
        return [j for g in self.groups for j in g.jobs]

    @cached_property
    def size(self) -> int:
        return SafetensorsWriter.file_size(self.entries, self.metadata)

    @cached_property
    def data_size(self) -> int:
        return sum(_entry_nbytes(e) for e in self.entries)


@dataclass(frozen=True)
class Unit:
    """A unit of work and of resume: one layer (or the globals), its source shards and output files."""

    key: str
    files: tuple[OutputFile, ...]

    @cached_property
    def jobs(self) -> list[TensorJob]:
        return [j for f in self.files for j in f.jobs]

    @cached_property
    def shards(self) -> tuple[str, ...]:
        return tuple(sorted({s for j in self.jobs for s in j.shards}))

    @cached_property
    def in_bytes(self) -> int:
        return sum(j.in_bytes for j in self.jobs)

    @cached_property
    def out_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class ConversionPlan:
    """Everything decided before work starts. ``units`` are in processing (and file-numbering) order."""

    units: list[Unit]
    recipe: rc.Recipe
    inventory: Inventory
    fallbacks: list[rc.Fallback] = field(default_factory=list)

    @property
    def files(self) -> list[OutputFile]:
        return [f for u in self.units for f in u.files]

    @property
    def in_bytes(self) -> int:
        return sum(u.in_bytes for u in self.units)

    @property
    def out_bytes(self) -> int:
        return sum(u.out_bytes for u in self.units)

    def format_totals(self) -> dict[str, dict[str, int]]:
        """Per written format (``int4-g64``, ``int8-row``, ``f32``, ``bf16``, ``fp8`` ...: the one vocabulary of
        ``format_names.format_label``, the names inspect and verify print): tensor count and output bytes."""
        totals: dict[str, dict[str, int]] = {}
        for job in (j for u in self.units for j in u.jobs):
            t = totals.setdefault(written_label(job.target), {"tensors": 0, "bytes": 0})
            t["tensors"] += 1
            t["bytes"] += job.out_bytes
        return dict(sorted(totals.items()))

    def role_formats(self) -> dict[str, dict[str, int]]:
        """Per recipe role: how many tensors got which format."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for job in (j for u in self.units for j in u.jobs):
            out[job.role.value][written_label(job.target)] += 1
        return {r: dict(sorted(v.items())) for r, v in sorted(out.items())}

    def peak_disk(self, transient: Iterable[str] = (), kept: Iterable[str] = (), workers: int = 1) -> int:
        """Peak bytes added to the output volume: published output so far, the files in flight, plus
        downloaded source shards alive at that point (``transient`` shards are deleted after their last unit,
        ``kept`` ones stay to the end). Up to ``workers`` consecutive units are in flight at once."""
        sizes = self.inventory.shard_sizes
        transient, kept = set(transient), set(kept)
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for i, unit in enumerate(self.units):
            for s in unit.shards:
                first.setdefault(s, i)
                last[s] = i
        n = len(self.units)
        peak, done = 0, 0
        for i in range(n):
            window_end = min(i + max(workers, 1), n) - 1
            out = done + sum(self.units[k].out_bytes for k in range(i, window_end + 1))
            alive = sum(
                sizes.get(s, 0)
                for s in first
                if (s in transient and first[s] <= window_end and last[s] >= i)
                or (s in kept and first[s] <= window_end)
            )
            peak = max(peak, out + alive)
            done += self.units[i].out_bytes
        return peak

    def summary(self, transient: Iterable[str] = (), kept: Iterable[str] = (), workers: int = 1) -> dict:
        """The plan as printed by ``--dry-run`` (``--json`` prints this dict)."""
        return {
            "units": [
                {"unit": u.key, "shards": list(u.shards), "files": [f.name for f in u.files],
                 "in_bytes": u.in_bytes, "out_bytes": u.out_bytes}
                for u in self.units
            ],
            "files": len(self.files),
            "in_bytes": self.in_bytes,
            "out_bytes": self.out_bytes,
            "peak_disk_bytes": self.peak_disk(transient, kept, workers),
            "recipe": self.recipe.as_dict(),
            "formats_per_role": self.role_formats(),
            "format_totals": self.format_totals(),
            "fallbacks": [f.as_dict() for f in self.fallbacks],
        }  # fmt: skip


def written_label(target: rc.Target) -> str:
    """The user-facing name of what a target writes (``Format.label``: floats by their stored dtype)."""
    return target.format_class.label(target.gs, "BF16" if target.is_bf16 else "F32")


# ------------------------------------------------------------------------------------------------ planning
def plan_conversion(inventory: Inventory, recipe: rc.Recipe) -> ConversionPlan:
    """Classify every tensor, choose its format, group tensors into units and files, name the files.

    Raises ConvertError naming the tensor for anything unclassifiable, and for ``--layout planar`` with a
    routed expert that would not be int4-row / int4-grouped gs 64 with ``I % 64 == 0``."""
    nhl = inventory.num_hidden_layers
    fp8_block = inventory.fp8.block if inventory.fp8 else None
    by_unit: dict[tuple, list[TensorJob]] = defaultdict(list)
    for name, src in inventory.tensors.items():
        role = rc.classify(name, len(src.shape), nhl)
        layer = rc.layer_of(name)
        ukey = (0, "", 0) if layer is None else (1, layer.prefix, layer.index)
        by_unit[ukey].extend(_jobs_for(src, role, recipe, fp8_block))

    fallbacks: list[rc.Fallback] = []
    drafts: list[tuple[str, list[tuple[list[OutputGroup], dict[str, str], bool]]]] = []
    for ukey in sorted(by_unit):
        jobs = by_unit[ukey]
        key = GLOBALS if ukey[0] == 0 else f"{ukey[1]}.{ukey[2]}"
        fallbacks.extend(j.target.fallback for j in jobs if j.target.fallback)
        planar_jobs = [j for j in jobs if recipe.layout == PLANAR.option and j.role is rc.Role.EXPERT]
        for j in planar_jobs:
            _check_planar(j)
        rest = [j for j in jobs if j not in planar_jobs] if planar_jobs else jobs
        files = []
        if rest:
            groups = _group(rest)
            files.append((groups, _metadata(groups, planar=False), False))
        if planar_jobs:
            groups = _group(planar_jobs)
            files.append((groups, _metadata(groups, planar=True), True))
        drafts.append((key, files))

    total = sum(len(f) for _, f in drafts)
    units, k = [], 0
    for key, files in drafts:
        out = []
        for groups, meta, planar in files:
            k += 1
            out.append(OutputFile(shard_file_name(k, total), tuple(groups), meta, planar))
        units.append(Unit(key, tuple(out)))
    return ConversionPlan(units, recipe, inventory, fallbacks)


def _jobs_for(src: SourceTensor, role: rc.Role, recipe: rc.Recipe, fp8_block) -> list[TensorJob]:
    option = recipe.option_for(role)
    block = fp8_block if src.scale is not None else None
    if len(src.shape) == 3:  # fused experts, split per expert (§4)
        jobs = []
        E, _, cols = src.shape
        kind = rc.SourceKind(src.dtype, block, fused=True)
        for sl in rc.split_fused(src.name, src.shape):
            O, I = sl.row1 - sl.row0, cols
            target = rc.choose_target(sl.out_name, role, option, O, I, kind)
            ex = rc.expert_of(sl.out_name)
            jobs.append(TensorJob(sl.out_name, src, role, target, O, I, (O, I), sl.expert, ex.base if ex else None,
                                  (sl.expert, sl.row0, sl.row1)))  # fmt: skip
        return jobs
    if len(src.shape) == 2:
        O, I = src.shape
        shape = src.shape
    else:  # 0-D and 1-D tensors: F32, logical shape irrelevant
        O, I = 1, max(int(src.shape[0]) if src.shape else 1, 1)
        shape = src.shape
    target = rc.choose_target(src.name, role, option, O, I, rc.SourceKind(src.dtype, block))
    ex = rc.expert_of(src.name) if len(src.shape) == 2 else None
    return [
        TensorJob(
            src.name, src, role, target, O, I, shape, ex.expert if ex else None, ex.base if ex else None
        )
    ]


def _check_planar(job: TensorJob) -> None:
    t = job.target
    if not t.format_class.planar_eligible(job.I, t.gs):
        raise ConvertError(
            f"--layout planar: routed expert tensor {job.out_name} [{job.O}, {job.I}] would be written as "
            f"{t.label}; {PLANAR_LAYOUT} needs int4-row or int4-g64 with I % 64 == 0"
        )


def _group(jobs: list[TensorJob]) -> list[OutputGroup]:
    """Non-expert tensors first (natural name order), then experts by (base, index), gate/up/down inside."""
    singles = sorted((j for j in jobs if j.expert is None), key=lambda j: natural_key(j.out_name))
    experts: dict[tuple[str, int], list[TensorJob]] = defaultdict(list)
    for j in jobs:
        if j.expert is not None:
            experts[(j.expert_base or "", j.expert)].append(j)
    groups = [OutputGroup((j,)) for j in singles]
    for key in sorted(experts, key=lambda k: (natural_key(k[0]), k[1])):
        members = sorted(experts[key], key=lambda j: rc.expert_of(j.out_name).order)
        groups.append(OutputGroup(tuple(members)))
    return groups


def _metadata(groups: list[OutputGroup], *, planar: bool) -> dict[str, str]:
    """``colitools.shapes`` (every quantized weight with a scale, incl. mxfp4 ``weight_packed``), ``colibri.fmt``
    stamps when any, ``colitools.layout`` for planar shards (§3, §4). Compact JSON, sorted keys."""
    shapes: dict[str, list[int]] = {}
    stamps: dict[str, str] = {}
    for g in groups:
        for j in g.jobs:
            if j.target.is_float:
                continue
            wname, _ = j.target.tensor_names(j.out_name)
            shapes[wname] = [j.O, j.I]
            if j.target.stamp:
                stamps[wname] = j.target.stamp
    meta = {"colitools.shapes": json.dumps(shapes, sort_keys=True, separators=(",", ":"))}
    if stamps:
        meta["colibri.fmt"] = json.dumps(stamps, sort_keys=True, separators=(",", ":"))
    if planar:
        meta["colitools.layout"] = PLANAR_LAYOUT
    return meta
