"""colibri reads everything colitools writes (issue 10, "Must show" 1).

Every tensor colitools' recipe would write -- the real ``choose_target`` (fallbacks, stamps) for a resident and
a routed-expert role, over every format colitools writes -- is given to an independent re-statement of colibri's
own decision procedure (``tests/formats/colibri_resolver.py``: ``qt_resolve_fmt`` / ``qt_verify_fmt_stamp`` of
colibri's ``c/colibri.c``), which must neither refuse it nor resolve it to another format or group size.
"""

from __future__ import annotations

import colibri_resolver as colibri
import pytest

from colitools.converters.recipe import Role, SourceKind, choose_target
from colitools.formats.registry import Fp8E4m3B128, Int4Row, Int8Row, by_name

O_RANGE = range(1, 301)
SPECIAL_WIDTHS = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 24, 31, 33, 47, 48, 49, 63, 65, 95, 96, 97, 98, 99, 100, 127,
                  129, 143, 144, 145, 195, 196, 197, 255, 257, 383, 385, 389, 390, 391, 392, 393, 400, 511, 513,
                  587, 588, 769, 783, 784, 897, 1023}  # fmt: skip
PRIMES = {2, 3, 5, 7, 11, 13, 101, 211, 307, 401, 503, 601, 709, 809, 907, 1021}
I_SET = sorted(SPECIAL_WIDTHS | PRIMES | set(range(32, 1025, 32)))
# Every width at which two signatures can meet for some O (int3 vs row formats, fmt 6, the UE8M0 rule-7 band
# [1, 385..512], [2, 897..1024], int4-row I <= 1 / int2-row I <= 2) is in I_CORE; it runs against all O in
# 1..300. The full I_SET runs against the O where block-scale counts can equal O or 4*O (O <= 8 for I <= 1024)
# and the block edges.
I_CORE = sorted({1, 2, 3, 24, 47, 48, 64, 95, 96, 98, 128, 143, 144, 195, 196, 385, 389, 390, 391, 392, 512,
                 587, 897, 1021, 1024})  # fmt: skip
O_EDGE = sorted(set(range(1, 17)) | {63, 64, 65, 127, 128, 129, 255, 256, 257, 300})
OPTIONS = (
    ["int8-row", "int4-row", "int2-row", "int3-g64", "mxfp4", "fp8"]
    + [f"int4-g{gs}" for gs in (16, 32, 48, 64, 96, 128, 192, 256)]
)  # fmt: skip
F32_SOURCE = SourceKind("F32")
FP8_SOURCE = SourceKind("F8_E4M3", (128, 128))
NAMES = {
    Role.DENSE: "model.layers.0.self_attn.o_proj.weight",
    Role.EXPERT: "model.layers.0.mlp.experts.0.up_proj.weight",
}


def _colibri_reads(target, O: int, I: int, routed: bool) -> colibri.ColibriFormat:
    fmt = by_name(target.fmt)
    if fmt.name == "mxfp4":
        return colibri.resolve_mxfp4_pair(O, I, fmt.weight_nbytes(O, I), fmt.scale_nbytes(O, I))
    nb, ns = fmt.weight_nbytes(O, I, target.gs), fmt.scale_nbytes(O, I, target.gs)
    return colibri.load(O, I, nb, ns, scale_dtype=fmt.scale_dtype, stamp=target.stamp, routed=routed)


def _grid():
    """(O, I) pairs of the grid, deterministic: all O x I_CORE, O_EDGE x I_SET."""
    pairs = {(O, I) for O in O_RANGE for I in I_CORE} | {(O, I) for O in O_EDGE for I in I_SET}
    return sorted(pairs)


def _grid_failures(options=OPTIONS):
    cases, failures = 0, []
    pairs = _grid()
    for option in options:
        source = FP8_SOURCE if option == "fp8" else F32_SOURCE
        for role in (Role.DENSE, Role.EXPERT):
            routed = role is Role.EXPERT
            for O, I in pairs:
                target = choose_target(NAMES[role], role, option, O, I, source)
                cases += 1
                if target.is_float:
                    continue  # a plain float tensor: no .qs, colibri reads it as floats
                if routed and target.stamp is not None:
                    failures.append((option, role.value, O, I, target.label, "routed expert stamped"))
                    continue
                want = colibri.ColibriFormat(by_name(target.fmt).ord, target.gs or 0)
                try:
                    got = _colibri_reads(target, O, I, routed)
                except colibri.Refused as exc:
                    failures.append((option, role.value, O, I, target.label, f"refused: {exc}"))
                    continue
                if got != want:
                    failures.append((option, role.value, O, I, target.label, f"colibri reads {got}"))
    return cases, failures


def test_grid_covers_the_special_widths():
    for I in (24, 47, 48, 95, 96, 98, 143, 144, 195, 196, 389, 390, 391, 392, 128, 1024, 1021):
        assert I in I_SET
    assert set(I_CORE) <= set(I_SET)
    assert len(_grid()) * len(OPTIONS) * 2 > 200_000


