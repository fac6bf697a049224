"""`.coli_usage` reader and writer (docs/FORMATS.md §6)."""

from __future__ import annotations

import os
import re

import pytest

from colitools.errors import UsageFileError
from colitools.formats.usage import (
    MAX_EXPERT_SLOTS,
    UsageHistory,
    engine_id,
    format_usage,
    read_usage,
    write_usage,
)

GLM = 3815245270


def write(tmp_path, text: str | bytes, name: str = ".coli_usage"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_engine_id_is_fnv1a_32_of_the_name():
    assert engine_id("glm_moe_dsa") == GLM
    assert engine_id("") == 2166136261  # the offset basis
    assert engine_id("a") == 0xE40C292C  # published FNV-1a 32 test vector


def test_headers_give_geometry_engine_and_counts(tmp_path):
    path = write(tmp_path, f"-1 4 8\n-2 1 {GLM}\n0 3 10\n3 7 2\n")
    h = read_usage(path, n_layers=4, n_experts=8, engine="glm_moe_dsa")
    assert (h.n_layers, h.n_experts, h.engine_id, h.headerless) == (4, 8, GLM, False)
    assert h.counts == {(0, 3): 10, (3, 7): 2}
    assert h.total == 12 and h.skipped_records == 0


def test_engine_given_as_id_is_accepted(tmp_path):
    path = write(tmp_path, f"-1 2 2\n-2 1 {GLM}\n1 1 5\n")
    assert read_usage(path, engine=GLM).counts == {(1, 1): 5}


def test_legacy_headerless_file_takes_the_callers_geometry(tmp_path):
    path = write(tmp_path, "0 1 5\n2 3 7\n9 0 4\n")
    h = read_usage(path, n_layers=3, n_experts=4, engine="glm_moe_dsa")
    assert h.headerless and h.engine_id is None
    assert (h.n_layers, h.n_experts) == (3, 4)
    assert h.counts == {(0, 1): 5, (2, 3): 7}
    assert h.skipped_records == 1  # layer 9 is outside 3 layers


def test_legacy_headerless_file_without_geometry_infers_it_from_the_records(tmp_path):
    h = read_usage(write(tmp_path, "0 1 5\n2 3 7\n"))
    assert (h.n_layers, h.n_experts) == (3, 4)
    assert h.counts == {(0, 1): 5, (2, 3): 7}


def test_crlf_line_endings_read_like_lf(tmp_path):
    lf = read_usage(write(tmp_path, f"-1 4 8\n-2 1 {GLM}\n0 3 10\n3 7 2\n", "lf"))
    crlf = read_usage(write(tmp_path, f"-1 4 8\r\n-2 1 {GLM}\r\n0 3 10\r\n3 7 2\r\n", "crlf"))
    assert crlf == lf


def test_tabs_blank_lines_and_a_trailing_line_without_newline_are_fine(tmp_path):
    h = read_usage(write(tmp_path, "-1\t2\t2\n\n  0 1 3  \n1 0 4"))
    assert h.counts == {(0, 1): 3, (1, 0): 4}


def test_another_engines_history_is_refused(tmp_path):
    path = write(tmp_path, f"-1 2 2\n-2 1 {engine_id('deepseek_v3')}\n0 0 1\n")
    with pytest.raises(UsageFileError, match="engine id .* explicitly"):
        read_usage(path, engine="glm_moe_dsa")


def test_another_engines_history_is_accepted_when_passed_explicitly(tmp_path):
    other = engine_id("deepseek_v3")
    path = write(tmp_path, f"-1 2 2\n-2 1 {other}\n0 0 1\n")
    h = read_usage(path, engine="glm_moe_dsa", explicit=True)
    assert h.engine_id == other and h.counts == {(0, 0): 1}


def test_history_without_an_engine_header_is_not_refused_for_its_engine(tmp_path):
    path = write(tmp_path, "-1 2 2\n0 0 1\n")
    assert read_usage(path, engine="glm_moe_dsa").counts == {(0, 0): 1}


@pytest.mark.parametrize("layers, experts", [(5, 8), (4, 16), (3, 7)])
def test_wrong_geometry_is_refused(tmp_path, layers, experts):
    path = write(tmp_path, f"-1 4 8\n-2 1 {GLM}\n0 0 1\n")
    with pytest.raises(UsageFileError, match="geometry 4 layers x 8 experts does not match"):
        read_usage(path, n_layers=layers, n_experts=experts)


def test_geometry_checked_on_the_side_the_caller_knows(tmp_path):
    path = write(tmp_path, "-1 4 8\n0 0 1\n")
    assert read_usage(path, n_layers=4).n_experts == 8
    with pytest.raises(UsageFileError):
        read_usage(path, n_experts=9)


def test_format_version_2_is_refused(tmp_path):
    path = write(tmp_path, f"-1 4 8\n-2 2 {GLM}\n0 0 1\n")
    with pytest.raises(UsageFileError, match="version 2 is not supported"):
        read_usage(path)


def test_format_version_0_is_refused(tmp_path):
    with pytest.raises(UsageFileError, match="version 0"):
        read_usage(write(tmp_path, f"-2 0 {GLM}\n"))


@pytest.mark.parametrize("line", ["0 1 2 3", "0 1", "0 1 x", "0 1 2.5", "0 1 1_000", "-1 4 8 9"])
def test_records_other_than_three_integers_are_refused_naming_the_line(tmp_path, line):
    path = write(tmp_path, f"-1 4 8\n0 0 1\n{line}\n")
    with pytest.raises(UsageFileError, match=r":3: expected exactly three integers"):
        read_usage(path)


def test_out_of_range_and_non_positive_records_are_not_counted(tmp_path):
    text = "-1 2 4\n0 0 5\n2 0 9\n0 4 9\n1 -1 9\n1 3 0\n1 2 -4\n1 3 6\n"
    h = read_usage(write(tmp_path, text))
    assert h.counts == {(0, 0): 5, (1, 3): 6}
    assert h.skipped_records == 5
    assert h.total == 11


def test_other_negative_layer_records_are_skipped(tmp_path):
    h = read_usage(write(tmp_path, "-1 2 2\n-3 7 7\n-9 0 0\n1 1 2\n"))
    assert h.counts == {(1, 1): 2} and h.skipped_records == 0


def test_repeated_records_add_up(tmp_path):
    assert read_usage(write(tmp_path, "-1 2 2\n0 1 2\n0 1 3\n")).counts == {(0, 1): 5}


def test_empty_file_has_no_counts(tmp_path):
    h = read_usage(write(tmp_path, b""), n_layers=3, n_experts=4, engine="glm_moe_dsa")
    assert h.counts == {} and h.total == 0 and (h.n_layers, h.n_experts) == (3, 4)
    assert read_usage(write(tmp_path, b"", "other")).counts == {}


def test_contradicting_headers_are_refused(tmp_path):
    with pytest.raises(UsageFileError, match="contradicts"):
        read_usage(write(tmp_path, "-1 2 2\n-1 3 2\n"))


def test_missing_file_is_a_usage_file_error(tmp_path):
    with pytest.raises(UsageFileError, match="not found"):
        read_usage(tmp_path / "nope")


def test_writer_bytes_are_exact_sorted_and_three_fields_per_line(tmp_path):
    h = UsageHistory(4, 8, GLM)
    h.add(3, 7, 2)
    h.add(0, 3, 10)
    h.add(0, 3, 1)
    h.add(1, 1, 0)  # nothing recorded for zero
    path = tmp_path / ".coli_usage"
    write_usage(path, h)
    assert path.read_bytes() == f"-1 4 8\n-2 1 {GLM}\n0 3 11\n3 7 2\n".encode()
    assert all(len(line.split()) == 3 for line in path.read_text().splitlines())
    assert read_usage(path, n_layers=4, n_experts=8, engine="glm_moe_dsa") == h
    assert sorted(os.listdir(tmp_path)) == [".coli_usage"]  # no temporary file left behind


def test_writer_writes_zero_bytes_for_an_empty_history(tmp_path):
    path = tmp_path / ".coli_usage"
    path.write_text("old content\n")
    write_usage(path, UsageHistory(4, 8, GLM))
    assert path.read_bytes() == b""
    assert format_usage(UsageHistory(1, 1)) == b""


def test_writer_omits_the_version_header_when_the_engine_is_unknown(tmp_path):
    h = UsageHistory(2, 2)
    h.add(1, 0, 3)
    assert format_usage(h) == b"-1 2 2\n1 0 3\n"


def test_add_refuses_experts_outside_the_geometry():
    h = UsageHistory(2, 2)
    with pytest.raises(UsageFileError):
        h.add(2, 0)
    with pytest.raises(UsageFileError):
        h.add(0, 0, -1)


def test_writer_refuses_counts_outside_the_geometry(tmp_path):
    h = UsageHistory(2, 2, counts={(5, 0): 1})
    with pytest.raises(UsageFileError, match="outside the geometry"):
        write_usage(tmp_path / "u", h)
    assert not (tmp_path / "u").exists()


@pytest.mark.parametrize(
    ("text", "geometry", "words"),
    [
        ("-1 1 4000000000\n", {}, "its geometry header declares 1 layers x 4000000000 experts"),
        ("-1 1048577 1\n", {}, "its geometry header declares 1048577 layers x 1 experts"),
        ("0 1048576 1\n", {"n_layers": 2}, "its records imply 2 layers x 1048577 experts"),
        ("0 1 1\n", {"n_layers": 100_000, "n_experts": 100_000}, "the model's geometry is 100000 layers"),
    ],
)
def test_a_geometry_of_more_than_max_expert_slots_is_refused(tmp_path, text, geometry, words):
    path = write(tmp_path, text.encode())
    with pytest.raises(UsageFileError, match=f"{re.escape(words)}.*more than the {MAX_EXPERT_SLOTS}"):
        read_usage(path, **geometry)


def test_the_largest_geometry_is_read_and_its_records_counted(tmp_path):
    assert MAX_EXPERT_SLOTS == 1 << 20  # four times 128 layers x 2048 experts (docs/FORMATS.md §6)
    h = read_usage(write(tmp_path, b"-1 1 1048576\n0 1048575 3\n"))
    assert (h.n_layers, h.n_experts, h.count(0, 1048575)) == (1, 1048576, 3)
