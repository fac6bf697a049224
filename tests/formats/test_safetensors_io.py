"""safetensors container I/O (docs/FORMATS.md §1): round trips, conformance with the `safetensors` library, the
reader's validation list (one test per malformed case, raw bytes crafted by hand) and the writer's
publish-or-nothing guarantee."""

from __future__ import annotations

import errno
import json
import os
import struct
import tracemalloc
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError, deserialize, safe_open
from safetensors.numpy import save_file

from colitools.formats.dtypes import SAFETENSORS_DTYPES, numpy_dtype
from colitools.formats.errors import ColitoolsError, SafetensorsError
from colitools.formats.safetensors_io import (
    ALIGNMENT,
    MAX_HEADER_BYTES,
    SafetensorsFile,
    SafetensorsWriter,
    TensorInfo,
    coalesce_ranges,
    read_header,
    write_safetensors,
)
from colitools.formats.safetensors_io import writer as writer_module

ALL_DTYPES = sorted(SAFETENSORS_DTYPES)
# dtypes that safe_open(framework="numpy") can materialise (it has no bfloat16 / float8 in numpy).
NUMPY_NATIVE_DTYPES = ["BOOL", "F16", "F32", "F64", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"]


# --------------------------------------------------------------------------------------------------------------
# helpers


def random_array(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random bytes viewed as ``dtype``: for float dtypes this includes NaN/inf bit patterns."""
    dt = numpy_dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    if dtype == "BOOL":
        raw %= 2
    return raw.view(dt).reshape(shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality (NaN payloads included) of dtype, shape and bytes."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))
    )


def craft(
    tmp_path: Path,
    header: dict | str | bytes,
    data: bytes = b"",
    *,
    length: int | None = None,
    name: str = "crafted.safetensors",
) -> Path:
    """A safetensors file made by hand: 8-byte LE length, header bytes, data (no validation at all)."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    path = tmp_path / name
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def rejected(path: Path, *fragments: str) -> str:
    """Open ``path``; assert a one-line SafetensorsError naming the file and every fragment."""
    with pytest.raises(SafetensorsError) as caught:
        SafetensorsFile(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# --------------------------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_round_trip_of_every_dtype_is_bit_exact(tmp_path, dtype):
    arrays = {"t.weight": random_array(dtype, (3, 5), seed=1), "t.scalar": random_array(dtype, (), seed=2)}
    path = tmp_path / "rt.safetensors"
    write_safetensors(path, arrays)
    with SafetensorsFile(path) as f:
        assert {n: (i.dtype, i.shape) for n, i in f.tensors.items()} == {
            "t.weight": (dtype, (3, 5)),
            "t.scalar": (dtype, ()),
        }
        for name, array in arrays.items():
            assert same_bits(f.read(name), array)
            assert f.read_bytes(name) == array.tobytes()


@pytest.mark.parametrize(
    ("dtype", "bits"),
    [
        # NaNs with payloads, +-inf, denormal, -0
        ("BF16", [0x7FC0, 0x7FC1, 0xFF81, 0x7F80, 0xFF80, 0x0001, 0x8000]),
        ("F8_E4M3", [0x7F, 0xFF, 0x7E, 0x01, 0x80]),  # e4m3fn: both NaNs, max 448, denormal, -0
        ("F8_E5M2", [0x7D, 0xFE, 0x7C, 0xFC, 0x01]),  # NaNs, +-inf, denormal
        ("F8_E8M0", [0xFF, 0x00, 0x7F, 0xFE]),  # NaN, 2**-127, 1.0, 2**127
    ],
)
def test_bf16_and_f8_special_bit_patterns_survive_unchanged(tmp_path, dtype, bits):
    raw_dtype = np.uint16 if dtype == "BF16" else np.uint8
    array = np.array(bits, dtype=raw_dtype).view(numpy_dtype(dtype))
    path = tmp_path / "special.safetensors"
    write_safetensors(path, {"x": array})
    got = SafetensorsFile(path).read("x")
    assert got.dtype == numpy_dtype(dtype)
    assert np.array_equal(got.view(np.uint8), array.view(np.uint8))


def test_f8_and_bf16_decode_to_exact_values(tmp_path):
    values = np.array([1.0, -2.5, 448.0, 0.015625], dtype=np.float32)
    arrays = {
        "bf": values.astype(ml_dtypes.bfloat16),
        "e4": values.astype(ml_dtypes.float8_e4m3fn),
        "e8": np.array([1.0, 0.5, 2.0**100], dtype=np.float32).astype(ml_dtypes.float8_e8m0fnu),
    }
    path = tmp_path / "exact.safetensors"
    write_safetensors(path, arrays)
    f = SafetensorsFile(path)
    np.testing.assert_array_equal(f.read("bf").astype(np.float32), values)
    np.testing.assert_array_equal(f.read("e4").astype(np.float32), values)
    np.testing.assert_array_equal(f.read("e8").astype(np.float32), [1.0, 0.5, 2.0**100])


def test_zero_size_tensors_and_a_file_without_tensors_round_trip(tmp_path):
    arrays = {
        "empty": np.zeros((0, 7), np.float32),
        "between": np.arange(3, dtype=np.int16),
        "also_empty": np.zeros((4, 0), ml_dtypes.bfloat16),
    }
    path = tmp_path / "zero.safetensors"
    write_safetensors(path, arrays)
    f = SafetensorsFile(path)
    for name, array in arrays.items():
        assert same_bits(f.read(name), array)
    assert same_bits(f.read_many(["also_empty", "empty"])["empty"], arrays["empty"])

    empty = tmp_path / "nothing.safetensors"
    write_safetensors(empty, {}, metadata={"k": "v"})
    g = SafetensorsFile(empty)
    assert g.tensors == {} and g.metadata == {"k": "v"} and g.file_size == ALIGNMENT


def test_read_returns_a_writable_array_of_its_own(tmp_path):
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"a": np.arange(4, dtype=np.float32)})
    f = SafetensorsFile(path)
    a = f.read("a")
    a[0] = 42
    assert f.read("a")[0] == 0


_names = st.text(min_size=0, max_size=6).filter(lambda s: s != "__metadata__")
_entries = st.lists(
    st.tuples(_names, st.sampled_from(ALL_DTYPES), st.lists(st.integers(0, 4), max_size=3).map(tuple)),
    max_size=5,
    unique_by=lambda e: e[0],
)


@settings(max_examples=40, deadline=None)
@given(entries=_entries, metadata=st.none() | st.dictionaries(_names, st.text(max_size=6), max_size=3))
def test_any_written_file_reads_back_identically_and_parses_with_the_reference(
    tmp_path_factory, entries, metadata
):
    directory = tmp_path_factory.mktemp("prop")
    path = directory / "p.safetensors"
    arrays = {name: random_array(dtype, shape, seed=i) for i, (name, dtype, shape) in enumerate(entries)}
    with SafetensorsWriter(path, entries, metadata) as writer:
        for name, array in arrays.items():
            writer.write(name, array)
    assert path.stat().st_size == SafetensorsWriter.file_size(entries, metadata)
    f = SafetensorsFile(path)
    assert list(f.tensors) == [name for name, *_ in entries if name in f.tensors]
    assert f.metadata == (metadata or {})
    assert f.data_start % ALIGNMENT == 0
    for name, array in arrays.items():
        assert same_bits(f.read(name), array)
    reference = dict(deserialize(path.read_bytes()))
    assert set(reference) == set(arrays)
    for (name, dtype, shape), array in zip(entries, arrays.values(), strict=True):
        assert reference[name]["dtype"] == dtype
        assert tuple(reference[name]["shape"]) == shape
        assert bytes(reference[name]["data"]) == array.tobytes()


# --------------------------------------------------------------------------------------------------------------
# conformance with the safetensors library


def test_written_files_load_with_safetensors_safe_open(tmp_path):
    arrays = {
        f"m.{dt.lower()}": random_array(dt, (2, 3, 4), seed=i) for i, dt in enumerate(NUMPY_NATIVE_DTYPES)
    }
    metadata = {"colitools.shapes": "{}", "format": "pt", "ünïcode": "välue"}
    path = tmp_path / "conf.safetensors"
    write_safetensors(path, arrays, metadata)
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == metadata
        assert sorted(f.keys()) == sorted(arrays)
        for name, array in arrays.items():
            assert same_bits(f.get_tensor(name), array)


@pytest.mark.parametrize("dtype", sorted(set(ALL_DTYPES) - set(NUMPY_NATIVE_DTYPES)))
def test_written_bf16_and_f8_files_open_with_safe_open_and_match_the_reference_parser(tmp_path, dtype):
    array = random_array(dtype, (5, 3))
    path = tmp_path / "conf8.safetensors"
    write_safetensors(path, {"w": array}, {"k": "v"})
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"k": "v"}
        assert f.get_slice("w").get_dtype() == dtype
        assert f.get_slice("w").get_shape() == [5, 3]
    ((name, ref),) = deserialize(path.read_bytes())
    assert (name, ref["dtype"], ref["shape"], bytes(ref["data"])) == ("w", dtype, [5, 3], array.tobytes())


