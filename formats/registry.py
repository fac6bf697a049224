"""The format registry: one class per format (docs/FORMATS.md §2), registered by its ordinal, and the one table of
byte arithmetic that every reader, writer, resolver, planner, kernel driver and the runtime use. Nothing else
computes sizes.

A format's weight tensor is ``O`` rows of ``ceil(I / block_elems) * block_bytes`` bytes (``BYTE_TABLE``); its
scale tensor is described by ``scale_shape``. Each class also owns the facts other modules dispatch on:

* ``tensor_names(name)``: the weight and scale tensor names (``<name>`` + ``<name>.qs``, or mxfp4's
  ``<base>.weight_packed`` + ``<base>.weight_scale``);
* ``planar_eligible(I, gs)``: whether the planar64-v8 expert layout can hold it;
* ``kernel_code`` / ``writable``: the format code of the numba codecs (``kernels/``; None: encoded by its
  numpy reference on every path, a kernel is only speed), and whether colitools encodes it;
  ``_encode_reference`` / ``decode``: the numpy reference codec;
* ``byte_rank``: its place in colibri's byte precedence (FORMATS §3), which the resolver follows (``ranked``);
* ``matmul_kind`` / ``matmul_kind_of(planar)``: the runtime's matvec kernel (``runtime/kernels.py``);
  ``rowwise_scales``: a row's values need only that row's scales (the runtime's embedding lookup).

Adding a format touches this file (its class, its ``BYTE_TABLE`` row) and ``reference.py`` (its numpy codec);
``kernels/`` only for speed (docs/INTERNALS.md "How to add", proven by ``tests/formats/test_toy_format.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

import ml_dtypes
import numpy as np

from colitools.formats import affine, quantizers
from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError, FormatError, ResolveError, ResolveReason
from colitools.formats.format_names import (
    AFFINE_GROUP_SIZES,
    DEFAULT_GROUP_SIZE,
    GROUP_SIZES,
    NATIVE_OPTION,
    OPTION_FORMATS,
    RECIPE_FORMAT_NAMES,
    format_label,
    option_group_size,
    option_names,
)
from colitools.formats.planar import PLANAR_BLOCK
from colitools.formats.quantizers import RTN

ceil_div = ref.ceil_div

# GROUP_SIZES, DEFAULT_GROUP_SIZE, RECIPE_FORMAT_NAMES: the names users type, in format_names.py (numpy-free).

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
    "fp8-e4m3-e8m0": (1, 1),
    "fp8-e4m3-e8m0-t32": (1, 1),
    "fp8-e4m3-e8m0-r32": (1, 1),
}


def row_nbytes(name: str, I: int) -> int:
    """Bytes of one weight row of format ``name`` with ``I`` inputs."""
    elems, nbytes = BYTE_TABLE[name]
    return ceil_div(I, elems) * nbytes


# Tensor names (docs/FORMATS.md §2): the ``.qs`` family keeps the source name and adds a ``.qs`` scale; mxfp4
# uses the compressed-tensors pair on the source name without its trailing ``.weight``.
QS_SUFFIX = ".qs"
WEIGHT_SUFFIX = ".weight"
PACKED_SUFFIX = ".weight_packed"
MX_SCALE_SUFFIX = ".weight_scale"
BLOCK_SCALE_SUFFIX = ".scale"  # DeepSeek-V4's released spelling: ``<base>.weight`` + ``<base>.scale`` (E8M0)


class MatmulKind(StrEnum):
    """The runtime's matvec kernels (``colitools/runtime/kernels.py``); a format names its kind."""

    F32 = "f32"
    INT8_ROW = "int8-row"
    INT4 = "int4"  # int4-row and int4-grouped, pairs order
    INT4_PLANAR = "int4-planar"  # the same codes in planar64-v8 order
    INT3_G64 = "int3-g64"
    MXFP4 = "mxfp4"
    FP8_B128 = "fp8-e4m3-b128"
    INT2_ROW = "int2-row"


def _weight_base(name: str) -> str:
    """``name`` without its ``.weight`` suffix: the stem the formats with their own tensor names build on."""
    return name[: -len(WEIGHT_SUFFIX)] if name.endswith(WEIGHT_SUFFIX) else name


