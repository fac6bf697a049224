"""The replica routing rule (docs/FORMATS.md §7) and the read-share prediction (expected values computed by hand)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from colitools.errors import ParameterError
from colitools.mirror.routing import parse_disk_weights, predict_reads, replica_cuts, replica_for

# h = (index * 2654435761) mod 2^32, bucket = (h >> 16) & 255, by hand:
#   index 1: 0x9E3779B1 -> 0x9E37 -> 0x37 = 55      index 4: 0x78DDE6C4 -> 0x78DD -> 0xDD = 221
#   index 2: 0x3C6EF362 -> 0x3C6E -> 0x6E = 110     index 5: 0x17156075 -> 0x1715 -> 0x15 = 21
#   index 3: 0xDAA66D13 -> 0xDAA6 -> 0xA6 = 166     index 6: 0xB54CDA26 -> 0xB54C -> 0x4C = 76
#   index 0: 0 -> 0                                  index 7: 0x538453D7 -> 0x5384 -> 0x84 = 132
BUCKET = {0: 0, 1: 55, 2: 110, 3: 166, 4: 221, 5: 21, 6: 76, 7: 132}


@pytest.mark.parametrize(
    "weights, cuts",
    [
        ([9, 3], [192, 256]),  # 256 * 9/12 = 192
        ([1, 1], [128, 256]),
        ([1, 2], [85, 256]),  # 85.33
        ([2, 1], [171, 256]),  # 170.67
        ([1, 1, 2], [64, 128, 256]),
        ([1, 511], [1, 256]),  # 0.5 rounds half away from zero, as C's round() (Python's round gives 0)
        ([3, 509], [2, 256]),  # 1.5 -> 2
        ([Fraction("0.1"), Fraction("0.2")], [85, 256]),
        ([0.1, 0.2], [85, 256]),
    ],
)
def test_replica_cuts(weights, cuts):
    assert replica_cuts(weights) == cuts


@pytest.mark.parametrize("index", range(8))
def test_replica_for_matches_the_hand_computed_buckets(index):
    layer, expert = divmod(index, 4)
    assert replica_for(layer, expert, 4, [192, 256]) == (0 if BUCKET[index] < 192 else 1)
    assert replica_for(layer, expert, 4, [128, 256]) == (0 if BUCKET[index] < 128 else 1)


def test_replica_for_uses_layer_times_experts_plus_expert():
    # (layer 1, expert 0) with 4 experts per layer is index 4 (bucket 221); with 8 per layer it is index 8
    assert replica_for(1, 0, 4, [200, 256]) == 1
    assert replica_for(0, 4, 8, [200, 256]) == 1
    assert replica_for(1, 0, 2, [200, 256]) == 0  # index 2, bucket 110


def test_parse_disk_weights():
    assert parse_disk_weights("9,3") == [9, 3]
    assert parse_disk_weights(" 2.5 , 1 ") == [Fraction(5, 2), 1]
    for bad in ("9", "9,0", "9,-1", "a,b", "", "9,,3"):
        with pytest.raises(ParameterError, match="`disk_weights`"):
            parse_disk_weights(bad)


def test_prediction_splits_bytes_by_replica_and_presence():
    # four experts of layer 1 (indices 4..7), 100 bytes each, all mirrored
    counts = {(1, 0): 1, (1, 1): 2, (1, 2): 3, (1, 3): 4}
    sizes = {k: 100 for k in counts}
    p = predict_reads(counts, 4, sizes, sizes, counts.keys(), [9, 3])
    # cuts 192: only index 4 (bucket 221) goes to the mirror -> 1 * 100 of 1000 bytes
    assert (p.expert_bytes_read, p.mirror_bytes, p.primary_bytes) == (1000, 100, 900)
    assert p.mirror_share == pytest.approx(0.1)
    assert p.bandwidth_gain == pytest.approx(1 / 0.9)  # max(0.9 / 1, 0.1 * 9 / 3) = 0.9
    p = predict_reads(counts, 4, sizes, sizes, counts.keys(), [1, 1])
    # cuts 128: indices 4 (221) and 7 (132) -> (1 + 4) * 100
    assert p.mirror_bytes == 500 and p.bandwidth_gain == pytest.approx(2.0)


def test_prediction_reads_unmirrored_or_partly_mirrored_experts_from_the_primary():
    counts = {(1, 0): 2, (1, 3): 4}  # both routed to the mirror under 1,1
    sizes = {(1, 0): 100, (1, 3): 100}
    mirrored = {(1, 0): 100, (1, 3): 60}  # 40 bytes of (1, 3) live in a shard that is not mirrored
    p = predict_reads(counts, 4, sizes, mirrored, [(1, 3)], [1, 1])  # (1, 0)'s routed tensor not mirrored
    assert (p.mirror_bytes, p.primary_bytes) == (4 * 60, 2 * 100 + 4 * 40)
    assert p.mirror_share_full == pytest.approx(1.0)
    assert p.full_mirror_gain == pytest.approx(1.0)  # everything on the mirror: no faster than the primary


def test_prediction_with_a_slow_mirror_can_predict_a_loss():
    counts = {(1, 0): 1}
    p = predict_reads(counts, 4, {(1, 0): 8}, {(1, 0): 8}, [(1, 0)], [9, 3])
    assert p.mirror_share == 1.0 and p.bandwidth_gain == pytest.approx(1 / 3)
