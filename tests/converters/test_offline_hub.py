"""Hub sources without a network: HF_HUB_OFFLINE converts from the Hugging Face cache, a DNS failure is one line.

Real processes (the console script), the real huggingface_hub client filling the cache from the fake Hub
(``hubserver.py``), and an endpoint under ``.invalid`` (a TLD that never resolves; nothing leaves the machine).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from convcheck import snapshot
from tinyckpt import Tiny, make_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import colitools, one_line_error  # noqa: E402

UNREACHABLE = "http://nonexistent.invalid"
SPEC = Tiny(layers=2, experts=2, hidden=128, inter=64, shards=3)


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
    line = one_line_error(result)
    assert missing in line and "HF_HUB_OFFLINE" in line and "cache" in line, line


def test_offline_convert_of_an_uncached_repo_or_revision_is_one_line(hub, cached_repo, tmp_path):
    for args, words in (
        (("org/other",), ("org/other", "holds nothing")),
        (("org/tiny", "--revision", "v9"), ("'v9'", "cached: main")),
    ):
        result = colitools("convert", *args, tmp_path / "out", HF_HUB_OFFLINE="1", HF_ENDPOINT=UNREACHABLE)
        assert result.returncode == 1
        line = one_line_error(result)
        assert all(w in line for w in words), line


def test_unresolvable_hub_host_fails_with_one_line(hub, tmp_path):
    result = colitools("convert", "org/tiny", tmp_path / "out", HF_ENDPOINT=UNREACHABLE)
    assert result.returncode == 1
    line = one_line_error(result)
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


# ------------------------------------------------------------------- cache blobs whose bytes are not their name
ORACLE = Path(__file__).resolve().parents[2] / "oracles" / "qwen2_moe"
DAMAGED = "model-00001-of-00002.safetensors"


def _weights(out: Path) -> dict[str, bytes]:
    """What a conversion wrote, but the manifest (which records the source: a folder here, a repo there)."""
    return {k: v for k, v in snapshot(out).items() if k != "colitools.json without run"}


def _zero_4k(path: Path, offset: int) -> bytes:
    """Zero 4 KiB of the file behind ``path`` at ``offset`` (in place: the blob a snapshot symlink points to);
    returns the bytes as they were."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        before = fh.read(4096)
        fh.seek(offset)
        fh.write(bytes(len(before)))
    return before


@pytest.fixture
def local_reference(tmp_path) -> Path:
    """oracles/qwen2_moe converted from the folder itself: what every conversion of its bytes must write."""
    out = tmp_path / "reference"
    result = colitools("convert", ORACLE, out, "--min-free-gb", "0", "--no-progress")
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize(
    "damaged, offset, kind",
    [(DAMAGED, 200_000, "sha256"), ("config.json", 0, "git blob sha1")],
    ids=["lfs-shard", "config"],
)
def test_offline_refuses_a_hand_made_cache_blob_that_does_not_hash_to_its_name_and_converts_it_once_repaired(
    tmp_path, local_reference, damaged, offset, kind
):
    import hashlib

    from hubserver import write_hf_cache

    cache = tmp_path / "cache"
    repo = write_hf_cache(cache, "org/name", ORACLE)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": UNREACHABLE}
    blob = (repo / "snapshots").glob(f"*/{damaged}").__next__().resolve()
    named = blob.name  # what huggingface_hub named it by: the sha256, or the git blob sha1 (config.json)
    original = _zero_4k(blob, offset)
    data = blob.read_bytes()
    actual = (
        hashlib.sha256(data).hexdigest()
        if kind == "sha256"
        else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    )
    out = tmp_path / "out"
    result = colitools("convert", "org/name", out, "--min-free-gb", "0", "--no-progress", **env)
    assert result.returncode == 1, result.stderr
    line = one_line_error(result)
    assert line.startswith(f"colitools: error: {damaged}: "), line
    assert f"{kind} {actual}, expected {named}" in line and "HF_HUB_OFFLINE" in line, line
    assert not (out / "colitools.json").exists() or '"complete"' not in (out / "colitools.json").read_text()
    with open(blob, "r+b") as fh:  # repaired: the rerun converts the right bytes, and only those
        fh.seek(offset)
        fh.write(original)
    done = colitools("convert", "org/name", out, "--min-free-gb", "0", "--no-progress", **env)
    assert done.returncode == 0, done.stderr
    assert _weights(out) == _weights(local_reference)


