"""``colitools mirror plan | stage | verify``: dual-SSD mirrors driven by routing history (README "Mirrors").

Exit codes: plan and stage 0 when admitted (and, for stage, verified), 2 when not admitted (nothing copied),
1 on error; verify 0 when ready, 4 when not, 1 on error; stage 4 if its final verify fails, 2 when the mirror
drive runs out of space (MirrorReserveStop, one line naming the file and the bytes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from colitools.cli.app import mirror_app
from colitools.errors import MirrorError

EXIT_NOT_ADMITTED = 2
EXIT_NOT_READY = 4

ModelOpt = Annotated[Path | None, typer.Option("--model", help="Primary model directory (the shards).")]
MirrorOpt = Annotated[Path | None, typer.Option("--mirror", help="Mirror directory on the second drive.")]
UsageOpt = Annotated[
    Path | None, typer.Option("--usage", help="Routing history (default MODEL/.coli_usage); naming it accepts "
                              "another engine's history.")
]
BudgetOpt = Annotated[float | None, typer.Option("--budget-gib", help="Most GiB to copy (> 0).")]
ReserveOpt = Annotated[float, typer.Option("--reserve-gib", help="GiB to leave free on the mirror drive.")]
SourceDirOpt = Annotated[
    list[Path] | None, typer.Option("--source-dir", help="Extra shard directory of a split model (repeatable).")
]
WeightsOpt = Annotated[
    str | None, typer.Option("--disk-weights", help="Read-bandwidth weights primary,mirror (e.g. 9,3).")
]
ProbeOpt = Annotated[bool, typer.Option("--probe", help="Measure both drives' sequential read bandwidth.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]


def _gib(n: int) -> str:
    """Bytes for people: the largest binary unit that keeps the number >= 1."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n} B"


def _weights(weights, source: str) -> str:
    """Drive weights for people: measured ones in MB/s (1 decimal), given ones as written (9:3)."""
    if source == "probe":
        return " : ".join(f"{w / 1e6:.1f} MB/s" for w in weights)
    return ":".join(f"{w:g}" for w in weights)


def _require(value, option: str):
    if value is None:
        raise MirrorError(f"missing option {option}")
    return value


def _plan_kwargs(model, mirror, usage, budget_gib, reserve_gib, source_dir, disk_weights, probe) -> dict:
    from colitools.mirror.plan import gib_to_bytes
    from colitools.mirror.routing import parse_disk_weights

    return {
        "model": _require(model, "--model"),
        "mirror": _require(mirror, "--mirror"),
        "budget_bytes": gib_to_bytes(_require(budget_gib, "--budget-gib"), "--budget-gib"),
        "reserve_bytes": gib_to_bytes(reserve_gib, "--reserve-gib"),
        "usage": usage,
        "source_dirs": list(source_dir or []),
        "disk_weights": parse_disk_weights(disk_weights) if disk_weights is not None else None,
        "probe": probe,
    }


def _print_plan(plan) -> None:
    data = plan.to_json()
    shard_bytes = sum(s.size for s in plan.shards)
    print(f"model    {data['model_root']}  ({len(plan.shards)} shards, {_gib(shard_bytes)})")
    print(f"mirror   {data['mirror_root']}  (free {_gib(data['free_bytes'])}, reserve {_gib(data['reserve_bytes'])})")
    usage = f"{data['usage_selections']} selections" if data["usage_history_present"] else "no usage history"
    print(f"usage    {data['usage_file']}  ({usage})")
    limited = (f" (of {_gib(data['budget_bytes'])} requested: the rest does not fit above the reserve)"
               if data["budget_limited_by_free_space"] else "")
    print(
        f"budget   {_gib(data['effective_budget_bytes'])}{limited}: {len(plan.files)} shard(s) selected, {_gib(data['selected_bytes'])}; "
        f"to copy {_gib(data['remaining_copy_bytes'])}; projected free {_gib(data['projected_free_bytes'])}"
    )
    if plan.files:
        width = max(len(f.name) for f in plan.files)
        print()
        print(f"  {'#':>3}  {'shard':<{width}}  {'size':>11}  {'weighted expert bytes':>22}  {'activated experts':>17}")
        for i, f in enumerate(plan.files, 1):
            print(f"  {i:>3}  {f.name:<{width}}  {_gib(f.size):>11}  {f.weighted_expert_bytes:>22}  "
                  f"{f.activated_experts:>17}")
        print()
    p = plan.prediction
    if p is not None:
        print(
            f"predicted expert reads: primary {p.primary_share:.1%}, mirror {p.mirror_share:.1%} "
            f"(weights {_weights(p.weights, plan.disk_weights_source)} from {plan.disk_weights_source}, "
            f"cuts {','.join(map(str, p.cuts))} of 256)"
        )
        if p.same_device:
            print("predicted read bandwidth: x1.000 of the primary alone (the mirror is on the same device)")
        else:
            print(f"predicted read bandwidth: x{p.bandwidth_gain:.3f} of the primary alone "
                  f"(a full mirror would give x{p.full_mirror_gain:.3f})")
    for probe in plan.probes:
        mode = "O_DIRECT" if probe.direct_io else "buffered"
        print(f"probe    {probe.directory}: {probe.bytes_per_second / 1e6:.0f} MB/s ({mode}, "
              f"{probe.bytes_read >> 20} MiB in {probe.seconds:.2f} s)")
    for warning in plan.warnings:
        print(f"warning: {warning}")
    print(f"admitted: {'yes' if plan.admitted else 'no (' + str(plan.reason) + ')'}")


