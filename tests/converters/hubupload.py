"""The upload half of the fake Hub (``hubserver.py``): the requests huggingface_hub's ``HfApi.create_repo``,
``create_branch`` and ``create_commit`` send over the legacy LFS transfer (tests set ``HF_HUB_DISABLE_XET``),
read from huggingface_hub's own source (``hf_api.py``, ``_commit_api.py``, ``lfs.py``):

* ``POST /api/repos/create`` ``{"name", "organization", "visibility"?}`` -> 200 ``{"url"}``, 409 when it exists;
* ``POST /api/models/{repo}/branch/{branch}`` -> a branch at main's commit (409 when it exists);
* ``POST /api/validate-yaml`` -> ``{"errors": [], "warnings": []}`` (the README.md check of ``create_commit``);
* ``POST /api/models/{repo}/preupload/{rev}`` ``{"files": [{"path", "sample", "size"}]}`` -> each file's
  ``uploadMode`` (``lfs`` for weight suffixes or > 10 MB), ``shouldIgnore`` false and the ``oid`` at that revision;
* ``POST /{repo}.git/info/lfs/objects/batch`` -> per object ``actions`` (upload to the CDN listener + verify)
  unless an object with that oid and size is stored already (no ``actions``: huggingface_hub skips it);
* ``PUT {cdn}/lfs/{oid}?sig=`` -> the body is stored only when its sha256 is the oid and its length the size
  announced in the batch (else 400, nothing stored); ``POST /{repo}.git/info/lfs/objects/verify``;
* ``POST /api/models/{repo}/commit/{rev}[?create_pr=1]`` (ndjson ``header`` / ``file`` / ``lfsFile``) -> a new commit
  on the branch (or on ``refs/pr/N``); every ``lfsFile`` must name a stored object of that size (else 400; a
  ``CommitOperationCopy`` sends no size: the object must be stored);
* ``POST /api/models/{repo}/paths-info/{rev}`` (form ``paths``, ``expand``: ``HfApi.get_paths_info``) -> the files
  among ``paths`` at that revision (``type``, ``path``, ``size``, ``oid`` = git blob sha1, ``lfs: {oid = sha256,
  size, pointerSize}``), the paths that are not there left out, as the Hub does;
* ``DELETE /api/models/{repo}/branch/{branch}`` (``HfApi.delete_branch``) -> the branch removed (404 when absent).

Every write needs ``Authorization: Bearer <token>`` (401 without; with ``HubServer.token`` set, that token);
a repo or revision that does not exist is 404 with the Hub's ``X-Error-Code``. ``reject_push(repo, status)``
answers that repo's commits with ``status`` (403: no write access, 412: the branch moved); ``throttle_uploads``
reads LFS bodies at a limited rate. ``UploadState`` counts LFS bodies received and objects stored per oid;
``on_commit`` is called with each commit's repo, revision and files before it is answered.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

_REPO = r"(?P<repo>[^/]+(?:/[^/]+)?)"
_API = re.compile(rf"^/api/models/{_REPO}/(?P<what>preupload|commit|branch|paths-info)/(?P<rev>.+)$")
_LFS = re.compile(rf"^/{_REPO}\.git/info/lfs/objects/(?P<what>batch|verify)$")
_REGULAR_LIMIT = 10 * 1024 * 1024


@dataclass
class UploadState:
    """What the upload endpoints keep: stored objects (sha256 -> file), counters, rejections."""

    storage: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="hub-lfs-")))
    bodies: dict[str, int] = field(default_factory=dict)  # oid -> LFS bodies received (complete or not)
    stored: dict[str, int] = field(default_factory=dict)  # oid -> times stored
    body_bytes: int = 0  # LFS body bytes read from sockets
    created: list[str] = field(default_factory=list)  # repos created through the API
    private: set[str] = field(default_factory=set)
    rejections: dict[str, tuple[int, str]] = field(default_factory=dict)
    rate: float | None = None  # LFS body bytes per second
    commits: list[dict] = field(default_factory=list)  # every commit header received (summary, description)
    on_commit: object = None  # called (repo_id, revision, paths) as a commit arrives, before it is answered
    lock: threading.RLock = field(default_factory=threading.RLock)

    def close(self) -> None:
        shutil.rmtree(self.storage, ignore_errors=True)


def reject_push(hub, repo_id: str, status: int = 403, message: str | None = None) -> None:
    """Answer every commit to ``repo_id`` with ``status`` (None: accept again)."""
    with hub.upload.lock:
        if status is None:
            hub.upload.rejections.pop(repo_id, None)
        else:
            text = message or ("You don't have the rights to push to this repo" if status == 403 else
                               "A commit has happened since. Please refresh and try again.")  # fmt: skip
            hub.upload.rejections[repo_id] = (status, text)


def throttle_uploads(hub, bytes_per_second: float | None) -> None:
    """Read LFS upload bodies at about ``bytes_per_second`` (None: no limit)."""
    hub.upload.rate = bytes_per_second


def dispatch_upload(handler, method: str) -> None:
    """Route one POST / PUT (``_Handler.do_POST`` / ``do_PUT``)."""
    hub = handler.server.hub
    url = urlsplit(handler.path)
    path, query = url.path, parse_qs(url.query)
    if (status := hub._take_failure(path)) is not None:
        _drain(handler)
        return handler._error(status, "Injected failure")
    if handler.server.role == "cdn":
        if method == "PUT" and path.startswith("/lfs/"):
            return _lfs_put(handler, path[len("/lfs/") :], query)
        return handler._error(404, "Not Found")
    auth = handler.headers.get("Authorization")
    if (
        auth is None
        or not auth.startswith("Bearer ")
        or (hub.token is not None and auth != f"Bearer {hub.token}")
    ):
        _drain(handler)
        return handler._error(401, "Invalid credentials in Authorization header")
    if path == "/api/validate-yaml":
        _drain(handler)
        return handler._json({"errors": [], "warnings": []}, False)
    if path == "/api/repos/create":
        return _create_repo(handler, json.loads(_read_body(handler)))
    if m := _LFS.match(path):
        body = json.loads(_read_body(handler))
        if _repo_of(handler, unquote(m["repo"])) is None:
            return None
        return _lfs_batch(handler, body) if m["what"] == "batch" else _lfs_verify(handler, body)
    if m := _API.match(path):
        body = _read_body(handler)
        return _ROUTES[m["what"]](handler, unquote(m["repo"]), unquote(m["rev"]), body, query)
    _drain(handler)
    return handler._error(404, "Not Found")


# -- request bodies ------------------------------------------------------------------------------------------
def _read_body(handler, limit_rate: float | None = None, digest=None) -> bytes:
    """The request body (Content-Length or chunked); with ``digest`` the bytes are hashed, not kept."""
    rate = limit_rate
    chunks: list[bytes] = []

    def take(data: bytes) -> None:
        if digest is not None:
            digest.update(data)
        else:
            chunks.append(data)
        if rate:
            time.sleep(len(data) / rate)

    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                handler.rfile.readline()
                break
            _read_exact(handler, size, take)
            handler.rfile.readline()
    else:
        _read_exact(handler, int(handler.headers.get("Content-Length") or 0), take)
    return b"".join(chunks)


def _read_exact(handler, n: int, take) -> None:
    while n > 0:
        data = handler.rfile.read(min(n, 64 * 1024))
        if not data:
            raise ConnectionError("request body ended early")
        take(data)
        n -= len(data)


def _drain(handler) -> None:
    try:
        _read_body(handler)
    except (ConnectionError, ValueError):
        handler.close_connection = True


# -- repos and branches --------------------------------------------------------------------------------------
def _repo_of(handler, repo_id: str):
    repo = handler.server.hub._repos.get(repo_id)
    if repo is None:
        handler._error(404, "Repository not found", code="RepoNotFound")
    return repo


def _create_repo(handler, body: dict) -> None:
    from hubserver import _Repo

    hub = handler.server.hub
    repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
    with hub._lock:
        if repo_id in hub._repos:
            # the real Hub's 409 carries the repo url, which create_repo(exist_ok=True) returns
            body = json.dumps(
                {"error": "You already created this model repo", "url": f"{hub.endpoint}/{repo_id}"}
            )
            handler._send(409, {"Content-Type": "application/json", "Content-Length": str(len(body)),
                                "X-Error-Message": "You already created this model repo"})  # fmt: skip
            handler.wfile.write(body.encode())
            return None
        empty = hashlib.sha1(f"{repo_id}\0initial".encode()).hexdigest()
        hub._repos[repo_id] = _Repo({"main": empty}, {empty: {}})
        hub.upload.created.append(repo_id)
        if body.get("visibility") == "private" or body.get("private"):
            hub.upload.private.add(repo_id)
    return handler._json({"url": f"{hub.endpoint}/{repo_id}", "name": repo_id, "id": repo_id}, False)


def _branch(handler, repo_id: str, branch: str, body: bytes, query: dict) -> None:
    repo = _repo_of(handler, repo_id)
    if repo is None:
        return None
    with handler.server.hub._lock:
        if handler.command == "DELETE":
            if repo.refs.pop(branch, None) is None:
                return handler._error(404, f"Invalid rev id: {branch}", code="RevisionNotFound")
            return handler._json({}, False)
        if branch in repo.refs:
            return handler._error(409, f"Reference already exists: refs/heads/{branch}")
        repo.refs[branch] = repo.refs["main"]
    return handler._json({}, False)


def _preupload(handler, repo_id: str, rev: str, body: bytes, query: dict) -> None:
    found = handler._find(repo_id, rev)
    if found is None:
        return None
    files = found[1]
    answers = []
    for f in json.loads(body)["files"]:
        lfs = f["path"].endswith(_lfs_suffixes()) or f["size"] > _REGULAR_LIMIT
        old = files.get(f["path"])
        oid = None if old is None else (old.sha256 if old.lfs else old.blob_id)
        answers.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                        "oid": oid})  # fmt: skip
    return handler._json({"files": answers, "commitOid": found[0]}, False)


def _paths_info(handler, repo_id: str, rev: str, body: bytes, query: dict) -> None:
    found = handler._find(repo_id, rev)
    if found is None:
        return None
    asked = parse_qs(body.decode())
    answers = []
    for path in asked.get("paths", []):
        f = found[1].get(path)
        if f is None:
            continue
        entry = {"type": "file", "path": f.name, "size": f.size, "oid": f.blob_id}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        answers.append(entry)
    data = json.dumps(answers).encode()  # a JSON list (``_json`` sends objects)
    handler._send(200, {"Content-Type": "application/json", "Content-Length": str(len(data))})
    handler.wfile.write(data)
    return None


def _lfs_suffixes() -> tuple[str, ...]:
    from hubserver import LFS_SUFFIXES

    return LFS_SUFFIXES


# -- LFS -----------------------------------------------------------------------------------------------------
def _lfs_batch(handler, body: dict) -> None:
    hub = handler.server.hub
    answers = []
    for obj in body["objects"]:
        oid, size = obj["oid"], obj["size"]
        have = hub._blobs.get(oid)
        if have is not None and have.size == size:
            answers.append({"oid": oid, "size": size})  # already stored: no actions
            continue
        sig = hub._sign(oid, str(size))
        answers.append({
            "oid": oid, "size": size,
            "actions": {
                "upload": {"href": f"{hub.cdn_endpoint}/lfs/{oid}?size={size}&sig={sig}"},
                "verify": {"href": f"{hub.endpoint}/{_repo_path(handler)}.git/info/lfs/objects/verify"},
            },
        })  # fmt: skip
    return handler._json({"transfer": "basic", "objects": answers}, False)


def _repo_path(handler) -> str:
    return _LFS.match(urlsplit(handler.path).path)["repo"]


def _lfs_put(handler, oid: str, query: dict) -> None:
    from hubserver import RepoFile

    hub = handler.server.hub
    size = int(query.get("size", ["-1"])[0])
    if not hmac.compare_digest(query.get("sig", [""])[0], hub._sign(oid, str(size))):
        _drain(handler)
        return handler._error(403, "Request signature does not match")
    with hub.upload.lock:
        hub.upload.bodies[oid] = hub.upload.bodies.get(oid, 0) + 1
    digest = hashlib.sha256()
    counted = _Counting(digest, hub.upload)
    try:
        _read_body(handler, hub.upload.rate, counted)
    except (ConnectionError, OSError):
        handler.close_connection = True
        return None
    if counted.n != size or digest.hexdigest() != oid:
        return handler._error(400, f"sha256 or size mismatch: received {counted.n} bytes with sha256 "
                                   f"{digest.hexdigest()}, expected oid {oid} and size {size}")  # fmt: skip
    dest = hub.upload.storage / oid  # a test downloads it back through the resolve / CDN endpoints
    dest.write_bytes(b"".join(counted.parts))
    with hub._lock:
        hub._blobs[oid] = RepoFile(oid, dest, size, oid, _git_blob_id(dest), True)
        hub.upload.stored[oid] = hub.upload.stored.get(oid, 0) + 1
    return handler._json({}, False)


class _Counting:
    """Hashes the body and keeps it in memory (test objects are small) while counting its bytes."""

    def __init__(self, digest, state: UploadState):
        self.digest, self.state, self.n, self.parts = digest, state, 0, []

    def update(self, data: bytes) -> None:
        self.digest.update(data)
        self.parts.append(data)
        self.n += len(data)
        with self.state.lock:
            self.state.body_bytes += len(data)


def _git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def _lfs_verify(handler, body: dict) -> None:
    have = handler.server.hub._blobs.get(body["oid"])
    if have is None or have.size != body["size"]:
        return handler._error(404, f"object {body['oid']} not stored")
    return handler._json({}, False)


# -- commits -------------------------------------------------------------------------------------------------
def _commit(handler, repo_id: str, rev: str, body: bytes, query: dict) -> None:
    hub = handler.server.hub
    if (rejection := hub.upload.rejections.get(repo_id)) is not None:
        return handler._error(rejection[0], rejection[1])
    found = handler._find(repo_id, rev)
    if found is None:
        return None
    parent, files = found
    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
    header = next(item["value"] for item in lines if item["key"] == "header")
    new = dict(files)
    for item in lines:
        value = item["value"]
        if item["key"] == "file":
            new[value["path"]] = _store_regular(hub, value["path"], base64.b64decode(value["content"]))
        elif item["key"] == "lfsFile":
            blob = hub._blobs.get(value["oid"])
            if blob is None or blob.size != value.get("size", blob.size):
                return handler._error(400, f"LFS object {value['oid']} of {value['path']} was never uploaded")
            new[value["path"]] = _named(blob, value["path"])
        elif item["key"] != "header":
            return handler._error(400, f"unsupported commit item {item['key']!r}")
    if hub.upload.on_commit is not None:  # a test looks at the client's side while it waits for the answer
        hub.upload.on_commit(repo_id, rev, sorted(new))
    return _publish_commit(handler, repo_id, rev, parent, new, header, pr="create_pr" in query)


def _store_regular(hub, name: str, data: bytes):
    from hubserver import RepoFile

    digest = hashlib.sha256(data).hexdigest()
    dest = hub.upload.storage / f"regular-{digest}"
    dest.write_bytes(data)
    return RepoFile(name, dest, len(data), digest, _git_blob_id(dest), False)


def _named(blob, name: str):
    from hubserver import RepoFile

    return RepoFile(name, blob.path, blob.size, blob.sha256, blob.blob_id, True)


def _publish_commit(handler, repo_id, rev, parent, files, header, *, pr: bool) -> None:
    hub = handler.server.hub
    listing = "".join(f"{n}\0{f.sha256}\0" for n, f in sorted(files.items()))
    commit = hashlib.sha1(f"{parent}\0{listing}\0{header.get('summary')}".encode()).hexdigest()
    with hub._lock:
        repo = hub._repos[repo_id]
        repo.commits[commit] = files
        hub.upload.commits.append(dict(header, pr=pr, revision=rev))
        for f in files.values():
            if f.lfs:
                hub._blobs.setdefault(f.sha256, f)
        if pr:
            number = 1 + sum(1 for ref in repo.refs if ref.startswith("refs/pr/"))
            repo.refs[f"refs/pr/{number}"] = commit
            pr_url = f"{hub.endpoint}/{repo_id}/discussions/{number}"
        else:
            repo.refs[unquote(rev)] = commit
            pr_url = None
    return handler._json({"commitUrl": f"{hub.endpoint}/{repo_id}/commit/{commit}", "commitOid": commit,
                          "pullRequestUrl": pr_url}, False)  # fmt: skip


_ROUTES = {"preupload": _preupload, "commit": _commit, "branch": _branch, "paths-info": _paths_info}
