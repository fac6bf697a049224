"""``convert(source, outdir, options)``: the whole pipeline of ``colitools convert`` (docs/INTERNALS.md, "Converters").

source -> inventory (headers, weight_map, config; validated) -> recipe + plan (every tensor classified, every
byte counted) -> for each pending unit in order: disk floor, source shards on disk (downloads resume; a Hub
source's shards download ahead on a background thread while units convert, ``prefetch.py``), stream
tensors through the writer, atomic publish, ledger record, release of source shards no pending unit needs ->
index, config and tokenizer files, manifest marked complete.

Byte identity: the shards, ``model.safetensors.index.json``, ``config.json`` and the copied files depend only on
the source and the recipe, whatever the interruptions, resumes or ``--workers``. ``colitools.json`` too, except
its ``run`` section (times and counters of the last run).

Parallelism: with ``workers > 1`` units are converted in worker processes (``spawn``); the main process keeps
downloads, the disk floor, the ledger and shard release, so each of those has one owner.

Test-only knob (see ``unit_writer`` for the others): ``COLITOOLS_TEST_SLOW_UNIT_SECONDS`` sleeps after every
recorded unit, giving a test a window "between units" to SIGKILL the process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, NamedTuple

from colitools.converters import budget, output, parts, plan_record, reuse
from colitools.converters.diskfloor import DiskFloor
from colitools.converters.inventory import build_inventory, read_source_headers
from colitools.converters.ledger import Ledger, ResumeState, remove_temporaries
from colitools.converters.options import ConvertOptions, ConvertSummary
from colitools.converters.planner import ConversionPlan, Unit, plan_conversion, say_native_decoded
from colitools.converters.prefetch import peak_disk_ahead, start_prefetch
from colitools.converters.recipe import Role, requantized_warning
from colitools.converters.source_identity import SourceIdentities
from colitools.converters.sources import LocalFolderSource, Source, SourceFile, open_source
from colitools.converters.unit_writer import PendingUnit, UnitResult, convert_unit, encode_work, start_unit
from colitools.formats import kernels
from colitools.formats.error_stats import ErrorStats
from colitools.formats.errors import ConvertError, ParameterError
from colitools.formats.families import RUNNABLE_MODEL_TYPES
from colitools.formats.filenames import CONFIG_FILE, DOWNLOAD_DIR, INDEX_FILE, LOCK_FILE
from colitools.formats.lockfile import held_lock
from colitools.formats.model_config import model_type

WORKDIR = DOWNLOAD_DIR
LOCKFILE = LOCK_FILE
SLOW_UNIT_ENV = "COLITOOLS_TEST_SLOW_UNIT_SECONDS"


def load_plan(source: Source, options: ConvertOptions, out: Path | None = None) -> ConversionPlan:
    """Read the source's config, weight map and shard headers, validate them and plan the conversion; under a
    size budget, measure the source first (its cache in ``out``, converters/budget.py)."""
    config = source.read_json(CONFIG_FILE)
    weight_map = source.weight_map()
    shards = sorted(set(weight_map.values()))
    headers = read_source_headers(source, shards)
    files = source.files()
    inventory = build_inventory(headers, weight_map, config, {s: files[s].size for s in shards})
    recipe, choice = options.source_recipe(inventory)  # experts: native where a format holds the source's
    # a file the target's engine reads beside config.json (deepseek_v41: dsv41_engram.json), before any work
    recipe.target.check_source(config)
    recipe.target.check_side_files(config, lambda name: source.read_json(name) if name in files else None)
    if recipe.budget is not None:
        plan, _ = budget.allocate(
            source, inventory, recipe, out=out, dry_run=options.dry_run, usage=options.usage,
            bar=lambda total: _bar(options, total, "measure"),
        )  # fmt: skip
    else:
        plan = plan_conversion(inventory, recipe)
    plan.experts_choice = choice
    return plan


class Planned(NamedTuple):
    """A conversion's plan, its source shards' identities now, and its record's key (``plan_record``)."""

    plan: ConversionPlan
    identities: SourceIdentities
    key: str
    recorded: bool  # the plan is the one ``out`` recorded (nothing to record again)


