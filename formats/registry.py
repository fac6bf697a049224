"""The format registry: one class per format (docs/FORMATS.md §2), registered by its ordinal, and the one table of
byte arithmetic that every reader, writer, resolver and planner uses. Nothing else computes sizes.

A format's weight tensor is ``O`` rows of ``ceil(I / block_elems) * block_bytes`` bytes (``BYTE_TABLE``); its
scale tensor is described by ``scale_shape``. Adding a format touches this file (and ``reference.py``/
``kernels/`` for its codec).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError, FormatError, ResolveError

ceil_div = ref.ceil_div

GROUP_SIZES: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_GROUP_SIZE = 64

# name -> (block_elems, block_bytes): bytes of one weight row = ceil(I / block_elems) * block_bytes.
BYTE_TABLE: dict[str, tuple[int, int]] = {
    "int8-row": (1, 1),
    "int4-row": (2, 1),
    "int2-row": (4, 1),
    "int4-grouped": (2, 1),
    "int3-g64": (64, 24),
    "e8-iq3-lattice": (256, 98),
    "mxfp4": (2, 1),  # I % 32 == 0, so this is exactly I / 2
    "fp8-e4m3-b128": (1, 1),
}


def row_nbytes(name: str, I: int) -> int:
    """Bytes of one weight row of format ``name`` with ``I`` inputs."""
    elems, nbytes = BYTE_TABLE[name]
    return ceil_div(I, elems) * nbytes


FORMATS: dict[int, type[Format]] = {}
_BY_NAME: dict[str, type[Format]] = {}


class Format:
    """A weight format. Subclasses set ``ord``/``name`` and are registered on definition."""

    ord: ClassVar[int]
    name: ClassVar[str]
    quantized: ClassVar[bool] = True  # False for float tensors kept as F32/BF16 (no scale tensor)
    scale_dtype: ClassVar[str] = "F32"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.ord in FORMATS:
            raise TypeError(f"format ordinal {cls.ord} registered twice")
        FORMATS[cls.ord] = cls
        _BY_NAME[cls.name] = cls

    @classmethod
    def weight_nbytes(cls, O: int, I: int, gs: int | None = None) -> int:
        return O * row_nbytes(cls.name, I)

    @classmethod
    def weight_shape(cls, O: int, I: int, gs: int | None = None) -> tuple[int, int]:
        """Shape the writer gives the U8 weight tensor: 2-D ``[O, row_bytes]``."""
        return (O, row_nbytes(cls.name, I))

    @classmethod
    def scale_shape(cls, O: int, I: int, gs: int | None = None) -> tuple[int, ...]:
        raise NotImplementedError

    @classmethod
    def scale_nbytes(cls, O: int, I: int, gs: int | None = None) -> int:
        return int(np.prod(cls.scale_shape(O, I, gs), dtype=np.int64)) * 4

    @classmethod
    def check_encodable(cls, O: int, I: int, *, name: str = "") -> None:
        """Raise EncodeError if this format cannot hold an ``[O, I]`` tensor."""

    @classmethod
    def encode(
        cls, w: np.ndarray, gs: int | None = None, *, name: str = "", fast: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encode float32 ``w[O, I]`` -> ``(codes uint8 [O, row_bytes], scales)``.

        ``fast`` selects the numba kernel (byte-identical to the numpy reference). NaN/inf input raises
        EncodeError naming the tensor."""
        w = _as_f32_matrix(w, name)
        cls.check_encodable(*w.shape, name=name)
        if fast:
            from colitools.formats import kernels

            return kernels.encode(cls.name, w, gs, name=name)
        _check_finite(w, name)
        return cls._encode_reference(w, gs)

    @classmethod
    def _encode_reference(cls, w: np.ndarray, gs: int | None) -> tuple[np.ndarray, np.ndarray]:
        raise EncodeError(f"format {cls.name} cannot be written by colitools")

    @classmethod
    def decode(cls, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None = None) -> np.ndarray:
        """Decode to float32 ``[O, I]`` (numpy reference)."""
        raise NotImplementedError

    @classmethod
    def bits_per_weight(cls, I: int = 4096, gs: int | None = None) -> float:
        """Bits per weight including scales, for a wide row."""
        O = 4096
        return 8 * (cls.weight_nbytes(O, I, gs) + cls.scale_nbytes(O, I, gs)) / (O * I)


