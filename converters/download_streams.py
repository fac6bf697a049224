"""Parallel HTTP Range streams into one ``.part`` (``download_file(streams=N)``, ``convert --download-streams``).

A CDN limits each connection, not the link: N connections, each fetching the next missing chunk of the file with
a ``Range`` request, fill one ``.part`` of the file's full size (sparse, ``ftruncate``) with ``os.pwrite``.

* Resume and verification: the part, its range log and its sha256 are ``ranged_part.RangedPart``'s. A stream
  buffers at most ``WRITE_BYTES`` in memory, then writes and records it.
* Receive: a body's first piece through httpx2, the rest ``recv_into`` the stream's buffer from the socket
  (``direct_socket``; the connection is then not reused).
* Stall: the client's read timeout is ``stall_seconds()`` (the socket's too, read directly): a stream that delivers nothing for that long fails
  with a ``ReadTimeout`` and asks for the rest of its chunk again, under the download's retry policy.
* Fallback: a server that answers a range with 200 (or an encoded body) gets today's single stream; the part is
  cut to its done prefix first, the log removed.
* Redirect: the Hub answers a file's URL with a redirect to its CDN (a signed URL); the first chunk answered after
  it makes the file's later chunks go to the CDN's URL straight (``_Target``): one request a chunk, not two (and
  on a real network one round trip and TLS handshake less). ``Authorization`` goes there only if httpx2 kept it
  on the redirect (it drops it when the redirect leaves the origin). A refusal there (401/403/404/410: a signature expired) sends that
  chunk back through the Hub for good, and its answer after the redirect is the URL the others learn next.
* Tail: ``StreamJob.on_last_chunk`` is called once, when a stream finds no chunk left to ask for (the file's
  streams begin to end), so a caller may start the next file's streams meanwhile (``prefetch.ShardPrefetch``).
  Files downloading together share ``StreamJob.slots`` (``StreamSlots``, one per ``HubSource``): a stream holds
  a slot while it fetches, so the next file's streams start one by one as the last file's end, the connections
  stay at the stream count, and the earlier file ends as soon as alone (its units convert meanwhile).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2

from colitools.converters import download as dl
from colitools.converters.options import DEFAULT_DOWNLOAD_STREAMS
from colitools.converters.ranged_part import RangedPart, log_path
from colitools.formats.errors import ConvertError

log = logging.getLogger(__name__)

MiB = 1 << 20
DEFAULT_STREAMS = DEFAULT_DOWNLOAD_STREAMS  # convert's default, a library's too
MIN_CHUNK = 8 * MiB  # a file this small or smaller downloads in one stream
MAX_CHUNK = 64 * MiB
WRITE_BYTES = 1 * MiB  # what a stream holds in memory before it writes and records it
STALL_SECONDS = 30.0
STALL_ENV = "COLITOOLS_TEST_STALL_SECONDS"


def stall_seconds() -> float:
    """Seconds without a byte after which a stream is dropped (``COLITOOLS_TEST_STALL_SECONDS`` shortens it)."""
    return float(os.environ.get(STALL_ENV) or STALL_SECONDS)


def chunk_for(size: int, streams: int) -> int:
    """The chunk a stream asks for at a time: about a quarter of the file per stream within [MIN_CHUNK,
    MAX_CHUNK], then evened out so the chunks are a multiple of the streams (they end together: 13 chunks of
    8 MiB on 4 streams would leave one stream alone for the last quarter)."""
    streams = max(streams, 1)
    target = min(MAX_CHUNK, max(MIN_CHUNK, -(-size // (streams * 4))))
    count = -(-max(size, 1) // target)
    count = -(-count // streams) * streams
    return max(-(-size // count), 1)


def wants_streams(part: Path, size: int | None, streams: int, smallest: int) -> bool:
    """Whether a download takes the ranged path: a known size over ``smallest`` bytes and several streams, or
    a range log left by an earlier ranged run (resumed by range, whatever ``streams`` says now)."""
    if size is None or size <= 0 or not hasattr(os, "preadv"):  # no pwrite, preadv (Windows): one stream
        return False
    return log_path(part).is_file() or (streams > 1 and size > smallest)


STALE_STATUSES = (401, 403, 404, 410)  # a CDN's answer to a signed URL that expired (or was withdrawn)


class _StaleTarget(Exception):
    """The CDN refused a URL learned from an earlier redirect: the chunk asks the Hub again at once."""


class _Target:
    """Where a file's chunks are asked for (module docstring, "Redirect"): ``job.url`` until a chunk is answered
    after a redirect, then the URL that answered it, with ``job.headers`` fit for its origin."""

    def __init__(self, job: StreamJob):
        self.job = job
        self._lock = threading.Lock()
        self._learned: tuple[str, dict[str, str]] | None = None

    def now(self) -> tuple[str, dict[str, str]]:
        with self._lock:
            return self._learned or (self.job.url, self.job.headers)

    def learn(self, response: httpx2.Response) -> None:
        """Remember where ``response`` (a 206) came from, when a redirect led there."""
        if not response.history:
            return
        headers = self.job.headers
        if "Authorization" not in response.request.headers:  # httpx2 dropped it on the way (another origin)
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        with self._lock:
            self._learned = (str(response.url), headers)

    def forget(self, url: str) -> None:
        with self._lock:
            if self._learned is not None and self._learned[0] == url:
                self._learned = None


class _RangesIgnored(Exception):
    """The server answered a range request with the whole file (200) or an encoded body."""


@dataclass(frozen=True)
class StreamJob:
    """The fixed facts of one ranged download."""

    url: str
    name: str
    headers: dict[str, str]
    size: int
    progress: dl.Progress | None
    retries: int
    backoff: dl.Backoff
    streams: int
    chunk: int
    on_last_chunk: Callable[[], None] | None = None  # called once, when every chunk has been asked for
    slots: StreamSlots | None = None  # shared by the files downloading together


class StreamSlots:
    """At most ``count`` streams at once over the ranged downloads that share it (module docstring, "Tail")."""

    def __init__(self, count: int):
        self._free = max(count, 1)
        self._cond = threading.Condition()

    def take(self, stop: threading.Event) -> bool:
        """Wait for a slot; False once ``stop`` is set."""
        with self._cond:
            while not self._free:
                if stop.is_set():
                    return False
                self._cond.wait(0.25)  # ``stop`` is an Event of its own: looked at again
            self._free -= 1
            return True

    def give(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify()


def download_ranged(client: httpx2.Client, job: StreamJob, part_path: Path, dest: Path, want_sha: str | None,
                    disk_check) -> bool:  # fmt: skip
    """Fill and publish ``dest`` with ``job.streams`` streams; False when the server ignores ranges (the part
    is then today's prefix part, for the single stream). A sha256 mismatch is fetched once more from scratch
    (one warning), a second one is ``download.mismatch_error``."""
    with RangedPart(part_path, job.size, job.progress) as part:
        for from_scratch in (False, True):
            if disk_check is not None:
                disk_check(job.size - part.done_bytes())
            try:
                _run_streams(client, job, part)
            except _RangesIgnored as why:
                log.warning("%s: %s; downloading in one stream", job.name, why)
                part.to_prefix()
                return False
            digest = part.hexdigest()
            if want_sha is None or digest == want_sha:
                part.publish(dest)
                return True
            if from_scratch:
                part.discard()
                raise dl.mismatch_error(job.name, digest, want_sha, job.size)
            dl.warn_mismatch(job.name, digest, want_sha)
            part.reset()
    raise AssertionError("unreachable")  # pragma: no cover


def _run_streams(client: httpx2.Client, job: StreamJob, part: RangedPart) -> None:
    """Every missing chunk fetched by up to ``job.streams`` threads; the first error stops them all and is
    raised (what they wrote stays recorded)."""
    chunks = deque((a, min(a + job.chunk, b)) for lo, b in part.missing() for a in range(lo, b, job.chunk))
    lock, stop, errors, told = threading.Lock(), threading.Event(), [], []
    target = _Target(job)

    def last_chunk_out() -> None:  # under ``lock``: the first stream to find no chunk left tells the caller
        if not told and job.on_last_chunk is not None:
            told.append(True)
            job.on_last_chunk()

    def stream() -> None:
        if job.slots is not None and not job.slots.take(stop):
            return
        buf = bytearray(WRITE_BYTES)
        try:
            while not stop.is_set():
                with lock:
                    if not chunks:
                        return last_chunk_out()
                    a, b = chunks.popleft()
                _Chunk(job, part, a, b, stop, buf, target).fetch(client)
                part.hash_ahead()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            errors.append(exc)
            stop.set()
        finally:
            if job.slots is not None:
                job.slots.give()

    threads = [threading.Thread(target=stream, name=f"download-{i}", daemon=True)
               for i in range(min(job.streams, len(chunks)))]  # fmt: skip
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:
        if stop.is_set() or any(t.is_alive() for t in threads):  # an error, or Ctrl-C here
            stop.set()
            part.stop_writes()  # a stream still reading can write nothing more
    if errors:
        raise next((e for e in errors if isinstance(e, _RangesIgnored)), errors[0])


class _Chunk:
    """One stream's chunk ``[start, end)``: requests until it is written, under the download's retry policy. What
    arrives is gathered in the stream's ``buf`` (``WRITE_BYTES``) and written out each time it is full."""

    def __init__(self, job: StreamJob, part: RangedPart, start: int, end: int, stop: threading.Event,
                 buf: bytearray, target: _Target):  # fmt: skip
        self.job, self.part, self.end, self.stop = job, part, end, stop
        self.target = target
        self.via_hub = False  # once the learned URL was refused, this chunk asks the Hub (no loop between them)
        self.pos = start
        self.buf = memoryview(buf)
        self.filled = 0  # bytes of ``buf`` received, not yet written (they start at ``pos``)

    def fetch(self, client: httpx2.Client) -> None:
        failures = 0
        while self.pos < self.end and not self.stop.is_set():
            before = self.pos
            try:
                self._attempt(client)
                if self.pos < self.end and not self.stop.is_set():
                    raise dl._Transient(f"connection ended at byte {self.pos} (range to {self.end})")
            except _StaleTarget:
                continue
            except (httpx2.TransportError, dl._Transient) as exc:
                failures = 1 if self.pos > before else failures + 1
                job = self.job
                time.sleep(dl.retry_delay(job.name, job.url, exc, failures, job.retries, job.backoff, self.pos,
                                          str(job.size)))  # fmt: skip

    def _attempt(self, client: httpx2.Client) -> None:
        url, headers = (self.job.url, self.job.headers) if self.via_hub else self.target.now()
        headers = {**headers, "Range": f"bytes={self.pos}-{self.end - 1}"}
        with client.stream("GET", url, headers=headers) as response:
            status = response.status_code
            if url != self.job.url and status in STALE_STATUSES:
                self.target.forget(url)
                self.via_hub = True
                raise _StaleTarget
            if status in dl.RETRY_STATUSES:
                raise dl._Transient(f"HTTP {status}", dl.retry_after(response))
            if status == 200:
                raise _RangesIgnored("server ignored the range request")
            if status != 206:
                raise dl.refused(self.job.name, response)
            if response.headers.get("Content-Encoding", "identity").lower() not in ("identity", ""):
                raise _RangesIgnored("server sent an encoded body for a range request")
            self._check_content_range(response)
            self.target.learn(response)
            try:
                self._receive(response)
            finally:
                self._flush()  # what arrived before a drop or a stall is kept

    def _receive(self, response: httpx2.Response) -> None:
        """The body into ``buf``. The first piece comes through httpx2 (with it, whatever httpx2 read beyond the
        headers); the rest, when the connection is a socket of its own (``direct_socket``), with ``recv_into``
        straight into ``buf``: httpx2 hands a body over in 64 KiB ``bytes`` after five copies in Python (~2.3
        CPU-s per GB here, bench/README.md). The connection is then closed with the response, not reused: httpx2
        did not see the body end."""
        sock = direct_socket(response)
        left = int(response.headers.get("Content-Length", 0))
        for data in response.iter_raw():
            self._take(data)
            left -= len(data)
            if self.stop.is_set():
                return
            if sock is not None:
                return self._recv_into(sock, min(left, self.end - self.pos - self.filled))
        return None

    def _take(self, data: bytes) -> None:
        if self.pos + self.filled + len(data) > self.end:
            self.filled = 0
            raise dl._Transient(f"server sent more than the range {self.pos}-{self.end - 1}")
        view = memoryview(data)
        while view:
            n = min(len(view), len(self.buf) - self.filled)
            self.buf[self.filled : self.filled + n] = view[:n]
            self.filled += n
            view = view[n:]
            if self.filled == len(self.buf):
                self._flush()

    def _recv_into(self, sock: socket.socket, left: int) -> None:
        """``left`` more body bytes from ``sock`` into ``buf``; a read timeout or error is httpx2's (retried)."""
        stall = stall_seconds()
        try:
            sock.settimeout(stall)
            while left > 0 and not self.stop.is_set():
                n = sock.recv_into(self.buf[self.filled : self.filled + left])
                if not n:
                    return  # the connection ended: ``fetch`` asks for the rest
                self.filled += n
                left -= n
                if self.filled == len(self.buf):
                    self._flush()
        except TimeoutError:
            raise httpx2.ReadTimeout(f"no byte for {stall:g} s") from None
        except OSError as exc:
            raise httpx2.ReadError(str(exc)) from None

    def _flush(self) -> None:
        if self.filled and self.part.write(self.pos, self.buf[: self.filled]):
            self.pos += self.filled
        self.filled = 0

    def _check_content_range(self, response: httpx2.Response) -> None:
        match = dl.CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if match is None or int(match.group(1)) != self.pos:
            got = response.headers.get("Content-Range")
            raise dl._Transient(f"asked for bytes from {self.pos}, got Content-Range {got!r}")
        if int(match.group(2)) >= self.end:
            raise dl._Transient(f"server sent more than the range {self.pos}-{self.end - 1}: {match.group(0)!r}")
        if match.group(3) != "*" and int(match.group(3)) != self.job.size:
            raise ConvertError(
                f"{self.job.name}: the server has {match.group(3)} bytes, expected {self.job.size}; "
                "the remote file changed or the listing is stale"
            )


def direct_socket(response: httpx2.Response) -> socket.socket | None:
    """The socket an HTTP/1.1 response with a ``Content-Length`` body arrives on, when reading it is reading the
    body: plain TCP, or TLS by the socket itself (a TLS connection inside a proxy's TLS is not; nor is a body
    decoded or in chunks). httpx2 gives it out as its ``network_stream`` extension."""
    stream = response.extensions.get("network_stream")
    if stream is None or response.extensions.get("http_version") != b"HTTP/1.1":
        return None
    if "Transfer-Encoding" in response.headers or not response.headers.get("Content-Length", "").isdigit():
        return None
    sock, tls = stream.get_extra_info("socket"), stream.get_extra_info("ssl_object")
    if not isinstance(sock, socket.socket) or isinstance(tls, ssl.SSLObject):
        return None
    return sock if isinstance(sock, ssl.SSLSocket) or tls is None else None
