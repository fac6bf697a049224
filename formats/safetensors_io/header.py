"""What the safetensors reader and writer share: the header's limits, its length field, and ``TensorInfo``.

docs/FORMATS.md §1. The byte arithmetic of one tensor (``checked_nbytes``) lives here so that the reader's
validation and the writer's planning can never disagree about a size.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from colitools.formats.dtypes import itemsize

__all__ = [
    "ALIGNMENT",
    "LENGTH",
    "MAX_HEADER_BYTES",
    "MAX_TENSOR_BYTES",
    "METADATA_KEY",
    "TensorInfo",
    "checked_nbytes",
    "little_endian",
]

MAX_HEADER_BYTES = 100_000_000
"""Largest header (the JSON part, ``N``) a reader accepts and a writer produces."""

ALIGNMENT = 4096
"""Writers pad the header so that the data buffer starts at a multiple of this (``(8 + N) % 4096 == 0``)."""

MAX_TENSOR_BYTES = 2**63 - 1
"""Largest byte count of one tensor (and of any byte offset) we accept: the range of a signed 64-bit offset."""

METADATA_KEY = "__metadata__"
"""The header key of the string-to-string metadata map; no tensor may have this name."""

LENGTH = struct.Struct("<Q")
"""The 8-byte little-endian header length ``N`` that starts every file."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in a safetensors file. ``begin``/``end`` are absolute file offsets."""

    name: str
    dtype: str  # safetensors dtype name, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int  # absolute byte offset of the tensor data in the file
    end: int  # absolute, exclusive

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (``end - begin``)."""
        return self.end - self.begin


def checked_nbytes(shape: Sequence[int], dtype: str) -> int | None:
    """``numel(shape) * itemsize(dtype)``, or None if any intermediate product exceeds 2**63 - 1 bytes.

    Checked on the running product so that a hostile shape cannot make us multiply huge integers. Like the
    reference implementation (a checked multiply over the dims), an intermediate overflow is an error even if a
    later dimension is 0.
    """
    total = itemsize(dtype)
    for dim in shape:
        total *= dim
        if total > MAX_TENSOR_BYTES:
            return None
    return total


def little_endian(dtype: np.dtype) -> np.dtype:
    """``dtype`` with little-endian byte order (unchanged for byte-sized and order-less dtypes).

    safetensors data is little-endian; arrays are read and written as little-endian.
    """
    return dtype.newbyteorder("<")