@mirror_app.command("plan")
def plan_command(
    model: ModelOpt = None,
    mirror: MirrorOpt = None,
    usage: UsageOpt = None,
    budget_gib: BudgetOpt = None,
    reserve_gib: ReserveOpt = 10.0,
    source_dir: SourceDirOpt = None,
    disk_weights: WeightsOpt = None,
    probe: ProbeOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Choose the shards to mirror from the routing history (greedy knapsack by benefit per byte)."""
    from colitools.mirror.plan import plan_mirror

    plan = plan_mirror(**_plan_kwargs(model, mirror, usage, budget_gib, reserve_gib, source_dir, disk_weights,
                                      probe))
    if json_output:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        _print_plan(plan)
    if not plan.admitted:
        raise typer.Exit(EXIT_NOT_ADMITTED)


def _print_verification(v) -> None:
    print(f"mirror   {v.mirror_root}  ({v.mode} mode)")
    if v.files:
        width = max(len(f.name) for f in v.files)
        print(f"  {'file':<{width}}  {'status':<7}  {'engine accepts':<14}  problems")
        for f in v.files:
            accepts = {True: "yes", False: "no", None: "unknown"}[f.engine_accepts]
            print(f"  {f.name:<{width}}  {'ok' if f.ok else 'FAILED':<7}  {accepts:<14}  {'; '.join(f.problems)}")
    for problem in v.problems:
        print(f"problem: {problem}")
    print(f"ready: {'yes' if v.ready else 'no'}")


@mirror_app.command("stage")
def stage_command(
    model: ModelOpt = None,
    mirror: MirrorOpt = None,
    usage: UsageOpt = None,
    budget_gib: BudgetOpt = None,
    reserve_gib: ReserveOpt = 10.0,
    source_dir: SourceDirOpt = None,
    disk_weights: WeightsOpt = None,
    probe: ProbeOpt = False,
    json_output: JsonOpt = False,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                  help="Progress bars (default: on a terminal).")] = None,
    reread_from_device: Annotated[bool, typer.Option(
        "--reread-from-device",
        help="Re-hash each copy from the mirror drive (O_DIRECT) instead of the page cache: also catches "
             "corruption below the page cache; every byte crosses the mirror drive twice (slower).")] = False,
) -> None:
    """Copy the planned shards (verified, atomic, resumable), write the receipt, then verify the mirror."""
    from colitools.mirror.stage import stage_mirror

    result = stage_mirror(**_plan_kwargs(model, mirror, usage, budget_gib, reserve_gib, source_dir, disk_weights,
                                         probe), progress=progress, reread_from_device=reread_from_device)
    if json_output:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _print_plan(result.plan)
        if result.staged:
            copied = [f for f in result.files if f.action == "copied"]
            print(f"staged: {len(copied)} copied, {len(result.files) - len(copied)} kept; receipt {result.receipt}")
            _print_verification(result.verification)
    if not result.staged:
        if not json_output:
            print(f"refused ({result.reason}): nothing copied", file=sys.stderr)
        raise typer.Exit(EXIT_NOT_ADMITTED)
    if not result.ready:
        raise typer.Exit(EXIT_NOT_READY)


@mirror_app.command("verify")
def verify_command(
    mirror: MirrorOpt = None,
    model: ModelOpt = None,
    source_dir: SourceDirOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Check the mirror against its receipt (or, without one, against the whole model)."""
    from colitools.mirror.verify import verify_mirror

    result = verify_mirror(_require(mirror, "--mirror"), model, source_dirs=list(source_dir or []))
    if json_output:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _print_verification(result)
    if not result.ready:
        raise typer.Exit(EXIT_NOT_READY)
