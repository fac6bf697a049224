"""``formats/jsonfile.py``: the small JSON files of a model folder, and JSON text that is no Unicode text."""

from __future__ import annotations

import json
import re

import pytest

from colitools.formats.errors import FormatError
from colitools.formats.jsonfile import invalid_text, load_json_object


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ('{"model_type": "qwen3_moe\\udfff"}', "qwen3_moe\udfff"),  # a value
        ('{"a": {"b\\uD800": 1}}', "b\ud800"),  # a key, upper-case hex
        ('{"a": [1, ["\\udc80x"]]}', "\udc80x"),  # deep in a list
        ('{"a": "\\udfff\\ud83d"}', "\udfff\ud83d"),  # a low then a high surrogate is no pair
    ],
)
def test_a_lone_surrogate_escape_anywhere_is_found_and_refused_naming_the_file(tmp_path, text, bad):
    raw = text.encode()
    assert invalid_text(raw, json.loads(raw)) == bad
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    with pytest.raises(FormatError) as caught:
        load_json_object(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: the string ") and "is not Unicode text" in message
    assert message.encode("ascii")  # printable on any terminal: the surrogate is shown as its escape


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "w\\ud83d\\ude00"}',  # a surrogate pair: one character
        '{"name": "\\\\udfff"}',  # an escaped backslash, then the letters udfff
        '{"name": "é名", "n": 1}',
    ],
)
def test_text_is_accepted(tmp_path, text):
    raw = text.encode()
    assert invalid_text(raw, json.loads(raw)) is None
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    assert load_json_object(path) == json.loads(raw)


def test_every_other_json_reader_refuses_a_lone_surrogate_escape(tmp_path):
    """The readers of JSON that is not a model folder's config or index (the runtime's engram sidecar, the
    manifest, an oracle reference, the mirror's receipt, a shard's metadata stamps) refuse it as well, in one
    line of their own error class."""
    from colitools.converters.manifest import Manifest
    from colitools.formats.errors import ManifestError, ResolveError, VerifyError
    from colitools.formats.resolver import STAMP_KEY, parse_stamps
    from colitools.formats.targets import V41_ENGRAM_FILE
    from colitools.mirror.verify import MirrorVerification, _load_receipt
    from colitools.runtime.engram import load_engram_hash
    from colitools.verify.oracle import _read_json

    raw = b'{"schema": "x\\udfff"}'
    path = tmp_path / V41_ENGRAM_FILE
    path.write_bytes(raw)
    not_text = r'the string "x\\udfff" is not Unicode text'
    with pytest.raises(FormatError, match=not_text):
        load_engram_hash(tmp_path, None, 0)
    with pytest.raises(ManifestError, match=not_text):
        Manifest.load(path)
    with pytest.raises(VerifyError, match=not_text):
        _read_json(path)
    result = MirrorVerification("receipt", tmp_path, None)
    assert _load_receipt(path, result) is None
    assert len(result.problems) == 1 and result.problems[0].startswith(f"receipt {path.name}: the string ")
    with pytest.raises(ResolveError, match=not_text):
        parse_stamps({STAMP_KEY: '{"x\\udfff": "int4-row"}'})


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"name": "\xed\xa0\x80"}', "not UTF-8 text (byte 10)"),  # a lone surrogate encoded, not escaped
        ('{"name": "\ud800"}'.encode("utf-16-le", "surrogatepass"), "not UTF-16-LE text (byte 20)"),
    ],
)
def test_an_encoded_lone_surrogate_is_refused_too(tmp_path, raw, says):
    """``json.loads`` of bytes decodes with 'surrogatepass': the reader decodes strictly first."""
    path = tmp_path / "config.json"
    path.write_bytes(raw)
    with pytest.raises(FormatError, match=rf"{path}: {re.escape(says)}"):
        load_json_object(path)
