"""The conversion plan: output units, their files, tensors, byte sizes and the disk peak, all before any work.

* One **unit** per decoder layer (``...layers.{N}``) plus one for the global tensors (embeddings, final norm,
  head), processed globals first, then layers in (prefix, index) order. A unit knows the source shards it
  reads and the exact bytes it writes (byte arithmetic of the format registry + the writer's header rule).
* A unit writes one file; with ``--layout planar`` a layer with routed experts writes two: the layer's other
  tensors (a main shard), then its **sidecar layer file** ``experts-int4g64/layer-NNN.safetensors``
  (``formats/planar_sidecar.py``: planar64-v8 codes, F32 scales per 64-block, ``__metadata__`` last). The main
  container (its shards and index) then holds no routed expert.
* Tensor order in a file: non-expert tensors by name (natural order), each weight followed by its scale; then
  experts in expert order, each expert's weights back to back (gate, up, down) followed by their scales in the
  same order (docs/FORMATS.md §4, the same order the planar record uses).
* Main shards are named ``model-{k:05d}-of-{n:05d}.safetensors`` in processing order (sidecar files are not
  counted).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from colitools.converters import recipe as rc
from colitools.converters.cached import cached_property
from colitools.converters.inventory import Inventory, SourceTensor, natural_key, source_kind
from colitools.formats import planar_sidecar as sidecar
from colitools.formats import qpack, targets
from colitools.formats.dtypes import itemsize
from colitools.formats.errors import ConvertError, TargetRefused
from colitools.formats.expert_layouts import Stack
from colitools.formats.filenames import shard_file_name
from colitools.formats.format_names import copied_label
from colitools.formats.layouts import PLANAR, QPACK
from colitools.formats.names import detail_role, order_role_formats, parse_name
from colitools.formats.planar import PLANAR_LAYOUT
from colitools.formats.safetensors_io import SafetensorsWriter

log = logging.getLogger(__name__)

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
    fused_pick: rc.ExpertSlice | None = None  # an interleaved / transposed stack slice, or a stack-bias slice

    @property
    def routed(self) -> bool:
        """A routed expert's tensor (role ``experts``): what a target's expert layout groups."""
        return self.role is rc.Role.EXPERT

    @cached_property
    def weight_entry(self) -> Entry:
        wname, _ = self.target.tensor_names(self.out_name)
        if self.target.is_source:  # rules 0 and 1: the source's dtype and shape, bytes unchanged
            return (wname, self.source.dtype, self.shape)
        if self.target.is_float:
            return (wname, "BF16" if self.target.is_bf16 else "F32", self.shape)
        return (wname, *self.target.coded(self.O, self.I))

    @cached_property
    def scale_entry(self) -> Entry | None:
        _, sname = self.target.tensor_names(self.out_name)
        if sname is None:
            return None
        return (sname, *self.target.coded(self.O, self.I, scale=True))

    @cached_property
    def in_bytes(self) -> int:
        """Source bytes this job reads (its slab of a fused tensor, plus the scale)."""
        if self.fused_pick is not None and self.source.quant is not None:  # rows of a natively quantized slab
            E, rows = self.source.shape[:2]
            return self.source.nbytes * self.fused_pick.count // max(E * rows, 1)
        if self.fused_pick is not None:
            n = itemsize(self.source.dtype)
            for d in self.shape:
                n *= d
            if self.source.scale is not None:  # an FP8 stack's slice: its share of the scale grid
                n += self.source.scale_nbytes * n // max(self.source.nbytes, 1)
            return n
        if self.fused_rows is None:
            return self.source.nbytes + self.source.scale_nbytes
        _, r0, r1 = self.fused_rows
        E, rows, cols = self.source.shape
        if self.source.quant is not None:  # a natively quantized slab: its share of every companion
            return self.source.nbytes * (r1 - r0) // max(E * rows, 1)
        share = self.source.scale_nbytes * (r1 - r0) // max(E * rows, 1)
        return (r1 - r0) * cols * itemsize(self.source.dtype) + share

    @cached_property
    def out_bytes(self) -> int:
        return sum(_entry_nbytes(e) for e in (self.weight_entry, self.scale_entry) if e is not None)

    @cached_property
    def shards(self) -> set[str]:
        return self.source.shards

    def __getstate__(self) -> dict:
        return _without(self, ("weight_entry", "scale_entry", "shards"))


def _without(obj: object, cached: tuple[str, ...]) -> dict:
    """``obj``'s pickled state: its fields and the sizes it computed, not the lists and tuples it can rebuild
    (a recorded plan, ``plan_record``, and a unit sent to a ``--workers`` process stay small and quick to load)."""
    return {k: v for k, v in obj.__dict__.items() if k not in cached}


def _entry_nbytes(entry: Entry) -> int:
    n = itemsize(entry[1])
    for d in entry[2]:
        n *= d
    return n


@dataclass(frozen=True)
class OutputGroup:
    """Tensors written back to back: their weights, then their scales in the same order (one expert, or a
    single non-expert tensor), as a target groups them (formats/expert_layouts.py ``Grouped``): ``stacks`` are
    tensors made of several jobs' codes (a merged expert blob, a fused stack: ``Stack``), written instead of
    the jobs' own; ``interleaved``: each weight directly followed by its scale (a loader's expert record)."""

    jobs: tuple[TensorJob, ...]
    stacks: tuple[Stack, ...] = ()
    interleaved: bool = False
    trailing: int = 0  # the last ``trailing`` jobs (an expert's biases) follow the others' scales (§4)

    @property
    def entries(self) -> list[Entry]:
        if self.stacks:
            return [e for st in self.stacks for e in st.entries]
        cut = len(self.jobs) - self.trailing
        return self._entries(self.jobs[:cut]) + self._entries(self.jobs[cut:])

    def _entries(self, jobs: tuple[TensorJob, ...]) -> list[Entry]:
        if self.interleaved:
            return [e for j in jobs for e in (j.weight_entry, j.scale_entry) if e is not None]
        return [j.weight_entry for j in jobs] + [j.scale_entry for j in jobs if j.scale_entry]

    @property
    def sidecar_entries(self) -> list[Entry]:
        """The same record in a sidecar layer file: scales F32 ``[O, I/64]`` (an int4-row scale per block)."""
        scales = [
            (j.scale_entry[0], "F32", sidecar.scale_shape(j.O, j.I)) for j in self.jobs if j.scale_entry
        ]
        return [j.weight_entry for j in self.jobs] + scales


@dataclass(frozen=True)
class OutputFile:
    """One output shard: its final name, tensor groups, ``__metadata__`` and exact size."""

    name: str
    groups: tuple[OutputGroup, ...]
    metadata: dict[str, str]
    planar: bool = False
    sidecar_layer: int | None = None  # a planar sidecar layer file (``name`` is experts-int4g64/layer-NNN...)
    qpack_layer: int | None = None  # a QPACK layer file (``packed_experts/layer_NN.bin``, raw: no header)

    @property
    def is_sidecar(self) -> bool:
        return self.sidecar_layer is not None

    @cached_property
    def entries(self) -> list[Entry]:
        if self.is_sidecar:
            return [e for g in self.groups for e in g.sidecar_entries]
        return [e for g in self.groups for e in g.entries]

    @cached_property
    def jobs(self) -> list[TensorJob]:
        return [j for g in self.groups for j in g.jobs]

    @cached_property
    def size(self) -> int:
        if self.qpack_layer is not None:
            return self.data_size
        return SafetensorsWriter.file_size(self.entries, self.metadata, metadata_last=self.is_sidecar)

    @cached_property
    def data_size(self) -> int:
        return sum(_entry_nbytes(e) for e in self.entries)

    def __getstate__(self) -> dict:
        return _without(self, ("entries", "jobs"))


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

    def __getstate__(self) -> dict:
        return _without(self, ("jobs",))


@dataclass
class ConversionPlan:
    """Everything decided before work starts. ``units`` are in processing (and file-numbering) order."""

    units: list[Unit]
    recipe: rc.Recipe
    inventory: Inventory
    fallbacks: list[rc.Fallback] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # tower tensors left out (--towers drop)
    experts_choice: object = None  # recipe.ExpertsChoice: how `experts` was chosen (runner.load_plan)
    budget: dict | None = None  # a size budget's allocation report (converters/budget.py), None without one

    @property
    def files(self) -> list[OutputFile]:
        return [f for u in self.units for f in u.files]

    @property
    def main_files(self) -> list[OutputFile]:
        """The main container's shards (every file but the planar sidecar's and the QPACK layer files)."""
        return [f for f in self.files if not f.is_sidecar and f.qpack_layer is None]

    @property
    def sidecar_files(self) -> list[OutputFile]:
        """The planar sidecar's layer files, in layer order (empty unless ``--layout planar``)."""
        return [f for f in self.files if f.is_sidecar]

    # The figures of the whole plan are computed once (the summary, the ledger's record and its check on a
    # rerun each ask for them; on 92k tensors each pass costs ~0.3 s): a plan's units are never changed
    # after planning (``dataclasses.replace`` makes a new plan, with its own figures).
    @cached_property
    def in_bytes(self) -> int:
        return sum(u.in_bytes for u in self.units)

    @cached_property
    def out_bytes(self) -> int:
        return sum(u.out_bytes for u in self.units)

    def format_totals(self) -> dict[str, dict[str, int]]:
        """Per written format (``int4-g64``, ``int8-row``, ``f32``, ``bf16``, ``fp8`` ...: the one vocabulary of
        ``format_names.format_label``, the names inspect and verify print): tensor count and output bytes."""
        return {k: dict(v) for k, v in self._format_totals.items()}

    def role_formats(self) -> dict[str, dict[str, int]]:
        """Per role (the finer roles of ``names.DETAIL_ROLES``: router, norm/1-D, conv, ssm params, hc, sinks,
        embed, head, mtp, routed experts, shared experts, attention, dense mlp, tower, copied non-float, ...):
        how many output tensors got which format, roles in that order."""
        return {k: dict(v) for k, v in self._role_formats.items()}

    @cached_property
    def _format_totals(self) -> dict[str, dict[str, int]]:
        totals: dict[str, dict[str, int]] = {}
        for job in (j for u in self.units for j in u.jobs):
            t = totals.setdefault(job.target.written_label, {"tensors": 0, "bytes": 0})
            t["tensors"] += 1
            t["bytes"] += job.out_bytes
        return dict(sorted(totals.items()))

    @cached_property
    def _role_formats(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        nhl = self.inventory.num_hidden_layers
        for job in (j for u in self.units for j in u.jobs):
            label = copied_label(job.source.dtype) if job.target.is_source else job.target.written_label
            copied = job.role is rc.Role.COPY
            role = detail_role(job.out_name, len(job.shape), copied=copied, num_hidden_layers=nhl)
            counts[role][label] += 1
        return order_role_formats(counts)

    def peak_disk(self, transient: Iterable[str] = (), kept: Iterable[str] = (), workers: int = 1,
                  streamed: bool = False) -> int:  # fmt: skip
        """Peak bytes added to the output volume: published output so far (``streamed``: see ``outputs_at``),
        the files in flight, plus downloaded source shards alive at that point (``transient`` shards are deleted
        after their last unit, ``kept`` ones stay to the end). Up to ``workers`` consecutive units are in flight
        at once."""
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
            out = outputs_at(self.units, i, window_end, done, workers, streamed)
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
            "dropped_towers": list(self.dropped),
        }  # fmt: skip


