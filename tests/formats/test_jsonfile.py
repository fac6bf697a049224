"""``formats/jsonfile.py``: the small JSON files of a model folder, and JSON text that is no Unicode text."""

from __future__ import annotations

import json

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
