"""compressed-tensors ``float-quantized`` FP8, one scale per output row or per tensor (Llama-4's FP8 release)."""

from __future__ import annotations

from colitools.formats import reference as ref
from colitools.formats.errors import ConfigError
from colitools.formats.source_encodings import (
    Paired,
    Part,
    SourceEncoding,
)
from colitools.formats.source_encodings.compressed_tensors import FLOAT_QUANTIZED, _ct_weights


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
