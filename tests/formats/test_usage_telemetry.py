"""The save and read semantics colibri's engines share (``c/route_trace.h``, its cases in
``c/tests/test_route_trace.c``): IKU1 histories, CRLF, admitted-only totals, the dropped-row rule, trusted reads
and ``COLI_USAGE_DECAY``. Every file here is written byte by byte in the test."""

from __future__ import annotations

import struct

import pytest

from colitools.formats.errors import ParameterError, UsageFileError
from colitools.formats.usage import (
    UsageHistory,
    decay_usage,
    engine_id,
    format_usage,
    read_usage,
    write_usage,
)

GLM = engine_id("glm_moe_dsa")


def iku1(layers: int, experts: int, cells: dict[tuple[int, int], int]) -> bytes:
    """Inkling's dense history by hand: uint32 LE {magic "IKU1", layers, experts}, then the row-major block."""
    body = [0] * (layers * experts)
    for (layer, expert), n in cells.items():
        body[layer * experts + expert] = n
    return struct.pack("<4s2I", b"IKU1", layers, experts) + struct.pack(f"<{len(body)}I", *body)


def test_iku1_bytes_are_read_by_position_for_an_inkling_model(tmp_path):
    # test_route_trace.c 7b: layer 3 / expert 2 -> 7, layer 1 / expert 5 -> 4, total 11
    f = tmp_path / "h"
    f.write_bytes(iku1(5, 8, {(3, 2): 7, (1, 5): 4}))
    assert f.read_bytes()[:16] == bytes.fromhex("494b5531 05000000 08000000 00000000")
    h = read_usage(f, n_layers=5, n_experts=8, engine="inkling_text")
    assert h.iku1 and h.counts == {(3, 2): 7, (1, 5): 4} and h.total == 11 and h.engine_id is None
    assert read_usage(f, engine=engine_id("inkling")).total == 11  # colibri's engine name, by id
    assert read_usage(f).n_layers == 5  # no model: the file's geometry


@pytest.mark.parametrize("explicit", [False, True])
def test_iku1_is_refused_by_name_for_any_other_engine_even_when_named(tmp_path, explicit):
    f = tmp_path / "h"
    f.write_bytes(iku1(5, 8, {(3, 2): 7}))
    with pytest.raises(UsageFileError, match=r"IKU1 .* inkling engine\) is read only for an Inkling model, not "
                       r"for this model's engine 'glm_moe_dsa'"):  # fmt: skip
        read_usage(f, n_layers=5, n_experts=8, engine="glm_moe_dsa", explicit=explicit)


@pytest.mark.parametrize("geometry", [(4, 8), (5, 16)])
def test_iku1_geometry_is_the_parse_geometry_and_must_match(tmp_path, geometry):
    f = tmp_path / "h"
    f.write_bytes(iku1(5, 8, {(3, 2): 7}))
    with pytest.raises(UsageFileError, match=r"IKU1 usage history is 5 layers x 8 experts, the model is"):
        read_usage(f, n_layers=geometry[0], n_experts=geometry[1], engine="inkling_text", explicit=True)


@pytest.mark.parametrize(
    ("cut", "message"), [(10, "shorter than its 12-byte header"), (-4, "is 172 bytes, the file is 168")]
)
def test_a_truncated_iku1_file_is_refused_naming_its_size(tmp_path, cut, message):
    f = tmp_path / "h"
    f.write_bytes(iku1(5, 8, {(3, 2): 7})[:cut])
    with pytest.raises(UsageFileError, match=message):
        read_usage(f, engine="inkling_text")


def test_an_inkling_run_extends_an_iku1_history_into_the_text_layout(tmp_path):
    # inkling.c saves through rt_save: the history it seeded from IKU1 is written back as text
    f = tmp_path / "h"
    f.write_bytes(iku1(2, 4, {(0, 1): 3, (1, 3): 2}))
    h = read_usage(f, n_layers=2, n_experts=4, engine="inkling_text")
    h.engine_id = engine_id("inkling_text")
    h.add(0, 1, 1)
    write_usage(f, h)
    assert f.read_bytes() == f"-1 2 4\n-2 1 {engine_id('inkling_text')}\n0 1 4\n1 3 2\n".encode()


