"""download_file against the fake Hub: resume, retries, verification, publication (real HTTP, real files)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers

from colitools.converters.download import Backoff, download_file
from colitools.converters.sources import open_source
from colitools.errors import ConvertError, DiskFloorStop

FAST = Backoff(base=0.01, maximum=0.05)
NAME = "model-00001-of-00001.safetensors"
MiB = 1 << 20


class ByteCounter:
    """A tqdm-compatible progress sink."""

    def __init__(self):
        self.n = 0
        self.negative = 0

    def update(self, n):
        self.n += n
        if n < 0:
            self.negative += 1


@pytest.fixture
def remote(hub, tmp_path):
    """A repo with one LFS file of 1.5 MiB of random bytes; returns (url, data)."""
    folder = tmp_path / "repo"
    folder.mkdir()
    data = os.urandom(3 * MiB // 2)
    (folder / NAME).write_bytes(data)
    (folder / "config.json").write_text('{"model_type": "toy"}')
    hub.add_repo("org/toy", {"main": folder})
    return hf_hub_url("org/toy", NAME, endpoint=hub.endpoint), data


def fetch(url, dest, data, **kwargs):
    kwargs.setdefault("backoff", FAST)
    return download_file(url, dest, len(data), hashlib.sha256(data).hexdigest(), build_hf_headers(), **kwargs)


def test_full_download_is_verified_published_and_leaves_no_part(hub, remote, tmp_path):
    url, data = remote
    progress = ByteCounter()
    out = fetch(url, tmp_path / "w" / NAME, data, progress=progress)
    assert out == tmp_path / "w" / NAME
    assert out.read_bytes() == data
    assert not (tmp_path / "w" / (NAME + ".part")).exists()
    stats = hub.stats(NAME)
    assert (stats.redirects, stats.gets, stats.bytes_served) == (1, 1, len(data))
    assert progress.n == len(data)


def test_dropped_connection_resumes_at_the_offset_it_reached(hub, remote, tmp_path):
    url, data = remote
    hub.drop_after(NAME, 600_000)
    out = fetch(url, tmp_path / NAME, data)
    assert out.read_bytes() == data
    stats = hub.stats(NAME)
    assert stats.drops == 1
    assert stats.ranges == [(0, len(data)), (600_000, len(data))]
    assert stats.bytes_served == len(data)  # nothing fetched twice


def test_repeated_drops_keep_making_progress(hub, remote, tmp_path):
    url, data = remote
    hub.drop_after(NAME, 200_000, times=5)
    out = fetch(url, tmp_path / NAME, data, retries=1)  # each attempt brings bytes, so 1 retry is enough
    assert out.read_bytes() == data
    assert [start for start, _ in hub.stats(NAME).ranges] == [
        0,
        200_000,
        400_000,
        600_000,
        800_000,
        1_000_000,
    ]
    assert hub.stats(NAME).bytes_served == len(data)


def test_existing_part_from_an_earlier_run_is_resumed_and_hashed(hub, remote, tmp_path):
    url, data = remote
    (tmp_path / (NAME + ".part")).write_bytes(data[:700_000])
    progress = ByteCounter()
    disk_requests = []
    out = fetch(url, tmp_path / NAME, data, progress=progress, disk_check=disk_requests.append)
    assert out.read_bytes() == data
    assert hub.stats(NAME).ranges == [(700_000, len(data))]
    assert hub.stats(NAME).bytes_served == len(data) - 700_000
    assert disk_requests == [len(data) - 700_000]
    assert progress.n == len(data)


def test_resume_survives_sigkill_of_the_downloading_process(hub, tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    data = os.urandom(4 * MiB)
    (folder / "model.safetensors").write_bytes(data)
    hub.add_repo("org/big", {"main": folder})
    hub.throttle("model.safetensors", 2 * MiB)  # about 2 s for the whole file: time to kill it midway
    workdir = tmp_path / "work"
    part = workdir / "model.safetensors.part"
    child = textwrap.dedent(
        """
        import sys
        from colitools.converters.sources import open_source
        open_source("org/big", workdir=sys.argv[1]).ensure_local("model.safetensors")
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child, str(workdir)])  # inherits HF_ENDPOINT & co
    try:
        deadline = time.monotonic() + 20
        while not (part.exists() and part.stat().st_size >= 300_000):
            assert proc.poll() is None, "the child ended before it could be killed"
            assert time.monotonic() < deadline, "the child never started downloading"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)  # no-op if the child already ended (and was reaped)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    kept = part.stat().st_size
    assert 0 < kept < len(data)
    assert not (workdir / "model.safetensors").exists()

    hub.throttle("model.safetensors", None)
    out = open_source("org/big", workdir=workdir, backoff=FAST).ensure_local("model.safetensors")
    assert out == workdir / "model.safetensors" and not part.exists()
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    stats = hub.stats("model.safetensors")
    assert stats.ranges == [(0, len(data)), (kept, len(data))]  # the rerun asked for the missing bytes only
    assert stats.bytes_served < 2 * len(data)


def test_corrupted_byte_is_caught_by_sha256_and_refetched_once(hub, remote, tmp_path):
    url, data = remote
    hub.corrupt(NAME, offset=123_456)
    progress = ByteCounter()
    out = fetch(url, tmp_path / NAME, data, progress=progress)
    assert out.read_bytes() == data
    stats = hub.stats(NAME)
    assert stats.corrupted == 1
    assert stats.ranges == [(0, len(data)), (0, len(data))]
    assert progress.n == len(data)  # the discarded copy was taken back off the bar


