"""``colitools upload`` of files the Hub holds already: huggingface_hub skips the commit, and the command says
"nothing to commit" (exit 0) instead of "uploaded N files", and that ``--create-pr`` opened no pull request.

Real processes (the console script) and the real huggingface_hub client against the fake Hub (``hubserver.py`` +
``hubupload.py``), whose own record of commits (``hub.upload.commits``) is the reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.runner import convert

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import colitools  # noqa: E402

SPEC = Tiny(layers=2, experts=2, hidden=128, inter=64, shards=3)
TOKEN = "hf_write_token"


@pytest.fixture
def converted(hub, tmp_path, monkeypatch) -> Path:
    src = tmp_path / "src"
    make_checkpoint(src, SPEC)
    hub.add_repo("org/tiny", {"main": src})
    out = tmp_path / "out"
    convert("org/tiny", out)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.token = TOKEN
    return out


def test_an_identical_upload_says_nothing_to_commit_and_a_pr_that_was_not_opened(hub, converted):
    first = colitools("upload", converted, "me/tiny-int4", "--no-progress")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("uploaded ") and len(hub.upload.commits) == 1
    head = hub.commit_of("me/tiny-int4")
    n = len(json.loads((converted / "colitools.json").read_text())["shards"])

    again = colitools("upload", converted, "me/tiny-int4", "--no-progress")
    assert again.returncode == 0 and again.stderr == "", again.stderr  # not huggingface_hub's own line too
    assert len(hub.upload.commits) == 1 and hub.commit_of("me/tiny-int4") == head  # the Hub made no commit
    line = again.stdout.strip()
    assert (
        line.startswith("nothing to commit: me/tiny-int4 (main) holds these ") and "uploaded" not in line
    ), line
    assert f" unchanged at {head[:12]}" in line and "pull request" not in line, line
    report = json.loads(colitools("upload", converted, "me/tiny-int4", "--json").stdout)
    assert report["committed"] is False and report["commit_oid"] == head and len(report["files"]) >= n

    pr = colitools("upload", converted, "me/tiny-int4", "--create-pr", "--json")
    assert pr.returncode == 0, pr.stderr
    report = json.loads(pr.stdout)
    assert report["committed"] is False and report["pr_url"] is None
    assert len(hub.upload.commits) == 1  # no commit, on a pull request or anywhere
    text = colitools("upload", converted, "me/tiny-int4", "--create-pr").stdout
    assert text.startswith("nothing to commit: ") and "; no pull request opened: " in text, text

    (converted / "README.md").write_text("# A card of my own\n")  # a change: now a pull request is opened
    opened = json.loads(colitools("upload", converted, "me/tiny-int4", "--create-pr", "--json").stdout)
    assert opened["committed"] is True and opened["pr_url"].endswith("/discussions/1")
    assert len(hub.upload.commits) == 2 and hub.upload.commits[-1]["pr"] is True
