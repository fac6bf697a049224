"""Parallel Range streams (``download_file(streams=N)``, ``download_streams.py``) against the fake Hub: real HTTP
through huggingface_hub's URLs and headers, real files, a real process killed with a real SIGKILL."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from urllib.parse import urlsplit

import httpx2
import pytest
from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers
from midkill import sigkill_when

from colitools.converters import download_streams as ds
from colitools.converters import ranged_part as rp
from colitools.converters.download import Backoff, download_file
from colitools.converters.options import DEFAULT_DOWNLOAD_STREAMS, ConvertOptions
from colitools.converters.sources import open_source
from colitools.errors import ConvertError, ParameterError

FAST = Backoff(base=0.01, maximum=0.05)
NAME = "model-00001-of-00001.safetensors"
KiB, MiB = 1 << 10, 1 << 20
CHUNK = 256 * KiB


@pytest.fixture
def remote(hub, tmp_path):
    """A repo with one LFS file of 3 MiB + 5 bytes of random bytes; returns (url, data)."""
    folder = tmp_path / "repo"
    folder.mkdir()
    data = os.urandom(3 * MiB + 5)
    (folder / NAME).write_bytes(data)
    hub.add_repo("org/toy", {"main": folder})
    return hf_hub_url("org/toy", NAME, endpoint=hub.endpoint), data


def fetch(url, dest, data, streams=4, **kwargs):
    kwargs.setdefault("backoff", FAST)
    return download_file(url, dest, len(data), hashlib.sha256(data).hexdigest(), build_hf_headers(),
                         streams=streams, chunk_bytes=CHUNK, **kwargs)  # fmt: skip


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".part", ".ranges")))


def downloads(hub, name):
    """The byte ranges served for ``name`` but the header reads (huggingface_hub's
    ``parse_safetensors_file_metadata`` asks for ``bytes=0-100000``)."""
    return [r for r in hub.stats(name).ranges if r != (0, 100_001)]


def covered(ranges):
    return rp.merge(list(ranges))


@pytest.mark.parametrize("streams", [1, 4])
def test_bytes_identical_to_the_source_with_1_and_4_streams(hub, remote, tmp_path, streams):
    url, data = remote
    out = fetch(url, tmp_path / NAME, data, streams=streams)
    assert out.read_bytes() == data and leftovers(tmp_path) == []
    stats = hub.stats(NAME)
    assert stats.bytes_served == len(data)  # nothing asked twice
    if streams == 1:
        assert stats.ranges == [(0, len(data))]  # today's single stream
    else:
        assert sorted(stats.ranges) == [(a, min(a + CHUNK, len(data))) for a in range(0, len(data), CHUNK)]
        assert 1 <= stats.redirects <= 4  # a stream's first range at most through the Hub's redirect, then straight
    assert hub.cdn_auth_headers == 0


def test_a_part_left_by_one_stream_is_resumed_by_four_keeping_its_bytes(hub, remote, tmp_path):
    url, data = remote
    (tmp_path / (NAME + ".part")).write_bytes(data[:700_000])
    out = fetch(url, tmp_path / NAME, data)
    assert out.read_bytes() == data and leftovers(tmp_path) == []
    stats = hub.stats(NAME)
    assert covered(stats.ranges) == [(700_000, len(data))]
    assert stats.bytes_served == len(data) - 700_000


def test_a_torn_last_record_only_means_those_bytes_are_asked_again(hub, remote, tmp_path):
    url, data = remote
    part = tmp_path / (NAME + ".part")
    part.write_bytes(data[:MiB] + bytes(len(data) - MiB))  # a full-size part, its first MiB written
    (tmp_path / (NAME + ".part.ranges")).write_bytes(b"0 1048576\n2097152 31")  # killed mid-record
    out = fetch(url, tmp_path / NAME, data)
    assert out.read_bytes() == data and leftovers(tmp_path) == []
    assert covered(hub.stats(NAME).ranges) == [(MiB, len(data))]
    assert hub.stats(NAME).bytes_served == len(data) - MiB


def test_sigkill_mid_download_then_the_rerun_fetches_only_the_missing_ranges(hub, tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    data = os.urandom(32 * MiB + 123)
    (folder / "model.safetensors").write_bytes(data)
    hub.add_repo("org/big", {"main": folder})
    hub.throttle("model.safetensors", 4 * MiB)  # per connection: seconds for the whole file, time to kill it
    workdir = tmp_path / "work"
    part, log = workdir / "model.safetensors.part", workdir / "model.safetensors.part.ranges"
    child = textwrap.dedent(
        """
        import sys
        from colitools.converters.sources import open_source
        open_source("org/big", workdir=sys.argv[1], download_streams=4).ensure_local("model.safetensors")
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child, str(workdir)], stderr=subprocess.PIPE, text=True)

    def some_ranges_done():
        done = rp.read_log(log) or []
        return len(done) >= 2 and 2 * MiB < sum(b - a for a, b in done) < len(data) // 2

    sigkill_when(proc, some_ranges_done)
    done = rp.read_log(log)
    kept = sum(b - a for a, b in done)
    assert part.stat().st_size == len(data) and not (workdir / "model.safetensors").exists()
    assert all(part.read_bytes()[a:b] == data[a:b] for a, b in done)  # the log names only bytes on disk

    hub.throttle("model.safetensors", None)
    hub.reset_stats()
    rerun = open_source("org/big", workdir=workdir, backoff=FAST, download_streams=4)
    out = rerun.ensure_local("model.safetensors")
    assert out.read_bytes() == data and leftovers(workdir) == []
    stats = hub.stats("model.safetensors")
    assert stats.bytes_served == len(data) - kept  # what was on disk was not downloaded again
    assert covered(stats.ranges + done) == [(0, len(data))]
    assert all(b <= x or a >= y for a, b in stats.ranges for x, y in done)


