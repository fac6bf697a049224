"""``convert --upload-repo REPO --stream-upload`` against the fake Hub (``hubserver.py`` + ``hubupload.py``): real
HTTP, the real huggingface_hub client both ways, real processes and SIGKILL for the interrupted run.

The reference every output is compared with is a plain local conversion of the same Hub source (no upload); the
bound on local disk is taken from the source folder's shard sizes and that reference's per-unit files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hubupload import throttle_uploads
from midkill import sigkill_when
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.verify.container import verify_container

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import COMMAND, colitools, one_line_error  # noqa: E402

SPEC = Tiny(layers=4, experts=2, hidden=128, inter=64, shards=3)
TOKEN = "hf_write_token"
BRANCH = "colitools-stream"  # the work branch docs/CLI.md names


@pytest.fixture
def source(hub, tmp_path, monkeypatch) -> tuple[Path, Path]:
    """org/tiny on the fake Hub and its plain local conversion (the reference), a write token set."""
    src = tmp_path / "src"
    make_checkpoint(src, SPEC)
    hub.add_repo("org/tiny", {"main": src})
    reference = tmp_path / "reference"
    convert("org/tiny", reference)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.token = TOKEN
    hub.reset_stats()
    return src, reference


def download(repo_id: str, dest: Path) -> Path:
    from huggingface_hub import HfApi, hf_hub_download

    for sibling in HfApi(token=TOKEN).model_info(repo_id).siblings:
        hf_hub_download(repo_id, sibling.rfilename, local_dir=dest, token=TOKEN)
    return dest


def files_of(folder: Path) -> dict[str, Path]:
    return {
        p.relative_to(folder).as_posix(): p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    }


def assert_same_as_reference(back: Path, reference: Path) -> None:
    """Every file of the reference conversion, byte for byte (``colitools.json`` but its ``run`` section), plus
    the card; the container verifies (each shard hashed against the manifest)."""
    got, want = files_of(back), files_of(reference)
    assert sorted(got) == sorted([*want, "README.md"])
    for name, path in want.items():
        if name == "colitools.json":
            a, b = json.loads(got[name].read_bytes()), json.loads(path.read_bytes())
            a.pop("run"), b.pop("run")
            assert a == b
        else:
            assert got[name].read_bytes() == path.read_bytes(), name
    check = verify_container(back)
    assert check.ok, check.problems


def lfs_puts(hub) -> dict[str, int]:
    """LFS object PUTs the CDN answered, per oid (the server's request log)."""
    counts: dict[str, int] = {}
    for method, path, status in list(hub.log):
        if method == "PUT" and path.startswith("/lfs/") and status == 200:
            oid = path[len("/lfs/") :].split("?")[0]
            counts[oid] = counts.get(oid, 0) + 1
    return counts


def test_stream_upload_round_trip_one_unit_on_disk_at_a_time(hub, source, tmp_path):
    src, reference = source
    units = json.loads((reference / "colitools.json").read_text())["units"]
    unit_files = [{f["name"]: f["size"] for f in rec["files"]} for rec in units.values()]
    shard_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    out = tmp_path / "out"
    seen: list[tuple[str, dict[str, int], int]] = []

    def on_commit(repo_id, revision, paths):  # the client waits for this commit's answer meanwhile
        held = {n: p.stat().st_size for n, p in files_of(out).items() if n.endswith(".safetensors")}
        used = sum(p.stat().st_blocks * 512 for p in out.rglob("*") if p.is_file())
        seen.append((revision, held, used))

    hub.upload.on_commit = on_commit
    summary = convert("org/tiny", out, ConvertOptions(upload_repo="me/tiny-int4", stream_upload=True))
    # one commit per unit on the work branch, each while the folder held that unit's files and no other's
    assert [s[0] for s in seen] == [BRANCH] * len(units) + ["main"]
    assert [s[1] for s in seen[:-1]] == unit_files
    # and every byte on that volume: at most the whole source (3 shards, downloaded) + the largest unit + 1 MB
    # of ledger, index, config and the headers kept for the card
    bound = shard_bytes + max(sum(u.values()) for u in unit_files) + (1 << 20)
    assert max(s[2] for s in seen) <= bound
    assert seen[-1][1] == {}  # the final commit: no unit file left here
    back = download("me/tiny-int4", tmp_path / "back")
    assert_same_as_reference(back, reference)
    # what stays local: the ledger and the small files, no unit file, no work folder; the branch is gone
    assert sorted(files_of(out)) == sorted(n for n in files_of(reference) if not n.endswith(".safetensors"))
    assert not (out / ".colitools-upload").exists()
    assert BRANCH not in hub._repos["me/tiny-int4"].refs
    assert summary.upload["repo_id"] == "me/tiny-int4" and summary.upload["revision"] == "main"
    # each LFS object went over the wire once (the final commit copied them from the branch)
    recorded = {f["sha256"] for rec in units.values() for f in rec["files"]}
    assert lfs_puts(hub) == {oid: 1 for oid in recorded}
    # `colitools upload` of this folder names the repo that holds its files
    up = colitools("upload", out, "me/other")
    assert up.returncode == 1 and "sent its files to me/tiny-int4" in one_line_error(up)
    # a rerun does nothing and sends nothing
    before = len(hub.log)
    again = colitools(
        "convert", "org/tiny", out, "--upload-repo", "me/tiny-int4", "--stream-upload", "--json"
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["upload"]["commit_oid"] == summary.upload["commit_oid"]
    assert not [e for e in hub.log[before:] if e[0] in ("PUT", "POST")]


def test_sigkill_during_a_streaming_upload_resumes_without_sending_a_confirmed_file_again(
    hub, source, tmp_path
):
    _, reference = source
    out = tmp_path / "out"
    args = [
        "convert",
        "org/tiny",
        str(out),
        "--upload-repo",
        "me/tiny-int4",
        "--stream-upload",
        "--no-progress",
    ]
    throttle_uploads(hub, 200_000)  # bytes/s: a unit's upload lasts long enough to be killed in

    def confirmed() -> set[str]:
        try:
            units = json.loads((out / "colitools.json").read_text())["units"]
        except (OSError, ValueError, KeyError):
            return set()
        return {f["sha256"] for u in units.values() for f in u["files"] if f.get("uploaded")}

    def mid_upload() -> bool:  # a file confirmed, and the body of one not confirmed on its way
        with hub.upload.lock:
            receiving = set(hub.upload.bodies) - set(hub.upload.stored)
        return bool(confirmed()) and bool(receiving - confirmed())

    proc = subprocess.Popen([*COMMAND, *args], env=os.environ.copy(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    sigkill_when(proc, mid_upload)
    done = confirmed()
    throttle_uploads(hub, None)  # the body cut by the kill ends short: the server stores nothing of it
    puts = lfs_puts(hub)
    assert all(puts.get(oid) == 1 for oid in done)
    result = colitools(*args, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # the units whose files were confirmed are kept, not converted again (their files are gone from here)
    assert report["units_redone"] == [] and report["units_skipped"] >= 1
    after = lfs_puts(hub)
    for oid in done:  # the server's log: not one more PUT of a confirmed object, nor a body
        assert after[oid] == 1 and hub.upload.bodies[oid] == 1
    units = json.loads((reference / "colitools.json").read_text())["units"]
    assert set(after) == {f["sha256"] for u in units.values() for f in u["files"]}
    assert_same_as_reference(download("me/tiny-int4", tmp_path / "back"), reference)
    assert not [n for n in files_of(out) if n.endswith(".safetensors")]


def test_with_two_workers_at_most_two_units_files_are_on_disk(hub, source, tmp_path):
    _, reference = source
    out = tmp_path / "out"
    held: list[list[str]] = []
    hub.upload.on_commit = lambda repo_id, revision, paths: held.append(
        sorted(p.name for p in out.glob("*.safetensors"))
    )
    convert("org/tiny", out, ConvertOptions(upload_repo="me/tiny-int4", stream_upload=True, workers=2))
    units = json.loads((reference / "colitools.json").read_text())["units"]
    assert len(held) == len(units) + 1 and max(len(h) for h in held) <= 2 and held[-1] == []
    assert_same_as_reference(download("me/tiny-int4", tmp_path / "back"), reference)


def test_dry_run_peak_disk_counts_one_unit_of_output(hub, source, tmp_path):
    """From a local folder (no downloads) the plan's peak is the outputs alone: the whole output without
    streaming, the largest unit's with it (the reference conversion's per-unit file sizes)."""
    src, reference = source
    units = json.loads((reference / "colitools.json").read_text())["units"]
    per_unit = [sum(f["size"] for f in rec["files"]) for rec in units.values()]
    whole = convert(str(src), tmp_path / "a", ConvertOptions(dry_run=True))
    streamed = convert(
        str(src), tmp_path / "b", ConvertOptions(dry_run=True, upload_repo="me/x", stream_upload=True)
    )
    assert whole.peak_disk_bytes == sum(per_unit)
    assert streamed.peak_disk_bytes == streamed.plan["peak_disk_bytes"] == max(per_unit) < sum(per_unit)


def test_repo_id_and_token_are_checked_before_any_work(hub, source, tmp_path, monkeypatch):
    out = tmp_path / "out"
    bad = colitools("convert", "org/tiny", out, "--upload-repo", "me/bad repo", "--stream-upload")
    assert bad.returncode == 2 and "--upload-repo 'me/bad repo'" in one_line_error(bad)
    assert not out.exists() and hub.log == []  # not even the source's listing was asked
    monkeypatch.delenv("HF_TOKEN")
    for extra in ([], ["--stream-upload"]):
        none = colitools("convert", "org/tiny", out, "--upload-repo", "me/tiny-int4", *extra)
        assert none.returncode == 1 and "no Hugging Face token" in one_line_error(none)
        assert not out.exists() and hub.log == []
    alone = colitools("convert", "org/tiny", out, "--stream-upload")
    assert alone.returncode == 2 and "--upload-repo" in one_line_error(alone) and not out.exists()


def test_a_streamed_folder_is_refused_without_stream_upload_or_for_another_repo(hub, source, tmp_path):
    out = tmp_path / "out"
    hub.upload.on_commit = lambda repo_id, revision, paths: None
    proc = subprocess.Popen(
        [*COMMAND, "convert", "org/tiny", str(out), "--upload-repo", "me/a", "--stream-upload", "--no-progress"],
        env={**os.environ, "COLITOOLS_TEST_SLOW_UNIT_SECONDS": "0.5"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def streamed() -> bool:
        try:
            units = json.loads((out / "colitools.json").read_text())["units"]
        except (OSError, ValueError, KeyError):
            return False
        return any(f.get("uploaded") for u in units.values() for f in u["files"])

    sigkill_when(proc, streamed)
    for args in ([], ["--upload-repo", "me/b", "--stream-upload"]):
        result = colitools("convert", "org/tiny", out, *args)
        assert result.returncode == 1
        assert "streamed files to me/a" in one_line_error(result) and "--upload-repo 'me/a'" in result.stderr