def test_reader_reads_files_written_by_safetensors_save_file(tmp_path):
    arrays = {f"t{i}": random_array(dt, (3, i + 1), seed=i) for i, dt in enumerate(NUMPY_NATIVE_DTYPES)}
    path = tmp_path / "reference.safetensors"
    save_file(arrays, path, metadata={"a": "b"})
    with SafetensorsFile(path) as f:
        assert f.data_start % ALIGNMENT != 0  # the reference writer only pads to 8 bytes
        assert f.metadata == {"a": "b"}
        assert set(f.tensors) == set(arrays)
        for name, array in arrays.items():
            assert same_bits(f.read(name), array)
        many = f.read_many(list(arrays))
        assert all(same_bits(many[name], array) for name, array in arrays.items())


# --------------------------------------------------------------------------------------------------------------
# writer layout


def test_header_is_compact_metadata_first_space_padded_offsets_in_write_order(tmp_path):
    path = tmp_path / "layout.safetensors"
    arrays = {"z": np.ones(3, np.float32), "a": np.ones(2, np.uint8), "m": np.ones((2, 2), np.int64)}
    write_safetensors(path, arrays, {"key": "value"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % ALIGNMENT == 0
    text = raw[8 : 8 + n].decode()
    body = text.rstrip(" ")
    assert set(text[len(body) :]) <= {" "}
    assert body == (
        '{"__metadata__":{"key":"value"},'
        '"z":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},'
        '"a":{"dtype":"U8","shape":[2],"data_offsets":[12,14]},'
        '"m":{"dtype":"I64","shape":[2,2],"data_offsets":[14,46]}}'
    )
    assert len(raw) == 8 + n + 46
    f = SafetensorsFile(path)
    assert list(f.tensors) == ["z", "a", "m"]
    assert f.header_bytes == raw[: 8 + n]
    assert f.data_start == 8 + n == ALIGNMENT


def test_header_needing_no_padding_is_not_padded_to_the_next_page(tmp_path):
    # Grow a metadata value until the compact JSON is exactly 4096 - 8 bytes long.
    base = len(json.dumps({"__metadata__": {"k": ""}}, separators=(",", ":")))
    value = "x" * (ALIGNMENT - 8 - base)
    path = tmp_path / "exact.safetensors"
    write_safetensors(path, {}, {"k": value})
    f = SafetensorsFile(path)
    assert f.data_start == ALIGNMENT
    assert not f.header_bytes.endswith(b" ")


@pytest.mark.parametrize("header_fill", [0, 1, 4000, 4090, 9000])
def test_data_buffer_starts_page_aligned(tmp_path, header_fill):
    path = tmp_path / "align.safetensors"
    write_safetensors(path, {"w": np.ones(5, np.float16)}, {"fill": "y" * header_fill})
    f = SafetensorsFile(path)
    assert f.data_start % ALIGNMENT == 0
    assert f.tensors["w"].begin == f.data_start


def test_data_size_and_file_size_predict_the_written_file(tmp_path):
    entries = [("a", "F32", (3, 4)), ("b", "BF16", (7,)), ("c", "U8", (0, 9))]
    assert SafetensorsWriter.data_size(entries) == 48 + 14
    predicted = SafetensorsWriter.file_size(entries, {"k": "v"})
    path = tmp_path / "sizes.safetensors"
    with SafetensorsWriter(path, entries, {"k": "v"}) as writer:
        assert writer.tensors["b"].begin == ALIGNMENT + 48
        for name, dtype, shape in entries:
            writer.write(name, np.zeros(shape, numpy_dtype(dtype)))
    assert path.stat().st_size == predicted == ALIGNMENT + 62


_awkward_names = st.text(
    st.sampled_from(list('ab."\\/\x00\x1f\x7f\u00e9\u4e2d\U0001f600') + ["\n", "\t"]), max_size=8
).filter(lambda s: s != "__metadata__")


@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.one_of(
                _awkward_names,
                st.from_regex(r"model\.layers\.[0-9]{1,2}\.mlp\.experts\.[0-9]{1,3}\.w", fullmatch=True),
            ),
            st.sampled_from(ALL_DTYPES),
            st.lists(st.integers(0, 10**6), max_size=3).map(tuple),
        ),
        max_size=12,
        unique_by=lambda e: e[0],
    ),
    metadata=st.none() | st.dictionaries(_awkward_names, _awkward_names, max_size=3),
    metadata_last=st.booleans(),
)
def test_file_size_counts_exactly_the_header_the_writer_builds(entries, metadata, metadata_last):
    """``file_size`` counts the header's bytes without building it (planning sizes every output file); the
    reference is the header ``_plan_layout`` serializes with json.dumps, the bytes every writer writes."""
    layout = writer_module._plan_layout("x", entries, metadata, metadata_last)
    expected = len(layout.header) + sum(t.nbytes for t in layout.tensors.values())
    assert SafetensorsWriter.file_size(entries, metadata, metadata_last=metadata_last) == expected
    # the count itself, before the page padding would hide an error of a few bytes
    checked = writer_module._validated_entries("x", entries)
    counted = writer_module._json_length(checked, metadata)
    raw = layout.header[8:].rstrip(b" ")
    assert counted == len(raw) or (counted is None and not raw.isascii())


