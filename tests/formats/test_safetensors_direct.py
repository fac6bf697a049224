"""Reads around the page cache (``SafetensorsFile(direct=True)``, formats/safetensors_io/direct.py): the same bytes
as the file holds (files written by the upstream ``safetensors`` package, compared with the arrays written), page
cache state observed with the kernel's own ``cachestat``, descriptors counted in /proc/self/fd."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from colitools.formats.errors import SafetensorsError
from colitools.formats.safetensors_io import SafetensorsFile, direct


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (written back first: dirty pages cannot be dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def offsets(path: Path) -> dict[str, tuple[int, int]]:
    """Absolute ``(begin, end)`` of every tensor, from the header parsed here (8-byte length, JSON)."""
    with open(path, "rb") as fh:  # the header only: the data's pages stay as they are
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in header.items()
            if k != "__metadata__"}  # fmt: skip


def cached(path: Path, begin: int, end: int) -> bool | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return direct.cached(fd, begin, end - begin)
    finally:
        os.close(fd)


@pytest.fixture
def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "a_small": rng.standard_normal(250).astype(np.float32),  # 1000 bytes: below DIRECT_MIN, buffered
        "b_big": rng.standard_normal((1000, 1000)).astype(ml_dtypes.bfloat16),  # 2 MB
        "c_last": rng.integers(0, 255, 700_001, dtype=np.uint8),  # ends the file off a 4 KiB block
    }


@pytest.fixture
def shard(tmp_path, arrays) -> Path:
    path = tmp_path / "s.safetensors"
    save_file({k: (v.view(np.uint16) if v.dtype == ml_dtypes.bfloat16 else v) for k, v in arrays.items()},
              str(path))  # fmt: skip  (bf16 bits written as U16: the upstream numpy writer has no bfloat16)
    if cached(path, 0, path.stat().st_size) is None:
        pytest.skip("this kernel cannot say what the page cache holds (no cachestat): reads stay buffered")
    fd = direct.open_direct(path)
    if fd is None:
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT: reads stay buffered")
    os.close(fd)
    evict(path)
    return path


def test_an_evicted_range_is_read_around_the_page_cache_with_the_same_bytes(shard, arrays):
    where = offsets(shard)
    b0, b1 = where["b_big"]
    assert (b0 % 8, b1 - b0 >= direct.DIRECT_MIN, b0 % direct.ALIGN != 0) == (0, True, True)
    assert cached(shard, b0, b1) is False
    with SafetensorsFile(shard, direct=True) as f:
        got = f.read_range(b0, b1 - b0)
        assert got.ctypes.data % 8 == 0 and got.flags.writeable
        assert got.tobytes() == arrays["b_big"].tobytes()
        assert cached(shard, b0, b1) is False  # read around the page cache: not one page of it kept whole
        assert f.read_range(b0 + 8, 4096).tobytes() == arrays["b_big"].tobytes()[8 : 8 + 4096]  # small: buffered
        last = f.read_range(*where["c_last"][:1], where["c_last"][1] - where["c_last"][0])
        assert last.tobytes() == arrays["c_last"].tobytes()  # up to the file's last byte, off a block boundary


def test_the_same_reader_without_direct_fills_the_page_cache(shard, arrays):
    b0, b1 = offsets(shard)["b_big"]
    with SafetensorsFile(shard) as f:
        assert f.read_range(b0, b1 - b0).tobytes() == arrays["b_big"].tobytes()
    assert cached(shard, b0, b1) is True  # what the direct test above shows is not the reader's doing anyway


def test_a_cached_range_is_copied_from_the_page_cache_and_no_direct_descriptor_opened(shard, arrays):
    shard.read_bytes()  # every page cached
    before = len(os.listdir("/proc/self/fd"))
    with SafetensorsFile(shard, direct=True) as f:
        b0, b1 = offsets(shard)["b_big"]
        assert f.read_range(b0, b1 - b0).tobytes() == arrays["b_big"].tobytes()
        assert len(os.listdir("/proc/self/fd")) == before + 1  # the reader's own descriptor only


def test_close_releases_both_descriptors(shard, arrays):
    before = len(os.listdir("/proc/self/fd"))
    f = SafetensorsFile(shard, direct=True)
    b0, b1 = offsets(shard)["b_big"]
    f.read_range(b0, b1 - b0)
    assert len(os.listdir("/proc/self/fd")) == before + 2
    f.close()
    assert len(os.listdir("/proc/self/fd")) == before
    # a read after close reopens (and checks) the file, as a buffered reader does
    assert f.read_range(b0, b1 - b0).tobytes() == arrays["b_big"].tobytes()
    f.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_file_that_shrank_behind_a_direct_read_is_one_line_naming_it_and_the_byte(shard):
    where = offsets(shard)
    with SafetensorsFile(shard, direct=True) as f:
        f.read_range(where["b_big"][0], 4 * direct.DIRECT_MIN)  # the direct descriptor is open
        c0, c1 = where["c_last"]
        cut = c0 + 300_001  # inside the last tensor, off a block boundary
        os.truncate(shard, cut)
        evict(shard)
        with pytest.raises(SafetensorsError) as err:
            f.read_range(c0, c1 - c0)
    msg = str(err.value)
    assert msg == f"{shard}: unexpected end of file at byte {cut} (the file shrank after its header was read)"


def test_threads_sharing_a_reader_open_one_direct_descriptor(shard, arrays):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    b0, b1 = offsets(shard)["b_big"]
    before = len(os.listdir("/proc/self/fd"))
    f = SafetensorsFile(shard, direct=True)
    start = threading.Barrier(8)
    step = (b1 - b0) // 8 // 8 * 8

    def part(i: int) -> bytes:
        start.wait()  # all at once: each finds no direct descriptor yet
        return f.read_range(b0 + i * step, step).tobytes()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(part, range(8)))
    assert b"".join(got) == arrays["b_big"].tobytes()[: 8 * step]
    assert len(os.listdir("/proc/self/fd")) == before + 2
    f.close()
    assert len(os.listdir("/proc/self/fd")) == before