def test_a_crlf_history_reads_like_lf(tmp_path):
    # test_route_trace.c 4b: a Windows-written history
    f = tmp_path / "h"
    f.write_bytes(f"-1 5 8\r\n-2 1 {GLM}\r\n3 2 2\r\n3 5 1\r\n".encode())
    h = read_usage(f, n_layers=5, n_experts=8, engine="glm_moe_dsa")
    assert h.counts == {(3, 2): 2, (3, 5): 1} and h.total == 3


def test_out_of_range_records_are_never_in_the_total(tmp_path):
    # test_route_trace.c 9: valid, layer out of range, expert out of range -> total 5
    f = tmp_path / "h"
    f.write_bytes(b"3 2 5\n9 1 100\n1 99 200\n")
    h = read_usage(f, n_layers=5, n_experts=8)
    assert h.total == 5 and h.counts == {(3, 2): 5} and h.skipped_records == 2


def test_a_layer_that_does_not_route_absorbs_nothing_and_is_not_written_back(tmp_path):
    # test_route_trace.c 12: layer 2 dropped; "2 3 50" is not counted, "3 4 7" lands
    f = tmp_path / "h"
    f.write_bytes(b"2 3 50\n3 4 7\n")
    h = read_usage(f, n_layers=5, n_experts=8, routed_layers=[0, 1, 3, 4])
    assert h.total == 7 and h.counts == {(3, 4): 7} and h.skipped_records == 1
    h.engine_id = GLM
    write_usage(f, h)
    assert f.read_bytes() == f"-1 5 8\n-2 1 {GLM}\n3 4 7\n".encode()


def test_a_trusted_read_relaxes_the_engine_only(tmp_path):
    # test_route_trace.c 10 / 10b
    f = tmp_path / "h"
    f.write_bytes(f"-1 5 8\n-2 1 {engine_id('kimi_k3')}\n3 2 6\n".encode())
    with pytest.raises(UsageFileError, match="pass the file explicitly"):
        read_usage(f, n_layers=5, n_experts=8, engine="glm_moe_dsa")
    assert read_usage(f, n_layers=5, n_experts=8, engine="glm_moe_dsa", explicit=True).total == 6
    f.write_bytes(f"-1 99 512\n-2 1 {GLM}\n3 2 6\n".encode())
    with pytest.raises(UsageFileError, match="usage geometry 99 layers x 512 experts does not match"):
        read_usage(f, n_layers=5, n_experts=8, engine="glm_moe_dsa", explicit=True)
    f.write_bytes(f"-1 5 8\n-2 2 {GLM}\n3 2 9\n".encode())
    with pytest.raises(UsageFileError, match="usage format version 2 is not supported"):
        read_usage(f, n_layers=5, n_experts=8, engine="glm_moe_dsa", explicit=True)


def test_decay_rounds_half_up_and_keeps_count_one_alive():
    # floor(c * d + 0.5), exact in binary: 0.5 -> 1:1 (1.0), 3:2 (2.0), 4:2 (2.5), 5:3 (3.0)
    h = UsageHistory(1, 8, GLM, {(0, 1): 1, (0, 3): 3, (0, 4): 4, (0, 5): 5})
    decay_usage(h, 0.5)
    assert h.counts == {(0, 1): 1, (0, 3): 2, (0, 4): 2, (0, 5): 3}
    # below 0.5 a count of 1 rounds to 0 and its record goes: 0.25 -> 1:0 (0.75), 2:1 (1.0), 3:1 (1.25)
    h = UsageHistory(1, 8, GLM, {(0, 1): 1, (0, 2): 2, (0, 3): 3})
    decay_usage(h, 0.25)
    assert format_usage(h) == f"-1 1 8\n-2 1 {GLM}\n0 2 1\n0 3 1\n".encode()


def test_decay_one_is_byte_identical_and_out_of_range_factors_are_refused():
    h = UsageHistory(2, 8, GLM, {(0, 1): 7, (1, 2): 123456789})
    before = format_usage(h)
    decay_usage(h, 1.0)
    assert format_usage(h) == before
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ParameterError, match=r"`usage_decay` must be in \(0, 1\]"):
            decay_usage(h, bad)