@pytest.mark.parametrize("streams", [1, 4])
def test_a_stalled_stream_is_dropped_and_its_range_asked_again(hub, remote, tmp_path, monkeypatch, streams):
    url, data = remote
    monkeypatch.setenv(ds.STALL_ENV, "2")
    hub.stall(NAME, 100_000)  # the first response sends 100 000 bytes, then nothing, connection open
    out = fetch(url, tmp_path / NAME, data, streams=streams)
    assert out.read_bytes() == data and leftovers(tmp_path) == []
    stats = hub.stats(NAME)
    assert stats.stalls == 1
    assert stats.bytes_served == len(data)  # the stalled stream's bytes were kept, the rest asked again
    assert any(a == start + 100_000 for a, _ in stats.ranges for start, _ in stats.ranges[:1])


def test_on_last_chunk_is_called_once_while_the_last_chunks_are_still_arriving(hub, remote, tmp_path, monkeypatch):
    url, data = remote
    monkeypatch.setenv(ds.STALL_ENV, "2")
    hub.stall(NAME, 100_000)  # one stream's chunk holds for 2 s: the others run out of chunks meanwhile
    calls = []
    out = fetch(url, tmp_path / NAME, data, on_last_chunk=lambda: calls.append(hub.stats(NAME)))
    assert out.read_bytes() == data
    assert len(calls) == 1
    # told while a chunk was still owed: the stalled one (its rest is asked again after the stall)
    assert calls[0].stalls == 1 and calls[0].bytes_served < len(data)
    assert hub.stats(NAME).bytes_served == len(data)


def test_drops_and_5xx_are_retried_per_stream_without_fetching_twice(hub, remote, tmp_path):
    url, data = remote
    hub.drop_after(NAME, 50_000, times=3)
    out = fetch(url, tmp_path / NAME, data)
    assert out.read_bytes() == data
    assert hub.stats(NAME).bytes_served == len(data) and hub.stats(NAME).drops == 3
    hub.fail_next(3, status=503)
    out = fetch(url, tmp_path / "again" / NAME, data)
    assert out.read_bytes() == data


def test_a_range_over_plain_http_is_read_straight_from_the_cdn_socket(hub, remote):
    """``direct_socket``: the body of a range on a plain HTTP/1.1 connection is read from its socket (the path every
    ranged download here takes), the CDN's after the redirect; a response that names no connection goes through
    httpx2."""
    url, _ = remote
    with httpx2.Client(follow_redirects=True) as client:
        with client.stream("GET", url, headers={"Range": "bytes=0-99", "Accept-Encoding": "identity"}) as response:
            sock = ds.direct_socket(response)
            assert isinstance(sock, socket.socket)
            assert sock.getpeername()[1] == urlsplit(hub.cdn_endpoint).port
    assert ds.direct_socket(httpx2.Response(206, headers={"Content-Length": "100"})) is None


def test_a_server_ignoring_range_gets_one_stream(hub, remote, tmp_path):
    url, data = remote
    hub.ignore_range = True
    out = fetch(url, tmp_path / NAME, data)
    assert out.read_bytes() == data and leftovers(tmp_path) == []
    assert hub.stats(NAME).ranges[-1] == (0, len(data))


def test_a_corrupted_chunk_is_caught_by_sha256_and_fetched_again(hub, remote, tmp_path):
    url, data = remote
    hub.corrupt(NAME, offset=1_000_000)
    out = fetch(url, tmp_path / NAME, data)
    assert out.read_bytes() == data and leftovers(tmp_path) == []
    assert hub.stats(NAME).corrupted == 1
    # a bad digest: the whole file once more, from scratch, as one stream does
    assert hub.stats(NAME).bytes_served == 2 * len(data)


