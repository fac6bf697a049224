"""safetensors dtype names <-> exact numpy dtypes (BF16 and FP8 through ml_dtypes, never a lossy path)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# name -> numpy dtype. Every dtype of docs/FORMATS.md §1; itemsize comes from the numpy dtype.
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}

_BY_NUMPY = {dt: name for name, dt in SAFETENSORS_DTYPES.items()}

FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"})


def itemsize(name: str) -> int:
    """Bytes per element of safetensors dtype ``name`` (KeyError if unknown)."""
    return SAFETENSORS_DTYPES[name].itemsize


def numpy_dtype(name: str) -> np.dtype:
    """The exact numpy dtype for safetensors dtype ``name`` (KeyError if unknown)."""
    return SAFETENSORS_DTYPES[name]


def safetensors_name(dtype: np.dtype) -> str:
    """The safetensors dtype name of a numpy dtype (KeyError if it has none)."""
    return _BY_NUMPY[np.dtype(dtype)]
