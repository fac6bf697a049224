"""A Hub endpoint that refuses the connection while the Hugging Face cache holds the whole model: one quick retry,
then one line saying to set HF_HUB_OFFLINE=1 (``converters/cache_hint.py``); with it set, the cache converts.

Real processes (the console script), the real huggingface_hub client filling the cache from the fake Hub
(``hubserver.py``), and a port on 127.0.0.1 nobody listens on (a real ECONNREFUSED).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from hubserver import write_hf_cache
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.cache_hint import cached_snapshot, is_connection_refused

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import colitools  # noqa: E402

SPEC = Tiny(layers=2, experts=2, hidden=128, inter=64, shards=3)


def closed_port() -> str:
    """An endpoint on 127.0.0.1 whose port was just released: connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def cached_repo(hub, tmp_path) -> Path:
    """org/tiny on the fake Hub, every file downloaded into the HF cache by huggingface_hub itself."""
    from huggingface_hub import hf_hub_download

    repo = tmp_path / "repo"
    make_checkpoint(repo, SPEC)
    hub.add_repo("org/tiny", {"main": repo})
    for path in sorted(repo.iterdir()):
        hf_hub_download("org/tiny", path.name)
    return repo


def test_a_refused_connection_with_the_model_cached_says_set_hf_hub_offline_in_one_line(
    hub, cached_repo, tmp_path
):
    endpoint = closed_port()
    result = colitools("convert", "org/tiny", tmp_path / "out", "--min-free-gb", "0", HF_ENDPOINT=endpoint)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # no "retrying in" warnings: one quick quiet retry
    line = lines[0]
    assert line.startswith("colitools: error: org/tiny@main: cannot reach " + endpoint), line
    assert "holds every file of org/tiny@main: set HF_HUB_OFFLINE=1" in line, line
    offline = colitools("convert", "org/tiny", tmp_path / "out", "--min-free-gb", "0", "--no-progress",
                        HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="1")  # fmt: skip
    assert offline.returncode == 0, offline.stderr


def test_the_hint_needs_every_file_the_conversion_reads_in_the_snapshot(tmp_path):
    repo = tmp_path / "repo"
    make_checkpoint(repo, SPEC)
    cache = tmp_path / "cache"
    base = write_hf_cache(cache, "org/tiny", repo)
    commit = (base / "refs" / "main").read_text()
    assert cached_snapshot(cache, "org/tiny", "main") == base / "snapshots" / commit
    assert cached_snapshot(cache, "org/tiny", commit) == base / "snapshots" / commit
    assert cached_snapshot(cache, "org/tiny", "v2") is None
    assert cached_snapshot(cache, "org/other", "main") is None
    (base / "snapshots" / commit / "model-00002-of-00003.safetensors").unlink()  # one shard short
    assert cached_snapshot(cache, "org/tiny", "main") is None


def test_refused_is_told_apart_from_other_transport_errors():
    import httpx2

    try:
        httpx2.get(closed_port() + "/api/models/org/tiny", timeout=30)
    except httpx2.TransportError as exc:
        assert is_connection_refused(exc)
    assert not is_connection_refused(httpx2.ReadTimeout("slow"))
    wrapped = httpx2.ConnectError("x")
    wrapped.__cause__ = socket.gaierror(-3, "Temporary failure in name resolution")
    assert not is_connection_refused(wrapped)
