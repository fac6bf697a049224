"""Resume after a move or a metadata change (issue 43 item 8): a conversion SIGKILLed after two finished units,
then its source folder moved, hard-linked (``cp -al``), a shard ``chmod``ed or ``touch -m``ed, one byte changed
with size and mtime kept, another model put at the same or at another path; the rerun (a real ``colitools convert
--json`` process) keeps or redoes the finished units as converters/source_identity.py decides, and its output is
byte-identical to an uninterrupted conversion of what the folder holds then (``colitools.json`` too, but for its
``run`` section: the kept units' records are brought up to date).

The expected fingerprint is computed here from the recipe docs/INTERNALS.md states (a byte mask of the sampled
ranges), not by the code under test."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from convcheck import listing, snapshot
from midkill import sigkill_when, temporaries
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert

# 4 units (globals, model.layers.0-2) over 3 shards of 5.7-6.6 MB: the fingerprint samples part of each shard
SPEC = Tiny(layers=3, experts=4, hidden=512, inter=256, shards=3)
SHARD1, SHARD2, SHARD3 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))


def _cmd(src: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0", *extra]


def _ledger(out: Path) -> dict:
    try:
        return json.loads((out / "colitools.json").read_text())
    except (OSError, ValueError):
        return {}


def _killed_after_two_units(src: Path, out: Path) -> dict[str, dict]:
    """Convert ``src`` into ``out`` in a real process and SIGKILL it between units once two are recorded; return
    the recorded units (unit -> record)."""
    env = {**os.environ, "COLITOOLS_TEST_SLOW_UNIT_SECONDS": "1.0"}
    proc = subprocess.Popen(_cmd(src, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sigkill_when(proc, lambda: len(_ledger(out).get("units") or {}) >= 2 and not temporaries(out, ""))
    proc.stderr.close()
    units = _ledger(out)["units"]
    assert list(units)[:2] == ["globals", "model.layers.0"] and len(units) < 4, list(units)
    return units


def _resume(src: Path, out: Path, *extra: str) -> dict:
    done = subprocess.run([*_cmd(src, out, *extra), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _uninterrupted(src: Path, out: Path) -> dict[str, bytes]:
    convert(str(src), out, ConvertOptions(min_free_gb=0))
    return snapshot(out)


def _read_by(units: dict[str, dict]) -> set[str]:
    return {s for rec in units.values() for s in rec["sources"]}


def _assert_kept(summary: dict, units: dict[str, dict]) -> None:
    assert summary["units_redone"] == [] and summary["units_skipped"] == len(units)
    assert summary["units_converted"] == 4 - len(units)


# ------------------------------------------------------------------------------- the documented fingerprint
def _sampled_mask(blob: bytes) -> np.ndarray:
    """Which bytes the fingerprint covers, as docs/INTERNALS.md states it: the header (8 bytes of length and the
    JSON), the first and last 4096 bytes of every tensor's data, and 16 blocks of 65536 bytes whose starts are
    spread evenly from the data's start to its end minus a block (rounded down)."""
    mask = np.zeros(len(blob), dtype=bool)
    n = struct.unpack("<Q", blob[:8])[0]
    base = 8 + n
    mask[:base] = True
    for name, info in json.loads(blob[8:base]).items():
        if name != "__metadata__":
            begin, end = (base + o for o in info["data_offsets"])
            mask[begin : min(begin + 4096, end)] = True
            mask[max(end - 4096, begin) : end] = True
    data = len(blob) - base
    for i in range(16):
        start = base + (i * (data - 65536)) // 15
        mask[start : start + 65536] = True
    return mask


def _expected_fingerprint(path: Path) -> str:
    """sha256 of the tag, the size (u64 LE), then per maximal run of sampled bytes: start, length (u64 LE) and the
    bytes."""
    blob = path.read_bytes()
    mask = _sampled_mask(blob)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.view(np.int8), [0]])))
    digest = hashlib.sha256(b"colitools shard fingerprint 1\0" + struct.pack("<Q", len(blob)))
    for start, end in zip(edges[::2], edges[1::2], strict=True):
        digest.update(struct.pack("<QQ", start, end - start) + blob[start:end])
    return digest.hexdigest()


def _bf16_byte(src: Path, tensor: str, sampled: bool) -> tuple[Path, int]:
    """The file and offset of the sign byte (the high byte) of the BF16 value of ``tensor`` largest in magnitude
    among those inside (``sampled``) or outside every range the fingerprint reads (its sign flipped, the value
    keeps its group's scale and changes its code)."""
    shard = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"][tensor]
    blob = (src / shard).read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    begin, end = (8 + n + o for o in json.loads(blob[8 : 8 + n])[tensor]["data_offsets"])
    magnitude = (np.frombuffer(blob[begin:end], dtype="<u2") & 0x7FFF).astype(np.int32)  # ordered like |value|
    wanted = _sampled_mask(blob)[begin + 1 : end : 2] == sampled
    assert wanted.any(), (tensor, sampled)
    i = int(np.argmax(np.where(wanted, magnitude, -1)))
    return src / shard, begin + 2 * i + 1


