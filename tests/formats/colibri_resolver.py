"""A small, independent re-statement of how colibri's C engine decides a stored tensor's format.

Written from the facts of colibri's own code (public, ``JustVugg/colibri``), never from colitools' resolver:

* ``qt_resolve_fmt(name, O, I, nb, ns, &gs, stamped_name)`` in ``c/colibri.c`` -- the byte arithmetic:

  1. the E8/IQ3 branch first: ``ns == 4 and nb == O * ceil(I/256) * 98``. If the weight bytes are also
     ``O * I`` and either one f32 128x128 block (``nblk == 1``), four UE8M0 blocks (``nblk == 4``) or
     ``O == 1`` (int8's per-row ``ns == 4``) also fit, only a stamp naming ``e8-iq3-lattice``, or
     ``fp8-e4m3-b128`` in the single-f32-block case, or ``int8-row`` in the ``O == 1`` case settles it; anything
     else (no stamp included) is a refusal. Without such a co-candidate the branch returns fmt 6 whatever the
     stamp says (``qt_verify_fmt_stamp`` then refuses a stamp other than ``e8-iq3-lattice``);
  2. by weight bytes, int8 (``O*I``) > int4 (``O*ceil(I/2)``) > int2 (``O*ceil(I/4)``) > int3-g64
     (``O*ceil(I/64)*24``), else a refusal ("no int8/int4/int2/int3-g64/fp8 layout");
  3. int4 with ``detect_group_size`` (candidates 16, 32, 48, 64, 96, 128, 192, 256, finest first, stop at
     ``gs > I``, only when ``ns > 4*O``) is fmt 4 at that group size;
  4. for int8's weight bytes: ``is_row = ns == 4*O``, ``is_blk = ns == 4*nblk``, ``is_blk_ue8m0 = ns == nblk``
     (``nblk = ceil(O/128) * ceil(I/128)``). ``is_row and is_blk``: a stamp ``int8-row``/``fp8-e4m3-b128``
     decides, any other stamp is a refusal, no stamp is int8-row (the "INVERSION"). Else ``is_blk_ue8m0``: int8-row
     only with a stamp ``int8-row`` and ``is_row``; otherwise the refusal "fp8-e4m3-b128 with ue8m0 scales
     recognized but not implemented" (a stamp ``fp8-e4m3-b128`` cannot grant a decoder). Else ``is_blk`` alone is
     fmt 8;
  5. the scale bytes must be exactly ``4 *`` (``O*ceil(I/gs)`` for fmt 4, ``O*ceil(I/64)`` for fmt 5, ``nblk``
     for fmt 8, else ``O``), else a refusal.

* ``qt_verify_fmt_stamp(name, stamped, fmt)`` in ``c/colibri.c`` -- called right after ``qt_resolve_fmt`` by
  ``qt_from_disk`` (resident tensors): no stamp passes; a stamp naming a format of its ``FMT_NAMES`` table
  (``f32``, ``int8-row``, ``int4-row``, ``int2-row``, ``int4-grouped``, ``int3-g64``, ``e8-iq3-lattice``,
  ``fp8-e4m3-b128`` -> 0..6, 8) must equal the resolved format; an unknown name or a different format is a
  refusal. The routed-expert loader (``expert_load_impl``) passes no stamp and never verifies one.

* Scales are then read with ``st_read_f32_cap`` (``c/st.h``: F32, BF16 or F16 widened, at most the expected
  count) -- or, for fmt 8, ``st_read_scale_f32``, which also takes one-byte UE8M0 scales.

mxfp4 (ordinal 7) is no ``qt_resolve_fmt`` format: colibri's engines that read it find it by its tensor pair
(``weight_packed`` ``O*I/2`` bytes, ``weight_scale`` ``O*I/32`` bytes); ``resolve_mxfp4_pair`` states that.
"""

from __future__ import annotations

from dataclasses import dataclass

FMT_NAMES = {
    "f32": 0,
    "int8-row": 1,
    "int4-row": 2,
    "int2-row": 3,
    "int4-grouped": 4,
    "int3-g64": 5,
    "e8-iq3-lattice": 6,
    "fp8-e4m3-b128": 8,
}
GROUP_CANDIDATES = (16, 32, 48, 64, 96, 128, 192, 256)
FLOAT_SCALE_DTYPES = ("F32", "BF16", "F16")


class Refused(Exception):
    """colibri would stop (``exit(1)``) on this tensor; the message says which check refused it."""


