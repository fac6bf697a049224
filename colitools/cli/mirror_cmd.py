"""``colitools mirror plan | stage | verify``: dual-SSD mirrors driven by routing history (docs/CLI.md "mirror").

Exit codes: plan and stage 0 when admitted (and, for stage, verified), 2 when not admitted (nothing copied),
1 on error; verify 0 when ready, 4 when not, 1 on error; stage 4 if its final verify fails, 2 when the mirror
drive runs out of space (MirrorReserveStop, one line naming the file and the bytes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli import output
from colitools.cli.app import mirror_app
from colitools.cli.options import (
    DEFAULT_RESERVE_GIB,
    BudgetOpt,
    JsonOpt,
    MirrorOpt,
    ModelOpt,
    ProbeOpt,
    ProgressOpt,
    ReserveOpt,
    SourceDirOpt,
    UsageOpt,
    WeightsOpt,
)
from colitools.formats.errors import EXIT_NOT_ADMITTED, EXIT_NOT_OK


def _bytes(n: int) -> str:
    from colitools.mirror.plan import format_bytes  # imported when a command prints (the CLI starts light)

    return format_bytes(n)


def _weights(weights, source: str) -> str:
    """Drive weights for people: measured ones in MB/s (1 decimal), given ones as written (9:3)."""
    if source == "probe":
        return " : ".join(f"{w / 1e6:.1f} MB/s" for w in weights)
    return ":".join(f"{w:g}" for w in weights)


def _plan_kwargs(model, mirror, usage, budget_bytes, reserve_bytes, source_dir, disk_weights, probe) -> dict:
    from colitools.mirror.routing import parse_disk_weights

    return {
        "model": model,
        "mirror": mirror,
        "budget_bytes": budget_bytes,
        "reserve_bytes": reserve_bytes,
        "usage": usage,
        "source_dirs": list(source_dir or []),
        "disk_weights": parse_disk_weights(disk_weights) if disk_weights is not None else None,
        "probe": probe,
    }


def _plan_lines(plan) -> Iterator[str]:
    data = plan.to_json()
    shard_bytes = sum(s.size for s in plan.shards)
    yield f"model    {data['model_root']}  ({len(plan.shards)} shards, {_bytes(shard_bytes)})"
    yield f"mirror   {data['mirror_root']}  (free {_bytes(data['free_bytes'])}, reserve {_bytes(data['reserve_bytes'])})"
    usage = f"{data['usage_selections']} selections" if data["usage_history_present"] else "no usage history"
    yield f"usage    {data['usage_file']}  ({usage})"
    if plan.admitted:
        yield from _selection_lines(plan, data)
    else:  # no selection, free space after it or prediction: none of it would happen
        yield f"budget   {_bytes(data['budget_bytes'])}: nothing to copy: {_refusal(plan)}"
    for probe in plan.probes:
        mode = "O_DIRECT" if probe.direct_io else "buffered"
        yield (f"probe    {probe.directory}: {probe.bytes_per_second / 1e6:.0f} MB/s ({mode}, "
               f"{_bytes(probe.bytes_read)} in {probe.seconds:.2f} s)")  # fmt: skip
    for warning in plan.warnings:
        yield f"warning: {warning}"
    yield f"admitted: {'yes' if plan.admitted else 'no (' + str(plan.reason) + ')'}"


def _refusal(plan) -> str:
    """Why an unadmitted plan copies nothing, for people (``plan.reason`` is the word for scripts)."""
    from colitools.mirror.plan import REASON_NO_USAGE, REASON_NOTHING_FITS

    if plan.reason == REASON_NO_USAGE:
        return "no usage history ranks the shards"
    if plan.reason == REASON_NOTHING_FITS:
        return "no shard holding a used expert fits the budget"
    return (f"copying the selection ({_bytes(plan.remaining_copy_bytes)}) would leave less than the "
            f"{_bytes(plan.reserve_bytes)} reserve free")  # fmt: skip


def _selection_lines(plan, data: dict) -> Iterator[str]:
    limited = (f" (of {_bytes(data['budget_bytes'])} requested: the rest does not fit above the reserve)"
               if data["budget_limited_by_free_space"] else "")  # fmt: skip
    yield (
        f"budget   {_bytes(data['effective_budget_bytes'])}{limited}: {len(plan.files)} shard(s) selected, "
        f"{_bytes(data['selected_bytes'])}; to copy {_bytes(data['remaining_copy_bytes'])}; "
        f"projected free {_bytes(data['projected_free_bytes'])}"
    )
    if plan.files:
        width = max(len(f.name) for f in plan.files)
        yield ""
        yield f"  {'#':>3}  {'shard':<{width}}  {'size':>11}  {'weighted expert bytes':>22}  {'activated experts':>17}"
        for i, f in enumerate(plan.files, 1):
            yield (f"  {i:>3}  {f.name:<{width}}  {_bytes(f.size):>11}  {f.weighted_expert_bytes:>22}  "
                   f"{f.activated_experts:>17}")  # fmt: skip
        yield ""
    yield from _prediction_lines(plan)


def _prediction_lines(plan) -> Iterator[str]:
    p = plan.prediction
    if p is None:
        return
    yield (
        f"predicted expert reads: primary {p.primary_share:.1%}, mirror {p.mirror_share:.1%} "
        f"(weights {_weights(p.weights, plan.disk_weights_source)} from {plan.disk_weights_source}, "
        f"cuts {','.join(map(str, p.cuts))} of 256)"
    )
    if p.same_device:
        yield "predicted read bandwidth: x1.000 of the primary alone (the mirror is on the same device)"
    else:
        yield (f"predicted read bandwidth: x{p.bandwidth_gain:.3f} of the primary alone "
               f"(a full mirror would give x{p.full_mirror_gain:.3f})")  # fmt: skip


def _verification_lines(v) -> Iterator[str]:
    yield f"mirror   {v.mirror_root}  ({v.mode} mode)"
    if v.files:
        width = max(len(f.name) for f in v.files)
        yield f"  {'file':<{width}}  {'status':<7}  {'engine accepts':<14}  problems"
        for f in v.files:
            accepts = {True: "yes", False: "no", None: "unknown"}[f.engine_accepts]
            notes = "; ".join((["not in the receipt"] if f.in_receipt is False else []) + f.problems)
            yield f"  {f.name:<{width}}  {'ok' if f.ok else 'FAILED':<7}  {accepts:<14}  {notes}"
    for problem in v.problems:
        yield f"problem: {problem}"
    if any(f.in_receipt is False and not f.ok for f in v.files):
        yield "hint: mirror stage --prune removes the model's shards the plan no longer selects"
    yield f"ready: {'yes' if v.ready else 'no'}"


def _stage_lines(result) -> Iterator[str]:
    yield from _plan_lines(result.plan)
    if result.staged:
        copied = [f for f in result.files if f.action == "copied"]
        yield f"staged: {len(copied)} copied, {len(result.files) - len(copied)} kept; receipt {result.receipt}"
        if result.pruned:
            yield f"pruned (no longer selected): {', '.join(result.pruned)}"
        left = [name for name in result.unselected if name not in result.pruned]
        if left:
            yield (f"no longer selected, still on the mirror (the engine reads them; --prune removes them): "
                   f"{', '.join(left)}")  # fmt: skip
        yield from _verification_lines(result.verification)


@mirror_app.command("plan")
def plan_command(
    model: ModelOpt,
    mirror: MirrorOpt,
    budget_bytes: BudgetOpt,
    usage: UsageOpt = None,
    reserve_bytes: ReserveOpt = DEFAULT_RESERVE_GIB,
    source_dir: SourceDirOpt = None,
    disk_weights: WeightsOpt = None,
    probe: ProbeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Choose the shards to mirror from the routing history (greedy knapsack by benefit per byte)."""
    from colitools.mirror.plan import plan_mirror

    kwargs = _plan_kwargs(model, mirror, usage, budget_bytes, reserve_bytes, source_dir, disk_weights, probe)
    plan = plan_mirror(**kwargs)
    output.emit(as_json, plan.to_json, _plan_lines(plan))
    if not plan.admitted:
        raise typer.Exit(EXIT_NOT_ADMITTED)


