"""Size budgets (docs/FORMATS.md §12): the solver against brute force, and whole conversions of oracle fixtures
under ``target_size`` against the uniform recipe of the same size."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from colitools.converters.allocation import Item, lower_hull, solve
from colitools.converters.budget import ROLE_IMPORTANCE
from colitools.converters.options import ConvertOptions
from colitools.converters.recipe import Role
from colitools.converters.runner import convert
from colitools.formats.errors import ConvertError, ParameterError


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


# ------------------------------------------------------------------------------------ whole conversions
ORACLES = Path(__file__).resolve().parents[2] / "oracles"
UNIFORM = dict.fromkeys(("experts", "dense", "embed", "mtp"), "int3-g64")


def _index_size(folder: Path) -> int:
    return json.loads((folder / "model.safetensors.index.json").read_text())["metadata"]["total_size"]


def _recorded_sse(folder: Path) -> dict[str, float]:
    """Each written tensor's squared error as the conversion recorded it (``units[key]["errors"]``)."""
    units = json.loads((folder / "colitools.json").read_text())["units"]
    return {name: e[1] for u in units.values() for name, e in u.get("errors", {}).items()}


def _convert(src: Path, out: Path, **kw):
    return convert(str(src), out, ConvertOptions(progress=False, **kw))


@pytest.mark.parametrize("fixture", ["olmoe", "qwen3_moe"])
def test_budget_at_uniform_int3_size(tmp_path, fixture):
    src = ORACLES / fixture
    _convert(src, tmp_path / "uniform", **UNIFORM)
    budget = _index_size(tmp_path / "uniform")  # the size of the real uniform int3-g64 conversion
    summary = _convert(src, tmp_path / "budget", target_size=budget)
    achieved = _index_size(tmp_path / "budget")
    assert 0.99 * budget <= achieved <= budget
    assert summary.budget["achieved_bytes"] == achieved and summary.budget["budget_bytes"] == budget
    uniform, budgeted = _recorded_sse(tmp_path / "uniform"), _recorded_sse(tmp_path / "budget")
    assert set(uniform) == set(budgeted)
    report = json.loads((tmp_path / "budget/colitools.json").read_text())["budget"]
    imp = {name: t["importance"] for name, t in report["tensors"].items()}
    assert {imp[n] for n in imp if ".experts." in n} == {ROLE_IMPORTANCE[Role.EXPERT]}  # no usage history
    assert imp["lm_head.weight"] == ROLE_IMPORTANCE[Role.EMBED]
    assert imp["model.layers.1.self_attn.o_proj.weight"] == ROLE_IMPORTANCE[Role.DENSE]
    # the objective, on what both conversions recorded as they wrote: never above the uniform recipe's
    assert _weighted(budgeted, imp) <= _weighted(uniform, imp)
    # what the allocation predicted per tensor is what the conversion measured as it wrote
    for name, t in report["tensors"].items():
        assert t["sse"] == pytest.approx(budgeted[name], rel=1e-12, abs=1e-12)
    assert report["predicted_error"] == pytest.approx(_weighted(budgeted, imp))


def _weighted(sse: dict[str, float], imp: dict[str, float]) -> float:
    return sum(imp[n] * e for n, e in sse.items() if n in imp)  # (the F32 tensors: no error, not budgeted)


def test_budget_beats_uniform_on_qwen3_moe(tmp_path):
    # qwen3_moe's tensors differ enough that mixing formats pays: strictly less error at the same size
    src = ORACLES / "qwen3_moe"
    _convert(src, tmp_path / "uniform", **UNIFORM)
    _convert(src, tmp_path / "budget", target_size=_index_size(tmp_path / "uniform"))
    uniform, budgeted = _recorded_sse(tmp_path / "uniform"), _recorded_sse(tmp_path / "budget")
    report = json.loads((tmp_path / "budget/colitools.json").read_text())["budget"]
    imp = {name: t["importance"] for name, t in report["tensors"].items()}
    assert _weighted(budgeted, imp) < 0.8 * _weighted(uniform, imp)


def test_target_bpw_counts_every_float_element(tmp_path):
    from safetensors.numpy import load_file

    src = ORACLES / "olmoe"
    elements = sum(a.size for a in load_file(str(src / "model.safetensors")).values())  # all float, none dropped
    summary = _convert(src, tmp_path / "o", target_bpw=3.3)
    assert summary.budget["budget_bytes"] == int(3.3 * elements / 8)
    assert 0.99 * summary.budget["budget_bytes"] <= _index_size(tmp_path / "o") <= summary.budget["budget_bytes"]


