"""The library behind `colitools inspect` and `colitools formats`: finding shards, index coverage, totals."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction

import numpy as np
import pytest

from colitools.formats.errors import ColitoolsError, FormatError, SafetensorsError
from colitools.formats.inspect import describe_formats, inspect_path, open_model
from colitools.formats.registry import FORMATS, Int4Grouped, Int8Row, by_name
from colitools.formats.resolver import encode_shapes, encode_stamps
from colitools.formats.safetensors_io import write_safetensors

RNG = np.random.default_rng(3)
W = RNG.standard_normal((8, 128)).astype(np.float32)
EXPERT = "model.layers.0.mlp.experts.{}.{}.weight"
CONFIG = {"model_type": "olmoe", "hidden_size": 128, "vocab_size": 16, "intermediate_size": 8, "num_experts": 1}


def _encode(name, fmt, w, gs=None):
    codes, scales = by_name(fmt).encode(w, gs, name=name, fast=False)
    return {name: codes, name + ".qs": scales}


def _model(tmp_path, *, index=True, config=True, layout_second=None):
    """Two shards: globals (embed int8-row, norm f32) and one MoE layer's experts (int4-g64, fp8 stamped)."""
    first = {
        **_encode("model.embed_tokens.weight", "int8-row", RNG.standard_normal((16, 128)).astype(np.float32)),
        "model.norm.weight": np.ones(128, np.float32),
    }
    w_down = RNG.standard_normal((128, 8)).astype(np.float32)
    second = {
        **_encode(EXPERT.format(0, "gate_proj"), "int4-grouped", W, 64),
        **_encode(EXPERT.format(0, "up_proj"), "int4-grouped", W, 64),
        **_encode(EXPERT.format(0, "down_proj"), "int8-row", w_down),
        "model.layers.0.self_attn.q_proj.weight": RNG.integers(0, 0x70, (1, 100), dtype=np.uint8),
        "model.layers.0.self_attn.q_proj.weight.qs": np.ones((1, 1), np.float32),
    }
    write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors", first,
        {"colitools.shapes": encode_shapes({"model.embed_tokens.weight": (16, 128)})},
    )  # fmt: skip
    meta = {
        "colitools.shapes": encode_shapes(
            {
                EXPERT.format(0, "gate_proj"): (8, 128),
                EXPERT.format(0, "up_proj"): (8, 128),
                EXPERT.format(0, "down_proj"): (128, 8),
                "model.layers.0.self_attn.q_proj.weight": (1, 100),
            }
        ),
        "colibri.fmt": encode_stamps({"model.layers.0.self_attn.q_proj.weight": "fp8-e4m3-b128"}),
    }
    if layout_second:
        meta["colitools.layout"] = layout_second
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", second, meta)
    if index:
        weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
        weight_map |= {n: "model-00002-of-00002.safetensors" for n in second}
        total = sum(a.nbytes for a in (*first.values(), *second.values()))
        (tmp_path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
        )
    if config:
        (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return tmp_path


def test_inspect_model_dir_reports_every_tensor_and_totals(tmp_path):
    report = inspect_path(_model(tmp_path))
    assert report.index and report.config_checked and report.warnings == []
    assert [s.tensors for s in report.shards] == [3, 8]
    assert report.layout == "pairs"
    by_name_ = {t.name: t for t in report.tensors}
    assert len(by_name_) == 11
    gate = by_name_[EXPERT.format(0, "gate_proj")]
    assert (gate.format.name, gate.format.group_size, gate.logical_shape, gate.nbytes, gate.scale_nbytes) == (
        "int4-grouped", 64, (8, 128), 8 * 64, 8 * 2 * 4,
    )  # fmt: skip
    q = by_name_["model.layers.0.self_attn.q_proj.weight"]
    assert (q.format.name, q.stamp) == ("fp8-e4m3-b128", "fp8-e4m3-b128")
    totals = {t.format: (t.tensors, t.bytes) for t in report.totals}
    assert totals == {
        "f32": (1, 512),
        "fp8": (1, 104),  # totals use the one vocabulary (format_names.format_label)
        "int4-g64": (2, 2 * (512 + 64)),
        "int8-row": (2, (16 * 128 + 64) + (128 * 8 + 512)),
    }
    assert sum(t.bytes for t in report.totals) == report.total_bytes


def test_inspect_json_is_serialisable_and_complete(tmp_path):
    data = json.loads(json.dumps(inspect_path(_model(tmp_path)).to_json()))
    assert data["layout"] == "pairs" and data["index"] is True
    gate = next(t for t in data["tensors"] if t["name"] == EXPERT.format(0, "gate_proj"))
    assert gate == {
        "name": EXPERT.format(0, "gate_proj"),
        "file": str(tmp_path / "model-00002-of-00002.safetensors"),
        "dtype": "U8",
        "shape": [8, 64],
        "bytes": 512,
        "kind": "quantized",
        "format": "int4-grouped",
        "label": "int4-g64",
        "fmt": 4,
        "group_size": 64,
        "logical_shape": [8, 128],
        "stamp": None,
        "scale": EXPERT.format(0, "gate_proj") + ".qs",
        "scale_bytes": 64,
        "scale_of": None,
        "layout": "pairs",
    }


def test_inspect_lone_file_and_dir_without_index(tmp_path):
    _model(tmp_path, index=False, config=False)
    report = inspect_path(tmp_path / "model-00002-of-00002.safetensors")
    assert len(report.shards) == 1 and not report.index and not report.config_checked
    assert len(inspect_path(tmp_path).shards) == 2


def test_inspect_mixed_layout(tmp_path):
    _model(tmp_path, index=False, config=False)  # expert 1 holds its gate only: config.json would refuse it
    planar = _encode(EXPERT.format(1, "gate_proj"), "int4-grouped", W, 64)
    meta = {
        "colitools.shapes": encode_shapes({EXPERT.format(1, "gate_proj"): (8, 128)}),
        "colitools.layout": "planar64-v8",
    }
    write_safetensors(tmp_path / "model-planar.safetensors", planar, meta)
    report = inspect_path(tmp_path)
    assert report.layout == "mixed (pairs, planar64-v8)"
    assert {t.name: t.layout for t in report.tensors}[EXPERT.format(1, "gate_proj")] == "planar64-v8"


def test_planar_shard_with_fp8_is_refused(tmp_path):
    # The second shard holds an fp8 tensor, which planar64-v8 cannot hold.
    with pytest.raises(ColitoolsError, match="planar needs int4-row or int4-g64"):
        inspect_path(_model(tmp_path, layout_second="planar64-v8"))


def test_config_mismatch_is_an_error(tmp_path):
    _model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "intermediate_size": 16}))
    with pytest.raises(
        ColitoolsError,
        match=r"gate_proj.weight is \[8, 128\] \(colitools.shapes\) but config.json implies \[16, 128\]",
    ):
        inspect_path(tmp_path)


