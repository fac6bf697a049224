"""Publish a converted folder to the Hugging Face Hub (``colitools upload``, ``convert --upload-repo``).

Through huggingface_hub's public API: ``HfApi.create_repo(exist_ok=True)``, ``create_branch`` for a
``revision`` that is not there yet, and one ``create_commit`` holding every file, with the card
(``model_card.build_card``) as ``README.md``. The token is huggingface_hub's (``get_token``: ``HF_TOKEN``, then
the file ``hf auth login`` wrote).

What is uploaded: the files the manifest records (every unit's files, the copied files, the indexes) and
``colitools.json`` itself; nothing else in the folder (usage history, locks, a user's notes) unless it is the
card. Refused before anything is sent: a folder with no readable manifest, a conversion not marked complete, a
planned file not recorded, a recorded file missing or of another size.

The manifest's sha256 of each file is handed to huggingface_hub as the LFS oid (``UploadInfo.sha256``, public
and documented as "SHA256 of the blob, if already known"), so the upload reads each file once, to send it, not a
second time to hash it. That is also the check of the bytes: the Hub recomputes the sha256 of every object it
receives and refuses one that is not its oid, so a file changed since the conversion fails its upload with one
line naming it. Resumable: an interrupted run rerun sends only what the Hub does not hold yet (its LFS batch
answer lists the objects it already has, and huggingface_hub skips them).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colitools.converters.manifest import MANIFEST_FILE, Manifest, ManifestError
from colitools.converters.model_card import CARD_FILE, build_card
from colitools.formats.errors import ParameterError, UploadError
from colitools.formats.filenames import INDEX_FILE
from colitools.formats.planar_sidecar import INDEX_NAME, SIDECAR_DIR

_SIDECAR_INDEX = f"{SIDECAR_DIR}/{INDEX_NAME}"  # the planar sidecar's index (not in the manifest's records)


@dataclass(frozen=True)
class UploadFile:
    """One file of the upload: its name in the repo, size, and the manifest's sha256 (None: not recorded)."""

    name: str
    size: int
    sha256: str | None = None


@dataclass
class UploadReport:
    """What ``upload_output`` did; ``to_json`` for ``--json``, ``text`` for people."""

    repo_id: str
    revision: str
    commit_url: str
    commit_oid: str
    pr_url: str | None
    files: list[UploadFile] = field(default_factory=list)
    card: str = ""  # the README.md uploaded
    committed: bool = True  # False: the Hub held these exact files already and skipped the commit (no PR either)
    create_pr: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "colitools.upload/1",
            "ok": True,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit_url": self.commit_url,
            "commit_oid": self.commit_oid,
            "pr_url": self.pr_url,
            "committed": self.committed,
            "create_pr": self.create_pr,
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.files],
            "total_bytes": self.total_bytes,
        }

    def text(self) -> str:
        return report_line(self.to_json())


def report_line(report: dict[str, Any]) -> str:
    """The line an upload prints, from its report (``UploadReport.to_json``; ``convert --stream-upload`` keeps
    the dict)."""
    where = report["pr_url"] or report["commit_url"]
    if not report.get("committed", True):  # huggingface_hub skips a commit that changes nothing
        nopr = "; no pull request opened" if report.get("create_pr") else ""
        return (f"nothing to commit: {report['repo_id']} ({report['revision']}) holds these {len(report['files'])} "
                f"files and {CARD_FILE} unchanged at {report['commit_oid'][:12]}{nopr}: {report['commit_url']}")  # fmt: skip
    return (f"uploaded {len(report['files'])} files ({report['total_bytes']:,} bytes) and {CARD_FILE} to "
            f"{report['repo_id']} ({report['revision']}): {where}")  # fmt: skip


def upload_files(outdir: Path) -> tuple[Manifest, list[UploadFile]]:
    """The manifest of ``outdir`` and the files to upload; UploadError when the conversion is not complete
    (see the module docstring)."""
    path = outdir / MANIFEST_FILE
    if not path.is_file():
        raise UploadError(f"{outdir}: no {MANIFEST_FILE}: not a colitools output (convert it first)")
    try:
        manifest = Manifest.load(path)
        records = manifest.file_records()
        planned = manifest.planned_files()
    except (OSError, ManifestError) as exc:
        raise UploadError(f"{path}: unreadable manifest ({exc})") from None
    if manifest.state != "complete":
        raise UploadError(f"{outdir}: conversion state is {manifest.state!r}, not 'complete': resume the convert "
                          "before uploading")  # fmt: skip
    streamed = next((r["uploaded"] for r in records if r.get("uploaded")), None)  # converters/stream_upload.py
    if streamed is not None:
        raise UploadError(f"{outdir}: `colitools convert --stream-upload` sent its files to {streamed} and deleted "
                          "them here: that repo holds the conversion")  # fmt: skip
    recorded = {r["name"] for r in records}
    missing = [n for n in planned if n not in recorded]
    if missing:
        raise UploadError(
            f"{path}: {len(missing)} planned file(s) not recorded as finished, e.g. {missing[0]}"
        )
    files = [UploadFile(r["name"], r["size"], r["sha256"]) for r in records] + extra_files(outdir, manifest)
    for f in files:
        local = outdir / f.name
        if not local.is_file():
            raise UploadError(f"{local}: recorded in {MANIFEST_FILE} but missing")
        if f.sha256 is not None and local.stat().st_size != f.size:
            raise UploadError(f"{local}: size {local.stat().st_size}, {MANIFEST_FILE} says {f.size}")
    return manifest, files


