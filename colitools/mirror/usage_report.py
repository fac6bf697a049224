"""``usage show``: what a routing history says (geometry, engine, totals, hottest experts, coverage curve).

The coverage curve answers "how much of the routing would the hottest X% of the expert bytes serve": experts
are ranked by selections per byte (by selections alone when sizes are unknown and assumed equal), and for each
X the selections of the experts that fit in X% of all routed-expert bytes are summed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from colitools.formats.usage import UsageHistory, engine_id

__all__ = ["COVERAGE_POINTS", "KNOWN_ENGINES", "UsageSummary", "engine_name", "summarize_usage"]

COVERAGE_POINTS = (1, 2, 5, 10, 20, 25, 50, 75, 100)  # percent of routed-expert bytes

# model_type values of the families colitools handles, for naming an engine id in reports
KNOWN_ENGINES = (
    "glm_moe_dsa", "glm4_moe", "deepseek_v3", "deepseek_v2", "kimi_k2", "olmoe", "mixtral", "qwen2_moe",
    "qwen3_moe", "qwen3_next", "gpt_oss", "minimax", "minimax_m2", "llama4", "ernie4_5_moe", "dots1",
)
_BY_ID = {engine_id(name): name for name in KNOWN_ENGINES}


def engine_name(eid: int | None) -> str | None:
    """The engine name an id is the FNV-1a hash of, when it is one of ``KNOWN_ENGINES``."""
    return _BY_ID.get(eid) if eid is not None else None


@dataclass
class UsageSummary:
    """Numbers of ``usage show`` (``to_json`` is its ``--json`` output)."""

    n_layers: int
    n_experts: int
    engine_id: int | None
    engine: str | None
    headerless: bool
    total_selections: int
    records: int
    skipped_records: int
    layers_with_records: int
    sizes_known: bool
    hottest: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # layer -> [(expert, count)]
    layer_totals: dict[int, int] = field(default_factory=dict)
    coverage: list[tuple[int, float]] = field(default_factory=list)  # (percent of bytes, share of selections)

    def to_json(self) -> dict:
        return {
            "n_layers": self.n_layers,
            "n_experts": self.n_experts,
            "engine_id": self.engine_id,
            "engine": self.engine,
            "headerless": self.headerless,
            "total_selections": self.total_selections,
            "records": self.records,
            "skipped_records": self.skipped_records,
            "layers_with_records": self.layers_with_records,
            "expert_sizes_known": self.sizes_known,
            "layers": [
                {
                    "layer": layer,
                    "selections": self.layer_totals.get(layer, 0),
                    "hottest": [{"expert": e, "count": n} for e, n in self.hottest[layer]],
                }
                for layer in sorted(self.hottest)
            ],
            "coverage": [{"bytes_percent": p, "selections_share": s} for p, s in self.coverage],
        }


def coverage_curve(
    history: UsageHistory,
    expert_bytes: Mapping[tuple[int, int], int] | None = None,
    points: Sequence[int] = COVERAGE_POINTS,
) -> list[tuple[int, float]]:
    """Share of all selections served by the hottest experts that fit in each percentage of expert bytes."""
    total = history.total
    if expert_bytes:
        sizes = {k: v for k, v in expert_bytes.items()
                 if 0 <= k[0] < history.n_layers and 0 <= k[1] < history.n_experts and v > 0}
    else:
        sizes = {(layer, e): 1 for layer in range(history.n_layers) for e in range(history.n_experts)}
    all_bytes = sum(sizes.values())
    if total == 0 or all_bytes == 0:
        return [(p, 0.0) for p in points]
    # rank by selections per byte (a float ranking is precise enough for a report), then by key
    ranked = sorted(
        (k for k in sizes if history.count(*k) > 0),
        key=lambda k: (-history.count(*k) / sizes[k], k),
    )
    curve = []
    for p in points:
        limit = all_bytes * p / 100
        used = covered = 0
        for k in ranked:
            if used + sizes[k] > limit:
                break
            used += sizes[k]
            covered += history.count(*k)
        curve.append((p, covered / total))
    return curve


def summarize_usage(
    history: UsageHistory, expert_bytes: Mapping[tuple[int, int], int] | None = None, top: int = 5
) -> UsageSummary:
    """Summarize a history; ``expert_bytes`` (from the model's shards) makes the coverage curve byte-exact."""
    per_layer: dict[int, list[tuple[int, int]]] = {}
    for (layer, expert), n in history.counts.items():
        per_layer.setdefault(layer, []).append((expert, n))
    hottest = {layer: sorted(items, key=lambda t: (-t[1], t[0]))[:top] for layer, items in per_layer.items()}
    return UsageSummary(
        n_layers=history.n_layers,
        n_experts=history.n_experts,
        engine_id=history.engine_id,
        engine=engine_name(history.engine_id),
        headerless=history.headerless,
        total_selections=history.total,
        records=len(history.counts),
        skipped_records=history.skipped_records,
        layers_with_records=len(per_layer),
        sizes_known=bool(expert_bytes),
        hottest=hottest,
        layer_totals=history.layer_totals(),
        coverage=coverage_curve(history, expert_bytes),
    )