@pytest.mark.slow
def test_colibri_neither_refuses_nor_misreads_anything_colitools_writes():
    cases, failures = _grid_failures()
    shown = "\n".join(map(str, failures[:20]))
    assert not failures, f"{len(failures)} of {cases} written tensors misread or refused by colibri:\n{shown}"


@pytest.mark.parametrize(
    ("option", "role", "O", "I", "written", "stamp"),
    [
        # §3 rule 7: ceil(O/128)*ceil(I/128) == 4*O -- colibri's UE8M0-FP8 signature.
        ("int8-row", Role.DENSE, 8, 4096, "int8-row", "int8-row"),
        ("int8-row", Role.DENSE, 1, 512, "int8-row", "int8-row"),
        ("int8-row", Role.EXPERT, 1, 512, "f32", None),
        ("int8-row", Role.EXPERT, 8, 4096, "f32", None),
        # int4-row at O == 1 with fmt 6's byte counts: colibri's e8 branch refuses an int4-row stamp.
        ("int4-row", Role.DENSE, 1, 195, "int8-row", None),
        ("int4-row", Role.DENSE, 1, 392, "int8-row", "int8-row"),  # and its int8-row bytes meet rule 7
        ("int4-row", Role.EXPERT, 1, 392, "f32", None),
        ("int4-g256", Role.DENSE, 1, 196, "int8-row", None),  # I <= gs: int4-row, then the same fallback
        ("int4-row", Role.EXPERT, 1, 196, "int8-row", None),
        ("int4-row", Role.DENSE, 2, 196, "int4-row", None),  # O > 1: no collision
        # int8-row / fp8 at I == 98 (fmt 6's signature) keep their stamps; routed experts go to F32.
        ("int8-row", Role.DENSE, 1, 98, "int8-row", "int8-row"),
        ("int8-row", Role.EXPERT, 1, 98, "f32", None),
        ("fp8", Role.DENSE, 64, 98, "fp8-e4m3-b128", "fp8-e4m3-b128"),
        ("fp8", Role.EXPERT, 64, 98, "int8-row", None),
    ],
)
def test_choice_at_colibri_collisions(option, role, O, I, written, stamp):
    source = FP8_SOURCE if option == "fp8" else F32_SOURCE
    target = choose_target(NAMES[role], role, option, O, I, source)
    assert (target.label, target.stamp) == (written, stamp)
    assert (target.fallback is not None) == (written != option.replace("fp8", "fp8-e4m3-b128"))
    if not target.is_float:
        got = _colibri_reads(target, O, I, role is Role.EXPERT)
        assert got.fmt == by_name(target.fmt).ord


def test_int2_row_never_has_fmt6_byte_counts():
    """O*ceil(I/4) == O*ceil(I/256)*98 has no solution (ceil(I/4) <= 64*ceil(I/256) < 98*ceil(I/256)), so the
    spec's int2-row O == 1 fallback never triggers; checked here over every width up to 1 << 14."""
    assert not [I for I in range(1, 1 << 14) if -(-I // 4) == -(-I // 256) * 98]
    assert [I for I in range(1, 1024) if -(-I // 2) == -(-I // 256) * 98] == [
        195,
        196,
        391,
        392,
        587,
        588,
        783,
        784,
    ]


def test_oracle_refusals_match_colibri_messages():
    """The oracle's refusals at the collisions it exists for (not colitools' code: colibri's)."""
    with pytest.raises(colibri.Refused, match="ue8m0 scales recognized but not implemented"):
        colibri.load(1, 512, 512, 4, routed=False)  # unstamped int8-row [1, 512]
    assert colibri.load(1, 512, 512, 4, stamp="int8-row", routed=False) == colibri.ColibriFormat(1)
    with pytest.raises(colibri.Refused, match="ue8m0"):
        colibri.load(1, 512, 512, 4, stamp="fp8-e4m3-b128", routed=False)
    with pytest.raises(colibri.Refused, match="stamp 'int4-row'"):
        colibri.load(1, 195, Int4Row.weight_nbytes(1, 195), 4, stamp="int4-row", routed=False)
    assert colibri.load(1, 195, 98, 4, routed=True) == colibri.ColibriFormat(6)  # misread, unstamped
    with pytest.raises(colibri.Refused, match="E8/IQ3"):
        colibri.load(1, 98, 98, 4, routed=False)
    assert colibri.load(256, 16384, 256 * 16384, 1024, routed=False) == colibri.ColibriFormat(1)
    nblk = 2 * 128
    assert colibri.load(256, 16384, 256 * 16384, 4 * nblk, stamp="fp8-e4m3-b128", routed=False).fmt == 8
    assert colibri.load(300, 300, 300 * 300, Fp8E4m3B128.scale_nbytes(300, 300), routed=False).fmt == 8
    assert colibri.load(4, 8, Int8Row.weight_nbytes(4, 8), 16, routed=False).fmt == 1
    assert colibri.load(4, 200, 4 * 100, 4 * 4 * 4, routed=False) == colibri.ColibriFormat(4, 64)
