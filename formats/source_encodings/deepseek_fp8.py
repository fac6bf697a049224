"""DeepSeek-V3's FP8 block-scaled weights (``_scale_inv``): registered, not paired (the converter carries
their scale as ``SourceTensor.scale``)."""

from __future__ import annotations

from colitools.formats import model_config
from colitools.formats import reference as ref
from colitools.formats.errors import ConfigError
from colitools.formats.source_encodings import (
    DEFAULT_FP8_BLOCK,
    Fp8Scheme,
    NativeForm,
    Paired,
    Part,
    SourceEncoding,
    _decoders,
    ceil,
)


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
