"""Sources: local folders and Hugging Face repos (real huggingface_hub calls against the fake Hub)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from safetensors.numpy import save_file

from colitools.converters.download import Backoff
from colitools.converters.sources import (
    HubSource,
    LocalFolderSource,
    SourceFile,
    check_shard_name,
    open_source,
)
from colitools.errors import ConvertError, FormatError
from colitools.formats.safetensors_io import SafetensorsFile

try:  # tests/ folders are not packages: pytest puts this folder on sys.path ("prepend" import mode)
    from hubserver import FileStats
except ImportError:  # pragma: no cover
    from .hubserver import FileStats

FAST = Backoff(base=0.01, maximum=0.05)
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def make_checkpoint(folder, weight_map=None, scale=1.0):
    """A two-shard BF16-free toy checkpoint: config.json, index, two shards, a tokenizer file."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shard1 = {
        "embed.weight": rng.standard_normal((16, 8), dtype=np.float32) * scale,
        "layers.0.mlp.weight": rng.standard_normal((8, 8), dtype=np.float32) * scale,
    }
    shard2 = {"layers.1.mlp.weight": rng.standard_normal((8, 8), dtype=np.float32) * scale}
    save_file(shard1, str(folder / SHARD1))
    save_file(shard2, str(folder / SHARD2))
    if weight_map is None:
        weight_map = {**dict.fromkeys(shard1, SHARD1), **dict.fromkeys(shard2, SHARD2)}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 8}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def sha256_of(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def repo(hub, tmp_path):
    folder = make_checkpoint(tmp_path / "repo")
    hub.add_repo("org/toy", {"main": folder})
    return folder


def open_hub(spec, tmp_path, **kwargs):
    return open_source(spec, workdir=tmp_path / "work", backoff=FAST, **kwargs)


# -- the fake Hub speaks huggingface_hub's protocol ---------------------------------------------------------------
def test_model_info_lists_sizes_lfs_sha256_and_commit_through_huggingface_hub(hub, repo):
    info = HfApi(endpoint=hub.endpoint).model_info("org/toy", files_metadata=True)
    assert info.sha == hub.commit_of("org/toy")
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == {"config.json", "model.safetensors.index.json", SHARD1, SHARD2, "tokenizer.json"}
    assert siblings[SHARD1].size == (repo / SHARD1).stat().st_size
    assert siblings[SHARD1].lfs.sha256 == sha256_of(repo / SHARD1)
    assert siblings["config.json"].lfs is None

    meta = get_hf_file_metadata(hf_hub_url("org/toy", SHARD1))
    assert (meta.etag, meta.size, meta.commit_hash) == (
        sha256_of(repo / SHARD1),
        siblings[SHARD1].size,
        info.sha,
    )
    assert meta.location.startswith(hub.cdn_endpoint + "/blobs/")  # the 302 to another origin


def test_hf_hub_download_fills_the_cache_through_the_redirect(hub, repo):
    path = hf_hub_download("org/toy", SHARD2)
    assert sha256_of(Path(path)) == sha256_of(repo / SHARD2)
    assert hub.stats(SHARD2).gets == 1


# -- Hub sources --------------------------------------------------------------------------------------------------
def test_hub_source_lists_files_reads_json_and_weight_map_pinned_to_the_commit(hub, repo, tmp_path):
    source = open_hub("org/toy", tmp_path)
    assert isinstance(source, HubSource)
    assert source.describe() == {"kind": "hf", "repo_id": "org/toy", "revision": hub.commit_of("org/toy")}
    files = source.files()
    assert files[SHARD1] == SourceFile(SHARD1, (repo / SHARD1).stat().st_size, sha256_of(repo / SHARD1))
    assert files["config.json"].sha256 is None
    assert source.read_json("config.json") == {"model_type": "toy", "hidden_size": 8}
    assert source.weight_map() == {
        "embed.weight": SHARD1,
        "layers.0.mlp.weight": SHARD1,
        "layers.1.mlp.weight": SHARD2,
    }
    assert source.shards() == [SHARD1, SHARD2]
    assert hub.stats(SHARD1).gets == 0  # planning needs no shard bytes


def test_hub_shard_is_downloaded_into_workdir_verified_and_released(hub, repo, tmp_path):
    source = open_hub("org/toy", tmp_path)
    assert source.local_copy(SHARD1) is None
    path = source.ensure_local(SHARD1)
    assert path == tmp_path / "work" / SHARD1 == source.local_copy(SHARD1)
    assert sha256_of(path) == sha256_of(repo / SHARD1)
    assert source.is_deletable(SHARD1)
    assert source.ensure_local(SHARD1) == path  # already there: not fetched again
    next(path.parent.glob(f".{SHARD1}*")).unlink()  # as if the process died between publish and stamp
    assert open_hub("org/toy", tmp_path).ensure_local(SHARD1) == path  # re-hashed, not re-fetched
    assert hub.stats(SHARD1).gets == 1
    assert source.release(SHARD1)
    assert not path.exists() and not source.is_deletable(SHARD1)
    assert list((tmp_path / "work").glob(f"*{SHARD1}*")) == []


def test_hf_cache_hit_serves_no_bytes_and_is_never_deletable(hub, repo, tmp_path):
    cached = hf_hub_download("org/toy", SHARD1, revision=hub.commit_of("org/toy"))
    hub.reset_stats()
    source = open_hub("org/toy", tmp_path)
    path = source.ensure_local(SHARD1)
    assert str(path) == cached == str(source.local_copy(SHARD1))
    assert hub.stats(SHARD1) == FileStats()  # no GET, no HEAD, no redirect, no byte
    assert not source.is_deletable(SHARD1)
    assert not source.release(SHARD1)
    assert path.exists()


def test_stale_download_of_the_same_size_from_another_revision_is_replaced(hub, tmp_path):
    old = make_checkpoint(tmp_path / "old")
    new = make_checkpoint(tmp_path / "new", scale=2.0)
    assert (old / SHARD1).stat().st_size == (new / SHARD1).stat().st_size
    commits = hub.add_repo("org/toy", {"main": new, "a" * 40: old})
    stale = open_hub("org/toy", tmp_path, revision=commits["a" * 40]).ensure_local(SHARD1)
    assert sha256_of(stale) == sha256_of(old / SHARD1)

    source = open_hub("org/toy", tmp_path)
    assert source.describe()["revision"] == commits["main"]
    assert sha256_of(source.ensure_local(SHARD1)) == sha256_of(new / SHARD1)


def test_download_interrupted_mid_shard_resumes_through_the_source(hub, repo, tmp_path):
    hub.drop_after(SHARD1, 100)
    path = open_hub("org/toy", tmp_path).ensure_local(SHARD1)
    assert sha256_of(path) == sha256_of(repo / SHARD1)
    assert [start for start, _ in hub.stats(SHARD1).ranges] == [0, 100]


def test_private_repo_needs_the_token(hub, repo, tmp_path, monkeypatch):
    hub.token = "hf_secret"
    with pytest.raises(
        ConvertError, match=r"org/toy@main: repository not found or not accessible \(HTTP 401\)"
    ):
        open_hub("org/toy", tmp_path)
    with pytest.raises(ConvertError, match=r"HTTP 401 .*check the token"):
        open_hub("org/toy", tmp_path, token="hf_wrong")

    source = open_hub("org/toy", tmp_path, token="hf_secret")
    assert sha256_of(source.ensure_local(SHARD2)) == sha256_of(repo / SHARD2)
    assert hub.cdn_auth_headers == 0  # the token never left the Hub

    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # the ambient token works the same way
    assert open_hub("org/toy", tmp_path).read_json("config.json")["model_type"] == "toy"


def test_unknown_repo_and_revision_are_convert_errors(hub, repo, tmp_path):
    with pytest.raises(ConvertError, match=r"org/nothing@main: repository not found"):
        open_hub("org/nothing", tmp_path)
    with pytest.raises(ConvertError, match=r"org/toy@v9: revision 'v9' not found"):
        open_hub("org/toy", tmp_path, revision="v9")


def test_api_5xx_burst_is_retried(hub, repo, tmp_path):
    hub.fail_next(3, status=503, path_contains="/api/models/")
    source = open_hub("org/toy", tmp_path)
    assert source.describe()["revision"] == hub.commit_of("org/toy")
    assert [s for _, p, s in hub.log if p.startswith("/api/models/")] == [503, 503, 503, 200]


def test_single_file_checkpoint_weight_map_from_a_remote_header(hub, tmp_path):
    folder = tmp_path / "single"
    folder.mkdir()
    tensors = {"a": np.zeros((256, 256), np.float32), "b": np.ones(3, np.float32)}
    save_file(tensors, str(folder / "model.safetensors"))
    hub.add_repo("org/single", {"main": folder})
    source = open_hub("org/single", tmp_path)
    assert source.weight_map() == {"a": "model.safetensors", "b": "model.safetensors"}
    # huggingface_hub reads the first 100 kB (header included) with one range request: not the 256 kB file
    assert hub.stats("model.safetensors").ranges == [(0, 100_001)]
    assert not source.is_deletable("model.safetensors")


def test_missing_shard_on_the_hub_is_a_convert_error_naming_it(hub, tmp_path):
    folder = make_checkpoint(tmp_path / "repo")
    (folder / SHARD2).unlink()
    hub.add_repo("org/broken", {"main": folder})
    with pytest.raises(
        ConvertError, match=rf"shard {SHARD2} \(1 tensors, e.g. 'layers.1.mlp.weight'\) is missing"
    ):
        open_hub("org/broken", tmp_path).weight_map()


# -- local folders ------------------------------------------------------------------------------------------------
def test_local_folder_source_uses_files_in_place_and_never_deletes(tmp_path):
    folder = make_checkpoint(tmp_path / "ckpt")
    source = open_source(str(folder), workdir=tmp_path / "work")
    assert isinstance(source, LocalFolderSource)
    assert source.describe() == {"kind": "local", "path": str(folder.resolve())}
    assert source.files()[SHARD2] == SourceFile.from_stat(SHARD2, (folder / SHARD2).stat())
    assert source.read_json("config.json")["hidden_size"] == 8
    assert source.weight_map()["layers.1.mlp.weight"] == SHARD2
    assert source.ensure_local(SHARD1) == folder.resolve() / SHARD1
    assert not source.is_deletable(SHARD1)
    assert not source.release(SHARD1)
    assert (folder / SHARD1).exists()
    assert not (tmp_path / "work").exists()


def test_local_single_file_checkpoint(tmp_path):
    folder = tmp_path / "single"
    folder.mkdir()
    save_file({"w": np.zeros(2, np.float32)}, str(folder / "model.safetensors"))
    assert open_source(str(folder), workdir=tmp_path).weight_map() == {"w": "model.safetensors"}


@pytest.mark.parametrize(
    ("shard", "reason"),
    [
        ("/etc/passwd.safetensors", "absolute path"),
        ("C:\\model.safetensors", "absolute path"),
        ("sub/model.safetensors", "contains a path separator"),
        ("..\\model.safetensors", "contains a path separator"),
        ("..model.safetensors", "contains '..'"),
        ("model.bin", "does not end in .safetensors"),
        ("", "not a file name"),
    ],
)
def test_bad_shard_names_in_the_index_are_refused(tmp_path, shard, reason):
    folder = make_checkpoint(tmp_path / "ckpt", weight_map={"embed.weight": SHARD1, "evil.weight": shard})
    source = open_source(str(folder), workdir=tmp_path / "work")
    with pytest.raises(
        FormatError, match=r"model\.safetensors\.index\.json: shard file name .*'evil\.weight'.*" + reason
    ):
        source.weight_map()


def test_bad_shard_name_on_the_hub_is_refused_before_any_download(hub, tmp_path):
    folder = make_checkpoint(tmp_path / "repo", weight_map={"x": "../../outside.safetensors"})
    hub.add_repo("org/evil", {"main": folder})
    with pytest.raises(FormatError, match=r"'../../outside.safetensors' \(tensor 'x'\) is refused"):
        open_hub("org/evil", tmp_path).weight_map()
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").glob("*.safetensors"))


def test_missing_local_shard_is_a_convert_error_naming_it(tmp_path):
    folder = make_checkpoint(tmp_path / "ckpt")
    (folder / SHARD1).unlink()
    with pytest.raises(
        ConvertError, match=rf"shard {SHARD1} \(2 tensors, e.g. 'embed.weight'\) is missing from"
    ):
        open_source(str(folder), workdir=tmp_path).weight_map()


def test_index_without_weight_map_and_invalid_json_are_convert_errors(tmp_path):
    folder = make_checkpoint(tmp_path / "ckpt")
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ConvertError, match="no 'weight_map' object"):
        open_source(str(folder), workdir=tmp_path).weight_map()
    (folder / "config.json").write_text('{"a": ')
    with pytest.raises(
        FormatError, match=r"/config.json: invalid JSON at line 1 column 7"
    ):  # the one reader's
        open_source(str(folder), workdir=tmp_path).read_json("config.json")
    (folder / "config.json").write_text("[1]")
    with pytest.raises(FormatError, match=r"/config.json: expected a JSON object$"):
        open_source(str(folder), workdir=tmp_path).read_json("config.json")
    with pytest.raises(ConvertError, match=r"generation_config.json: not found in"):
        open_source(str(folder), workdir=tmp_path).read_json("generation_config.json")