def block_grid(O: int, I: int, br: int, bc: int) -> tuple[int, int]:
    """The ``[ceil(O/br), ceil(I/bc)]`` grid of block scales (FP8 sources and fp8-e4m3-b128)."""
    return (ceil_div(O, br), ceil_div(I, bc))


FORMATS: dict[int, type[Format]] = {}
_BY_NAME: dict[str, type[Format]] = {}


@dataclass(frozen=True)
class _FastCodecs:
    encode: Callable[..., tuple[np.ndarray, np.ndarray]]  # kernels.encode(fmt_name, w, gs, name=, quantizer=)
    encode_fp8_e8m0: Callable[[np.ndarray, str], tuple[np.ndarray, np.ndarray]]


# The fast codecs (``kernels/``) import this module, so they hand their entry points in when they are imported
# (``set_fast_codecs``) instead of being imported from here. Until then ``Format.encode(fast=True)`` encodes by
# the numpy reference, the same bytes (a kernel is only speed); the converter imports the kernels.
_fast: _FastCodecs | None = None


def set_fast_codecs(encode: Callable, encode_fp8_e8m0: Callable) -> None:
    """The kernels' ``encode`` and ``encode_fp8_e8m0``, which ``Format.encode(fast=True)`` calls
    (``kernels/_dispatch.py`` hands them in when it is imported)."""
    global _fast
    _fast = _FastCodecs(encode, encode_fp8_e8m0)


