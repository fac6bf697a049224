"""gpt-oss's MXFP4 weights and expert stacks (``_blocks`` / ``_scales``)."""

from __future__ import annotations

from colitools.formats import names
from colitools.formats import reference as ref
from colitools.formats.source_encodings import (
    Paired,
    Part,
    SourceEncoding,
    _decoders,
    _held_by_mxfp4,
    _keepable_e8m0,
    _need,
    div,
)


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