def plan_for(src: Source, out: Path, options: ConvertOptions) -> Planned:
    """The plan of converting ``src`` into ``out``: the one a conversion in ``out`` recorded when its key still
    matches the sources and the recipe (a resume does not plan again), else ``load_plan``."""
    key = plan_record.plan_key(src, options.recipe().fingerprint())
    plan = plan_record.load_recorded(out, key)
    recorded = plan is not None
    if plan is None:
        plan = load_plan(src, options, out)
    else:
        say_native_decoded(plan.fallbacks)  # the line planning prints, printed by every run alike
    return Planned(plan, source_identities(src, plan), key, recorded)


def convert(
    source: str | Source, outdir: str | os.PathLike[str], options: ConvertOptions | None = None
) -> ConvertSummary:
    """Convert ``source`` (a local folder or ``org/name`` Hub repo id, or an opened ``Source``) into ``outdir``.

    Resumable: rerun after any interruption and it continues, producing the same bytes. Raises ConvertError
    (one line naming the tensor / file / numbers) for bad input, before any output is published, and
    DiskFloorStop (exit code 3) when ``on_low_disk="stop"`` meets the floor."""
    options = options or ConvertOptions()
    started = time.monotonic()
    if options.workers < 1:
        raise ConvertError(f"`workers={options.workers}`: must be at least 1")
    options.recipe()  # bad options fail before anything is opened or fetched
    if options.upload_repo is not None and not options.dry_run:
        from colitools.converters.stream_upload import check_target

        check_target(options.upload_repo, options.token)  # a bad repo id, no token: before any work
    if isinstance(outdir, str) and not outdir:  # Path("") is ".": it would convert into the current folder
        raise ParameterError("`outdir`: an empty path; give the folder to convert into")
    out = Path(outdir).expanduser().resolve()
    output.check_output_path(out)
    spec = str(source) if not isinstance(source, Source) else None
    hint = (
        f"rerun `colitools convert {spec} {out}` with the same options to resume"
        if spec
        else "rerun to resume"
    )
    floor = DiskFloor(out, options.min_free_bytes, options.on_low_disk, resume_hint=hint)
    with contextlib.ExitStack() as stack:
        # a dry run must leave no trace: the few small files it fetches (config, index) go to a temporary folder
        work = (
            Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="colitools-dry-")))
            if options.dry_run
            else out / WORKDIR
        )
        src = source if isinstance(source, Source) else open_source(
            spec, options.revision, options.token, workdir=work, disk_check=floor.download_check,
            download_streams=options.download_streams,
        )  # fmt: skip
        if isinstance(src, LocalFolderSource):
            output.check_not_in_source(out, src.root)
        frozen = gc.get_freeze_count()
        try:
            summary = _convert(src, out, options, floor, started)
            if options.stream_upload and not options.dry_run:  # the final commit (converters/stream_upload.py)
                from colitools.converters.stream_upload import publish_streamed

                summary.upload = publish_streamed(out, options.upload_repo, options.token, progress=_hub_bars(options))
            return summary
        finally:
            if not frozen:  # what planning froze (``_gc_paused``) is collectable again
                gc.unfreeze()


def _convert(
    src: Source, out: Path, options: ConvertOptions, floor: DiskFloor, started: float
) -> ConvertSummary:
    planned, state, summary = plan_and_summary(src, out, options)
    if state.complete:
        summary.warnings = _without_identical_requantization(planned.plan, summary.warnings, state.kept.values())
    if options.dry_run or state.complete:
        return summary
    out.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        try:
            _run(src, planned, out, options, floor, summary)
        except BaseException:  # a clean stop (error, Ctrl-C, SIGTERM, disk floor): every writer has ended
            remove_temporaries(out)
            raise
    summary.disk_waits = floor.waits
    summary.wall_seconds = time.monotonic() - started
    return summary


