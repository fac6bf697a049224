"""Incomplete or inconsistent checkpoints are refused before any work, naming the tensor (issue 43 item 1).

Each kind damages the tiny generated checkpoint one way; ``convert`` (and its ``--dry-run``) must refuse it in one
``colitools: error:`` line, exit 1, without creating the output folder. The same completeness rule
(``model_config.check_complete``) holds for a converted container: ``verify container`` reports a container that
misses a tensor the model needs (exit 4) and ``inspect`` refuses it (exit 1)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import one_line_error, run_cli

from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "converters"))
from tinyckpt import Tiny, make_checkpoint, write_tensors  # noqa: E402

EXPERT = "model.layers.1.mlp.experts.2.up_proj.weight"
Q_PROJ = "model.layers.1.self_attn.q_proj.weight"


def _drop(tensors, cfg):
    del tensors[EXPERT]


def _fewer(tensors, cfg):
    cfg["num_hidden_layers"] = 3


def _three_d(tensors, cfg):
    tensors[EXPERT] = tensors[EXPERT][None]


def _int_attention(tensors, cfg):
    tensors[Q_PROJ] = tensors[Q_PROJ].view(np.int16)


def _no_hidden(tensors, cfg):
    del cfg["hidden_size"]


def _no_count(tensors, cfg):
    del cfg["n_routed_experts"]


def _missing_expert(tensors, cfg):
    for proj in ("gate_proj", "up_proj", "down_proj"):
        del tensors[f"model.layers.0.mlp.experts.3.{proj}.weight"]


# kind -> (damage, words the one error line holds)
KINDS = {
    "expert-missing-a-projection": (_drop, (EXPERT, "missing", "not up")),
    "fewer-layers-than-num_hidden_layers": (_fewer, ("num_hidden_layers is 3", "model.layers.2.")),
    "expert-projection-3-d": (_three_d, (EXPERT, "3-D [1, 32, 64]")),
    "attention-projection-integer": (_int_attention, (Q_PROJ, "I16")),
    "config-without-hidden_size": (_no_hidden, ("hidden_size is missing",)),
    "config-without-expert-count": (_no_count, ("no routed expert count", "n_routed_experts")),
    "expert-missing": (_missing_expert, ("model.layers.0.mlp.experts.3.", "expert 3")),
}


def _source(folder: Path, damage) -> Path:
    tensors = make_checkpoint(folder, Tiny(layers=2))
    cfg = json.loads((folder / "config.json").read_text())
    damage(tensors, cfg)
    (folder / "model.safetensors").unlink()
    write_tensors(folder, tensors, 1)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("dry_run", [False, True], ids=["convert", "dry-run"])
def test_incomplete_source_is_refused_before_any_work(tmp_path, kind, dry_run):
    damage, words = KINDS[kind]
    src, out = _source(tmp_path / "src", damage), tmp_path / "out"
    args = ("convert", src, out, "--min-free-gb", "0", "--no-progress", *(("--dry-run",) if dry_run else ()))
    one_line_error(run_cli(*args), *words, code=1)
    assert not out.exists()  # refused at planning: not even the output folder


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("complete")
    make_checkpoint(root / "src", Tiny(layers=2))
    result = run_cli("convert", root / "src", root / "out", "--min-free-gb", "0", "--no-progress")
    assert result.returncode == 0, result.stderr
    return root / "out"


def _container_without(converted: Path, tmp_path: Path, change) -> Path:
    model = tmp_path / "model"
    shutil.copytree(converted, model)
    change(model)
    return model


def _fewer_in_config(model: Path) -> None:
    cfg = json.loads((model / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (model / "config.json").write_text(json.dumps(cfg))


def _drop_expert_projection(model: Path) -> None:
    """The converted container without ``EXPERT`` (and its scale): its shard rewritten, index and
    ``colitools.shapes`` without them, as a writer that left the tensor out would publish it."""
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shard = model / index["weight_map"][EXPERT]
    gone = {EXPERT, EXPERT + ".qs"}
    with SafetensorsFile(shard) as f:
        kept = {n: f.read(n) for n in f.tensors if n not in gone}
        meta = dict(f.metadata)
    shapes = json.loads(meta["colitools.shapes"])
    del shapes[EXPERT]
    meta["colitools.shapes"] = json.dumps(shapes, sort_keys=True, separators=(",", ":"))
    shard.unlink()
    write_safetensors(shard, kept, meta)
    index["weight_map"] = {n: s for n, s in index["weight_map"].items() if n not in gone}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    ("change", "words"),
    [(_fewer_in_config, "model.layers.2."), (_drop_expert_projection, EXPERT)],
    ids=["layer", "expert-projection"],
)
def test_verify_and_inspect_refuse_a_container_missing_a_tensor(converted, tmp_path, change, words):
    assert run_cli("verify", "container", converted).returncode == 0
    model = _container_without(converted, tmp_path, change)
    verify = run_cli("verify", "container", model)
    assert verify.returncode == 4 and "Traceback" not in verify.stderr, verify.stdout + verify.stderr
    assert any(words in line for line in verify.stdout.splitlines() if line.startswith("PROBLEM")), verify.stdout
    one_line_error(run_cli("inspect", model), words, code=1)
