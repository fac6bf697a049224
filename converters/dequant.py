"""Source tensor -> float32 (docs/FORMATS.md §9).

* BF16 / F16 / F32 (and F64, which rounds): exact upcast (ml_dtypes for BF16, never a lossy path).
* FP8 block-scaled (DeepSeek-V3 convention): ``<name>`` F8_E4M3 ``[M, N]`` + ``<name>_scale_inv`` F32 or BF16
  ``[ceil(M/br), ceil(N/bc)]``, block ``[br, bc]`` from ``quantization_config.weight_block_size``;
  ``w[r, c] = f32(e4m3(q[r, c])) * f32(s[r // br, c // bc])`` (one float32 multiply, edge blocks partial).

* Natively quantized sources (MXFP4, INT4 ``pack-quantized``, NVFP4, MXFP8): ``quant_scheme`` reads
  ``quantization_config``; the inventory pairs the companion tensors; ``decode_native`` decodes them through the
  fast kernels (``formats/kernels/decoders.py``), bit-identical to ``formats/reference.py``.

The scale grid is validated before any data is read (``check_scale_grid``); an FP8 weight without its scale is
an error, never silently upcast without scaling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.errors import ConvertError
from colitools.formats import model_config
from colitools.formats.dtypes import numpy_dtype
from colitools.formats.reference import ceil_div, dequant_fp8_block

FLOAT_SOURCE_DTYPES = ("F32", "F16", "BF16", "F64")
FP8_SOURCE_DTYPES = ("F8_E4M3",)
SCALE_DTYPES = ("F32", "BF16")
SCALE_SUFFIX = "_scale_inv"
DEFAULT_FP8_BLOCK = (128, 128)


@dataclass(frozen=True)
class Fp8Scheme:
    """The FP8 block scaling of a source (``quantization_config``): scale block ``(rows, cols)``."""

    block: tuple[int, int] = DEFAULT_FP8_BLOCK


# Natively quantized source encodings (§5): the kind names carried by paired source tensors.
MXFP4 = "mxfp4"  # gpt-oss <base>_blocks + <base>_scales
INT4 = "int4"  # compressed-tensors pack-quantized weight_packed / weight_scale / weight_shape
NVFP4 = "nvfp4"  # modelopt <name> U8 + <name>_scale F8_E4M3 + <name>_scale_2 F32
MXFP8 = "mxfp8"  # <name> F8_E4M3 + <name>_scale U8 (E8M0)
KNOWN_QUANT_METHODS = ("fp8", "mxfp4", "compressed-tensors", "modelopt", "mxfp8")


@dataclass(frozen=True)
class Int4Scheme:
    """compressed-tensors ``pack-quantized`` weights: group size (None: from the scale grid), symmetric, act
    order (``actorder`` set: the columns are permuted by ``weight_g_idx``)."""

    group_size: int | None = None
    symmetric: bool = True
    actorder: bool = False


@dataclass(frozen=True)
class QuantScheme:
    """``quantization_config`` as colitools reads it: the method, its FP8 block scheme (fp8) and INT4 scheme
    (compressed-tensors)."""

    method: str | None
    fp8: Fp8Scheme | None = None
    int4: Int4Scheme | None = None


def quant_scheme(config: Mapping[str, Any]) -> QuantScheme:
    """The source quantization declared by ``config.json`` (method None when there is none).

    ``fp8`` (fmt e4m3), ``mxfp4``, ``compressed-tensors`` (format ``pack-quantized``, 4-bit int weights),
    ``modelopt`` (quant_algo NVFP4) and ``mxfp8`` are understood; any other ``quant_method`` (or an unsupported
    variant of these) is refused, naming it, before work starts."""
    qc = model_config.quantization_config(config)
    if qc is None:
        return QuantScheme(None)
    method = qc.get("quant_method")
    if method == "fp8":
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ConvertError(f"config.json: quantization_config.fmt {fmt!r} is not supported (only 'e4m3')")
        return QuantScheme("fp8", fp8=Fp8Scheme(model_config.fp8_block_size(config) or DEFAULT_FP8_BLOCK))
    if method in ("mxfp4", "mxfp8"):
        return QuantScheme(method)
    if method == "modelopt":
        algo = qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo")
        if algo not in ("NVFP4", "MXFP8"):
            raise ConvertError(
                f"config.json: quantization_config.quant_algo {algo!r} of quant_method 'modelopt' is not "
                "supported (only 'NVFP4', 'MXFP8')"
            )
        return QuantScheme(method)
    if method == "compressed-tensors":
        return QuantScheme(method, int4=_int4_scheme(qc))
    raise ConvertError(
        f"config.json: quantization_config.quant_method {method!r} is not supported "
        f"(supported: {', '.join(KNOWN_QUANT_METHODS)})"
    )


def _int4_scheme(qc: Mapping[str, Any]) -> Int4Scheme:
    """The INT4 weight scheme of a compressed-tensors config (one ``config_groups`` scheme for its weights)."""
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    schemes = [g for g in groups.values() if isinstance(g, Mapping) and g.get("weights")]
    formats = {fmt, *(g.get("format") for g in schemes)} - {None}
    if formats - {"pack-quantized"}:
        raise ConvertError(
            "config.json: quantization_config.format "
            f"{sorted(formats - {'pack-quantized'})[0]!r} of quant_method 'compressed-tensors' is not supported "
            "(only 'pack-quantized')"
        )
    if not schemes:
        return Int4Scheme()
    weights = [g["weights"] for g in schemes]
    for w in weights:
        if w.get("num_bits") != 4 or w.get("type", "int") != "int":
            raise ConvertError(
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


def fp8_scheme(config: Mapping[str, Any]) -> Fp8Scheme | None:
    """The FP8 scheme declared by ``config.json`` (``quant_method: fp8``), or None. Refuses an unknown
    ``quant_method`` like ``quant_scheme`` (a natively quantized method has no FP8 scheme)."""
    return quant_scheme(config).fp8


def scale_name(weight: str) -> str:
    """Name of the FP8 scale tensor of ``weight`` (``<name>_scale_inv``)."""
    return weight + SCALE_SUFFIX


def expected_scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """Scale grid of an FP8 weight of ``shape``: ceil grid over the last two dims (leading dims kept, for fused
    expert tensors)."""
    *lead, M, N = shape
    return (*lead, ceil_div(M, block[0]), ceil_div(N, block[1]))


def check_scale_grid(
    name: str,
    shape: tuple[int, ...],
    scale: str,
    scale_dtype: str,
    scale_shape: tuple[int, ...],
    block: tuple[int, int],
) -> None:
    """Refuse a scale tensor whose dtype or grid does not fit weight ``name`` (ConvertError naming both)."""
    if scale_dtype not in SCALE_DTYPES:
        raise ConvertError(f"tensor {scale}: scale dtype {scale_dtype} is not F32 or BF16 (scale of {name})")
    want = expected_scale_shape(shape, block)
    if tuple(scale_shape) != want:
        raise ConvertError(
            f"tensor {scale}: scale grid {list(scale_shape)} does not match weight {name} {list(shape)} with "
            f"{block[0]}x{block[1]} blocks (expected {list(want)})"
        )


def check_source_dtype(name: str, dtype: str, has_scale: bool) -> None:
    """Refuse dtypes colitools cannot dequantize, and an FP8 weight without its ``_scale_inv``."""
    if dtype in FP8_SOURCE_DTYPES:
        if not has_scale:
            raise ConvertError(f"tensor {name}: FP8 weight without its scale tensor {scale_name(name)}")
        return
    if dtype not in FLOAT_SOURCE_DTYPES:
        raise ConvertError(
            f"tensor {name}: source dtype {dtype} cannot be converted (float or FP8 weights only)"
        )


def to_float32(
    name: str,
    values: np.ndarray,
    *,
    scale: np.ndarray | None = None,
    block: tuple[int, int] | None = None,
) -> np.ndarray:
    """Dequantize one source tensor (or a 2-D slab of one) to float32.

    ``values`` has its exact source dtype (ml_dtypes for BF16/F8, or raw ``uint8`` for F8 bytes). FP8 needs
    ``scale`` with the ceil grid of ``block``."""
    dtype = values.dtype
    is_fp8 = dtype == numpy_dtype("F8_E4M3") or (scale is not None and dtype == np.uint8)
    if is_fp8:
        if scale is None or block is None:
            raise ConvertError(f"tensor {name}: FP8 weight without its scale tensor {scale_name(name)}")
        if values.ndim != 2:
            raise ConvertError(f"tensor {name}: FP8 dequant needs a 2-D slab, got shape {list(values.shape)}")
        want = expected_scale_shape(values.shape, block)
        if tuple(scale.shape) != want:
            raise ConvertError(
                f"tensor {name}: scale grid {list(scale.shape)} does not match {list(values.shape)} "
                f"with {block[0]}x{block[1]} blocks (expected {list(want)})"
            )
        return dequant_fp8_block(values, scale, block)
    if scale is not None:
        raise ConvertError(f"tensor {name}: a scale was given for a {dtype} tensor")
    if dtype not in (np.float32, np.float16, np.float64, numpy_dtype("BF16")):
        raise ConvertError(
            f"tensor {name}: source dtype {dtype} cannot be converted (float or FP8 weights only)"
        )
    return np.ascontiguousarray(values, dtype=np.float32)


def decode_native(kind: str, parts: Mapping[str, np.ndarray], O: int, I: int, group: int) -> np.ndarray:
    """Decode one ``[O, I]`` tensor (or expert slab) of natively quantized ``kind`` to float32 with the fast
    kernels. ``parts``: ``data`` and ``scale`` (and ``scale_2`` for NVFP4), already cut to the tensor's rows."""
    from colitools.formats.kernels import decoders as dec

    data, scale = parts["data"], parts["scale"]
    if kind == MXFP4:
        return dec.decode_mxfp4_blocks(data.reshape(O, I // 32, 16), scale.reshape(O, I // 32))
    if kind == INT4:
        return dec.decode_pack_quantized(data.reshape(O, -1), scale.reshape(O, -1), I, group)
    if kind == NVFP4:
        return dec.decode_nvfp4(data.reshape(O, -1), scale.reshape(O, -1), parts["scale_2"], I)
    if kind == MXFP8:
        return dec.decode_mxfp8(data.reshape(O, I), scale.reshape(O, -1), I)
    raise ConvertError(f"unknown native source kind {kind!r}")  # pragma: no cover