def _flip_keeping_size_and_mtime(path: Path, offset: int) -> None:
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0x80]))  # the sign of one BF16 value
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


# ------------------------------------------------------------------------------------------------- the tests
def test_a_moved_source_folder_keeps_every_finished_unit(tmp_path):
    src, moved, out = tmp_path / "src", tmp_path / "moved", tmp_path / "out"
    make_checkpoint(src, SPEC)
    units = _killed_after_two_units(src, out)
    for rec in units.values():  # what the units recorded: the documented fingerprint of each shard they read
        for shard, ident in rec["sources"].items():
            assert ident["fingerprint"] == _expected_fingerprint(src / shard)
    src.rename(moved)

    summary = _resume(moved, out)
    _assert_kept(summary, units)
    # a moved folder keeps every stat field: the fingerprint alone was taken again, of each shard they read
    assert summary["sources_rechecked"] == dict.fromkeys(sorted(_read_by(units)), "another folder")
    assert snapshot(out) == _uninterrupted(moved, tmp_path / "ref") and listing(out) == listing(tmp_path / "ref")
    # the ledger now records the new folder: a rerun reads nothing (no shard re-checked) and has nothing to do
    again = _resume(moved, out, "--dry-run")
    assert again["sources_rechecked"] == {} and again["units_skipped"] == 4 and again["units_redone"] == []


@pytest.mark.parametrize("how", ["-al", "-a"])
def test_a_hard_linked_or_copied_source_keeps_every_finished_unit(tmp_path, how):
    """``cp -al``: the same inodes, whose ctime a new link moves on; ``cp -a``: new files, mtime kept."""
    src, linked, out = tmp_path / "src", tmp_path / "linked", tmp_path / "out"
    make_checkpoint(src, SPEC)
    units = _killed_after_two_units(src, out)
    subprocess.run(["cp", how, str(src), str(linked)], check=True)
    same_inode = (linked / SHARD1).stat().st_ino == (src / SHARD1).stat().st_ino
    assert same_inode == (how == "-al")
    assert (linked / SHARD1).stat().st_mtime_ns == units["globals"]["sources"][SHARD1]["mtime_ns"]

    summary = _resume(linked, out)
    _assert_kept(summary, units)
    assert summary["sources_rechecked"] == dict.fromkeys(sorted(_read_by(units)), "ctime_ns")
    assert snapshot(out) == _uninterrupted(linked, tmp_path / "ref")


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        (["chmod", "0400"], "ctime_ns"),
        (["chown", "65534"], "ctime_ns"),  # (run as root; as another user chown is refused before any change)
        (["touch", "-m", "-d", "2020-01-02 03:04:05"], "ctime_ns, mtime_ns"),
    ],
)
def test_a_metadata_change_of_a_shard_keeps_its_units(tmp_path, change, differs):
    if change[0] == "chown" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    units = _killed_after_two_units(src, out)
    before = (src / SHARD2).read_bytes()
    subprocess.run([*change, str(src / SHARD2)], check=True)
    assert (src / SHARD2).read_bytes() == before

    summary = _resume(src, out)
    _assert_kept(summary, units)
    assert summary["sources_rechecked"] == {SHARD2: differs}
    assert snapshot(out) == _uninterrupted(src, tmp_path / "ref")


