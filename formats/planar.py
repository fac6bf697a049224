"""The ``planar64-v8`` code order for int4 expert tensors (docs/FORMATS.md §4).

Same bytes per row as "pairs", ordered in 64-element blocks of 32 bytes: byte ``k`` of a block holds element
``k`` in its low nibble and element ``k + 32`` in its high nibble (both ``v + 8``). Requires ``I % 64 == 0``.
"""

from __future__ import annotations

import numpy as np

from colitools.formats.errors import FormatError
from colitools.formats.layouts import PLANAR

PLANAR_LAYOUT = PLANAR.stored
PLANAR_BLOCK = 64


def _check(codes: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.ndim != 2 or (2 * codes.shape[1]) % PLANAR_BLOCK:
        raise FormatError(f"planar64-v8 needs int4 codes [O, I/2] with I % 64 == 0, got shape {list(codes.shape)}")
    return codes


def _nibbles(codes: np.ndarray) -> np.ndarray:
    u = np.empty((codes.shape[0], codes.shape[1] * 2), dtype=np.uint8)
    u[:, 0::2] = codes & 0x0F
    u[:, 1::2] = codes >> 4
    return u


def pairs_to_planar(codes: np.ndarray) -> np.ndarray:
    """Reorder pair-packed int4 codes ``[O, I/2]`` into planar64 order (same shape)."""
    codes = _check(codes)
    O, rb = codes.shape
    u = _nibbles(codes).reshape(O, -1, 2, 32)  # [O, blocks, half, k]
    return (u[:, :, 0, :] | (u[:, :, 1, :] << 4)).astype(np.uint8).reshape(O, rb)


def planar_to_pairs(codes: np.ndarray) -> np.ndarray:
    """Inverse of ``pairs_to_planar``."""
    codes = _check(codes)
    O, rb = codes.shape
    b = codes.reshape(O, -1, 32)
    u = np.concatenate([b & 0x0F, b >> 4], axis=2).reshape(O, -1)  # elements in order
    return (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
