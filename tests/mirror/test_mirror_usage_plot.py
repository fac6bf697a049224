"""`usage show --plot`: the history as a layer x expert heatmap through the optional matplotlib extra, and the
one line that says how to install it when the extra is missing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from mirror_builders import HEADER, expert_tensors, run_cli, write_config, write_history, write_shard
from safetensors import safe_open

from colitools.formats.usage import UsageHistory, engine_id, write_usage
from colitools.mirror.usage_plot import MARK_LABEL, usage_matrix
from colitools.mirror.usage_report import usage_report


def history(tmp_path):
    h = UsageHistory(3, 4, engine_id("olmoe"), {(0, 1): 9, (2, 3): 100, (1, 0): 1})
    write_usage(tmp_path / ".coli_usage", h)
    return h


def test_the_heatmap_grid_is_the_history_dense():
    h = UsageHistory(3, 4, None, {(0, 1): 9, (2, 3): 100, (1, 0): 1})
    assert usage_matrix(h).tolist() == [[0, 9, 0, 0], [1, 0, 0, 0], [0, 0, 0, 100]]


def test_usage_show_plot_writes_a_png_whose_hottest_cell_is_brightest(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    history(tmp_path)
    r = run_cli("usage", "show", str(tmp_path / ".coli_usage"), "--plot", str(tmp_path / "h.png"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"heatmap    {tmp_path / 'h.png'}"
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(tmp_path / "h.png")[..., :3].sum(axis=-1)  # brightness (inferno: brighter = more)
    assert (
        image.max() > 2.5 and image.min() < 0.5
    )  # the 100-selection cell is near white, a zero cell near black


def test_without_matplotlib_the_plot_is_one_line_saying_how_to_install_it(tmp_path):
    history(tmp_path)
    blocker = tmp_path / "no_extra" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "no_extra")}
    r = subprocess.run([sys.executable, "-m", "colitools", "usage", "show", str(tmp_path / ".coli_usage"), "--plot",
                        str(tmp_path / "h.png")], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 1 and not (tmp_path / "h.png").exists()
    assert r.stderr.splitlines() == [
        "colitools: error: --plot needs matplotlib, an optional extra: pip install 'colitools[plot]'"
    ]


# --- a planned mirror: usage show --model MIRROR marks the experts its plan put on the mirror -------------------

GATE = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.gate_proj\.weight")


def planned_mirror(tmp_path):
    """A 3-layer x 4-expert model in four shards of three experts each, a history, and a mirror staged by the
    real `mirror stage` with room for two shards (the plan picks by benefit per byte)."""
    model, mirror = tmp_path / "model", tmp_path / "mirror"
    model.mkdir()
    write_config(model, n_layers=3, n_experts=4)
    keys = [(layer, e) for layer in range(3) for e in range(4)]
    for i in range(4):  # shard i holds experts 3i..3i+2 in (layer, expert) order: spans layers
        tensors = [t for layer, e in keys[3 * i : 3 * i + 3] for t in expert_tensors(layer, e)]
        write_shard(model / f"model-{i + 1:05d}-of-00004.safetensors", tensors, fill=i)
    counts = {key: 1 + 7 * ((3 * key[0] + 5 * key[1]) % 4) for key in keys}
    write_history(model / ".coli_usage", counts, n_layers=3, n_experts=4)
    shard_bytes = HEADER + 3 * 3 * 1040
    budget_gib = f"{float(Fraction(2 * shard_bytes + 100, 1 << 30)):.12f}"  # two shards fit, three do not
    r = run_cli("mirror", "stage", "--model", str(model), "--mirror", str(mirror), "--budget-gib", budget_gib,
                "--reserve-gib", "0")  # fmt: skip
    assert r.returncode == 0, r.stderr
    return model, mirror


def experts_in_plan(mirror) -> set[tuple[int, int]]:
    """Independently of colitools' scan: the plan file's shard names, and the gate_proj tensors the safetensors
    library lists in the model's copies of them."""
    plan = json.loads((mirror / ".colibri-mirror-plan.json").read_text())
    found = set()
    for entry in plan["files"]:
        with safe_open(str(Path(plan["model_root"]) / entry["name"]), "np") as f:
            found |= {(int(m[1]), int(m[2])) for m in map(GATE.fullmatch, f.keys()) if m}
    return found


def marked_cells(figure) -> set[tuple[int, int]]:
    """The cells the figure outlines: the offsets (expert, layer) of the scatter labelled as the mirror marks."""
    [ax] = [a for a in figure.axes if a.get_label() != "<colorbar>"]
    [marks] = [c for c in ax.collections if c.get_label().startswith(MARK_LABEL)]
    return {(int(round(y)), int(round(x))) for x, y in marks.get_offsets()}


def test_the_heatmap_of_a_planned_mirror_outlines_exactly_the_plans_experts(tmp_path):
    pytest.importorskip("matplotlib")
    model, mirror = planned_mirror(tmp_path)
    expected = experts_in_plan(mirror)
    assert len(expected) == 6  # two shards of three experts: some experts, not all 12
    report = usage_report(model / ".coli_usage", model=mirror, plot=tmp_path / "h.png")
    assert marked_cells(report.figure) == expected
    legend = [t.get_text() for t in report.figure.legends[0].get_texts()]
    assert legend == [f"{MARK_LABEL}: 6"]
    assert report.model == model and (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"


def test_usage_show_of_a_planned_mirror_names_the_plan_and_lists_its_experts(tmp_path):
    model, mirror = planned_mirror(tmp_path)
    r = run_cli("usage", "show", str(model / ".coli_usage"), "--model", str(mirror), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["model"] == str(model) and data["mirror_plan"]["file"] == str(
        mirror / ".colibri-mirror-plan.json"
    )
    assert {tuple(k) for k in data["mirror_plan"]["experts_on_mirror"]} == experts_in_plan(mirror)
    text = run_cli("usage", "show", str(model / ".coli_usage"), "--model", str(mirror)).stdout
    assert f"mirror     {mirror / '.colibri-mirror-plan.json'}: 2 shard(s), 6 experts on the mirror" in text


def test_a_model_without_a_plan_is_drawn_without_marks(tmp_path):
    pytest.importorskip("matplotlib")
    model, _ = planned_mirror(tmp_path)
    report = usage_report(model / ".coli_usage", model=model, plot=tmp_path / "h.png")
    ax = report.figure.axes[0]
    assert not ax.collections and not report.figure.legends and "mirror_plan" not in report.to_json()


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ("[1]", "expected a JSON object"),
        ('{"schema": "other"}', "schema is 'other', expected 'colibri.partial-mirror.v1'"),
        (
            '{"schema": "colibri.partial-mirror.v1", "model_root": "MODEL", "source_dirs": [], "files": [{"name": '
            '"nope.safetensors"}]}',
            "names 'nope.safetensors', which is not a shard of",
        ),
        (
            '{"schema": "colibri.partial-mirror.v1", "model_root": "MODEL", "source_dirs": [], "files": [3]}',
            "`files` is not a list of {name, ...} objects",
        ),
    ],
)
def test_a_damaged_plan_is_one_line_naming_it(tmp_path, plan, message):
    model, mirror = planned_mirror(tmp_path)
    (mirror / ".colibri-mirror-plan.json").write_text(plan.replace("MODEL", str(model)))
    r = run_cli("usage", "show", str(model / ".coli_usage"), "--model", str(mirror))
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert (
        r.stderr.startswith("colitools: error: ")
        and message in r.stderr
        and ".colibri-mirror-plan.json" in r.stderr
    )