# ------------------------------------------------------------------------------------------------ planning
def plan_conversion(inventory: Inventory, recipe: rc.Recipe) -> ConversionPlan:
    """Classify every tensor, choose its format, group tensors into units and files, name the files.

    Raises ConvertError naming the tensor for anything unclassifiable, and for ``--layout planar`` with a
    routed expert that would not be int4-row / int4-grouped gs 64 with ``I % 64 == 0``; TargetRefused for
    whatever the recipe's target (``recipe.target``, formats/targets/) cannot write."""
    recipe.target.check_source(inventory.config)
    by_unit, dropped = _unit_jobs(inventory, recipe)
    fallbacks = [j.target.fallback for ukey in sorted(by_unit) for j in by_unit[ukey] if j.target.fallback]
    drafts = []
    for ukey in sorted(by_unit):
        key = GLOBALS if ukey[0] == 0 else f"{ukey[1]}.{ukey[2]}"
        drafts.append((key, _unit_files(key, ukey[2], by_unit[ukey], recipe)))
    say_native_decoded(fallbacks)
    return ConversionPlan(_units(drafts), recipe, inventory, fallbacks, dropped)


def _unit_jobs(inventory: Inventory, recipe: rc.Recipe) -> tuple[dict[tuple, list[TensorJob]], list[str]]:
    """Every tensor's jobs as the target writes them, by unit key (``(0, "", 0)`` for the globals, ``(1,
    prefix, layer)``), and the tensors left out (towers with ``--towers drop``, MTP modules of a target that
    drops them)."""
    target, nhl = recipe.target, inventory.num_hidden_layers
    fp8_block = inventory.fp8.block if inventory.fp8 else None
    by_unit: dict[tuple, list[TensorJob]] = defaultdict(list)
    dropped: list[str] = []
    chosen: dict[rc.Target, rc.Target] = {}  # one object per distinct target (_shared_target)
    mode = recipe.quantizer_mode  # FORMATS §9: the encoder mode of every target with scales to choose
    for name, src in inventory.tensors.items():
        role = source_role(name, src, nhl)
        if is_dropped(role, recipe):
            dropped.append(name)
            continue
        layer = rc.layer_of(name)
        ukey = (0, "", 0) if layer is None else (1, layer.prefix, layer.index)
        jobs = _jobs_for(src, role, recipe, fp8_block, inventory.orientation_of)
        by_unit[ukey].extend(_shared_target(_quantized_by(_for_target(j, target), mode), chosen) for j in jobs)
    return by_unit, dropped