@mirror_app.command("stage")
def stage_command(
    model: ModelOpt,
    mirror: MirrorOpt,
    budget_bytes: BudgetOpt,
    usage: UsageOpt = None,
    reserve_bytes: ReserveOpt = DEFAULT_RESERVE_GIB,
    source_dir: SourceDirOpt = None,
    disk_weights: WeightsOpt = None,
    probe: ProbeOpt = False,
    as_json: JsonOpt = False,
    progress: ProgressOpt = None,
    reread_from_device: Annotated[bool, typer.Option(
        "--reread-from-device",
        help="Re-hash each copy from the mirror drive (O_DIRECT) instead of the page cache: also catches "
             "corruption below the page cache; every byte crosses the mirror drive twice (slower).")] = False,
    prune: Annotated[bool, typer.Option(
        "--prune",
        help="Remove the model's shards the mirror holds that the plan no longer selects (listed without it), "
             "once the selection is copied.")] = False,
) -> None:  # fmt: skip
    """Copy the planned shards (verified, atomic, resumable), write the receipt, then verify the mirror."""
    from colitools.mirror.stage import stage_mirror

    kwargs = _plan_kwargs(model, mirror, usage, budget_bytes, reserve_bytes, source_dir, disk_weights, probe)
    result = stage_mirror(**kwargs, progress=progress, reread_from_device=reread_from_device, prune=prune)
    output.emit(as_json, result.to_json, _stage_lines(result))
    if not result.staged:
        if not as_json:
            output.echo(f"{output.ERROR_PREFIX}refused ({result.reason}): nothing copied", err=True)
        raise typer.Exit(EXIT_NOT_ADMITTED)
    if not result.ready:
        raise typer.Exit(EXIT_NOT_OK)


@mirror_app.command("verify")
def verify_command(
    mirror: MirrorOpt,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="Primary model directory (without a receipt: check the mirror against the whole model).",
        ),
    ] = None,
    source_dir: SourceDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check the mirror against its receipt (or, without one, against the whole model)."""
    from colitools.mirror.verify import verify_mirror

    result = verify_mirror(mirror, model, source_dirs=list(source_dir or []))
    output.emit(as_json, result.to_json, _verification_lines(result))
    if not result.ready:
        raise typer.Exit(EXIT_NOT_OK)
