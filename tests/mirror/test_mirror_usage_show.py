"""`colitools usage show` and the summary behind it (hand-computed coverage), plus the bandwidth probe."""

from __future__ import annotations

import json
import os

import pytest
from mirror_builders import expert_tensors, run_cli, write_config, write_history, write_shard

from colitools.formats.usage import UsageHistory, engine_id
from colitools.mirror.probe import probe_directory, probe_file
from colitools.mirror.usage_report import coverage_curve, summarize_usage


def history(counts, layers=2, experts=4, engine="olmoe") -> UsageHistory:
    h = UsageHistory(layers, experts, engine_id(engine))
    for key, n in counts.items():
        h.add(*key, n)
    return h


def test_coverage_with_equal_sizes_counts_the_hottest_experts():
    # 8 experts, 100 selections: 60, 30, 10 -> 1 expert is 12.5% of the bytes
    h = history({(0, 0): 60, (1, 2): 30, (0, 3): 10})
    curve = dict(coverage_curve(h, points=(10, 12.5, 25, 37.5, 100)))
    assert curve == {10: 0.0, 12.5: 0.6, 25: 0.9, 37.5: 1.0, 100: 1.0}


def test_coverage_with_real_sizes_ranks_by_selections_per_byte():
    h = history({(0, 0): 60, (0, 1): 40})
    sizes = {(0, e): 100 for e in range(4)} | {(1, e): 100 for e in range(4)}
    sizes[(0, 0)] = 300  # 1000 bytes in all; (0,1) has more selections per byte (0.4 vs 0.2)
    curve = dict(coverage_curve(h, sizes, points=(10, 30, 40, 100)))
    assert curve == {10: 0.4, 30: 0.4, 40: 1.0, 100: 1.0}


def test_summary_lists_the_hottest_experts_per_layer():
    s = summarize_usage(history({(0, 0): 5, (0, 1): 9, (0, 2): 9, (1, 3): 1}), top=2)
    assert s.hottest == {0: [(1, 9), (2, 9)], 1: [(3, 1)]}
    assert (s.total_selections, s.records, s.layers_with_records, s.engine) == (24, 4, 2, "olmoe")


def test_usage_show_prints_geometry_engine_totals_hottest_and_coverage(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    write_config(model, n_layers=2, n_experts=4)
    write_shard(model / "a.safetensors", [t for e in range(4) for t in expert_tensors(0, e)])
    write_history(model / ".coli_usage", {(0, 1): 30, (0, 2): 10, (1, 0): 60}, n_layers=2, n_experts=4)
    r = run_cli("usage", "show", str(model / ".coli_usage"))
    assert r.returncode == 0, r.stderr
    assert "2 layers x 4 experts (header)" in r.stdout
    assert f"id {engine_id('olmoe')} = 'olmoe'" in r.stdout
    assert "100 selections, 3 experts with records, 2 layers with records" in r.stdout
    assert "1=30 (75.0%)  2=10 (25.0%)" in r.stdout
    assert "expert bytes from" in r.stdout  # the file's directory holds the shards
    r = run_cli("usage", "show", str(model / ".coli_usage"), "--json")
    data = json.loads(r.stdout)
    assert data["total_selections"] == 100 and data["engine_matches_model"] is True
    assert data["layers"][1] == {"layer": 1, "selections": 60, "hottest": [{"expert": 0, "count": 60}]}
    # layer 1 has no shard here, so only layer 0's 4 experts have bytes: 25% of them is expert (0,1)
    assert {c["bytes_percent"]: c["selections_share"] for c in data["coverage"]}[25] == pytest.approx(0.3)


def test_usage_show_legacy_file_and_another_engine(tmp_path):
    path = tmp_path / "legacy_usage"
    path.write_text("0 1 5\r\n3 2 7\r\n")
    r = run_cli("usage", "show", str(path))
    assert r.returncode == 0 and "4 layers x 3 experts (legacy headerless" in r.stdout
    assert "engine     unknown" in r.stdout and "experts assumed equal in size" in r.stdout
    other = tmp_path / "other"
    other.write_text(f"-1 2 2\n-2 1 {engine_id('deepseek_v3')}\n1 1 4\n")
    r = run_cli("usage", "show", str(other))
    assert r.returncode == 0 and "'deepseek_v3'" in r.stdout  # named explicitly: shown, not refused


def test_usage_show_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad"
    bad.write_text("-1 2 2\n-2 2 0\n")
    r = run_cli("usage", "show", str(bad))
    assert r.returncode == 1 and r.stderr.startswith("colitools: error:") and "version 2" in r.stderr


def test_probe_reads_a_file_and_says_whether_the_page_cache_may_distort_it(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(9 << 20))
    r = probe_file(path, seconds=5, max_bytes=64 << 20)
    assert r.bytes_read == 9 << 20 and r.bytes_per_second > 0
    assert (r.note is None) == r.direct_io
    if not r.direct_io:
        assert "page cache" in r.note


def test_probe_of_an_empty_directory_uses_a_temporary_file_and_removes_it(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    r = probe_directory(d / "not-yet", seconds=5, probe_file_bytes=4 << 20)
    assert r.bytes_read == 4 << 20 and r.file == "(temporary probe file)"
    assert os.listdir(d) == [] and not (d / "not-yet").exists()
