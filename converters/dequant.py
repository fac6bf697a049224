"""Source tensor -> float32 (FORMATS-SPEC §5).

* BF16 / F16 / F32 (and F64, which rounds): exact upcast (ml_dtypes for BF16, never a lossy path).
* FP8 block-scaled (DeepSeek-V3 convention): ``<name>`` F8_E4M3 ``[M, N]`` + ``<name>_scale_inv`` F32 or BF16
  ``[ceil(M/br), ceil(N/bc)]``, block ``[br, bc]`` from ``quantization_config.weight_block_size``;
  ``w[r, c] = f32(e4m3(q[r, c])) * f32(s[r // br, c // bc])`` (one float32 multiply, edge blocks partial).

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
from colitools.formats.errors import ConfigError
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


def fp8_scheme(config: Mapping[str, Any]) -> Fp8Scheme | None:
    """The FP8 scheme declared by ``config.json``'s ``quantization_config``, or None when there is none.

    Only ``quant_method: fp8`` with ``fmt: e4m3`` (or no fmt) is understood; any other quantization method is
    refused (the source is already quantized in a way colitools cannot read). The block is the config facts'
    ``fp8_block_size`` (``quantization_config.weight_block_size``, default 128 x 128)."""
    try:
        qc = model_config.quantization_config(config)
        if qc is None:
            return None
        method = qc.get("quant_method")
        if method != "fp8":
            raise ConvertError(
                f"config.json: quantization_config.quant_method {method!r} is not supported (only 'fp8')"
            )
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ConvertError(f"config.json: quantization_config.fmt {fmt!r} is not supported (only 'e4m3')")
        return Fp8Scheme(model_config.fp8_block_size(config) or DEFAULT_FP8_BLOCK)
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None


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