def test_file_size_refuses_what_the_writer_refuses():
    with pytest.raises(SafetensorsError, match="not valid Unicode"):
        SafetensorsWriter.file_size([("a\ud800", "F32", (1,))])
    with pytest.raises(SafetensorsError, match="not valid Unicode"):
        SafetensorsWriter.file_size([("a", "F32", (1,))], {"k": "\udc00"})
    with pytest.raises(SafetensorsError, match="over the limit"):
        SafetensorsWriter.file_size(
            [(f"t{i:07d}" + "x" * 200, "F32", (1,)) for i in range(MAX_HEADER_BYTES // 250)]
        )


def test_writer_accepts_strided_big_endian_and_raw_byte_inputs(tmp_path):
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    entries = [
        ("transposed", "F32", (4, 3)),
        ("big_endian", "F32", (3, 4)),
        ("raw", "U8", (2, 2)),
        ("view", "I16", (3,)),
        ("int8_as_u8", "U8", (3,)),
    ]
    path = tmp_path / "inputs.safetensors"
    with SafetensorsWriter(path, entries) as writer:
        writer.write("transposed", base.T)
        writer.write("big_endian", base.astype(">f4"))
        writer.write("raw", b"\x01\x02\x03\x04")
        writer.write("view", memoryview(np.array([1, -2, 3], np.int16)))
        writer.write("int8_as_u8", np.array([-1, 0, 1], np.int8))
    f = SafetensorsFile(path)
    np.testing.assert_array_equal(f.read("transposed"), base.T)
    np.testing.assert_array_equal(f.read("big_endian"), base)
    assert f.read_bytes("raw") == b"\x01\x02\x03\x04"
    np.testing.assert_array_equal(f.read("view"), [1, -2, 3])
    np.testing.assert_array_equal(f.read("int8_as_u8"), [255, 0, 1])


# --------------------------------------------------------------------------------------------------------------
# writer failures: an error anywhere publishes nothing and leaves no temporary file


def test_writer_writes_to_a_hidden_temp_and_publishes_only_on_close(tmp_path):
    path = tmp_path / "out.safetensors"
    writer = SafetensorsWriter(path, [("a", "F32", (2,))])
    assert writer.temp_path == tmp_path / f".out.safetensors.tmp-{os.getpid()}"
    writer.write("a", np.ones(2, np.float32))
    assert leftovers(tmp_path) == [writer.temp_path.name]
    writer.close()
    assert leftovers(tmp_path) == ["out.safetensors"]
    writer.close()  # idempotent
    writer.abort()  # no effect once published
    assert leftovers(tmp_path) == ["out.safetensors"]


def test_writer_rejects_tensors_out_of_order(tmp_path):
    path = tmp_path / "order.safetensors"
    writer = SafetensorsWriter(path, [("first", "F32", (1,)), ("second", "F32", (1,))])
    with pytest.raises(
        SafetensorsError, match=r"'second' written out of order: expected 'first' \(tensor 1 of 2\)"
    ):
        writer.write("second", np.ones(1, np.float32))
    assert leftovers(tmp_path) == []
    with pytest.raises(SafetensorsError, match="aborted"):
        writer.close()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (np.ones(3, np.float32), "got 12 bytes, but shape [2, 2] of F32 needs 16"),
        (b"\x00" * 15, "got 15 bytes, but shape [2, 2] of F32 needs 16"),
        (np.ones((2, 2), np.float64), "has 8-byte items, F32 has 4"),
        (np.array([None] * 4, dtype=object), "holds Python objects"),
    ],
)
def test_writer_rejects_a_wrong_byte_count(tmp_path, data, fragment):
    path = tmp_path / "count.safetensors"
    writer = SafetensorsWriter(path, [("w", "F32", (2, 2))])
    with pytest.raises(SafetensorsError) as caught:
        writer.write("w", data)
    assert fragment in str(caught.value) and str(path) in str(caught.value) and "'w'" in str(caught.value)
    assert leftovers(tmp_path) == []