def _edit_index(tmp_path, edit):
    path = tmp_path / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    edit(index)
    path.write_text(json.dumps(index))


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (
            lambda ix: ix["weight_map"].pop("model.norm.weight"),
            "holds tensor model.norm.weight, but weight_map does not list it",
        ),
        (
            lambda ix: ix["weight_map"].update({"ghost": "model-00001-of-00002.safetensors"}),
            "maps tensor ghost to model-00001-of-00002.safetensors, which does not hold it",
        ),
        (
            lambda ix: ix["weight_map"].update({"model.norm.weight": "model-00002-of-00002.safetensors"}),
            "but weight_map maps it to model-00002",
        ),
        (
            lambda ix: ix["weight_map"].update({"x": "../model.safetensors"}),
            "shard file name '../model.safetensors' (tensor 'x') is refused: contains a path separator",
        ),
        (lambda ix: ix["weight_map"].update({"x": "/abs/model.safetensors"}), "is refused: absolute path"),
        (
            lambda ix: ix["weight_map"].update({"x": "sub/model.safetensors"}),
            "is refused: contains a path separator",
        ),
        (lambda ix: ix["weight_map"].update({"x": "model.bin"}), "is refused: does not end in .safetensors"),
        (
            lambda ix: ix["weight_map"].update({"x": 3}),
            "shard file name 3 (tensor 'x') is refused: not a file name",
        ),
        (lambda ix: ix.pop("weight_map"), "weight_map is missing"),
    ],
)
def test_index_must_cover_exactly_the_tensors_present(tmp_path, edit, words):
    _model(tmp_path)
    _edit_index(tmp_path, edit)
    with pytest.raises(FormatError, match=re.escape(words)) as info:
        inspect_path(tmp_path)
    assert "model.safetensors.index.json" in str(info.value) and "\n" not in str(info.value)