def _as_f32_matrix(w: np.ndarray, name: str) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2:
        raise EncodeError(f"tensor {name or '?'}: expected a 2-D weight, got shape {list(w.shape)}")
    if w.dtype != np.float32:
        w = w.astype(np.float32)
    return np.ascontiguousarray(w)


def _check_finite(w: np.ndarray, name: str) -> None:
    bad = ~np.isfinite(w)
    if bad.any():
        o, i = (int(x) for x in np.argwhere(bad)[0])
        raise EncodeError(
            f"tensor {name or '?'}: non-finite value {w[o, i]} at [{o}, {i}] ({int(bad.sum())} non-finite in total)"
        )


class Float(Format):
    """Plain float tensor (F32, BF16 or F16), no scale tensor."""

    ord = 0
    name = "f32"
    quantized = False

    @classmethod
    def weight_nbytes(cls, O: int, I: int, gs: int | None = None) -> int:
        return O * I * 4

    @classmethod
    def weight_shape(cls, O: int, I: int, gs: int | None = None) -> tuple[int, int]:
        return (O, I)

    @classmethod
    def scale_shape(cls, O: int, I: int, gs: int | None = None) -> tuple[int, ...]:
        return (0,)

    @classmethod
    def scale_nbytes(cls, O: int, I: int, gs: int | None = None) -> int:
        return 0


class Int8Row(Format):
    ord = 1
    name = "int8-row"

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return (O,)

    @classmethod
    def _encode_reference(cls, w, gs):
        return ref.encode_int8_row(w)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int8_row(codes, scales, O, I)


class Int4Row(Format):
    ord = 2
    name = "int4-row"

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return (O,)

    @classmethod
    def _encode_reference(cls, w, gs):
        return ref.encode_int4_row(w)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int4_row(codes, scales, O, I)


class Int2Row(Format):
    ord = 3
    name = "int2-row"

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return (O,)

    @classmethod
    def _encode_reference(cls, w, gs):
        return ref.encode_int2_row(w)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int2_row(codes, scales, O, I)


class Int4Grouped(Format):
    ord = 4
    name = "int4-grouped"

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return (O, ceil_div(I, _require_gs(gs)))

    @classmethod
    def check_encodable(cls, O, I, *, name=""):
        pass

    @classmethod
    def encode(cls, w, gs=None, *, name="", fast=True):
        gs = _require_gs(gs)
        I = np.shape(w)[1] if np.ndim(w) == 2 else 0
        if writer_group_size(I, gs) != gs:
            raise EncodeError(
                f"tensor {name or '?'}: group size {gs} at I = {I} would not resolve back "
                f"(writer rule gives {writer_group_size(I, gs)}); use writer_group_size()"
            )
        return super().encode(w, gs, name=name, fast=fast)

    @classmethod
    def _encode_reference(cls, w, gs):
        return ref.encode_int4_grouped(w, gs)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int4_grouped(codes, scales, O, I, _require_gs(gs))

    @classmethod
    def bits_per_weight(cls, I=4096, gs=None):
        return super().bits_per_weight(I, gs or DEFAULT_GROUP_SIZE)


class Int3G64(Format):
    ord = 5
    name = "int3-g64"

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return (O, ceil_div(I, ref.INT3_GROUP))

    @classmethod
    def _encode_reference(cls, w, gs):
        return ref.encode_int3_g64(w)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int3_g64(codes, scales, O, I)


class E8Iq3Lattice(Format):
    """Recognised by the resolver only; colitools does not write or decode it yet."""

    ord = 6
    name = "e8-iq3-lattice"

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return (1,)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        raise FormatError("e8-iq3-lattice decoding is not implemented by colitools")


