"""The registry of natively quantized source encodings (docs/FORMATS.md §5): one class per encoding, registered by
its ``kind`` in ``__init_subclass__``, in definition order (the order recognition tries them), as
``registry.Format`` classes are. This module holds the base class, the parts, the registry and recognition; the
encodings live one module per producer (``deepseek_fp8``, ``gpt_oss_mxfp4``, ``ct_mxfp4_pack``, ``ct_int4``,
``modelopt_nvfp4``, ``mxfp8``, ``ct_fp8_channel``, ``deepseek_v41``; compressed-tensors' config reading in
``compressed_tensors``), imported below in recognition order, as mlx-lm keeps one file per model. gguf-py's ``__Quant`` classes and compressed-tensors' compressors (each declares
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

Adding an encoding is a module of this package (its class), its import line below (its place in recognition
order) and its numpy decoder in ``reference.py``; a kernel for speed is optional.
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
from colitools.formats.format_names import format_label

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


# ------------------------------------------------------------------------- shared by the encodings' modules
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


# the encodings, one module per producer; imported in recognition order (the order they register)
# isort: off
from colitools.formats.source_encodings.deepseek_fp8 import Fp8Block  # noqa: E402, F401
from colitools.formats.source_encodings.gpt_oss_mxfp4 import Mxfp4Blocks  # noqa: E402, F401
from colitools.formats.source_encodings.ct_mxfp4_pack import Mxfp4PackQuantized  # noqa: E402, F401
from colitools.formats.source_encodings.ct_int4 import PackQuantizedInt4  # noqa: E402, F401
from colitools.formats.source_encodings.modelopt_nvfp4 import Nvfp4  # noqa: E402, F401
from colitools.formats.source_encodings.mxfp8 import Mxfp8  # noqa: E402, F401
from colitools.formats.source_encodings.ct_fp8_channel import Fp8Channel  # noqa: E402, F401
from colitools.formats.source_encodings.deepseek_v41 import Ue8m0Fp8, Ue8m0Fp4  # noqa: E402, F401
# isort: on

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


from colitools.formats.source_encodings.compressed_tensors import (  # noqa: E402, F401 (public names)
    FLOAT_QUANTIZED,
    MXFP4_PACK_QUANTIZED,
    PACK_QUANTIZED,
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
