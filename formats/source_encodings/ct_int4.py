"""compressed-tensors ``pack-quantized`` INT4 (Kimi-K2-Thinking's experts)."""

from __future__ import annotations

import numpy as np

from colitools.formats import reference as ref
from colitools.formats.errors import FormatError
from colitools.formats.format_names import GROUP_SIZES
from colitools.formats.registry import writer_group_size
from colitools.formats.source_encodings import (
    Int4Scheme,
    NativeForm,
    Paired,
    Part,
    SourceEncoding,
    _decoders,
    _need,
    ceil,
    div,
)
from colitools.formats.source_encodings.compressed_tensors import PACK_QUANTIZED, _ct_scheme


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