def source_role(name: str, src: SourceTensor, num_hidden_layers: int | None) -> rc.Role:
    """The recipe role of source tensor ``name`` (a natively quantized tensor is a float weight stored in codes:
    its data dtype is U8 / I32)."""
    return rc.classify(name, len(src.shape), num_hidden_layers, "F32" if src.quant is not None else src.dtype)


def is_dropped(role: rc.Role, recipe: rc.Recipe) -> bool:
    """A tensor of ``role`` left out of the output (towers with ``--towers drop``, MTP modules of a target that
    drops them)."""
    return (role is rc.Role.TOWER and recipe.towers == "drop") or (role is rc.Role.MTP and recipe.target.drop_mtp)


def written_jobs(
    src: SourceTensor, role: rc.Role, recipe: rc.Recipe, inventory: Inventory
) -> list[tuple[str, TensorJob]]:
    """Source tensor ``src``'s jobs as ``recipe``'s target writes them (what ``_unit_jobs`` plans for it), each
    with its recipe name (before the target renames it), for the size budget (``converters/budget.py``)."""
    fp8_block = inventory.fp8.block if inventory.fp8 else None
    jobs = _jobs_for(src, role, recipe, fp8_block, inventory.orientation_of)
    return [(j.out_name, _quantized_by(_for_target(j, recipe.target), recipe.quantizer_mode)) for j in jobs]


