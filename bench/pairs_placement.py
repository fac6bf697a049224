"""Does a ``.coli_pairs`` co-activation table make ``mirror plan`` predict better on a held-out trace? (issue 30)

Traces: ``colitools run --route-trace`` on copies of oracle fixtures (``--no-usage``, ``--ignore-eos``; the
default ones are those whose two layers both route: a pairs table needs two MoE layers), one run per prompt (seeded random prompt ids, ``--new-tokens`` generated: prefill rows and decode steps are positions).
Prompts are split into ``--folds`` folds; each fold is held out once, and the other prompts are the train part:
their traces give the usage counts and, through ``colitools.formats.route_trace.build_pairs`` (what
``colitools usage pairs`` writes), the pairs table (top 16, depth 2).

Placements of ``--budgets`` percent of the routed experts on the fast drive, at expert granularity (one
equal-sized shard per expert: the finest layout a mirror can have, so the pairs have the most room to matter;
with the fixtures' real per-layer shards a budget picks whole layers and the pairs could change nothing):

* ``plan``: the mirror plan's own knapsack (``colitools.mirror.plan.select_shards``) on the train counts;
* ``pairs b=B``: co-activated experts placed together, greedily: next is the expert maximising
  ``count(x) + B * sum over chosen y of (pairs[y -> x] + pairs[x -> y])`` (ties: layer, expert).

Measured on the held-out part: ``hit`` = share of its routed (layer, expert) selections whose expert is on the
fast drive, and ``read`` = the share the engine would read from the mirror under the routing rule (FORMATS §7,
weights 1,1: placed there and hashed to it). Also the dynamic use colibri makes of the table (its ``COUPLE=``
prefetcher): per held-out position, the top-k experts of layer L+dL predicted from layer L's selected set by
summed pair counts, against the top-k of layer L+dL by train counts (``recall`` = share of the actual selections
predicted). Prints the verdict the issue asks for: pairs are worth adopting in ``mirror plan`` only if the best
``B`` raises the held-out hit rate by at least ``--adopt-pp`` points on average and on no fixture lowers it.

Usage: ``.venv/bin/python bench/pairs_placement.py [--fixtures mixtral,mixtral_bf16_fused,olmoe] [--prompts 32]
[--folds 4] [--new-tokens 96] [--budgets 25,50] [--betas 0.25,0.5,1] [--workdir DIR] [--seed 0]``
(traces are kept in the work directory and reused by a rerun with the same settings).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from colitools.formats.jsonfile import load_json_object
from colitools.formats.model_config import read_facts
from colitools.formats.route_trace import build_pairs, trace_positions
from colitools.mirror.plan import select_shards
from colitools.mirror.routing import replica_cuts, replica_for
from colitools.mirror.scan import ShardExperts

REPO = Path(__file__).resolve().parents[1]
Key = tuple[int, int]  # (layer, expert)
Position = dict[int, list[int]]  # layer -> selected experts


@dataclass
class Fixture:
    name: str
    n_experts: int
    vocab: int
    traces: list[Path]


def make_traces(name: str, work: Path, prompts: int, new_tokens: int, seed: int) -> Fixture:
    """One trace per prompt of the fixture ``name`` (a copy in ``work``: the oracle folder is never written)."""
    model = work / name
    if not model.exists():
        shutil.copytree(REPO / "oracles" / name, model, ignore=shutil.ignore_patterns("reference"))
    facts = read_facts(load_json_object(model / "config.json"), where=name)
    vocab = int(load_json_object(model / "config.json").get("vocab_size") or 0) or 200
    rng = np.random.default_rng([seed, sum(map(ord, name))])
    traces = []
    for i in range(prompts):
        trace = work / f"{name}.p{i:02d}.n{new_tokens}.s{seed}.trace"
        ids = rng.integers(1, vocab, size=int(rng.integers(6, 17)))
        if not trace.exists():
            command = [sys.executable, "-m", "colitools", "run", str(model), "--prompt-ids", ",".join(map(str, ids)),
                       "--max-new-tokens", str(new_tokens), "--ignore-eos", "--no-usage", "--route-trace",
                       str(trace) + ".part"]  # fmt: skip
            subprocess.run(command, check=True, capture_output=True, text=True)
            Path(str(trace) + ".part").rename(trace)
        traces.append(trace)
    return Fixture(name, facts.routed_experts, vocab, traces)


def selections(traces: list[Path]) -> Counter[Key]:
    """Every routed (layer, expert) selection of the traces, one per line and expert (the usage record's count;
    not from the positions: route_pairs.py's grouping folds the decode steps of a one-MoE-layer model)."""
    counts: Counter[Key] = Counter()
    for trace in traces:
        for line in trace.read_text().splitlines():
            _call, _row, layer, *picks = line.split()
            counts.update((int(layer), int(p.split(":")[0])) for p in picks)
    return counts


def pair_lookup(traces: list[Path]) -> dict[tuple[int, int, int], dict[int, int]]:
    """The train part's pairs table as ``(L, dL, e) -> {f: count}`` (what ``usage pairs`` writes for them)."""
    return {(L, dL, e): dict(picks) for L, dL, e, picks in build_pairs(traces).entries}


def plan_placement(counts: Counter[Key], keys: list[Key], k: int) -> set[Key]:
    """The mirror plan's knapsack over one equal-sized shard per expert, ``k`` of them in the budget."""
    shards = [ShardExperts(f"L{layer:04d}-E{e:06d}", Path("."), 1000, {(layer, e): 1000}, frozenset({(layer, e)}))
              for layer, e in keys]  # fmt: skip
    by_name = {s.name: s for s in shards}
    return {
        key
        for f in select_shards(shards, dict(counts), budget_bytes=1000 * k)
        for key in by_name[f.name].routed
    }


def pairs_placement(counts: Counter[Key], pairs: dict, keys: list[Key], k: int, beta: float) -> set[Key]:
    """Greedy co-located placement: count plus ``beta`` times the pair counts linking it to the chosen ones."""
    link: dict[Key, Counter[Key]] = {key: Counter() for key in keys}
    for (L, dL, e), picks in pairs.items():
        for f, c in picks.items():
            if (L, e) in link and (L + dL, f) in link:
                link[(L, e)][(L + dL, f)] += c
                link[(L + dL, f)][(L, e)] += c
    chosen: set[Key] = set()
    bonus: Counter[Key] = Counter()
    for _ in range(k):
        best = min((key for key in keys if key not in chosen),
                   key=lambda key: (-(counts[key] + beta * bonus[key]), key))  # fmt: skip
        chosen.add(best)
        for other, c in link[best].items():
            bonus[other] += c
    return chosen


def hit_rates(held: Counter[Key], placed: set[Key], n_experts: int) -> tuple[float, float]:
    """(share of held-out selections on the fast drive, share read from the mirror under the routing rule)."""
    total = sum(held.values())
    cuts = replica_cuts([1, 1])
    on = sum(n for key, n in held.items() if key in placed)
    read = sum(n for key, n in held.items() if key in placed and replica_for(*key, n_experts, cuts) == 1)
    return on / total, read / total


def prefetch_recall(
    held: list[Position], pairs: dict, counts: Counter[Key], depth: int = 2
) -> tuple[float, float]:
    """COUPLE-style prediction of layer L+dL's experts from layer L's, against the marginal top-k of L+dL."""
    hit_pairs = hit_marginal = total = 0
    for position in held:
        for L, ids in position.items():
            for dL in range(1, depth + 1):
                actual = position.get(L + dL)
                if actual is None:
                    continue
                k = len(actual)
                score: Counter[int] = Counter()
                for e in ids:
                    score.update(pairs.get((L, dL, e), {}))
                predicted = sorted(score, key=lambda f: (-score[f], f))[:k]
                layer_counts = {f: n for (layer, f), n in counts.items() if layer == L + dL}
                marginal = sorted(layer_counts, key=lambda f: (-layer_counts[f], f))[:k]
                hit_pairs += len(set(predicted) & set(actual))
                hit_marginal += len(set(marginal) & set(actual))
                total += k
    return (hit_pairs / total, hit_marginal / total) if total else (0.0, 0.0)


@dataclass
class FoldResult:
    hit: dict[str, dict[int, tuple[float, float]]]  # placement -> budget % -> (hit, read)
    recall: tuple[float, float]  # (pairs, marginal)


def evaluate_fold(fixture: Fixture, held_out: set[int], budgets: list[int], betas: list[float]) -> FoldResult:
    train = [t for i, t in enumerate(fixture.traces) if i not in held_out]
    held_traces = [fixture.traces[i] for i in sorted(held_out)]
    held_positions = [p for t in held_traces for p in trace_positions(t).values()]
    counts, held = selections(train), selections(held_traces)
    layers = sorted({layer for layer, _ in counts} | {layer for layer, _ in held})
    keys = [(layer, e) for layer in layers for e in range(fixture.n_experts)]
    pairs = pair_lookup(train)
    hit: dict[str, dict[int, tuple[float, float]]] = {"plan": {}, **{f"pairs b={b:g}": {} for b in betas}}
    for percent in budgets:
        k = max(1, round(len(keys) * percent / 100))
        hit["plan"][percent] = hit_rates(held, plan_placement(counts, keys, k), fixture.n_experts)
        for b in betas:
            placed = pairs_placement(counts, pairs, keys, k, b)
            hit[f"pairs b={b:g}"][percent] = hit_rates(held, placed, fixture.n_experts)
    return FoldResult(hit, prefetch_recall(held_positions, pairs, counts))


def report_fixture(fixture: Fixture, folds: list[FoldResult], budgets: list[int]) -> dict[str, float]:
    """Print the fixture's held-out means; returns each pairs placement's mean gain over the plan (points)."""
    positions = sum(len(trace_positions(t)) for t in fixture.traces)
    print(
        f"\n{fixture.name}: {len(fixture.traces)} traces, {positions} positions, {fixture.n_experts} experts/layer"
    )
    print(
        f"  {'placement':<14}" + "".join(f"  {p:>3}%: hit   read" for p in budgets) + "   gain vs plan (pp)"
    )
    gains: dict[str, float] = {}
    for name in folds[0].hit:
        cells = []
        for percent in budgets:
            hit = statistics.fmean(f.hit[name][percent][0] for f in folds)
            read = statistics.fmean(f.hit[name][percent][1] for f in folds)
            cells.append(f"  {hit:9.1%} {read:6.1%}")
        # the gain of every (fold, budget) case: its spread says how much of the mean is noise
        deltas = [100 * (f.hit[name][p][0] - f.hit["plan"][p][0]) for f in folds for p in budgets]
        gains[name] = statistics.fmean(deltas)
        spread = f"   {gains[name]:+.2f} (sd {statistics.pstdev(deltas):.2f})" if name != "plan" else ""
        print(f"  {name:<14}" + "".join(cells) + spread)
    pairs, marginal = (statistics.fmean(f.recall[i] for f in folds) for i in (0, 1))
    print(f"  prefetch (COUPLE) recall of layer L+dL's top-k: pairs {pairs:.1%}, marginal heat {marginal:.1%} "
          f"({100 * (pairs - marginal):+.1f} pp)")  # fmt: skip
    del gains["plan"]
    return gains


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fixtures", default="mixtral,mixtral_bf16_fused,olmoe")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--budgets", default="25,50")
    parser.add_argument("--betas", default="0.25,0.5,1")
    parser.add_argument("--adopt-pp", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    betas = [float(b) for b in args.betas.split(",")]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="pairs-placement-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"traces in {work}; {args.prompts} prompts per fixture in {args.folds} folds, {args.new_tokens} new tokens"
    )
    all_gains: dict[str, list[float]] = {}
    for name in args.fixtures.split(","):
        fixture = make_traces(name, work, args.prompts, args.new_tokens, args.seed)
        folds = [evaluate_fold(fixture, set(range(f, args.prompts, args.folds)), budgets, betas)
                 for f in range(args.folds)]  # fmt: skip
        for placement, gain in report_fixture(fixture, folds, budgets).items():
            all_gains.setdefault(placement, []).append(gain)
    best = max(all_gains, key=lambda p: statistics.fmean(all_gains[p]))
    mean, worst = statistics.fmean(all_gains[best]), min(all_gains[best])
    adopt = mean >= args.adopt_pp and worst >= 0
    print(f"\nbest pairs placement: {best}, held-out hit rate {mean:+.2f} pp on average over the plan "
          f"(worst fixture {worst:+.2f} pp): {'ADOPT' if adopt else 'NOT ADOPTED'} "
          f"(threshold: +{args.adopt_pp:g} pp on average, no fixture below 0)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