def test_folder_without_index_or_single_file_is_a_convert_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConvertError, match="has neither model.safetensors.index.json nor model.safetensors"):
        open_source(str(tmp_path / "empty"), workdir=tmp_path).weight_map()


@pytest.mark.parametrize("spec", ["./not/here", "not-a-folder", "a/b/c", "org/-bad", "/abs/missing"])
def test_spec_that_is_neither_folder_nor_repo_id_is_refused(tmp_path, spec):
    with pytest.raises(ConvertError, match="no such folder, and not a Hugging Face repo id"):
        open_source(spec, workdir=tmp_path)


def test_revision_with_a_local_folder_and_a_file_as_source_are_refused(tmp_path):
    folder = make_checkpoint(tmp_path / "ckpt")
    with pytest.raises(ConvertError, match="`revision` applies to Hugging Face repos"):
        open_source(str(folder), revision="main", workdir=tmp_path)
    with pytest.raises(ConvertError, match="not a file"):
        open_source(str(folder / "config.json"), workdir=tmp_path)


def test_check_shard_name_accepts_the_usual_names():
    for name in ("model.safetensors", "model-00001-of-00163.safetensors", "consolidated.00.safetensors"):
        check_shard_name(name)


# -- shard headers ------------------------------------------------------------------------------------------------
def test_every_source_reads_a_shard_header_the_same_way(hub, repo, tmp_path):
    local = open_source(str(repo), workdir=tmp_path / "lwork")
    remote = open_hub("org/toy", tmp_path)
    assert not local.is_remote and remote.is_remote
    for shard in (SHARD1, SHARD2):
        expected = {n: (t.dtype, t.shape) for n, t in SafetensorsFile(repo / shard).tensors.items()}
        for source in (local, remote):
            assert {n: (h.dtype, h.shape) for n, h in source.header(shard).items()} == expected
    # the Hub source read its headers with range requests: nothing downloaded
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())
    remote.ensure_local(SHARD1)  # once downloaded, the header comes from the verified copy
    hub.fail_next(5, status=404, path_contains=SHARD1)
    assert set(remote.header(SHARD1)) == {"embed.weight", "layers.0.mlp.weight"}


def test_a_corrupt_local_shard_header_is_a_convert_error_naming_the_shard(tmp_path):
    folder = make_checkpoint(tmp_path / "ckpt")
    data = bytearray((folder / SHARD2).read_bytes())
    data[8:10] = b"[]"  # the header is no longer a JSON object
    (folder / SHARD2).write_bytes(bytes(data))
    source = open_source(str(folder), workdir=tmp_path / "work")
    with pytest.raises(ConvertError, match=rf"^shard {SHARD2}: "):
        source.header(SHARD2)


def test_a_single_file_checkpoint_is_listed_by_the_strict_reader(tmp_path):
    import struct

    from safetensors import safe_open

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "toy"}')
    entry = '{"dtype":"U8","shape":[2],"data_offsets":[%d,%d]}'
    header = ('{"dup.w":' + entry % (0, 2) + ',"dup.w":' + entry % (0, 2) + "}").encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(2))
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as fh:  # the upstream reader is lax
        assert list(fh.keys()) == ["dup.w"]
    with pytest.raises(ConvertError, match=r"^shard model.safetensors: .*duplicate tensor name 'dup.w'"):
        open_source(str(folder), workdir=tmp_path).weight_map()