def _quantized_by(job: TensorJob, mode: str) -> TensorJob:
    """``job`` whose target encodes with the encoder mode ``mode`` (``rc.Target.with_quantizer``)."""
    target = job.target.with_quantizer(mode)
    return job if target is job.target else replace(job, target=target)


def _shared_target(job: TensorJob, chosen: dict[rc.Target, rc.Target]) -> TensorJob:
    """``job`` with the one object of its target among ``chosen`` (equal targets are one object: a recorded
    plan pickles each once). ``job`` is new, seen by nobody yet: setting its field is safe."""
    try:
        one = chosen.setdefault(job.target, job.target)
    except TypeError:  # a target with an unhashable spelling: kept as it is
        return job
    if one is not job.target:
        object.__setattr__(job, "target", one)
    return job


def _unit_files(
    key: str, layer: int, jobs: list[TensorJob], recipe: rc.Recipe
) -> list[tuple[list[OutputGroup], dict[str, str], int | None]]:
    """A unit's files before numbering: ``(groups, metadata, sidecar layer or None)``; the main file's groups
    as the target writes them, then (``--layout planar``) the sidecar layer file of its routed experts."""
    planar_jobs = [j for j in jobs if recipe.layout == PLANAR.option and j.role is rc.Role.EXPERT]
    for j in planar_jobs:
        _check_planar(j)
    qpack_jobs = [j for j in jobs if recipe.layout == QPACK.option and j.role is rc.Role.EXPERT]
    aside = {id(j) for j in (*planar_jobs, *qpack_jobs)}
    rest = [j for j in jobs if id(j) not in aside] if aside else jobs
    files = []
    if rest:
        grouped = recipe.target.group(_group(rest))
        groups = [OutputGroup(g.jobs, g.stacks, g.interleaved, g.trailing) for g in grouped]
        files.append((groups, _metadata(groups, planar=False), None))
    if planar_jobs:
        groups = [OutputGroup(g) for g in _group(planar_jobs)]
        _check_records(groups, key)
        files.append((groups, sidecar.layer_metadata(layer), layer))
    if qpack_jobs:
        files.append(([_qpack_group(qpack_jobs, layer, recipe)], {}, QpackLayer(layer)))
    return files