class Format:
    """A weight format. Subclasses set ``ord``/``name`` and are registered on definition."""

    ord: ClassVar[int]
    name: ClassVar[str]
    quantized: ClassVar[bool] = True  # False for float tensors kept as F32/BF16 (no scale tensor)
    weight_dtype: ClassVar[str] = "U8"  # safetensors dtype of the weight (codes) tensor
    scale_dtype: ClassVar[str] = "F32"  # safetensors dtype of the scale tensor
    scale_numpy: ClassVar[type] = np.float32  # its numpy dtype
    grouped: ClassVar[bool] = False  # takes a group size (int4-grouped)
    kernel_code: ClassVar[int | None] = None  # format code inside the numba codecs (kernels/); None: none
    writable: ClassVar[bool] = False  # colitools' encoders write it (else: passthrough / read only)
    matmul_kind: ClassVar[MatmulKind | None] = None  # the runtime's kernel for it (None: no runtime kernel)
    planar_matmul_kind: ClassVar[MatmulKind | None] = None  # the same in the planar64-v8 layout
    rowwise_scales: ClassVar[bool] = False  # row o's values need only row o of the scales
    row_align: ClassVar[int] = 1  # rows a parallel kernel must keep together (scale blocks)
    read_only: ClassVar[bool] = False  # recognised by the resolver, never written by colitools
    # Its place in colibri's byte precedence (FORMATS §3) among the formats read from the same tensor pair
    # (``ranked``), ``(weight rank, scale rank)``; None: not told apart by byte counts (f32; mxfp4's pair is its
    # own). A reader takes the lowest weight rank whose weight byte count matches (int8 10 > int4 20 > int2 30 >
    # int3 40), then the first format of that rank, in scale-rank order, whose scale bytes match (int8-row before
    # fp8-e4m3-b128; int4-row before int4-grouped at a detected group size; the UE8M0 grids). Weight rank
    # ``RANK_SIGNATURE_FIRST`` (0) is matched on both counts before any other (e8-iq3-lattice's ``ns == 4``).
    byte_rank: ClassVar[tuple[int, int] | None] = None
    # a symmetric integer format whose scales a quantizer chooses (FORMATS §11): ``--quantizer mse`` applies
    mse_scales: ClassVar[bool] = False
    # written in a ``.qs`` (or its target's) pair: False for a format only a container naming its tensors holds
    # (the affine formats in QPACK, FORMATS §2.12: as a pair their bytes would resolve as int4-grouped)
    pairs: ClassVar[bool] = True
    # ``colitools formats``: byte formulas as text (tests evaluate them against the arithmetic above) and the
    # scale tensor's name and dtype.
    weight_formula: ClassVar[str]
    scale_formula: ClassVar[str]
    scale_tensor_label: ClassVar[str] = "<name>.qs F32"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.ord in FORMATS:
            raise TypeError(f"format ordinal {cls.ord} registered twice")
        FORMATS[cls.ord] = cls
        _BY_NAME[cls.name] = cls

    @classmethod
    def label(cls, gs: int | None = None, dtype: str | None = None) -> str:
        """The user-facing name (``format_names.format_label``): ``int4-g64``, ``bf16`` for a BF16 float, ``fp8``."""
        return format_label(cls.name, gs, dtype)

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The recipe options that write this format (``f32``/``bf16``, ``int4-g16`` .. ``int4-g256``, ...)."""
        return option_names(cls.name)

    @classmethod
    def tensor_names(cls, name: str) -> tuple[str, str | None]:
        """``(weight tensor name, scale tensor name or None)`` of a weight stored under ``name``."""
        return name, name + QS_SUFFIX

    @classmethod
    def planar_eligible(cls, I: int, gs: int | None = None) -> bool:
        """Whether the planar64-v8 expert layout can hold this format with ``I`` inputs (docs/FORMATS.md §4)."""
        return False

    @classmethod
    def matmul_kind_of(cls, planar: bool = False) -> MatmulKind | None:
        """The runtime kernel for this format stored in the pairs (or the planar64-v8) layout."""
        return cls.planar_matmul_kind if planar else cls.matmul_kind

    @classmethod
    def weight_nbytes(cls, O: int, I: int, gs: int | None = None) -> int:
        return O * row_nbytes(cls.name, I)

    @classmethod
    def weight_shape(cls, O: int, I: int, gs: int | None = None) -> tuple[int, int]:
        """Shape the writer gives the U8 weight tensor: 2-D ``[O, row_bytes]``."""
        return (O, row_nbytes(cls.name, I))

    @classmethod
    def scale_grid(cls, O: int, I: int, gs: int | None = None) -> tuple[int, ...]:
        """Shape of the scale tensor, without checking ``gs`` (the kernels take any positive group size)."""
        raise NotImplementedError

    @classmethod
    def scale_shape(cls, O: int, I: int, gs: int | None = None) -> tuple[int, ...]:
        """Shape of the scale tensor for ``[O, I]`` (``gs`` checked against ``GROUP_SIZES`` if it has one)."""
        return cls.scale_grid(O, I, gs)

    @classmethod
    def scale_nbytes(cls, O: int, I: int, gs: int | None = None) -> int:
        itemsize = np.dtype(cls.scale_numpy).itemsize
        return int(np.prod(cls.scale_shape(O, I, gs), dtype=np.int64)) * itemsize

    @classmethod
    def check_encodable(cls, O: int, I: int, *, name: str = "") -> None:
        """Raise EncodeError if this format cannot hold an ``[O, I]`` tensor."""

    @classmethod
    def encode(
        cls, w: np.ndarray, gs: int | None = None, *, name: str = "", fast: bool = True, quantizer: str = RTN
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encode float32 ``w[O, I]`` -> ``(codes uint8 [O, row_bytes], scales)``.

        ``fast`` selects the numba kernel (byte-identical to the numpy reference) once the kernels are loaded
        (``set_fast_codecs``). ``quantizer`` is an encoder mode of ``quantizers.MODES`` (``rtn``, ``mse``,
        ``mse-positive``; FORMATS §11), ignored by a format without ``mse_scales``. NaN/inf input raises EncodeError naming the tensor."""
        fast = fast and _fast is not None
        w = _as_f32_matrix(w, name, keep_16bit=fast)
        cls.check_encodable(*w.shape, name=name)
        quantizer = cls.quantizer_mode(quantizer)
        if fast:
            return _fast.encode(cls.name, w, gs, name=name, quantizer=quantizer)
        _check_finite(w, name)
        return cls._encode_reference(w, gs, quantizer)

    @classmethod
    def quantizer_mode(cls, quantizer: str) -> str:
        """The encoder mode this format applies for ``quantizer``: ``rtn`` unless it has ``mse_scales``."""
        quantizers.signed(quantizer)  # a known mode, else ValueError
        return quantizer if cls.mse_scales else RTN

    @classmethod
    def _encode_reference(
        cls, w: np.ndarray, gs: int | None, quantizer: str = RTN, search=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The numpy reference encoder (``search``: the kernels' mse group search, numpy's when None)."""
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


def _as_f32_matrix(w: np.ndarray, name: str, keep_16bit: bool = False) -> np.ndarray:
    """``w`` as a C-contiguous float32 matrix; BF16 and F16 values kept as they are for the kernels
    (``keep_16bit``), which read their bits (an exact upcast, no float32 copy of the tensor)."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise EncodeError(f"tensor {name or '?'}: expected a 2-D weight, got shape {list(w.shape)}")
    if keep_16bit and w.dtype in _KERNEL_16BIT:
        return np.ascontiguousarray(w)
    if w.dtype != np.float32:
        w = w.astype(np.float32)
    return np.ascontiguousarray(w)


_KERNEL_16BIT = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


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
    weight_formula = "O * I * itemsize (F32 4, BF16/F16 2)"
    scale_formula = "none"
    scale_tensor_label = "-"
    quantized = False
    matmul_kind = MatmulKind.F32

    @classmethod
    def tensor_names(cls, name):
        return name, None

    @classmethod
    def weight_nbytes(cls, O: int, I: int, gs: int | None = None) -> int:
        return O * I * 4

    @classmethod
    def weight_shape(cls, O: int, I: int, gs: int | None = None) -> tuple[int, int]:
        return (O, I)

    @classmethod
    def scale_grid(cls, O: int, I: int, gs: int | None = None) -> tuple[int, ...]:
        return (0,)

    @classmethod
    def scale_nbytes(cls, O: int, I: int, gs: int | None = None) -> int:
        return 0


class Int8Row(Format):
    ord = 1
    name = "int8-row"
    byte_rank = (10, 0)
    mse_scales = True
    weight_formula = "O * I"
    scale_formula = "O * 4"
    kernel_code = 0
    writable = True
    matmul_kind = MatmulKind.INT8_ROW
    rowwise_scales = True

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return (O,)

    @classmethod
    def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
        return ref.encode_int8_row(w, quantizer, search)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int8_row(codes, scales, O, I)


class Int4Row(Format):
    ord = 2
    name = "int4-row"
    byte_rank = (20, 0)
    mse_scales = True
    weight_formula = "O * ceil(I/2)"
    scale_formula = "O * 4"
    kernel_code = 1
    writable = True
    matmul_kind = MatmulKind.INT4
    planar_matmul_kind = MatmulKind.INT4_PLANAR
    rowwise_scales = True

    @classmethod
    def planar_eligible(cls, I, gs=None):
        return I % PLANAR_BLOCK == 0

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return (O,)

    @classmethod
    def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
        return ref.encode_int4_row(w, quantizer, search)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int4_row(codes, scales, O, I)


class Int2Row(Format):
    ord = 3
    name = "int2-row"
    byte_rank = (30, 0)
    mse_scales = True
    weight_formula = "O * ceil(I/4)"
    scale_formula = "O * 4"
    kernel_code = 2
    writable = True
    matmul_kind = MatmulKind.INT2_ROW
    rowwise_scales = True

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return (O,)

    @classmethod
    def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
        return ref.encode_int2_row(w, quantizer, search)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int2_row(codes, scales, O, I)


class Int4Grouped(Format):
    ord = 4
    name = "int4-grouped"
    byte_rank = (20, 1)  # int4's bytes with more than one scale per row (a detected group size)
    mse_scales = True
    weight_formula = "O * ceil(I/2)"
    scale_formula = "O * ceil(I/gs) * 4"
    grouped = True
    kernel_code = 3
    writable = True
    matmul_kind = MatmulKind.INT4
    planar_matmul_kind = MatmulKind.INT4_PLANAR
    rowwise_scales = True

    @classmethod
    def planar_eligible(cls, I, gs=None):
        return gs == PLANAR_BLOCK and I % PLANAR_BLOCK == 0

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return (O, ceil_div(I, gs))

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        return cls.scale_grid(O, I, _require_gs(gs))

    @classmethod
    def check_encodable(cls, O, I, *, name=""):
        pass

    @classmethod
    def encode(cls, w, gs=None, *, name="", fast=True, quantizer=RTN):
        gs = _require_gs(gs)
        I = np.shape(w)[1] if np.ndim(w) == 2 else 0
        if writer_group_size(I, gs) != gs:
            raise EncodeError(
                f"tensor {name or '?'}: group size {gs} at I = {I} would not resolve back "
                f"(writer rule gives {writer_group_size(I, gs)}); use writer_group_size()"
            )
        return super().encode(w, gs, name=name, fast=fast, quantizer=quantizer)

    @classmethod
    def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
        return ref.encode_int4_grouped(w, gs, quantizer, search)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int4_grouped(codes, scales, O, I, _require_gs(gs))

    @classmethod
    def bits_per_weight(cls, I=4096, gs=None):
        return super().bits_per_weight(I, gs or DEFAULT_GROUP_SIZE)


class Int3G64(Format):
    ord = 5
    name = "int3-g64"
    byte_rank = (40, 0)
    mse_scales = True
    weight_formula = "O * ceil(I/64) * 24"
    scale_formula = "O * ceil(I/64) * 4"
    kernel_code = 4
    writable = True
    matmul_kind = MatmulKind.INT3_G64
    rowwise_scales = True

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return (O, ceil_div(I, ref.INT3_GROUP))

    @classmethod
    def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
        return ref.encode_int3_g64(w, quantizer, search)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_int3_g64(codes, scales, O, I)


class E8Iq3Lattice(Format):
    """Recognised by the resolver only; colitools does not write or decode it yet."""

    ord = 6
    name = "e8-iq3-lattice"
    byte_rank = (0, 0)  # RANK_SIGNATURE_FIRST: its one 4-byte scale is checked before any weight precedence
    weight_formula = "O * ceil(I/256) * 98"
    scale_formula = "4"
    read_only = True

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return (1,)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        raise FormatError("e8-iq3-lattice decoding is not implemented by colitools")


class Mxfp4(Format):
    """OCP MX FP4: ``<base>.weight_packed`` U8 ``[O, I/2]`` + ``<base>.weight_scale`` U8 E8M0 ``[O, I/32]``."""

    ord = 7
    name = "mxfp4"
    weight_formula = "O * I/2"
    scale_formula = "O * I/32"
    scale_tensor_label = "<base>.weight_scale U8 (E8M0)"
    scale_dtype = "U8"  # E8M0 bytes, not F32
    scale_numpy = np.uint8
    kernel_code = 5
    writable = True
    matmul_kind = MatmulKind.MXFP4
    rowwise_scales = True

    @classmethod
    def tensor_names(cls, name):
        base = _weight_base(name)
        return base + PACKED_SUFFIX, base + MX_SCALE_SUFFIX

    @classmethod
    def weight_nbytes(cls, O, I, gs=None):
        return O * (I // 2)

    @classmethod
    def weight_shape(cls, O, I, gs=None):
        return (O, I // 2)

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return (O, I // ref.MXFP4_BLOCK)

    @classmethod
    def check_encodable(cls, O, I, *, name=""):
        if I % ref.MXFP4_BLOCK:
            raise EncodeError.about(
                name or "?", f"mxfp4 needs I % 32 == 0, got I = {I}", ResolveReason.NOT_ENCODABLE
            )

    @classmethod
    def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
        return ref.encode_mxfp4(w)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_mxfp4(codes, scales, O, I)


class Fp8E4m3B128(Format):
    """FP8 bytes passed through from a block-scaled source; ``.qs`` is the source ``weight_scale_inv``."""

    ord = 8
    name = "fp8-e4m3-b128"
    byte_rank = (10, 1)  # int8's bytes; int8-row first where both scale counts match (O == nblk)
    weight_formula = "O * I"
    scale_formula = "ceil(O/128) * ceil(I/128) * 4"
    kernel_code = 6  # decoders only: written by passthrough, never encoded
    matmul_kind = MatmulKind.FP8_B128
    block: ClassVar[tuple[int, int]] = (ref.FP8_BLOCK, ref.FP8_BLOCK)
    row_align = ref.FP8_BLOCK

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return block_grid(O, I, *cls.block)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_fp8_b128(codes, scales, O, I)


class Fp8E4m3E8m0(Format):
    """FP8 e4m3fn codes with one E8M0 power-of-two scale per 128x128 block, as DeepSeek-V4 releases its dense
    projections and ``c/deepseek_v4.c`` (``coli_tensor_load_fp8``, ``coli_v4_layer_validate``) reads them:
    ``<base>.weight`` F8_E4M3 ``[O, I]`` + ``<base>.scale`` F8_E8M0 ``[ceil(O/128), ceil(I/128)]``,
    ``w = e4m3(code) * 2^(byte - 127)`` (docs/FORMATS.md §2.9). ``fast`` encodes with its own block kernel
    (``kernels.encode_fp8_e8m0``, byte-identical to the reference; no ``kernel_code``: the row codecs do not
    know it); the runtime runs it on the fp8 block kernel with the scales as float32 (exact)."""

    ord = 9
    name = "fp8-e4m3-e8m0"
    byte_rank = (10, 0)  # among the <base>.scale F8_E8M0 pairs: first where two grids coincide
    weight_formula = "O * I"
    scale_formula = "ceil(O/128) * ceil(I/128)"
    scale_tensor_label = "<base>.scale F8_E8M0"
    weight_dtype = "F8_E4M3"
    scale_dtype = "F8_E8M0"
    scale_numpy = np.uint8
    writable = True
    matmul_kind = MatmulKind.FP8_B128
    block: ClassVar[tuple[int, int]] = (ref.FP8_BLOCK, ref.FP8_BLOCK)
    row_align = ref.FP8_BLOCK

    @classmethod
    def tensor_names(cls, name):
        base = _weight_base(name)
        return base + WEIGHT_SUFFIX, base + BLOCK_SCALE_SUFFIX

    @classmethod
    def weight_shape(cls, O, I, gs=None):
        return (O, I)

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return block_grid(O, I, *cls.block)

    @classmethod
    def encode(cls, w, gs=None, *, name="", fast=True, quantizer=RTN):
        w = _as_f32_matrix(w, name)
        if fast and _fast is not None:  # its own kernel (kernels.encode_fp8_e8m0), not the row codecs' kernel_code
            return _fast.encode_fp8_e8m0(w, name)
        _check_finite(w, name)
        return cls._encode_reference(w, gs)

    @classmethod
    def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
        return ref.encode_fp8_e8m0(w, cls.block)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return ref.decode_fp8_e8m0(codes, scales, O, I, cls.block)

    @classmethod
    def kernel_scales(cls, scales: np.ndarray) -> np.ndarray:
        """The float32 block scales the runtime's fp8 kernel multiplies by (exact powers of two)."""
        return ref.e8m0_to_f32(scales)


class Fp8E4m3E8m0T32(Fp8E4m3E8m0):
    """DeepSeek-V4.1 Flash's dense FP8, as ``c/deepseek_v41.c`` reads it (``w8_load``: ``{name}.weight`` ``O*I``
    bytes, ``{name}.scale`` ``ceil(O/32)*ceil(I/32)`` bytes; ``mv8``: ``w = e4m3(code) * ue8m0(tile)``): the
    names, dtypes and rule of fp8-e4m3-e8m0 over 32x32 tiles (docs/FORMATS.md §2.10). colibri uploads it to its
    Vulkan device as its fmt 12 (e4m3 with one f32 scale per 32 inputs of a row). No runtime kernel (the fp8
    kernel takes 128x128 blocks): ``run`` decodes it to float32 once at load (exact values,
    ``runtime.weights.decoded_at_load``); written by the numpy reference encoder (or kept byte for byte from a
    V4.1 source, ``native``)."""

    ord = 101  # colibri's private ordinal block (100+): colibri has no container ordinal for it
    name = "fp8-e4m3-e8m0-t32"
    byte_rank = (10, 1)
    scale_formula = "ceil(O/32) * ceil(I/32)"
    matmul_kind = None
    block: ClassVar[tuple[int, int]] = (32, 32)
    row_align = 32

    @classmethod
    def encode(cls, w, gs=None, *, name="", fast=True, quantizer=RTN):
        w = _as_f32_matrix(w, name)
        _check_finite(w, name)
        return cls._encode_reference(w, gs)  # no block kernel for 32-edge blocks: the vectorised reference


class Fp8E4m3E8m0R32(Fp8E4m3E8m0T32):
    """DeepSeek-V4.1 Flash's engram tables, as ``c/deepseek_v41.c`` reads them (``engram_table_open``: rows =
    weight bytes / head_dim; ``engram_row``: a row's ``head_dim`` e4m3 bytes at ``id * head_dim`` and its
    ``head_dim / 32`` scale bytes at ``id * head_dim / 32``, ``w = e4m3(code) * ue8m0(byte)``): one E8M0 byte per
    32 inputs of each row, ``<base>.scale`` ``[O, ceil(I/32)]`` (docs/FORMATS.md §2.11). No runtime kernel either:
    ``run`` decodes a matrix of it to float32 once at load, and an embedding table only the rows it looks up."""

    ord = 102
    name = "fp8-e4m3-e8m0-r32"
    byte_rank = (10, 2)
    scale_formula = "O * ceil(I/32)"
    block: ClassVar[tuple[int, int]] = (1, 32)
    row_align = 1
    rowwise_scales = True


class _Affine:
    """MLX-affine codes with a BF16 scale and bias per group (FORMATS §2.12, ``formats/affine.py``): the weight
    tensor U8 ``[O, I * bits / 8]`` (little-endian U32 words), the scale tensor BF16 ``[2, O, I / gs]`` (scales then
    biases). Written only into a QPACK container (``pairs`` False); ``--quantizer mse`` is its asymmetric search.
    Decoded by the runtime once, at load (no matmul kernel)."""

    bits: ClassVar[int]
    name: ClassVar[str]
    grouped = True
    writable = True
    mse_scales = True
    pairs = False
    scale_dtype = "BF16"
    scale_numpy = affine.BF16
    scale_tensor_label = "<name>.scales + <name>.biases BF16"
    rowwise_scales = True

    @classmethod
    def weight_nbytes(cls, O, I, gs=None):
        return O * affine.row_nbytes(I, cls.bits)

    @classmethod
    def weight_shape(cls, O, I, gs=None):
        return (O, affine.row_nbytes(I, cls.bits))

    @classmethod
    def scale_grid(cls, O, I, gs=None):
        return (2, O, ceil_div(I, gs))

    @classmethod
    def scale_shape(cls, O, I, gs=None):
        if gs not in AFFINE_GROUP_SIZES:
            raise FormatError(f"{cls.name}: group size {gs} is not one of {', '.join(map(str, AFFINE_GROUP_SIZES))}")
        return cls.scale_grid(O, I, gs)

    @classmethod
    def encode(cls, w, gs=None, *, name="", fast=True, quantizer=RTN):
        I = np.shape(w)[1] if np.ndim(w) == 2 else 0
        if gs not in AFFINE_GROUP_SIZES or I % gs:
            raise EncodeError.about(name or "?", f"{cls.label(gs)} needs I % {gs} == 0, got I = {I}",
                                    ResolveReason.NOT_ENCODABLE)  # fmt: skip
        codes, scalars = super().encode(w, gs, name=name, fast=fast, quantizer=quantizer)
        at = affine.overflow(scalars, gs)
        if at is not None:
            raise EncodeError.about(name or "?", f"{cls.label(gs)}: the group at [{at[0]}, {at[1]}] spans more than "
                                    "float32's range", ResolveReason.NOT_ENCODABLE)  # fmt: skip
        return codes, scalars

    @classmethod
    def _encode_reference(cls, w, gs, quantizer=RTN, search=None):
        """``search``: the kernels' affine fit (``kernels/affine.py``, ``_dispatch._mse_encode``), numpy's when
        None."""
        return affine.encode(w, cls.bits, gs, RTN if quantizer == RTN else quantizers.MSE, search)

    @classmethod
    def decode(cls, codes, scales, O, I, gs=None):
        return affine.decode(codes, scales, O, I, cls.bits, gs)

    @classmethod
    def bits_per_weight(cls, I=4096, gs=None):
        return super().bits_per_weight(I, gs or DEFAULT_GROUP_SIZE)


class Affine4(_Affine, Format):
    ord = 103
    name = "affine4"
    bits = 4
    weight_formula = "O * I/2"
    scale_formula = "2 * O * I/gs * 2"


class Affine8(_Affine, Format):
    ord = 104
    name = "affine8"
    bits = 8
    weight_formula = "O * I"
    scale_formula = "2 * O * I/gs * 2"


RANK_SIGNATURE_FIRST = 0  # the weight rank matched on both byte counts before any other (``Format.byte_rank``)


_RANKED: dict[tuple, tuple[type[Format], ...]] = {}  # memo of ranked(), keyed by the registry's contents


def ranked(scale_suffix: str = QS_SUFFIX) -> tuple[type[Format], ...]:
    """The registered formats with a ``byte_rank`` whose scale tensor is named by ``scale_suffix`` (``QS_SUFFIX``:
    ``<name>.qs``, the formats ``resolver.resolve_format`` tells apart; ``BLOCK_SCALE_SUFFIX``: ``<base>.scale``,
    DeepSeek's E8M0 pairs), in their byte precedence: the order a reader tries them. Follows the registry as it
    is at each call, so a format registered later (a test's) takes its place."""
    key = (scale_suffix, *FORMATS.values())
    if key not in _RANKED:
        probe = "w" + WEIGHT_SUFFIX
        named = [f for f in FORMATS.values() if (f.tensor_names(probe)[1] or "").endswith(scale_suffix)]
        _RANKED[key] = tuple(sorted((f for f in named if f.byte_rank is not None), key=lambda f: f.byte_rank))
    return _RANKED[key]


# the FP8 formats with E8M0 block scales under DeepSeek's ``<base>.weight`` F8_E4M3 + ``<base>.scale`` F8_E8M0
# names, told apart by the scale tensor's shape (docs/FORMATS.md §3); in this order (``byte_rank``) where two
# shapes coincide
UE8M0_FP8_FORMATS: tuple[type[Fp8E4m3E8m0], ...] = ranked(BLOCK_SCALE_SUFFIX)


def _require_gs(gs: int | None) -> int:
    if gs not in GROUP_SIZES:
        raise FormatError(f"group size {gs} is not one of {', '.join(map(str, GROUP_SIZES))}")
    return gs


FALLBACK_FORMAT: type[Format] = Int8Row  # what a writer falls back to (docs/FORMATS.md §5)


def lookup(name: str) -> type[Format] | None:
    """The format class whose stamp string is ``name``, or None."""
    return _BY_NAME.get(name)


def matmul_format(kind: str, gs: int | None = None) -> type[Format] | None:
    """The format a runtime kernel ``kind`` holds (int4 kinds: int4-grouped with a ``gs``, else int4-row)."""
    held = [f for f in FORMATS.values() if kind is not None and kind in (f.matmul_kind, f.planar_matmul_kind)]
    if len(held) > 1:
        held = [fmt for fmt in held if fmt.grouped == (gs is not None)]
    return held[0] if held else None


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
    raise ResolveError.about(
        tensor or "?",
        f"int4 scale bytes {scale_nbytes} match no group size for [{O}, {I}] "
        f"(candidates {', '.join(map(str, GROUP_SIZES))})",
        ResolveReason.NO_GROUP_SIZE,
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


def parse_format_option(option: str) -> FormatChoice:
    """Parse a recipe format name (``--experts int4-g64`` etc.), raising FormatError for unknown names."""
    if option in OPTION_FORMATS:
        return FormatChoice(option, by_name(OPTION_FORMATS[option]), option_group_size(option))
    if option == NATIVE_OPTION:  # no format of its own: the converter picks one per source tensor (§6)
        return FormatChoice(option, None, None)
    raise FormatError(f"unknown format {option!r}; choose one of: {', '.join(RECIPE_FORMAT_NAMES)}")
