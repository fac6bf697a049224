"""The runtime opens a model folder with the inspector's opener: the same shard-name rule, the same message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from colitools.errors import FormatError
from colitools.formats.filenames import INDEX_FILE
from colitools.formats.inspect import inspect_path
from colitools.runtime import load_model

ORACLE = Path(__file__).resolve().parents[2] / "oracles" / "qwen2_moe"


@pytest.fixture
def model(tmp_path) -> Path:
    dest = tmp_path / "model"
    shutil.copytree(ORACLE, dest, ignore=shutil.ignore_patterns("reference"))
    return dest


def _rename_in_index(model: Path, shard: str) -> None:
    index = json.loads((model / INDEX_FILE).read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = shard
    (model / INDEX_FILE).write_text(json.dumps(index))


# The runtime's own check used to let these through (a drive letter, a NUL, an absolute name, a bare name).
@pytest.mark.parametrize(
    "shard", ["../model-00001-of-00002.safetensors", "C:model.safetensors", "a\x00.safetensors", ".safetensors", ""]
)
def test_runtime_refuses_a_bad_shard_name_exactly_like_inspect(model, shard):
    _rename_in_index(model, shard)
    with pytest.raises(FormatError) as inspected:
        inspect_path(model)
    with pytest.raises(FormatError) as loaded:
        load_model(model, record_usage=False)
    assert type(loaded.value) is type(inspected.value) and str(loaded.value) == str(inspected.value)
    assert "is refused" in str(loaded.value)


def test_runtime_refuses_an_index_that_misses_a_tensor_like_inspect(model):
    index = json.loads((model / INDEX_FILE).read_text())
    dropped = sorted(index["weight_map"])[0]
    del index["weight_map"][dropped]
    (model / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(FormatError) as inspected:
        inspect_path(model)
    with pytest.raises(FormatError) as loaded:
        load_model(model, record_usage=False)
    assert type(loaded.value) is type(inspected.value) and str(loaded.value) == str(inspected.value) and dropped in str(loaded.value)


def test_runtime_refuses_an_index_naming_a_tensor_no_shard_holds(model):
    """Issue 9 item 4: the index names a tensor that no shard holds; run refuses it as inspect does."""
    index = json.loads((model / INDEX_FILE).read_text())
    some_shard = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"]["model.layers.0.mlp.experts.99.up_proj.weight"] = some_shard
    (model / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(FormatError) as inspected:
        inspect_path(model)
    with pytest.raises(FormatError) as loaded:
        load_model(model, record_usage=False)
    assert type(loaded.value) is type(inspected.value) and str(loaded.value) == str(inspected.value)
    assert "model.layers.0.mlp.experts.99.up_proj.weight" in str(loaded.value)


def test_runtime_still_loads_the_untouched_folder(model):
    with load_model(model, record_usage=False) as m:
        assert m.args.model_type == "qwen2_moe"
