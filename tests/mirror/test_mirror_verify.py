"""`mirror verify`: receipt and full-mirror modes, engine-level acceptance, every single-byte flip detected."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from mirror_builders import expert_tensors, run_cli, write_config, write_history, write_shard
from safetensors.numpy import save_file

from colitools.errors import MirrorError
from colitools.mirror.stage import stage_mirror
from colitools.mirror.verify import RECEIPT, safe_shard_name, verify_mirror


@pytest.fixture
def fast_tmp(tmp_path) -> Iterator[Path]:
    """A directory on tmpfs when there is one: verify reads mirror files from the device (O_DIRECT), which
    on a disk makes the kernel write each freshly flipped byte back first; tmpfs has no such write-back."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="colitools-test-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def staged(fast_tmp) -> tuple[Path, Path]:
    """A staged mirror of two shards: `small` (written by the safetensors library, compact header) and `a`."""
    model, mirror = fast_tmp / "model", fast_tmp / "mirror"
    model.mkdir()
    write_config(model, n_layers=2, n_experts=4)
    base = "model.layers.0.mlp.experts.0"
    save_file({f"{base}.gate_proj.weight": np.arange(16, dtype=np.uint8).reshape(2, 8),
               f"{base}.up_proj.weight": np.arange(16, 32, dtype=np.uint8).reshape(2, 8),
               f"{base}.down_proj.weight": np.arange(32, 48, dtype=np.uint8).reshape(2, 8)},
              str(model / "small.safetensors"))
    write_shard(model / "a.safetensors", expert_tensors(0, 1))
    write_shard(model / "unused.safetensors", expert_tensors(1, 0))
    write_history(model / ".coli_usage", {(0, 0): 100, (0, 1): 1}, n_layers=2, n_experts=4)
    result = stage_mirror(model, mirror, budget_bytes=10**9, reserve_bytes=0, progress=False)
    assert result.ready and [f.file.name for f in result.files] == ["small.safetensors", "a.safetensors"]
    return model, mirror


def check(verification, name):
    return next(f for f in verification.files if f.name == name)


def test_a_staged_mirror_is_ready_and_accepted_by_the_engine(staged):
    model, mirror = staged
    for v in (verify_mirror(mirror), verify_mirror(mirror, model)):
        assert v.ready and v.mode == "receipt" and v.problems == []
        assert [(f.name, f.ok, f.engine_accepts) for f in v.files] == [
            ("small.safetensors", True, True), ("a.safetensors", True, True)]


def test_every_single_byte_flip_of_a_mirror_file_is_detected(staged):
    model, mirror = staged
    path = mirror / "small.safetensors"
    original = path.read_bytes()
    header_end = 8 + struct.unpack("<Q", original[:8])[0]
    assert len(original) < 1024 and header_end < len(original)  # a small file: both header and data bytes
    for i in range(len(original)):
        flipped = bytearray(original)
        flipped[i] ^= 0xFF
        path.write_bytes(bytes(flipped))
        v = verify_mirror(mirror, model)
        small = check(v, "small.safetensors")
        assert not v.ready, f"flip of byte {i} not detected"
        assert any("sha256" in p for p in small.problems), (i, small.problems)
        # the engine's own test (size + header bytes) catches header flips only; sha256 catches the rest
        assert small.engine_accepts is (i >= header_end), i
        assert check(v, "a.safetensors").ok
    path.write_bytes(original)
    assert verify_mirror(mirror, model).ready


def test_a_missing_file_is_reported(staged):
    model, mirror = staged
    (mirror / "a.safetensors").unlink()
    v = verify_mirror(mirror, model)
    assert not v.ready
    a = check(v, "a.safetensors")
    assert a.problems == ["missing from the mirror"] and a.engine_accepts is False
    r = run_cli("mirror", "verify", "--mirror", str(mirror), "--model", str(model))
    assert r.returncode == 4 and "missing from the mirror" in r.stdout and "ready: no" in r.stdout


def test_a_renamed_file_is_reported_missing(staged):
    model, mirror = staged
    (mirror / "a.safetensors").rename(mirror / "a-renamed.safetensors")
    v = verify_mirror(mirror, model)
    assert not v.ready and check(v, "a.safetensors").problems == ["missing from the mirror"]
    assert "a-renamed.safetensors" not in [f.name for f in v.files]


def rewrite_receipt(mirror: Path, edit) -> None:
    path = mirror / RECEIPT
    receipt = json.loads(path.read_text())
    edit(receipt)
    path.write_text(json.dumps(receipt))


@pytest.mark.parametrize("bad", ["../x.safetensors", "sub/x.safetensors", "/tmp/x.safetensors", "..\\x.safetensors",
                                 "x.bin", ".safetensors", "", None, 7])
