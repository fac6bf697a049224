"""The registry of natively quantized source encodings (docs/FORMATS.md §5): one class per encoding, registered by
its ``kind`` in ``__init_subclass__``, in definition order (the order recognition tries them), as
``registry.Format`` classes are. gguf-py's ``__Quant`` classes and compressed-tensors' compressors (each declares
its ``compression_param_names`` and their shapes beside its codec) are the models.

Each class declares what a reader of a source checkpoint needs to know of one encoding:

* ``kind`` (the code's name for it: ``QuantRef.kind``, ``families.Family.native_orientation``) and ``label`` (messages);
* ``declared_by``: the ``quantization_config`` ``(quant_method, quant_algo)`` pairs that declare it, and
  ``scheme(qc, config)``, which reads and checks that config (FP8 blocks, INT4 group / symmetry) and refuses a
  variant colitools cannot read (``ConfigError``);
* ``parts``: its tensors by role (``data``, ``scale``, ``scale_2``, ...), each a name suffix, the dtypes producers
  write and its shape computed from ``(O, I, group)`` (compressed-tensors' ``compression_param_info``): the shape
  expected, its prose (``Part.prose``) and the one-line refusal (``Part.check``) all derive from it, for the
  converter and the runtime alike; ``pair(name, tensors, scheme)`` recognises one weight by its tensor pairs and
  checks its companions through ``Part.check`` (``FormatError`` naming both, expected and actual shapes);
  ``companion_suffixes``: companions refused without their data tensor;
* ``native_form(...)``: whether a registered output format holds it exactly (``native``, docs/FORMATS.md §6),
  and which; ``keep`` repacks its bytes into that format;
* ``decode``: float32 values, with the numpy reference (``reference.py``) or its kernel (``kernels/decoders.py``).

FP8 block-scaled weights (``_scale_inv``) are registered too (their config, companions, native form and decoder),
but not paired here (``paired = False``): the converter carries their scale as ``SourceTensor.scale``, because its
FP8 kernels fuse the dequant into every encoder and cut scale grids for expert slabs.

Adding an encoding touches this file and ``reference.py`` (its numpy decoder); a kernel for speed is optional.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from colitools.formats import model_config, names
from colitools.formats import reference as ref
from colitools.formats.dtypes import itemsize
from colitools.formats.errors import ConfigError, FormatError
from colitools.formats.format_names import GROUP_SIZES, format_label
from colitools.formats.registry import writer_group_size

DEFAULT_FP8_BLOCK = (128, 128)


class TensorLike(Protocol):
    """A header entry: what recognition reads of a tensor (``HeaderTensor``, ``safetensors_io.TensorInfo``)."""

    dtype: str
    shape: tuple[int, ...]


class _Sym(str):
    """A dimension by name (``O``, ``I``, ``g``): a part's shape function called with these gives its prose."""


def div(a, b):
    """``a / b`` of a shape function: an exact division on numbers, ``"a/b"`` on names."""
    return _Sym(f"{a}/{b}") if isinstance(a, str) or isinstance(b, str) else a // b