def test_writer_rejects_a_tensor_past_the_declared_ones(tmp_path):
    writer = SafetensorsWriter(tmp_path / "extra.safetensors", [("a", "U8", (1,))])
    writer.write("a", b"\x00")
    with pytest.raises(SafetensorsError, match="'b' written after all 1 declared tensors"):
        writer.write("b", b"\x00")
    assert leftovers(tmp_path) == []


def test_writer_closed_before_every_tensor_was_written_publishes_nothing(tmp_path):
    path = tmp_path / "missing.safetensors"
    writer = SafetensorsWriter(path, [("a", "U8", (1,)), ("b", "U8", (1,)), ("c", "U8", (1,))])
    writer.write("a", b"\x00")
    with pytest.raises(
        SafetensorsError, match="closed after 1 of 3 tensors; tensor 'b' and 1 more not written"
    ):
        writer.close()
    assert leftovers(tmp_path) == []


def test_exception_inside_with_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with SafetensorsWriter(tmp_path / "x.safetensors", [("a", "U8", (1,)), ("b", "U8", (1,))]) as writer:
            writer.write("a", b"\x00")
            raise RuntimeError("boom")
    assert leftovers(tmp_path) == []


def test_failed_write_leaves_the_previous_file_at_the_final_path_untouched(tmp_path):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"old": np.ones(2, np.float32)})
    before = path.read_bytes()
    with pytest.raises(SafetensorsError):
        with SafetensorsWriter(path, [("new", "F32", (2,))]) as writer:
            writer.write("new", np.ones(3, np.float32))
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == ["model.safetensors"]
    write_safetensors(path, {"new": np.zeros(2, np.float32)})  # a complete write replaces it
    assert list(SafetensorsFile(path).tensors) == ["new"]