def plan_and_summary(
    src: Source, out: Path, options: ConvertOptions
) -> tuple[Planned, ResumeState, ConvertSummary]:
    """Everything a conversion does before its first unit: the plan (``plan_for``), the ledger's checks
    (``Ledger.examine``) and the summary figures. The cyclic garbage collector is paused meanwhile: planning
    makes ~10 objects per tensor and frees none of them (it is not garbage), yet every collection of the
    older generations walked them all again: 40-70% of a 92k-tensor plan's time (bench/plan.py)."""
    with _gc_paused():
        planned = plan_for(src, out, options)
        # the same ledger checks as the real run, read-only: a dry run reports what a rerun would skip, and
        # refuses what it would refuse; a complete output needs nothing, not even the lock (a read-only output
        # is fine)
        section = parts.check_folder(out, options.part)  # --part K/N: never mixed with another part's units
        state = Ledger.examine(out, planned.plan, src.describe(), planned.identities, options.replace)
        if options.part is not None:
            state.complete = parts.is_finished(section, state.finished)
        summary = _summary(src, planned.plan, out, options, state)
        if options.dry_run:  # --replace: what would be copied from the previous output instead of encoded
            pending = [u for u in planned.plan.units if u.key not in set(state.finished)]
            summary.tensors_copied = reuse.planned_copies(out, state.donor, planned.plan, planned.identities, pending)
        return planned, state, summary


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector off meanwhile (unless it was off already), and what was made meanwhile
    left out of its later passes (``gc.freeze``: else the first collection after it walks every object of the
    plan once more, ~0.3 s on 92k tensors, and each older generation's again; the plan has no cycles, so
    reference counting frees it all the same). ``convert`` unfreezes at its end."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def _mine(plan: ConversionPlan, options: ConvertOptions) -> list[Unit]:
    """The units this run converts: the whole plan's, or with ``--part K/N`` its share (``parts.py``)."""
    return plan.units if options.part is None else options.part.units(plan.units)


def source_identities(src: Source, plan: ConversionPlan) -> SourceIdentities:
    """Source shard -> ``SourceFile.identity()`` now, and what each unit records of the shards it reads."""
    return SourceIdentities.of(src, plan.inventory.shards)


def run_warnings(plan: ConversionPlan) -> list[str]:
    """What the user should know before relying on ``colitools run`` for this checkpoint (the conversion itself
    is still valid): a model type the runtime has no family for, or a model without routed experts."""
    warnings = []
    kind = model_type(plan.inventory.config)
    if kind not in RUNNABLE_MODEL_TYPES:
        warnings.append(
            f"model_type {kind!r}: `colitools run` will not execute this model (it runs "
            f"{', '.join(RUNNABLE_MODEL_TYPES)}); the converted files are still valid"
        )
    if not any(j.role is Role.EXPERT for u in plan.units for j in u.jobs):
        warnings.append(
            "no routed experts (a dense model): `colitools run` will not execute it; the converted files are "
            "still valid"
        )
    requantized = _requantized_experts(plan)
    line = requantized_warning(plan.experts_choice, requantized) if plan.experts_choice else None
    return [*warnings, line] if line else warnings


def _requantized_jobs(plan: ConversionPlan) -> Iterator:
    """The jobs of natively quantized routed experts the plan decodes and quantizes again."""
    for job in (j for u in plan.units for j in u.jobs):
        q, t = job.source.quant, job.target
        if job.role is Role.EXPERT and q is not None and not t.native and t.format_class.quantized:
            yield job


def _requantized_experts(plan: ConversionPlan) -> dict[str, tuple[int, str]]:
    """Natively quantized routed experts the plan decodes and quantizes again: encoding label -> (tensors, the
    format written, the first one's)."""
    out: dict[str, tuple[int, str]] = {}
    for job in _requantized_jobs(plan):
        label = job.source.quant.encoding.label
        n, written = out.get(label, (0, job.target.label))
        out[label] = (n + 1, written)
    return out


def _without_identical_requantization(
    plan: ConversionPlan, warnings: list[str], units: Iterable[Mapping[str, Any]]
) -> list[str]:
    """``warnings`` without the one that routed experts are quantized a second time when every one of them was
    written with its source values unchanged: each one's recorded error (``units``: the ledger's unit records)
    is zero (``--target kimi_k3``'s MXFP4 experts written as mxfp4). A tensor without a record keeps it."""
    line = requantized_warning(plan.experts_choice, _requantized_experts(plan)) if plan.experts_choice else None
    if line is None or line not in warnings:
        return warnings
    errors = {name: e for u in units for name, e in (u.get("errors") or {}).items()}
    jobs = list(_requantized_jobs(plan))
    if all(job.out_name in errors and ErrorStats(*errors[job.out_name]).sse == 0.0 for job in jobs):
        return [w for w in warnings if w != line]
    return warnings


