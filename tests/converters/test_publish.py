"""``colitools upload`` against the fake Hub (``hubserver.py`` + ``hubupload.py``): real HTTP, real files, the real
huggingface_hub client on both sides of the round trip, real processes and signals for the interrupted upload."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hubupload import reject_push, throttle_uploads
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.manifest import Manifest
from colitools.converters.publish import upload_output
from colitools.converters.runner import convert
from colitools.errors import ParameterError, UploadError
from colitools.verify.container import verify_container

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import COMMAND, colitools, one_line_error  # noqa: E402

SPEC = Tiny(layers=2, experts=2, hidden=128, inter=64, shards=3)
TOKEN = "hf_write_token"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def converted(hub, tmp_path, monkeypatch) -> Path:
    """org/tiny served by the fake Hub, converted from it (a Hub source: the manifest pins its commit)."""
    src = tmp_path / "src"
    make_checkpoint(src, SPEC)
    hub.add_repo("org/tiny", {"main": src})
    out = tmp_path / "out"
    convert("org/tiny", out)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.token = TOKEN
    return out


def download(repo_id: str, dest: Path, revision: str | None = None) -> Path:
    """Every file of the repo revision, fetched by huggingface_hub (listing from ``model_info``)."""
    from huggingface_hub import HfApi, hf_hub_download

    for sibling in HfApi(token=TOKEN).model_info(repo_id, revision=revision).siblings:
        hf_hub_download(repo_id, sibling.rfilename, revision=revision, local_dir=dest, token=TOKEN)
    return dest


def test_round_trip_convert_from_the_hub_upload_download_verifies_and_is_byte_identical(
    hub, converted, tmp_path
):
    report = upload_output(converted, "me/tiny-int4")
    assert report.repo_id == "me/tiny-int4" and hub.upload.created == ["me/tiny-int4"]
    back = download("me/tiny-int4", tmp_path / "back")
    uploaded = sorted(
        p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file() and ".cache" not in p.parts
    )
    local = sorted(p.name for p in converted.iterdir() if p.is_file() and not p.name.startswith("."))
    assert uploaded == sorted([*local, "README.md"])
    for name in local:
        assert (back / name).read_bytes() == (converted / name).read_bytes(), name
    check = verify_container(back)
    assert check.ok, check.problems
    assert check.matched_files == 3  # every shard hashed against the manifest, after the download
    # each LFS object arrived once, under the manifest's sha256
    shards = Manifest.load(converted / "colitools.json").data["shards"]
    assert {s["sha256"]: 1 for s in shards} == {oid: n for oid, n in hub.upload.stored.items()}


def test_the_card_names_source_commit_version_recipe_formats_engine_and_sizes(hub, converted, tmp_path):
    from huggingface_hub import ModelCard

    upload_output(converted, "me/tiny-int4")
    card_text = (download("me/tiny-int4", tmp_path / "back") / "README.md").read_text()
    card = ModelCard(card_text)
    commit = hub.commit_of("org/tiny")
    assert card.data.base_model == "org/tiny" and card.data.base_model_relation == "quantized"
    assert {"colitools", "int4-g64", "int8-row", "f32"} <= set(card.data.tags)
    assert f"[org/tiny]({hub.endpoint}/org/tiny) at commit `{commit}`" in card_text  # the Hub that was used
    assert "huggingface.co" not in card_text
    assert "colitools 0.1.0" in card_text
    assert "| experts | int4-g64 |" in card_text and "| layout | pairs |" in card_text
    # the formats table: numbers from an independent count over the container's headers
    from colitools.formats.inspect import inspect_path

    for total in inspect_path(converted).totals:
        assert f"| {total.format} | {total.tensors} | {total.bytes:,} |" in card_text
    assert "None: every tensor got its role's format." in card_text
    assert "colibri's `c/colibri.c` engine" in card_text and "qt_from_disk" not in card_text
    assert f'model="$(HF_ENDPOINT={hub.endpoint} hf download me/tiny-int4)"' in card_text
    assert 'colitools run "$model" --prompt "Hello"' in card_text
    # sizes first: source -> output, bits per weight; only the roles the model has (no MTP layer, no tower)
    body = card_text.split("---\n", 2)[2].splitlines()
    assert body[2].startswith("**") and " -> " in body[2] and "bits per weight**" in body[2], body[:4]
    assert "| mtp |" not in card_text and "| towers |" not in card_text
    for p in converted.glob("*.safetensors"):
        assert f"| {p.name} | {p.stat().st_size:,} |" in card_text
    total = sum(p.stat().st_size for p in converted.iterdir() if p.is_file() and not p.name.startswith("."))
    assert f"Total: {total:,} bytes." in card_text


def test_a_readme_of_the_user_is_kept_and_its_metadata_completed(hub, converted, tmp_path):
    (converted / "README.md").write_text(
        "---\nlicense: apache-2.0\ntags:\n- mine\n---\n# My notes\nkeep me\n"
    )
    upload_output(converted, "me/tiny-int4")
    text = (download("me/tiny-int4", tmp_path / "back") / "README.md").read_text()
    assert text.endswith("# My notes\nkeep me\n")
    assert "license: apache-2.0" in text and "base_model: org/tiny" in text
    assert "- mine" in text and "- colitools" in text


def test_upload_reads_each_shard_once_with_the_manifest_sha256(hub, converted, tmp_path):
    """The shards' bytes are changed behind the manifest's back, sizes kept: if huggingface_hub hashed the files
    itself the oids would match the new bytes and the Hub would take them; with the manifest's sha256 the Hub
    sees bodies that are not their oid and refuses them, and the error names the file."""
    shard = sorted(converted.glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UploadError, match=rf"me/tiny-int4: Error while uploading '{shard.name}'.*400 sha256"):
        upload_output(converted, "me/tiny-int4")
    # nothing was announced under the changed bytes' sha256
    assert hub.upload.bodies.get(sha256(shard), 0) == 0


def test_upload_to_an_existing_repo_on_a_new_branch_and_as_a_pull_request(hub, converted, tmp_path):
    upload_output(converted, "me/tiny-int4")
    stored = dict(hub.upload.stored)
    upload_output(converted, "me/tiny-int4", revision="int4")
    # a change: an identical upload commits nothing
    (converted / "README.md").write_text("# A card of my own\n")
    pr = upload_output(converted, "me/tiny-int4", create_pr=True)
    assert hub.upload.created == ["me/tiny-int4"] and hub.upload.stored == stored  # no object sent twice
    assert pr.pr_url and pr.pr_url.endswith("/discussions/1")
    assert (download("me/tiny-int4", tmp_path / "b", revision="int4") / "colitools.json").is_file()
    with pytest.raises(ParameterError, match="`create_pr`"):
        upload_output(converted, "me/tiny-int4", create_pr=True, revision="int4")


def test_missing_token_is_one_line_exit_1(hub, converted, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    result = colitools("upload", converted, "me/tiny-int4")
    assert result.returncode == 1
    assert "no Hugging Face token" in one_line_error(result) and "--token" in result.stderr


def test_a_rejected_push_is_one_line_naming_the_repo_and_status(hub, converted):
    reject_push(hub, "me/tiny-int4", 403)
    result = colitools("upload", converted, "me/tiny-int4", "--no-progress")
    assert result.returncode == 1
    assert "me/tiny-int4: the Hub refused the upload: 403" in one_line_error(result)
    reject_push(hub, "me/other", 412)
    result = colitools("upload", converted, "me/other", "--json")
    assert json.loads(result.stdout.splitlines()[-1])["exit_code"] == 1 and "412" in one_line_error(result)


def test_an_incomplete_output_is_refused_before_anything_is_sent(hub, converted):
    manifest = Manifest.load(converted / "colitools.json")
    manifest.data["state"] = "converting"
    manifest.dump(converted / "colitools.json")
    result = colitools("upload", converted, "me/tiny-int4")
    assert result.returncode == 1 and "not 'complete'" in one_line_error(result)
    assert hub.upload.created == []


def test_an_upload_killed_mid_transfer_resumes_sending_only_what_is_missing(hub, converted, tmp_path):
    shards = {s["sha256"]: s["size"] for s in Manifest.load(converted / "colitools.json").data["shards"]}
    throttle_uploads(hub, 100_000)  # bytes/s: the smallest shard lands first, the others are still in flight
    child = subprocess.Popen([*COMMAND, "upload", str(converted), "me/tiny-int4"], env=os.environ.copy(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not hub.upload.stored and time.monotonic() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    first = dict(hub.upload.stored)
    assert len(first) == 1 and set(first) < set(shards)
    throttle_uploads(hub, None)
    time.sleep(3)  # bodies the kernel had buffered before the kill finish at the old rate (<= 1.3 s)
    settled, received = dict(hub.upload.stored), dict(hub.upload.bodies)
    result = colitools("upload", converted, "me/tiny-int4")
    assert result.returncode == 0, result.stderr
    assert set(hub.upload.stored) == set(shards)
    for oid in settled:  # what the Hub held before the rerun was not sent again
        assert hub.upload.bodies[oid] == received[oid] and hub.upload.stored[oid] == 1
    back = download("me/tiny-int4", tmp_path / "back")
    assert verify_container(back).ok


def test_convert_with_upload_repo_uploads_the_finished_output(hub, converted, tmp_path):
    out = tmp_path / "out2"
    result = colitools("convert", "org/tiny", out, "--upload-repo", "me/tiny-cli", "--json", "--no-progress")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["upload"]["repo_id"] == "me/tiny-cli" and report["units_total"] == 3
    back = download("me/tiny-cli", tmp_path / "back")
    for shard in out.glob("*.safetensors"):
        assert (back / shard.name).read_bytes() == shard.read_bytes()
    assert "base_model: org/tiny" in (back / "README.md").read_text()