def test_full_disk_removes_the_temp_and_reports_the_needed_size(tmp_path, monkeypatch):
    path = tmp_path / "full.safetensors"
    entries = [("big", "U8", (10_000,))]
    needed = SafetensorsWriter.file_size(entries)
    writer = SafetensorsWriter(path, entries)
    real_write = os.write

    def disk_full(fd, data):  # the OS, not the code under test: the data write finds the disk full
        if len(data) == 10_000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(ColitoolsError) as caught:
        writer.write("big", np.zeros(10_000, np.uint8))
    assert isinstance(caught.value, SafetensorsError)
    assert str(caught.value) == f"writing {path}: No space left on device (needed {needed} bytes)"
    assert leftovers(tmp_path) == []


def test_existing_temp_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "busy.safetensors"
    temp = tmp_path / f".busy.safetensors.tmp-{os.getpid()}"
    temp.write_bytes(b"someone else's")
    with pytest.raises(SafetensorsError, match="already exists"):
        SafetensorsWriter(path, [("a", "U8", (1,))])
    assert temp.read_bytes() == b"someone else's"
    assert not path.exists()


@pytest.mark.parametrize(
    ("entries", "metadata", "fragment"),
    [
        ([("a", "U8", (1,)), ("a", "U8", (1,))], None, "'a': declared twice"),
        ([("__metadata__", "U8", (1,))], None, "reserved"),
        ([("a", "F4", (1,))], None, "unknown dtype 'F4'"),
        ([("a", "U8", (2, -1))], None, "not a tuple of non-negative integers"),
        ([("a", "U8", (True,))], None, "not a tuple of non-negative integers"),
        ([("a", "F32", (2**62, 2))], None, "overflows"),
        ([("a", "U8", (1,))], {"k": 1}, "__metadata__ must map strings to strings"),
    ],
)
def test_writer_rejects_invalid_entries_before_creating_anything(tmp_path, entries, metadata, fragment):
    with pytest.raises(SafetensorsError, match=fragment):
        SafetensorsWriter(tmp_path / "bad.safetensors", entries, metadata)
    assert leftovers(tmp_path) == []


def test_write_safetensors_rejects_a_numpy_dtype_without_a_safetensors_name(tmp_path):
    with pytest.raises(SafetensorsError, match="'c'.*complex64"):
        write_safetensors(tmp_path / "c.safetensors", {"c": np.zeros(2, np.complex64)})
    assert leftovers(tmp_path) == []


# --------------------------------------------------------------------------------------------------------------
# read_many and coalescing


def _info(name: str, begin: int, end: int) -> TensorInfo:
    return TensorInfo(name, "U8", (end - begin,), begin, end)


def test_coalesce_ranges_groups_touching_ranges_in_file_order():
    a, b, c, d = _info("a", 100, 110), _info("b", 110, 130), _info("c", 140, 150), _info("d", 150, 150)
    e = _info("e", 150, 160)
    assert coalesce_ranges([e, c, a, d, b]) == [[a, b], [c, d, e]]
    assert coalesce_ranges([]) == []
    assert coalesce_ranges([c, a]) == [[a], [c]]
    assert coalesce_ranges([a, a]) == [[a, a]]


