"""The generated model card speaks to a user about the model it describes (issue 43 item 5): the engine of its
``--target`` (``colitools.json`` keeps it under ``recipe``), source size -> output size and bits per weight first,
only the roles the model has, no C function names; a Hub source linked on the Hub it came from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from colitools.converters.manifest import Manifest
from colitools.converters.model_card import build_card
from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.inspect import inspect_path
from colitools.formats.targets import TARGETS

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
CASES = [  # fixture, target, the engine the card must name
    ("olmoe_target", "olmoe", "c/olmoe.c"),
    ("qwen38", "qwen38", "c/qwen38.c"),
    ("deepseek_v3", None, "c/colibri.c"),
]


def _files(out: Path) -> list[tuple[str, int]]:
    return [(p.name, p.stat().st_size) for p in sorted(out.iterdir()) if p.is_file() and not p.name.startswith(".")]


@pytest.mark.parametrize(("fixture", "target", "engine"), CASES, ids=[c[0] for c in CASES])
def test_the_card_names_the_engine_of_its_target_sizes_first_and_only_the_models_roles(
    tmp_path, fixture, target, engine
):
    out = tmp_path / "out"
    convert(str(ORACLES / fixture), out, ConvertOptions(target=target) if target else None)
    manifest = Manifest.load(out / "colitools.json")
    assert manifest.data["recipe"].get("target") == target  # where colitools.json keeps it
    files = _files(out)
    text = build_card(out, manifest, "me/model", files, endpoint="https://hub.example")
    body = text.split("---\n", 2)[2]
    assert f"colibri's `{engine}` engine" in body
    others = {t.loader.split()[0] for t in TARGETS.values()} - {engine}
    assert not any(f"`{o}`" in body for o in others), body
    # no C function names of any loader (load_t, qt_from_disk, q38_load_cfg, ...)
    functions = {f for t in TARGETS.values() for f in re.findall(r"\b[a-z0-9]+_[a-z0-9_]+\b", t.loader)}
    assert not [f for f in functions if re.search(rf"\b{f}\b", body)], body
    # source size -> output size and bits per weight, first
    first = body.splitlines()[2]
    plan = manifest.data["plan"]
    report = inspect_path(out)
    assert first.startswith("**") and " -> " in first and "bits per weight**" in first, first
    bpw = float(re.search(r"([0-9.]+) bits per weight", first).group(1))
    weights = [t for t in report.tensors if t.kind in ("quantized", "float")]
    assert 0 < bpw < 33 and plan["in_bytes"] > 0
    assert len(weights) > 0
    # only the roles this model has: the recipe rows of options no tensor of it uses are left out
    roles = set(report.formats_per_role)
    assert ("| mtp |" in body) == ("mtp" in roles)
    assert "tower" in roles or "| towers |" not in body  # (the recipe records towers only when not `keep`)


def test_a_hub_source_is_linked_on_the_hub_it_came_from(tmp_path):
    out = tmp_path / "out"
    convert(str(ORACLES / "olmoe"), out)
    manifest = Manifest.load(out / "colitools.json")
    manifest.data["source"] = {"kind": "hf", "repo_id": "org/m", "revision": "0" * 40}
    text = build_card(out, manifest, "me/m", _files(out), endpoint="https://hub.example/")
    assert "[org/m](https://hub.example/org/m)" in text and "huggingface.co" not in text
    assert 'model="$(HF_ENDPOINT=https://hub.example hf download me/m)"' in text
    default = build_card(out, manifest, "me/m", _files(out), endpoint="https://huggingface.co")
    assert "[org/m](https://huggingface.co/org/m)" in default and 'model="$(hf download me/m)"' in default
