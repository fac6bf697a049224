"""Resumable, verified HTTP downloads of source shards.

``download_file`` fetches one file into ``<dest>.part`` with HTTP Range requests, so an interrupted download
(dropped connection, 5xx, even a SIGKILL of the whole process) continues where it stopped instead of starting
over. The finished part is checked against the expected size and sha256 before it is published under its final
name with fsync + atomic rename, so a file at ``dest`` is always complete and verified.

huggingface_hub's own ``hf_hub_download`` is not used for shards: it downloads into a process-unique temporary
file that is deleted on failure (nothing survives a restart) and does not check the sha256 of LFS files.
The HTTP client is httpx2, the one huggingface_hub itself depends on.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx2

from colitools.formats.atomic import fsync_dir
from colitools.formats.errors import ConvertError

if TYPE_CHECKING:  # download_streams imports this module
    from colitools.converters.download_streams import StreamSlots

# The lock is a flock on the ``.part`` file itself, not ``filelock``: filelock locks a lock file of its own
# (a ``.part.lock`` next to every part, to clean up after each download), and what must never have two
# writers is the part, whose descriptor we hold anyway.
try:  # advisory lock on the .part file; absent on Windows, where we simply do without
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

DEFAULT_RETRIES = 6
HASH_BLOCK = 8 << 20
# Transient answers worth another attempt; everything else >= 400 is reported at once.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# A host name that does not resolve (DNS failure) gets one retry after at most this long, not the backoff.
QUICK_RETRY_SECONDS = 0.5
CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


class Progress(Protocol):
    """What ``download_file`` needs of a progress bar (a ``tqdm`` made with ``unit="B", unit_scale=True``)."""

    def update(self, n: int | float = 1) -> Any: ...


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff between failed attempts: ``base * 2**(k-1)`` seconds, capped at ``maximum``."""

    base: float = 1.0
    maximum: float = 30.0

    def delay(self, failure: int, retry_after: float | None = None) -> float:
        wait = self.base * 2 ** max(failure - 1, 0)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, self.maximum)


def is_name_resolution_error(exc: BaseException) -> bool:
    """Whether a transport error is a failed DNS lookup (``socket.gaierror`` anywhere in its cause chain):
    not transient like a 503, so callers give it one quick retry at most and then one clear line."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, socket.gaierror):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


class _Transient(Exception):
    """One attempt failed in a way that another attempt may fix."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


def retry_delay(name: str, url: str, exc: BaseException, failures: int, retries: int, backoff: Backoff, at: int,
                size_text: str) -> float:  # fmt: skip
    """The download's retry policy (one owner, every stream): seconds to wait after ``exc``, the ``failures``-th
    consecutive attempt without progress at byte ``at``, or a ``ConvertError`` once the budget is spent. A host
    name that does not resolve gets one quick retry, then one line."""
    dns = is_name_resolution_error(exc)
    if dns and failures > min(retries, 1):
        raise ConvertError(
            f"{name}: cannot resolve the host of {_safe_url(url)} ({exc}); check the network, then run again "
            "to resume"
        ) from None
    if dns:
        wait = min(backoff.delay(1), QUICK_RETRY_SECONDS)
        log.debug("%s: %s; retrying in %.2fs", name, _describe(exc), wait)  # debug: the user sees one line
        return wait
    if failures > retries:
        raise ConvertError(
            f"{name}: download failed at byte {at} of {size_text} after {failures} attempts without progress "
            f"({_describe(exc)}); run again to resume from there"
        ) from None
    wait = backoff.delay(failures, exc.retry_after if isinstance(exc, _Transient) else None)
    log.warning("%s: %s; retrying from byte %d in %.2fs", name, _describe(exc), at, wait)
    return wait


def refused(name: str, response: httpx2.Response) -> ConvertError:
    """The error of an answer that no retry changes (401, 403, 404, ... or an unexpected status)."""
    status = response.status_code
    if status >= 400:
        return ConvertError(
            f"{name}: download refused with HTTP {status} {_reason(status)} from {_safe_url(response.url)}"
        )
    return ConvertError(f"{name}: unexpected HTTP {status} from {_safe_url(response.url)}")


def mismatch_error(name: str, digest: str, want_sha: str, size: int) -> ConvertError:
    return ConvertError(
        f"{name}: sha256 {digest} does not match the expected {want_sha} ({size} bytes), also after "
        "downloading it again from scratch"
    )


