"""Hub sources without a network: HF_HUB_OFFLINE converts from the Hugging Face cache, a DNS failure is one line.

Real processes (the console script), the real huggingface_hub client filling the cache from the fake Hub
(``hubserver.py``), and an endpoint under ``.invalid`` (a TLD that never resolves; nothing leaves the machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from convcheck import snapshot
from tinyckpt import Tiny, make_checkpoint

_SCRIPT = Path(sys.executable).with_name("colitools")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "colitools"]
UNREACHABLE = "http://nonexistent.invalid"
SPEC = Tiny(layers=2, experts=2, hidden=128, inter=64, shards=3)


def colitools(*args, **env: str) -> subprocess.CompletedProcess[str]:
    """The console script with the test's environment (the ``hub`` fixture's HF_* variables) plus ``env``."""
    full = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **env}
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=300, env=full)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("colitools: error: "), result.stderr
    return lines[0]


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


def test_offline_convert_uses_only_the_hf_cache_and_matches_an_online_conversion(hub, cached_repo, tmp_path):
    online = colitools("convert", "org/tiny", tmp_path / "online", "--min-free-gb", "0", "--no-progress")
    assert online.returncode == 0, online.stderr
    hub.reset_stats()
    offline = colitools(
        "convert", "org/tiny", tmp_path / "offline", "--min-free-gb", "0", "--no-progress",
        HF_HUB_OFFLINE="1", HF_ENDPOINT=UNREACHABLE,
    )  # fmt: skip
    assert offline.returncode == 0, offline.stderr
    assert "Traceback" not in offline.stderr
    assert all(hub.stats(p.name).gets == 0 for p in cached_repo.iterdir())
    assert snapshot(tmp_path / "offline") == snapshot(tmp_path / "online")
    assert not (tmp_path / "offline" / ".colitools-download").exists()


def test_offline_convert_names_the_first_file_missing_from_the_cache(hub, cached_repo, tmp_path):
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / "models--org--tiny" / "snapshots"
    (snapshot_dir,) = snapshots.iterdir()
    missing = "model-00002-of-00003.safetensors"
    (snapshot_dir / missing).unlink()
    result = colitools(
        "convert",
        "org/tiny",
        tmp_path / "out",
        "--min-free-gb",
        "0",
        HF_HUB_OFFLINE="1",
        HF_ENDPOINT=UNREACHABLE,
    )
    assert result.returncode == 1
    line = one_error_line(result)
    assert missing in line and "HF_HUB_OFFLINE" in line and "cache" in line, line


def test_offline_convert_of_an_uncached_repo_or_revision_is_one_line(hub, cached_repo, tmp_path):
    for args, words in (
        (("org/other",), ("org/other", "holds nothing")),
        (("org/tiny", "--revision", "v9"), ("'v9'", "cached: main")),
    ):
        result = colitools("convert", *args, tmp_path / "out", HF_HUB_OFFLINE="1", HF_ENDPOINT=UNREACHABLE)
        assert result.returncode == 1
        line = one_error_line(result)
        assert all(w in line for w in words), line


def test_unresolvable_hub_host_fails_with_one_line(hub, tmp_path):
    result = colitools("convert", "org/tiny", tmp_path / "out", HF_ENDPOINT=UNREACHABLE)
    assert result.returncode == 1
    line = one_error_line(result)
    assert "cannot resolve the host of " + UNREACHABLE in line and "HF_HUB_OFFLINE=1" in line, line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.safetensors"))


def test_name_resolution_errors_are_recognised_through_the_cause_chain():
    import socket

    import httpx2

    from colitools.converters.download import is_name_resolution_error

    try:
        httpx2.get(UNREACHABLE + "/api/models/org/tiny", timeout=30)
    except httpx2.TransportError as exc:
        assert is_name_resolution_error(exc)
    else:  # pragma: no cover - a resolver that answers for .invalid breaks RFC 6761
        pytest.skip("this resolver answers for .invalid")
    assert not is_name_resolution_error(httpx2.ConnectError("refused"))
    wrapped = httpx2.ConnectError("x")
    wrapped.__cause__ = socket.gaierror(-3, "Temporary failure in name resolution")
    assert is_name_resolution_error(wrapped)
