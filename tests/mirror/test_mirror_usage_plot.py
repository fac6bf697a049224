"""`usage show --plot`: the history as a layer x expert heatmap through the optional matplotlib extra, and the
one line that says how to install it when the extra is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mirror_builders import run_cli

from colitools.formats.usage import UsageHistory, engine_id, write_usage
from colitools.mirror.usage_plot import usage_matrix


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
