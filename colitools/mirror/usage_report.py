"""``usage show``: what a routing history says (geometry, engine, totals, hottest experts, coverage curve).

The coverage curve answers "how much of the routing would the hottest X% of the expert bytes serve": experts
are ranked by selections per byte (by selections alone when sizes are unknown and assumed equal), and for each
X the selections of the experts that fit in X% of all routed-expert bytes are summed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from colitools.formats.atomic import check_png_path
from colitools.formats.usage import INKLING_FAMILY, UsageHistory, engine_id, read_usage
from colitools.mirror.planned import PlannedMirror, planned_experts, read_planned_mirror
from colitools.mirror.scan import ExpertKey, discover_shards, model_geometry

__all__ = [
    "COVERAGE_POINTS",
    "KNOWN_ENGINES",
    "UsageReport",
    "UsageSummary",
    "engine_name",
    "summarize_usage",
    "usage_report",
]

COVERAGE_POINTS = (1, 2, 5, 10, 20, 25, 50, 75, 100)  # percent of routed-expert bytes

# model_type values of the families colitools handles, for naming an engine id in reports
KNOWN_ENGINES = (
    "glm_moe_dsa",
    "glm4_moe",
    "deepseek_v3",
    "deepseek_v2",
    "kimi_k2",
    "olmoe",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_next",
    "gpt_oss",
    "minimax",
    "minimax_m2",
    "llama4",
    "ernie4_5_moe",
    "dots1",
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
    iku1: bool = False  # read from Inkling's dense binary layout
    layer_totals: dict[int, int] = field(default_factory=dict)
    coverage: list[tuple[int, float]] = field(default_factory=list)  # (percent of bytes, share of selections)

    def to_json(self) -> dict:
        return {
            "n_layers": self.n_layers,
            "n_experts": self.n_experts,
            "engine_id": self.engine_id,
            "engine": self.engine,
            "headerless": self.headerless,
            "iku1": self.iku1,
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
        sizes = {
            k: v
            for k, v in expert_bytes.items()
            if 0 <= k[0] < history.n_layers and 0 <= k[1] < history.n_experts and v > 0
        }
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
        # an IKU1 file holds no engine id: the layout is colibri's inkling engine's own (read for no other model)
        engine=INKLING_FAMILY if history.iku1 else engine_name(history.engine_id),
        headerless=history.headerless,
        iku1=history.iku1,
        total_selections=history.total,
        records=len(history.counts),
        skipped_records=history.skipped_records,
        layers_with_records=len(per_layer),
        sizes_known=bool(expert_bytes),
        hottest=hottest,
        layer_totals=history.layer_totals(),
        coverage=coverage_curve(history, expert_bytes),
    )


@dataclass
class UsageReport:
    """``usage show``: the summary of one history file, read beside its model (``to_json`` is its ``--json``)."""

    file: Path
    model: Path | None  # the model directory giving the geometry and expert sizes (None: none found)
    model_type: str | None  # the model's engine (config.json model_type), when it has one
    geometry_from_model: bool  # the model's config.json gave the layer count
    summary: UsageSummary
    plot: Path | None = None  # the heatmap written (usage show --plot)
    mirror: PlannedMirror | None = None  # the planned mirror named as the model (usage show --model MIRROR)
    on_mirror: frozenset[ExpertKey] = (
        frozenset()
    )  # the experts its plan put on the mirror (marked in the plot)
    figure: object | None = None  # the plot's matplotlib Figure (not part of the JSON)

    @property
    def model_engine_id(self) -> int | None:
        return engine_id(self.model_type) if self.model_type is not None else None

    @property
    def engine_matches_model(self) -> bool | None:
        """Whether the history was recorded by the model's engine (None when either is unknown; an IKU1 history is
        read for an Inkling model only)."""
        if self.summary.iku1 and self.model_type is not None:
            return True
        if self.model_engine_id is None or self.summary.engine_id is None:
            return None
        return self.summary.engine_id == self.model_engine_id

    def to_json(self) -> dict:
        data = self.summary.to_json()
        data["file"] = str(self.file)
        data["model"] = str(self.model) if self.model is not None else None
        data["model_type"] = self.model_type
        data["engine_matches_model"] = self.engine_matches_model
        if self.plot is not None:
            data["plot"] = str(self.plot)
        if self.mirror is not None:
            data["mirror_plan"] = {
                "file": str(self.mirror.plan_file),
                "files": list(self.mirror.files),
                "experts_on_mirror": [list(key) for key in sorted(self.on_mirror)],
            }
        return data


def _model_dirs(
    file: Path, model: str | os.PathLike | None
) -> tuple[Path | None, list[Path], PlannedMirror | None]:
    """The model directory (``model``, or the history's folder when it holds shards), its shard directories, and
    the plan when that directory is a planned mirror (then the model is the one the plan mirrors)."""
    model_dir = Path(model) if model is not None else None
    if model_dir is None and any(p.is_file() for p in file.parent.glob("*.safetensors")):
        model_dir = file.parent
    planned = read_planned_mirror(model_dir) if model_dir is not None else None
    if planned is not None:
        return planned.model_root, [planned.model_root, *planned.source_dirs], planned
    return model_dir, [model_dir] if model_dir is not None else [], None


def usage_report(file: str | os.PathLike, *, model: str | os.PathLike | None = None, top: int = 5,
                 plot: str | os.PathLike | None = None) -> UsageReport:  # fmt: skip
    """Read the history ``file`` whatever engine wrote it (the user named it) and summarize it with the geometry
    and per-expert bytes of ``model`` (default: the file's own folder when it holds shards), ``top`` experts per
    layer; ``plot``: also draw it as a layer x expert heatmap into that PNG (``usage_plot``, matplotlib).
    A ``model`` that is a planned mirror (``mirror stage`` recorded its plan there) stands for the model the plan
    mirrors, and the experts the plan put on the mirror are reported and marked in the plot.
    MirrorError / UsageFileError on a model or history that cannot be read."""
    file = Path(file)
    if plot is not None:
        check_png_path(plot)
    model_dir, shard_dirs, planned = _model_dirs(file, model)
    geometry = model_geometry(model_dir) if model_dir is not None else None
    n_experts = geometry.n_experts if geometry else None
    history = read_usage(
        file,
        n_layers=geometry.n_layers if geometry else None,
        n_experts=n_experts,
        engine=geometry.engine if geometry else None,  # an IKU1 file is read for an Inkling model only
        explicit=True,
    )
    expert_bytes: dict[tuple[int, int], int] | None = None
    if model_dir is not None:  # an expert split over shards counts the bytes of every shard holding it
        expert_bytes = {}
        for shard in discover_shards(shard_dirs, None, n_experts):
            for key, n in shard.expert_bytes.items():
                expert_bytes[key] = expert_bytes.get(key, 0) + n
    report = UsageReport(
        file=file,
        model=model_dir,
        model_type=geometry.engine if geometry else None,
        geometry_from_model=bool(geometry and geometry.n_layers),
        summary=summarize_usage(history, expert_bytes, top=top),
        mirror=planned,
        on_mirror=planned_experts(planned, n_experts) if planned is not None else frozenset(),
    )
    if plot is not None:
        from colitools.mirror.usage_plot import plot_usage

        title = (
            f"{file} - {history.total} selections, {history.n_layers} layers x {history.n_experts} experts"
        )
        marked = report.on_mirror if planned is not None else None
        report.figure = plot_usage(history, plot, title=title, marked=marked)
        report.plot = Path(plot)
    return report