def test_unreachable_budget_is_one_line_exit_2(tmp_path):
    with pytest.raises(ParameterError, match=r"^`target_size=1000` \(1000 bytes\) is unreachable: the smallest "
                       r"achievable size is \d+ bytes and the largest \d+ bytes$") as exc:  # fmt: skip
        _convert(ORACLES / "olmoe", tmp_path / "o", target_size=1000)
    assert exc.value.exit_code == 2
    # refused before any output: only the measurements are kept, for the next budget
    assert [p.name for p in (tmp_path / "o").iterdir()] == [".colitools-budget.json"]
    run = subprocess.run(
        [sys.executable, "-m", "colitools", "convert", str(ORACLES / "olmoe"), str(tmp_path / "o"),
         "--target-size", "1TB"], capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "--target-size 1000000000000" in run.stderr, run.stderr
    assert "largest" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"target_size": "25GiB", "target_bpw": 3.0}, "two budgets"),
        ({"target_size": "25GiB", "experts": "int4-row"}, "replaces `experts=int4-row`"),
        ({"target_bpw": 0.0}, "bits per weight"),
        ({"target_size": "12 parsecs"}, "a size such as"),
        ({"usage": "x.coli_usage"}, "`usage` weights a size budget"),
    ],
)
def test_contradictions_refused(kw, message):
    with pytest.raises(ParameterError, match=message):
        ConvertOptions(**kw)


def test_cache_reused_and_another_budget_refuses_to_mix(tmp_path):
    src, out = ORACLES / "olmoe", tmp_path / "o"
    first = _convert(src, out, target_size=100_000)
    n = first.budget["measurement"]["tensors"]
    assert first.budget["measurement"]["measured"] == n > 0
    cache = out / ".colitools-budget.json"
    stamp = cache.stat().st_mtime_ns
    again = _convert(src, out, target_size=100_000)  # the complete output: nothing converted, nothing measured
    assert again.units_converted == 0
    assert again.budget["measurement"] == {**again.budget["measurement"], "measured": 0, "cached": n}
    # another budget, in another folder holding the cache only: measured from the cache, not again
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / cache.name).write_bytes(cache.read_bytes())
    other = _convert(src, tmp_path / "p", target_size=90_000)
    assert other.budget["measurement"]["measured"] == 0
    assert _index_size(tmp_path / "p") <= 90_000
    assert cache.stat().st_mtime_ns == stamp
    with pytest.raises(ConvertError, match="another recipe .*budget"):
        _convert(src, out, target_size=90_000)  # this folder holds the 100 kB allocation: not mixed


def test_usage_history_weights_routed_experts(tmp_path):
    from colitools.formats.usage import UsageHistory, write_usage

    src = ORACLES / "olmoe"  # 2 layers x 6 experts
    counts = {(0, 0): 90, (0, 1): 10}  # layer 0: expert 0 has 90% of the selections; layer 1 has no records
    write_usage(tmp_path / "u.coli_usage", UsageHistory(2, 6, None, counts))
    summary = _convert(src, tmp_path / "o", target_size=100_000, usage=str(tmp_path / "u.coli_usage"))
    assert "tensors" not in summary.to_dict()["budget"]  # per tensor: colitools.json and --dry-run --json
    recorded = json.loads((tmp_path / "o/colitools.json").read_text())["budget"]["tensors"]
    imp = {n: t["importance"] for n, t in recorded.items()}
    hot = "model.layers.0.mlp.experts.0.down_proj.weight"
    assert imp[hot] == pytest.approx(0.9 * 6)
    assert imp["model.layers.0.mlp.experts.1.up_proj.weight"] == pytest.approx(0.1 * 6)
    assert imp["model.layers.0.mlp.experts.5.up_proj.weight"] == 0.05  # never selected: the floor, not 0
    assert imp["model.layers.1.mlp.experts.5.up_proj.weight"] == 1.0  # a layer without records
    assert imp["model.layers.0.self_attn.q_proj.weight"] == ROLE_IMPORTANCE[Role.DENSE]


