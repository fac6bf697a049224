"""Size budgets (``convert --target-size`` / ``--target-bpw``, docs/FORMATS.md §12).

Before any work: every tensor whose format the budget chooses (rules 3-6 of §6: routed experts, other 2-D
weights, embeddings / head, MTP) is measured in each candidate format its target's engine reads (the recipe
asked once per option, so a candidate that would fall back or repeat another is not offered); the squared error
is what the conversion records for it (``unit_writer.encode_measured``: its source read, encoded with
the recipe's quantizer mode, decoded, ``error_stats.tensor_error``). ``converters/allocation.py`` then picks one
option per tensor (per group where the target's engine needs one format for all routed experts), and the recipe
carries the choice (``Recipe.budget``): the planner asks ``Recipe.tensor_option`` for every tensor.

The measurements are cached in the output folder (``CACHE_FILE``, keyed by the source shards' identities, the
quantizer mode, the target, the layout and the candidates), so a resume or another budget does not measure
again; ``--dry-run`` reads the cache and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from colitools.converters import allocation
from colitools.converters import recipe as rc
from colitools.converters.inventory import Inventory
from colitools.converters.plan_record import PLAN_FILE
from colitools.converters.planner import (
    ConversionPlan,
    TensorJob,
    is_dropped,
    plan_conversion,
    source_role,
    written_jobs,
)
from colitools.converters.sources import Source
from colitools.converters.unit_writer import ShardReader, _source_values, encode_measured
from colitools.formats import planar_sidecar as sidecar
from colitools.formats.atomic import write_json_atomic
from colitools.formats.dtypes import itemsize, numpy_dtype
from colitools.formats.errors import ConvertError, ParameterError, TargetRefused
from colitools.formats.filenames import DOWNLOAD_DIR, LOCK_FILE, MANIFEST_FILE
from colitools.formats.format_names import NATIVE_OPTION, RECIPE_FORMAT_NAMES
from colitools.formats.jsonfile import load_json_object
from colitools.formats.layouts import PLANAR, QPACK
from colitools.formats.registry import parse_format_option
from colitools.formats.targets.base import EXPERT_GRANULARITIES

CACHE_FILE = ".colitools-budget.json"  # the measurements, in the output folder
CACHE_VERSION = 1
# the candidates of a target that reads any format (§10): colibri.c's writable formats and mxfp4 (I % 32 == 0,
# else it falls back and is not offered); a named target offers what its loader reads for the role
CANDIDATES = ("int8-row", "int4-g32", "int4-g64", "int4-g128", "int4-row", "int3-g64", "int2-row", "mxfp4")
# importance per role (docs/FORMATS.md §12): the mean KLD one unit of squared error costs in that role, relative
# to the routed experts', measured by degrading one role at a time to int3-g64 (the others int8-row) on five
# oracle families (``bench/budget.py --importance int3-g64 --seed 1``; geometric means 12.6 and 14.1, per family
# 3-25x and 5-30x, bench/README.md). MTP layers are not run by the runtime, so not measured: the experts' 1.
ROLE_IMPORTANCE = {rc.Role.EXPERT: 1.0, rc.Role.DENSE: 12.0, rc.Role.EMBED: 14.0, rc.Role.MTP: 1.0}
USAGE_FLOOR = 0.05  # the weight of a routed expert its history never selected (never 0)
GROUP_EXPERTS = "routed experts"  # the one item of a target that needs one format for all routed experts


@dataclass
class Measured:
    """One written tensor's measurements: ``options[option] = (bytes, sse)``; ``base`` its bytes in the
    recipe's own option (what the budget's fixed cost subtracts)."""

    role: rc.Role
    layer: str
    n: int
    base: int
    options: dict[str, tuple[int, float]] = field(default_factory=dict)
    expert: int | None = None
    layer_index: int | None = None
    source: str = ""  # the source tensor it is cut from (a stack's jobs share it)
    fresh: int = 0  # 1: measured by this run, 0: read from the cache


def role_candidates(recipe: rc.Recipe, role: rc.Role) -> tuple[str, ...]:
    """The options the budget may give a tensor of ``role``: ``CANDIDATES``, or what the target reads for the
    role, less ``native``, passthrough formats and formats its engine has no reader for."""
    allowed = recipe.target.allowed(rc.option_name(role))
    pool = CANDIDATES if allowed is None else tuple(a for a in allowed if a != NATIVE_OPTION)
    if recipe.layout == QPACK.option and role is rc.Role.EXPERT:  # a QPACK container holds affine experts only
        pool = tuple(o for o in RECIPE_FORMAT_NAMES if (c := parse_format_option(o).fmt) and not c.pairs)
    engine, out = recipe.target.engine_formats, []
    for option in pool:
        fmt = parse_format_option(option).fmt
        if fmt.quantized and (not fmt.writable or (engine is not None and fmt.name not in engine)):
            continue
        out.append(option)
    return tuple(out)


def expert_grain(recipe: rc.Recipe) -> str:
    """Where the target's engine lets the routed experts' formats differ (``Target.expert_granularity``, read in
    its loader: ``tensor``, ``expert``, ``layer`` or ``uniform``): the budget chooses one format per such group."""
    grain = recipe.target.expert_granularity
    if grain not in EXPERT_GRANULARITIES:  # pragma: no cover - a target module's typo
        raise ValueError(f"target {recipe.target.name}: expert_granularity {grain!r}")
    return grain


# ------------------------------------------------------------------------------------------ measurement
def _offered(src, role: rc.Role, recipe: rc.Recipe, inventory: Inventory) -> list[tuple[str, TensorJob, dict]]:
    """``src``'s jobs (recipe name, job in the recipe's option) and, per job, the candidate option -> job in it:
    a candidate that falls back, writes what an earlier one writes, or (a routed expert, ``--layout planar``)
    that the planar sidecar cannot hold is left out."""
    base = written_jobs(src, role, recipe, inventory)
    per_option = {}
    for option in role_candidates(recipe, role):
        try:
            per_option[option] = written_jobs(src, role, recipe.with_option(role, option), inventory)
        except TargetRefused:  # its loader cannot read this tensor so: not a candidate
            continue
    out = []
    planar = recipe.layout == PLANAR.option and role is rc.Role.EXPERT  # the sidecar holds int4-row / -g64 only
    for k, (name, job) in enumerate(base):
        offered, seen = {}, set()
        for option, jobs in per_option.items():
            t = jobs[k][1].target
            key = (t.fmt, t.gs, t.quantizer, t.native)
            if t.fallback is not None or key in seen or (planar and not t.format_class.planar_eligible(job.I, t.gs)):
                continue
            seen.add(key)
            offered[option] = jobs[k][1]
        out.append((name, job, offered))
    return out


def written_bytes(job: TensorJob, planar: bool) -> int:
    """The tensor data ``job`` writes: its weight and scale, or (``planar``: a routed expert in the planar
    sidecar) its codes and the sidecar's F32 scale per (row, 64-block) (``OutputGroup.sidecar_entries``)."""
    if not planar:
        return job.out_bytes
    _, dtype, shape = job.weight_entry
    return itemsize(dtype) * math.prod(shape) + 4 * math.prod(sidecar.scale_shape(job.O, job.I))


