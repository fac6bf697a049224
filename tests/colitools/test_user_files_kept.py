"""Nothing of the user's is overwritten (issue 43 item 6): ``run --route-trace FILE`` and ``usage pairs --out FILE``
replace an existing file only when it is their own format (a previous trace, a previous table), and ``usage pairs``
refuses traces of different geometry instead of merging them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_helpers import one_line_error, run_cli

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "olmoe"
RUN = ("--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--no-usage")
TRACE_2x2 = "0 0 0 1:0.6000 3:0.4000\n0 0 1 2:0.5000 0:0.5000\n1 0 0 3:0.7000 1:0.3000\n1 0 1 0:0.9000 2:0.1000\n"
TRACE_3x1 = "0 0 0 1:1.0000\n0 0 1 2:1.0000\n0 0 2 0:1.0000\n"  # 3 MoE layers, top-1: another model


@pytest.fixture
def model(tmp_path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "model")
    return tmp_path / "model"


def test_route_trace_refuses_a_file_that_is_not_a_trace(model):
    config = model / "config.json"
    before = config.read_bytes()
    one_line_error(run_cli("run", model, *RUN, "--route-trace", config), str(config), "not a route trace", code=1)
    assert config.read_bytes() == before


def test_route_trace_replaces_a_previous_trace_and_writes_a_new_file(model, tmp_path):
    trace = tmp_path / "route.trace"
    assert run_cli("run", model, *RUN, "--route-trace", trace).returncode == 0
    first = trace.read_text()
    assert first and all(line.split()[3:] for line in first.splitlines())
    trace.write_text(TRACE_2x2)  # a trace (of another run): ours to replace
    assert run_cli("run", model, *RUN, "--route-trace", trace).returncode == 0
    assert trace.read_text() == first


def test_usage_pairs_refuses_to_overwrite_a_models_config(model, tmp_path):
    trace = tmp_path / "a.trace"
    trace.write_text(TRACE_2x2)
    config = model / "config.json"
    before = config.read_bytes()
    result = run_cli("usage", "pairs", trace, "--out", config)
    one_line_error(result, str(config), "not a .coli_pairs table", code=1)
    assert config.read_bytes() == before
    out = tmp_path / "t.coli_pairs"
    assert run_cli("usage", "pairs", trace, "--out", out).returncode == 0
    table = out.read_bytes()
    assert table.startswith(b"COLIPAIRS 1 ")
    assert run_cli("usage", "pairs", trace, trace, "--out", out).returncode == 0  # a table of ours: replaced
    assert out.read_bytes() != table


def test_usage_pairs_refuses_traces_of_different_geometry(tmp_path):
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    a.write_text(TRACE_2x2)
    b.write_text(TRACE_3x1)
    out = tmp_path / "t.coli_pairs"
    result = run_cli("usage", "pairs", a, b, "--out", out)
    one_line_error(result, str(b), str(a), "3 MoE layers", "2 MoE layers", "not merged", code=1)
    assert not out.exists()