def test_index_naming_a_missing_shard(tmp_path):
    _model(tmp_path)
    _edit_index(tmp_path, lambda ix: ix["weight_map"].update({"x": "model-00003-of-00002.safetensors"}))
    with pytest.raises(SafetensorsError, match="model-00003-of-00002.safetensors: cannot open"):
        inspect_path(tmp_path)


def test_index_warnings(tmp_path):
    _model(tmp_path)
    _edit_index(tmp_path, lambda ix: ix["metadata"].update({"total_size": 5}))
    write_safetensors(tmp_path / "stray.safetensors", {"a": np.ones(1, np.float32)})
    warnings = inspect_path(tmp_path).warnings
    assert any("not in model.safetensors.index.json" in w and "stray.safetensors" in w for w in warnings)
    assert any("total_size is 5" in w for w in warnings)


@pytest.mark.parametrize(
    ("name", "text"),
    [("config.json", "{oops"), ("config.json", "[1]"), ("model.safetensors.index.json", "nope")],
)
def test_bad_json_beside_the_shards(tmp_path, name, text):
    _model(tmp_path)
    (tmp_path / name).write_text(text)
    with pytest.raises(FormatError, match=re.escape(name)):
        inspect_path(tmp_path)


def test_missing_path_and_empty_dir(tmp_path):
    with pytest.raises(FormatError, match="no such file or directory"):
        open_model(tmp_path / "nope")
    with pytest.raises(FormatError, match="no \\*.safetensors files"):
        open_model(tmp_path)


# ----------------------------------------------------------------------------------------- format table
def _eval_formula(text: str, O: int, I: int, gs: int | None) -> int:
    value = eval(text, {"ceil": math.ceil}, {"O": Fraction(O), "I": Fraction(I), "gs": gs})
    assert value.denominator == 1
    return int(value)


@pytest.mark.parametrize(("O", "I"), [(1, 1), (3, 100), (7, 97), (130, 300), (256, 1024), (5, 98)])
def test_format_table_formulas_agree_with_the_registry(O, I):
    rows = describe_formats()
    assert [r.ord for r in rows] == sorted(FORMATS)
    for row in rows:
        fmt = FORMATS[row.ord]
        if row.name == "f32":
            continue
        if row.name == "mxfp4" and I % 32:
            continue
        for gs in row.group_sizes or (None,):
            if not fmt.pairs and I % gs:  # an affine format holds whole groups only (FORMATS §2.12)
                continue
            assert _eval_formula(row.weight_bytes, O, I, gs) == fmt.weight_nbytes(O, I, gs), row.name
            assert _eval_formula(row.scale_bytes, O, I, gs) == fmt.scale_nbytes(O, I, gs), row.name


def test_format_table_bits_per_weight():
    bits = {r.name: r.bits_per_weight for r in describe_formats()}
    assert bits["int4-grouped"] == 4.5 and bits["int3-g64"] == 3.5 and bits["mxfp4"] == 4.25
    assert bits["int8-row"] == pytest.approx(8 + 32 / 4096, abs=1e-4)
    assert bits["f32"] == 32
    assert [r.written for r in describe_formats()].count(False) == 1  # e8-iq3-lattice is read only
    assert Int4Grouped.bits_per_weight(4096, 64) == 4.5 and Int8Row.ord == 1