def test_corruption_that_persists_is_one_error_and_leaves_no_part(hub, remote, tmp_path):
    url, data = remote
    hub.corrupt(NAME, offset=2_000_000, times=2)
    with pytest.raises(ConvertError, match=rf"{NAME}: sha256 .* does not match .*again from scratch"):
        fetch(url, tmp_path / NAME, data)
    assert leftovers(tmp_path) == [] and not (tmp_path / NAME).exists()


def test_refused_download_is_one_error_and_the_token_never_reaches_the_cdn(hub, remote, tmp_path):
    url, data = remote
    hub.token = "hf_secret"
    refused = rf"{NAME}: download refused with HTTP 401 Unauthorized from http://"
    with pytest.raises(ConvertError, match=refused):
        fetch(url, tmp_path / NAME, data)
    assert len([1 for _, path, _ in hub.log if "/resolve/" in path]) <= 4  # one per stream at most, no retry
    digest = hashlib.sha256(data).hexdigest()
    out = download_file(url, tmp_path / NAME, len(data), digest, build_hf_headers(token="hf_secret"),
                        streams=4, chunk_bytes=CHUNK)  # fmt: skip
    assert out.read_bytes() == data
    assert hub.stats(NAME).gets > 4 and hub.cdn_auth_headers == 0  # the token stayed on the Hub, every range