def test_a_receipt_naming_a_path_outside_the_mirror_is_refused(staged, bad):
    model, mirror = staged
    outside = mirror.parent / "x.safetensors"
    shutil.copy(model / "a.safetensors", outside)  # a perfect copy sits there: it must still not be used
    entry = {"name": bad, "size": outside.stat().st_size,
             "sha256": hashlib.sha256(outside.read_bytes()).hexdigest()}
    rewrite_receipt(mirror, lambda r: r["files"].append(entry))
    v = verify_mirror(mirror, model)
    assert not v.ready
    refused = [f for f in v.files if f.problems == ["refused: not a plain *.safetensors file name"]]
    assert len(refused) == 1 and refused[0].sha256 is None and refused[0].size is None
    assert all(f.ok for f in v.files if f is not refused[0])


def test_safe_shard_names():
    assert safe_shard_name("model-00001-of-00002.safetensors")
    for bad in ("../x.safetensors", "a/b.safetensors", "/x.safetensors", "x\\y.safetensors", "x.safetensors\x00",
                "x.safetensors.bak", ".safetensors", "..safetensors"):
        assert not safe_shard_name(bad), bad


def test_duplicate_receipt_entries_are_reported(staged):
    model, mirror = staged
    rewrite_receipt(mirror, lambda r: r["files"].append(dict(r["files"][0])))
    v = verify_mirror(mirror, model)
    assert not v.ready and any(p == "listed twice in the receipt" for f in v.files for p in f.problems)


@pytest.mark.parametrize("edit", [
    lambda r: r.update(schema="something.else.v9"),
    lambda r: r.update(files=[]),
    lambda r: r.update(files="a.safetensors"),
    lambda r: r["files"][0].update(size=-1),
    lambda r: r["files"][0].update(size=True),
    lambda r: r["files"][0].update(sha256="ABC"),
])
def test_invalid_receipts_are_not_ready(staged, edit):
    model, mirror = staged
    rewrite_receipt(mirror, edit)
    assert not verify_mirror(mirror, model).ready


def test_a_receipt_that_is_not_json_is_not_ready(staged):
    _, mirror = staged
    (mirror / RECEIPT).write_text("{not json")
    v = verify_mirror(mirror)
    assert not v.ready and "invalid JSON" in v.problems[0]


def test_a_changed_primary_is_reported_with_model(staged):
    model, mirror = staged
    data = bytearray((model / "a.safetensors").read_bytes())
    data[-1] ^= 0x10  # a data byte: the headers still agree, so the engine would accept the mirror copy
    (model / "a.safetensors").write_bytes(bytes(data))
    assert verify_mirror(mirror).ready  # without --model only the mirror copies are checked
    v = verify_mirror(mirror, model)
    a = check(v, "a.safetensors")
    assert not v.ready and a.problems == ["primary copy's sha256 no longer matches the receipt"]
    assert a.engine_accepts is True


def test_full_mirror_mode_without_a_receipt(staged, tmp_path):
    model, _ = staged
    full = tmp_path / "full"
    full.mkdir()
    for shard in model.glob("*.safetensors"):
        shutil.copy(shard, full / shard.name)
    v = verify_mirror(full, model)
    assert v.mode == "full" and v.ready
    assert [(f.name, f.engine_accepts) for f in v.files] == [
        ("a.safetensors", True), ("small.safetensors", True), ("unused.safetensors", True)]
    data = bytearray((full / "small.safetensors").read_bytes())
    data[20] ^= 0x01  # inside the JSON header
    (full / "small.safetensors").write_bytes(bytes(data))
    (full / "unused.safetensors").unlink()
    v = verify_mirror(full, model)
    small, unused = check(v, "small.safetensors"), check(v, "unused.safetensors")
    assert not v.ready and small.engine_accepts is False
    assert "header bytes differ from the primary's" in small.problems
    assert "sha256 differs from the primary's" in small.problems
    assert unused.problems == ["missing from the mirror"]
    assert check(v, "a.safetensors").ok


def test_no_receipt_and_no_model_is_not_ready(tmp_path):
    (tmp_path / "m").mkdir()
    v = verify_mirror(tmp_path / "m")
    assert not v.ready and v.mode == "none" and "pass `model`" in v.problems[0]
    assert run_cli("mirror", "verify", "--mirror", str(tmp_path / "m")).returncode == 4


def test_a_missing_mirror_directory_is_an_error(tmp_path):
    with pytest.raises(MirrorError, match="does not exist"):
        verify_mirror(tmp_path / "nope")
    r = run_cli("mirror", "verify", "--mirror", str(tmp_path / "nope"))
    assert r.returncode == 1 and r.stderr.startswith("colitools: error:")


def test_cli_verify_json(staged):
    model, mirror = staged
    r = run_cli("mirror", "verify", "--mirror", str(mirror), "--model", str(model), "--json")
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert data["ready"] and data["mode"] == "receipt" and data["engine_accepts_all"]
    assert [f["name"] for f in data["files"]] == ["small.safetensors", "a.safetensors"]
