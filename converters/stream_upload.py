"""``convert --upload-repo REPO --stream-upload``: each unit's files go to the Hub as soon as the ledger records
them, and leave the local disk once the Hub holds them with the manifest's sha256.

Where the files go. Every unit's files are committed to the work branch ``colitools-stream`` of ``REPO`` (created
from main), one commit per unit (``create_commit``, the manifest's sha256 handed over as the LFS oid, as
``publish.upload_output`` does). The repo's main branch is not touched until the end: then one commit on main
copies every unit file from the branch (``CommitOperationCopy``: the Hub links the stored objects, no byte is
sent again) and adds the index, ``config.json``, the copied files, ``colitools.json`` and the model card; the
branch is deleted after. So main is either what it was or the whole conversion, never half of one: a reader of
main cannot take a half-published repo for a whole one, whatever interrupts the run. (Committing the units to
main and holding back only the index and ``colitools.json`` would leave loose shards on main for hours; LFS
objects uploaded without a commit are not kept by the Hub.)

When a file is done. After a unit's commit, ``get_paths_info`` on the branch must report every file of the unit
with the manifest's sha256 (a file the Hub keeps as a regular file: the git blob sha1 of the local bytes); only
then the ledger marks each record ``"uploaded": REPO`` (saved) and the local file is deleted, in that order: a
file is never gone before its mark is on disk. The ledger (``ledger._files_damaged``) counts a marked file that
is absent as intact, so a resume neither converts nor sends it again. A unit recorded but not marked yet (a kill
between the record and the confirmation) is uploaded when the next run starts; its objects the Hub already
stored are not sent again (the LFS batch answer lists them), and a file the branch already holds with its digest
is only marked. Before deleting a file its safetensors header is kept as a sparse stand-in under
``.colitools-upload/`` (the header, then a hole to the file's size: a few KB on disk), from which the model card's
formats table is read at the end (``model_card.build_card`` inspects the container's headers).

What stays local. After a run: ``colitools.json`` (the ledger: every file with its sha256 and its ``uploaded``
mark, and ``published``: the repo and the commit on main), ``config.json``, ``model.safetensors.index.json``, the
copied tokenizer and generation files (all small), and no unit file. The uploaded ``colitools.json`` is the local
one without the marks and without ``published``: a local conversion's, ``run`` apart.

Disk. ``runner`` lets unit k+1 write only once unit k's files are confirmed and deleted (its shards download
meanwhile), so the output holds one unit's files at a time: peak local disk <= the source shards of one unit
(plus those downloaded ahead) + one unit's output + the floor (``bench/stream_upload.py`` measures it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colitools.converters.manifest import MANIFEST_FILE, Manifest
from colitools.formats.atomic import write_json_atomic
from colitools.formats.errors import ConvertError, ParameterError, UploadError
from colitools.formats.filenames import LOCK_FILE
from colitools.formats.lockfile import held_lock

if TYPE_CHECKING:  # publish (huggingface_hub, the model card's inspect) is imported when an upload runs
    from colitools.converters.publish import UploadFile

BRANCH = "colitools-stream"  # the work branch the units are committed to until main gets them all at once
MARK = "uploaded"  # a unit file record's key: the repo the Hub confirmed it in (the file was deleted here)
STUB_DIR = ".colitools-upload"  # the deleted files' header stand-ins, for the model card


def check_target(repo_id: str, token: str | None) -> str:
    """The token to upload ``repo_id`` with, checked before any work: a malformed repo id is a ParameterError
    (exit 2), no token an UploadError (exit 1), each one line."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ParameterError(
            f"`upload_repo={repo_id!r}`: not a Hugging Face repo id (org/name): {exc}"
        ) from None
    token = token or get_token()
    if not token:
        raise UploadError(
            "no Hugging Face token to upload with: set HF_TOKEN, run `hf auth login`, or pass `token`"
        )
    return token


def check_folder(out: Path, units: dict[str, Any], repo_id: str | None, stream: bool) -> None:
    """Refuse (one line) a run in ``out``, whose ledger holds ``units``, that would lose files this folder
    streamed: a rerun without ``stream`` or to another repo (the deleted files are on the Hub in the repo their
    marks name, not here)."""
    repos = {f.get(MARK) for u in units.values() if isinstance(u, dict) for f in u.get("files") or ()
             if isinstance(f, dict) and f.get(MARK)}  # fmt: skip
    if not repos or (stream and repos == {repo_id}):
        return
    where = sorted(map(str, repos))[0]
    raise ConvertError(
        f"{out}: this conversion streamed files to {where} and deleted them here: rerun with "
        f"`upload_repo={where!r}` and `stream_upload`"
    )