def test_corruption_that_persists_is_a_convert_error_and_removes_the_part(hub, remote, tmp_path):
    url, data = remote
    hub.corrupt(NAME, offset=10, times=2)
    with pytest.raises(ConvertError, match=rf"{NAME}: sha256 .* does not match .*again from scratch"):
        fetch(url, tmp_path / NAME, data)
    assert not (tmp_path / (NAME + ".part")).exists()
    assert not (tmp_path / NAME).exists()


def test_burst_of_5xx_is_retried(hub, remote, tmp_path):
    url, data = remote
    hub.fail_next(3, status=503)
    out = fetch(url, tmp_path / NAME, data)
    assert out.read_bytes() == data
    assert [status for _, path, status in hub.log if "/resolve/" in path] == [503, 503, 503, 302]


def test_endless_5xx_gives_up_after_the_retry_budget_and_keeps_the_part(hub, remote, tmp_path):
    url, data = remote
    (tmp_path / (NAME + ".part")).write_bytes(data[:1000])
    hub.fail_next(100, status=502)
    with pytest.raises(ConvertError, match=r"failed at byte 1000 of 1572864 after 3 attempts .*HTTP 502"):
        fetch(url, tmp_path / NAME, data, retries=2)
    assert (tmp_path / (NAME + ".part")).stat().st_size == 1000


def test_server_ignoring_range_restarts_from_byte_zero(hub, remote, tmp_path):
    url, data = remote
    (tmp_path / (NAME + ".part")).write_bytes(data[:5000])
    hub.ignore_range = True
    progress = ByteCounter()
    out = fetch(url, tmp_path / NAME, data, progress=progress)
    assert out.read_bytes() == data
    assert hub.stats(NAME).ranges == [(0, len(data))]
    assert progress.n == len(data) and progress.negative == 1


def test_stale_part_longer_than_the_file_is_discarded(hub, remote, tmp_path):
    url, data = remote
    (tmp_path / (NAME + ".part")).write_bytes(b"x" * (len(data) + 10))
    out = fetch(url, tmp_path / NAME, data)
    assert out.read_bytes() == data
    assert hub.stats(NAME).ranges == [(0, len(data))]


def test_wrong_expected_size_is_a_convert_error_naming_both_sizes(hub, remote, tmp_path):
    url, data = remote
    with pytest.raises(
        ConvertError, match=rf"{NAME}: the server has {len(data)} bytes, expected {len(data) + 1}"
    ):
        download_file(url, tmp_path / NAME, len(data) + 1, None, build_hf_headers(), backoff=FAST)


def test_disk_check_can_stop_before_any_byte_is_requested(hub, remote, tmp_path):
    url, data = remote

    def floor(needed):
        raise DiskFloorStop(f"need {needed} bytes")

    with pytest.raises(DiskFloorStop, match=f"need {len(data)} bytes"):
        fetch(url, tmp_path / NAME, data, disk_check=floor)
    assert hub.stats(NAME).gets == 0


def test_http_401_is_reported_at_once_without_retries(hub, remote, tmp_path):
    url, data = remote
    hub.token = "hf_secret"
    with pytest.raises(
        ConvertError, match=rf"{NAME}: download refused with HTTP 401 Unauthorized from http://"
    ):
        fetch(url, tmp_path / NAME, data)
    assert len([1 for _, path, _ in hub.log if "/resolve/" in path]) == 1
    out = download_file(
        url, tmp_path / NAME, len(data), hashlib.sha256(data).hexdigest(), build_hf_headers(token="hf_secret")
    )
    assert out.read_bytes() == data
    assert hub.cdn_auth_headers == 0  # the token stayed on the Hub, not sent to the CDN


def test_small_regular_file_is_served_without_redirect(hub, remote, tmp_path):
    url = hf_hub_url("org/toy", "config.json", endpoint=hub.endpoint)
    out = download_file(url, tmp_path / "config.json", None, None, build_hf_headers())
    assert out.read_text() == '{"model_type": "toy"}'
    assert hub.stats("config.json").redirects == 0


def test_cli_shard_failing_its_sha256_twice_names_its_size_after_one_prefixed_warning(hub, tmp_path):
    from tinyckpt import Tiny, make_checkpoint

    folder = tmp_path / "repo"
    make_checkpoint(folder, Tiny(layers=1, experts=2, hidden=64, inter=64, shards=1))
    shard = folder / "model.safetensors"
    size = shard.stat().st_size
    hub.add_repo("org/tiny", {"main": folder})
    hub.corrupt(shard.name, offset=size - 100, times=2)  # in the data, past the header the plan reads
    command = [
        sys.executable,
        "-m",
        "colitools",
        "convert",
        "org/tiny",
        str(tmp_path / "out"),
        "--min-free-gb",
        "0",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)  # inherits HF_ENDPOINT & co
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"colitools: warning: {shard.name}: sha256 mismatch (got "), lines[0]
    assert lines[0].endswith("); downloading again"), lines[0]
    expected = hashlib.sha256(shard.read_bytes()).hexdigest()
    assert lines[1].startswith(f"colitools: error: {shard.name}: sha256 "), lines[1]
    assert f"does not match the expected {expected} ({size} bytes), also after downloading" in lines[1], (
        lines[1]
    )
    assert hub.stats(shard.name).corrupted == 2
