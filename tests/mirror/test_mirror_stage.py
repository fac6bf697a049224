"""`mirror stage`: verified atomic copies, kept targets, refusals, and a stage killed mid-copy then rerun."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from mirror_builders import (
    run_cli,
    run_cli_process,
    three_shard_model,
    write_history,
    write_shard,
)

from colitools.errors import MirrorError
from colitools.mirror import fileops
from colitools.mirror.fileops import (
    STALL_ENV,
    TEMP_SUFFIX,
    copy_to_temp,
    copy_verified,
    publish_copy,
    sha256_file,
    temp_path_for,
)
from colitools.mirror.plan import PLAN_FILE, SCHEMA
from colitools.mirror.stage import LOCK_FILE, MirrorReserveStop, stage_mirror
from colitools.mirror.verify import RECEIPT

BIG = 24 << 20  # three 8 MiB guard intervals, many copy buffers


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(path: Path) -> tuple[bytes, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_ino, st.st_mtime_ns


@pytest.fixture
def model(tmp_path) -> Path:
    """a: expert (0,0) used 100x; b: (0,1) used once; c: layer 1 unused; the plan picks a, then b."""
    return three_shard_model(tmp_path, {(0, 0): 100, (0, 1): 1})


def stage(model: Path, mirror: Path, **kwargs):
    kwargs.setdefault("budget_bytes", 10**12)
    kwargs.setdefault("reserve_bytes", 0)
    return stage_mirror(model, mirror, progress=False, **kwargs)


def test_stage_copies_the_selection_writes_receipt_and_plan_and_verifies(model, tmp_path):
    mirror = tmp_path / "mirror"
    result = stage(model, mirror)
    assert result.staged and result.ready
    assert [(f.file.name, f.action) for f in result.files] == [
        ("a.safetensors", "copied"),
        ("b.safetensors", "copied"),
    ]
    for name in ("a.safetensors", "b.safetensors"):
        assert (mirror / name).read_bytes() == (model / name).read_bytes()
    assert not (mirror / "c.safetensors").exists()
    receipt = json.loads((mirror / RECEIPT).read_text())
    assert receipt["schema"] == SCHEMA and receipt["model_root"] == str(model)
    assert (
        receipt["created_at"].endswith("Z")
        and receipt["budget_bytes"] == 10**12
        and receipt["reserve_bytes"] == 0
    )
    assert receipt["usage_file"] == str(model / ".coli_usage")
    assert [(f["name"], f["size"], f["sha256"], f["activated_experts"]) for f in receipt["files"]] == [
        (n, (model / n).stat().st_size, sha(model / n), 1) for n in ("a.safetensors", "b.safetensors")
    ]
    assert receipt["files"][0]["weighted_expert_bytes"] == 100 * 3120
    plan = json.loads((mirror / PLAN_FILE).read_text())
    assert plan["schema"] == SCHEMA and [f["name"] for f in plan["files"]] == [
        "a.safetensors",
        "b.safetensors",
    ]
    assert not [p for p in os.listdir(mirror) if TEMP_SUFFIX in p or ".tmp-" in p]
    assert LOCK_FILE not in os.listdir(mirror)  # held while staging, removed when done


def test_rerun_keeps_matching_targets_as_they_are(model, tmp_path):
    mirror = tmp_path / "mirror"
    stage(model, mirror)
    before = {n: snapshot(mirror / n) for n in ("a.safetensors", "b.safetensors")}
    again = stage(model, mirror)
    assert [f.action for f in again.files] == ["kept", "kept"] and again.ready
    assert {n: snapshot(mirror / n) for n in before} == before


def test_preexisting_corrupt_targets_are_replaced(model, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    corrupt = bytearray((model / "a.safetensors").read_bytes())
    corrupt[5000] ^= 0x01  # same size, one bit off
    (mirror / "a.safetensors").write_bytes(bytes(corrupt))
    (mirror / "b.safetensors").write_bytes(b"truncated")
    result = stage(model, mirror)
    assert [f.action for f in result.files] == ["copied", "copied"] and result.ready
    assert sha(mirror / "a.safetensors") == sha(model / "a.safetensors")
    assert sha(mirror / "b.safetensors") == sha(model / "b.safetensors")


def test_a_symlink_to_the_primary_is_replaced_by_a_real_copy(model, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "a.safetensors").symlink_to(model / "a.safetensors")
    result = stage(model, mirror)
    assert result.files[0].action == "copied" and not (mirror / "a.safetensors").is_symlink()
    assert (model / "a.safetensors").is_file() and sha(model / "a.safetensors") == result.files[0].sha256


def test_files_the_plan_did_not_select_are_never_touched(model, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "c.safetensors").write_bytes(b"an old, unselected and even corrupt copy")
    (mirror / "other.safetensors").write_bytes(b"someone else's file")
    (mirror / "notes.txt").write_text("keep me")
    before = {n: snapshot(mirror / n) for n in ("c.safetensors", "other.safetensors", "notes.txt")}
    assert stage(model, mirror).ready
    assert {n: snapshot(mirror / n) for n in before} == before


def test_refusals_copy_nothing(model, tmp_path):
    (model / ".coli_usage").unlink()
    result = stage(model, tmp_path / "m1")
    assert (result.staged, result.reason) == (False, "usage_history_missing")
    assert not (tmp_path / "m1").exists()
    write_history(model / ".coli_usage", {(0, 0): 1}, n_layers=2, n_experts=4)
    result = stage(model, tmp_path / "m2", reserve_bytes=2**60)
    assert (result.staged, result.reason) == (False, "free_space_reserve")
    assert not (tmp_path / "m2").exists()
    result = stage(model, tmp_path / "m3", budget_bytes=100)
    assert (result.staged, result.reason) == (False, "no_usage_ranked_shards_fit_the_budget")


def test_a_guard_that_stops_the_copy_leaves_no_temporary_file_and_the_target_untouched(model, tmp_path):
    big = model / "big.safetensors"
    write_shard(big, [("model.layers.0.mlp.experts.2.gate_proj.weight", BIG)])
    target = tmp_path / "big.safetensors"
    target.write_bytes(b"old")
    seen: list[int] = []

    def guard(written: int) -> None:
        seen.append(written)
        if written >= 8 << 20:
            raise MirrorError("reserve reached")

    with pytest.raises(MirrorError, match="reserve reached"):
        copy_verified(big, target, big.stat().st_size, guard=guard, guard_every=8 << 20)
    assert seen == [0, 8 << 20]
    assert target.read_bytes() == b"old" and not temp_path_for(target).exists()
    assert copy_verified(big, target, big.stat().st_size) == sha256_file(big) == sha(target)


def test_a_source_that_changed_size_since_planning_is_an_error(model, tmp_path):
    with pytest.raises(MirrorError, match="source changed"):
        copy_verified(model / "a.safetensors", tmp_path / "a.safetensors", 123)
    assert (
        not (tmp_path / "a.safetensors").exists() and not temp_path_for(tmp_path / "a.safetensors").exists()
    )


def test_stage_killed_during_a_copy_is_finished_by_a_rerun(model, tmp_path):
    big = model / "big.safetensors"
    write_shard(big, [("model.layers.0.mlp.experts.2.gate_proj.weight", BIG)], fill=7)
    # big is chosen after a and b (1 selection over 24 MiB); the test knob stops the child once 8 MiB of a
    # temporary file are written (a and b are far smaller), so the kill lands in the middle of big's copy
    # whatever the machine's speed.
    write_history(model / ".coli_usage", {(0, 0): 100, (0, 1): 10, (0, 2): 1}, n_layers=2, n_experts=4)
    mirror = tmp_path / "mirror"
    child = run_cli_process(
        "mirror",
        "stage",
        "--model",
        str(model),
        "--mirror",
        str(mirror),
        "--budget-gib",
        "1",
        "--reserve-gib",
        "0",
        "--no-progress",
        env={STALL_ENV: str(8 << 20)},
    )
    temp = temp_path_for(mirror / "big.safetensors")
    published = [mirror / "a.safetensors", mirror / "b.safetensors"]  # published by a second thread
    deadline = time.monotonic() + 120  # a hang guard only; nothing here measures time
    try:
        while not (temp.exists() and temp.stat().st_size >= 8 << 20 and all(p.exists() for p in published)):
            assert child.poll() is None, f"stage exited early: {child.communicate()}"
            assert time.monotonic() < deadline, "stage never reached the big copy"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    # the state a kill leaves: finished copies published, the interrupted one only as a hidden temporary file
    assert sha(mirror / "a.safetensors") == sha(model / "a.safetensors")
    assert sha(mirror / "b.safetensors") == sha(model / "b.safetensors")
    assert not (mirror / "big.safetensors").exists() and temp.exists()
    assert not (mirror / RECEIPT).exists()
    inode_a = (mirror / "a.safetensors").stat().st_ino

    result = stage(model, mirror)
    assert result.ready
    assert [(f.file.name, f.action) for f in result.files] == [
        ("a.safetensors", "kept"),
        ("b.safetensors", "kept"),
        ("big.safetensors", "copied"),
    ]
    assert (mirror / "a.safetensors").stat().st_ino == inode_a
    assert sha(mirror / "big.safetensors") == sha(big)
    assert not temp.exists()
    assert [f["name"] for f in json.loads((mirror / RECEIPT).read_text())["files"]] == [
        "a.safetensors",
        "b.safetensors",
        "big.safetensors",
    ]


@pytest.mark.parametrize(
    "signum, code, said",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_during_a_copy_stops_the_stage_cleanly_leaving_no_lock_and_no_temporary(
    model, tmp_path, signum, code, said
):
    mirror = tmp_path / "mirror"
    child = run_cli_process("mirror", "stage", "--model", str(model), "--mirror", str(mirror), "--budget-gib", "1",
                            "--reserve-gib", "0", "--no-progress", env={STALL_ENV: "1000"})  # fmt: skip
    deadline = time.monotonic() + 120  # a hang guard only
    try:
        while not any(TEMP_SUFFIX in p for p in (os.listdir(mirror) if mirror.is_dir() else [])):
            assert child.poll() is None, f"stage exited early: {child.communicate()}"
            assert time.monotonic() < deadline, "stage never started a copy"
            time.sleep(0.02)
        assert LOCK_FILE in os.listdir(mirror)  # held while it works
        child.send_signal(signum)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == code, err
    assert err.splitlines() == [
        f"colitools: {said}; rerun the same command to resume (verified copies are kept)"
    ]
    left = os.listdir(mirror)
    assert LOCK_FILE not in left and not [p for p in left if TEMP_SUFFIX in p or ".tmp-" in p], left
    assert stage(model, mirror).ready


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc/<pid>/task")
def test_a_ctrl_c_the_kernel_delivers_to_a_copy_thread_still_stops_the_stage(model, tmp_path):
    """A process-directed signal may land in any thread; CPython runs its handler in the main thread, which an
    untimed wait on the copies would keep asleep (with the stall knob: forever). ``kill`` of a thread id sends
    the signal to the process, delivered to that thread first."""
    mirror = tmp_path / "mirror"
    child = run_cli_process("mirror", "stage", "--model", str(model), "--mirror", str(mirror), "--budget-gib", "1",
                            "--reserve-gib", "0", "--no-progress", env={STALL_ENV: "1000"})  # fmt: skip
    deadline = time.monotonic() + 120  # a hang guard only
    try:
        while not any(TEMP_SUFFIX in p for p in (os.listdir(mirror) if mirror.is_dir() else [])):
            assert child.poll() is None, f"stage exited early: {child.communicate()}"
            assert time.monotonic() < deadline, "stage never started a copy"
            time.sleep(0.02)
        others = [int(t) for t in os.listdir(f"/proc/{child.pid}/task") if int(t) != child.pid]
        os.kill(others[0], signal.SIGINT)  # a thread of the stage that is not its main thread
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == 130, err
    assert err.splitlines() == [
        "colitools: interrupted; rerun the same command to resume (verified copies are kept)"
    ]
    assert LOCK_FILE not in os.listdir(mirror)


def test_cli_stage_exit_codes(model, tmp_path):
    mirror = str(tmp_path / "mirror")
    r = run_cli(
        "mirror",
        "stage",
        "--model",
        str(model),
        "--mirror",
        mirror,
        "--budget-gib",
        "1",
        "--reserve-gib",
        "0",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["staged"] and data["ready"] and data["copied"] == ["a.safetensors", "b.safetensors"]
    assert data["verify"]["ready"] and data["plan"]["admitted"]
    r = run_cli(
        "mirror",
        "stage",
        "--model",
        str(model),
        "--mirror",
        mirror,
        "--budget-gib",
        "1",
        "--reserve-gib",
        "0",
    )
    assert r.returncode == 0 and "0 copied, 2 kept" in r.stdout and "ready: yes" in r.stdout
    r = run_cli(
        "mirror",
        "stage",
        "--model",
        str(model),
        "--mirror",
        mirror,
        "--budget-gib",
        "1",
        "--reserve-gib",
        "100000000",
    )
    assert r.returncode == 2 and "nothing copied" in r.stderr


def test_a_second_stage_on_the_same_mirror_is_refused_while_one_runs(model, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with open(mirror / LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(MirrorError, match="another stage is running"):
            stage(model, mirror)
    assert stage(model, mirror).ready


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("reread_from_device", [False, True])
def test_every_worker_count_and_rehash_mode_stages_the_same_mirror(
    model, tmp_path, workers, reread_from_device
):
    write_shard(
        model / "big.safetensors", [("model.layers.0.mlp.experts.2.gate_proj.weight", BIG + 123)], fill=7
    )
    write_history(model / ".coli_usage", {(0, 0): 100, (0, 1): 10, (0, 2): 1}, n_layers=2, n_experts=4)
    mirror = tmp_path / "mirror"
    result = stage(model, mirror, workers=workers, reread_from_device=reread_from_device)
    assert result.ready and [f.action for f in result.files] == ["copied"] * 3
    names = ["a.safetensors", "b.safetensors", "big.safetensors"]
    assert [f["name"] for f in json.loads((mirror / RECEIPT).read_text())["files"]] == names
    for f in result.files:
        assert f.sha256 == sha(model / f.file.name) == sha(mirror / f.file.name)
    assert not [p for p in os.listdir(mirror) if TEMP_SUFFIX in p]
    assert set(result.timings) == {"plan", "check", "copy", "receipt", "verify"}


@pytest.mark.parametrize("reread_from_device", [False, True])
def test_a_temporary_file_that_changed_before_publishing_is_refused(model, tmp_path, reread_from_device):
    big = model / "big.safetensors"
    write_shard(big, [("model.layers.0.mlp.experts.2.gate_proj.weight", BIG)], fill=7)
    target = tmp_path / "big.safetensors"
    target.write_bytes(b"old")
    pending = copy_to_temp(big, target, big.stat().st_size, reread_from_device=reread_from_device)
    assert pending.sha256 == sha(big) and pending.temp == temp_path_for(target)
    with open(
        pending.temp, "r+b"
    ) as f:  # what a bad write, a buffer reused too early or a stray writer leaves
        f.seek(BIG - 5)
        byte = f.read(1)
        f.seek(BIG - 5)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(MirrorError, match="differs from the bytes written"):
        publish_copy(pending)
    assert target.read_bytes() == b"old" and not pending.temp.exists()


def test_publish_fsyncs_then_rehashes_then_renames_then_fsyncs_the_directory(model, tmp_path, monkeypatch):
    target = tmp_path / "a.safetensors"
    pending = copy_to_temp(model / "a.safetensors", target, (model / "a.safetensors").stat().st_size)
    events: list[str] = []
    real_fsync, real_replace, real_rehash = os.fsync, os.replace, fileops._sha256_fd

    def fsync(fd):
        events.append("fsync dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        return real_fsync(fd)

    def replace(src, dst):
        events.append("rename")
        return real_replace(src, dst)

    def rehash(fd, progress):
        events.append("rehash")
        return real_rehash(fd, progress)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(fileops, "_sha256_fd", rehash)
    assert publish_copy(pending) == sha(model / "a.safetensors") == sha(target)
    assert events == ["fsync file", "rehash", "rename", "fsync dir"]


def test_free_space_falling_below_the_reserve_during_the_stage_stops_it_and_a_rerun_finishes(
    model, tmp_path, monkeypatch
):
    write_shard(model / "big.safetensors", [("model.layers.0.mlp.experts.2.gate_proj.weight", BIG)], fill=7)
    write_history(model / ".coli_usage", {(0, 0): 100, (0, 1): 10, (0, 2): 1}, n_layers=2, n_experts=4)
    mirror = tmp_path / "mirror"
    real_usage = shutil.disk_usage

    def usage(path):  # another writer fills the drive as soon as a first copy is published
        u = real_usage(path)
        return u._replace(free=0) if any(mirror.glob("*.safetensors")) else u

    monkeypatch.setattr(shutil, "disk_usage", usage)
    with pytest.raises(MirrorReserveStop, match="rerun when there is room") as stop:
        stage(model, mirror, workers=2)  # big starts only once a or b is published, and is refused
    assert stop.value.exit_code == 2
    published = sorted(p.name for p in mirror.glob("*.safetensors"))
    assert published in (["a.safetensors"], ["b.safetensors"], ["a.safetensors", "b.safetensors"])
    for name in published:
        assert sha(mirror / name) == sha(model / name)
    assert not (mirror / RECEIPT).exists() and not [p for p in os.listdir(mirror) if TEMP_SUFFIX in p]

    monkeypatch.setattr(shutil, "disk_usage", real_usage)
    result = stage(model, mirror)
    assert result.ready and [f.file.name for f in result.files if f.action == "kept"] == published
    assert result.files[2].action == "copied" and sha(mirror / "big.safetensors") == sha(
        model / "big.safetensors"
    )


def test_cli_stage_reread_from_device_gives_the_same_mirror(model, tmp_path):
    plain, device = tmp_path / "plain", tmp_path / "device"
    for mirror, extra in ((plain, ()), (device, ("--reread-from-device",))):
        r = run_cli(
            "mirror",
            "stage",
            "--model",
            str(model),
            "--mirror",
            str(mirror),
            "--budget-gib",
            "1",
            "--reserve-gib",
            "0",
            "--json",
            *extra,
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["ready"]
    for name in ("a.safetensors", "b.safetensors"):
        assert (device / name).read_bytes() == (plain / name).read_bytes() == (model / name).read_bytes()


def test_the_reserve_check_counts_the_bytes_a_copy_in_flight_already_wrote(tmp_path):
    """Two copies at once on a nearly full drive: the second one's first check must count the bytes the first
    has written so far (its temporary file), not only what it last reported (every 256 MiB)."""
    from colitools.mirror.fileops import temp_path_for
    from colitools.mirror.stage import _on_drive

    target = tmp_path / "s0.safetensors"
    assert _on_drive(target, 0) == 0
    temp_path_for(target).write_bytes(b"x" * 413_696)  # written, not yet reported
    assert _on_drive(target, 0) == 413_696
    assert _on_drive(target, 500_000) == 500_000
    temp_path_for(target).rename(target)  # published, not yet recorded
    assert _on_drive(target, 0) == 413_696