@dataclass(frozen=True)
class ColibriFormat:
    fmt: int
    gs: int = 0  # 0 unless fmt == 4


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _detect_group_size(O: int, I: int, ns: int) -> int:
    if O <= 0 or ns <= O * 4 or I <= 0:
        return 0
    for gs in GROUP_CANDIDATES:
        if gs > I:
            break
        if ns == O * _ceil(I, gs) * 4:
            return gs
    return 0


def qt_resolve_fmt(O: int, I: int, nb: int, ns: int, stamp: str | None) -> ColibriFormat:
    """colibri's ``qt_resolve_fmt``: the format of a U8 weight with a ``.qs`` sidecar, or ``Refused``."""
    sf = FMT_NAMES.get(stamp, -1) if stamp is not None else -1
    nblk = _ceil(O, 128) * _ceil(I, 128)
    if ns == 4 and nb == O * _ceil(I, 256) * 98:  # E8/IQ3 (fmt 6), checked first
        f32_also = nb == O * I and nblk == 1
        ue8m0_also = nb == O * I and nblk == 4
        i8_also = nb == O * I and O == 1
        if f32_also or ue8m0_also or i8_also:
            if sf == 6:
                return ColibriFormat(6)
            if sf == 8 and f32_also:
                return ColibriFormat(8)
            if sf == 1 and i8_also:
                return ColibriFormat(1)
            raise Refused(f"[{O},{I}] matches E8/IQ3 and another layout; refusing rather than guessing")
        return ColibriFormat(6)
    if nb == O * I:
        fmt = 1
    elif nb == O * _ceil(I, 2):
        fmt = 2
    elif nb == O * _ceil(I, 4):
        fmt = 3
    elif nb == O * _ceil(I, 64) * 24:
        fmt = 5
    else:
        raise Refused(f"[{O},{I}]: {nb} weight bytes, no int8/int4/int2/int3-g64/fp8 layout")
    gs = 0
    if fmt == 2:
        gs = _detect_group_size(O, I, ns)
        if gs:
            fmt = 4
    if fmt == 1:
        is_row, is_blk, is_ue8m0 = ns == 4 * O, ns == 4 * nblk, ns == nblk
        if is_row and is_blk:
            if sf in (1, 8):
                fmt = sf
            elif stamp is not None:
                raise Refused(f"[{O},{I}]: int8/fp8 scale collision, stamp {stamp!r} resolves neither")
        elif is_ue8m0:
            if not (sf == 1 and is_row):
                raise Refused(f"[{O},{I}]: fp8-e4m3-b128 with ue8m0 scales recognized but not implemented")
        elif is_blk:
            fmt = 8
    expected = {4: O * _ceil(I, gs or 1), 5: O * _ceil(I, 64), 8: nblk}.get(fmt, O)
    if ns != expected * 4:
        raise Refused(f"[{O},{I}] fmt={fmt}: scale array is {ns} bytes, expected {expected * 4}")
    return ColibriFormat(fmt, gs)


def qt_verify_fmt_stamp(stamp: str | None, fmt: int) -> None:
    """colibri's ``qt_verify_fmt_stamp``: a present stamp must name the resolved format."""
    if stamp is None:
        return
    if FMT_NAMES.get(stamp, -1) != fmt:
        raise Refused(f"stamp {stamp!r} but byte arithmetic says fmt={fmt}")


def load(
    O: int, I: int, nb: int, ns: int, *, scale_dtype: str = "F32", stamp: str | None = None, routed: bool
) -> ColibriFormat:
    """What colibri makes of one stored ``<name>`` + ``<name>.qs`` pair, as ``qt_from_disk`` (resident,
    ``routed=False``: stamp resolved and verified) or the routed-expert loader (``routed=True``: no stamp is
    consulted) would; ``Refused`` where it stops."""
    used = None if routed else stamp
    got = qt_resolve_fmt(O, I, nb, ns, used)
    if not routed:
        qt_verify_fmt_stamp(used, got.fmt)
    ok_dtypes = FLOAT_SCALE_DTYPES + (("U8", "F8_E8M0") if got.fmt == 8 else ())
    if scale_dtype not in ok_dtypes:
        raise Refused(f"scale dtype {scale_dtype} is not read for fmt={got.fmt}")
    return got


def resolve_mxfp4_pair(O: int, I: int, packed_nbytes: int, scale_nbytes: int) -> ColibriFormat:
    """An mxfp4 pair as colibri's MXFP4 readers take it (``I % 32 == 0``, ``O*I/2`` + ``O*I/32`` bytes)."""
    if I % 32 or packed_nbytes != O * I // 2 or scale_nbytes != O * I // 32:
        raise Refused(f"[{O},{I}]: not an mxfp4 pair ({packed_nbytes}, {scale_nbytes} bytes)")
    return ColibriFormat(7)
