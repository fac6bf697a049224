"""Kill the converter (a real child process, SIGKILL) at several points; a rerun must finish with output
byte-identical to an uninterrupted run.

Test-only knobs (environment, read by the converter; documented in docs/INTERNALS.md):
``COLITOOLS_TEST_SLOW_TENSOR_SECONDS`` (sleep after each tensor: the kill lands mid-unit),
``COLITOOLS_TEST_SLOW_UNIT_SECONDS`` (sleep after each recorded unit: the kill lands between units),
``COLITOOLS_TEST_KILL_AT=published:N`` (the process SIGKILLs itself right after publishing its N-th file and
before recording it in the ledger). Compared for identity: every shard, the index, config and copied files, and
``colitools.json`` without its ``run`` section (see ``convcheck.snapshot``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from convcheck import listing, snapshot
from midkill import sigkill_mid_file, sigkill_when, temporaries
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert

SPEC = Tiny(layers=3, experts=4, hidden=128, inter=64, shards=3)


def _cmd(src, out, *extra):
    return [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0", *extra]


def _start(src, out, env_extra, *extra):
    env = {**os.environ, **env_extra}
    return subprocess.Popen(
        _cmd(src, out, *extra), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _finished_units(out: Path) -> int:
    try:
        return len(json.loads((out / "colitools.json").read_text())["units"])
    except (OSError, ValueError, KeyError):
        return 0


def _wait_for(proc, cond, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        if proc.poll() is not None:
            pytest.fail(
                f"converter exited ({proc.returncode}) before the kill point: {proc.stderr.read().decode()}"
            )
        time.sleep(0.01)
    proc.kill()
    pytest.fail("kill point not reached")


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    proc.stderr.close()


def _rerun(src, out):
    subprocess.run(_cmd(src, out), check=True, capture_output=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    make_checkpoint(root / "src", SPEC)
    convert(str(root / "src"), root / "ref", ConvertOptions(min_free_gb=0))
    return root / "src", snapshot(root / "ref"), listing(root / "ref")


def test_kill_mid_unit_then_resume_is_byte_identical(reference, tmp_path):
    src, ref, names = reference
    out = tmp_path / "out"
    proc = _start(src, out, {"COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "0.02"})
    # one unit recorded, and the next unit's temporary file growing: the kill lands inside a unit
    assert sigkill_mid_file(proc, out, "model-", lambda: _finished_units(out) >= 1)  # a partial file was left behind
    proc.stderr.close()
    _rerun(src, out)
    assert snapshot(out) == ref and listing(out) == names


def test_kill_between_units_then_resume_is_byte_identical(reference, tmp_path):
    src, ref, names = reference
    out = tmp_path / "out"
    proc = _start(src, out, {"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "1.5"})
    sigkill_when(proc, lambda: _finished_units(out) >= 1 and not temporaries(out, ""))
    proc.stderr.close()
    assert not any(".tmp-" in p.name for p in out.iterdir())
    _rerun(src, out)
    assert snapshot(out) == ref and listing(out) == names


def test_kill_after_publish_before_the_ledger_records_it(reference, tmp_path):
    src, ref, names = reference
    out = tmp_path / "out"
    done = subprocess.run(
        _cmd(src, out), env={**os.environ, "COLITOOLS_TEST_KILL_AT": "published:2"}, capture_output=True
    )
    assert done.returncode == -signal.SIGKILL
    # two files published under their final names, at least one of them not recorded (recording follows
    # publication). Which two: the units' writers run concurrently, so not always the first two by name.
    published = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(published) >= 2 and _finished_units(out) < len(published), (published, _finished_units(out))
    _rerun(src, out)
    assert snapshot(out) == ref and listing(out) == names


def test_damaged_finished_file_is_redone(reference, tmp_path):
    src, ref, names = reference
    out = tmp_path / "out"
    _rerun(src, out)
    with open(out / "model-00003-of-00004.safetensors", "r+b") as fh:
        fh.truncate(100)
    again = convert(str(src), out, ConvertOptions(min_free_gb=0))
    assert again.units_redone == ["model.layers.1"] and again.units_converted == 1
    assert snapshot(out) == ref


def test_kill_during_a_download_then_resume(hub, tmp_path):
    folder = tmp_path / "repo"
    make_checkpoint(folder, SPEC)
    hub.add_repo("org/tiny", {"main": folder})
    convert("org/tiny", tmp_path / "ref", ConvertOptions(min_free_gb=0))
    ref = snapshot(tmp_path / "ref")
    assert listing(tmp_path / "ref") == listing(tmp_path / "ref")  # no .colitools-download left
    assert ".colitools-download" not in listing(tmp_path / "ref")

    shard = "model-00002-of-00003.safetensors"
    size = (folder / shard).stat().st_size
    hub.throttle(shard, 40_000)
    hub.reset_stats()
    out = tmp_path / "out"
    part = out / ".colitools-download" / (shard + ".part")
    proc = _start("org/tiny", out, {})
    _wait_for(proc, lambda: part.exists() and part.stat().st_size > 20_000)
    _kill(proc)
    have = part.stat().st_size
    assert 0 < have < size
    hub.throttle(shard, None)
    _rerun("org/tiny", out)
    assert snapshot(out) == ref and listing(out) == listing(tmp_path / "ref")
    ranges = hub.stats(shard).ranges
    # the rerun resumed the part with a Range request
    assert (have, size) in [tuple(r) for r in ranges], ranges


def _flip_bf16_signs(shard: Path) -> None:
    """Flip the sign bit of every BF16 value of ``shard`` in place: same size, other content; then put its
    mtime back (only ctime, which no user-level call can set, still shows the edit)."""
    st = shard.stat()
    with open(shard, "r+b") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__" or info["dtype"] != "BF16":
                continue
            start, end = info["data_offsets"]
            fh.seek(base + start)
            values = bytearray(fh.read(end - start))
            values[1::2] = bytes(
                b ^ 0x80 for b in values[1::2]
            )  # little-endian: the sign is in the high byte
            fh.seek(base + start)
            fh.write(values)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_size == st.st_size and shard.stat().st_mtime_ns == st.st_mtime_ns


def test_source_changed_after_a_kill_redoes_its_units_byte_identical_to_the_new_source(tmp_path):
    import shutil

    from colitools.verify.container import verify_container

    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    proc = _start(src, out, {"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "1.5"})
    _wait_for(proc, lambda: _finished_units(out) >= 2)
    _kill(proc)
    ledger = json.loads((out / "colitools.json").read_text())
    finished = list(ledger["units"])
    shard = next(iter(ledger["units"][finished[-1]]["sources"]))  # read by a finished unit
    readers = [k for k in finished if shard in ledger["units"][k]["sources"]]
    old_bytes = snapshot(out)
    _flip_bf16_signs(src / shard)

    done = subprocess.run([*_cmd(src, out), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["units_redone"] == readers
    assert all(shard in summary["redo_reasons"][k] for k in readers)
    assert summary["units_skipped"] == len(finished) - len(readers)

    # the reference: an uninterrupted conversion of the NEW source, from the same folder (same manifest source)
    moved = tmp_path / "resumed"
    out.rename(moved)
    convert(str(src), out, ConvertOptions(min_free_gb=0))
    assert snapshot(moved) == snapshot(out) and listing(moved) == listing(out)
    assert any(old_bytes.get(k) != v for k, v in snapshot(out).items() if k.endswith(".safetensors"))
    assert verify_container(moved).ok
    shutil.rmtree(out)


def test_finished_units_record_the_identity_of_their_source_shards(reference, tmp_path):
    src, _, _ = reference
    out = tmp_path / "out"
    _rerun(src, out)
    units = json.loads((out / "colitools.json").read_text())["units"]
    for rec in units.values():
        for shard, ident in rec["sources"].items():
            st = (src / shard).stat()
            stat = {k: v for k, v in ident.items() if k != "fingerprint"}  # test_resume_moved.py checks the rest
            assert stat == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
            assert set(ident) == {"size", "mtime_ns", "ctime_ns", "fingerprint"}


def _marked_pids(marker: str) -> list[int]:
    """Every live process whose environment holds ``marker`` (the parent and whatever it started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                status = (entry / "status").read_text()
                if "\nState:\tZ" not in status:  # a zombie holds nothing
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _read_to_eof(stream, timeout: float) -> bool:
    import threading

    done = threading.Event()

    def drain():
        while stream.read(65536):
            pass
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    return done.wait(timeout)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_sigkill_of_a_parallel_conversion_leaves_no_process_behind(reference, tmp_path):
    import uuid

    src, _, _ = reference
    out = tmp_path / "out"
    marker = f"COLITOOLS_TEST_MARKER={uuid.uuid4()}"
    env = {**os.environ, "COLITOOLS_TEST_MARKER": marker.split("=", 1)[1],
           "COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "0.05"}  # fmt: skip
    exe = Path(sys.executable).parent / "colitools"
    proc = subprocess.Popen(
        [str(exe), "convert", str(src), str(out), "--min-free-gb", "0", "--workers", "2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        # both workers started and at work: the unit temporaries are growing
        _wait_for(
            proc, lambda: len(_marked_pids(marker)) >= 3 and any(".tmp-" in p.name for p in out.iterdir())
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        end = time.monotonic() + 20
        while _marked_pids(marker) and time.monotonic() < end:
            time.sleep(0.1)
        left = _marked_pids(marker)
        assert not left, f"processes outlived the killed parent: {left}"
        assert _read_to_eof(proc.stdout, 20) and _read_to_eof(proc.stderr, 20), "a pipe is still held open"
    finally:
        for pid in _marked_pids(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_resume_after_config_json_changed_is_refused_naming_the_file_and_the_key(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_checkpoint(src, SPEC)
    proc = _start(src, out, {"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "1.5"})
    _wait_for(proc, lambda: _finished_units(out) >= 1)
    _kill(proc)
    config = json.loads((src / "config.json").read_text())
    assert config["num_hidden_layers"] == 3
    # the third layer becomes an MTP layer: other formats, other file sizes
    config["num_hidden_layers"], config["num_nextn_predict_layers"] = 2, 1
    (src / "config.json").write_text(json.dumps(config))
    before = snapshot(out)
    done = subprocess.run(_cmd(src, out), capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"colitools: error: {out / 'colitools.json'}: config.json changed since "), line
    assert "(num_hidden_layers: 3, now 2; num_nextn_predict_layers: 0, now 1)" in line, line
    assert "another colitools version" not in line, line
    assert snapshot(out) == before  # refused before anything is written

    # a ledger of an earlier colitools records no config: the refusal cannot name it, and says so
    ledger = json.loads((out / "colitools.json").read_text())
    del ledger["source_config"]
    (out / "colitools.json").write_text(json.dumps(ledger))
    done = subprocess.run(_cmd(src, out), capture_output=True, text=True)
    assert done.returncode == 1 and "the recorded plan's files differ" in done.stderr, done.stderr
