"""modelopt NVFP4."""

from __future__ import annotations

from colitools.formats import reference as ref
from colitools.formats.errors import FormatError
from colitools.formats.source_encodings import (
    Paired,
    Part,
    SourceEncoding,
    _decoders,
    _nbytes,
    ceil,
    div,
)


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