def test_downloads_sharing_stream_slots_keep_to_its_count_of_connections(hub, tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    files = {f"part-{i}.safetensors": os.urandom(2 * MiB + i) for i in range(2)}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    hub.add_repo("org/two", {"main": folder})
    hub.throttle(None, 4 * MiB)  # a body lasts long enough for the two downloads to meet
    slots = ds.StreamSlots(2)

    def get(name: str) -> None:
        fetch(hf_hub_url("org/two", name, endpoint=hub.endpoint), tmp_path / "out" / name, files[name], streams=2,
              stream_slots=slots)  # fmt: skip

    threads = [threading.Thread(target=get, args=(name,)) for name in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {name: (tmp_path / "out" / name).read_bytes() for name in files} == files
    # 2 streams each, 2 slots for both: never the 4 connections of two unshared downloads. The Hub counts a body
    # out when its handler returns, which on a loaded machine can be after the client has read the last byte,
    # released the slot and asked for the next body: one body of slack
    assert 2 <= hub.cdn_bodies_most <= 3


def test_later_chunks_go_to_the_cdn_straight_and_never_carry_the_token(hub, remote, tmp_path):
    url, data = remote
    hub.token = "hf_secret"
    digest = hashlib.sha256(data).hexdigest()
    out = download_file(url, tmp_path / NAME, len(data), digest, build_hf_headers(token="hf_secret"),
                        streams=2, chunk_bytes=CHUNK)  # fmt: skip
    assert out.read_bytes() == data
    stats = hub.stats(NAME)
    assert stats.gets == -(-len(data) // CHUNK) == 13  # a body per chunk
    assert stats.redirects <= 2  # each stream's first chunk at most: the other 11 asked the CDN's URL straight
    assert hub.cdn_auth_headers == 0


def test_a_learned_url_carries_the_token_only_when_the_redirect_kept_it():
    job = ds.StreamJob("http://hub.test/f", NAME, {"Authorization": "Bearer hf_x", "Accept-Encoding": "identity"},
                       10, None, 1, FAST, 2, 5)  # fmt: skip
    hop = httpx2.Response(302, request=httpx2.Request("GET", job.url))
    for carried, kept in (({"Authorization": "Bearer hf_x"}, True), ({}, False)):  # same origin / another one
        target = ds._Target(job)
        final = httpx2.Request("GET", "https://cdn.test/b?sig=1", headers=carried)
        target.learn(httpx2.Response(206, request=final, history=[hop]))
        url, headers = target.now()
        assert url == "https://cdn.test/b?sig=1"
        assert ("Authorization" in headers) is kept and headers["Accept-Encoding"] == "identity"


def test_a_cdn_url_refused_later_sends_the_chunk_back_through_the_hub(hub, remote, tmp_path):
    url, data = remote
    job = ds.StreamJob(url, NAME, {"Accept-Encoding": "identity"}, len(data), None, 3, FAST, 1, len(data))
    target = ds._Target(job)
    with httpx2.Client(follow_redirects=True) as client:
        with client.stream("GET", url, headers={**job.headers, "Range": "bytes=0-0"}) as first:
            target.learn(first)  # a 206 after the Hub's redirect
        learned = target.now()[0]
        assert urlsplit(learned).port == urlsplit(hub.cdn_endpoint).port
        deadline = time.monotonic() + 10  # the server counts that byte after the client has read it
        while hub.stats(NAME).bytes_served < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        hub.reset_stats()
        hub.fail_next(1, 403, "/blobs/")  # the CDN refuses the learned URL once, as an expired signature
        with rp.RangedPart(tmp_path / "file.part", len(data), None) as part:
            chunk = ds._Chunk(job, part, 0, len(data), threading.Event(), bytearray(ds.WRITE_BYTES), target)
            chunk.fetch(client)
            assert part.hexdigest() == hashlib.sha256(data).hexdigest()
    assert [status for _, _, status in hub.log] == [403, 302, 206]  # refused, then the Hub's redirect, the body
    assert hub.stats(NAME).bytes_served == len(data)


def test_the_option_is_validated_and_the_cli_default_is_the_libraries():
    from colitools.cli import convert_cmd

    assert convert_cmd._DEFAULT_STREAMS == DEFAULT_DOWNLOAD_STREAMS == ds.DEFAULT_STREAMS
    with pytest.raises(ParameterError, match="download_streams=0"):
        ConvertOptions(download_streams=0)
    assert ds.chunk_for(5 << 30, 4) == ds.MAX_CHUNK  # 80 chunks, 20 per stream
    assert ds.chunk_for(100 * MiB, 4) == 100 * MiB // 16  # 13 chunks of 8 MiB evened out to 16
    for size, streams in ((100 * MiB + 1, 4), (3 * MiB, 8), (10**9, 3)):
        count = -(-size // ds.chunk_for(size, streams))
        assert count % streams == 0 or count == 1


def test_convert_from_the_hub_with_streams_matches_one_stream(hub, tmp_path):
    from convcheck import snapshot
    from tinyckpt import Tiny, make_checkpoint

    folder = tmp_path / "repo"
    make_checkpoint(folder, Tiny(layers=1, experts=4, hidden=512, inter=1024, shards=1))
    shard = folder / "model.safetensors"
    assert shard.stat().st_size > ds.MIN_CHUNK
    hub.add_repo("org/tiny", {"main": folder})
    outs = {}
    for streams in ("1", None):
        hub.reset_stats()
        out = tmp_path / f"out-{streams or 'default'}"
        command = [sys.executable, "-m", "colitools", "convert", "org/tiny", str(out), "--min-free-gb", "0"]
        command += ["--download-streams", streams] if streams else []
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)  # HF_ENDPOINT & co
        assert result.returncode == 0, result.stderr
        outs[streams] = snapshot(out)
        download = downloads(hub, shard.name)
        assert covered(download) == [(0, shard.stat().st_size)]
        assert sum(b - a for a, b in download) == shard.stat().st_size
        assert len(download) == (1 if streams else DEFAULT_DOWNLOAD_STREAMS)  # the default: N ranges
    assert outs["1"] == outs[None]


def test_sigkill_of_convert_mid_download_resumes_and_matches_a_one_stream_conversion(hub, tmp_path):
    from convcheck import snapshot
    from tinyckpt import Tiny, make_checkpoint

    folder = tmp_path / "repo"
    make_checkpoint(folder, Tiny(layers=1, experts=4, hidden=512, inter=1024, shards=1))
    shard = folder / "model.safetensors"
    size = shard.stat().st_size
    hub.add_repo("org/tiny", {"main": folder})
    base = [sys.executable, "-m", "colitools", "convert", "org/tiny"]
    ref = subprocess.run([*base, str(tmp_path / "ref"), "--min-free-gb", "0", "--download-streams", "1"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ref.returncode == 0, ref.stderr

    out = tmp_path / "out"
    log = out / ".colitools-download" / "model.safetensors.part.ranges"
    hub.throttle(shard.name, 1 * MiB)  # per connection
    proc = subprocess.Popen([*base, str(out), "--min-free-gb", "0", "--no-progress"], stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    sigkill_when(proc, lambda: 2 * MiB < sum(b - a for a, b in rp.read_log(log) or []) < size - 4 * MiB)
    kept = sum(b - a for a, b in rp.read_log(log))

    hub.throttle(shard.name, None)
    hub.reset_stats()
    rerun = subprocess.run([*base, str(out), "--min-free-gb", "0"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert snapshot(out) == snapshot(tmp_path / "ref")
    download = downloads(hub, shard.name)
    assert sum(b - a for a, b in download) == size - kept  # the killed run's bytes on disk were kept
    assert not (out / ".colitools-download").exists()
