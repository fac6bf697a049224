"""Formats per role (docs/FORMATS.md §6 "Formats per role"): ``convert`` (its summary, ``--dry-run`` and the
manifest ``colitools.json``) and ``inspect`` (``--summary``, ``--json``) count which format every tensor got per
role (router, conv, ssm params, routed experts, attention, ...), by the one role map ``names.detail_role``.

The converter counts its plan; inspect counts the container it reads back (stored names, resolved formats): the
two must agree on every converted oracle fixture. One expectation is hand-counted from the fixture's tensor list
(qwen3_next), independent of both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
CASES = [
    ("qwen3_next", []),
    ("qwen3_5_moe", ["--experts", "int4-g32"]),  # a kept tower, conv1d, A_log, dt_bias
    ("gpt_oss_mxfp4", ["--experts", "native"]),  # mxfp4 experts kept, stack biases, sinks, router bias
    ("deepseek_v3_fp8", ["--dense", "fp8", "--layout", "planar"]),  # fp8 passthrough, a planar sidecar
    ("kimi_k25", ["--experts", "mxfp4", "--dense", "bf16"]),
]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    out = {}
    for name, options in CASES:
        dest = tmp_path_factory.mktemp(name) / "out"
        r = run_cli("convert", ORACLES / name, dest, *options, "--min-free-gb", "0", "--json")
        assert r.returncode == 0, r.stderr
        out[name] = (dest, json.loads(r.stdout))
    return out


@pytest.mark.parametrize("name", [n for n, _ in CASES])
def test_inspect_counts_formats_per_role_as_the_manifest_and_the_summary_do(converted, name):
    dest, summary = converted[name]
    manifest = json.loads((dest / "colitools.json").read_text())["formats_per_role"]
    inspected = json.loads(run_cli("inspect", dest, "--summary", "--json").stdout)["formats_per_role"]
    assert inspected == manifest == summary["formats_per_role"]
    assert list(inspected) == list(manifest)  # the same role order
    # every weight is counted once: the per-role counts add up to the per-format totals
    totals = {f: t["tensors"] for f, t in summary["format_totals"].items()}
    per_format: dict[str, int] = {}
    for formats in manifest.values():
        for label, n in formats.items():
            label = label.split(" (copied)")[0].lower() if label.endswith("(copied)") else label
            per_format[label] = per_format.get(label, 0) + n
    assert per_format == totals


def test_qwen3_next_formats_per_role_hand_counted(converted):
    """oracles/qwen3_next with the default recipe: layer 0 gated DeltaNet (in_proj_qkvz, in_proj_ba, out_proj;
    conv1d [128, 1, 4]; A_log, dt_bias; a gated norm) + dense MLP; layer 1 attention (q/k/v/o, q/k norms) + 8
    experts (I = 64 <= 64: int4-g64 is int4-row) + shared expert + its gate; 4 layer norms and the final norm."""
    dest, _ = converted["qwen3_next"]
    want = {
        "router": {"f32": 2},  # mlp.gate, mlp.shared_expert_gate
        "norm/1-D": {"f32": 8},
        "conv": {"f32": 1},
        "ssm params": {"f32": 2},  # A_log, dt_bias
        "embed": {"int8-row": 1},
        "head": {"int8-row": 1},
        "routed experts": {"int4-row": 24},
        "shared experts": {"int8-row": 3},
        "attention": {"int8-row": 7},  # linear_attn in_proj_qkvz / in_proj_ba / out_proj, self_attn q/k/v/o
        "dense mlp": {"int8-row": 3},
    }
    assert json.loads((dest / "colitools.json").read_text())["formats_per_role"] == want
    r = run_cli("inspect", dest, "--summary")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    block = lines[lines.index("formats per role:") + 1 :][: len(want)]
    assert [line.split()[0] for line in block] == [role.split()[0] for role in want]
    assert "  conv             1 x f32" in block and "  ssm params       2 x f32" in block
    assert "  routed experts   24 x int4-row" in block


def test_dry_run_prints_the_formats_per_role_before_any_work(tmp_path):
    r = run_cli("convert", ORACLES / "qwen3_next", tmp_path / "out", "--dry-run", "--experts", "int4-g32",
                "--min-free-gb", "0")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "formats per role:" in r.stdout and "  routed experts   24 x int4-g32" in r.stdout
    assert "  conv             1 x f32" in r.stdout
    assert not (tmp_path / "out").exists()


def test_gpt_oss_mxfp4_native_roles(converted):
    dest, summary = converted["gpt_oss_mxfp4"]
    roles = summary["formats_per_role"]
    # 2 layers x 4 experts x (gate, up, down) kept mxfp4; their 24 biases F32 with the routed experts
    assert roles["routed experts"] == {"f32": 24, "mxfp4": 24}
    assert roles["sinks"] == {"f32": 2} and roles["router"] == {"f32": 4}  # router weight + bias per layer