def test_one_byte_changed_in_a_sampled_range_redoes_the_units_that_read_it(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    units = _killed_after_two_units(src, out)
    path, offset = _bf16_byte(src, "model.layers.0.mlp.experts.3.down_proj.weight", sampled=True)
    _flip_keeping_size_and_mtime(path, offset)
    readers = [k for k, rec in units.items() if path.name in rec["sources"]]

    summary = _resume(src, out)
    assert summary["units_redone"] == readers and summary["units_skipped"] == len(units) - len(readers)
    assert all("its content fingerprint differs" in summary["redo_reasons"][k] for k in readers)
    assert snapshot(out) == _uninterrupted(src, tmp_path / "ref")


def test_one_byte_changed_outside_every_sampled_range_is_not_seen(tmp_path):
    """The documented limit: same size, mtime put back, the edit inside a tensor between its sampled windows.
    The unit that read it is kept: the output is the conversion of the bytes before the edit."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    units = _killed_after_two_units(src, out)
    before = _uninterrupted(src, tmp_path / "before")
    path, offset = _bf16_byte(src, "model.layers.0.mlp.experts.3.down_proj.weight", sampled=False)
    _flip_keeping_size_and_mtime(path, offset)

    summary = _resume(src, out)
    _assert_kept(summary, units)
    assert summary["sources_rechecked"] == {path.name: "ctime_ns"}
    after = _uninterrupted(src, tmp_path / "after")
    layer0 = units["model.layers.0"]["files"][0]["name"]
    assert after[layer0] != before[layer0]  # the edit does change the conversion...
    assert snapshot(out)[layer0] == before[layer0]  # ...and the kept unit is the one of the bytes before it


def test_another_model_at_the_same_path_is_converted_again(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    units = _killed_after_two_units(src, out)
    shutil.rmtree(src)
    make_checkpoint(src, dataclasses.replace(SPEC, seed=1))  # same shapes, sizes and plan; other values

    summary = _resume(src, out)
    assert summary["units_redone"] == list(units) and summary["units_skipped"] == 0
    assert summary["units_converted"] == 4 and summary["sources_rechecked"] == {}
    assert snapshot(out) == _uninterrupted(src, tmp_path / "ref")


def test_another_model_at_another_path_is_refused_in_one_line(tmp_path):
    src, other, out = tmp_path / "src", tmp_path / "other", tmp_path / "out"
    make_checkpoint(src, SPEC)
    _killed_after_two_units(src, out)
    make_checkpoint(other, dataclasses.replace(SPEC, seed=1))
    ledger = (out / "colitools.json").read_bytes()

    done = subprocess.run(_cmd(other, out), capture_output=True, text=True)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("colitools: error: "), done.stderr
    assert "another source" in lines[0] and str(src) in lines[0] and str(other) in lines[0]
    assert "content fingerprint differs" in lines[0]
    assert (out / "colitools.json").read_bytes() == ledger


def _as_before_fingerprints(out: Path) -> None:
    """Make ``out``'s ledger one an earlier colitools wrote: the same, without the fingerprints."""
    data = _ledger(out)
    for rec in data["units"].values():
        for ident in rec["sources"].values():
            del ident["fingerprint"]
    (out / "colitools.json").write_text(json.dumps(data, indent=2))


def test_an_earlier_ledger_resumes_in_a_moved_folder_and_gains_its_fingerprints(tmp_path):
    src, moved, out = tmp_path / "src", tmp_path / "moved", tmp_path / "out"
    make_checkpoint(src, SPEC)
    units = _killed_after_two_units(src, out)
    _as_before_fingerprints(out)
    src.rename(moved)  # every shard's size, mtime and ctime as recorded: the same inodes, untouched

    summary = _resume(moved, out)
    _assert_kept(summary, units)
    assert summary["sources_rechecked"] == {}
    assert snapshot(out) == _uninterrupted(moved, tmp_path / "ref")  # the kept units' records have fingerprints


def test_an_earlier_ledger_redoes_the_units_of_a_shard_whose_ctime_changed(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    units = _killed_after_two_units(src, out)
    _as_before_fingerprints(out)
    os.chmod(src / SHARD3, 0o400)  # only ctime: nothing recorded to compare the bytes with
    readers = [k for k, rec in units.items() if SHARD3 in rec["sources"]]
    assert readers == ["globals"]

    summary = _resume(src, out)
    assert summary["units_redone"] == readers and summary["units_skipped"] == len(units) - 1
    assert "no content fingerprint recorded" in summary["redo_reasons"]["globals"]
    assert snapshot(out) == _uninterrupted(src, tmp_path / "ref")


def test_a_shard_touched_during_the_run_stops_it_and_the_rerun_converts_only_what_read_it_after(tmp_path):
    """``touch -m`` of a shard while the conversion runs, after a unit that read it was recorded: the next unit
    that read it is not recorded (one line, exit 1: its bytes may not be the run's); the rerun re-checks the
    shard's content for the recorded unit, converts the one not recorded and completes byte-identical."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    env = {**os.environ, "COLITOOLS_TEST_SLOW_UNIT_SECONDS": "1.0"}
    proc = subprocess.Popen(_cmd(src, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while "globals" not in (_ledger(out).get("units") or {}) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    subprocess.run(["touch", "-m", str(src / SHARD3)], check=True)  # read by globals and model.layers.2
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.strip().splitlines() == [
        f"colitools: error: {src / SHARD3}: source shard changed during the conversion; rerun the same command, "
        "which redoes the units that read it"
    ], err
    assert list(_ledger(out)["units"]) == ["globals", "model.layers.0", "model.layers.1"]

    summary = _resume(src, out)
    assert summary["units_converted"] == 1 and summary["units_skipped"] == 3 and summary["units_redone"] == []
    assert summary["sources_rechecked"] == {SHARD3: "ctime_ns, mtime_ns"}
    assert snapshot(out) == _uninterrupted(src, tmp_path / "ref")