class Mxfp4(Format):
    """OCP MX FP4: ``<base>.weight_packed`` U8 ``[O, I/2]`` + ``<base>.weight_scale`` U8 E8M0 ``[O, I/32]``."""

    ord = 7
    name = "mxfp4"
    scale_dtype = "U8"

    @classmethod
    def weight_nbytes(cls, O, I, gs=None):
        return O * (I // 2)

    @classmethod
    def weight_shape(cls, O, I, gs=None):
        return (O, I // 2)

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return (O, I // ref.MXFP4_BLOCK)

    @classmethod
    def scale_nbytes(cls, O, I, gs=None):
        return O * (I // ref.MXFP4_BLOCK)  # E8M0 bytes, not F32

    @classmethod
    def check_encodable(cls, O, I, *, name=""):
        if I % ref.MXFP4_BLOCK:
            raise EncodeError(f"tensor {name or '?'}: mxfp4 needs I % 32 == 0, got I = {I}")

    @classmethod
    def _encode_reference(cls, w, gs):
        return ref.encode_mxfp4(w)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_mxfp4(codes, scales, O, I)


class Fp8E4m3B128(Format):
    """FP8 bytes passed through from a block-scaled source; ``.qs`` is the source ``weight_scale_inv``."""

    ord = 8
    name = "fp8-e4m3-b128"

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return (ceil_div(O, ref.FP8_BLOCK), ceil_div(I, ref.FP8_BLOCK))

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_fp8_b128(codes, scales, O, I)


def _require_gs(gs: int | None) -> int:
    if gs not in GROUP_SIZES:
        raise FormatError(f"group size {gs} is not one of {', '.join(map(str, GROUP_SIZES))}")
    return gs


def by_name(name: str) -> type[Format]:
    """The format class whose stamp string is ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise FormatError(f"unknown format {name!r} (known: {', '.join(sorted(_BY_NAME))})") from None


# ----------------------------------------------------------------------------- group-size arithmetic (§2.4)
def detect_group_size(O: int, I: int, scale_nbytes: int, *, tensor: str = "") -> int | None:
    """Reader rule: ``None`` for int4-row (one scale per row), else the finest candidate whose scale count
    matches. No match raises ResolveError naming the tensor and the byte counts."""
    if scale_nbytes == O * 4:
        return None
    for gs in GROUP_SIZES:
        if gs > I:
            break
        if scale_nbytes == O * ceil_div(I, gs) * 4:
            return gs
    raise ResolveError(
        f"tensor {tensor or '?'}: int4 scale bytes {scale_nbytes} match no group size for [{O}, {I}] "
        f"(candidates {', '.join(map(str, GROUP_SIZES))})"
    )


def writer_group_size(I: int, gs: int) -> int | None:
    """Writer rule: the group size to write for a requested ``gs`` so that detection is unambiguous.

    ``None`` means write int4-row (``I <= gs``: one group per row has int4-row's bytes and values)."""
    _require_gs(gs)
    if I <= gs:
        return None

    def detects_as(c: int) -> int | None:
        return detect_group_size(1, I, ceil_div(I, c) * 4)

    if detects_as(gs) == gs:
        return gs
    for c in sorted((c for c in GROUP_SIZES if c < gs), reverse=True):
        if detects_as(c) == c:
            return c
    raise AssertionError("unreachable: gs 16 always qualifies when I > 16")  # pragma: no cover


# --------------------------------------------------------------------------------- recipe format names (§6)
@dataclass(frozen=True)
class FormatChoice:
    """A format option value of the recipe: ``name`` as the user wrote it, the format class (None for
    ``bf16``/``fp8``, which are handled by the converter), and the requested group size for int4-g*."""

    option: str
    fmt: type[Format] | None
    gs: int | None = None

    @property
    def keeps_float(self) -> bool:
        return self.option in ("f32", "bf16")


RECIPE_FORMAT_NAMES = (
    "f32", "bf16", "int8-row", "int4-row", "int2-row",
    *(f"int4-g{g}" for g in GROUP_SIZES), "int3-g64", "mxfp4", "fp8",
)  # fmt: skip


def parse_format_option(option: str) -> FormatChoice:
    """Parse a recipe format name (``--experts int4-g64`` etc.), raising FormatError for unknown names."""
    m = re.fullmatch(r"int4-g(\d+)", option)
    if m and int(m.group(1)) in GROUP_SIZES:
        return FormatChoice(option, Int4Grouped, int(m.group(1)))
    simple = {
        "f32": Float, "bf16": Float, "int8-row": Int8Row, "int4-row": Int4Row, "int2-row": Int2Row,
        "int3-g64": Int3G64, "mxfp4": Mxfp4, "fp8": Fp8E4m3B128,
    }  # fmt: skip
    if option in simple:
        return FormatChoice(option, simple[option], None)
    raise FormatError(f"unknown format {option!r}; choose one of: {', '.join(RECIPE_FORMAT_NAMES)}")