def _measure_job(
    offered: dict[str, TensorJob], reader, block, planar: bool
) -> dict[str, tuple[int, float]]:
    """Each candidate's bytes and squared error, the source read once (as the unit writer reads it). A float
    tensor of more than ``SAMPLE_ELEMS`` elements is read and measured on ``sample_blocks`` of its rows only, its
    error scaled by ``O / rows measured``: the formats' scales are per row or per group of a row, so each row's
    error is its own and the estimate is unbiased."""
    first = next(iter(offered.values()))
    sampled = _sampled_rows(first, reader)
    values, scale = (sampled, None) if sampled is not None else _source_values(first, reader, block)
    out = {}
    for option, job in offered.items():
        if sampled is not None:
            job = replace(job, O=values.shape[0], shape=values.shape, fused_rows=None, fused_pick=None)
        codes, scales, err = encode_measured(job, values, scale, block)
        sse = 0.0 if err is None else err.sse * (first.O / job.O if sampled is not None else 1)
        out[option] = (written_bytes(offered[option], planar), sse)
        del codes, scales
    return out


SAMPLE_ELEMS = 1 << 19  # a float tensor larger than this is measured on a row sample of about this many elements
SAMPLE_BLOCKS = 4  # in this many runs of rows, evenly spread (one read or Range request each)


