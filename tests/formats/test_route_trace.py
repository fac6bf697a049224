"""colibri's ROUTE_TRACE line and the ``.coli_pairs`` table of ``c/tools/route_pairs.py`` (FORMATS §6): every
expected byte here is worked out by hand from the trace written in the test."""

from __future__ import annotations

import numpy as np
import pytest

from colitools.formats.errors import ParameterError, UsageFileError
from colitools.formats.route_trace import (
    RouteTraceWriter,
    build_pairs,
    format_pairs,
    format_trace_line,
    read_pairs,
    write_route_pairs,
)


def test_trace_line_is_three_ints_then_expert_colon_gate_to_four_places():
    assert format_trace_line(0, 1, 3, [5, 2], [0.5, 0.123456]) == "0 1 3 5:0.5000 2:0.1235\n"
    # a float32 gate is printed from its exact value, as C's printf("%.4f") of the promoted double
    g = np.float32(0.60315)  # 0.603150010108947753...
    assert format_trace_line(7, 0, 0, [1], [g]) == "7 0 0 1:0.6032\n"
    assert format_trace_line(2, 0, 1, [], []) == "2 0 1\n"


def test_the_writer_numbers_calls_once_per_call_and_rows_per_batch(tmp_path):
    w = RouteTraceWriter(tmp_path / "t")
    w.record(0, np.array([[1, 0], [2, 3]]), np.array([[0.75, 0.25], [0.5, 0.5]], dtype=np.float32))
    w.record(1, np.array([[3, 1]]), np.array([[1.0, 0.0]], dtype=np.float32))
    w.close()
    assert (tmp_path / "t").read_bytes() == (
        b"0 0 0 1:0.7500 0:0.2500\n0 1 0 2:0.5000 3:0.5000\n1 0 1 3:1.0000 1:0.0000\n"
    )


# Two forwards of three layers. Forward 1: rows 0 and 1 (layer-major, as an engine writes them); forward 2
# starts where the layer drops back to 0 and reuses row 0. Noise the tool skips: a blank line, a line of three
# fields (a layer with no expert; it does not move the previous layer either), and row 1 of layer 2 written
# twice (the second wins).
TRACE = """\
0 0 0 1:0.6 2:0.4
0 1 0 2:0.5 3:0.5
1 0 1 4:0.9 5:0.1

1 1 1 5:0.7 4:0.3
9 9 0
2 0 2 6:0.5 7:0.5
2 1 2 0:1.0 1:0.0
2 1 2 7:0.8 6:0.2
3 0 0 1:0.5 3:0.5
4 0 1 5:1.0 4:0.0
5 0 2 7:0.6 0:0.4
"""
# Positions: (f1, r0) = {0: [1, 2], 1: [4, 5], 2: [6, 7]}, (f1, r1) = {0: [2, 3], 1: [5, 4], 2: [7, 6]},
# (f2, r0) = {0: [1, 3], 1: [5, 4], 2: [7, 0]}.
# (0,1,1): r0 f1 {4,5} + f2 {5,4}       -> 4:2 5:2 (4 counted first)
# (0,1,2): f1 r0 {4,5} + f1 r1 {5,4}    -> 4:2 5:2
# (0,1,3): f1 r1 {5,4} + f2 {5,4}       -> 5:2 4:2 (5 first)
# (0,2,1): f1 r0 {6,7} + f2 {7,0}       -> 7:2 6:1 0:1
# (0,2,2): f1 r0 {6,7} + f1 r1 {7,6}    -> 6:2 7:2
# (0,2,3): f1 r1 {7,6} + f2 {7,0}       -> 7:2 6:1 0:1
# (1,1,4): f1 r0 {6,7} + f1 r1 {7,6} + f2 {7,0} -> 7:3 6:2 0:1
# (1,1,5): the same three                        -> 7:3 6:2 0:1
PAIRS = b"""\
COLIPAIRS 1 8
0 1 1 4:2 5:2
0 1 2 4:2 5:2
0 1 3 5:2 4:2
0 2 1 7:2 6:1 0:1
0 2 2 6:2 7:2
0 2 3 7:2 6:1 0:1
1 1 4 7:3 6:2 0:1
1 1 5 7:3 6:2 0:1
"""


def test_pairs_group_by_forward_and_row_and_rank_ties_by_first_count(tmp_path):
    (tmp_path / "t").write_text(TRACE)
    table = build_pairs([tmp_path / "t"])
    assert format_pairs(table) == PAIRS
    assert table.positions == {str(tmp_path / "t"): 3}


def test_pairs_top_and_depth(tmp_path):
    (tmp_path / "t").write_text(TRACE)
    assert format_pairs(build_pairs([tmp_path / "t"], top=1, depth=1)) == (
        b"COLIPAIRS 1 5\n0 1 1 4:2\n0 1 2 4:2\n0 1 3 5:2\n1 1 4 7:3\n1 1 5 7:3\n"
    )


def test_several_traces_add_up_and_each_starts_its_own_forwards(tmp_path):
    # the second file starts at layer 1: no forward boundary is carried over from the first file's last layer
    (tmp_path / "a").write_text("0 0 0 1:1.0\n1 0 1 2:1.0\n")
    (tmp_path / "b").write_text("0 0 1 2:1.0\n1 0 1 3:1.0\n0 0 0 1:1.0\n")
    # b: (f1, r0) = {1: [3]} (the second layer-1 line wins), then layer 0 < 1 opens f2 = {0: [1]}
    table = write_route_pairs([tmp_path / "a", tmp_path / "b", tmp_path / "a"], tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"COLIPAIRS 1 1\n0 1 1 2:2\n"
    assert table.positions == {str(tmp_path / "a"): 1, str(tmp_path / "b"): 2}


def test_an_empty_table_is_the_header_and_an_empty_line(tmp_path):
    (tmp_path / "t").write_text("0 0 0 1:1.0\n")
    assert format_pairs(build_pairs([tmp_path / "t"])) == b"COLIPAIRS 1 0\n\n"


def test_a_hand_written_table_round_trips_byte_for_byte(tmp_path):
    (tmp_path / "p").write_bytes(PAIRS)
    assert format_pairs(read_pairs(tmp_path / "p")) == PAIRS
    (tmp_path / "p").write_bytes(b"COLIPAIRS 1 2\n0 1 2 5:3\n")
    with pytest.raises(UsageFileError, match="header says 2 lines, the table has 1"):
        read_pairs(tmp_path / "p")


def test_bad_traces_and_parameters_are_one_line_errors(tmp_path):
    (tmp_path / "t").write_text("0 0 0 1:0.5\n0 x 0 1:0.5\n")
    with pytest.raises(UsageFileError, match=r"t:2: expected '<call> <row> <layer> <expert>:<gate> \.\.\.'"):
        build_pairs([tmp_path / "t"])
    with pytest.raises(UsageFileError, match="route trace not found"):
        build_pairs([tmp_path / "missing"])
    with pytest.raises(ParameterError, match="`top` must be >= 1"):
        build_pairs([], top=0)
    with pytest.raises(ParameterError, match="`depth` must be >= 1"):
        build_pairs([], depth=0)