def _summary(src: Source, plan: ConversionPlan, out: Path, options: ConvertOptions, state) -> ConvertSummary:
    remote = src.is_remote
    mine = _mine(plan, options)
    pending = [u for u in mine if u.key not in set(state.finished)]
    # downloads and peak disk of what this run still has to do (finished units are on disk already)
    needed = sorted({s for u in pending for s in u.shards})
    transient = needed if remote and not options.keep_source else []
    kept = needed if remote and options.keep_source else []
    remaining = dataclasses.replace(plan, units=pending)
    summary = ConvertSummary(
        src.describe(), str(out), options.dry_run, plan.recipe.as_dict(), len(plan.units),
        units_skipped=len(state.finished), units_redone=list(state.dropped), redo_reasons=dict(state.reasons),
        sources_rechecked=dict(state.rechecked),
        total_out_bytes=plan.out_bytes, peak_disk_bytes=peak_disk_ahead(remaining, transient, kept, options, out),
        format_totals=plan.format_totals(), formats_per_role=plan.role_formats(),
        fallbacks=[f.as_dict() for f in plan.fallbacks], warnings=run_warnings(plan),
        dropped_towers=list(plan.dropped),
        experts_choice=_choice(plan), budget=plan.budget,
    )  # fmt: skip
    if options.dry_run:
        # what this run would read and write: the pending units' figures, as a real run counts them
        summary.bytes_in, summary.bytes_out = remaining.in_bytes, remaining.out_bytes
        summary.plan = (plan if options.part is None else dataclasses.replace(plan, units=mine)).summary(
            transient, kept, options.workers
        )
        summary.plan["peak_disk_bytes"] = summary.peak_disk_bytes
        for u in summary.plan["units"]:
            u["finished"] = u["unit"] in state.finished
    if options.part is not None:
        summary.part = {"part": str(options.part), "units": len(mine), "in_bytes": sum(u.in_bytes for u in mine),
                        "shards": sorted({s for u in mine for s in u.shards})}  # fmt: skip
    return summary


def _choice(plan: ConversionPlan) -> dict:
    choice = plan.experts_choice
    return {**choice.as_dict(), "line": choice.line} if choice is not None else {}


def _locked(out: Path) -> contextlib.AbstractContextManager[None]:
    """One conversion per output folder at a time: ``.colitools.lock`` (``lockfile.held_lock``), removed when the
    conversion ends, by an error or a clean stop too; a SIGKILL leaves the file, which the next run takes."""
    return held_lock(
        out / LOCKFILE, lambda: ConvertError(f"{out}: another colitools convert is working in this folder")
    )


def _bar(options: ConvertOptions, total: int, desc: str, leave: bool = True):
    enabled = options.progress if options.progress is not None else sys.stderr.isatty()
    if not enabled:
        return _NoBar()  # tqdm (import, monitor thread) only when a bar is shown
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc=desc, leave=leave,
                dynamic_ncols=True)  # fmt: skip