def test_dry_run_prints_the_allocation_and_writes_nothing(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "colitools", "convert", str(ORACLES / "olmoe"), str(tmp_path / "o"),
         "--target-size", "100kB", "--dry-run"], capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert not (tmp_path / "o").exists()
    lines = run.stdout.splitlines()
    budget = next(line for line in lines if line.startswith("budget: "))
    assert "of 100.00 kB" in budget and "measured 46 tensors" in budget
    rows = [line.split() for line in lines if line.startswith("  expert ") or line.startswith("  dense ")]
    assert {r[1] for r in rows} == {"model.layers.0", "model.layers.1"}
    assert all(r[-3] == "bpw" and r[-2] == "sse" for r in rows)
    js = subprocess.run(
        [sys.executable, "-m", "colitools", "convert", str(ORACLES / "olmoe"), str(tmp_path / "o"),
         "--target-size", "100kB", "--dry-run", "--json"], capture_output=True, text=True,
    )  # fmt: skip
    plan = json.loads(js.stdout)
    tensors = plan["budget"]["tensors"]
    assert len(tensors) == 46
    assert sum(t["bytes"] for t in tensors.values()) <= 100_000
    assert not (tmp_path / "o").exists()


def test_large_tensors_measured_on_a_row_sample(tmp_path):
    from tinyckpt import Tiny, make_checkpoint

    from colitools.converters.budget import SAMPLE_ELEMS

    spec = Tiny(layers=1, experts=2, hidden=1024, inter=768, vocab=512)  # 1024 x 1024 attention: 2x SAMPLE_ELEMS
    assert 1024 * 1024 > SAMPLE_ELEMS
    make_checkpoint(tmp_path / "src", spec)
    _convert(tmp_path / "src", tmp_path / "uniform", **UNIFORM)
    budget = _index_size(tmp_path / "uniform")
    _convert(tmp_path / "src", tmp_path / "budget", target_size=budget)
    assert 0.99 * budget <= _index_size(tmp_path / "budget") <= budget
    recorded = _recorded_sse(tmp_path / "budget")
    report = json.loads((tmp_path / "budget/colitools.json").read_text())["budget"]
    shapes = spec.names_2d()
    sampled = [n for n in report["tensors"] if shapes[n][0] * shapes[n][1] > SAMPLE_ELEMS]
    assert any("self_attn" in n for n in sampled) and "lm_head.weight" not in sampled  # 512 x 1024: whole
    for name, t in report["tensors"].items():
        if name in sampled:  # every k-th row: an estimate of what the conversion recorded
            assert t["sse"] == pytest.approx(recorded[name], rel=0.1)
        else:  # small enough to be measured whole: exactly what the conversion recorded
            assert t["sse"] == pytest.approx(recorded[name], rel=1e-12)
    assert any(report["tensors"][n]["sse"] != recorded[n] for n in sampled)


@pytest.mark.parametrize(("fixture", "target", "size"), [("qwen3_5_moe", "qwen36", 300_000), ("inkling", "inkling", 500_000)])
def test_targets_that_stack_experts_get_one_format_per_stack(tmp_path, fixture, target, size):
    from colitools.verify.container import verify_container

    summary = _convert(ORACLES / fixture, tmp_path / "o", target=target, target_size=size)
    assert 0.99 * size <= _index_size(tmp_path / "o") <= size
    data = json.loads((tmp_path / "o/colitools.json").read_text())
    tensors = data["budget"]["tensors"]
    routed = {t["format"] for n, t in tensors.items() if ".experts." in n and ".shared_experts." not in n}
    assert len(routed) == 1 and data["recipe"]["experts"] == routed.pop()  # merged blobs / fused stacks: one
    shared = defaultdict(set)  # a stacked shared expert (inkling) is one float stack: one dtype per projection
    for n, t in tensors.items():
        if ".shared_experts." in n:
            shared[(n.split(".shared_experts.")[0], n.rsplit(".", 2)[-2])].add(t["format"])
    assert all(len(v) == 1 for v in shared.values())
    assert summary.units_converted == summary.units_total
    assert verify_container(tmp_path / "o").ok


def test_hub_source_measured_by_range_requests_as_a_local_one(hub, tmp_path):
    from tinyckpt import Tiny, make_checkpoint

    spec = Tiny(layers=1, experts=2, hidden=1024, inter=2048, vocab=512, shards=2)  # big tensors: 1/4-1/2 rows
    make_checkpoint(tmp_path / "src", spec)
    hub.add_repo("org/tiny", {"main": tmp_path / "src"})
    shards = sorted(p.name for p in (tmp_path / "src").glob("*.safetensors"))
    local = _convert(tmp_path / "src", tmp_path / "local", target_size=8_000_000, dry_run=True)
    remote = _convert("org/tiny", tmp_path / "remote", target_size=8_000_000, dry_run=True)
    assert remote.budget["tensors"] == local.budget["tensors"]  # the same rows read, the same figures
    assert remote.budget["measurement"]["measured"] == len(remote.budget["tensors"]) > 0
    served = sum(hub.stats(s).bytes_served for s in shards)
    assert served < 0.5 * sum((tmp_path / "src" / s).stat().st_size for s in shards)  # samples, not the model
    assert all(hub.stats(s).gets > 2 for s in shards)  # header reads, then Range requests
    assert not (tmp_path / "remote").exists()


