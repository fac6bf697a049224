"""One format vocabulary: convert's summary and manifest, inspect, verify and `colitools formats` name a format
the same way, by the recipe option that writes it (docs/FORMATS.md "Format names")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colitools.formats.format_names import (
    NATIVE_OPTION,
    OPTION_FORMATS,
    RECIPE_FORMAT_NAMES,
    format_label,
    option_names,
)
from colitools.formats.registry import FORMATS, by_name, parse_format_option

ROOT = Path(__file__).resolve().parents[2]
OLMOE = ROOT / "oracles" / "olmoe"
_SCRIPT = Path(sys.executable).with_name("colitools")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "colitools"]

# registry name -> (label printed, options that write it): the table of docs/FORMATS.md "Format names"
VOCABULARY = {
    "f32": ("f32", ("f32", "bf16")),
    "int8-row": ("int8-row", ("int8-row",)),
    "int4-row": ("int4-row", ("int4-row",)),
    "int2-row": ("int2-row", ("int2-row",)),
    "int4-grouped": ("int4-g64", tuple(f"int4-g{g}" for g in (16, 32, 48, 64, 96, 128, 192, 256))),
    "int3-g64": ("int3-g64", ("int3-g64",)),
    "e8-iq3-lattice": ("e8-iq3-lattice", ()),
    "mxfp4": ("mxfp4", ("mxfp4",)),
    "fp8-e4m3-b128": ("fp8", ("fp8",)),
    "fp8-e4m3-e8m0": ("fp8-e8m0", ("fp8-e8m0",)),
    "fp8-e4m3-e8m0-t32": ("fp8-e8m0-t32", ("fp8-e8m0-t32",)),
    "fp8-e4m3-e8m0-r32": ("fp8-e8m0-r32", ("fp8-e8m0-r32",)),
    "affine4": ("affine4-g64", tuple(f"affine4-g{g}" for g in (32, 64, 128))),
    "affine8": ("affine8-g64", tuple(f"affine8-g{g}" for g in (32, 64, 128))),
}


def test_vocabulary_table_is_pinned_for_every_registry_format():
    assert set(VOCABULARY) == {f.name for f in FORMATS.values()}
    for name, (label, options) in VOCABULARY.items():
        fmt = by_name(name)
        assert fmt.label(64 if fmt.grouped else None) == label
        assert fmt.option_names() == option_names(name) == options


def test_floats_are_named_by_their_stored_dtype():
    assert [format_label("f32", None, d) for d in ("F32", "BF16", "F16", None)] == [
        "f32",
        "bf16",
        "f16",
        "f32",
    ]
    assert format_label("int4-grouped", 128) == "int4-g128"


def test_every_recipe_option_parses_to_the_format_it_is_listed_under():
    # every option names one format, except native: it keeps each source tensor's own (FORMATS §6)
    assert set(OPTION_FORMATS) == set(RECIPE_FORMAT_NAMES) - {NATIVE_OPTION}
    assert parse_format_option(NATIVE_OPTION).fmt is None
    for option, name in OPTION_FORMATS.items():
        choice = parse_format_option(option)
        assert choice.fmt is not None and choice.fmt.name == name
        # the label of what an option writes is the option itself (floats: by the dtype the option stores)
        dtype = "BF16" if option == "bf16" else None
        assert choice.fmt.label(choice.gs, dtype) == option


def test_oracle_reference_labels_are_in_the_vocabulary():
    labels = {label for label, _ in VOCABULARY.values()} | set(RECIPE_FORMAT_NAMES)
    for path in sorted((ROOT / "oracles").glob("*/reference/*.json")):
        used = set((json.loads(path.read_text()).get("tensor_formats") or {}).values())
        # row 0: a non-float tensor is copied and named by its dtype, as the manifest's formats_per_role does
        used = {u for u in used if not (u.endswith(" (copied)") and u.split()[0] in ("I64", "I32", "U8", "BOOL"))}
        assert used <= labels, (path, used - labels)


def run(*args) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def bf16_output(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("labels") / "out"
    result = run(
        "convert", OLMOE, out, "--dense", "bf16", "--experts", "int4-g32", "--min-free-gb", "0", "--json"
    )
    assert result.returncode == 0, result.stderr
    return out


def test_convert_manifest_inspect_and_verify_use_the_same_labels(bf16_output):
    manifest = json.loads((bf16_output / "colitools.json").read_text())
    totals = {k: v["tensors"] for k, v in manifest["format_totals"].items()}
    assert "bf16" in totals and "int4-g32" in totals and "f32" in totals, totals
    assert {f for role in manifest["formats_per_role"].values() for f in role} == set(totals)

    inspected = json.loads(run("inspect", bf16_output, "--json").stdout)
    assert {t["format"]: t["tensors"] for t in inspected["totals"]} == totals
    labels = {t["label"] for t in inspected["tensors"] if t["label"] is not None}
    assert labels == set(totals)
    assert not any("(" in t["format"] for t in inspected["totals"])  # no "f32 (BF16)" any more

    verified = run("verify", "container", bf16_output, "--json")
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["formats"] == totals

    table = run("inspect", bf16_output).stdout
    assert " bf16 " in table and "f32 (BF16)" not in table


def test_formats_command_maps_registry_names_to_convert_options():
    rows = {r["name"]: r for r in json.loads(run("formats", "--json").stdout)}
    assert {name: tuple(r["options"]) for name, r in rows.items()} == {
        n: o for n, (_, o) in VOCABULARY.items()
    }
    text = run("formats").stdout
    assert "convert options" in text and "int4-g{16..256}" in text and "f32, bf16" in text
