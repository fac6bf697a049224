"""Size budgets (docs/FORMATS.md §12): the solver against brute force, and whole conversions of oracle fixtures
under ``target_size`` against the uniform recipe of the same size."""

from __future__ import annotations

import itertools
import random

import pytest

from colitools.converters.allocation import Item, lower_hull, solve
from colitools.formats.errors import ParameterError


def _brute(items, fixed, budget):
    """The least cost of every assignment of at most ``budget`` bytes (and its bytes)."""
    best = None
    for combo in itertools.product(*(range(len(it.options)) for it in items)):
        b = fixed + sum(it.options[k][0] for it, k in zip(items, combo, strict=True))
        c = sum(it.options[k][1] for it, k in zip(items, combo, strict=True))
        if b <= budget and (best is None or c < best[0]):
            best = (c, b)
    return best


# hand-made: three tensors, four formats each (bytes, squared error), one option above its hull (item b's 60)
HAND = [
    Item("a", ((10, 9.0), (20, 4.0), (30, 2.0), (40, 1.5))),
    Item("b", ((10, 5.0), (20, 4.5), (30, 1.0), (60, 0.9))),
    Item("c", ((5, 3.0), (10, 1.0), (20, 0.5), (25, 0.45))),
]


def test_hull_drops_options_above_it():
    # b: (20, 4.5) lies above the segment (10, 5) - (30, 1): never a multiplier's choice
    assert lower_hull(HAND[1].options) == [0, 2, 3]
    assert lower_hull(HAND[0].options) == [0, 1, 2, 3]
    # equal bytes: the cheaper one; a dearer option with more bytes is not on the hull
    assert lower_hull(((10, 3.0), (10, 2.0), (20, 2.5))) == [1]


def test_solver_optimal_on_hand_case_at_every_budget():
    fixed = 7
    lo, hi = fixed + 25, fixed + 125
    for budget in range(lo, hi + 1):
        sol = solve(HAND, fixed, budget)
        assert sol.bytes <= budget
        assert sol.bytes == fixed + sum(it.options[k][0] for it, k in zip(HAND, sol.choice, strict=True))
        # the sweep point is exactly optimal for its own size (a brute force of every assignment agrees)
        best_at_sweep, _ = _brute(HAND, fixed, sol.sweep_bytes)
        assert sol.sweep_cost == pytest.approx(best_at_sweep, abs=1e-12)
        assert sol.cost <= sol.sweep_cost + 1e-12
        # and never worse than the brute-force optimum by more than the hull's gap at this budget
        best, _ = _brute(HAND, fixed, budget)
        assert sol.cost >= best - 1e-12


def test_solver_hand_case_values():
    # by hand: the smallest size is 7 + 10 + 10 + 5 = 32. Hull steps by error saved per byte: a 10->20 0.5,
    # c 5->10 0.4, a 20->30 0.2 and b 10->30 0.2 (a tie: item a first), a 30->40 0.05, c 10->20 0.05, c 20->25
    # 0.01, b 30->60 0.0033. Budget 77 = 32 + 45: a 10->20 (+10), c 5->10 (+5), a 20->30 (+10), b 10->30 (+20)
    # spend exactly 45: a@30 2.0 + b@30 1.0 + c@10 1.0 = 4.0
    sol = solve(HAND, 7, 77)
    assert (sol.choice, sol.bytes, sol.cost) == ((2, 2, 1), 77, 4.0)
    assert _brute(HAND, 7, 77) == (4.0, 77)
    # budget 62 = 32 + 30: the sweep stops before b's step (a@30, b@10, c@10: 8.0 at 57); nothing else fits
    # (brute force: 8.0 too, e.g. a@20 b@30 c@5 at 62)
    sol = solve(HAND, 7, 62)
    assert (sol.sweep_bytes, sol.cost) == (57, 8.0)
    assert _brute(HAND, 7, 62)[0] == 8.0


def test_solver_random_cases_against_brute_force():
    rng = random.Random(41)
    exact = 0
    for _ in range(60):
        items = []
        for k in range(rng.randint(2, 5)):
            opts = sorted({(rng.randint(1, 40), round(rng.uniform(0, 10), 3)) for _ in range(rng.randint(1, 4))})
            items.append(Item(f"t{k}", tuple(opts)))
        lo = sum(min(b for b, _ in it.options) for it in items)
        hi = sum(max(b for b, _ in it.options) for it in items)
        budget = rng.randint(lo, hi)
        sol = solve(items, 0, budget)
        best, _ = _brute(items, 0, budget)
        assert sol.bytes <= budget
        assert _brute(items, 0, sol.sweep_bytes)[0] == pytest.approx(sol.sweep_cost, abs=1e-9)
        assert best - 1e-9 <= sol.cost <= sol.sweep_cost + 1e-9
        exact += sol.cost <= best + 1e-9
    assert exact >= 45  # the fill reaches the true optimum on most budgets between the sweep's points


def test_unreachable_budget_names_both_sizes():
    with pytest.raises(ParameterError, match=r"^the budget \(31 bytes\) is unreachable: the smallest achievable size is 32 bytes and the largest 132 bytes$"):
        solve(HAND, 7, 31)
    with pytest.raises(ParameterError, match=r"smallest achievable size is 32 bytes"):
        solve(HAND, 7, 133)