def owner(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory ``array`` views."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def test_read_many_fetches_each_run_of_adjacent_tensors_into_one_buffer(tmp_path):
    arrays = {
        "gate": random_array("U8", (4, 8), 1),
        "up": random_array("U8", (4, 8), 2),
        "down": random_array("U8", (8, 4), 3),
        "gate.qs": random_array("F32", (4,), 4),
        "up.qs": random_array("F32", (4,), 5),
        "down.qs": random_array("F32", (8,), 6),
    }
    path = tmp_path / "expert.safetensors"
    write_safetensors(path, arrays)
    f = SafetensorsFile(path)
    got = f.read_many(["down", "gate", "up", "gate", "down.qs"])
    assert list(got) == ["down", "gate", "up", "down.qs"]
    for name, array in got.items():
        assert same_bits(array, arrays[name])
    # gate|up|down are adjacent: one read, one buffer. down.qs is separated by gate.qs/up.qs: its own read.
    assert owner(got["gate"]) is owner(got["up"]) is owner(got["down"])
    assert owner(got["down"]) is not owner(got["down.qs"])
    assert owner(got["gate"]).nbytes == 3 * 32
    with pytest.raises(SafetensorsError, match="no tensor named 'nope'"):
        f.read_many(["gate", "nope"])


def test_read_header_releases_the_descriptor_and_data_reads_reopen_the_same_file(tmp_path):
    path = tmp_path / "h.safetensors"
    write_safetensors(path, {"a": np.arange(3, dtype=np.int32)}, {"m": "1"})
    f = read_header(path)
    assert f._fd is None
    assert f.metadata == {"m": "1"} and f.tensors["a"].nbytes == 12
    np.testing.assert_array_equal(f.read("a"), [0, 1, 2])
    f.close()
    write_safetensors(path, {"a": np.arange(5, dtype=np.int32)})  # replaced: another inode
    with pytest.raises(SafetensorsError, match="changed since its header was read"):
        f.read("a")


# --------------------------------------------------------------------------------------------------------------
# reader validation: one malformed case per test, bytes crafted by hand


def test_rejects_a_file_shorter_than_the_length_field(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x05\x00\x00\x00\x00")
    rejected(path, "file is 5 bytes")


def test_rejects_a_header_length_larger_than_the_file(tmp_path):
    path = craft(tmp_path, b"{}", length=1000)
    rejected(path, "header length 1000", "file size (10 bytes")


def test_header_bomb_is_rejected_without_allocating(tmp_path):
    path = craft(tmp_path, b"{}", length=10**9)
    tracemalloc.start()
    try:
        rejected(path, "header length 1000000000", str(MAX_HEADER_BYTES))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_rejects_a_header_over_the_limit_even_when_the_file_is_large_enough(tmp_path):
    path = craft(tmp_path, b"{}", length=MAX_HEADER_BYTES + 1)
    os.truncate(path, MAX_HEADER_BYTES + 100)  # sparse: costs no disk
    rejected(path, f"header length {MAX_HEADER_BYTES + 1} exceeds the limit")


def test_rejects_a_header_that_is_not_utf8(tmp_path):
    rejected(craft(tmp_path, b'{"w\xff":1}'), "not valid UTF-8", "byte 3")


@pytest.mark.parametrize("text", ['{"w":', "", '{"__metadata__":NaN}', "{} {}"])
def test_rejects_a_header_that_is_not_json(tmp_path, text):
    rejected(craft(tmp_path, text), "not valid JSON")


@pytest.mark.parametrize(
    ("text", "kind"), [("[]", "array"), ('"x"', "string"), ("3", "number"), ("null", "null")]
)
def test_rejects_a_header_that_is_not_a_json_object(tmp_path, text, kind):
    rejected(craft(tmp_path, text), f"header is a JSON {kind}, expected an object")


def test_rejects_an_entry_that_is_not_an_object(tmp_path):
    rejected(craft(tmp_path, {"layer.w": [0, 4]}, b"\0" * 4), "tensor 'layer.w'", "JSON array")


@pytest.mark.parametrize("missing", ["dtype", "shape", "data_offsets"])
def test_rejects_an_entry_missing_a_key(tmp_path, missing):
    fields = entry("F32", [1], 0, 4)
    del fields[missing]
    rejected(craft(tmp_path, {"w": fields}, b"\0" * 4), "tensor 'w'", f"lacks '{missing}'")


@pytest.mark.parametrize("dtype", ["F4", "f32", "C64", 7])
def test_rejects_an_unknown_dtype(tmp_path, dtype):
    fields = entry("F32", [1], 0, 4) | {"dtype": dtype}
    rejected(craft(tmp_path, {"w": fields}, b"\0" * 4), "tensor 'w'", f"unknown dtype {json.dumps(dtype)}")


@pytest.mark.parametrize(
    ("shape", "shown"),
    [
        (3, "3"),
        ([-1], "[-1]"),
        ([True], "[true]"),
        ([2.0], "[2.0]"),
        (["2"], '["2"]'),
        ({"a": 1}, '{"a": 1}'),
    ],
)
def test_rejects_a_shape_that_is_not_a_list_of_non_negative_ints(tmp_path, shape, shown):
    path = craft(tmp_path, {"w": {"dtype": "U8", "shape": shape, "data_offsets": [0, 1]}}, b"\0")
    rejected(path, "tensor 'w'", f"shape {shown}", "not a list of non-negative integers")


def test_rejects_an_overflowing_numel(tmp_path):
    path = craft(tmp_path, {"w": entry("F32", [2**32, 2**32, 0], 0, 0)})
    rejected(path, "tensor 'w'", f"shape [{2**32}, {2**32}, 0] of F32 overflows")


@pytest.mark.parametrize(
    "offsets", [[4], [0, 4, 8], [4, 0], [-4, 0], [True, 4], [0, 4.0], "0,4", None, [0, "4"]]
)
def test_rejects_data_offsets_that_are_not_an_ordered_pair_of_non_negative_ints(tmp_path, offsets):
    path = craft(tmp_path, {"w": {"dtype": "U8", "shape": [4], "data_offsets": offsets}}, b"\0" * 4)
    rejected(path, "tensor 'w'", f"data_offsets {json.dumps(offsets, separators=(', ', ':'))}")


@pytest.mark.parametrize("dtype", ["F32", "U8", "I8", "BF16", "F8_E4M3", "BOOL"])
def test_rejects_a_byte_span_that_differs_from_numel_times_itemsize(tmp_path, dtype):
    need = 6 * SAFETENSORS_DTYPES[dtype].itemsize
    path = craft(tmp_path, {"w": entry(dtype, [2, 3], 0, need + 1)}, b"\0" * (need + 1))
    rejected(path, "tensor 'w'", f"span {need + 1} bytes", f"shape [2, 3] of {dtype} needs {need}")


def test_rejects_overlapping_tensors(tmp_path):
    path = craft(tmp_path, {"a": entry("U8", [8], 0, 8), "b": entry("U8", [8], 4, 12)}, b"\0" * 12)
    rejected(path, "tensor 'b'", "[4, 12] overlap tensor 'a', which ends at 8")


def test_rejects_two_tensors_sharing_one_range(tmp_path):
    path = craft(tmp_path, {"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 0, 4)}, b"\0" * 4)
    rejected(path, "tensor 'b'", "overlap tensor 'a'")


def test_rejects_a_hole_between_tensors(tmp_path):
    path = craft(tmp_path, {"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 8, 12)}, b"\0" * 12)
    rejected(path, "tensor 'b'", "hole of 4 bytes after tensor 'a', which ends at 4")


def test_rejects_a_hole_at_the_start_of_the_data_buffer(tmp_path):
    path = craft(tmp_path, {"a": entry("U8", [4], 4, 8)}, b"\0" * 8)
    rejected(path, "tensor 'a'", "hole of 4 bytes at the start of the data buffer")


def test_rejects_trailing_bytes_after_the_last_tensor(tmp_path):
    path = craft(tmp_path, {"a": entry("U8", [4], 0, 4)}, b"\0" * 7)
    rejected(path, "'a' ends at 4", "holds 7 bytes (3 trailing bytes)")


def test_rejects_a_tensor_past_the_end_of_the_file(tmp_path):
    path = craft(tmp_path, {"a": entry("U8", [8], 0, 8)}, b"\0" * 5)
    rejected(path, "tensor 'a' ends at 8", "past the end of the data buffer (5 bytes")


def test_rejects_data_without_tensors(tmp_path):
    rejected(craft(tmp_path, {"__metadata__": {}}, b"\0" * 3), "no tensors", "holds 3 bytes")


def test_rejects_duplicate_tensor_names(tmp_path):
    one = json.dumps(entry("U8", [2], 0, 2), separators=(",", ":"))
    two = json.dumps(entry("U8", [2], 2, 4), separators=(",", ":"))
    path = craft(tmp_path, f'{{"dup.w":{one},"dup.w":{two}}}', b"\0" * 4)
    rejected(path, "duplicate tensor name 'dup.w'")


def test_rejects_a_duplicate_key_inside_an_entry(tmp_path):
    path = craft(tmp_path, '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"dtype":"U8"}}', b"\0")
    rejected(path, "tensor 'w'", "duplicate key 'dtype'")


def test_rejects_a_duplicate_metadata_map(tmp_path):
    rejected(craft(tmp_path, '{"__metadata__":{},"__metadata__":{}}'), "duplicate __metadata__")


@pytest.mark.parametrize(("value", "kind"), [([], "array"), ("x", "string"), (None, "null")])
def test_rejects_metadata_that_is_not_an_object(tmp_path, value, kind):
    rejected(craft(tmp_path, {"__metadata__": value}), f"__metadata__ is a JSON {kind}, expected an object")


@pytest.mark.parametrize(
    ("value", "kind"), [(1, "number"), ({"a": "b"}, "object"), (None, "null"), (True, "boolean")]
)
def test_rejects_a_metadata_value_that_is_not_a_string(tmp_path, value, kind):
    path = craft(tmp_path, {"__metadata__": {"ok": "v", "colitools.shapes": value}})
    rejected(path, "'colitools.shapes'", f"JSON {kind}, expected a string")


def test_rejects_a_duplicate_metadata_key(tmp_path):
    rejected(craft(tmp_path, '{"__metadata__":{"k":"a","k":"b"}}'), "duplicate __metadata__ key 'k'")


def test_accepts_hand_made_headers_with_whitespace_extra_keys_and_unsorted_offsets(tmp_path):
    header = (
        ' { "b" : {"dtype":"U8","shape":[2],"data_offsets":[2,4],"extra":1},\n'
        '"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}, "z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}  '
    )
    f = SafetensorsFile(craft(tmp_path, header, b"\x01\x02\x03\x04"))
    assert list(f.tensors) == ["a", "b", "z"]  # data-offset order
    assert f.read_bytes("b") == b"\x03\x04"
    assert f.read("z").shape == (0,)


def test_rejects_a_missing_file_and_a_directory(tmp_path):
    rejected(tmp_path / "absent.safetensors", "cannot open")
    with pytest.raises(SafetensorsError, match="not a regular file"):
        SafetensorsFile(tmp_path)


def test_known_header_is_reused_only_while_the_file_is_unchanged(tmp_path):
    from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors

    path = tmp_path / "a.safetensors"
    write_safetensors(path, {"x": np.arange(4, dtype=np.float32)})
    first = SafetensorsFile(path)
    first.close()
    again = SafetensorsFile(path, known=first)
    assert again.tensors is first.tensors  # taken over, not parsed again
    assert again.read("x").tolist() == [0, 1, 2, 3]
    again.close()
    write_safetensors(path, {"y": np.arange(6, dtype=np.float32)})  # a new file at the same path
    fresh = SafetensorsFile(path, known=first)
    assert list(fresh.tensors) == ["y"] and fresh.read("y").tolist() == [0, 1, 2, 3, 4, 5]
    fresh.close()


# a lone surrogate escape (issue 24 item 7): JSON text Python's json accepts, which no UTF-8 output can hold
@pytest.mark.parametrize(
    "header",
    [
        '{"e\\udfff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
        '{"__metadata__":{"k\\uD800":"v"},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
        '{"__metadata__":{"k":"v\\udc80"},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    ],
)
def test_rejects_a_lone_surrogate_escape_in_a_name_or_metadata(tmp_path, header):
    message = rejected(craft(tmp_path, header, b"\0"), "is not Unicode text", "lone surrogate")
    assert message.encode("ascii")  # the message itself shows the escape, printable anywhere
    with pytest.raises(SafetensorError, match="surrogate|hex escape"):  # the upstream reader refuses it too
        deserialize((tmp_path / "crafted.safetensors").read_bytes())


def test_a_surrogate_pair_escape_is_text_and_reads_as_its_character(tmp_path):
    path = craft(tmp_path, '{"w\\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0")
    assert list(SafetensorsFile(path).tensors) == ["w\U0001f600"]
    assert [name for name, _ in deserialize(path.read_bytes())] == ["w\U0001f600"]


def test_a_tensor_written_in_parts_gives_the_bytes_of_one_write(tmp_path):
    a = np.arange(70 * 6, dtype=np.float32).reshape(70, 6)
    b = np.arange(5, dtype=np.int8)
    entries = [("a", "F32", (70, 6)), ("b", "I8", (5,))]
    with SafetensorsWriter(tmp_path / "whole.safetensors", entries) as w:
        w.write("a", a)
        w.write("b", b)
    with SafetensorsWriter(tmp_path / "parts.safetensors", entries) as w:
        for r0 in range(0, 70, 32):  # row slabs, the last one short
            w.write_part("a", a[r0 : r0 + 32])
        w.write("b", b)
    assert (tmp_path / "parts.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()


def test_parts_past_the_tensor_or_a_whole_write_after_a_part_are_refused(tmp_path):
    a = np.zeros((4, 2), np.float32)
    w = SafetensorsWriter(tmp_path / "x.safetensors", [("a", "F32", (4, 2))])
    w.write_part("a", a[:3])
    with pytest.raises(
        SafetensorsError, match=r"tensor 'a': got 40 bytes, but shape \[4, 2\] of F32 needs 32"
    ):
        w.write_part("a", a[:2])
    assert not w.temp_path.exists()  # aborted: nothing left behind
    w = SafetensorsWriter(tmp_path / "y.safetensors", [("a", "F32", (4, 2))])
    w.write_part("a", a[:1])
    with pytest.raises(SafetensorsError, match=r"tensor 'a' written whole after 8 bytes of it"):
        w.write("a", a)
