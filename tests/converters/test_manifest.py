"""``colitools.json``: one ``Manifest`` type, written by the ledger, read back by the ledger and ``verify container``."""

from __future__ import annotations

import json

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
        ("[1, 2]", "not an object"),
        ('"complete"', "not an object"),
    ],
)
def test_load_refuses_what_is_not_a_json_object(tmp_path, text, reason):
    (tmp_path / MANIFEST_FILE).write_text(text)
    with pytest.raises(ManifestError, match=reason):
        Manifest.load(tmp_path / MANIFEST_FILE)


def test_load_refuses_bytes_that_are_not_utf8(tmp_path):
    (tmp_path / MANIFEST_FILE).write_bytes(b'{"state": "\xff"}')
    with pytest.raises(ManifestError, match="utf-8"):
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
    with pytest.raises(ConvertError, match=r"colitools\.json: unreadable resume ledger \(not an object\)"):
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
