"""compressed-tensors ``mxfp4-pack-quantized`` (Kimi K3's routed experts)."""

from __future__ import annotations

import numpy as np

from colitools.formats import reference as ref
from colitools.formats.errors import FormatError
from colitools.formats.source_encodings import (
    Paired,
    Part,
    SourceEncoding,
    _decoders,
    _held_by_mxfp4,
    _keepable_e8m0,
    div,
)
from colitools.formats.source_encodings.compressed_tensors import MXFP4_PACK_QUANTIZED, _ct_scheme


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
