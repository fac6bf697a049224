"""``atomic.json_lines``: the JSON the manifest is written as (outer levels one member per line, deeper values
on one line), checked against the standard library's parser and encoder."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colitools.converters.manifest import Manifest
from colitools.formats.atomic import json_lines

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4))


@settings(max_examples=300, deadline=None)
@given(values, st.integers(0, 4))
def test_parses_back_to_the_same_value(value, expand):
    text = json_lines(value, expand)
    assert json.loads(text) == value
    assert json.loads(text) == json.loads(json.dumps(value))


def test_outer_levels_one_member_per_line_deeper_ones_on_one_line():
    obj = {"format": 1, "units": {"a": {"files": [{"name": "x", "size": 2}]}, "b": {}}, "plan": [1, [2, 3]], "e": []}
    assert json_lines(obj, 2) == (
        "{\n"
        '  "format": 1,\n'
        '  "units": {\n'
        '    "a": {"files": [{"name": "x", "size": 2}]},\n'
        '    "b": {}\n'
        "  },\n"
        '  "plan": [\n'
        "    1,\n"
        "    [2, 3]\n"
        "  ],\n"
        '  "e": []\n'
        "}"
    )
    assert json_lines(obj, 0) == json.dumps(obj)  # the standard library's default separators


def test_non_ascii_is_kept_and_non_string_keys_are_refused():
    assert json_lines({"é": "ü"}, 1) == '{\n  "é": "ü"\n}'
    with pytest.raises(TypeError, match="keys must be strings"):
        json_lines({1: 2}, 1)


def test_manifest_dump_is_one_line_per_unit(tmp_path):
    units = {f"model.layers.{i}": {"files": [{"name": f"f{i}", "size": i, "sha256": "0" * 64}]} for i in range(3)}
    path = tmp_path / "colitools.json"
    Manifest({"format": 1, "state": "converting", "units": units}).dump(path)
    text = path.read_text(encoding="utf-8")
    assert json.loads(text) == {"format": 1, "state": "converting", "units": units}
    lines = text.splitlines()
    for key in units:
        assert sum(line.lstrip().startswith(f'"{key}": {{"files": [') for line in lines) == 1
    assert text.endswith("}\n")