class _NoBar:
    """The part of a tqdm bar the runner and ``download_file`` use, doing nothing."""

    def update(self, n: int | float = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _run(src: Source, planned: Planned, out: Path, options: ConvertOptions, floor: DiskFloor,
         summary: ConvertSummary) -> None:  # fmt: skip
    plan, identities = planned.plan, planned.identities
    ledger, state, donor, mine = _open_run(src, planned, out, options)
    _note_resume(summary, state)
    pending = [u for u in mine if not ledger.is_finished(u.key)]
    needed = _release_unread(src, plan, pending, options)
    streamer = _stream_uploader(out, ledger, options)  # --stream-upload: an earlier run's units are sent first
    serial = options.workers == 1 or len(pending) <= 1
    block = plan.inventory.fp8.block if plan.inventory.fp8 else None
    _limit_malloc_arenas()
    on_kernels = kernels.plan_encodes(encode_work(j for u in pending for j in u.jobs))
    bar = _bar(options, sum(u.in_bytes for u in pending), "convert")
    slow_unit = float(os.environ.get(SLOW_UNIT_ENV) or 0)
    after = {u.key: n.shards for u, n in zip(pending, pending[1:], strict=False)}  # the next unit's shards
    ahead = start_prefetch(
        src, pending, floor, options.workers, lambda n, what: _bar(options, n, what, leave=False)
    )

    def prepare(unit: Unit, writing: int = 0, drain: Callable[[], None] | None = None) -> dict[str, Path]:
        # ``writing``: bytes of units still being written in the background, not yet visible as used space.
        # When they and this unit do not fit, let them finish first (``drain``) rather than wait for space
        # that their own bytes are about to take.
        if writing and drain is not None and not floor.has_room(unit.out_bytes + writing):
            drain()
            writing = 0
        floor.ensure(unit.out_bytes + writing, f"unit {unit.key}")
        paths = _shard_paths(src, unit, ahead, floor, options)
        src.check_ahead(after.get(unit.key, ()))  # the Hugging Face cache check, while this unit converts
        if streamer is not None and serial and drain is not None:
            drain()  # the unit before is uploaded and deleted before this one writes (stream_upload.py)
        return paths

    def finished(unit: Unit, result: UnitResult) -> None:
        ledger.record_unit(unit, result.files, plan, result.errors)
        if streamer is not None:
            streamer.unit_recorded(ledger.manifest, unit.key, ledger.save)
        summary.units_converted += 1
        summary.bytes_in += result.in_bytes
        summary.bytes_out += sum(f.size for f in result.files)
        summary.tensors_copied += result.copied
        for shard in unit.shards:
            needed[shard] -= 1
            if not needed[shard]:
                _release(src, shard, options)

    # Index, config and copied files are written while the last unit's files are published and recorded
    # (fsyncs in both): they depend only on the source and the plan, and are written once every unit is
    # encoded, so a conversion that fails on the way leaves none of them behind.
    with ThreadPoolExecutor(1, thread_name_prefix="outputs") as side:
        outputs: list[Future] = []

        def all_encoded() -> None:
            ahead.wait_all()  # the copied files, downloaded while the last unit converted
            outputs.append(side.submit(_write_outputs, src, plan, out))

        try:
            if serial:
                _run_serial(pending, prepare, finished, out, block, bar, slow_unit, all_encoded, donor)
            else:
                _run_parallel(pending, prepare, finished, out, block, options.workers, bar, on_kernels, donor)
                ahead.wait_all()  # the copied files, before ``_write_outputs`` reads them
        finally:
            bar.close()
            ahead.close()
        copied = outputs[0].result() if outputs else _write_outputs(src, plan, out)
    _finalize(src, plan, out, ledger, options, summary, copied, identities)


def _open_run(src: Source, planned: Planned, out: Path, options: ConvertOptions):
    """``(ledger, its resume state, the --replace donor, this run's units)``: the ledger opened (``--part``: its
    share recorded), the plan recorded for the next run's planning."""
    plan, identities = planned.plan, planned.identities
    ledger, state = Ledger.open(out, plan, src.describe(), identities, options.replace)
    donor = reuse.Donor.open(out, plan, identities)  # --replace: the previous output's tensors to copy
    mine = _mine(plan, options)
    if options.part is not None:
        parts.start(ledger.data, options.part, mine)
        ledger.save()
    if not planned.recorded:
        with _gc_paused():
            plan_record.record(out, plan, planned.key)
    return ledger, state, donor, mine


def _note_resume(summary: ConvertSummary, state) -> None:
    """What the ledger kept and redid of an earlier run, for the summary."""
    summary.units_skipped = len(state.finished)
    summary.units_redone = state.dropped
    summary.redo_reasons = state.reasons
    summary.sources_rechecked = state.rechecked


def _release_unread(src: Source, plan: ConversionPlan, pending: list[Unit], options: ConvertOptions) -> Counter:
    """How many pending units read each shard; the leftovers of an earlier run that none reads released."""
    needed = Counter(s for u in pending for s in u.shards)
    for shard in plan.inventory.shards:
        if not needed[shard]:
            _release(src, shard, options)
    return needed


def _shard_paths(src: Source, unit: Unit, ahead, floor: DiskFloor, options: ConvertOptions) -> dict[str, Path]:
    """``unit``'s source shards on disk: a Hub source's downloaded ahead (``prefetch``), a local folder's or the
    Hugging Face cache's (nothing to download, no bar), else downloaded now."""
    paths = ahead.paths(unit)
    for shard in (s for s in unit.shards if s not in paths):
        floor.downloading = shard
        local = src.local_copy(shard)
        if local is not None:
            paths[shard] = local
            continue
        with _bar(options, src.files()[shard].size, f"download {shard}", leave=False) as dbar:
            paths[shard] = src.ensure_local(shard, progress=dbar)
    return paths


def _stream_uploader(out: Path, ledger: Ledger, options: ConvertOptions):
    """``--stream-upload``'s uploader, its branch open and an earlier run's recorded units sent; None without
    it. A folder whose files were streamed is refused without it (``stream_upload.check_folder``)."""
    from colitools.converters import stream_upload

    stream_upload.check_folder(out, ledger.manifest.units, options.upload_repo, options.stream_upload)
    if not options.stream_upload:
        return None
    token = stream_upload.check_target(options.upload_repo, options.token)
    uploader = stream_upload.StreamUploader(out, options.upload_repo, token, progress=_hub_bars(options))
    uploader.open_branch()
    uploader.catch_up(ledger.manifest, ledger.save)
    return uploader


def _hub_bars(options: ConvertOptions) -> bool:
    """huggingface_hub's upload bars: as ``progress`` says, else when stderr is a terminal (as the runner's)."""
    return options.progress if options.progress is not None else sys.stderr.isatty()


M_ARENA_MAX = -8  # glibc mallopt parameter


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """At most ``arenas`` glibc malloc arenas for the threads created from now on. The pipeline's threads
    (encoders, sinks, recorder) each got an arena of their own, and each arena keeps the high-water mark of the
    tensors that passed through it: ~35 MB of peak RSS on a 2-core machine, with no measurable CPU cost when
    they share two. A no-op where glibc's ``mallopt`` is not there."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, arenas)


def _run_serial(pending, prepare, finished, out: Path, block, bar, slow_unit: float,
                all_encoded: Callable[[], None], donor: reuse.Donor | None = None) -> None:  # fmt: skip
    """Units are encoded one after another in this thread. A unit whose tensors are all encoded goes to a
    recorder thread, which waits until its files are published (their writers fsync in the background) and
    records it (the ledger's own fsyncs), while this thread already encodes the next unit: no fsync is on the
    encoding path. Units are recorded strictly in order; at most one recorded unit is outstanding when the next
    one starts (memory: two units' write queues, as before). On any error, or an interrupt, the units already
    encoded are still published and recorded (the recorder finishes its queue), then the error propagates.
    ``all_encoded`` is called once the last unit is encoded. ``slow_unit`` (test knob) drains and pauses
    between units."""
    recorder = ThreadPoolExecutor(1, thread_name_prefix="record")
    last: tuple[Unit, Future] | None = None  # the newest unit handed to the recorder

    def record(unit: Unit, started: PendingUnit) -> None:
        finished(unit, started.wait())

    def drain() -> None:
        nonlocal last
        if last is not None:
            fut, last = last[1], None
            fut.result()  # re-raises a failure of the recorder (publication or ledger)

    try:
        for unit in pending:
            paths = prepare(unit, last[0].out_bytes if last else 0, drain)
            started = start_unit(unit, paths, out, block, bar.update, donor and donor.plan_unit(unit))
            previous, last = last, (unit, recorder.submit(record, unit, started))
            if previous is not None:
                previous[1].result()  # usually recorded already, while this unit was encoded
            if slow_unit:
                drain()
                time.sleep(slow_unit)
        if pending:
            all_encoded()
        drain()
    finally:
        recorder.shutdown(wait=True)  # what was handed over is published and recorded even on an error


def _run_parallel(pending, prepare, finished, out: Path, block, workers: int, bar, on_kernels: bool,
                  donor: reuse.Donor | None = None) -> None:  # fmt: skip
    """Convert ``pending`` units on ``workers`` processes; the main process prepares (downloads) and records.
    ``on_kernels``: the whole plan's choice of the kernels over the numpy reference (``kernels.plan_encodes``),
    which each worker takes (its own plan would see one unit).

    Units may finish out of order; each is recorded as soon as it is published (the ledger is a set)."""
    import multiprocessing  # here: --workers only (multiprocessing and its executor: ~13 ms of every import)
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    _start_resource_tracker()
    queue = list(pending)
    inflight: dict[Future, Unit] = {}
    # the processes are the parallelism: each uses its share of the cores (no oversubscription)
    threads = max(1, (os.cpu_count() or 1) // workers)

    def record(fut: Future) -> None:
        unit = inflight.pop(fut)
        result = fut.result()
        bar.update(result.in_bytes)
        finished(unit, result)

    def drain() -> None:
        for fut in sorted(inflight, key=lambda f: pending.index(inflight[f])):
            wait([fut])
            record(fut)

    init_args = (threads, os.getpid(), on_kernels)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=init_args) as pool:
        try:
            while queue or inflight:
                while queue and len(inflight) < workers:
                    unit = queue[0]
                    paths = prepare(unit, sum(u.out_bytes for u in inflight.values()), drain)
                    copies = donor and donor.plan_unit(unit)
                    with _sigint_blocked():  # a submit may spawn a worker: it starts with SIGINT blocked
                        inflight[pool.submit(convert_unit, unit, paths, out, block, None, copies)] = queue.pop(0)
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: pending.index(inflight[f])):
                    record(fut)
        except BaseException:
            for fut in list(inflight):  # keep what the workers finish (a clean stop loses no work)
                if not fut.cancel():
                    with contextlib.suppress(BaseException):
                        wait([fut])
                        record(fut)
            raise


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread meanwhile: a process spawned now inherits the blocked mask (across exec), so
    a Ctrl-C to the process group while a worker is still importing stays pending there until ``_worker_init``
    ignores it (multiprocessing's resource tracker starts the same way); this process takes its own SIGINT when
    the block ends (or at once, in another of its threads). SIGHUP too: a closed terminal hangs up the whole
    process group as a Ctrl-C interrupts it."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_GROUP_SIGNALS = {signal.SIGINT, signal.SIGHUP}  # what reaches the whole process group: the parent stops for all


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (a helper process of the spawn context) quiet after a SIGKILL of
    this process (below) and with the group signals blocked, which it inherits: a closed terminal or a Ctrl-C reaches the whole process group, and the tracker, which
    blocks only SIGINT / SIGTERM itself, would die of a SIGHUP, and the parent then warn "resource_tracker: process
    died unexpectedly" (stderr noise, a relaunch) at its clean stop."""
    from multiprocessing import resource_tracker

    old = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
    # After a SIGKILL of this process the tracker unlinks the pool's semaphores (its job) and warns, on the
    # terminal, about "leaked semaphore objects": noise after a kill the resume handles. Its command line takes
    # the interpreter's -W options (sys.warnoptions), so it alone starts with UserWarnings ignored.
    warnoptions = list(sys.warnoptions)
    sys.warnoptions.append("ignore::UserWarning")
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions[:] = warnoptions
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _worker_init(threads: int, parent_pid: int, on_kernels: bool) -> None:
    """A worker ignores SIGINT and SIGHUP (a Ctrl-C, a closed terminal reach the whole process group): the parent
    stops the conversion, lets the units in flight finish and prints its one line."""
    for signum in _GROUP_SIGNALS:  # one pending since the spawn is discarded
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _GROUP_SIGNALS)
    _die_with_parent(parent_pid)
    from colitools.formats import kernels

    kernels.set_threads(threads)
    if on_kernels:
        kernels.use_kernels()


def _check_sources_unchanged(src: Source, identities: Mapping[str, dict]) -> None:
    if not isinstance(src, LocalFolderSource):
        return  # a Hub source is pinned to a commit and every download is sha256-checked
    for shard, before in identities.items():
        try:
            now = SourceFile.from_stat(shard, (src.root / shard).stat()).identity()
        except OSError:
            now = None
        if now != before:
            raise ConvertError(
                f"{src.root / shard}: source shard changed during the conversion; rerun the same command, "
                "which redoes the units that read it"
            )


def _die_with_parent(parent_pid: int) -> None:
    """A worker must not outlive the conversion (a SIGKILLed parent would leave it, PPID 1, holding the
    parent's stdout/stderr open). Linux: the kernel sends SIGKILL to this process when the thread that spawned
    it exits (``prctl(PR_SET_PDEATHSIG)``; workers are spawned by the main thread, which lives as long as the
    process); the parent may already be gone before the call, hence the check after it. The resource tracker
    exits by itself once every process holding its pipe (the parent and these workers) is gone. Elsewhere a
    parent watcher thread does the same, polling."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent_pid:
                os._exit(1)
            return
    import threading

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _release(src: Source, shard: str, options: ConvertOptions) -> None:
    if not options.keep_source and src.is_deletable(shard):
        src.release(shard)


def _write_outputs(src: Source, plan: ConversionPlan, out: Path) -> list[str]:
    """Index, config and the generation/tokenizer files; returns the names of the copied files."""
    config = src.read_json(CONFIG_FILE)
    output.write_index(out, plan)
    output.write_target_files(out, plan, config)
    source = src.describe()
    output.write_qpack_files(out, plan, config, source.get("repo_id") or source.get("path") or "?")
    copied = []
    for name in output.copied_files(list(src.files())):
        output.copy_file(src.ensure_local(name), out / name)
        copied.append(name)
    for name, obj in plan.recipe.target.engine_files(copied, config).items():  # an id-only tokenizer.json
        output.write_json_atomic(out / name, obj)
    return copied


def _finalize(src: Source, plan: ConversionPlan, out: Path, ledger: Ledger, options: ConvertOptions,
              summary: ConvertSummary, copied: list[str], identities: Mapping[str, dict]) -> None:  # fmt: skip
    """The manifest marked complete, once index, config and copied files (``_write_outputs``) are in place (so
    a manifest saying ``complete`` means everything else is in place), and once the local source shards are
    seen unchanged since the run started (a shard edited during the run is not marked complete: the units
    recorded with its old identity are redone by the rerun)."""
    _check_sources_unchanged(src, identities)
    summary.warnings = _without_identical_requantization(plan, summary.warnings, ledger.data["units"].values())
    reuse.finish(out, plan)  # --replace: the donor's files no planned file replaced, then its record
    plan_record.remove(out)  # before "complete": a finished output holds no leftover
    for name in src.files():  # config, index, copied files: whatever this run downloaded into the work folder
        _release(src, name, options)
    shards = ledger.file_records()
    mine = _mine(plan, options)
    if sorted(f.name for f in shards) != sorted(f.name for u in mine for f in u.files):  # pragma: no cover - a bug
        raise ConvertError("internal: the ledger does not cover every planned file")
    extra = {
        "warnings": summary.warnings,
        "shards": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in shards],
        "copied_files": [CONFIG_FILE, INDEX_FILE, *copied],
        # the same labels as the summary, inspect and verify (format_names.format_label)
        "format_totals": summary.format_totals, "formats_per_role": summary.formats_per_role,
        "experts_choice": {k: v for k, v in summary.experts_choice.items() if k != "line"},
        "run": {
            "units_converted": summary.units_converted, "units_skipped": summary.units_skipped,
            "tensors_copied": summary.tensors_copied,
            "bytes_in": summary.bytes_in, "bytes_out": summary.bytes_out,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }  # fmt: skip
    if options.part is None:
        ledger.finish(extra)
    else:
        _finish_part(plan, out, ledger, mine, extra)
    work = out / WORKDIR
    if work.is_dir() and not options.keep_source:
        with contextlib.suppress(OSError):
            work.rmdir()  # only when empty: a kept or foreign file is never deleted


def _finish_part(plan: ConversionPlan, out: Path, ledger: Ledger, mine: list[Unit], extra: dict[str, Any]) -> None:
    """A part's end (``--part K/N``): the manifest sections one machine's run writes, and the ``part`` section
    ``merge`` completes them from (``parts.finish``); the manifest's ``state`` stays ``converting`` (the folder
    holds a share of the output, which ``verify container`` must not take for a whole)."""
    ledger.data.update(extra)
    line = requantized_warning(plan.experts_choice, _requantized_experts(plan)) if plan.experts_choice else None
    errors = {name: e for u in ledger.data["units"].values() for name, e in (u.get("errors") or {}).items()}
    exact = all(
        job.out_name in errors and ErrorStats(*errors[job.out_name]).sse == 0.0
        for job in _requantized_jobs(dataclasses.replace(plan, units=mine))
    )
    parts.finish(
        ledger.data, out, [f.name for u in mine for f in u.files],
        sidecar_index=output.sidecar_index(plan, [u.key for u in plan.units]),
        requantization_line=line, requantized_exact=exact,
    )  # fmt: skip
    ledger.save()
