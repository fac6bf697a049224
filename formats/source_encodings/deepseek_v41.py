"""DeepSeek-V4(.1)'s UE8M0 encodings: FP8 with E8M0 tiles or row groups, and the FP4 routed experts."""

from __future__ import annotations

import numpy as np

from colitools.formats import model_config
from colitools.formats import reference as ref
from colitools.formats.errors import FormatError
from colitools.formats.source_encodings import (
    Fp8Scheme,
    NativeForm,
    Paired,
    Part,
    SourceEncoding,
    _decoders,
    _held_by_mxfp4,
    _keepable_e8m0,
    ceil,
    div,
)


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
