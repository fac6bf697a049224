"""A size budget chooses the routed experts' formats at the grain the target's engine allows
(``Target.expert_granularity``, docs/FORMATS.md §12): per tensor, per expert, per layer or one for all."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from colitools.converters.budget import Measured, _expert_groups
from colitools.converters.options import ConvertOptions
from colitools.converters.recipe import Role
from colitools.converters.runner import convert
from colitools.formats import targets
from colitools.formats.targets import qwen36
from colitools.formats.targets.base import EXPERT_GRANULARITIES
from tests.converters.test_reuse import ROOT

QWEN = ROOT / "oracles" / "qwen3_5_moe"


def _measured() -> dict[str, Measured]:
    """Two layers x two experts x (gate, down), and one attention tensor."""
    out = {}
    for layer in (0, 1):
        for e in (0, 1):
            for proj in ("gate_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
                out[name] = Measured(Role.EXPERT, f"model.layers.{layer}", 8, 8, {"int8-row": (8, 1.0)}, e, layer)
    out["model.layers.0.self_attn.o_proj.weight"] = Measured(Role.DENSE, "model.layers.0", 8, 8, {"int8-row": (8, 1.0)})
    return out


def _names(layer: int, experts=(0, 1)) -> list[str]:
    return sorted(f"model.layers.{layer}.mlp.experts.{e}.{p}.weight" for e in experts for p in ("down_proj", "gate_proj"))


@pytest.mark.parametrize(
    ("grain", "expected"),
    [
        ("tensor", []),
        ("expert", [_names(0, (0,)), _names(0, (1,)), _names(1, (0,)), _names(1, (1,))]),
        ("layer", [_names(0), _names(1)]),
        ("uniform", [_names(0) + _names(1)]),
    ],
)
def test_routed_experts_are_grouped_at_the_engines_grain(grain, expected):
    assert _expert_groups(_measured(), grain) == expected


def test_every_target_records_its_expert_grain():
    for target in targets.TARGETS.values():
        assert target.expert_granularity in EXPERT_GRANULARITIES, target.name
    # the loaders read (each target module cites the lines): only c/colibri.c resolves each expert tensor alone
    assert {t.name: t.expert_granularity for t in targets.TARGETS.values()}["generic"] == "tensor"


def _per_layer(summary) -> dict[str, set[str]]:
    per = defaultdict(set)
    for name, v in summary.budget["tensors"].items():
        if ".mlp.experts." in name:
            per[name.split(".mlp.")[0]].add(v["format"])
    return per


def test_a_per_layer_grain_gives_each_layer_one_format_and_never_a_worse_objective(tmp_path):
    # a merged-blob target whose engine would allow a format per layer (qwen36 itself needs one for all: its
    # one expert_gs); 260 kB lies between the uniform int4-g32 and int8-row sizes of this fixture
    layered = replace(qwen36.TARGET, expert_granularity="layer")
    common = {"target_size": 260000, "dry_run": True, "progress": False}
    per_layer = convert(str(QWEN), tmp_path / "a", ConvertOptions(target=layered, **common))
    uniform = convert(str(QWEN), tmp_path / "b", ConvertOptions(target=qwen36.TARGET, **common))
    layers = _per_layer(per_layer)
    assert len(layers) == 2 and all(len(f) == 1 for f in layers.values())
    assert len({f.pop() for f in _per_layer(uniform).values()}) == 1  # one format for all of them
    assert per_layer.budget["predicted_error"] <= uniform.budget["predicted_error"]
    assert per_layer.budget["achieved_bytes"] <= 260000
