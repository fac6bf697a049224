"""MXFP8 (``mxfp8``, modelopt MXFP8, or ``fp8`` with ``[1, 32]`` E8M0 blocks: Inkling-2's expert stacks)."""

from __future__ import annotations

import numpy as np

from colitools.formats import model_config
from colitools.formats import reference as ref
from colitools.formats.source_encodings import (
    Paired,
    Part,
    SourceEncoding,
    _decoders,
    ceil,
)
from colitools.formats.source_encodings.deepseek_fp8 import Fp8Block


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