class StreamUploader:
    """The streaming upload of one conversion in ``out`` to ``repo_id`` (see the module docstring)."""

    def __init__(self, out: Path, repo_id: str, token: str, *, endpoint: str | None = None,
                 progress: bool | None = None):  # fmt: skip
        from huggingface_hub import HfApi

        self.out, self.repo_id, self.progress = out, repo_id, progress
        self.api = HfApi(endpoint=endpoint, token=token)
        self.endpoint = endpoint

    def open_branch(self) -> None:
        """The repo (created when missing) and its work branch (from main when missing), before any unit."""
        from colitools.converters import publish

        with publish._hub_errors(self.repo_id):
            self.api.create_repo(self.repo_id, exist_ok=True)
            self.api.create_branch(self.repo_id, branch=BRANCH, exist_ok=True)

    def catch_up(self, manifest: Manifest, save) -> None:
        """Every recorded unit whose files are not all confirmed yet (an earlier run stopped in between):
        uploaded now; a marked file still here is deleted."""
        for key in list(manifest.units):
            self.unit_recorded(manifest, key, save, sent_before=True)

    def unit_recorded(self, manifest: Manifest, key: str, save, *, sent_before: bool = False) -> None:
        """Upload the files of unit ``key`` (recorded in ``manifest``) to the branch, confirm each one's sha256 on
        the Hub, mark them (``save()`` writes the ledger) and delete them here. ``sent_before``: an earlier run
        may have committed them (asked first, so a committed file is only marked)."""
        records = [f for f in manifest.units[key]["files"] if f.get(MARK) != self.repo_id]
        if records:
            confirmed = self._confirmed(records) if sent_before else set()
            sending = [f for f in records if f["name"] not in confirmed]
            if sending:
                self._commit(key, sending)
                confirmed = self._confirmed(records)
            missing = [f["name"] for f in records if f["name"] not in confirmed]
            if missing:
                raise UploadError(f"{self.repo_id}: the Hub does not hold {missing[0]} with the sha256 "
                                  f"{MANIFEST_FILE} records after its upload")  # fmt: skip
            for f in records:
                self._keep_header(f["name"])
                f[MARK] = self.repo_id
            save()
        for f in manifest.units[key]["files"]:
            with contextlib.suppress(FileNotFoundError):
                (self.out / f["name"]).unlink()

    def _commit(self, key: str, records: list[dict[str, Any]]) -> None:
        from colitools.converters import publish

        ops = [
            publish.add_operation(self.out, publish.UploadFile(f["name"], f["size"], f["sha256"]))
            for f in records
        ]
        with publish._hub_errors(self.repo_id), publish._progress_bars(self.progress):
            self.api.create_commit(
                self.repo_id, ops, commit_message=f"colitools: unit {key}", revision=BRANCH
            )

    def _confirmed(self, records: list[dict[str, Any]], revision: str = BRANCH) -> set[str]:
        """Names among ``records`` the Hub holds at ``revision`` with their recorded sha256 (an LFS file's oid;
        a regular file's git blob sha1, computed from the local bytes)."""
        from colitools.converters import publish

        with publish._hub_errors(self.repo_id):
            held = {p.path: p for p in self.api.get_paths_info(self.repo_id, [f["name"] for f in records],
                                                               revision=revision)}  # fmt: skip
        ok = set()
        for f in records:
            info = held.get(f["name"])
            lfs = getattr(info, "lfs", None)
            if lfs is not None and lfs.sha256 == f["sha256"] and lfs.size == f["size"]:
                ok.add(f["name"])
            elif info is not None and lfs is None and (self.out / f["name"]).is_file():
                if info.blob_id == _git_blob_id(self.out / f["name"]):
                    ok.add(f["name"])
        return ok

    def _keep_header(self, name: str) -> None:
        """A sparse stand-in of ``name``: its safetensors header, then a hole to its size (``STUB_DIR``)."""
        local = self.out / name
        if not local.is_file():
            return
        stub = self.out / STUB_DIR / name
        stub.parent.mkdir(parents=True, exist_ok=True)
        with open(local, "rb") as src, open(stub, "wb") as dst:
            head = src.read(8)
            dst.write(head + src.read(int.from_bytes(head, "little")) if len(head) == 8 else head)
            dst.truncate(local.stat().st_size)

    # ------------------------------------------------------------------------------------------ the end
    def publish(self, manifest: Manifest, save) -> dict[str, Any]:
        """The final commit on main (every unit file copied from the branch, the small files and the card
        added), checked, recorded as ``published`` in the ledger; then the branch is deleted. Returns the
        upload report (``publish.UploadReport.to_json``'s keys)."""
        from huggingface_hub import CommitOperationAdd, CommitOperationCopy

        from colitools.converters import publish
        from colitools.converters.model_card import CARD_FILE

        units = [f for u in manifest.units.values() for f in u["files"]]
        small = self._small_files(manifest)
        clean = self.out / STUB_DIR / MANIFEST_FILE
        clean.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(clean, _without_marks(manifest.data), expand=2)
        files = [publish.UploadFile(f["name"], f["size"], f["sha256"]) for f in units]
        files += [*small, publish.UploadFile(MANIFEST_FILE, clean.stat().st_size)]
        card = self._card(manifest, files)
        ops: list[Any] = [CommitOperationCopy(f["name"], f["name"], src_revision=BRANCH) for f in units]
        ops += [publish.add_operation(self.out, f) for f in small]
        ops += [CommitOperationAdd(MANIFEST_FILE, str(clean)), CommitOperationAdd(CARD_FILE, card.encode())]
        version = (manifest.data.get("tool") or {}).get("version")
        with publish._hub_errors(self.repo_id), publish._progress_bars(self.progress):
            info = self.api.create_commit(self.repo_id, ops, commit_message=f"Upload colitools {version} conversion",
                                          commit_description=publish._description(manifest))  # fmt: skip
        missing = {f["name"] for f in units} - self._confirmed(units, revision="main")
        if missing:
            raise UploadError(
                f"{self.repo_id}: main does not hold {sorted(missing)[0]} with its recorded sha256"
            )
        report = _report(self.repo_id, info, files)
        manifest.data["published"] = {"repo_id": self.repo_id, "commit": info.oid, "report": report}
        save()
        self.delete_branch()
        shutil.rmtree(self.out / STUB_DIR, ignore_errors=True)
        return report

    def _small_files(self, manifest: Manifest) -> list[UploadFile]:
        """The index, config, copied files and the sidecar index (``publish.extra_files`` but the manifest)."""
        from colitools.converters import publish

        return [f for f in publish.extra_files(self.out, manifest) if f.name != MANIFEST_FILE]

    def _card(self, manifest: Manifest, files: list[UploadFile]) -> str:
        """The model card, read from the stand-ins of the deleted files beside the local ones."""
        from colitools.converters.model_card import CARD_FILE, build_card

        view = self.out / STUB_DIR / "card"
        shutil.rmtree(view, ignore_errors=True)
        for f in files:
            here = self.out / f.name
            there = here if here.is_file() else self.out / STUB_DIR / f.name
            if f.name == MANIFEST_FILE:
                there = self.out / STUB_DIR / MANIFEST_FILE
            (view / f.name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(there, view / f.name)
        if (self.out / CARD_FILE).is_file():
            os.symlink(self.out / CARD_FILE, view / CARD_FILE)
        try:
            return build_card(view, manifest, self.repo_id, [(f.name, f.size) for f in files], self.endpoint)
        finally:
            shutil.rmtree(view, ignore_errors=True)

    def delete_branch(self) -> None:
        from huggingface_hub.errors import RevisionNotFoundError

        from colitools.converters import publish

        with publish._hub_errors(self.repo_id), contextlib.suppress(RevisionNotFoundError):
            self.api.delete_branch(self.repo_id, branch=BRANCH)


def _without_marks(data: dict[str, Any]) -> dict[str, Any]:
    """The manifest as a local conversion writes it: no ``uploaded`` marks, no ``published``."""
    units = {k: {**u, "files": [{n: v for n, v in f.items() if n != MARK} for f in u["files"]]}
             for k, u in data["units"].items()}  # fmt: skip
    return {k: (units if k == "units" else v) for k, v in data.items() if k != "published"}


def _report(repo_id: str, info, files: Iterable[UploadFile]) -> dict[str, Any]:
    from colitools.converters.publish import UploadReport

    return UploadReport(repo_id, "main", info.commit_url, info.oid, info.pr_url, list(files)).to_json()


def _git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def publish_streamed(out: Path, repo_id: str, token: str | None, *, endpoint: str | None = None,
                     progress: bool | None = None) -> dict[str, Any]:  # fmt: skip
    """After ``convert`` completed ``out``: the units not confirmed yet uploaded, then the final commit on main
    (``StreamUploader.publish``), under the folder's lock. Returns the upload report."""
    uploader = StreamUploader(
        out, repo_id, check_target(repo_id, token), endpoint=endpoint, progress=progress
    )
    path = out / MANIFEST_FILE
    with held_lock(
        out / LOCK_FILE, lambda: ConvertError(f"{out}: another colitools convert is working in this folder")
    ):
        manifest = Manifest.load(path)
        if manifest.state != "complete":  # pragma: no cover - convert returns a complete output
            raise UploadError(f"{out}: conversion state is {manifest.state!r}, not 'complete'")
        done = manifest.data.get("published")
        if isinstance(done, dict) and done.get("repo_id") == repo_id:  # a rerun: published already
            uploader.delete_branch()  # in case the run that published stopped before this
            return done["report"]
        uploader.open_branch()
        uploader.catch_up(manifest, lambda: manifest.dump(path))
        return uploader.publish(manifest, lambda: manifest.dump(path))
