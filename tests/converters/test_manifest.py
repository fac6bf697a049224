"""``colitools.json``: one ``Manifest`` type, written by the ledger, read back by the ledger and ``verify container``."""

from __future__ import annotations

import json
import re

import pytest
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.manifest import MANIFEST_FILE, Manifest, ManifestError
from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError
from colitools.verify.container import verify_container


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("manifest")
    make_checkpoint(root / "src", Tiny(layers=2, experts=2, hidden=64, inter=64, shards=2))
    convert(str(root / "src"), root / "out", ConvertOptions(progress=False, min_free_gb=0.0))
    return root / "out"


def test_load_dump_round_trip_is_byte_identical(converted, tmp_path):
    raw = (converted / MANIFEST_FILE).read_bytes()
    manifest = Manifest.load(converted / MANIFEST_FILE)
    assert manifest.state == "complete"
    assert manifest.planned_files() == [r["name"] for r in manifest.file_records()]
    assert all(sorted(r) == ["name", "sha256", "size"] for r in manifest.file_records())
    manifest.dump(tmp_path / MANIFEST_FILE)
    assert (tmp_path / MANIFEST_FILE).read_bytes() == raw
    assert Manifest.load(tmp_path / MANIFEST_FILE) == manifest


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{", "Expecting property name enclosed in double quotes"),
        ("[1, 2]", "expected a JSON object"),
        ('"complete"', "expected a JSON object"),
    ],
)
def test_load_refuses_what_is_not_a_json_object(tmp_path, text, reason):
    (tmp_path / MANIFEST_FILE).write_text(text)
    with pytest.raises(ManifestError, match=reason):
        Manifest.load(tmp_path / MANIFEST_FILE)


def test_load_refuses_bytes_that_are_not_utf8(tmp_path):
    (tmp_path / MANIFEST_FILE).write_bytes(b'{"state": "\xff"}')
    with pytest.raises(ManifestError, match="not UTF-8 text"):
        Manifest.load(tmp_path / MANIFEST_FILE)


@pytest.mark.parametrize("units", [None, [], {"globals": []}, {"globals": {"no": "files"}}])
def test_file_records_refuse_malformed_units(units):
    data = {"state": "complete"} if units is None else {"state": "complete", "units": units}
    with pytest.raises(ManifestError):
        Manifest(data).file_records()


def test_ledger_and_verify_refuse_the_same_malformed_manifest(converted, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", MANIFEST_FILE):
        (out / name).write_bytes((converted / name).read_bytes())
    (out / MANIFEST_FILE).write_text("[]")
    src = converted.parent / "src"
    with pytest.raises(ConvertError, match=r"colitools\.json: unreadable resume ledger \(expected a JSON object\)"):
        convert(str(src), out, ConvertOptions(progress=False, min_free_gb=0.0))
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in converted.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    (copy / MANIFEST_FILE).write_text(json.dumps({"state": "complete", "units": []}))
    problems = verify_container(copy, hashes=False).problems
    assert [p for p in problems if "unreadable manifest" in p] == [
        f"{copy / MANIFEST_FILE}: unreadable manifest ('list' object has no attribute 'values')"
    ]


def _tampered(converted, tmp_path, change) -> tuple:
    """A copy of the converted folder whose colitools.json ``change(data)`` edited, beside a real shard
    ``outside.safetensors`` in its parent (what a name leaving the folder would reach)."""
    out = tmp_path / "out"
    out.mkdir()
    for p in converted.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    data = json.loads((out / MANIFEST_FILE).read_text())
    change(data)
    (out / MANIFEST_FILE).write_text(json.dumps(data))
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((out / data["plan"]["files"][0]["name"]).read_bytes())
    return out, outside


def _record_outside(name):
    def change(data):  # the first unit's first file, same size and sha256 as the outside copy
        next(iter(data["units"].values()))["files"][0]["name"] = name

    return change


@pytest.mark.parametrize(
    ("change", "where", "reason"),
    [
        (_record_outside("../outside.safetensors"), "units['globals'].files", "leaves the folder"),
        (_record_outside("experts-int4g64/../../outside.safetensors"), "units['globals'].files", "leaves the folder"),
        (lambda d: d["plan"]["files"][0].update(name="/etc/hostname"), "plan.files", "absolute path"),
        (lambda d: d["shards"][0].update(name="a\\..\\..\\outside.safetensors"), "shards", "backslash"),
        (lambda d: d["copied_files"].append("../config.json"), "copied_files", "leaves the folder"),
    ],
)
def test_a_recorded_file_name_leaving_the_folder_is_refused_by_verify_and_by_the_resume(
    converted, tmp_path, change, where, reason
):
    out, outside = _tampered(converted, tmp_path, change)
    before = outside.read_bytes()
    with pytest.raises(ManifestError, match=rf"^{re.escape(where)}: file name .* is refused: .*{reason}"):
        Manifest.load(out / MANIFEST_FILE)
    report = verify_container(out)
    assert not report.ok and any("unreadable manifest" in p and reason in p for p in report.problems)
    assert report.hashed_files == 0  # nothing was hashed, the outside file least of all
    with pytest.raises(ConvertError, match="unreadable resume ledger .*is refused"):
        convert(str(converted.parent / "src"), out, ConvertOptions(progress=False, min_free_gb=0.0))
    assert outside.read_bytes() == before


def test_a_lone_surrogate_escape_in_the_manifest_is_refused(converted, tmp_path):
    out, _ = _tampered(converted, tmp_path, lambda d: d.update(tool={"name": "colitools\udfff"}))
    with pytest.raises(ManifestError, match=r'the string "colitools\\udfff" is not Unicode text'):
        Manifest.load(out / MANIFEST_FILE)


def test_names_inside_the_folder_load_including_the_sidecar_and_odd_legal_names(tmp_path):
    names = ["model-00001-of-00002.safetensors", "experts-int4g64/layer-003.safetensors", "..a.safetensors", "é名"]
    data = {"plan": {"files": [{"name": n, "size": 1} for n in names]}, "copied_files": ["tokenizer.json"]}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(data))
    assert Manifest.load(tmp_path / MANIFEST_FILE).planned_files() == names
