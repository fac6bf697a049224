"""A small fake Hugging Face Hub for tests: the subset of the protocol that huggingface_hub uses for model repos.

Two listeners on 127.0.0.1, like the real service:

* the **Hub** (``endpoint``):
  ``GET /api/models/{repo_id}`` and ``/api/models/{repo_id}/revision/{rev}`` -> ``{"id", "sha", "siblings"}``;
  with ``?blobs=true`` (``HfApi.model_info(files_metadata=True)``) every sibling carries ``size`` and
  ``blobId`` (git blob sha1), LFS files also ``lfs: {sha256, size, pointerSize}``.
  ``HEAD|GET /{repo_id}/resolve/{rev}/{filename}``: always ``X-Repo-Commit``. Regular files are served
  directly (``ETag`` = quoted git blob sha1). LFS files (``*.safetensors`` and other weight suffixes) answer
  ``302`` with ``Location`` on the CDN, ``X-Linked-Etag`` (quoted sha256) and ``X-Linked-Size``: because the
  CDN is another origin, huggingface_hub stops at this first response and reads the metadata from it
  (``get_hf_file_metadata``), and httpx2 drops ``Authorization`` when a GET follows the redirect.
  Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``) as the Hub does.
  ``GET /api/agent-harnesses`` (fetched once per process by huggingface_hub's user-agent code) answers an
  empty registry, without auth and outside fault injection.
  With ``token`` set, every Hub request needs ``Authorization: Bearer <token>`` (else 401).
* the **CDN** (``cdn_endpoint``): ``HEAD|GET /blobs/{sha256}?filename=..&sig=..``, signed URLs (403 on a bad
  signature), no auth; counts requests that still carry an ``Authorization`` header (``cdn_auth_headers``).

Bodies honour single ``Range: bytes=a-b | a- | -n`` requests (206 + ``Content-Range``, 416 when unsatisfiable)
and announce ``Accept-Ranges: bytes`` and ``Content-Length``.

Repos: ``{repo_id: {revision: folder}}``. A 40-hex revision key is a commit; any other key is a branch whose
commit is derived from the repo id, the branch and the files. Files are read from the folder at request time
(metadata is computed when the repo is added).

Uploads (``hubupload.py``: the endpoints huggingface_hub's ``create_repo`` / ``create_branch`` /
``create_commit`` call, with the checks the real Hub makes: a write token, an existing repo and revision, LFS
objects whose sha256 and size are their oid, a commit naming only stored objects; ``reject_push`` answers a
repo's commits with 403 / 412, ``throttle_uploads`` slows LFS bodies down).

Fault injection (per server, keyed by the file name inside the repo): ``drop_after`` (close the connection
after N bytes of a response body, for the next k responses), ``corrupt`` (flip one byte of the next k bodies
that cover it), ``fail_next`` (the next k requests answer 5xx), ``throttle`` (bytes per second),
``ignore_range``. ``stats(filename)`` counts body responses, HEADs, redirects, bytes served and the byte range
of every body response; ``cdn_bodies_most`` is the most CDN body responses that were in flight at once. ``stall`` (after N bytes of the next k bodies, send nothing more and hold the connection
open, until the server stops): a stalled transfer. ``throttle`` paces each body response on its own (one
connection at a time carries a response: a per-connection limit, as a CDN's); ``throttle_link`` caps the bytes per
second of all bodies together (the link), on top.

``write_hf_cache(cache_dir, repo_id, folder)`` lays a folder out as huggingface_hub's cache holds a snapshot
(refs, blobs named as the Hub's ETags name them, snapshot symlinks), by hand: a cache without a server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

try:  # tests/ folders are not packages (see conftest.py)
    from hubupload import UploadState, dispatch_upload
except ImportError:  # pragma: no cover
    from .hubupload import UploadState, dispatch_upload

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx", ".zst")
# A body goes out in slices, each paced (``throttle``, ``throttle_link``) and sent with ``socket.sendfile``: the fake
# Hub stands for a CDN, whose serving costs the client's machine no CPU, and it shares the cores of the benches that
# time the client. A slice is 10 ms of a throttled response within [CHUNK, SLICE] (a slow one is paced as finely as
# before), SLICE unthrottled.
CHUNK = 64 * 1024
SLICE = 1024 * 1024
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class RepoFile:
    """One file of one commit, with the metadata the Hub would report."""

    name: str
    path: Path
    size: int
    sha256: str
    blob_id: str  # git blob sha1 of the content
    lfs: bool


@dataclass
class FileStats:
    """What the server did for one file name (across repos and revisions)."""

    gets: int = 0  # body responses (200/206), on the Hub or the CDN
    heads: int = 0
    redirects: int = 0  # 302 answers from /resolve (GET or HEAD)
    bytes_served: int = 0  # body bytes actually written to sockets
    ranges: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of every body response
    drops: int = 0
    corrupted: int = 0
    stalls: int = 0


@dataclass
class _Repo:
    refs: dict[str, str]  # branch -> commit
    commits: dict[str, dict[str, RepoFile]]  # commit -> files


class HubServer:
    """A threaded fake Hub (see the module docstring). Use as a context manager or ``start()``/``stop()``."""

    def __init__(
        self, repos: dict[str, dict[str, str | os.PathLike]] | None = None, *, token: str | None = None
    ):
        self.token = token
        self.ignore_range = False
        self.cdn_auth_headers = 0
        self.cdn_bodies_most = 0  # the most CDN body responses in flight at once (connections sending a body)
        self._cdn_bodies = 0
        self.log: list[tuple[str, str, int]] = []  # (method, path, status)
        self._lock = threading.RLock()
        self._repos: dict[str, _Repo] = {}
        self._blobs: dict[str, RepoFile] = {}  # sha256 -> a file with that content
        self._stats: dict[str, FileStats] = {}
        self._drops: dict[str, list[int]] = {}  # filename -> [nbytes, times]
        self._corrupt: dict[str, list[int]] = {}  # filename -> [offset, times]
        self._stall: dict[str, list[int]] = {}  # filename -> [nbytes, times]
        self._stopping = threading.Event()  # releases stalled responses
        self._throttle: dict[str | None, float] = {}  # filename (None: every file) -> bytes/s
        self._link = [0.0, 0.0]  # bytes/s of every body together (0: no cap), the time the link is free again
        self._failures = [0, 503, None]  # remaining, status, path substring
        self._secret = os.urandom(16)
        self.upload = UploadState()  # hubupload.py: created repos, stored LFS objects, rejected pushes
        self._hub = _Listener(self, "hub")
        self._cdn = _Listener(self, "cdn")
        self._threads: list[threading.Thread] = []
        for repo_id, revisions in (repos or {}).items():
            self.add_repo(repo_id, revisions)

    # -- lifecycle -------------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def start(self) -> HubServer:
        for listener in (self._hub, self._cdn):
            thread = threading.Thread(
                target=listener.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()
        for listener in (self._hub, self._cdn):
            listener.shutdown()
            listener.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self.upload.close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- repos -----------------------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, revisions: dict[str, str | os.PathLike]) -> dict[str, str]:
        """Serve ``repo_id`` with ``{revision: folder}``; returns ``{revision: commit}``. "main" defaults to the
        first revision given."""
        refs: dict[str, str] = {}
        commits: dict[str, dict[str, RepoFile]] = {}
        for rev, folder in revisions.items():
            files = _scan(Path(folder))
            if _COMMIT.match(rev):
                commit = rev
            else:
                listing = "".join(f"{f.name}\0{f.sha256}\0" for f in files.values())
                commit = hashlib.sha1(f"{repo_id}\0{rev}\0{listing}".encode()).hexdigest()
                refs[rev] = commit
            commits[commit] = files
        if "main" not in refs and commits:
            refs["main"] = next(iter(commits))
        with self._lock:
            self._repos[repo_id] = _Repo(refs, commits)
            for files in commits.values():
                for f in files.values():
                    if f.lfs:
                        self._blobs[f.sha256] = f
        return {rev: refs.get(rev, rev) for rev in revisions}

    def commit_of(self, repo_id: str, revision: str = "main") -> str:
        repo = self._repos[repo_id]
        return repo.refs.get(revision, revision)

    # -- fault injection -------------------------------------------------------------------------------------
    def drop_after(self, filename: str, nbytes: int, times: int = 1) -> None:
        """The next ``times`` body responses for ``filename`` close the connection after ``nbytes`` body bytes."""
        with self._lock:
            self._drops[filename] = [nbytes, times]

    def corrupt(self, filename: str, offset: int, times: int = 1) -> None:
        """Flip the byte at ``offset`` in the next ``times`` body responses of ``filename`` that contain it."""
        with self._lock:
            self._corrupt[filename] = [offset, times]

    def stall(self, filename: str, nbytes: int, times: int = 1) -> None:
        """The next ``times`` body responses for ``filename`` send ``nbytes`` body bytes, then nothing more: the
        connection stays open (until the server stops) without a byte."""
        with self._lock:
            self._stall[filename] = [nbytes, times]

    def fail_next(self, count: int, status: int = 503, path_contains: str | None = None) -> None:
        """The next ``count`` requests (whose path contains ``path_contains``, if given) answer ``status``."""
        with self._lock:
            self._failures = [count, status, path_contains]

    def throttle(self, filename: str | None, bytes_per_second: float | None) -> None:
        """Serve ``filename`` (None: every file) at about ``bytes_per_second``; None removes the limit."""
        with self._lock:
            if bytes_per_second is None:
                self._throttle.pop(filename, None)
            else:
                self._throttle[filename] = bytes_per_second

    def throttle_link(self, bytes_per_second: float | None) -> None:
        """Cap every body response together at about ``bytes_per_second`` (the link); None removes the cap."""
        with self._lock:
            self._link = [bytes_per_second or 0.0, time.monotonic()]

    def _link_wait(self, n: int) -> float:
        """Reserve ``n`` bytes on the link: seconds to wait before they are through (0 without a cap)."""
        with self._lock:
            rate, free = self._link
            if not rate:
                return 0.0
            now = time.monotonic()
            self._link[1] = max(free, now) + n / rate
            return self._link[1] - now

    # -- counters --------------------------------------------------------------------------------------------
    def stats(self, filename: str) -> FileStats:
        """A copy of the counters of ``filename``."""
        with self._lock:
            s = self._stats.get(filename, FileStats())
            return FileStats(
                s.gets, s.heads, s.redirects, s.bytes_served, list(s.ranges), s.drops, s.corrupted, s.stalls
            )

    def reset_stats(self) -> None:
        with self._lock:
            self._stats.clear()
            self.log.clear()
            self.cdn_auth_headers = 0
            self.cdn_bodies_most = 0

    # -- internals used by the handler -----------------------------------------------------------------------
    def _stat(self, filename: str) -> FileStats:
        return self._stats.setdefault(filename, FileStats())

    def _take_failure(self, path: str) -> int | None:
        with self._lock:
            remaining, status, needle = self._failures
            if remaining > 0 and (needle is None or needle in path):
                self._failures[0] -= 1
                return status
        return None

    def _take(self, table: dict[str, list[int]], filename: str, covers=None) -> int | None:
        with self._lock:
            entry = table.get(filename)
            if entry is None or entry[1] <= 0 or (covers is not None and not covers(entry[0])):
                return None
            entry[1] -= 1
            return entry[0]

    def _sign(self, sha256: str, filename: str) -> str:
        return hmac.new(self._secret, f"{sha256}\0{filename}".encode(), "sha256").hexdigest()[:32]

    def _blob_url(self, f: RepoFile) -> str:
        return f"{self.cdn_endpoint}/blobs/{f.sha256}?filename={quote(f.name, safe='')}&sig={self._sign(f.sha256, f.name)}"


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, hub: HubServer, role: str):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub
        self.role = role


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # idle keep-alive connections end by themselves
    server: _Listener

    def log_message(self, format, *args):  # noqa: A002 - silence the default stderr log
        pass

    def do_GET(self):
        self._dispatch(head=False)

    def do_HEAD(self):
        self._dispatch(head=True)

    def do_POST(self):
        dispatch_upload(self, "POST")

    def do_PUT(self):
        dispatch_upload(self, "PUT")

    def do_DELETE(self):
        dispatch_upload(self, "DELETE")

    # -- routing ---------------------------------------------------------------------------------------------
    def _dispatch(self, head: bool) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        if self.server.role == "hub" and path == "/api/agent-harnesses":
            # Fetched once per process by huggingface_hub's user-agent code (utils/_detect_agent.py), with no
            # auth: answered with an empty registry, outside fault injection so it never eats a failure.
            return self._json({"standardEnvVars": [], "harnesses": {}}, head)
        if (status := hub._take_failure(path)) is not None:
            return self._error(status, "Injected failure")
        if self.server.role == "cdn":
            if path.startswith("/blobs/"):
                return self._blob(path[len("/blobs/") :], query, head)
            return self._error(404, "Not Found")
        if hub.token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                return self._error(401, "Invalid username or password.", code="RepoNotFound")
            if auth != f"Bearer {hub.token}":
                return self._error(401, "Invalid credentials in Authorization header")
        if path.startswith("/api/models/"):
            return self._model_info(path[len("/api/models/") :], query, head)
        if m := _RESOLVE.match(path):
            return self._resolve(unquote(m["repo"]), unquote(m["rev"]), unquote(m["file"]), head)
        return self._error(404, "Not Found")

    def _model_info(self, rest: str, query: dict, head: bool) -> None:
        repo_id, _, rev = rest.partition("/revision/")
        repo_id, rev = unquote(repo_id), unquote(rev) or "main"
        found = self._find(repo_id, rev)
        if found is None:
            return
        commit, files = found
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for f in files.values():
            entry: dict = {"rfilename": f.name}
            if blobs:
                entry.update(size=f.size, blobId=f.blob_id)
                if f.lfs:
                    entry["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(entry)
        body = {
            "_id": commit[:24],
            "id": repo_id,
            "modelId": repo_id,
            "sha": commit,
            "private": self.server.hub.token is not None,
            "gated": False,
            "disabled": False,
            "tags": [],
            "downloads": 0,
            "likes": 0,
            "lastModified": "2025-01-01T00:00:00.000Z",
            "siblings": siblings,
        }
        self._json(body, head)

    def _resolve(self, repo_id: str, rev: str, filename: str, head: bool) -> None:
        found = self._find(repo_id, rev)
        if found is None:
            return
        commit, files = found
        f = files.get(filename)
        if f is None:
            return self._error(404, "Entry not found", code="EntryNotFound", extra={"X-Repo-Commit": commit})
        hub = self.server.hub
        if f.lfs:
            with hub._lock:
                hub._stat(f.name).redirects += 1
            self._send(
                302,
                {
                    "Location": hub._blob_url(f),
                    "X-Repo-Commit": commit,
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(f.size),
                    "ETag": f'"{f.blob_id}"',
                    "Content-Length": "0",
                },
            )
            return None
        self._body(f, head, {"ETag": f'"{f.blob_id}"', "X-Repo-Commit": commit})
        return None

    def _blob(self, sha256: str, query: dict, head: bool) -> None:
        hub = self.server.hub
        filename = query.get("filename", [""])[0]
        sig = query.get("sig", [""])[0]
        f = hub._blobs.get(sha256)
        if f is None or not hmac.compare_digest(sig, hub._sign(sha256, filename)):
            return self._error(403, "Request signature does not match")
        if self.headers.get("Authorization") is not None:
            with hub._lock:
                hub.cdn_auth_headers += 1
        headers = {
            "ETag": f'"{sha256}"',
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename)}",
        }
        self._body(f, head, headers, name=filename or f.name)
        return None

    def _find(self, repo_id: str, rev: str) -> tuple[str, dict[str, RepoFile]] | None:
        """(commit, files) of a repo revision, or None after answering the error."""
        repo = self.server.hub._repos.get(repo_id)
        if repo is None:
            self._error(404, "Repository not found", code="RepoNotFound")
            return None
        commit = repo.refs.get(rev, rev)
        files = repo.commits.get(commit)
        if files is None:
            self._error(404, f"Invalid rev id: {rev}", code="RevisionNotFound")
            return None
        return commit, files

    # -- bodies ----------------------------------------------------------------------------------------------
    def _body(self, f: RepoFile, head: bool, headers: dict[str, str], name: str | None = None) -> None:
        hub = self.server.hub
        name = name or f.name
        size = f.size
        start, end, status = 0, size, 200
        requested = None if hub.ignore_range else self.headers.get("Range")
        if requested is not None:
            rng = _parse_range(requested, size)
            if rng == "unsatisfiable":
                return self._error(416, "Range Not Satisfiable", extra={"Content-Range": f"bytes */{size}"})
            if rng is not None:
                (start, end), status = rng, 206
        headers = {
            **headers,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Length": str(end - start),
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self._send(status, headers)
        with hub._lock:
            stat = hub._stat(name)
            if head:
                stat.heads += 1
                return None
            stat.gets += 1
            stat.ranges.append((start, end))
        cdn = self.server.role == "cdn"
        with hub._lock:
            hub._cdn_bodies += cdn
            hub.cdn_bodies_most = max(hub.cdn_bodies_most, hub._cdn_bodies)
        try:
            return self._send_body(f, name, start, end)
        finally:
            with hub._lock:
                hub._cdn_bodies -= cdn

    def _send_body(self, f: RepoFile, name: str, start: int, end: int) -> None:
        hub = self.server.hub
        drop_at = hub._take(hub._drops, name)
        flip_at = hub._take(hub._corrupt, name, covers=lambda off: start <= off < end)
        stall_at = hub._take(hub._stall, name)
        rate = hub._throttle.get(name, hub._throttle.get(None))
        sent, began = 0, time.monotonic()
        piece = int(min(SLICE, max(CHUNK, rate / 100))) if rate else SLICE
        try:
            with open(f.path, "rb") as fh:
                while sent < end - start:
                    n = min(piece, end - start - sent)
                    if drop_at is not None:
                        n = min(n, drop_at - sent)
                        if n <= 0:
                            with hub._lock:
                                hub._stat(name).drops += 1
                            self._drop_connection()
                            return None
                    if stall_at is not None and (n := min(n, stall_at - sent)) <= 0:
                        return self._stall_connection(name)
                    if flip_at is not None and start + sent <= flip_at < start + sent + n:
                        data = bytearray(os.pread(fh.fileno(), n, start + sent))
                        data[flip_at - start - sent] ^= 0xFF
                        with hub._lock:
                            hub._stat(name).corrupted += 1
                        self.wfile.write(data)
                    elif not (n := self.connection.sendfile(fh, start + sent, n)):  # the file was cut meanwhile
                        self._drop_connection()
                        return None
                    sent += n
                    with hub._lock:
                        hub._stat(name).bytes_served += n
                    if sent == end - start:  # the body is out: no pause after it (the connection is free)
                        hub._link_wait(n)  # its bytes took the link all the same
                        break
                    if rate and (ahead := began + sent / rate - time.monotonic()) > 0:
                        time.sleep(ahead)  # paced to the rate, whatever the writes took
                    if (link := hub._link_wait(n)) > 0:
                        time.sleep(link)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        return None

    def _stall_connection(self, name: str) -> None:
        hub = self.server.hub
        with hub._lock:
            hub._stat(name).stalls += 1
        self.wfile.flush()
        hub._stopping.wait(600)  # a stalled peer: the client must give up on its own
        self._drop_connection()

    def _drop_connection(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- helpers ---------------------------------------------------------------------------------------------
    def _json(self, body: dict, head: bool) -> None:
        data = json.dumps(body).encode()
        self._send(200, {"Content-Type": "application/json; charset=utf-8", "Content-Length": str(len(data))})
        if not head:
            self.wfile.write(data)

    def _send(self, status: int, headers: dict[str, str]) -> None:
        self.server.hub.log.append((self.command, self.path, status))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def _error(self, status: int, message: str, code: str | None = None, extra: dict | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        headers = {
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
            "X-Error-Message": message,
        }
        if code is not None:
            headers["X-Error-Code"] = code
        headers.update(extra or {})
        self._send(status, headers)
        if self.command != "HEAD":
            self.wfile.write(data)


def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """A single byte range as [start, end); None to ignore the header; "unsatisfiable" for 416."""
    m = _RANGE.match(header.strip())
    if m is None or (not m[1] and not m[2]):
        return None
    if not m[1]:  # suffix: the last n bytes
        n = int(m[2])
        return (max(size - n, 0), size) if n > 0 and size > 0 else "unsatisfiable"
    first = int(m[1])
    last = int(m[2]) if m[2] else size - 1
    if last < first:
        return None
    if first >= size:
        return "unsatisfiable"
    return first, min(last, size - 1) + 1


def write_hf_cache(
    cache_dir: str | os.PathLike,
    repo_id: str,
    folder: str | os.PathLike,
    *,
    commit: str = "c0ffee" * 6 + "c0ff",
    ref: str = "main",
) -> Path:
    """Lay ``folder`` out in ``cache_dir`` as huggingface_hub's cache holds a snapshot of ``repo_id``, by hand:
    ``models--<org>--<name>/refs/<ref>`` holding ``commit``, ``blobs/<name>`` (an LFS file's named by its
    sha256, any other file's by its git blob sha1, as the Hub's ETags name them), and
    ``snapshots/<commit>/<file>`` relative symlinks to the blobs. Returns the repo's folder in the cache."""
    base = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    snapshot = base / "snapshots" / commit
    for sub in (base / "blobs", base / "refs", snapshot):
        sub.mkdir(parents=True, exist_ok=True)
    (base / "refs" / ref).write_text(commit)
    for f in _scan(Path(folder)).values():
        blob = base / "blobs" / (f.sha256 if f.lfs else f.blob_id)
        blob.write_bytes(f.path.read_bytes())
        link = snapshot.joinpath(*f.name.split("/"))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return base


def _scan(folder: Path) -> dict[str, RepoFile]:
    files: dict[str, RepoFile] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if any(part.startswith(".") for part in name.split("/")):
            continue
        sha256, sha1 = hashlib.sha256(), hashlib.sha1()
        size = path.stat().st_size
        sha1.update(f"blob {size}\0".encode())
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                sha256.update(block)
                sha1.update(block)
        files[name] = RepoFile(
            name, path, size, sha256.hexdigest(), sha1.hexdigest(), name.endswith(LFS_SUFFIXES)
        )
    return files
