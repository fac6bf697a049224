"""docs/FORMATS.md §3: resolution of one tensor from byte counts, stamps and logical shapes (whole containers:
``test_container.py``).

Every byte count in the tables below is computed by hand from the spec's formulas (not from the registry), so
that a wrong size in the registry or the resolver fails here."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colitools.formats.errors import ResolveError
from colitools.formats.registry import (
    GROUP_SIZES,
    Int4Grouped,
    Int4Row,
    Int8Row,
    Mxfp4,
    by_name,
    writer_group_size,
)
from colitools.formats.resolver import (
    Resolved,
    check_roundtrip,
    encode_shapes,
    encode_stamps,
    parse_layout,
    parse_shapes,
    parse_stamps,
    resolve_format,
    resolve_mxfp4,
    stamp_for,
)

E8 = Resolved(6, "e8-iq3-lattice")
I8 = Resolved(1, "int8-row")
FP8 = Resolved(8, "fp8-e4m3-b128")
I4 = Resolved(2, "int4-row")
I2 = Resolved(3, "int2-row")
I3 = Resolved(5, "int3-g64")


def G(gs: int) -> Resolved:
    return Resolved(4, "int4-grouped", gs)


# (case, nb, ns, O, I, stamp, expected)
RESOLVES = [
    # step 1: e8 first (ns == 4 and nb == O * ceil(I/256) * 98)
    ("e8 [2, 512]", 392, 4, 2, 512, None, E8),
    ("e8 [3, 98] beats int8 (i8 = 294)", 294, 4, 3, 98, None, E8),
    ("e8 [1, 98] beats int8-row and fp8", 98, 4, 1, 98, None, E8),
    ("stamp e8 at I = 98", 98, 4, 1, 98, "e8-iq3-lattice", E8),
    ("stamp int8-row at [1, 98]", 98, 4, 1, 98, "int8-row", I8),
    ("stamp fp8 at [1, 98]", 98, 4, 1, 98, "fp8-e4m3-b128", FP8),
    ("stamp fp8 at [3, 98] (nblk 1)", 294, 4, 3, 98, "fp8-e4m3-b128", FP8),
    ("O = 1 int4-row signature at I = 196 is e8", 98, 4, 1, 196, None, E8),
    ("O = 1 int4-row at I = 196 with stamp", 98, 4, 1, 196, "int4-row", I4),
    ("O = 1 int4-row at I = 195 with stamp", 98, 4, 1, 195, "int4-row", I4),
    ("O = 1 int4-row at I = 392 with stamp", 196, 4, 1, 392, "int4-row", I4),
    ("O = 1 I = 197: int4-row, no collision (99 != 98)", 99, 4, 1, 197, None, I4),
    ("O = 2 I = 196: int4-row (e8 needs ns 4)", 196, 8, 2, 196, None, I4),
    # step 2: precedence int8 > int4 > int2 > int3, [4, 100]
    ("int8-row [4, 100]", 400, 16, 4, 100, None, I8),
    ("int4-row [4, 100]", 200, 16, 4, 100, None, I4),
    ("int2-row [4, 100]", 100, 16, 4, 100, None, I2),
    ("int3-g64 [4, 100]", 192, 32, 4, 100, None, I3),
    ("int4-row odd [4, 101]", 204, 16, 4, 101, None, I4),
    ("int2-row odd [4, 101]", 104, 16, 4, 101, None, I2),
    ("int3-g64 [4, 64]", 96, 16, 4, 64, None, I3),
    ("int3-g64 [4, 200]", 384, 64, 4, 200, None, I3),
    ("int3 signature at I = 24 is int8-row", 96, 16, 4, 24, None, I8),
    ("int3 signature at I = 47 is int4-row", 96, 16, 4, 47, None, I4),
    ("int3 signature at I = 48 is int4-row", 96, 16, 4, 48, None, I4),
    ("int3 signature at I = 95 is int4-g48", 192, 32, 4, 95, None, G(48)),
    ("int3 signature at I = 96 is int4-g48", 192, 32, 4, 96, None, G(48)),
    ("int3 signature at I = 143 is int4-g48", 288, 48, 4, 143, None, G(48)),
    ("int3 signature at I = 144 is int4-g48", 288, 48, 4, 144, None, G(48)),
    ("int4/int2 signature at I = 1 is int8-row", 4, 16, 4, 1, None, I8),
    ("int2 signature at I = 2 is int4-row", 4, 16, 4, 2, None, I4),
    # step 3: group-size detection, [2, 256] -> nb 256
    ("gs 16 [2, 256]", 256, 128, 2, 256, None, G(16)),
    ("gs 32 [2, 256]", 256, 64, 2, 256, None, G(32)),
    ("gs 48 [2, 256] (6 groups)", 256, 48, 2, 256, None, G(48)),
    ("gs 64 [2, 256]", 256, 32, 2, 256, None, G(64)),
    ("gs 96 [2, 256] (3 groups)", 256, 24, 2, 256, None, G(96)),
    ("gs 128 [2, 256]", 256, 16, 2, 256, None, G(128)),
    ("gs 192 [1, 768] (4 groups)", 384, 16, 1, 768, None, G(192)),
    ("gs 256 [1, 768] (3 groups)", 384, 12, 1, 768, None, G(256)),
    ("two groups at I = 96 are gs 48", 144, 24, 3, 96, None, G(48)),
    ("two groups at I = 100 are gs 64", 150, 24, 3, 100, None, G(64)),
    ("one group at I = 40 is int4-row", 40, 8, 2, 40, None, I4),
    ("gs 16 at I = 20 (2 groups)", 20, 16, 2, 20, None, G(16)),
    ("stamp int4-grouped on grouped bytes", 256, 32, 2, 256, "int4-grouped", G(64)),
    # step 4: int8-row vs fp8 by scale count
    ("int8-row [256, 256] row scales", 65536, 1024, 256, 256, None, I8),
    ("fp8 [256, 256] blk only (nblk 4)", 65536, 16, 256, 256, None, FP8),
    ("fp8 [300, 500] blk only (nblk 3 * 4)", 150000, 48, 300, 500, None, FP8),
    ("O == nblk [2, 256], no stamp -> int8-row", 512, 8, 2, 256, None, I8),
    ("O == nblk [2, 256], stamp fp8", 512, 8, 2, 256, "fp8-e4m3-b128", FP8),
    ("O == nblk [2, 256], stamp int8-row", 512, 8, 2, 256, "int8-row", I8),
    ("O == nblk [1, 100], stamp fp8", 100, 4, 1, 100, "fp8-e4m3-b128", FP8),
    ("O == nblk [1, 100], no stamp", 100, 4, 1, 100, None, I8),
    ("stamp equal to the unstamped answer", 200, 16, 4, 100, "int4-row", I4),
]


@pytest.mark.parametrize(
    ("case", "nb", "ns", "O", "I", "stamp", "want"), RESOLVES, ids=[r[0] for r in RESOLVES]
)
def test_resolve_format_table(case, nb, ns, O, I, stamp, want):
    assert resolve_format("model.w", nb, ns, O, I, stamp) == want


# (case, nb, ns, O, I, stamp, words the message must contain)
ERRORS = [
    ("no known layout", 401, 16, 4, 100, None, ["no known layout"]),
    ("e8 weight bytes without its single scale", 392, 8, 2, 512, None, ["no known layout"]),
    ("int8 bytes, scales match neither", 65536, 20, 256, 256, None, ["neither", "1024", "16"]),
    ("int4 bytes, scales match no group size", 256, 40, 2, 256, None, ["group size"]),
    ("gs 16 is the finest: 3 groups at I = 20 match nothing", 20, 24, 2, 20, None, ["group size"]),
    ("int2 with wrong scale bytes", 100, 20, 4, 100, None, ["int2-row needs 16"]),
    ("int3 with wrong scale bytes", 192, 16, 4, 100, None, ["int3-g64 needs 32"]),
    ("stamp fp8 on int8-row bytes (nblk 1)", 400, 16, 4, 100, "fp8-e4m3-b128", ["contradicts", "int8-row"]),
    ("stamp int8-row on fp8 bytes", 65536, 16, 256, 256, "int8-row", ["contradicts", "fp8-e4m3-b128"]),
    ("stamp int4-grouped on int4-row bytes", 200, 16, 4, 100, "int4-grouped", ["contradicts", "int4-row"]),
    ("stamp int4-row on e8-only bytes", 392, 4, 2, 512, "int4-row", ["contradicts", "e8-iq3-lattice"]),
    ("stamp int4-row at [1, 98]", 98, 4, 1, 98, "int4-row", ["contradicts"]),
    ("stamp e8 on int8-row bytes", 400, 16, 4, 100, "e8-iq3-lattice", ["contradicts"]),
    ("stamp int3 on int2 bytes", 100, 16, 4, 100, "int3-g64", ["contradicts", "int2-row"]),
    ("stamp mxfp4 on a .qs tensor", 400, 16, 4, 100, "mxfp4", ["contradicts"]),
    ("stamp on bytes that allow nothing", 401, 16, 4, 100, "int8-row", ["no known format"]),
    ("unknown stamp", 400, 16, 4, 100, "int5-row", ["not a known format"]),
]


@pytest.mark.parametrize(("case", "nb", "ns", "O", "I", "stamp", "words"), ERRORS, ids=[e[0] for e in ERRORS])
def test_resolve_format_errors_name_tensor_and_both_counts(case, nb, ns, O, I, stamp, words):
    with pytest.raises(ResolveError) as info:
        resolve_format("model.layers.3.w", nb, ns, O, I, stamp)
    message = str(info.value)
    assert "\n" not in message
    assert "model.layers.3.w" in message and str(nb) in message and str(ns) in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(("O", "I"), [(0, 10), (10, 0), (-1, 5), (True, 5)])
def test_resolve_format_rejects_non_positive_shape(O, I):
    with pytest.raises(ResolveError, match="model.w"):
        resolve_format("model.w", 10, 4, O, I)


def test_resolve_mxfp4_pairs():
    assert resolve_mxfp4("m", 8 * 64, 8 * 4, 8, 128) == Resolved(7, "mxfp4")
    assert resolve_mxfp4("m", 3 * 16, 3 * 1, 3, 32) == Resolved(7, "mxfp4")


@pytest.mark.parametrize(
    ("packed", "scale", "O", "I", "words"),
    [
        (8 * 50, 8 * 4, 8, 100, "I % 32"),
        (8 * 64 + 1, 8 * 4, 8, 128, "needs 512 and 32"),
        (8 * 64, 8 * 4 * 4, 8, 128, "needs 512 and 32"),  # F32-sized scales are not E8M0 bytes
    ],
)
def test_resolve_mxfp4_errors(packed, scale, O, I, words):
    with pytest.raises(ResolveError, match=words) as info:
        resolve_mxfp4("mx.weight_packed", packed, scale, O, I)
    assert (
        "mx.weight_packed" in str(info.value)
        and str(packed) in str(info.value)
        and str(scale) in str(info.value)
    )


# ------------------------------------------------------------------------------------------ writer side
STAMPS = [
    ("fp8-e4m3-b128", 2, 256, None, "fp8-e4m3-b128"),  # O == nblk
    ("fp8-e4m3-b128", 1, 100, None, "fp8-e4m3-b128"),  # O == nblk == 1
    ("fp8-e4m3-b128", 5, 98, None, "fp8-e4m3-b128"),  # e8 signature (nblk 1, ns 4)
    ("fp8-e4m3-b128", 256, 256, None, None),
    ("fp8-e4m3-b128", 200, 98, None, None),  # nblk 2: ns 8, no e8 collision
    ("e8-iq3-lattice", 3, 98, None, "e8-iq3-lattice"),  # the spec stamps fmt 6 at I == 98
    ("e8-iq3-lattice", 3, 512, None, None),
    ("int8-row", 1, 98, None, "int8-row"),  # e8 signature
    ("int8-row", 2, 98, None, None),
    ("int8-row", 2, 256, None, None),  # O == nblk: int8-row is the unstamped answer
    ("int8-row", 8, 4096, None, "int8-row"),  # §3 rule 7: nblk == 4*O (colibri's UE8M0-FP8 signature)
    ("int8-row", 1, 512, None, "int8-row"),
    ("int8-row", 2, 1024, None, "int8-row"),
    ("int8-row", 1, 384, None, None),  # nblk 3
    ("int4-row", 1, 197, None, None),
    ("int4-row", 2, 196, None, None),
    ("int4-grouped", 4, 100, 64, None),
    ("int4-grouped", 4, 96, 48, None),
    ("int2-row", 4, 3, None, None),
    ("int3-g64", 4, 100, None, None),
    ("int3-g64", 4, 23, None, None),
    ("mxfp4", 4, 128, None, None),
    ("f32", 4, 128, None, None),
]


@pytest.mark.parametrize(("fmt", "O", "I", "gs", "want"), STAMPS)
def test_stamp_for(fmt, O, I, gs, want):
    assert stamp_for("t", fmt, O, I, gs) == want
    if fmt != "f32":
        check_roundtrip("t", fmt, gs, O, I, want)


@pytest.mark.parametrize(
    ("fmt", "O", "I", "gs", "became"),
    [
        ("int3-g64", 4, 24, None, "int8-row"),
        ("int3-g64", 4, 47, None, "int4-row"),
        ("int3-g64", 4, 48, None, "int4-row"),
        ("int3-g64", 4, 95, None, "int4-g48"),
        ("int3-g64", 4, 96, None, "int4-g48"),
        ("int3-g64", 4, 143, None, "int4-g48"),
        ("int3-g64", 1, 144, None, "int4-g48"),
        ("int2-row", 4, 2, None, "int4-row"),
        ("int2-row", 4, 1, None, "int8-row"),
        ("int4-row", 4, 1, None, "int8-row"),
        ("int4-grouped", 4, 96, 64, "int4-g48"),  # not the writer rule's gs
        # O == 1 int4-row with fmt 6's bytes: colibri's e8 branch refuses an int4-row stamp (qt_resolve_fmt)
        ("int4-row", 1, 195, None, "e8-iq3-lattice"),
        ("int4-row", 1, 196, None, "e8-iq3-lattice"),
        ("int4-row", 1, 784, None, "e8-iq3-lattice"),
    ],
)
def test_stamp_for_refuses_collisions_no_stamp_may_settle(fmt, O, I, gs, became):
    with pytest.raises(ResolveError, match=f"would resolve as {became}.*int8-row instead"):
        stamp_for("t", fmt, O, I, gs)


@pytest.mark.parametrize(
    ("fmt", "O", "I"),
    [("int8-row", 8, 4096), ("int8-row", 1, 512), ("fp8-e4m3-b128", 2, 256), ("int8-row", 1, 98)],
)
def test_stamp_for_routed_experts_never_stamped(fmt, O, I):
    with pytest.raises(ResolveError, match="needs a colibri.fmt stamp"):
        stamp_for("model.layers.1.mlp.experts.0.up_proj.weight", fmt, O, I, allow_stamp=False)
    assert stamp_for("x", "int4-row", 2, 196, allow_stamp=False) is None


def test_stamp_for_mxfp4_needs_i_multiple_of_32():
    with pytest.raises(ResolveError, match="I % 32"):
        stamp_for("t", "mxfp4", 4, 100)


def test_stamp_for_group_size_only_for_int4_grouped():
    with pytest.raises(ResolveError, match="group size"):
        stamp_for("t", "int8-row", 4, 100, 64)
    with pytest.raises(ResolveError, match="group size"):
        stamp_for("t", "int4-grouped", 4, 100)


def test_check_roundtrip_catches_wrong_bytes_and_wrong_format():
    assert check_roundtrip("t", "int4-grouped", 64, 4, 128, None, nb=256, ns=32) == G(64)
    with pytest.raises(ResolveError, match="wrote weight bytes 255"):
        check_roundtrip("t", "int4-grouped", 64, 4, 128, None, nb=255, ns=32)
    with pytest.raises(ResolveError, match="resolve as int8-row"):
        check_roundtrip("t", "fp8-e4m3-b128", None, 2, 256, None)  # the stamp was forgotten
    with pytest.raises(ResolveError, match="resolve as int4-g48"):
        check_roundtrip("t", "int3-g64", None, 4, 96, None)
    assert check_roundtrip("t", "mxfp4", None, 4, 64, None, nb=128, ns=8) == Resolved(7, "mxfp4")


WRITABLE = ["int8-row", "int4-row", "int2-row", "int3-g64", "mxfp4", "fp8-e4m3-b128"] + [
    f"int4-g{g}" for g in GROUP_SIZES
]


def _writer_choice(option: str, O: int, I: int) -> tuple[str, int | None, str | None]:
    """What a writer does: the writer rule for group sizes, stamp_for, int8-row when no stamp may settle it."""
    name, gs = option, None
    if option.startswith("int4-g"):
        gs = writer_group_size(I, int(option[6:]))
        name = "int4-row" if gs is None else "int4-grouped"
    try:
        return name, gs, stamp_for("t", name, O, I, gs)
    except ResolveError:
        fallback_ok = (
            (name == "int3-g64" and I in (24, 47, 48, 95, 96, 143, 144))
            or (name == "int2-row" and I <= 2)
            or (name == "int4-row" and I == 1)
            or (name == "int4-row" and O == 1 and I in (195, 196, 391, 392, 587, 588, 783, 784))  # colibri's e8
            or (name == "mxfp4" and I % 32)
        )
        assert fallback_ok, f"unexpected fallback for {option} [{O}, {I}]"
        return "int8-row", None, stamp_for("t", "int8-row", O, I)


@settings(max_examples=600, deadline=None)
@given(
    O=st.one_of(st.integers(1, 4), st.integers(1, 600), st.sampled_from([127, 128, 129, 256, 257])),
    I=st.one_of(
        st.integers(1, 3000),
        st.sampled_from([1, 2, 24, 47, 48, 95, 96, 98, 143, 144, 195, 196, 391, 392, 587, 588, 783, 784]),
    ),
    option=st.sampled_from(WRITABLE),
)
def test_property_writer_bytes_plus_stamp_resolve_to_the_chosen_format(O, I, option):
    name, gs, stamp = _writer_choice(option, O, I)
    fmt = by_name(name)
    nb, ns = fmt.weight_nbytes(O, I, gs), fmt.scale_nbytes(O, I, gs)
    if name == "mxfp4":
        got = resolve_mxfp4("t", nb, ns, O, I)
    else:
        got = resolve_format("t", nb, ns, O, I, stamp)
    assert (got.name, got.group_size) == (name, gs)
    assert check_roundtrip("t", name, gs, O, I, stamp) == got


def test_writer_group_size_examples_of_the_spec():
    assert writer_group_size(96, 64) == 48
    assert writer_group_size(100, 64) == 64
    assert writer_group_size(256, 192) == 128
    assert writer_group_size(64, 64) is None


# -------------------------------------------------------------------------------------- shard metadata
def test_parse_and_encode_stamps_and_shapes():
    meta = {
        "colibri.fmt": encode_stamps({"b": "fp8-e4m3-b128", "a": "int8-row"}),
        "colitools.shapes": encode_shapes({"w": (3, 5)}),
    }
    assert meta["colibri.fmt"] == '{"a":"int8-row","b":"fp8-e4m3-b128"}'  # sorted keys
    assert parse_stamps(meta) == {"a": "int8-row", "b": "fp8-e4m3-b128"}
    assert parse_shapes(meta) == {"w": (3, 5)}
    assert parse_stamps({}) == {} and parse_shapes({}) == {}
    assert encode_shapes({}) == "{}"
    assert parse_layout({}) == "pairs"
    assert parse_layout({"colitools.layout": "planar64-v8"}) == "planar64-v8"


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        ({"colibri.fmt": "{not json"}, "not valid JSON"),
        ({"colibri.fmt": '["a"]'}, "not a JSON object"),
        ({"colibri.fmt": '{"a": 4}'}, "not a string"),
        ({"colibri.fmt": '{"a": "int9"}'}, "not a known format"),
        ({"colitools.shapes": '{"a": [3]}'}, "not \\[O, I\\]"),
        ({"colitools.shapes": '{"a": [3, 0]}'}, "not \\[O, I\\]"),
        ({"colitools.shapes": '{"a": [3, true]}'}, "not \\[O, I\\]"),
        ({"colitools.shapes": '{"a": "3x4"}'}, "not \\[O, I\\]"),
        ({"colitools.layout": "planar32"}, "unknown colitools.layout"),
    ],
)
def test_bad_metadata_is_an_error_naming_the_file(meta, words):
    with pytest.raises(ResolveError, match=words) as info:
        parse_stamps(meta, where="shard-1.safetensors")
        parse_shapes(meta, where="shard-1.safetensors")
        parse_layout(meta, where="shard-1.safetensors")
    assert "shard-1.safetensors" in str(info.value)


def test_spec_int4_row_and_int8_row_classes_agree_with_hand_counts():
    # A guard for the tables above: the registry's counts for one shape, computed by hand.
    assert (Int8Row.weight_nbytes(4, 100), Int8Row.scale_nbytes(4, 100)) == (400, 16)
    assert (Int4Row.weight_nbytes(4, 101), Int4Grouped.scale_nbytes(3, 100, 64)) == (204, 24)
    assert (Mxfp4.weight_nbytes(8, 128), Mxfp4.scale_nbytes(8, 128)) == (512, 32)
    assert json.loads(encode_shapes({"b": (1, 2), "a": (3, 4)})) == {"a": [3, 4], "b": [1, 2]}