def sample_blocks(job: TensorJob) -> list[tuple[int, int]] | None:
    """The row runs ``[a, b)`` a tensor is measured on: None (all its rows) but for a float 2-D tensor (no FP8
    grid, not natively quantized, rows as stored) of more than ``SAMPLE_ELEMS`` elements."""
    src = job.source
    if src.quant is not None or src.scale is not None or job.fused_pick is not None or len(job.shape) != 2:
        return None
    per = max(1, SAMPLE_ELEMS // job.I // SAMPLE_BLOCKS)
    if job.O * job.I <= SAMPLE_ELEMS or per * SAMPLE_BLOCKS >= job.O:
        return None
    return [((k * job.O) // SAMPLE_BLOCKS, (k * job.O) // SAMPLE_BLOCKS + per) for k in range(SAMPLE_BLOCKS)]


def _sampled_rows(job: TensorJob, reader):
    """``job``'s source rows of ``sample_blocks`` (one positional read or Range request each), or None."""
    blocks = sample_blocks(job)
    if blocks is None:
        return None
    if job.fused_rows is not None:  # rows [r0, r1) of expert e's slab of a stack
        e, r0, _ = job.fused_rows
        runs = [reader.read_slab_rows(job.source, e, r0 + a, r0 + b) for a, b in blocks]
    else:
        runs = [reader.read_rows(job.source, a, b) for a, b in blocks]
    return np.ascontiguousarray(np.concatenate(runs))


class RangeReader:
    """The reads the measurement makes of a Hub shard that is not on this machine (``ShardReader``'s ``read``,
    ``read_rows``, ``read_slab_rows``), each one HTTP Range request (``HubSource.read_range``)."""

    def __init__(self, source: Source):
        self.source = source
        self._ranges: dict[str, dict[str, tuple[int, int]]] = {}
        self._lock = threading.Lock()  # the measuring threads share it: each header is read once

    def _begin(self, shard: str, name: str, dtype: str, shape: tuple[int, ...]) -> int:
        with self._lock:
            if shard not in self._ranges:
                self._ranges[shard] = self.source.tensor_ranges(shard)
        begin, end = self._ranges[shard].get(name, (0, -1))
        if end - begin != itemsize(dtype) * math.prod(shape):
            raise ConvertError(f"tensor {name}: shard {shard} on the Hub does not hold it as planned")
        return begin

    def read(self, shard: str, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        begin = self._begin(shard, name, dtype, shape)
        data = self.source.read_range(shard, begin, itemsize(dtype) * math.prod(shape))
        return np.frombuffer(bytearray(data), numpy_dtype(dtype)).reshape(shape)

    def read_slab_rows(self, part, e: int, r0: int, r1: int) -> np.ndarray:
        return self._rows(part, part.shape[1] * e + r0, part.shape[1] * e + r1, part.shape[2:])

    def read_rows(self, part, r0: int, r1: int) -> np.ndarray:
        return self._rows(part, r0, r1, part.shape[1:])

    def _rows(self, part, r0: int, r1: int, rest: tuple[int, ...]) -> np.ndarray:
        row = itemsize(part.dtype) * math.prod(rest)
        begin = self._begin(part.shard, part.name, part.dtype, part.shape)
        data = self.source.read_range(part.shard, begin + r0 * row, (r1 - r0) * row)
        return np.frombuffer(bytearray(data), numpy_dtype(part.dtype)).reshape(r1 - r0, *rest)


class _Readers:
    """A ``ShardReader`` for the shards on this machine, a ``RangeReader`` for the others (a Hub source)."""

    def __init__(self, local: dict[str, Path], source: Source):
        self.local, self.shards = ShardReader(local), set(local)
        self.remote = RangeReader(source)

    def _for(self, shard: str):
        return self.local if shard in self.shards else self.remote

    def read(self, shard: str, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        return self._for(shard).read(shard, name, dtype, shape)

    def read_slab_rows(self, part, e: int, r0: int, r1: int) -> np.ndarray:
        return self._for(part.shard).read_slab_rows(part, e, r0, r1)

    def read_rows(self, part, r0: int, r1: int) -> np.ndarray:
        return self._for(part.shard).read_rows(part, r0, r1)

    def close(self) -> None:
        self.local.close()


def _budget_sources(inventory: Inventory, recipe: rc.Recipe) -> list[tuple[str, Any, rc.Role]]:
    """``(name, source tensor, role)`` of every source tensor of a role the budget chooses for (rules 3-6)."""
    nhl, out = inventory.num_hidden_layers, []
    for name, src in inventory.tensors.items():
        role = source_role(name, src, nhl)
        if role in rc.BUDGET_ROLES and not is_dropped(role, recipe):
            out.append((name, src, role))
    return out


MEASURE_THREADS = 8  # source tensors measured at once (kernels release the GIL; Range requests wait on the network)


def measure(
    source: Source, inventory: Inventory, recipe: rc.Recipe, cache: dict | None, bar: Callable[[int], Any]
) -> tuple[dict[str, Measured], int]:
    """Every budgeted tensor's ``Measured`` (two candidates or more), from ``cache`` (the file's ``tensors``)
    where it has the tensor, else measured; and how many were measured. ``MEASURE_THREADS`` source tensors at a
    time, at most twice as many ahead, results taken in order (each tensor's figures depend on it alone). A shard
    not on this machine (a Hub source) is read by Range requests, its large tensors on their row samples only;
    ParameterError (one line) for one that would have to be read whole (FP8, natively quantized)."""
    sources = _budget_sources(inventory, recipe)
    paths = _local_shards(source, {s for _, src, _ in sources for s in src.shards})
    reader = _Readers(paths, source)
    block = inventory.fp8.block if inventory.fp8 else None
    where = (reader, paths, block, recipe.layout == PLANAR.option)

    def one(src, role) -> list[tuple[str, Measured]]:
        return [
            (rname, _measured(rname, role, job, offered, (cache or {}).get(rname), where))
            for rname, job, offered in _offered(src, role, recipe, inventory)
            if len(offered) >= 2
        ]

    out: dict[str, Measured] = {}
    total = sum(src.nbytes + src.scale_nbytes for _, src, _ in sources)
    with bar(total) as progress, ThreadPoolExecutor(MEASURE_THREADS, "measure", initializer=_one_kernel_thread) as pool:
        pending: deque = deque()
        try:
            for _, src, role in sources:
                pending.append((pool.submit(one, src, role), src.nbytes + src.scale_nbytes))
                while len(pending) > 2 * MEASURE_THREADS or (pending and pending[0][0].done()):
                    _collect(pending.popleft(), out, progress)
            while pending:
                _collect(pending.popleft(), out, progress)
        finally:
            for fut, _ in pending:
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            reader.close()
    return out, sum(m.fresh for m in out.values())


def _collect(item, out: dict[str, Measured], progress) -> None:
    future, nbytes = item
    out.update(future.result())
    progress.update(nbytes)


def _one_kernel_thread() -> None:
    """A measuring thread's kernel calls run on it alone (the threads measure tensors side by side)."""
    from colitools.formats import kernels

    kernels.set_threads(1, this_thread=True)


def _measured(rname: str, role: rc.Role, job: TensorJob, offered: dict, known: dict | None, where) -> Measured:
    """One tensor's ``Measured``: from its cache entry ``known`` when it has the same candidates, else measured
    (``where``: the reader, its shards' paths, the FP8 block, whether the layout is planar)."""
    reader, paths, block, planar = where
    planar = planar and role is rc.Role.EXPERT  # a routed expert in the planar sidecar
    layer = rc.layer_of(rname)
    m = Measured(role, layer.name if layer else "globals", job.O * job.I, written_bytes(job, planar),
                 expert=job.expert, layer_index=layer.index if layer else None, source=job.source.name)  # fmt: skip
    if known is not None and set(known) == set(offered):
        m.options = {k: (int(v[0]), float(v[1])) for k, v in known.items()}
        return m
    remote = sorted(s for s in job.shards if s not in paths)
    if remote and sample_blocks(job) is None and job.O * job.I > SAMPLE_ELEMS:
        _remote_refused(remote[0], job)
    m.options, m.fresh = _measure_job(offered, reader, block, planar), 1
    return m


def _local_shards(source: Source, shards: set[str]) -> dict[str, Path]:
    """The shards on this machine (``Source.local_copy``: a local folder, the Hugging Face cache, a finished
    download; never downloads); the measurement reads the others by Range requests."""
    paths = {}
    for shard in sorted(shards):
        local = source.local_copy(shard)
        if local is not None:
            paths[shard] = local
    return paths


def _remote_refused(shard: str, job: TensorJob) -> None:
    src = job.source
    what = (
        f"natively quantized ({src.quant.kind})" if src.quant is not None
        else "FP8 block-scaled" if src.scale is not None
        else "a stack sliced across its rows"
    )  # fmt: skip
    raise ParameterError(
        f"`target_size` / `target_bpw` measure a Hub source from samples of its float tensors' rows; tensor "
        f"{src.name} ({shard}) is {what} and would be read whole: download the source first (or have it in the "
        "Hugging Face cache), or convert without a budget"
    )


# ------------------------------------------------------------------------------------------------ cache
def cache_key(source: Source, inventory: Inventory, recipe: rc.Recipe) -> str:
    """What the measurements depend on: the source shards' identities, the recipe without its budget (target,
    layout, quantizer, options), the candidates per role."""
    files = source.files()
    key = {
        "version": CACHE_VERSION,
        "source": source.describe(),
        "shards": {s: files[s].identity() for s in inventory.shards},
        "recipe": replace(recipe, budget=None).as_dict(),
        "quantizer_mode": recipe.quantizer_mode,
        "candidates": {r.value: role_candidates(recipe, r) for r in rc.BUDGET_ROLES},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_cache(out: Path | None, key: str) -> dict | None:
    """The cached measurements of ``key`` (tensor -> option -> [bytes, sse]), None when there are none."""
    path = out / CACHE_FILE if out is not None else None
    if path is None or not path.is_file():
        return None
    try:
        data = load_json_object(path)
    except Exception:  # noqa: BLE001 - a damaged cache is measured again, never trusted
        return None
    return data.get("tensors") if data.get("key") == key and isinstance(data.get("tensors"), dict) else None


def write_cache(out: Path, key: str, measured: dict[str, Measured]) -> None:
    """The measurements into ``out`` (created), atomically; not into a folder holding anything but a colitools
    conversion's files."""
    if out.exists() and not (out / MANIFEST_FILE).exists():
        ours = {LOCK_FILE, DOWNLOAD_DIR, PLAN_FILE, CACHE_FILE}
        if any(p.name not in ours for p in out.iterdir()):
            return  # a foreign folder: the ledger refuses it next, nothing of ours is left in it
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: {k: list(v) for k, v in m.options.items()} for name, m in measured.items()}
    write_json_atomic(out / CACHE_FILE, {"version": CACHE_VERSION, "key": key, "tensors": tensors})


# ------------------------------------------------------------------------------------------ importances
def usage_weights(path: str | None, inventory: Inventory) -> tuple[dict[tuple[int, int], float], str | None]:
    """``(layer, expert) -> share of its layer's selections x the layer's expert count`` (at least
    ``USAGE_FLOOR``) from a routing history (``.coli_usage`` text or IKU1, formats/usage.py, or a ``ROUTE_TRACE``
    stream, formats/route_trace.py: each line's experts one selection each), and its sha256; an expert of a layer
    without records is absent (weight 1)."""
    if path is None:
        return {}, None
    counts, n_experts = _selections(path, inventory.config)
    per_layer: dict[int, int] = defaultdict(int)
    for (layer, _), n in counts.items():
        per_layer[layer] += n
    weights = {}
    for layer, total in per_layer.items():
        for e in range(n_experts):
            weights[(layer, e)] = max(USAGE_FLOOR, counts.get((layer, e), 0) / total * n_experts)
    return weights, hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _selections(path: str, config: dict) -> tuple[dict[tuple[int, int], int], int]:
    """``(layer, expert) -> selections`` of a usage history or a route trace (told by its first record: a
    trace's has ``expert:gate`` fields), and the experts per layer."""
    from colitools.formats.model_config import model_type, routed_expert_count
    from colitools.formats.route_trace import trace_positions
    from colitools.formats.usage import read_usage

    with open(path, "rb") as f:
        head = f.read(4096).split(b"\n")
    if not any(len(line.split()) >= 4 and b":" in line.split()[3] for line in head):
        history = read_usage(path, engine=model_type(config), explicit=True)
        return history.counts, history.n_experts
    n_experts, counts = routed_expert_count(config) or 0, defaultdict(int)
    for layers in trace_positions(path).values():
        for layer, ids in layers.items():
            for e in ids:
                if 0 <= e < n_experts:
                    counts[(layer, e)] += 1
    return dict(counts), n_experts


def importance(m: Measured, usage: dict[tuple[int, int], float]) -> float:
    """``imp_t``: the role's default, times a routed expert's usage weight."""
    imp = ROLE_IMPORTANCE[m.role]
    if m.role is rc.Role.EXPERT and m.expert is not None and m.layer_index is not None:
        imp *= usage.get((m.layer_index, m.expert), 1.0)
    return imp


# ------------------------------------------------------------------------------------------- allocation
def _expert_groups(measured: dict[str, Measured], grain: str) -> list[list[str]]:
    """The routed experts' tensors grouped as the engine needs one format for each group (``expert_grain``):
    none (``tensor``: each its own item), per expert, per layer, or all of them (``uniform``)."""
    experts = [n for n in sorted(measured) if measured[n].role is rc.Role.EXPERT]
    if grain == "tensor" or not experts:
        return []
    if grain == "uniform":
        return [experts]
    by: dict[tuple, list[str]] = defaultdict(list)
    for n in experts:
        m = measured[n]
        by[(m.layer_index if m.layer_index is not None else -1, m.layer, m.expert if grain == "expert" else -1)].append(n)
    return [by[k] for k in sorted(by)]


def _items(
    measured: dict[str, Measured], usage: dict, grain: str
) -> tuple[list[allocation.Item], list[list[str]], list[list[str]]]:
    """The solver's items: the routed experts grouped at the engine's grain (``_expert_groups``), then one item
    per other tensor (a target that groups its experts also writes the tensors cut from one source stack, such
    as a stacked shared expert, as one), the tensor names of each, and the option names of each item's
    options."""
    names = sorted(measured)
    grouped = grain != "tensor"
    groups = _expert_groups(measured, grain)
    in_groups = {n for g in groups for n in g}
    by_source: dict[str, list[str]] = defaultdict(list)
    for n in names:
        if n not in in_groups:
            by_source[measured[n].source if grouped else n].append(n)
    groups += sorted(by_source.values())
    items, options = [], []
    for g in groups:
        common = [o for o in measured[g[0]].options if all(o in measured[n].options for n in g)]
        opts = tuple(
            (sum(measured[n].options[o][0] for n in g),
             sum(importance(measured[n], usage) * measured[n].options[o][1] for n in g))
            for o in common
        )  # fmt: skip
        items.append(allocation.Item(_item_key(g, measured, grain, g[0] in in_groups), opts))
        options.append(common)
    return items, groups, options


def _item_key(g: list[str], measured: dict[str, Measured], grain: str, experts: bool) -> str:
    """An item's name in messages: its tensor, the source stack it is cut from, or its routed experts."""
    if not experts:
        return g[0] if len(g) == 1 else measured[g[0]].source
    m = measured[g[0]]
    where = {"layer": f" of {m.layer}", "expert": f" {m.layer}.{m.expert}"}.get(grain, "")
    return GROUP_EXPERTS + where


def budget_bytes(recipe: rc.Recipe, base: ConversionPlan) -> int:
    """The budget in bytes of tensor data: ``target_size``, or ``target_bpw`` x the elements of every written
    float weight (the base plan's tensors but copied non-float ones) / 8."""
    b = recipe.budget
    if b.size is not None:
        return b.size
    elements = sum(math.prod(j.shape) for u in base.units for j in u.jobs if j.role is not rc.Role.COPY)
    return int(b.bpw * elements / 8)


def data_bytes(plan: ConversionPlan) -> int:
    """The output's tensor data bytes (``metadata.total_size``, the planar sidecar's too)."""
    return sum(f.data_size for f in plan.files)


def allocate(
    source: Source, inventory: Inventory, recipe: rc.Recipe, *, out: Path | None, dry_run: bool,
    usage: str | None, bar: Callable[[int], Any],
) -> tuple[ConversionPlan, dict]:  # fmt: skip
    """Measure (or read the cache), allocate and plan: the conversion's plan under ``recipe.budget``, and the
    allocation's report (``ConversionPlan.budget``)."""
    started = time.monotonic()
    weights, usage_sha = usage_weights(usage, inventory)
    recipe = replace(recipe, budget=replace(recipe.budget, usage=usage_sha))
    base = plan_conversion(inventory, recipe)
    key = cache_key(source, inventory, recipe)
    measured, fresh = measure(source, inventory, recipe, read_cache(out, key), bar)
    if fresh and out is not None and not dry_run:
        write_cache(out, key, measured)
    measure_s = time.monotonic() - started
    items, groups, options = _items(measured, weights, expert_grain(recipe))
    fixed = data_bytes(base) - sum(measured[n].base for g in groups for n in g)
    target = budget_bytes(recipe, base)
    b = recipe.budget
    label = f"`target_size={b.size}`" if b.size is not None else f"`target_bpw={b.bpw:g}`"
    sol = allocation.solve(items, fixed, target, label)
    chosen = {n: options[i][k] for i, k in enumerate(sol.choice) for n in groups[i]}
    recipe = _allocated_recipe(recipe, chosen, measured, expert_grain(recipe))
    plan = plan_conversion(inventory, recipe)
    achieved = data_bytes(plan)
    if achieved > target:  # pragma: no cover - the byte arithmetic of the measurement is the planner's own
        raise ParameterError(f"`target_size`: the allocation writes {achieved} bytes, over the {target} asked")
    report = _report(recipe, plan, measured, weights, chosen, sol, target, achieved)
    report["measurement"] = {"tensors": len(measured), "measured": fresh, "cached": len(measured) - fresh,
                             "seconds": round(measure_s, 3)}  # fmt: skip
    plan.budget = report
    return plan, report


def _allocated_recipe(recipe: rc.Recipe, chosen: dict[str, str], measured: dict[str, Measured],
                      grain: str) -> rc.Recipe:  # fmt: skip
    """The recipe that writes ``chosen``: per tensor in ``Budget.formats``, and the one option of a target whose
    engine needs one format for all routed experts as its ``experts``."""
    experts = {o for n, o in chosen.items() if measured[n].role is rc.Role.EXPERT}
    if grain == "uniform" and experts:
        recipe = recipe.with_option(rc.Role.EXPERT, experts.pop())
        chosen = {n: o for n, o in chosen.items() if measured[n].role is not rc.Role.EXPERT}
    return replace(recipe, budget=replace(recipe.budget, formats=tuple(sorted(chosen.items()))))


def _report(recipe: rc.Recipe, plan: ConversionPlan, measured: dict[str, Measured], usage: dict,
            chosen: dict[str, str], sol: allocation.Solution, target: int, achieved: int) -> dict:  # fmt: skip
    """The allocation as ``--dry-run`` prints it and ``colitools.json`` records it: the budget, the sizes, the
    objective, per role and layer (formats, bytes, bits per weight, predicted squared error) and per tensor."""
    rows: dict[tuple[str, str], dict] = {}
    tensors = {}
    for name in sorted(chosen):
        m, option = measured[name], chosen[name]
        nbytes, sse = m.options[option]
        imp = importance(m, usage)
        tensors[name] = {"format": option, "bytes": nbytes, "sse": sse, "importance": imp}
        row = rows.setdefault((m.role.value, m.layer), {"role": m.role.value, "layer": m.layer, "formats": {},
                                                         "tensors": 0, "bytes": 0, "elements": 0, "sse": 0.0})
        row["formats"][option] = row["formats"].get(option, 0) + 1
        row["tensors"] += 1
        row["bytes"] += nbytes
        row["elements"] += m.n
        row["sse"] += sse
    for row in rows.values():
        row["bits_per_weight"] = round(8 * row["bytes"] / row["elements"], 4) if row["elements"] else 0.0
    b = recipe.budget
    return {
        **({"target_size": b.size} if b.size is not None else {"target_bpw": b.bpw}),
        "budget_bytes": target,
        "achieved_bytes": achieved,
        "smallest_bytes": sol.smallest,
        "largest_bytes": sol.largest,
        "objective": rc.BUDGET_OBJECTIVE,
        "predicted_error": sol.cost,
        "importance": {r.value: v for r, v in ROLE_IMPORTANCE.items()},
        "usage_sha256": b.usage,
        "per_role_layer": sorted(rows.values(), key=lambda r: (r["role"], _layer_order(r["layer"]))),
        "tensors": tensors,
    }


def _layer_order(layer: str) -> tuple[int, str, int]:
    head, _, tail = layer.rpartition(".")
    return (0, layer, 0) if not tail.isdigit() else (1, head, int(tail))


def report_lines(report: dict) -> list[str]:
    """The allocation in text (``--dry-run`` and the summary): the budget line, then one line per role and
    layer."""
    from colitools.converters.diskfloor import gb

    m = report.get("measurement", {})
    lines = [
        f"budget: {gb(report['achieved_bytes'])} of {gb(report['budget_bytes'])} "
        f"({report['achieved_bytes']} of {report['budget_bytes']} bytes; achievable "
        f"{report['smallest_bytes']}..{report['largest_bytes']}), predicted weighted squared error "
        f"{report['predicted_error']:.6g}; measured {m.get('measured', 0)} tensors, {m.get('cached', 0)} cached, "
        f"{m.get('seconds', 0):.1f} s"
    ]
    for row in report["per_role_layer"]:
        fmts = ", ".join(f"{k} x{v}" for k, v in sorted(row["formats"].items()))
        lines.append(
            f"  {row['role']:<7} {row['layer']:<24} {fmts:<40} {gb(row['bytes']):>10} "
            f"{row['bits_per_weight']:.3f} bpw  sse {row['sse']:.4g}"
        )
    return lines