@dataclass(frozen=True)
class QpackLayer:
    """A unit's QPACK layer file (``--layout qpack``), by decoder layer."""

    layer: int


def _qpack_group(jobs: list[TensorJob], layer: int, recipe: rc.Recipe) -> OutputGroup:
    """The routed experts of ``layer`` as one QPACK layer file (formats/qpack.py): expert by expert, gate, up,
    down; every expert of the layer, each ``[I, H]``, ``[I, H]``, ``[H, I]`` in one affine format. TargetRefused
    (one line) for anything else."""
    where = f"`layout=qpack`: layer {layer}"
    rank = {p.removesuffix("_proj"): k for k, p in enumerate(qpack.PROJECTIONS)}  # the record order
    keyed = [((j.expert, rank.get(parse_name(j.out_name).projection or "", 9)), j) for j in jobs]
    bad = next((j for (e, r), j in keyed if e is None or r == 9), None)
    if bad is not None:
        raise TargetRefused(f"{where}: routed expert tensor {bad.out_name} is not a gate, up or down projection")
    ordered = [j for _, j in sorted(keyed, key=lambda kj: kj[0])]
    experts = len(ordered) // 3
    gate = ordered[0]
    inter, hidden, t = gate.O, gate.I, gate.target
    for k, j in enumerate(ordered):
        shape = (hidden, inter) if k % 3 == 2 else (inter, hidden)
        if (j.expert, (j.O, j.I), j.target.fmt, j.target.gs) != (k // 3, shape, t.fmt, t.gs):
            raise TargetRefused(
                f"{where}: {j.out_name} [{j.O}, {j.I}] as {j.target.label} breaks the layer's records (expert "
                f"{k // 3}, {shape[0]} x {shape[1]}, {t.label}): QPACK holds every expert of a layer alike"
            )
    _, stride = qpack.sections(hidden, inter, t.format_class.bits, t.gs)
    stack = Stack(qpack.layer_file(layer), "U8", (experts * stride,), tuple(range(len(ordered))), fmt=t.fmt,
                  gs=t.gs, kind="qpack")  # fmt: skip
    return OutputGroup(tuple(ordered), stacks=(stack,))


def _units(
    drafts: list[tuple[str, list[tuple[list[OutputGroup], dict[str, str], int | None]]]],
) -> list[Unit]:
    """The units with their files named: main shards ``model-k-of-n`` in processing order, sidecar layer files
    by layer number (one per layer)."""
    total = sum(1 for _, f in drafts for *_, layer in f if layer is None)
    units, k, layers = [], 0, {}
    for key, files in drafts:
        out = []
        for groups, meta, layer in files:
            if layer is None:
                k += 1
                out.append(OutputFile(shard_file_name(k, total), tuple(groups), meta))
                continue
            if isinstance(layer, QpackLayer):
                out.append(OutputFile(qpack.layer_file(layer.layer), tuple(groups), meta, qpack_layer=layer.layer))
                continue
            if layer in layers:
                raise ConvertError(
                    f"`layout=planar`: units {layers[layer]} and {key} both have routed experts of layer {layer}; "
                    f"the sidecar holds one file per layer number"
                )
            layers[layer] = key
            out.append(OutputFile(sidecar.layer_file_path(layer), tuple(groups), meta, True, layer))
        units.append(Unit(key, tuple(out)))
    return units


def _for_target(job: TensorJob, target: targets.Target) -> TensorJob:
    """A job as the target writes it (``Target.rewrite``, formats/targets/): its written name and expert base,
    and the loader's float dtype, its source float dtype (where its bytes can be kept, else f32), a format
    re-chosen from another option (recorded as a fallback) or the loader's expert spelling."""
    rw = target.rewrite(job)  # TargetRefused (formats/targets/) for a tensor its loader cannot read
    if rw is None:
        return job
    if (rw.name, rw.expert_base) != (job.out_name, job.expert_base):
        job = replace(job, out_name=rw.name, expert_base=rw.expert_base)
    t = job.target
    if rw.float_dtype is not None:
        return replace(job, target=rc.Target(rc.BF16 if rw.float_dtype == "bf16" else "f32"))
    if rw.keep_float:
        plain = job.source.quant is None and job.source.scale is None and job.fused_rows is None
        keep = plain and job.fused_pick is None and job.source.dtype in ("BF16", "F16", "F32")
        return replace(job, target=rc.Target(rc.SOURCE if keep else "f32"))
    if rw.instead is not None:
        instead = rc.choose_target(
            job.out_name, job.role, rw.instead, job.O, job.I, source_kind(job.source, None)
        )
        fb = rc.Fallback(job.out_name, t.label, instead.label, rw.reason or "")
        return replace(job, target=replace(instead, fallback=fb))
    if rw.spelling is not None:
        return replace(job, target=replace(t, spelling=rw.spelling))
    return job


def say_native_decoded(fallbacks: list[rc.Fallback]) -> None:
    """One warning on the ``colitools`` logger (the CLI prints it, ``output.warn``), before any work, when
    ``native`` decodes natively quantized tensors instead of keeping them (asymmetric / act-order INT4, NVFP4,
    MXFP8); the manifest lists each as a fallback."""
    decoded = [f for f in fallbacks if f.requested == rc.NATIVE_OPTION]
    if decoded:
        kinds = sorted({f.reason.split(";")[0].removeprefix(f"{rc.NATIVE_DECODED}: ") for f in decoded})
        log.warning(
            "native: %d natively quantized tensor(s) decoded instead of kept (%s), e.g. %s -> %s; listed in the "
            "manifest's fallbacks", len(decoded), "; ".join(kinds), decoded[0].tensor, decoded[0].written
        )


def _jobs_for(
    src: SourceTensor, role: rc.Role, recipe: rc.Recipe, fp8_block, orientation_of=None
) -> list[TensorJob]:
    """``src``'s jobs; ``orientation_of(src)`` (``Inventory.orientation_of``) is asked for a stack only."""
    orientation = None
    block = fp8_block if src.scale is not None else None
    fused = rc.fused_of(src.name) if role not in (rc.Role.COPY, rc.Role.TOWER) else None
    stacked = fused is not None and len(src.shape) == (2 if fused.bias else 3)
    shared = (
        role in (rc.Role.DENSE, rc.Role.MTP) and len(src.shape) == 3 and rc.shared_stack(src.name) is not None
    )
    if (stacked or shared) and orientation_of is not None:
        orientation = orientation_of(src)
    if stacked:  # expert stacks, split per expert
        jobs = []
        kind = source_kind(src, block, fused=True)
        for sl in rc.split_fused(src.name, src.shape, orientation or rc.Orientation.ROWS):
            shape = sl.out_shape(src.shape)
            O, I = shape if len(shape) == 2 else (1, shape[0])
            # natively quantized codes are per row (blocks and scales of one row): every row selection is exact,
            # but not a transpose. FP8 blocks span rows and columns: a contiguous row range keeps its grid, any
            # other slice (a transposed stack's columns, interleaved rows) decodes the expert's whole slab first
            if src.quant is not None and sl.transposed:
                raise ConvertError(
                    f"tensor {src.name}: a natively quantized expert stack in the {orientation} orientation is "
                    "not supported"
                )
            target = rc.choose_target(sl.out_name, role, recipe.tensor_option(role, sl.out_name), O, I, kind)
            ex = rc.expert_of(sl.out_name)
            rows = (sl.expert, sl.row0, sl.row1) if sl.contiguous and not fused.bias else None
            pick = None if rows is not None else sl
            jobs.append(TensorJob(sl.out_name, src, role, target, O, I, shape, sl.expert, ex.base if ex else None,
                                  rows, pick))  # fmt: skip
        return jobs
    if shared:
        return _shared_stack_jobs(src, role, recipe, block, orientation)
    if len(src.shape) == 2:
        O, I = src.shape
        shape = src.shape
    else:  # 0-D, 1-D and >2-D float tensors (F32) and copied tensors: logical shape irrelevant
        n = 1
        for d in src.shape:
            n *= int(d)
        O, I = 1, max(n, 1)
        shape = src.shape
    target = rc.choose_target(src.name, role, recipe.tensor_option(role, src.name), O, I, source_kind(src, block))
    ex = rc.expert_of(src.name)
    if ex is not None and len(src.shape) != (1 if ex.bias else 2):
        ex = None  # an expert's record holds its projections [O, I] and its biases [O] (§4)
    return [
        TensorJob(
            src.name, src, role, target, O, I, shape, ex.expert if ex else None, ex.base if ex else None
        )
    ]


def _shared_stack_jobs(src: SourceTensor, role: rc.Role, recipe: rc.Recipe, block, orientation) -> list[TensorJob]:
    """A stacked shared expert ``[n, rows, cols]`` split into ``shared_experts.{k}.{gate,up,down}_proj.weight``
    (``rc.split_shared``), each one 2-D tensor of ``role`` (not a routed expert: no expert index)."""
    jobs = []
    kind = source_kind(src, block, fused=True)
    for sl in rc.split_shared(src.name, src.shape, orientation or rc.Orientation.ROWS):
        if (src.scale is not None or src.quant is not None) and not sl.contiguous:
            raise ConvertError(
                f"tensor {src.name}: a quantized stacked shared expert in the {orientation} orientation is not supported"
            )
        O, I = sl.out_shape(src.shape)
        target = rc.choose_target(sl.out_name, role, recipe.tensor_option(role, sl.out_name), O, I, kind)
        rows = (sl.expert, sl.row0, sl.row1) if sl.contiguous else None
        jobs.append(TensorJob(sl.out_name, src, role, target, O, I, (O, I), None, None, rows,
                              None if rows is not None else sl))  # fmt: skip
    return jobs


def _check_planar(job: TensorJob) -> None:
    t = job.target
    if not t.format_class.planar_eligible(job.I, t.gs):
        raise ConvertError(
            f"`layout=planar`: routed expert tensor {job.out_name} [{job.O}, {job.I}] would be written as "
            f"{t.label}; {PLANAR_LAYOUT} needs int4-row or int4-g64 with I % 64 == 0"
        )


def _check_records(groups: list[OutputGroup], key: str) -> None:
    """A sidecar layer file is one record per expert: exactly its gate, up and down projections, in that order,
    every expert of the layer (0..E-1) of one expert tensor family."""
    bases = {j.expert_base for g in groups for j in g.jobs}
    if any(len(g.jobs) != 3 or g.jobs[0].expert is None for g in groups) or len(bases) != 1:
        raise ConvertError(
            f"`layout=planar`: unit {key}: routed experts are not one gate/up/down record each"
        )
    for e, g in enumerate(groups):
        projections = tuple(parse_name(j.out_name).projection for j in g.jobs)
        if g.jobs[0].expert != e or projections != sidecar.PROJECTIONS:
            raise ConvertError(
                f"`layout=planar`: unit {key}: expert {g.jobs[0].expert} ({', '.join(j.out_name for j in g.jobs)}) "
                f"is not the gate, up and down record of expert {e}"
            )


def _group(jobs: list[TensorJob]) -> list[tuple[TensorJob, ...]]:
    """Non-expert tensors first (natural name order), then experts by (base, index), gate/up/down inside."""
    singles = sorted((j for j in jobs if j.expert is None), key=lambda j: natural_key(j.out_name))
    experts: dict[tuple[str, int], list[TensorJob]] = defaultdict(list)
    for j in jobs:
        if j.expert is not None:
            experts[(j.expert_base or "", j.expert)].append(j)
    groups = [(j,) for j in singles]
    for key in sorted(experts, key=lambda k: (natural_key(k[0]), k[1])):
        groups.append(tuple(sorted(experts[key], key=lambda j: rc.expert_of(j.out_name).order)))
    return groups


def _metadata(groups: list[OutputGroup], *, planar: bool) -> dict[str, str]:
    """``colitools.shapes`` (every quantized weight with a scale, incl. mxfp4 ``weight_packed``), ``colibri.fmt``
    stamps when any, ``colitools.layout`` for planar shards (§3, §4). Compact JSON, sorted keys."""
    shapes: dict[str, list[int]] = {}
    stamps: dict[str, str] = {}
    for g in groups:
        for j in g.jobs:
            if j.target.is_float or g.stacks:  # a merged blob's / a fused stack's geometry is the config's
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


def outputs_at(units: list[Unit], i: int, window_end: int, done: int, workers: int, streamed: bool) -> int:
    """Output bytes on disk while unit ``i`` converts, units ``i..window_end`` in flight and ``done`` bytes
    published before them. ``streamed`` (``convert --stream-upload``, converters/stream_upload.py): a unit's
    files leave once uploaded, so only unit ``i - 1`` (being uploaded while unit ``i``'s shards download) is
    still there, and one worker writes unit ``i`` only after it is gone; with several, the units in flight."""
    flight = sum(u.out_bytes for u in units[i : window_end + 1])
    if not streamed:
        return done + flight
    return max(units[i - 1].out_bytes if i else 0, flight) if workers <= 1 else flight
