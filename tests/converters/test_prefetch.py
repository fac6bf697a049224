"""Download ahead (converters/prefetch.py): a Hub conversion downloads the next units' shards while a unit
converts, within the disk floor. Real ``colitools convert`` processes against the local Hub server
(``hubserver.py``), real signals; the server's request log says which bytes were fetched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest
from convcheck import snapshot
from midkill import sigkill_when
from tinyckpt import Tiny, make_checkpoint

from colitools.converters import download_streams as ds
from colitools.converters import ranged_part as rp

MiB = 1 << 20
WORK = ".colitools-download"
# three layers of 4 experts x 3 x 512 x 1024 BF16: ~13 MB per shard, over MIN_CHUNK (several Range streams)
SPEC = Tiny(layers=3, experts=4, hidden=512, inter=1024, shards=3)
# four layers over six shards: a unit reads two, the globals the first and the last
SPREAD = Tiny(layers=4, experts=4, hidden=512, inter=1024, shards=6)


def _cmd(src, out, *extra):
    return [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--no-progress", *extra]


def _run(src, out, *extra, env=None):
    result = subprocess.run(_cmd(src, out, *extra), capture_output=True, text=True, timeout=300,
                            env={**os.environ, **(env or {})})  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def _converted(out: Path) -> dict[str, bytes]:
    """The converted bytes: every output file but the manifest (which names the source: a folder or a repo)."""
    return {k: v for k, v in snapshot(out).items() if k != "colitools.json without run"}


def _served(hub, name) -> int:
    """Bytes of ``name`` the CDN sent in body responses, but huggingface_hub's header reads
    (``parse_safetensors_file_metadata`` asks for ``bytes=0-100000``)."""
    return sum(b - a for a, b in hub.stats(name).ranges if (a, b) != (0, 100_001))


def _shards(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.glob("*.safetensors")}


def _plan_units(src, out) -> list[dict]:
    result = _run(src, out, "--dry-run", "--json", "--min-free-gb", "0")
    return json.loads(result.stdout)["plan"]["units"]


def _publish(hub, folder: Path, spec: Tiny) -> Path:
    make_checkpoint(folder, spec)
    hub.add_repo("org/ahead", {"main": folder})
    return folder


@pytest.fixture
def model(hub, tmp_path):
    return _publish(hub, tmp_path / "repo", SPEC)


def test_a_download_ahead_conversion_equals_the_local_one_byte_for_byte(hub, model, tmp_path):
    _run(model, tmp_path / "local", "--min-free-gb", "0")
    hub.reset_stats()
    _run("org/ahead", tmp_path / "hub", "--min-free-gb", "0", env={"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "0.3"})
    assert _converted(tmp_path / "hub") == _converted(tmp_path / "local")
    for name, size in _shards(model).items():
        assert _served(hub, name) == size  # every byte once
    assert not (tmp_path / "hub" / WORK).exists()  # each shard deleted once no unit needed it


def test_sigkill_during_a_download_ahead_resumes_without_fetching_a_byte_twice(hub, model, tmp_path):
    _run("org/ahead", tmp_path / "ref", "--min-free-gb", "0")
    units = _plan_units("org/ahead", tmp_path / "plan")
    first = {}
    for i, unit in enumerate(units):
        for shard in unit["shards"]:
            first.setdefault(shard, i)
    # the shard the units need last: downloaded ahead while the first units convert
    late = max(first, key=first.get)
    assert first[late] > 0
    sizes = _shards(model)
    hub.reset_stats()
    hub.throttle(late, 256 * 1024)  # per connection: that shard takes seconds
    out = tmp_path / "out"
    log = out / WORK / f"{late}.part.ranges"
    # each tensor is followed by a long pause: the first unit is still converting at the kill
    proc = subprocess.Popen(_cmd("org/ahead", out, "--min-free-gb", "0"), stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLITOOLS_TEST_SLOW_TENSOR_SECONDS": "5"})  # fmt: skip
    sigkill_when(
        proc, lambda: 1 * MiB < sum(b - a for a, b in rp.read_log(log) or []) < sizes[late] - 2 * MiB
    )
    manifest = out / "colitools.json"
    recorded = json.loads(manifest.read_text())["units"] if manifest.exists() else {}
    assert units[0]["unit"] not in recorded  # ``late`` was downloading while the first unit converted
    on_disk = {name: _on_disk(out / WORK / name, size) for name, size in sizes.items()}
    assert 0 < on_disk[late] < sizes[late]
    needed = {s for u in units if u["unit"] not in recorded for s in u["shards"]}
    before = {name: _served(hub, name) for name in sizes}

    hub.throttle(late, None)
    _run("org/ahead", out, "--min-free-gb", "0")
    assert snapshot(out) == snapshot(tmp_path / "ref")
    for name, size in sizes.items():  # the rerun asked only for what was not on disk, of what it still needed
        assert _served(hub, name) - before[name] == (size - on_disk[name] if name in needed else 0), name
    assert not (out / WORK).exists()


def _on_disk(dest: Path, size: int) -> int:
    """Bytes of a shard a conversion's work folder holds: all of a published one, else what its range log says
    its part holds, else the single-stream part's length."""
    if dest.exists():
        return size
    part = dest.with_name(dest.name + ".part")
    logged = rp.read_log(rp.log_path(part))
    if logged is not None:
        return sum(b - a for a, b in logged)
    return part.stat().st_size if part.exists() else 0


