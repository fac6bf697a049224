"""Source tensor -> float32 (docs/FORMATS.md §9).

* BF16 / F16 / F32 (and F64, which rounds): exact upcast (ml_dtypes for BF16, never a lossy path).
* FP8 block-scaled (DeepSeek-V3 convention): ``<name>`` F8_E4M3 ``[M, N]`` + ``<name>_scale_inv`` F32 or BF16
  ``[ceil(M/br), ceil(N/bc)]``, block ``[br, bc]`` from ``quantization_config.weight_block_size``;
  ``w[r, c] = f32(e4m3(q[r, c])) * f32(s[r // br, c // bc])`` (one float32 multiply, edge blocks partial).

* Natively quantized sources (MXFP4, INT4 ``pack-quantized``, NVFP4, MXFP8): the encodings of
  ``formats/source_encodings/`` (one class each) read ``quantization_config`` (``quant_scheme``), pair the
  companion tensors (the inventory) and decode them (the unit writer calls ``SourceEncoding.decode``).

The scale grid is validated before any data is read (``check_scale_grid``); an FP8 weight without its scale is
an error, never silently upcast without scaling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from colitools.formats.dtypes import numpy_dtype
from colitools.formats.errors import ConvertError
from colitools.formats.reference import ceil_div
from colitools.formats.source_encodings import (  # noqa: F401 (their home is the registry; named here too)
    DEFAULT_FP8_BLOCK,
    FP8_BLOCK,
    Fp8Scheme,
    Int4Scheme,
    QuantScheme,
    read_quant_config,
)

FLOAT_SOURCE_DTYPES = ("F32", "F16", "BF16", "F64")
FP8_SOURCE_DTYPES = FP8_BLOCK.part("data").dtypes  # ("F8_E4M3",)
SCALE_DTYPES = FP8_BLOCK.part("scale").dtypes  # ("F32", "BF16")
SCALE_SUFFIX = FP8_BLOCK.part("scale").suffix  # "_scale_inv"


def quant_scheme(config: Mapping[str, Any]) -> QuantScheme:
    """The source quantization declared by ``config.json`` (method None when there is none): each registered
    source encoding reads its own ``quant_method`` (``formats.source_encodings.read_quant_config``); any other
    ``quant_method`` (or an unsupported variant of one) is refused, naming it, before work starts."""
    return read_quant_config(config)


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


def is_fp8(values: np.ndarray, scale: np.ndarray | None) -> bool:
    """Whether ``values`` are FP8 (e4m3fn) codes: that dtype, or raw bytes that come with a scale."""
    return values.dtype == numpy_dtype("F8_E4M3") or (scale is not None and values.dtype == np.uint8)


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
    if is_fp8(values, scale):
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
        return FP8_BLOCK.decode({"data": values, "scale": scale}, *values.shape, block=block, fast=False)
    if scale is not None:
        raise ConvertError(f"tensor {name}: a scale was given for a {dtype} tensor")
    if dtype not in (np.float32, np.float16, np.float64, numpy_dtype("BF16")):
        raise ConvertError(
            f"tensor {name}: source dtype {dtype} cannot be converted (float or FP8 weights only)"
        )
    return np.ascontiguousarray(values, dtype=np.float32)