def test_online_refetches_a_damaged_cache_blob_into_the_work_folder_and_leaves_the_cache_alone(
    hub, tmp_path, local_reference
):
    from huggingface_hub import hf_hub_download

    repo = tmp_path / "repo"
    repo.mkdir()
    for path in ORACLE.iterdir():
        if path.is_file():
            (repo / path.name).write_bytes(path.read_bytes())
    hub.add_repo("org/name", {"main": repo})
    cached = {
        p.name: Path(hf_hub_download("org/name", p.name)) for p in repo.iterdir()
    }  # huggingface_hub's own
    _zero_4k(cached[DAMAGED], 200_000)
    damaged = cached[DAMAGED].resolve().read_bytes()
    hub.reset_stats()
    out = tmp_path / "out"
    result = colitools("convert", "org/name", out, "--min-free-gb", "0", "--no-progress")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("colitools: warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(f"colitools: warning: {DAMAGED}: "), result.stderr
    assert "damaged" in warnings[0] and "downloading the file again" in warnings[0], warnings[0]
    assert hub.stats(DAMAGED).gets == 1  # fetched again, once
    assert all(
        hub.stats(name).gets == 0 for name in cached if name != DAMAGED
    )  # the intact ones from the cache
    assert _weights(out) == _weights(local_reference)
    assert cached[DAMAGED].resolve().read_bytes() == damaged  # the user's cache is not written
    assert not (out / ".colitools-download").exists()  # the fresh copy was released


def test_a_cache_blob_is_hashed_once_per_conversion_however_many_units_read_it(tmp_path, monkeypatch):
    from hubserver import write_hf_cache
    from huggingface_hub import constants

    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert
    from colitools.converters.sources import open_source

    folder = tmp_path / "repo"  # units: globals (shards 1, 3), layer 0 (1, 2), layer 1 (2), layer 2 (3)
    make_checkpoint(folder, Tiny(layers=3, experts=4, hidden=128, inter=64, shards=3))
    cache = tmp_path / "cache"
    repo = write_hf_cache(cache, "org/name", folder)
    (snapshot_dir,) = (repo / "snapshots").iterdir()
    used = [p for p in snapshot_dir.iterdir() if p.name != "README.md"]  # shards, config, index, copied files
    blobs = {str(p.resolve()) for p in used}
    opened: list[str] = []
    threads: dict[str, str] = {}  # path -> the thread that opened it last
    listening = [True]  # an audit hook cannot be removed: it stops listening after the conversion

    def audit(event: str, args: tuple) -> None:
        if (
            listening[0]
            and event == "open"
            and isinstance(args[0], str)
            and os.path.realpath(args[0]) in blobs
        ):
            opened.append(args[0])
            threads[args[0]] = threading.current_thread().name

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    source = open_source("org/name", workdir=tmp_path / "work", cache_dir=cache)
    sys.addaudithook(audit)  # the real opens of the real files
    try:
        summary = convert(source, tmp_path / "out", ConvertOptions(min_free_gb=0))
    finally:
        listening[0] = False
    assert summary.units_converted == 4
    # readers open a file by its snapshot path (a symlink); the check hashes the blob itself, by its own name
    hashed = [path for path in opened if path in blobs]
    assert sorted(hashed) == sorted(blobs), hashed  # every file used, each hashed once
    assert len(opened) > len(hashed)  # and the same files were read through the snapshot too
    # the next unit's shard is hashed in the background while a unit converts (runner: Source.check_ahead)
    assert "cache-check" in {threads[path] for path in hashed}, threads
