"""`usage show` and `mirror plan` on Inkling's dense binary history (IKU1, FORMATS §6), built by hand with
struct: read for an Inkling model, refused by name (one line, exit 1) for any other, geometry checked."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from mirror_builders import run_cli

ORACLES = Path(__file__).resolve().parents[2] / "oracles"


def iku1(layers: int, experts: int, cells: dict[tuple[int, int], int]) -> bytes:
    body = [cells.get((layer, e), 0) for layer in range(layers) for e in range(experts)]
    return struct.pack(f"<4s2I{len(body)}I", b"IKU1", layers, experts, *body)


@pytest.fixture
def inkling(tmp_path) -> Path:  # model_type inkling_mm_model, 2 layers x 4 routed experts
    model = Path(shutil.copytree(ORACLES / "inkling", tmp_path / "inkling"))
    (model / ".coli_usage").write_bytes(iku1(2, 4, {(0, 1): 7, (1, 3): 2}))
    return model


def test_usage_show_reads_an_inkling_models_iku1_history(inkling):
    r = run_cli("usage", "show", str(inkling / ".coli_usage"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["iku1"] and out["n_layers"] == 2 and out["n_experts"] == 4 and out["total_selections"] == 9
    assert [(x["layer"], x["hottest"]) for x in out["layers"]] == [
        (0, [{"expert": 1, "count": 7}]),
        (1, [{"expert": 3, "count": 2}]),
    ]
    text = run_cli("usage", "show", str(inkling / ".coli_usage")).stdout.splitlines()
    assert text[1] == "geometry   2 layers x 4 experts (IKU1 dense binary header)"


def test_mirror_plan_reads_an_inkling_models_iku1_history(inkling, tmp_path):
    r = run_cli("mirror", "plan", "--model", str(inkling), "--mirror", str(tmp_path / "m"), "--budget-gib", "1",
                "--reserve-gib", "0", "--json")  # fmt: skip
    out = json.loads(r.stdout)  # a plan (admitted or not: the fixture's experts are native stacks), no error
    assert "error" not in out and out["usage_history_present"] and out["usage_selections"] == 9, r.stderr


def test_another_engines_model_refuses_an_iku1_history_by_name(tmp_path):
    olmoe = Path(shutil.copytree(ORACLES / "olmoe", tmp_path / "olmoe"))  # 2 layers x 6 experts
    (olmoe / ".coli_usage").write_bytes(iku1(2, 6, {(1, 5): 5}))
    line = (f"colitools: error: {olmoe / '.coli_usage'}: an IKU1 usage history (the dense binary layout of "
            "colibri's inkling engine) is read only for an Inkling model, not for this model's engine 'olmoe'")  # fmt: skip
    for args in (
        ("usage", "show", str(olmoe / ".coli_usage")),
        ("mirror", "plan", "--model", str(olmoe), "--mirror", str(tmp_path / "m"), "--budget-gib", "1"),
        ("mirror", "plan", "--model", str(olmoe), "--mirror", str(tmp_path / "m"), "--budget-gib", "1",
         "--usage", str(olmoe / ".coli_usage")),  # named: trust does not extend to another engine's layout
    ):  # fmt: skip
        r = run_cli(*args)
        assert r.returncode == 1 and r.stderr.splitlines() == [line], args


def test_an_iku1_history_of_another_geometry_is_refused_even_for_inkling(inkling):
    (inkling / ".coli_usage").write_bytes(iku1(2, 8, {(0, 1): 7}))
    r = run_cli("usage", "show", str(inkling / ".coli_usage"))
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"colitools: error: {inkling / '.coli_usage'}: IKU1 usage history is 2 layers x 8 experts, the model is "
        "2 x 4: refusing rather than misreading it"
    ]