def ceil(a, b):
    """``ceil(a / b)`` of a shape function: on numbers, or ``"ceil(a/b)"`` on names."""
    return _Sym(f"ceil({a}/{b})") if isinstance(a, str) or isinstance(b, str) else -(-a // b)


Shape = tuple[Any, ...]


@dataclass(frozen=True)
class Part:
    """One tensor of an encoding: ``role``, the suffix that names it after the weight's stem, the dtypes producers
    write and its shape, computed: ``shape(O, I, group)`` of one ``[O, I]`` weight (a list: the shapes allowed),
    stack dimensions prepended (``lead``). ``pair`` checks the required parts through ``check``; optional ones
    are read as any integer. Called with names (``prose``), the same function gives the shape as prose."""

    role: str
    suffix: str
    dtypes: tuple[str, ...]
    shape: Callable[[Any, Any, Any], Shape | list[Shape]]
    required: bool = True
    group_name: Any = "g"  # how ``prose`` names the group (FP8 blocks: ``("br", "bc")``)

    def allowed(self, O: int, I: int, group: Any = None, lead: tuple[int, ...] = ()) -> list[Shape]:
        """Every shape the part may have for an ``[O, I]`` weight (``lead``: its stack dimensions)."""
        got = self.shape(O, I, group)
        return [(*lead, *s) for s in (got if isinstance(got, list) else [got])]

    def expect(self, O: int, I: int, group: Any = None, lead: tuple[int, ...] = ()) -> Shape:
        return self.allowed(O, I, group, lead)[0]

    def nbytes(self, dtype: str, O: int, I: int, group: Any = None) -> int:
        """Bytes of the part of one ``[O, I]`` weight (one expert of a stack) in ``dtype``."""
        return math.prod(self.expect(O, I, group)) * itemsize(dtype)

    def prose(self, lead: tuple[str, ...] = ()) -> str:
        """The shape as the spec writes it (``[O, ceil(I/32)]``), from the shape function (``lead``: stack
        dimensions by name, ``("...",)``)."""
        shapes = self.allowed(_Sym("O"), _Sym("I"), self.group_name, tuple(map(_Sym, lead)))
        return " or ".join(f"[{', '.join(map(str, s))}]" for s in shapes)

    def fits(self, t: TensorLike, O: int, I: int, group: Any = None, lead: tuple[int, ...] = ()) -> bool:
        return t.dtype in self.dtypes and tuple(t.shape) in self.allowed(O, I, group, lead)

    def check(self, name: str, t: TensorLike, of: tuple[str, TensorLike], label: str, dims: tuple, why: str = ""):
        """FormatError (one line: the tensor, its dtype and shape, its weight's, and the expected ones) when
        tensor ``name`` (``t``) is not this part of weight ``of`` = ``(data name, header)``; ``dims``: ``(O, I,
        group, lead)``."""
        if not self.fits(t, *dims):
            want = " or ".join(str(list(s)) for s in self.allowed(*dims))
            raise FormatError(
                f"tensor {name}: {label} {self.role} {t.dtype} {list(t.shape)} does not fit {of[0]} "
                f"{list(of[1].shape)}{why} (expected {' or '.join(self.dtypes)} {want})"
            )

    def refuse(self, name: str, t: TensorLike, label: str, leads: tuple[tuple[str, ...], ...] = ((),),
               why: str = "") -> FormatError:  # fmt: skip
        """The error for a data tensor whose rank or dtype no weight of this encoding has (``leads``: the stack
        dimensions it may have)."""
        want = " or ".join(self.prose(lead) for lead in leads)
        want = f"{' or '.join(self.dtypes)} {want}{why}"
        return FormatError(f"tensor {name}: {label} weight {t.dtype} {list(t.shape)} (expected {want})")


@dataclass(frozen=True)
class Fp8Scheme:
    """The FP8 block scaling of a source (``quantization_config``): scale block ``(rows, cols)``."""

    block: tuple[int, int] = DEFAULT_FP8_BLOCK


@dataclass(frozen=True)
class Int4Scheme:
    """compressed-tensors ``pack-quantized`` weights: group size (None: from the scale grid), symmetric, act
    order (``actorder`` set: the columns are permuted by ``weight_g_idx``)."""

    group_size: int | None = None
    symmetric: bool = True
    actorder: bool = False


@dataclass(frozen=True)
class QuantScheme:
    """``quantization_config`` as colitools reads it: the method and each declared encoding's parsed scheme
    (``schemes``: kind -> scheme, for the encodings that have one)."""

    method: str | None
    schemes: tuple[tuple[str, Any], ...] = ()

    def of(self, encoding: type[SourceEncoding]) -> Any:
        """The scheme the config declares for ``encoding`` (None when it declares none)."""
        return dict(self.schemes).get(encoding.kind)

    @property
    def fp8(self) -> Fp8Scheme | None:
        return self.of(Fp8Block)

    @property
    def int4(self) -> Int4Scheme | None:
        return self.of(PackQuantizedInt4)


@dataclass(frozen=True)
class Paired:
    """One natively quantized weight found in a source: its logical ``name`` and shape ``[..., O, I]`` (the float
    weight it decodes to), its tensors by role, inputs per scale, whether a format holds it exactly, and the
    companions left out of the conversion (NVFP4 ``input_scale``)."""

    encoding: type[SourceEncoding]
    name: str
    shape: tuple[int, ...]
    parts: tuple[tuple[str, str], ...]  # (role, source tensor name), data first
    group: int
    exact: bool = True
    dropped: tuple[str, ...] = ()
    rows: int | None = None  # rows per scale where an encoding has two grids (DeepSeek-V4.1's FP8: tiles, rows)


@dataclass(frozen=True)
class NativeForm:
    """How ``native`` writes a tensor of an encoding: ``fmt`` / ``gs`` the registry format written (None: the
    role's default on the decoded values), ``copies`` the source's own bytes kept (``keep``), ``decoded`` what
    is recorded as a fallback when decoded (``"NVFP4 source"``), ``fallback`` the reason when ``fmt`` is a
    fallback rather than the encoding's own form."""

    fmt: str | None = None
    gs: int | None = None
    copies: bool = False
    decoded: str | None = None
    fallback: str | None = None

    @property
    def option(self) -> str | None:
        """The recipe option that writes ``fmt`` (``mxfp4``, ``int4-g32``, ``int4-row``, ``fp8``)."""
        return None if self.fmt is None else format_label(self.fmt, self.gs)


ENCODINGS: dict[str, type[SourceEncoding]] = {}


def _need(tensors: Mapping[str, TensorLike], n: str, what: str, of: str) -> TensorLike:
    if n not in tensors:
        raise FormatError(f"tensor {of}: {what} without its {n}")
    return tensors[n]


def _nbytes(t: TensorLike) -> int:
    n = itemsize(t.dtype)
    for d in t.shape:
        n *= d
    return n


class SourceEncoding:
    """A natively quantized source encoding. Subclasses set the class attributes below; they are registered on
    definition."""

    kind: ClassVar[str]
    label: ClassVar[str]
    declared_by: ClassVar[tuple[tuple[str, str | None], ...]] = ()  # (quant_method, quant_algo or None)
    parts: ClassVar[tuple[Part, ...]]
    group: ClassVar[int] = 0  # inputs per scale (INT4: from its config or scale grid)
    companion_suffixes: ClassVar[tuple[str, ...]] = ()  # refused without the data tensor
    paired: ClassVar[bool] = True  # recognised by ``pair`` into one logical weight
    by_dtype: ClassVar[bool] = True  # its data tensor's dtype is part of its recognition (False: its suffix
    # alone claims a tensor, and ``pair`` refuses one of another dtype)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind in ENCODINGS:
            raise TypeError(f"source encoding {cls.kind!r} registered twice")
        ENCODINGS[cls.kind] = cls

    @classmethod
    def part(cls, role: str) -> Part:
        return next(p for p in cls.parts if p.role == role)

    @classmethod
    def scheme(cls, qc: Mapping[str, Any], config: Mapping[str, Any]) -> Any:
        """This encoding's scheme read from ``quantization_config`` ``qc`` (None: it has none); ConfigError for a
        variant colitools cannot read."""
        return None

    @classmethod
    def pair(cls, name: str, tensors: Mapping[str, TensorLike], scheme: Any) -> Paired | None:
        """The weight whose data tensor is ``name``, if ``name`` is this encoding's data tensor (its companions
        checked against it, FormatError naming both); None otherwise."""
        return None

    @classmethod
    def native_form(
        cls, O: int, I: int, *, group: int | None = None, exact: bool = True, block=None, fused: bool = False
    ) -> NativeForm:
        """How ``native`` writes an ``[O, I]`` tensor (or expert slab) of this encoding."""
        return NativeForm(decoded=f"{cls.label} source")

    @classmethod
    def describe(cls, paired: Paired, scheme: Any) -> str:
        """How a reader of a source names a weight of this encoding (``inspect``: ``mxfp4``, ``fp8 128x128``,
        ``compressed-tensors int4 g32``)."""
        return cls.kind

    @classmethod
    def check_parts(cls, name: str, parts: Mapping[str, np.ndarray], shape: tuple[int, ...]) -> None:
        """Checks of the companions' values, made when tensor ``name`` (logical ``shape``) is converted."""

    @classmethod
    def keep(
        cls, parts: Mapping[str, np.ndarray], O: int, I: int, gs: int | None, *, name: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(codes, scales)`` of ``native_form``'s format holding the source's own bytes."""
        raise FormatError(f"tensor {name}: a {cls.label} source cannot be kept as it is")  # pragma: no cover

    @classmethod
    def decode(
        cls,
        parts: Mapping[str, np.ndarray],
        O: int,
        I: int,
        *,
        group: int | None = None,
        exact: bool = True,
        block=None,
        fast: bool = True,
    ) -> np.ndarray:
        """float32 ``[O, I]`` from ``parts`` cut to the tensor's rows: the kernel (``fast``) or the numpy
        reference, bit-identical."""
        raise NotImplementedError


def _decoders(fast: bool):
    """The module holding the source decoders: the kernels' (numba-free drivers) or the numpy reference; both
    name them alike."""
    if fast:
        from colitools.formats.kernels import decoders

        return decoders
    return ref


# ------------------------------------------------------------------------------------------- encodings
def _held_by_mxfp4(cls, O, I, *, group=None, exact=True, block=None, fused=False):
    """``native_form`` of the encodings whose codes and E8M0 scales are the registered mxfp4 format's bytes."""
    return NativeForm("mxfp4", copies=True)


def _keepable_e8m0(scale, O, I, *, name, source):
    """The E8M0 scales ``[O, I/32]`` of an MXFP4-byte source as U8 (bytes unchanged: U8 or F8_E8M0), refused
    when one is the NaN byte 0xFF, which mxfp4 cannot hold."""
    scale = np.ascontiguousarray(scale).view(np.uint8).reshape(O, I // 32)
    if (scale == 0xFF).any():
        raise FormatError(f"tensor {name}: E8M0 scale byte 0xFF (NaN) in an {source} source; cannot keep it")
    return scale


class Fp8Block(SourceEncoding):
    """FP8 block-scaled (DeepSeek-V3): ``<name>`` F8_E4M3 + ``<name>_scale_inv`` F32/BF16 on the ceil grid of
    ``weight_block_size``; ``w = f32(e4m3(q)) * f32(s)``. Held exactly by fp8-e4m3-b128 with 128x128 blocks."""

    kind = "fp8"
    label = "FP8"
    declared_by = (("fp8", None),)
    parts = (
        Part("data", "", ("F8_E4M3",), lambda O, I, b: (O, I), group_name=("br", "bc")),
        Part("scale", "_scale_inv", ("F32", "BF16"), lambda O, I, b: (ceil(O, b[0]), ceil(I, b[1])),
             group_name=("br", "bc")),
    )
    paired = False

    @classmethod
    def scheme(cls, qc, config):
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ConfigError(f"config.json: quantization_config.fmt {fmt!r} is not supported (only 'e4m3')")
        return Fp8Scheme(model_config.fp8_block_size(config) or DEFAULT_FP8_BLOCK)

    @classmethod
    def pair(cls, name, tensors, scheme):
        """(For readers of a source, ``pair_tensors(..., encodings=ENCODINGS.values())``: the converter carries
        the scale itself.) ``<name>`` F8_E4M3 with its ``_scale_inv`` on the ceil grid of the scheme's block."""
        data, scale = cls.parts
        h, sname = tensors[name], name + scale.suffix
        if h.dtype not in data.dtypes or sname not in tensors:
            return None
        br, bc = block = (scheme or Fp8Scheme()).block
        shape = tuple(h.shape)
        if len(shape) < 2:
            raise data.refuse(name, h, cls.label, (("...",),))
        dims = (shape[-2], shape[-1], block, shape[:-2])
        scale.check(sname, tensors[sname], (name, h), cls.label, dims, f" with {br}x{bc} blocks")
        return Paired(cls, name, shape, (("data", name), ("scale", sname)), br * bc)

    @classmethod
    def describe(cls, paired, scheme):
        br, bc = (scheme or Fp8Scheme()).block
        return f"fp8 {br}x{bc}"

    @classmethod
    def native_form(cls, O, I, *, group=None, exact=True, block=None, fused=False):
        if block == (ref.FP8_BLOCK, ref.FP8_BLOCK) and not fused:
            return NativeForm("fp8-e4m3-b128")  # a passthrough of the bytes: the format's own writer path
        return NativeForm()  # other blocks: the role's default, not recorded (it is not a native encoding)

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        return _decoders(fast).dequant_fp8_block(parts["data"], parts["scale"], block or DEFAULT_FP8_BLOCK)


class Mxfp4Blocks(SourceEncoding):
    """gpt-oss MXFP4: ``<base>_blocks`` U8 ``[..., O, I/32, 16]`` + ``<base>_scales`` U8 (E8M0) ``[..., O, I/32]``;
    ``e2m1(nib) * 2^(e - 127)``: mxfp4's own codes and scales, byte for byte."""

    kind = "mxfp4"
    label = "MXFP4"
    declared_by = (("mxfp4", None),)
    parts = (
        Part("data", names.MXFP4_BLOCKS, ("U8",), lambda O, I, g: (O, div(I, 32), 16)),
        Part("scale", names.MXFP4_SCALES, ("U8",), lambda O, I, g: (O, div(I, 32))),
    )
    group = ref.MXFP4_BLOCK
    companion_suffixes = (names.MXFP4_SCALES,)

    @classmethod
    def pair(cls, name, tensors, scheme):
        data, scale = cls.parts
        h = tensors[name]
        if not name.endswith(data.suffix) or h.dtype not in data.dtypes:
            return None
        base = name[: -len(data.suffix)]
        sname = base + scale.suffix
        s = _need(tensors, sname, "MXFP4 blocks", name)
        shape = tuple(h.shape)
        if len(shape) < 3:
            raise data.refuse(name, h, cls.label, (("...",),))
        dims = (shape[-3], shape[-2] * 32, cls.group, shape[:-3])
        data.check(name, h, (name, h), cls.label, dims)  # 16 bytes per block
        scale.check(sname, s, (name, h), cls.label, dims)
        return Paired(cls, base, (*shape[:-2], shape[-2] * 32), (("data", name), ("scale", sname)), cls.group)

    native_form = classmethod(_held_by_mxfp4)

    @classmethod
    def keep(cls, parts, O, I, gs, *, name):
        scale = _keepable_e8m0(parts["scale"], O, I, name=name, source="MXFP4")
        return ref.mxfp4_blocks_to_packed(parts["data"].reshape(O, I // 32, 16)), scale

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        blocks, scales = parts["data"].reshape(O, I // 32, 16), parts["scale"].reshape(O, I // 32)
        return _decoders(fast).decode_mxfp4_blocks(blocks, scales)


class Mxfp4PackQuantized(SourceEncoding):
    """compressed-tensors ``mxfp4-pack-quantized`` (Kimi K3's routed experts): ``<base>.weight_packed`` U8
    ``[O, I/2]`` (E2M1, low nibble = even element) + ``<base>.weight_scale`` U8 E8M0 ``[O, I/32]``;
    ``e2m1(nib) * 2^(e - 127)``. These are the registered mxfp4 format's own tensors, byte for byte (same
    suffixes, dtypes, shapes and nibble order): ``native`` keeps them unchanged. Defined before
    :class:`PackQuantizedInt4`, which claims every other ``.weight_packed``."""

    kind = "mxfp4-pack"
    label = "MXFP4"
    declared_by = (("compressed-tensors", None),)
    parts = (
        Part("data", ".weight_packed", ("U8",), lambda O, I, g: (O, div(I, 2))),
        Part("scale", ".weight_scale", ("U8",), lambda O, I, g: (O, div(I, 32))),
    )
    group = ref.MXFP4_BLOCK

    @classmethod
    def scheme(cls, qc, config):
        return _ct_scheme(qc, MXFP4_PACK_QUANTIZED)

    @classmethod
    def pair(cls, name, tensors, scheme):
        data, scale = cls.parts
        h, base = tensors[name], name[: -len(data.suffix)]
        sname = base + scale.suffix
        if not name.endswith(data.suffix) or h.dtype not in data.dtypes or sname not in tensors:
            return None
        s, shape = tensors[sname], tuple(h.shape)
        if len(shape) != 2 or s.dtype not in scale.dtypes:
            return None  # an INT4 weight_packed of another dtype: PackQuantizedInt4 refuses it
        O, I = shape[0], shape[1] * 2
        if I % cls.group:
            raise FormatError(
                f"tensor {name}: MXFP4 weight {list(shape)} holds I = {I}, not a multiple of 32"
            )
        scale.check(sname, s, (name, h), cls.label, (O, I, cls.group))
        return Paired(cls, base + ".weight", (O, I), (("data", name), ("scale", sname)), cls.group)

    native_form = classmethod(_held_by_mxfp4)

    @classmethod
    def keep(cls, parts, O, I, gs, *, name):
        scale = _keepable_e8m0(parts["scale"], O, I, name=name, source="MXFP4")
        return np.ascontiguousarray(parts["data"], dtype=np.uint8).reshape(O, I // 2), scale

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        blocks = np.ascontiguousarray(parts["data"], dtype=np.uint8).reshape(O, I // 32, 16)  # the same bytes
        return _decoders(fast).decode_mxfp4_blocks(blocks, parts["scale"].reshape(O, I // 32))


class PackQuantizedInt4(SourceEncoding):
    """compressed-tensors ``pack-quantized`` INT4 (Kimi-K2-Thinking's experts): ``<base>.weight_packed`` I32
    ``[O, I/8]`` (eight ``q + 8`` nibbles per int32, lowest bits first), ``.weight_scale`` ``[O, I/g]``,
    ``.weight_shape`` I64 ``[2]``; ``q * s``. Symmetric without act order: int4-grouped gs ``g`` holds it exactly
    (codes repacked, scales widened); asymmetric (``weight_zero_point``) or act order (``weight_g_idx``) is
    decoded."""

    kind = "int4"
    label = "INT4"
    declared_by = (("compressed-tensors", None),)
    parts = (
        Part("data", ".weight_packed", ("I32",), lambda O, I, g: (O, div(I, 8))),
        Part("scale", ".weight_scale", ("BF16", "F16", "F32"), lambda O, I, g: (O, ceil(I, g))),
        Part("zero_point", ".weight_zero_point", ("I32",), lambda O, I, g: (ceil(O, 8), ceil(I, g)), required=False),
        Part("g_idx", ".weight_g_idx", ("I32",), lambda O, I, g: (I,), required=False),
        Part("shape", ".weight_shape", ("I64",), lambda O, I, g: (2,), required=False),
    )
    companion_suffixes = (".weight_shape", ".weight_zero_point", ".weight_g_idx")
    by_dtype = False  # a .weight_packed of another dtype is refused, not passed over

    @classmethod
    def scheme(cls, qc, config):
        return _ct_scheme(qc, PACK_QUANTIZED)

    @classmethod
    def pair(cls, name, tensors, scheme):
        data, scale = cls.parts[:2]
        if not name.endswith(data.suffix):
            return None
        h, base = tensors[name], name[: -len(data.suffix)]
        _need(tensors, base + scale.suffix, "packed INT4 weight", name)
        shape = tuple(h.shape)
        if h.dtype not in data.dtypes or len(shape) != 2:
            raise data.refuse(name, h, "packed INT4")
        sname = base + scale.suffix
        s, ct = tensors[sname], scheme or Int4Scheme()
        O, I = shape[0], shape[1] * 8
        g = ct.group_size or (-(-I // s.shape[1]) if len(s.shape) == 2 and s.shape[1] else I)  # from the grid
        scale.check(sname, s, (name, h), cls.label, (O, I, g), f" with group size {g}")
        parts = [("data", name), ("scale", sname)]
        parts += [
            (p.role, base + p.suffix) for p in cls.parts if not p.required and base + p.suffix in tensors
        ]
        roles = dict(parts)
        exact = "zero_point" not in roles and "g_idx" not in roles and ct.symmetric and not ct.actorder
        return Paired(cls, base + ".weight", (O, I), tuple(parts), g, exact)

    @classmethod
    def native_form(cls, O, I, *, group=None, exact=True, block=None, fused=False):
        if not exact:
            return NativeForm(decoded="asymmetric or act-order INT4 source")
        g = group
        if g is not None and I <= g:
            return NativeForm("int4-row", copies=True)
        if g in GROUP_SIZES and writer_group_size(I, g) == g:
            return NativeForm("int4-grouped", g, copies=True)
        why = f"INT4 group size {g} at I = {I} would not resolve back as int4-grouped; decoded"
        return NativeForm("int8-row", fallback=why)

    @classmethod
    def describe(cls, paired, scheme):
        variant = "" if paired.exact else " (asymmetric or act order)"
        return f"compressed-tensors int4 g{paired.group}{variant}"

    @classmethod
    def check_parts(cls, name, parts, shape):
        if "shape" in parts:  # weight_shape: the true [O, I] of the packed codes
            got = [int(x) for x in np.asarray(parts["shape"]).reshape(-1)]
            if got != list(shape):
                raise FormatError(
                    f"tensor {name}: weight_shape {got} does not match its packed codes {list(shape)}"
                )

    @classmethod
    def keep(cls, parts, O, I, gs, *, name):
        codes = ref.int32_nibbles_to_pairs(parts["data"].reshape(O, -1), I)
        scales = np.asarray(parts["scale"]).astype(np.float32).reshape(O, -1)  # exact widening
        return codes, (scales.reshape(O) if gs is None else np.ascontiguousarray(scales))

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        if not exact:  # the general form (zero points, act order) has no kernel
            return ref.decode_pack_quantized_general(
                parts["data"], parts["scale"], I, group, parts.get("zero_point"), parts.get("g_idx")
            )
        return _decoders(fast).decode_pack_quantized(parts["data"].reshape(O, -1), parts["scale"].reshape(O, -1),
                                                     I, group)  # fmt: skip


class Nvfp4(SourceEncoding):
    """modelopt NVFP4: ``<name>`` U8 ``[O, I/2]`` E2M1 + ``<name>_scale`` F8_E4M3 ``[O, I/16]`` + ``<name>_scale_2``
    F32 scalar (``[]`` or ``[1]``); ``e2m1(nib) * e4m3(scale) * scale_2``. ``<base>.input_scale`` is dropped. No
    format holds it exactly: decoded."""

    kind = "nvfp4"
    label = "NVFP4"
    declared_by = (("modelopt", "NVFP4"),)
    parts = (
        Part("data", "", ("U8",), lambda O, I, g: (O, div(I, 2))),
        Part("scale", "_scale", ("F8_E4M3",), lambda O, I, g: (O, ceil(I, 16))),
        Part("scale_2", "_scale_2", ("F32",), lambda O, I, g: [(), (1,)]),
    )
    group = ref.NVFP4_BLOCK
    INPUT_SCALE = ".input_scale"  # on the stem without ".weight": activation scales, not converted

    @classmethod
    def pair(cls, name, tensors, scheme):
        data, scale, scale_2 = cls.parts
        h = tensors[name]
        if (
            h.dtype not in data.dtypes
            or name + scale.suffix not in tensors
            or name + scale_2.suffix not in tensors
        ):
            return None
        sname, s2name = name + scale.suffix, name + scale_2.suffix
        s, s2, shape = tensors[sname], tensors[s2name], tuple(h.shape)
        if len(shape) != 2:
            raise data.refuse(name, h, cls.label)
        O, I = shape[0], shape[1] * 2
        scale.check(sname, s, (name, h), cls.label, (O, I, cls.group))
        if s2.dtype not in scale_2.dtypes or _nbytes(s2) != 4:
            raise FormatError(
                f"tensor {s2name}: NVFP4 scale_2 {s2.dtype} {list(s2.shape)} (expected F32 scalar)"
            )
        stem = name[: -len(".weight")] if name.endswith(".weight") else name
        dropped = tuple(x for x in (stem + cls.INPUT_SCALE,) if x in tensors)
        parts = (("data", name), ("scale", sname), ("scale_2", s2name))
        return Paired(cls, name, (O, I), parts, cls.group, False, dropped)

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        data, scale = parts["data"].reshape(O, -1), parts["scale"].reshape(O, -1)
        return _decoders(fast).decode_nvfp4(data, scale, parts["scale_2"], I)


class Mxfp8(SourceEncoding):
    """MXFP8: ``<name>`` F8_E4M3 ``[O, I]`` (or an expert stack ``[E, A, B]``) + ``<name>_scale`` E8M0 (U8 or
    F8_E8M0) ``[O, ceil(I/32)]`` (``[E, A, ceil(B/32)]``: blocks of 32 along the last axis, a partial last block
    allowed), no ``_scale_inv``; ``e4m3(b) * 2^(e - 127)``. Declared as ``mxfp8``, modelopt MXFP8, or ``fp8`` with
    ``weight_block_size: [1, 32]`` and ``scale_fmt: ue8m0`` (transformers' ``FineGrainedFP8Config``, as Inkling-2
    ships its expert stacks); recognised by the tensor pair whatever the config says. No format holds it exactly
    (fp8-e4m3-e8m0's blocks are 128x128): decoded."""

    kind = "mxfp8"
    label = "MXFP8"
    declared_by = (("mxfp8", None), ("modelopt", "MXFP8"), ("fp8", None))
    parts = (
        Part("data", "", ("F8_E4M3",), lambda O, I, g: (O, I)),
        Part("scale", "_scale", ("U8", "F8_E8M0"), lambda O, I, g: (O, ceil(I, 32))),
    )
    group = ref.MXFP8_BLOCK
    # ``quant_method: fp8`` declares MXFP8 with this ``weight_block_size`` and ``scale_fmt: ue8m0``
    FP8_BLOCK = (1, ref.MXFP8_BLOCK)

    @classmethod
    def scheme(cls, qc, config):
        """True where ``quant_method: fp8`` declares MXFP8 (``[1, 32]`` blocks, ``scale_fmt: ue8m0``); None for
        every other FP8 config (128x128 DeepSeek blocks: ``Fp8Block``'s) and for ``mxfp8`` / modelopt, whose
        method alone declares it."""
        if qc.get("quant_method") != "fp8":
            return None
        declared = qc.get("scale_fmt") == "ue8m0" and model_config.fp8_block_size(config) == cls.FP8_BLOCK
        return True if declared else None

    @classmethod
    def pair(cls, name, tensors, scheme):
        data, scale = cls.parts
        h, sname = tensors[name], name + scale.suffix
        if h.dtype not in data.dtypes or sname not in tensors or tensors[sname].dtype not in scale.dtypes:
            return None
        if name + Fp8Block.part("scale").suffix in tensors:  # an FP8 block-scaled weight
            return None
        shape = tuple(h.shape)
        if len(shape) not in (2, 3) or not shape[-1]:
            raise data.refuse(name, h, cls.label, ((), ("E",)))
        scale.check(sname, tensors[sname], (name, h), cls.label, (shape[-2], shape[-1], cls.group, shape[:-2]))
        return Paired(cls, name, shape, (("data", name), ("scale", sname)), cls.group, False)

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        scale = np.asarray(parts["scale"]).view(np.uint8).reshape(O, -1)  # F8_E8M0 bytes are E8M0 bytes
        return _decoders(fast).decode_mxfp8(parts["data"].reshape(O, I), scale, I)


class Fp8Channel(SourceEncoding):
    """compressed-tensors ``float-quantized`` FP8 (Llama-4-Maverick-17B-128E-Instruct-FP8, llm-compressor's FP8
    ``channel`` / ``tensor`` schemes): ``<base>.weight`` F8_E4M3 ``[O, I]`` + ``<base>.weight_scale`` (BF16, F16 or
    F32) ``[O, 1]`` (one scale per output row) or ``[1]`` / ``[]`` (one per tensor); ``w = f32(e4m3(q)) * f32(s)``,
    one float32 multiply (exact: 4 + 11 significant bits). A static activation scale ``<base>.input_scale`` is
    dropped. No format holds per-row FP8 scales exactly (fp8-e4m3-b128's are 128x128 blocks): decoded."""

    kind = "fp8-channel"
    label = "FP8 channel"
    declared_by = (("compressed-tensors", None),)
    parts = (
        Part("data", ".weight", ("F8_E4M3",), lambda O, I, g: (O, I)),
        Part("scale", ".weight_scale", ("BF16", "F16", "F32"), lambda O, I, g: [(O, 1), (1,), ()]),
    )
    INPUT_SCALE = ".input_scale"  # on the stem: the activations' scale, not converted

    @classmethod
    def scheme(cls, qc, config):
        """True when a ``float-quantized`` group declares 8-bit float weights per channel or per tensor; None when
        the config has no such group; ConfigError for another float scheme (blocks, groups, other widths)."""
        weights = [w for f, w in _ct_weights(qc) if f == FLOAT_QUANTIZED]
        for w in weights:
            if (w.get("num_bits"), w.get("type"), w.get("strategy")) not in (
                (8, "float", "channel"),
                (8, "float", "tensor"),
            ):
                raise ConfigError(
                    f"config.json: compressed-tensors {FLOAT_QUANTIZED} weights with num_bits {w.get('num_bits')!r} "
                    f"type {w.get('type')!r} strategy {w.get('strategy')!r} are not supported (only 8-bit float "
                    "per 'channel' or per 'tensor')"
                )
        return True if weights else None

    @classmethod
    def pair(cls, name, tensors, scheme):
        data, scale = cls.parts
        base = name[: -len(data.suffix)]
        sname = base + scale.suffix
        if sname not in tensors or tensors[sname].dtype not in scale.dtypes:
            return None
        h, s = tensors[name], tensors[sname]
        shape = tuple(h.shape)
        if len(shape) != 2:
            raise data.refuse(name, h, cls.label)
        scale.check(sname, s, (name, h), cls.label, (*shape, None))
        dropped = tuple(x for x in (base + cls.INPUT_SCALE,) if x in tensors)
        group = shape[1] if s.shape and s.shape[0] == shape[0] else shape[0] * shape[1]
        return Paired(cls, name, shape, (("data", name), ("scale", sname)), group, False, dropped)

    @classmethod
    def describe(cls, paired, scheme):
        per = "channel" if paired.group == paired.shape[-1] else "tensor"
        return f"compressed-tensors fp8 per {per}"

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        return ref.dequant_fp8_rows(parts["data"].reshape(O, I), parts["scale"])


class Ue8m0Fp8(SourceEncoding):
    """DeepSeek-V4.1 Flash's FP8 (colibri ``c/tools/dsv41_ref.py`` ``fp8_quant_blocked`` / ``fp8_quant_rowgroups``):
    ``<b>.weight`` F8_E4M3 ``[O, I]`` + ``<b>.scale`` F8_E8M0 (or U8) holding one exponent byte per tile,
    ``w = e4m3(q) * 2^(e - 127)``. Two grids, told apart by the scale's rows: square ``weight_block_size`` tiles
    ``[ceil(O/b), ceil(I/b)]`` (the dense projections, b = 32) or row groups of 32 ``[O, ceil(I/32)]`` (the
    engram tables). Fp8Block's math with power-of-two scales, under other names and dtypes: recognised by the
    tensor pair. ``native`` keeps the codes and E8M0 bytes of a grid a format holds (``HELD_BY``: 32x32 tiles
    fp8-e4m3-e8m0-t32, row groups -r32, 128x128 tiles fp8-e4m3-e8m0); any other tile side is decoded."""

    kind = "fp8-ue8m0"
    label = "FP8 UE8M0"
    declared_by = (("fp8", None),)
    parts = (
        Part("data", ".weight", ("F8_E4M3",), lambda O, I, b: (O, I), group_name="b"),
        Part("scale", ".scale", ("U8", "F8_E8M0"), lambda O, I, b: [(ceil(O, b), ceil(I, b)), (O, ceil(I, 32))],
             group_name="b"),  # square tiles of side b, or row groups of 32
    )
    ROW_GROUP = 32

    @classmethod
    def scheme(cls, qc, config):
        """The square tile side ``b`` when ``scale_fmt: ue8m0`` declares E8M0 tiles (None otherwise)."""
        block = model_config.fp8_block_size(config)
        if qc.get("scale_fmt") != "ue8m0" or block is None or block[0] != block[1]:
            return None
        return Fp8Scheme(block)

    @classmethod
    def pair(cls, name, tensors, scheme):
        data, scale = cls.parts
        sname = name[: -len(data.suffix)] + scale.suffix
        if sname not in tensors or tensors[sname].dtype not in scale.dtypes or len(tensors[name].shape) != 2:
            return None
        h, s = tensors[name], tensors[sname]
        (O, I), b = tuple(h.shape), (scheme or Fp8Scheme()).block[0]
        scale.check(sname, s, (name, h), cls.label, (O, I, b), f" with {b}x{b} tiles or row groups")
        parts = (("data", name), ("scale", sname))
        if tuple(s.shape) == scale.expect(O, I, b):  # square tiles (first, as when both grids agree)
            return Paired(cls, name, (O, I), parts, b, (b, b) in cls.HELD_BY, rows=b)
        return Paired(cls, name, (O, I), parts, cls.ROW_GROUP, True, rows=1)

    # the registry format holding each grid byte for byte (``native``): (rows, inputs) per E8M0 byte -> format
    HELD_BY = {(128, 128): "fp8-e4m3-e8m0", (32, 32): "fp8-e4m3-e8m0-t32", (1, 32): "fp8-e4m3-e8m0-r32"}

    @classmethod
    def native_form(cls, O, I, *, group=None, exact=True, block=None, fused=False):
        """The source's own codes and E8M0 bytes, kept, where a registry format has its grid (``block``: rows
        and inputs per scale byte, from ``pair``); any other grid is decoded."""
        fmt = cls.HELD_BY.get(tuple(block)) if block is not None and not fused else None
        if fmt is None:
            return NativeForm(decoded=f"{cls.label} source")
        return NativeForm(fmt, copies=True)

    @classmethod
    def keep(cls, parts, O, I, gs, *, name):
        codes = np.ascontiguousarray(parts["data"]).view(np.uint8).reshape(O, I)
        scale = np.ascontiguousarray(parts["scale"]).view(np.uint8)
        if (scale == 0xFF).any():  # E8M0 NaN: refused as the decoded path refuses a NaN scale
            raise FormatError(f"tensor {name}: FP8 source scale holds the E8M0 NaN byte 0xFF")
        return codes, scale

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        e = np.asarray(parts["scale"]).view(np.uint8)
        rows = 1 if e.shape[0] == O else group  # row groups have one scale row per weight row
        s = np.ldexp(np.float32(1), e.astype(np.int32) - 127).astype(np.float32)
        return _decoders(fast).dequant_fp8_block(parts["data"].reshape(O, I), s, (rows, group))


class Ue8m0Fp4(SourceEncoding):
    """DeepSeek-V4(.1)'s FP4 routed experts (colibri ``dsv41_ref.py`` ``fp4_quant_rowgroups``): ``<b>.weight`` I8
    ``[O, I/2]`` e2m1 pairs (low nibble = even input, bit 3 the sign) + ``<b>.scale`` F8_E8M0 (or U8) ``[O, I/32]``;
    ``e2m1(nib) * 2^(e - 127)``: mxfp4's own codes and scales, byte for byte (``native`` keeps them)."""

    kind = "fp4-ue8m0"
    label = "FP4 UE8M0"
    declared_by = (("fp8", None),)  # (DeepSeek-V4.1: quant_method fp8 with expert_dtype fp4; no scheme)
    parts = (
        Part("data", ".weight", ("I8",), lambda O, I, g: (O, div(I, 2))),
        Part("scale", ".scale", ("U8", "F8_E8M0"), lambda O, I, g: (O, div(I, 32))),
    )
    group = ref.MXFP4_BLOCK

    @classmethod
    def pair(cls, name, tensors, scheme):
        data, scale = cls.parts
        sname = name[: -len(data.suffix)] + scale.suffix
        if sname not in tensors or tensors[sname].dtype not in scale.dtypes:
            return None
        h, s = tensors[name], tensors[sname]
        shape = tuple(h.shape)
        if len(shape) != 2 or (2 * shape[1]) % cls.group:
            raise data.refuse(name, h, cls.label, why=f", I a multiple of {cls.group}")
        scale.check(sname, s, (name, h), cls.label, (shape[0], 2 * shape[1], cls.group))
        return Paired(cls, name, (shape[0], 2 * shape[1]), (("data", name), ("scale", sname)), cls.group)

    native_form = classmethod(_held_by_mxfp4)

    @classmethod
    def keep(cls, parts, O, I, gs, *, name):
        scale = _keepable_e8m0(parts["scale"], O, I, name=name, source="FP4")
        return np.ascontiguousarray(parts["data"]).view(np.uint8).reshape(O, I // 2), scale

    @classmethod
    def decode(cls, parts, O, I, *, group=None, exact=True, block=None, fast=True):
        blocks = np.ascontiguousarray(parts["data"]).view(np.uint8).reshape(O, I // 32, 16)
        scales = np.ascontiguousarray(parts["scale"]).view(np.uint8).reshape(O, I // 32)
        return _decoders(fast).decode_mxfp4_blocks(blocks, scales)


FP8_BLOCK = Fp8Block
PAIRED: tuple[type[SourceEncoding], ...] = tuple(e for e in ENCODINGS.values() if e.paired)


def by_kind(kind: str) -> type[SourceEncoding]:
    """The encoding registered as ``kind`` (KeyError if none)."""
    return ENCODINGS[kind]


# --------------------------------------------------------------------------------- quantization_config
def quant_methods() -> tuple[str, ...]:
    """Every ``quant_method`` an encoding declares, in registration order."""
    return tuple(dict.fromkeys(m for e in ENCODINGS.values() for m, _ in e.declared_by))


def read_quant_config(config: Mapping[str, Any]) -> QuantScheme:
    """The source quantization ``config.json`` declares (method None when there is none), each declaring
    encoding's scheme read. ConfigError (one line) for a ``quant_method`` / ``quant_algo`` no encoding declares,
    or a variant of one colitools cannot read."""
    qc = model_config.quantization_config(config)
    if qc is None:
        return QuantScheme(None)
    method = qc.get("quant_method")
    claims = [(e, algo) for e in ENCODINGS.values() for m, algo in e.declared_by if m == method]
    if not claims:
        raise ConfigError(
            f"config.json: quantization_config.quant_method {method!r} is not supported "
            f"(supported: {', '.join(quant_methods())})"
        )
    algos = [algo for _, algo in claims if algo is not None]
    if algos:
        nested = qc.get("quantization")
        algo = qc.get("quant_algo") or (nested.get("quant_algo") if isinstance(nested, Mapping) else None)
        if algo not in algos:
            raise ConfigError(
                f"config.json: quantization_config.quant_algo {algo!r} of quant_method {method!r} is not "
                f"supported (only {', '.join(repr(a) for a in algos)})"
            )
        claims = [(e, a) for e, a in claims if a == algo]
    schemes = ((e.kind, e.scheme(qc, config)) for e, _ in claims)
    return QuantScheme(method, tuple((k, s) for k, s in schemes if s is not None))


PACK_QUANTIZED, MXFP4_PACK_QUANTIZED = "pack-quantized", "mxfp4-pack-quantized"  # compressed-tensors formats
FLOAT_QUANTIZED = "float-quantized"


def _ct_weights(qc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(format, weights)`` of every ``config_groups`` scheme of a compressed-tensors config that quantizes
    weights (a group's own ``format``, else the top level's, else pack-quantized); ConfigError for a malformed
    group or a format no encoding reads."""
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise ConfigError(
            f"config.json: quantization_config.config_groups is a {type(groups).__name__}, expected an object"
        )
    schemes = [g for g in groups.values() if isinstance(g, Mapping) and g.get("weights")]
    for key, g in groups.items():
        if isinstance(g, Mapping) and g.get("weights") and not isinstance(g["weights"], Mapping):
            raise ConfigError(
                f"config.json: quantization_config.config_groups.{key}.weights is a "
                f"{type(g['weights']).__name__}, expected an object"
            )
    known = {PACK_QUANTIZED, MXFP4_PACK_QUANTIZED, FLOAT_QUANTIZED}
    formats = {fmt, *(g.get("format") for g in schemes)} - {None}
    if formats - known:
        raise ConfigError(
            "config.json: quantization_config.format "
            f"{sorted(formats - known, key=str)[0]!r} of quant_method 'compressed-tensors' is not "
            f"supported (only {PACK_QUANTIZED!r}, {MXFP4_PACK_QUANTIZED!r}, {FLOAT_QUANTIZED!r})"
        )
    return [(g.get("format") or fmt or PACK_QUANTIZED, g["weights"]) for g in schemes]


def _ct_scheme(qc: Mapping[str, Any], fmt: str) -> Int4Scheme | None:
    """The weight scheme of format ``fmt`` in a compressed-tensors config: pack-quantized INT4 (one scheme for its
    weights: group size, symmetry, act order), or mxfp4-pack-quantized (checked: 4-bit float, groups of 32;
    it has no scheme of its own: None)."""
    weights = [w for f, w in _ct_weights(qc) if f == fmt]
    if fmt == MXFP4_PACK_QUANTIZED:
        for w in weights:
            if (w.get("num_bits"), w.get("type"), w.get("group_size")) != (4, "float", 32):
                raise ConfigError(
                    f"config.json: compressed-tensors {MXFP4_PACK_QUANTIZED} weights with num_bits "
                    f"{w.get('num_bits')!r} type {w.get('type')!r} group_size {w.get('group_size')!r} are not "
                    "supported (only 4-bit float in groups of 32)"
                )
        return None
    if not weights:
        return Int4Scheme()
    for w in weights:
        if w.get("num_bits") != 4 or w.get("type", "int") != "int":
            raise ConfigError(
                "config.json: compressed-tensors weights with num_bits "
                f"{w.get('num_bits')!r} type {w.get('type', 'int')!r} are not supported (only 4-bit int)"
            )
    sizes = {w.get("group_size") for w in weights}
    gs = sizes.pop() if len(sizes) == 1 else None
    return Int4Scheme(
        gs if isinstance(gs, int) and gs > 0 else None,
        symmetric=all(w.get("symmetric", True) for w in weights),
        actorder=any(w.get("actorder") not in (None, False, "static") for w in weights),
    )


# ------------------------------------------------------------------------------------------ recognition
def pair_tensors(
    tensors: Mapping[str, TensorLike],
    scheme: QuantScheme,
    order: Iterable[str] | None = None,
    encodings: Iterable[type[SourceEncoding]] | None = None,
) -> tuple[dict[str, Paired], set[str]]:
    """Recognise every natively quantized weight of a source (``tensors``: name -> header entry), each by the first
    registered encoding whose ``pair`` claims its data tensor, in ``order`` (default: natural name order).
    ``encodings``: those tried (default ``PAIRED``; a reader of a source passes ``ENCODINGS.values()`` to see FP8
    block-scaled weights too).

    Returns ``(logical name -> Paired, every source name consumed)``: their parts and dropped companions, which
    are not tensors of their own. FormatError (one line, naming the tensors) for a companion that does not fit
    its weight or has none, or a decoded name that is also a source tensor."""
    out: dict[str, Paired] = {}
    consumed: set[str] = set()
    # (encoding, its scheme, the data tensor's suffix and dtypes): a cheap filter before ``pair`` (92k tensors)
    tried = [
        (e, scheme.of(e), e.parts[0].suffix, e.parts[0].dtypes if e.by_dtype else None)
        for e in (PAIRED if encodings is None else encodings)
    ]
    by_dtype: dict[str, list] = {}  # source dtype -> the encodings whose data tensor may have it, in order
    for n in sorted(tensors, key=names.natural_key) if order is None else order:
        dtype = tensors[n].dtype
        candidates = by_dtype.get(dtype)
        if candidates is None:
            candidates = by_dtype[dtype] = [t for t in tried if t[3] is None or dtype in t[3]]
        for encoding, its_scheme, suffix, _ in candidates:
            if not n.endswith(suffix):
                continue
            p = encoding.pair(n, tensors, its_scheme)
            if p is None:
                continue
            if p.name in out or (p.name in tensors and p.name != n):
                raise FormatError(f"tensor {n}: its decoded name {p.name} is also a tensor of the source")
            out[p.name] = p
            consumed.update(name for _, name in p.parts)
            consumed.update(p.dropped)
            break
    _check_companions(tensors, consumed)
    return out, consumed


def _check_companions(tensors: Mapping[str, TensorLike], consumed: set[str]) -> None:
    """A companion tensor (``companion_suffixes``) whose data tensor is absent: FormatError naming both."""
    pairs = [(suffix, e.parts[0].suffix) for e in PAIRED for suffix in e.companion_suffixes]
    suffixes = tuple(suffix for suffix, _ in pairs)
    for n in tensors:
        if n in consumed or not n.endswith(suffixes):
            continue
        for suffix, data in pairs:
            if n.endswith(suffix) and n[: -len(suffix)] + data not in tensors:
                raise FormatError(f"tensor {n}: companion without its weight {n[: -len(suffix)] + data}")