def _unshared(volume: Path, size: int, script: str) -> subprocess.Popen:
    """``script`` (sh) in a mount namespace of its own where ``volume`` is a tmpfs of ``size`` bytes: a real
    small disk."""
    volume.mkdir(parents=True, exist_ok=True)
    wrapped = f"mount -t tmpfs -o size={size} tmpfs {volume} && {script}"
    return subprocess.Popen(["unshare", "-Urm", "sh", "-c", wrapped], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _held(proc: subprocess.Popen, work: str, shards: Iterable[str]) -> tuple[int, str, str]:
    """The most of ``shards`` (complete or partial) present at once in the namespace's ``work`` folder,
    sampled through ``/proc/PID/root`` until ``proc`` ends; with its stdout and stderr."""
    most, folder = 0, Path(f"/proc/{proc.pid}/root") / work.lstrip("/")
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.communicate(timeout=300)))
    reader.start()
    while reader.is_alive():
        try:
            names = {p.name.lstrip(".").split(".safetensors")[0] + ".safetensors" for p in folder.iterdir()}
        except OSError:
            names = set()
        most = max(most, len(names & set(shards)))
        reader.join(0.002)
    return most, *output


def _have_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _have_unshare(),
                    reason="needs Linux mount namespaces (unshare -Urm) for a real small disk")  # fmt: skip
def test_a_low_disk_floor_holds_fewer_shards_ahead_and_the_dry_run_counts_them(hub, tmp_path):
    model = _publish(hub, tmp_path / "repo", SPREAD)
    sizes = _shards(model)
    total = sum(sizes.values())
    units = _plan_units("org/ahead", tmp_path / "plan")
    out_bytes = sum(u["out_bytes"] for u in units)
    floor = 2_000_000  # --min-free-gb 0.002
    results = {}
    # a volume that holds every shard and the output above the floor, and one that holds what a conversion
    # without any download ahead needs at its peak (the shards each unit reads, kept from their first unit to
    # their last, and the output so far) with 3 MiB to spare: the latter cannot hold them all ahead
    tight = floor + _peak_without_ahead(units, sizes) + 3 * MiB
    assert tight < floor + out_bytes + total
    for name, capacity in (("roomy", floor + out_bytes + total + 8 * MiB), ("tight", tight)):
        volume = tmp_path / name
        out = volume / "out"
        dry = f"{sys.executable} -m colitools convert org/ahead {out} --dry-run --json --min-free-gb 0.002"
        real = f"{sys.executable} -m colitools convert org/ahead {out} --no-progress --min-free-gb 0.002"
        keep = f"cp -r {out} {tmp_path / (name + '-out')}"
        proc = _unshared(
            volume, capacity, f"{dry} && COLITOOLS_TEST_SLOW_UNIT_SECONDS=0.5 {real} >&2 && {keep}"
        )
        most, stdout, stderr = _held(proc, str(out / WORK), sizes)
        assert proc.returncode == 0, stderr
        results[name] = most, json.loads(stdout)["peak_disk_bytes"]
    _run(model, tmp_path / "local", "--min-free-gb", "0")
    for name in ("roomy", "tight"):
        assert _converted(tmp_path / f"{name}-out") == _converted(tmp_path / "local")
    (roomy_held, roomy_peak), (tight_held, tight_peak) = results["roomy"], results["tight"]
    assert tight_held < roomy_held
    assert tight_held < len(sizes)
    # the dry run's peak disk: every shard and the output on the roomy volume; at most the room on the tight one
    assert roomy_peak >= total + min(u["out_bytes"] for u in units)
    assert tight_peak <= tight - floor
    assert tight_peak < roomy_peak
    # 1 MB above the floor (the free space as the floor reads it, diskfloor.FAKE_FREE_ENV): no shard fits ahead,
    # the peak of a conversion without download ahead
    free = tmp_path / "free"
    free.write_text(str(floor + 1_000_000))
    none = _run("org/ahead", tmp_path / "plan", "--dry-run", "--json", "--min-free-gb", "0.002",
                env={"COLITOOLS_FAKE_FREE_BYTES_FILE": str(free)})  # fmt: skip
    assert json.loads(none.stdout)["peak_disk_bytes"] == _peak_without_ahead(units, sizes)