def extra_files(outdir: Path, manifest: Manifest) -> list[UploadFile]:
    """The files uploaded beside the units' (no sha256 recorded): the copied files, the index, the planar
    sidecar's index and ``colitools.json``, those present in ``outdir``."""
    recorded = {r["name"] for r in manifest.file_records()}
    extra = [*(manifest.data.get("copied_files") or []), INDEX_FILE, _SIDECAR_INDEX, MANIFEST_FILE]
    names = dict.fromkeys(n for n in extra if isinstance(n, str) and n not in recorded)
    return [UploadFile(n, (outdir / n).stat().st_size) for n in names if (outdir / n).is_file()]


def add_operation(root: Path, f: UploadFile):
    """The ``CommitOperationAdd`` of ``root / f.name``, with the manifest's sha256 as its LFS oid when recorded
    (no second read to hash it; the Hub refuses bytes that are not their oid)."""
    from huggingface_hub import CommitOperationAdd

    op = CommitOperationAdd(path_in_repo=f.name, path_or_fileobj=str(root / f.name))
    if f.sha256 is not None:
        op.upload_info.sha256 = bytes.fromhex(f.sha256)
    return op


def upload_output(
    outdir: str | os.PathLike[str],
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool = False,
    create_pr: bool = False,
    token: str | None = None,
    endpoint: str | None = None,
    progress: bool | None = None,
) -> UploadReport:
    """Upload the complete conversion in ``outdir`` to the Hub model repo ``repo_id`` (created when missing,
    ``private`` then), on branch ``revision`` (default main; created from main when missing) or as a pull request
    (``create_pr``, against main). ``progress``: huggingface_hub's bars (None: leave its setting)."""
    from huggingface_hub import CommitOperationAdd, HfApi, get_token

    root = Path(outdir)
    if create_pr and revision not in (None, "main"):
        raise ParameterError(f"`create_pr` opens a pull request against main, not `revision={revision!r}`")
    manifest, files = upload_files(root)
    token = token or get_token()
    if not token:
        raise UploadError("no Hugging Face token: set HF_TOKEN, run `hf auth login`, or pass `token`")
    card = build_card(root, manifest, repo_id, [(f.name, f.size) for f in files], endpoint)
    operations = [add_operation(root, f) for f in files]
    operations.append(CommitOperationAdd(path_in_repo=CARD_FILE, path_or_fileobj=card.encode("utf-8")))
    api = HfApi(endpoint=endpoint, token=token)
    version = (manifest.data.get("tool") or {}).get("version")
    with _hub_errors(repo_id), _progress_bars(progress), _skipped_commit_unsaid():
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision not in (None, "main") and not create_pr:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        head = api.repo_info(repo_id, revision=revision or "main").sha  # a skipped commit answers this one
        info = api.create_commit(
            repo_id, operations, commit_message=f"Upload colitools {version} conversion",
            commit_description=_description(manifest), revision=revision, create_pr=create_pr,
        )  # fmt: skip
    committed = info.oid != head or info.pr_url is not None
    return UploadReport(repo_id, revision or "main", info.commit_url, info.oid, info.pr_url, files, card, committed,
                        create_pr)  # fmt: skip


def _description(manifest: Manifest) -> str:
    source = manifest.data.get("source") or {}
    if source.get("kind") == "hf":
        return f"Converted from {source.get('repo_id')}@{source.get('revision')}."
    return "Converted from a local folder."


@contextmanager
def _progress_bars(progress: bool | None):
    """huggingface_hub's own tqdm bars on (True) or off (False) for the upload, its setting restored after."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    before = are_progress_bars_disabled()
    if progress is not None:
        (enable_progress_bars if progress else disable_progress_bars)()
    try:
        yield
    finally:
        (disable_progress_bars if before else enable_progress_bars)()


class _SkippedCommitFilter:
    """Drops huggingface_hub's own line about a commit it skipped: the report says it (``UploadReport.text``)."""

    def filter(self, record) -> bool:
        return not record.getMessage().startswith("No files have been modified since last commit")


@contextmanager
def _skipped_commit_unsaid():
    import logging

    logger, quiet = logging.getLogger("huggingface_hub.hf_api"), _SkippedCommitFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


@contextmanager
def _hub_errors(repo_id: str):
    """huggingface_hub's exceptions as one UploadError line naming the repo, the status and the Hub's message."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as exc:
        raise UploadError(f"{repo_id}: the Hub refused the upload: {_http_reason(exc)}") from None
    except RuntimeError as exc:  # huggingface_hub wraps a failed LFS upload: "Error while uploading 'x' ..."
        cause = exc.__cause__
        reason = _http_reason(cause) if isinstance(cause, HfHubHTTPError) else str(cause or exc)
        raise UploadError(f"{repo_id}: {str(exc).rstrip('.')}: {reason}") from None
    except (httpx2.HTTPError, ValueError) as exc:
        raise UploadError(f"{repo_id}: upload failed: {' '.join(str(exc).split())}") from None


def _http_reason(exc) -> str:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    message = response.headers.get("X-Error-Message") if response is not None else None
    text = message or str(exc).splitlines()[0]
    return f"{status} {text}" if status else text