def warn_mismatch(name: str, digest: str, want_sha: str) -> None:
    log.warning("%s: sha256 mismatch (got %s, expected %s); downloading again", name, digest, want_sha)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS context of every download's client, made once per process (httpx2's default: the CA bundle and the
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` of the environment): made per client it cost ~50 ms of CPU per file."""
    return httpx2.create_ssl_context()


def download_file(
    url: str,
    dest: str | os.PathLike[str],
    expected_size: int | None,
    expected_sha256: str | None,
    headers: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    retries: int = DEFAULT_RETRIES,
    *,
    backoff: Backoff = Backoff(),
    disk_check: Callable[[int], None] | None = None,
    timeout: float = 60.0,
    streams: int = 1,
    chunk_bytes: int | None = None,
    on_last_chunk: Callable[[], None] | None = None,
    stream_slots: StreamSlots | None = None,
) -> Path:
    """Download ``url`` to ``dest``, resuming from ``<dest>.part`` and verifying size and sha256.

    * Resume: bytes already in ``<dest>.part`` (from an earlier attempt or an earlier process) are kept and the
      rest is requested with ``Range: bytes=<n>-``. A 206 must start exactly at ``n``; a server that answers
      200 (ignoring Range) restarts the part from byte 0.
    * Retries: dropped connections, timeouts and 408/429/5xx answers are retried with exponential ``backoff``.
      ``retries`` bounds the consecutive attempts that bring no new bytes; an attempt that makes progress
      resets the count. Other HTTP errors (401, 403, 404, ...) raise ``ConvertError`` at once.
    * Verification: the part is hashed as it grows (an existing part is hashed first). On a sha256 mismatch
      the part is deleted and fetched once more from scratch; a second mismatch raises ``ConvertError``.
    * Publication: fsync of the part, atomic rename to ``dest``, fsync of the folder.

    Redirects are followed (the Hub redirects LFS files to a CDN; httpx2 drops ``Authorization`` when a
    redirect leaves the origin). ``progress.update`` receives the bytes already in the part at the start, then
    every chunk received, and a negative count when bytes are discarded. ``disk_check(needed_bytes)`` is called
    before every request with the bytes still missing (the converter's free-space floor: it may wait, or raise).
    A ``.part`` is locked while in use, so two processes never append to the same one.

    ``streams`` > 1 on a file of known size over one chunk (``chunk_bytes``, default
    ``download_streams.chunk_for``; at least ``MIN_CHUNK`` bytes): that many parallel Range streams into a full-size part with a range log
    (``download_streams.py``: the same resume, retries, verification and publication). Every stream, the single
    one too, is dropped and asked again after ``download_streams.stall_seconds()`` without a byte.
    ``on_last_chunk()`` is called once the streams have asked for every chunk (a single stream never calls it);
    ``stream_slots`` bounds the streams of the downloads that share it (``download_streams.StreamSlots``).
    """
    from colitools.converters import download_streams as ds

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part_path = dest.with_name(dest.name + ".part")
    want_sha = expected_sha256.lower() if expected_sha256 else None
    request_headers = {
        k: v for k, v in (headers or {}).items() if k.lower() not in ("range", "accept-encoding")
    }
    # Ranges only make sense on the stored bytes, never on a compressed rendering of them.
    request_headers["Accept-Encoding"] = "identity"

    fetch = _Fetch(url, dest.name, request_headers, expected_size, progress, retries, backoff, disk_check)
    limits = httpx2.Timeout(timeout, connect=min(timeout, 15.0), read=ds.stall_seconds())
    client = httpx2.Client(follow_redirects=True, timeout=limits, verify=tls_context())
    chunk = chunk_bytes or ds.chunk_for(expected_size or 0, streams)
    with client:
        if ds.wants_streams(part_path, expected_size, streams, chunk_bytes or ds.MIN_CHUNK):
            job = ds.StreamJob(url, dest.name, request_headers, expected_size, progress, retries, backoff,
                               max(streams, 1), chunk, on_last_chunk, stream_slots)  # fmt: skip
            if ds.download_ranged(client, job, part_path, dest, want_sha, disk_check):
                return dest
        return _single_stream(client, fetch, part_path, dest, want_sha, progress)


def _single_stream(client: httpx2.Client, fetch: _Fetch, part_path: Path, dest: Path, want_sha: str | None,
                   progress: Progress | None) -> Path:  # fmt: skip
    """Today's download: one connection appending to the part, hashed as it grows."""
    with _PartFile(part_path) as part:
        if part.size and progress is not None:
            progress.update(part.size)
        for from_scratch in (False, True):
            fetch.fill(client, part)
            digest = part.hexdigest()
            if want_sha is None or digest == want_sha:
                part.sync()
                os.replace(part_path, dest)
                fsync_dir(dest.parent)
                return dest
            if from_scratch:
                size = part.size  # of the bytes that failed, before the part is discarded
                part.discard()
                raise mismatch_error(dest.name, digest, want_sha, size)
            warn_mismatch(dest.name, digest, want_sha)
            if progress is not None:
                progress.update(-part.size)
            part.reset()
    raise AssertionError("unreachable")  # pragma: no cover


class _Fetch:
    """The request loop of one download: fills a part file to its full size, retrying transient failures."""

    def __init__(self, url, name, headers, expected_size, progress, retries, backoff, disk_check):
        self.url = url
        self.name = name
        self.headers = headers
        self.size: int | None = expected_size  # learned from the first response when not given
        self.progress = progress
        self.retries = retries
        self.backoff = backoff
        self.disk_check = disk_check

    def fill(self, client: httpx2.Client, part: _PartFile) -> None:
        # Not huggingface_hub's ``http_backoff``: it replays one identical request and counts every failure,
        # while a resumed download asks for a new ``Range`` after each drop, keeps the bytes that arrived, and
        # counts only attempts that brought no progress (and honours Retry-After through our ``Backoff``).
        failures = 0
        while True:
            if self.size is not None and part.size > self.size:
                log.warning(
                    "%s: partial file (%d bytes) is longer than the file (%d); restarting",
                    self.name,
                    part.size,
                    self.size,
                )
                self._discard(part)
            if self.size is not None and part.size == self.size:
                return
            if self.disk_check is not None and self.size is not None:
                self.disk_check(self.size - part.size)
            before = part.size
            try:
                if self._attempt(client, part):
                    return
                raise _Transient(f"connection ended at byte {part.size} of {self.size}")
            except (httpx2.TransportError, _Transient) as exc:
                failures = 1 if part.size > before else failures + 1
                time.sleep(retry_delay(self.name, self.url, exc, failures, self.retries, self.backoff, part.size,
                                       self._size_text()))  # fmt: skip

    def _attempt(self, client: httpx2.Client, part: _PartFile) -> bool:
        """One request; appends what arrives. True when the part is complete."""
        offset = part.size
        headers = dict(self.headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        with client.stream("GET", self.url, headers=headers) as response:
            status = response.status_code
            if status in RETRY_STATUSES:
                raise _Transient(f"HTTP {status}", retry_after(response))
            if status == 416 and offset:
                # Our range starts past the end of what the server has: the part cannot be a prefix of it.
                self._discard(part)
                raise _Transient(f"HTTP 416 for a range from byte {offset}")
            if status >= 400:
                raise refused(self.name, response)
            encoded = response.headers.get("Content-Encoding", "identity").lower() not in ("identity", "")
            if status == 206:
                total = self._check_content_range(response, offset, part)
            elif status == 200:
                if offset:
                    log.warning("%s: server ignored the range request; downloading from byte 0", self.name)
                    self._discard(part)
                # The length of a compressed body says nothing about the file's.
                total = None if encoded else _int_header(response, "Content-Length")
            else:
                raise refused(self.name, response)
            if total is not None:
                if self.size is None:
                    self.size = total
                elif total != self.size:
                    raise ConvertError(
                        f"{self.name}: the server has {total} bytes, expected {self.size}; "
                        "the remote file changed or the listing is stale"
                    )
            if encoded and part.size:
                self._discard(part)
                raise _Transient("server sent an encoded body for a range request")
            # No chunk_size: httpx2 would buffer up to it and lose the buffer when the connection drops.
            chunks = response.iter_bytes() if encoded else response.iter_raw()
            for chunk in chunks:
                part.write(chunk)
                if self.progress is not None:
                    self.progress.update(len(chunk))
                if self.size is not None and part.size > self.size:
                    self._discard(part)
                    raise _Transient(f"server sent more than the {self.size} bytes expected")
        if self.size is None:
            return True  # no length announced anywhere: the end of the body is the end of the file
        return part.size == self.size

    def _check_content_range(self, response: httpx2.Response, offset: int, part: _PartFile) -> int | None:
        match = CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if match is None or int(match.group(1)) != offset:
            got = response.headers.get("Content-Range")
            self._discard(part)
            raise _Transient(f"asked for bytes from {offset}, got Content-Range {got!r}; restarting from 0")
        return None if match.group(3) == "*" else int(match.group(3))

    def _discard(self, part: _PartFile) -> None:
        if self.progress is not None and part.size:
            self.progress.update(-part.size)
        part.reset()

    def _size_text(self) -> str:
        return "unknown" if self.size is None else str(self.size)


class _PartFile:
    """The ``.part`` file: opened for appending, locked, and hashed incrementally as it grows."""

    def __init__(self, path: Path):
        self.path = path
        self._file = None
        self._sha = hashlib.sha256()
        self.size = 0

    def __enter__(self) -> _PartFile:
        self._file = open(self.path, "a+b")  # noqa: SIM115 - closed in __exit__
        if fcntl is not None:
            try:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._file.close()
                raise ConvertError(
                    f"{self.path}: already being downloaded by another process or thread"
                ) from None
        # Resume: hash what an earlier attempt (or process) left, so the final digest covers every byte.
        self._file.seek(0)
        while block := self._file.read(HASH_BLOCK):
            self._sha.update(block)
            self.size += len(block)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._sha.update(data)
        self.size += len(data)

    def reset(self) -> None:
        self._file.truncate(0)
        self._file.seek(0)
        self._sha = hashlib.sha256()
        self.size = 0

    def hexdigest(self) -> str:
        return self._sha.hexdigest()

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def discard(self) -> None:
        self.reset()
        self.path.unlink(missing_ok=True)


def retry_after(response: httpx2.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None


def _int_header(response: httpx2.Response, name: str) -> int | None:
    try:
        return int(response.headers[name])
    except (KeyError, ValueError):
        return None


def _reason(status: int) -> str:
    return httpx2.codes.get_reason_phrase(status)


def _safe_url(url: Any) -> str:
    """The URL without its query string: CDN redirects carry signatures that must not end up in logs."""
    parts = urlsplit(str(url))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, _Transient) else f"{type(exc).__name__}: {text}"


def fetch_range(
    client: httpx2.Client,
    url: str,
    start: int,
    length: int,
    headers: Mapping[str, str] | None = None,
    *,
    retries: int = DEFAULT_RETRIES,
    backoff: Backoff = Backoff(),
    name: str = "",
) -> bytes:
    """Bytes ``[start, start + length)`` of ``url`` in one ``Range`` request (the size budget's row samples of a
    Hub shard), with the download's retries (dropped connections, timeouts, ``RETRY_STATUSES``; ``backoff``); a
    server that does not answer 206 with exactly that range, or another HTTP error, is a ``ConvertError``."""
    request = {k: v for k, v in (headers or {}).items() if k.lower() not in ("range", "accept-encoding")}
    request |= {"Accept-Encoding": "identity", "Range": f"bytes={start}-{start + length - 1}"}
    failures = 0
    while True:
        try:
            response = client.get(url, headers=request)
            if response.status_code in RETRY_STATUSES:
                raise _Transient(f"HTTP {response.status_code}", retry_after(response))
            match = CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if response.status_code != 206 or match is None or int(match.group(1)) != start:
                raise ConvertError(
                    f"{name}: a range request for bytes {start}-{start + length - 1} got HTTP "
                    f"{response.status_code} {_reason(response.status_code)} from {_safe_url(response.url)}"
                )
            if len(response.content) != length:
                raise _Transient(f"{len(response.content)} of {length} bytes")
            return response.content
        except (httpx2.TransportError, _Transient) as exc:
            failures += 1
            if failures > retries:
                raise ConvertError(
                    f"{name}: a range request for bytes {start}-{start + length - 1} failed {failures} times "
                    f"({_describe(exc)})"
                ) from None
            time.sleep(backoff.delay(failures, exc.retry_after if isinstance(exc, _Transient) else None))
