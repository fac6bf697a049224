"""ShardReader's slab reads (converters/unit_writer.py): rows ``[r0, r1)`` of one expert's slab of a stack, against
numpy slicing of the same array saved by the safetensors package."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from colitools.converters import unit_writer as uw
from colitools.errors import ConvertError


class Part:
    def __init__(self, name, dtype, shape):
        self.shard, self.name, self.dtype, self.shape = "s.safetensors", name, dtype, tuple(shape)


@pytest.fixture
def shard(tmp_path):
    rng = np.random.default_rng(7)
    arrays = {
        # an MXFP4 blocks stack [E, rows, B, 16]
        "blocks": rng.integers(0, 256, (3, 2600, 2, 16), dtype=np.uint8),
        "w": rng.standard_normal((2, 7, 5)).astype(np.float32),
        "tail": np.arange(4, dtype=np.int64),
    }
    path = tmp_path / "s.safetensors"
    save_file(arrays, str(path))
    return path, arrays


@pytest.mark.parametrize(
    ("name", "dtype", "e", "r0", "r1"),
    [
        ("blocks", "U8", 1, 0, 1300),  # the gate half of a non-interleaved gate / up stack
        ("blocks", "U8", 2, 1300, 2600),  # its up half, from the last slab
        ("blocks", "U8", 0, 3, 2051),
        ("blocks", "U8", 1, 9, 9),  # none
        ("w", "F32", 1, 1, 7),
        ("w", "F32", 0, 0, 7),
    ],
)
def test_read_slab_rows_equals_numpy_slicing(shard, name, dtype, e, r0, r1):
    path, arrays = shard
    a = arrays[name]
    reader = uw.ShardReader({"s.safetensors": path})
    try:
        got = reader.read_slab_rows(Part(name, dtype, a.shape), e, r0, r1)
    finally:
        reader.close()
    want = a[e, r0:r1]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want)


def test_read_slab_rows_of_a_truncated_shard_names_the_tensor(shard):
    path, arrays = shard
    a = arrays["blocks"]
    reader = uw.ShardReader({"s.safetensors": path})
    try:
        reader.read_slab_rows(Part("w", "F32", arrays["w"].shape), 0, 0, 1)  # the header is read and kept
        size = path.stat().st_size
        with open(path, "r+b") as fh:  # the shard shrinks behind the reader's back
            fh.truncate(size - 200_000)
        with pytest.raises(ConvertError, match=r"tensor blocks: .*s\.safetensors: unexpected end of file at byte \d+"):
            reader.read_slab_rows(Part("blocks", "U8", a.shape), 2, 0, 2600)
    finally:
        reader.close()
