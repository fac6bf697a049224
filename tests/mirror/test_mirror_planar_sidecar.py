"""A planar conversion keeps its routed experts in the experts-int4g64/ sidecar (docs/FORMATS.md §4): the mirror
scan counts them as expert bytes, but a receipt names plain shard files only, so the plan never selects them
and says so; a staged mirror of such a model verifies."""

from __future__ import annotations

from pathlib import Path

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.usage import UsageHistory, engine_id, write_usage
from colitools.mirror.plan import plan_mirror
from colitools.mirror.scan import discover_shards

ROOT = Path(__file__).resolve().parents[2]


def _planar_model(tmp_path: Path) -> Path:
    out = tmp_path / "planar"
    convert(str(ROOT / "oracles" / "olmoe"), out, ConvertOptions(layout="planar", progress=False, min_free_gb=0))
    history = UsageHistory(n_layers=2, n_experts=6, engine_id=engine_id("olmoe"))
    for layer in range(2):
        for expert in range(6):
            history.add(layer, expert, 1 + expert)
    write_usage(out / ".coli_usage", history)
    return out


def test_sidecar_files_count_as_expert_bytes_but_are_never_selected(tmp_path):
    model = _planar_model(tmp_path)
    shards = discover_shards([model], [])
    sidecar = [s for s in shards if s.name.startswith("experts-int4g64/")]
    assert len(sidecar) == 2 and all(s.expert_bytes for s in sidecar)
    plan = plan_mirror(model, tmp_path / "mirror", budget_bytes=1 << 30, reserve_bytes=0)
    assert all("/" not in f.name for f in plan.files)
    assert any("planar sidecar (2 file(s)" in w for w in plan.warnings)