def test_hub_source_converted_under_a_budget_downloads_each_shard_once(hub, tmp_path):
    hub.add_repo("org/olmoe", {"main": ORACLES / "olmoe"})
    _convert(ORACLES / "olmoe", tmp_path / "local", target_size=100_000)
    _convert("org/olmoe", tmp_path / "remote", target_size=100_000)
    for name in ("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "config.json"):
        assert (tmp_path / "remote" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    size = (ORACLES / "olmoe" / "model.safetensors").stat().st_size
    ranges = hub.stats("model.safetensors").ranges
    assert ranges.count((0, size)) == 1  # one whole download, for the conversion
    assert len(ranges) > 10 and all(r == (0, size) or r[1] - r[0] < size // 4 for r in ranges)  # + Range reads


def test_hub_fp8_tensor_that_would_be_read_whole_is_refused(hub, tmp_path):
    from tinyckpt import Tiny, make_checkpoint

    make_checkpoint(tmp_path / "src", Tiny(layers=1, experts=2, hidden=1024, inter=768, vocab=512, dtype="FP8"))
    hub.add_repo("org/fp8", {"main": tmp_path / "src"})
    with pytest.raises(ParameterError, match=r"measure a Hub source from samples of its float tensors' rows; "
                       r"tensor \S+ \(model.safetensors\) is FP8 block-scaled and would be read whole") as exc:
        _convert("org/fp8", tmp_path / "o", target_size=2_000_000)  # fmt: skip
    assert exc.value.exit_code == 2
    assert hub.stats("model.safetensors").bytes_served < (tmp_path / "src/model.safetensors").stat().st_size


def test_usage_from_a_route_trace(tmp_path):
    from colitools.formats.route_trace import format_trace_line

    lines = [format_trace_line(0, r, 0, [0, 1] if r < 3 else [0, 2], [0.5, 0.5]) for r in range(4)]
    lines += [format_trace_line(0, r, 1, [9], [1.0]) for r in range(2)]  # an expert out of range: not counted
    (tmp_path / "trace").write_text("".join(lines))
    _convert(ORACLES / "olmoe", tmp_path / "o", target_size=100_000, usage=str(tmp_path / "trace"))
    recorded = json.loads((tmp_path / "o/colitools.json").read_text())["budget"]["tensors"]
    imp = {n: t["importance"] for n, t in recorded.items()}
    # layer 0: 8 selections, expert 0 has 4 (x 6 experts / 8 = 3), expert 1 3, expert 2 1, the others none
    assert imp["model.layers.0.mlp.experts.0.gate_proj.weight"] == pytest.approx(3.0)
    assert imp["model.layers.0.mlp.experts.1.gate_proj.weight"] == pytest.approx(3 * 6 / 8)
    assert imp["model.layers.0.mlp.experts.2.gate_proj.weight"] == pytest.approx(6 / 8)
    assert imp["model.layers.0.mlp.experts.3.gate_proj.weight"] == 0.05
    assert imp["model.layers.1.mlp.experts.3.gate_proj.weight"] == 1.0


def test_measurement_is_the_same_on_one_thread(tmp_path, monkeypatch):
    from colitools.converters import budget

    src = ORACLES / "qwen3_moe"
    many = _convert(src, tmp_path / "a", target_size=100_000, dry_run=True)
    monkeypatch.setattr(budget, "MEASURE_THREADS", 1)
    one = _convert(src, tmp_path / "b", target_size=100_000, dry_run=True)
    assert one.budget["tensors"] == many.budget["tensors"]
    assert one.budget["predicted_error"] == many.budget["predicted_error"]


def test_model_card_states_the_budget_and_the_bits_per_weight(tmp_path):
    from colitools.converters.manifest import Manifest
    from colitools.converters.model_card import build_card

    out = tmp_path / "o"
    _convert(ORACLES / "olmoe", out, target_bpw=3.2)
    files = [(p.name, p.stat().st_size) for p in out.iterdir() if p.is_file() and not p.name.startswith(".")]
    card = build_card(out, Manifest.load(out / "colitools.json"), "me/olmoe-budget", files)
    assert "| budget | at most 3.2 bits per weight, formats chosen per tensor" in card
    assert "| experts |" not in card and "| dense |" not in card  # the options the budget replaced
    assert ", 3.20 bits per weight**" in card