def _peak_without_ahead(units: list[dict], sizes: dict[str, int]) -> int:
    """Output so far + the unit's output + the shards alive (first use <= unit <= last use), at its largest."""
    first, last = {}, {}
    for i, unit in enumerate(units):
        for shard in unit["shards"]:
            first.setdefault(shard, i)
            last[shard] = i
    peak, done = 0, 0
    for i, unit in enumerate(units):
        alive = sum(size for s, size in sizes.items() if first[s] <= i <= last[s])
        peak = max(peak, done + unit["out_bytes"] + alive)
        done += unit["out_bytes"]
    return peak


def test_a_refused_download_ahead_is_one_line_where_its_unit_needs_the_shard(hub, model, tmp_path):
    units = _plan_units("org/ahead", tmp_path / "plan")
    first: dict[str, int] = {}
    for i, unit in enumerate(units):
        for shard in unit["shards"]:
            first.setdefault(shard, i)
    late = max(first, key=first.get)
    for shard in first:
        if shard != late:
            hub.throttle(shard, 1 * MiB)  # the shards before it take seconds: time to arm the failure
    out = tmp_path / "out"
    proc = subprocess.Popen(_cmd("org/ahead", out, "--min-free-gb", "0"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    # planned (the shards' headers read): from now on every request for ``late`` is refused
    while not (out / ".colitools-plan").exists() and proc.poll() is None:
        threading.Event().wait(0.005)
    hub.fail_next(10_000, 403, late)
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode == 1, stderr
    assert stderr.splitlines() == [stderr.splitlines()[0]]
    assert stderr.startswith(
        f"colitools: error: {late}: download refused with HTTP 403 Forbidden from http://"
    )
    recorded = json.loads((out / "colitools.json").read_text())["units"]
    assert set(recorded) == {
        u["unit"] for u in units[: first[late]]
    }  # converted up to the unit that needs it

    hub.fail_next(0)
    for shard in first:
        hub.throttle(shard, None)
    _run("org/ahead", out, "--min-free-gb", "0")
    _run(model, tmp_path / "local", "--min-free-gb", "0")
    assert _converted(out) == _converted(tmp_path / "local")


def test_the_next_shard_downloads_while_the_one_before_waits_for_its_last_chunk(hub, model, tmp_path):
    order = list(dict.fromkeys(s for u in _plan_units("org/ahead", tmp_path / "plan") for s in u["shards"]))
    first = order[0]
    hub.reset_stats()
    _run("org/ahead", tmp_path / "dry", "--dry-run", "--min-free-gb", "0")
    headers = hub.stats(first).gets  # the planning's header reads: bodies shorter than the stall point
    # the first shard's first download body sends 1 MiB, then holds its connection for 3 s (then asked again)
    hub.reset_stats()
    hub.stall(first, 1 * MiB, times=headers + 1)
    _run("org/ahead", tmp_path / "hub", "--min-free-gb", "0", env={ds.STALL_ENV: "3"})
    assert hub.stats(first).stalls == 1
    gets = [(i, name) for i, (method, path, _) in enumerate(hub.log) for name in order
            if method == "GET" and f"filename={name}" in path]  # fmt: skip
    last_of_first = max(i for i, name in gets if name == first)
    # every other shard was fetched in the first one's tail (before the stalled chunk's rest was asked again);
    # one file at a time, they would all come after it
    assert all(i < last_of_first for i, name in gets if name != first)
    for name, size in _shards(model).items():  # every byte sent once, the stalled chunk's too
        stats = hub.stats(name)
        assert stats.bytes_served - 100_001 * stats.ranges.count((0, 100_001)) == size, name
    _run(model, tmp_path / "local", "--min-free-gb", "0")
    assert _converted(tmp_path / "hub") == _converted(tmp_path / "local")
