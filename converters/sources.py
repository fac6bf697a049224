"""Where a conversion reads its checkpoint from: a local folder or a Hugging Face repo at one revision.

``open_source(spec, ...)`` returns a ``Source``. The converter asks it for the file listing, the JSON files
(``config.json``, ``model.safetensors.index.json``), the ``weight_map`` (tensor -> shard, validated per
docs/FORMATS.md §8 ("Model directories")), and for shards on disk: ``ensure_local(shard)`` gives a path (downloading it if needed),
``is_deletable`` / ``release`` let the runner free the disk used by shards it downloaded, and never touch a
user's own files or the Hugging Face cache.

A Hub source is pinned to the commit its revision resolves to when it is opened, so every file of one
conversion comes from the same commit. huggingface_hub provides auth (``token`` or ``HF_TOKEN`` / the stored
login), the listing with sizes and LFS sha256 (``HfApi.model_info(files_metadata=True)``), URLs
(``hf_hub_url``) and the cache lookup (``try_to_load_from_cache``); the bytes are fetched by
``download.download_file`` (resumable, sha256-verified) into the conversion's work folder. A file taken from the
Hugging Face cache is hashed once per conversion, before its data is first used (on a background thread while
the unit before converts, ``check_ahead``), and must hash to what its blob is named by (LFS: the sha256; other
files: the git blob sha1): a damaged blob is refused offline and fetched again online, never converted.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colitools.formats.container import check_shard_name as check_container_shard_name
from colitools.formats.digest import git_blob_sha1, sha256_file
from colitools.formats.dtypes import itemsize
from colitools.formats.errors import ConvertError
from colitools.formats.filenames import INDEX_FILE, SINGLE_FILE
from colitools.formats.jsonfile import load_json_object

if TYPE_CHECKING:
    from colitools.converters.download import Backoff, Progress

# huggingface_hub, httpx2 and ``download`` (which imports httpx2) are imported where a Hub source needs them:
# together they cost ~0.15 s of every ``colitools convert`` start, and a local folder never uses them.

# The Hub's own repo id grammar (huggingface_hub.utils._validators.REPO_ID_REGEX), namespace required.
_REPO_ID = re.compile(r"^(?![-.])[\w\-.]{1,96}/(?![-.])[\w\-.]{1,96}(?<![-.])$")
_DRIVE = re.compile(r"^[A-Za-z]:")
_SHA256 = re.compile(r"[0-9a-f]{64}")  # the blob name of an LFS file in the Hugging Face cache
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")  # the blob name of any other file (its ETag: the git blob sha1)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceFile:
    """One file of a source: its name relative to the source root, size, and sha256 when the source knows it
    without reading the file (Hub LFS files). A local file also has its ``mtime_ns`` and ``ctime_ns``."""

    name: str
    size: int
    sha256: str | None = None
    mtime_ns: int | None = None
    ctime_ns: int | None = None

    @classmethod
    def from_stat(cls, name: str, st: os.stat_result) -> SourceFile:
        """A local file as ``os.stat`` sees it now."""
        return cls(name, st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)

    def identity(self) -> dict[str, Any]:
        """What a ``stat`` (or the Hub's listing) says of a source shard: the part of the resume ledger's record
        that costs no read (``source_identity.py`` adds a local file's content fingerprint and decides when a
        finished unit's shards are still the bytes it converted; docs/INTERNALS.md, "source_identity.py").

        Hub: size and LFS sha256 (the source is pinned to one commit, recorded in the manifest). Local: size,
        mtime_ns and ctime_ns, from one ``stat``. ``ctime`` is the strong part: any write, ``truncate`` or
        ``os.utime`` (putting mtime back) sets it to now, and no user-level call can set it back; a ``chmod``,
        ``chown`` or new hard link sets it too (then the fingerprint decides). Not used: the inode (a
        same-content copy or an atomic replace gets another one, a rewrite in place keeps it: it says nothing
        ``ctime`` does not)."""
        ident: dict[str, Any] = {"size": self.size}
        for key in ("sha256", "mtime_ns", "ctime_ns"):
            if getattr(self, key) is not None:
                ident[key] = getattr(self, key)
        return ident


@dataclass(frozen=True)
class HeaderTensor:
    """One entry of a shard header (what the planner needs; offsets are re-read from the shard at run time)."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = itemsize(self.dtype)
        for d in self.shape:
            n *= d
        return n


def check_shard_name(shard: str, index_name: str = INDEX_FILE, tensor: str | None = None) -> None:
    """Refuse a shard file name that could leave the source folder or is not a safetensors file (docs/FORMATS.md §8 ("Model directories")).

    The rule is ``formats.container.check_shard_name`` (its ``FormatError``), with the index as ``where``."""
    check_container_shard_name(shard, index_name, tensor)


class Source(ABC):
    """A checkpoint to convert. Subclasses: ``LocalFolderSource``, ``HubSource``."""

    #: Whether the shards come over the network (downloaded into the work folder, released after use).
    is_remote: bool = False

    def __init__(self) -> None:
        self._weight_map: dict[str, str] | None = None

    @abstractmethod
    def files(self) -> dict[str, SourceFile]:
        """Every file of the source, by name relative to its root ("/"-separated)."""

    @abstractmethod
    def ensure_local(self, name: str, progress: Progress | None = None,
                     on_last_chunk: Callable[[], None] | None = None) -> Path:  # fmt: skip
        """A path on disk holding the complete file ``name``; downloads it when it is not on disk yet
        (``on_last_chunk``: ``download_file``'s)."""

    @abstractmethod
    def local_copy(self, name: str) -> Path | None:
        """A path holding the complete file ``name`` already, or None; never downloads."""

    @abstractmethod
    def is_deletable(self, name: str) -> bool:
        """True only for a file that this source downloaded into the work folder (never a user's file)."""

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """For the manifest: ``{"kind": "local", "path"}`` or ``{"kind": "hf", "repo_id", "revision"}``."""

    @abstractmethod
    def _where(self) -> str:
        """How to name this source in messages."""

    def header(self, shard: str) -> dict[str, HeaderTensor]:
        """tensor name -> ``HeaderTensor`` of ``shard``'s header, without reading tensor data. A shard on disk
        is opened with the strict ``SafetensorsFile``; ``ConvertError`` names the shard at fault."""
        return _local_header(shard, self.ensure_local(shard))

    def release(self, name: str) -> bool:
        """Delete a downloaded file (and any partial download of it). Returns whether something was deleted;
        files that are not ``is_deletable`` are left alone."""
        return False

    def check_ahead(self, names: Iterable[str]) -> None:
        """The files ``names`` are needed next: a source that checks files before their use (the Hugging Face
        cache's) may start on them now, in the background. Nothing to do for a local folder."""
        return None

    def read_json(self, name: str) -> dict[str, Any]:
        """The JSON object in the file ``name`` (``config.json``, the index), read by the one reader of a model
        folder's JSON (``formats.jsonfile.load_json_object``: FormatError naming the file and the fault)."""
        self._require(name)
        return load_json_object(self.ensure_local(name))

    def weight_map(self) -> dict[str, str]:
        """tensor name -> shard file, from ``model.safetensors.index.json`` or a single ``model.safetensors``.

        Shard names are validated (docs/FORMATS.md §8 ("Model directories")) and every shard must exist in the source."""
        if self._weight_map is None:
            files = self.files()
            if INDEX_FILE in files:
                mapping = _weight_map_from_index(self.read_json(INDEX_FILE))
            elif SINGLE_FILE in files:
                mapping = dict.fromkeys(self.header(SINGLE_FILE), SINGLE_FILE)
            else:
                raise ConvertError(f"{self._where()}: has neither {INDEX_FILE} nor {SINGLE_FILE}")
            missing = sorted(set(mapping.values()) - files.keys())
            if missing:
                users = [t for t, s in mapping.items() if s == missing[0]]
                more = f" (and {len(missing) - 1} more shards)" if len(missing) > 1 else ""
                raise ConvertError(
                    f"{INDEX_FILE}: shard {missing[0]} ({len(users)} tensors, e.g. {users[0]!r}) "
                    f"is missing from {self._where()}{more}"
                )
            self._weight_map = mapping
        return dict(self._weight_map)

    def shards(self) -> list[str]:
        """The shard files named by the weight map, sorted."""
        return sorted(set(self.weight_map().values()))

    def _require(self, name: str) -> SourceFile:
        entry = self.files().get(name)
        if entry is None:
            raise ConvertError(f"{name}: not found in {self._where()}")
        return entry


class LocalFolderSource(Source):
    """A checkpoint folder on this machine. Files are used in place and never deleted."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root
        self._files: dict[str, SourceFile] | None = None

    def files(self) -> dict[str, SourceFile]:
        if self._files is None:
            found: dict[str, SourceFile] = {}
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for filename in sorted(filenames):
                    path = Path(dirpath, filename)
                    if filename.startswith(".") or not path.is_file():
                        continue
                    name = path.relative_to(self.root).as_posix()
                    found[name] = SourceFile.from_stat(name, path.stat())
            self._files = found
        return dict(self._files)

    def ensure_local(self, name: str, progress: Progress | None = None,
                     on_last_chunk: Callable[[], None] | None = None) -> Path:  # fmt: skip
        self._require(name)
        return self.root / name

    def local_copy(self, name: str) -> Path | None:
        return self.ensure_local(name)

    def is_deletable(self, name: str) -> bool:
        return False

    def describe(self) -> dict[str, str]:
        return {"kind": "local", "path": str(self.root)}

    def _where(self) -> str:
        return str(self.root)


class HubSource(Source):
    """A Hugging Face model repo, pinned to the commit its revision resolved to when it was opened.

    Files are taken from the Hugging Face cache when the cache has them for that commit; otherwise they are
    downloaded (resumably, sha256-checked for LFS files) into ``workdir``, and only those are deletable.
    """

    is_remote = True

    def __init__(
        self,
        repo_id: str,
        revision: str | None,
        token: str | bool | None,
        workdir: Path,
        *,
        endpoint: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        disk_check: Callable[[int], None] | None = None,
        retries: int | None = None,
        backoff: Backoff | None = None,
        download_streams: int | None = None,
    ):
        from huggingface_hub import HfApi, constants

        from colitools.converters.download import DEFAULT_RETRIES
        from colitools.converters.download import Backoff as _Backoff
        from colitools.converters.download_streams import DEFAULT_STREAMS, StreamSlots

        super().__init__()
        self.repo_id = repo_id
        self.requested_revision = revision or constants.DEFAULT_REVISION
        self.token = token
        self.workdir = workdir
        self.endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
        self.cache_dir = Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE)
        self.disk_check = disk_check
        self.retries = DEFAULT_RETRIES if retries is None else retries
        self.backoff = _Backoff() if backoff is None else backoff
        self.download_streams = DEFAULT_STREAMS if download_streams is None else download_streams
        self._stream_slots = StreamSlots(self.download_streams)  # shared by its files downloading together
        self._api = HfApi(endpoint=self.endpoint, token=token, library_name="colitools")
        self.offline = constants.is_offline_mode()
        self._blobs = _BlobChecks()  # the cache check: each blob hashed once, ahead of its use when told
        self._refetched: set[str] = set()  # files whose cached copy is damaged (online: downloaded instead)
        self._range_client = None  # the size budget's Range requests (``read_range``), made when first needed
        if self.offline:  # HF_HUB_OFFLINE: the commit and the listing come from the Hugging Face cache
            self.commit, self._files = self._cached_snapshot()
            return
        info = self._call(
            f"{repo_id}@{self.requested_revision}",
            lambda: self._api.model_info(repo_id, revision=revision, files_metadata=True, token=token),
        )
        if not info.sha or info.siblings is None:
            raise ConvertError(
                f"{repo_id}@{self.requested_revision}: the Hub answered without a commit or file list"
            )
        self.commit: str = info.sha
        self._files = {}
        for sibling in info.siblings:
            if sibling.size is None:
                raise ConvertError(
                    f"{repo_id}@{self.commit}: the Hub listed {sibling.rfilename} without a size"
                )
            sha256 = sibling.lfs.sha256 if sibling.lfs is not None else None
            self._files[sibling.rfilename] = SourceFile(sibling.rfilename, sibling.size, sha256)

    def files(self) -> dict[str, SourceFile]:
        return dict(self._files)

    def local_copy(self, name: str) -> Path | None:
        entry = self._require(name)
        cached = self._cached(entry)
        if cached is not None:
            return cached
        dest = self._download_path(name)
        return dest if self._is_verified_copy(entry, dest) else None

    def ensure_local(self, name: str, progress: Progress | None = None,
                     on_last_chunk: Callable[[], None] | None = None) -> Path:  # fmt: skip
        local = self.local_copy(name)
        if local is not None:
            return local
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        from colitools.converters.download import download_file

        entry = self._require(name)
        dest = self._download_path(name)
        download_file(
            hf_hub_url(self.repo_id, name, revision=self.commit, endpoint=self.endpoint),
            dest,
            entry.size,
            entry.sha256,
            headers=build_hf_headers(token=self.token, library_name="colitools"),
            progress=progress,
            retries=self.retries,
            backoff=self.backoff,
            disk_check=self.disk_check,
            streams=self.download_streams,
            on_last_chunk=on_last_chunk,
            stream_slots=self._stream_slots,
        )
        self._stamp_path(dest).write_text(json.dumps(self._stamp(entry)))
        return dest

    def is_deletable(self, name: str) -> bool:
        return name in self._files and _is_plain_relative(name) and self._download_path(name).is_file()

    def release(self, name: str) -> bool:
        if name not in self._files or not _is_plain_relative(name):
            return False
        dest = self._download_path(name)
        deleted = False
        part = dest.with_name(dest.name + ".part")
        for path in (dest, part, part.with_name(part.name + ".ranges"), self._stamp_path(dest)):
            if path.is_file():
                path.unlink()
                deleted = True
        return deleted

    def describe(self) -> dict[str, str]:
        return {"kind": "hf", "repo_id": self.repo_id, "revision": self.commit}

    def _where(self) -> str:
        if self.offline:
            return f"the Hugging Face cache of {self.repo_id}@{self.commit} (HF_HUB_OFFLINE is set)"
        return f"{self.repo_id}@{self.commit}"

    def _cached_snapshot(self) -> tuple[str, dict[str, SourceFile]]:
        """Offline: the commit the requested revision names in the Hugging Face cache and that snapshot's files
        (``scan_cache_dir``). Only cached files are listed, so a needed file that is not cached is reported by
        name (``_require``, ``weight_map``) and nothing is ever downloaded. An LFS file's blob is named by its
        sha256: the listing's, which its bytes must hash to when the file is used (``_check_blob``)."""
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound

        where = f"{self.repo_id}@{self.requested_revision}: HF_HUB_OFFLINE is set and the Hugging Face cache"
        try:
            cache = scan_cache_dir(self.cache_dir)
        except CacheNotFound:
            raise ConvertError(f"{where} ({self.cache_dir}) does not exist") from None
        repo = next((r for r in cache.repos if r.repo_id == self.repo_id and r.repo_type == "model"), None)
        if repo is None:
            raise ConvertError(f"{where} ({self.cache_dir}) holds nothing of {self.repo_id}") from None
        wanted = self.requested_revision
        revision = next((r for r in repo.revisions if wanted in r.refs), None) or next(
            (r for r in repo.revisions if r.commit_hash == wanted), None
        )
        if revision is None:
            have = sorted(ref for r in repo.revisions for ref in r.refs) or sorted(
                r.commit_hash[:12] for r in repo.revisions
            )
            raise ConvertError(f"{where} has no snapshot of revision {wanted!r} (cached: {', '.join(have)})")
        files = {}
        for f in revision.files:
            name = f.file_path.relative_to(revision.snapshot_path).as_posix()
            sha256 = f.blob_path.name if _SHA256.fullmatch(f.blob_path.name) else None
            files[name] = SourceFile(name, f.size_on_disk, sha256)
        return revision.commit_hash, files

    def _download_path(self, name: str) -> Path:
        if not _is_plain_relative(name):
            # The listing comes from a server: never let a file name point outside the work folder.
            raise ConvertError(f"{self._where()}: file name {name!r} is refused (not a plain relative path)")
        return self.workdir.joinpath(*name.split("/"))

    # A file in the work folder is reused only when a stamp written after its verified download says it is
    # this content (LFS: same sha256) or this file at this commit (small files, which have no sha256 listed):
    # a work folder reused for another revision may hold a different shard of exactly the same size.
    @staticmethod
    def _stamp_path(dest: Path) -> Path:
        return dest.with_name(f".{dest.name}.verified.json")

    def _stamp(self, entry: SourceFile) -> dict[str, Any]:
        if entry.sha256 is not None:
            return {"size": entry.size, "sha256": entry.sha256}
        return {"size": entry.size, "repo_id": self.repo_id, "commit": self.commit}

    def _is_verified_copy(self, entry: SourceFile, dest: Path) -> bool:
        if not dest.is_file() or dest.stat().st_size != entry.size:
            return False
        try:
            if json.loads(self._stamp_path(dest).read_text()) == self._stamp(entry):
                return True
        except (OSError, ValueError):
            pass
        if entry.sha256 is not None and sha256_file(dest) == entry.sha256:
            # Published, but the process ended before the stamp was written.
            self._stamp_path(dest).write_text(json.dumps(self._stamp(entry)))
            return True
        return False

    def _cached(self, entry: SourceFile) -> Path | None:
        """The file in the Hugging Face cache for our commit, if it is there with the listed size and its bytes
        hash to its blob's name (``_check_blob``). A damaged blob is a ConvertError offline; online it is
        passed over with a warning (the file is downloaded into the work folder, the cache is left alone)."""
        found = self._cached_unchecked(entry)
        if found is None:
            return None
        problem = self._check_blob(entry, found)
        if problem is None:
            return found
        if self.offline:
            raise ConvertError(
                f"{problem}; HF_HUB_OFFLINE is set: delete the damaged blob, or convert online to fetch the file again"
            )
        if entry.name not in self._refetched:
            self._refetched.add(entry.name)
            log.warning("%s; downloading the file again", problem)
        return None

    def _cached_unchecked(self, entry: SourceFile) -> Path | None:
        """The cache's file for our commit with the listed size, its bytes not checked (headers for planning)."""
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(
            self.repo_id, entry.name, cache_dir=self.cache_dir, revision=self.commit
        )
        if isinstance(found, str) and os.path.getsize(found) == entry.size:
            return Path(found)
        return None

    def _check_blob(self, entry: SourceFile, path: Path) -> str | None:
        """Why the cached ``path`` is not ``entry``'s bytes (None: it is), hashing each blob once per source
        (``_blob_problem``): here, unless ``check_ahead`` started it already."""
        return self._blobs.problem(entry, Path(os.path.realpath(path)))

    def check_ahead(self, names: Iterable[str]) -> None:
        """Start hashing the cached copies of ``names`` on a background thread (the runner names the shards of
        the next unit while this one converts), so the check overlaps the conversion instead of preceding it."""
        for name in names:
            entry = self._files.get(name)
            found = self._cached_unchecked(entry) if entry is not None else None
            if found is not None:
                self._blobs.start(entry, Path(os.path.realpath(found)))

    def header(self, shard: str) -> dict[str, HeaderTensor]:
        """The header from a copy on disk (the Hugging Face cache, or an intact earlier download into the work
        folder), else with two HTTP range requests (``HfApi.parse_safetensors_file_metadata``). A remote header
        is checked again, strictly, once the shard is on disk (the unit writer compares every tensor's dtype
        and shape with the plan)."""
        entry = self._require(shard)
        cached = self._cached_unchecked(entry)  # the bytes are hashed once the shard's data is needed
        if cached is not None:
            try:
                return _local_header(shard, cached)
            except ConvertError:
                if self._cached(entry) is not None:  # raises offline for a damaged blob, names it online
                    raise
        if self.is_deletable(shard):  # downloaded by an earlier run into the work folder
            # verifies the stamp / sha256; no download when the copy is intact
            return _local_header(shard, self.ensure_local(shard))
        from huggingface_hub.errors import SafetensorsParsingError

        def fetch():
            return self._api.parse_safetensors_file_metadata(
                self.repo_id, shard, revision=self.commit, token=self.token
            )

        try:
            meta = self._call(f"{shard} header", fetch)
        except SafetensorsParsingError as exc:
            raise ConvertError(f"shard {shard}: bad safetensors header: {exc}") from None
        return {
            n: HeaderTensor(str(t.dtype), tuple(int(d) for d in t.shape)) for n, t in meta.tensors.items()
        }

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` of file ``name`` at the pinned commit, in one HTTP Range request with
        the download's retries (``download.fetch_range``): the size budget's row samples (FORMATS §12)."""
        import httpx2
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        from colitools.converters.download import fetch_range

        entry = self._require(name)
        if start < 0 or length < 1 or start + length > entry.size:
            raise ConvertError(f"{name}: bytes {start}-{start + length - 1} are outside its {entry.size} bytes")
        if self._range_client is None:
            self._range_client = httpx2.Client(follow_redirects=True, timeout=httpx2.Timeout(60.0, connect=15.0))
        url = hf_hub_url(self.repo_id, name, revision=self.commit, endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token, library_name="colitools")
        return fetch_range(self._range_client, url, start, length, headers, retries=self.retries,
                           backoff=self.backoff, name=name)  # fmt: skip

    def tensor_ranges(self, shard: str) -> dict[str, tuple[int, int]]:
        """Each tensor's absolute ``(begin, end)`` in ``shard``, from its header read by two Range requests (the
        header's dtypes and shapes were checked when the source was planned, ``header``)."""
        (n,) = struct.unpack("<Q", self.read_range(shard, 0, 8))
        if n < 2 or 8 + n > self._require(shard).size:
            raise ConvertError(f"shard {shard}: header length {n} does not fit its {self._require(shard).size} bytes")
        try:
            root = json.loads(self.read_range(shard, 8, n))
            return {k: (8 + n + int(v["data_offsets"][0]), 8 + n + int(v["data_offsets"][1]))
                    for k, v in root.items() if k != "__metadata__"}  # fmt: skip
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise ConvertError(f"shard {shard}: bad safetensors header ({exc})") from None

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """A Hub API call with the download retry policy, its errors turned into one-line ``ConvertError``s."""
        import httpx2
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        from colitools.converters.cache_hint import is_connection_refused, offline_hint
        from colitools.converters.download import (
            QUICK_RETRY_SECONDS,
            RETRY_STATUSES,
            is_name_resolution_error,
        )

        # Not huggingface_hub's ``http_backoff``: that wraps one raw HTTP request, and these are HfApi calls
        # (``model_info``, ``parse_safetensors_file_metadata``: several requests and their error mapping); the
        # loop gives them the download's retry statuses, ``Backoff`` and retry count.
        failures = 0
        while True:
            try:
                return fn()
            except GatedRepoError:
                raise ConvertError(
                    f"{what}: gated repo; accept its terms on the Hub and pass a token"
                ) from None
            except RepositoryNotFoundError as exc:
                status = exc.response.status_code if exc.response is not None else "?"
                raise ConvertError(
                    f"{what}: repository not found or not accessible (HTTP {status}); for a private repo "
                    "pass `token` or set HF_TOKEN"
                ) from None
            except RevisionNotFoundError:
                raise ConvertError(f"{what}: revision {self.requested_revision!r} not found") from None
            except OfflineModeIsEnabled:
                raise ConvertError(f"{what}: HF_HUB_OFFLINE is set, the Hub cannot be reached") from None
            except HfHubHTTPError as exc:
                status = exc.response.status_code if exc.response is not None else None
                if status not in RETRY_STATUSES or failures >= self.retries:
                    hint = "; check the token" if status in (401, 403) else ""
                    raise ConvertError(f"{what}: HTTP {status} from {self.endpoint}{hint}") from None
                reason = f"HTTP {status}"
            except httpx2.TransportError as exc:
                # A name that does not resolve will not resolve in a minute either: one quick retry at most
                # (a resolver hiccup), not the 5xx backoff (~62 s before the same answer).
                unresolved = is_name_resolution_error(exc)
                # refused, with the whole model in the HF cache: one quick retry too, and the hint (cache_hint.py)
                hint = offline_hint(self.cache_dir, self.repo_id, self.requested_revision) if (
                    is_connection_refused(exc)) else ""  # fmt: skip
                if failures >= (min(self.retries, 1) if unresolved or hint else self.retries):
                    if unresolved:
                        raise ConvertError(
                            f"{what}: cannot resolve the host of {self.endpoint} ({exc}); check the network and "
                            "HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to convert from the Hugging Face cache"
                        ) from None
                    raise ConvertError(f"{what}: cannot reach {self.endpoint}: {exc}{hint}") from None
                reason = type(exc).__name__
                if unresolved or hint:
                    failures += 1
                    wait = min(self.backoff.delay(1), QUICK_RETRY_SECONDS)
                    log.debug("%s: %s; retrying in %.2fs", what, reason, wait)  # quiet: one line in the end
                    time.sleep(wait)
                    continue
            failures += 1
            wait = self.backoff.delay(failures)
            log.warning("%s: %s; retrying in %.2fs", what, reason, wait)
            time.sleep(wait)


class _BlobChecks:
    """The Hugging Face cache check of one source: blob -> the Future of its ``_blob_problem``. ``problem``
    hashes a blob not started yet in the calling thread (never queued behind the files checked ahead);
    ``start`` queues it for one daemon thread (a reader only: nothing to finish when the process ends)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checks: dict[Path, Future] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def problem(self, entry: SourceFile, blob: Path) -> str | None:
        with self._lock:
            future = self._checks.get(blob)
            if future is None:
                future = self._checks[blob] = Future()
                future.set_running_or_notify_cancel()
                inline = True
            else:
                inline = False
        if inline:
            _settle(future, entry, blob)
        return future.result()

    def start(self, entry: SourceFile, blob: Path) -> None:
        with self._lock:
            if blob in self._checks:
                return
            future = self._checks[blob] = Future()
            self._queue.put((future, entry, blob))
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="cache-check", daemon=True)
                self._worker.start()

    def _run(self) -> None:
        while True:
            future, entry, blob = self._queue.get()
            if future.set_running_or_notify_cancel():
                _settle(future, entry, blob)


def _settle(future: Future, entry: SourceFile, blob: Path) -> None:
    try:
        future.set_result(_blob_problem(entry, blob))
    except BaseException as exc:  # an unreadable blob: raised where the file is used
        future.set_exception(exc)


def _blob_problem(entry: SourceFile, blob: Path) -> str | None:
    """Why the cache's ``blob`` is not ``entry``'s bytes (None: it is). An LFS file must have the listed sha256
    (offline: the one its blob is named by); any other file the git blob sha1 its blob is named by
    (huggingface_hub names a blob by the file's ETag). A blob whose name is neither (a cache without symlinks
    holds plain copies) has nothing to be checked against."""
    if entry.sha256 is not None:
        kind, expected, actual = "sha256", entry.sha256, sha256_file(blob)
    elif _GIT_SHA1.fullmatch(blob.name):
        kind, expected, actual = "git blob sha1", blob.name, git_blob_sha1(blob)
    else:
        return None
    if actual == expected:
        return None
    return f"{entry.name}: the Hugging Face cache's copy ({blob}) is damaged: {kind} {actual}, expected {expected}"


def open_source(
    spec: str,
    revision: str | None = None,
    token: str | bool | None = None,
    *,
    workdir: str | os.PathLike[str],
    endpoint: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    disk_check: Callable[[int], None] | None = None,
    retries: int | None = None,
    backoff: Backoff | None = None,
    download_streams: int | None = None,
) -> Source:
    """Open a checkpoint: ``spec`` is an existing local folder, else a Hub repo id ``org/name``.

    A Hub source resolves ``revision`` (branch, tag or commit; default "main") to a commit at once and lists the
    repo; ``token`` defaults to ``HF_TOKEN`` / the stored login. ``workdir`` is the folder (owned by the
    conversion, not the output folder) that receives downloaded files; ``endpoint`` and ``cache_dir`` default
    to huggingface_hub's (``HF_ENDPOINT``, ``HF_HUB_CACHE``). ``disk_check(needed_bytes)`` is called before each
    download request (see ``download_file``); ``retries`` and ``backoff`` (default ``download.DEFAULT_RETRIES``
    and ``download.Backoff()``) apply to downloads and API calls; ``download_streams`` (default
    ``download_streams.DEFAULT_STREAMS``) is the Range streams per downloaded file.
    """
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConvertError(f"{spec}: a source must be a checkpoint folder or a Hub repo id, not a file")
        if revision is not None:
            raise ConvertError(f"{spec}: `revision` applies to Hugging Face repos, not to a local folder")
        return LocalFolderSource(path.resolve())
    if not _REPO_ID.match(spec) or ".." in spec or "--" in spec:
        raise ConvertError(f"{spec}: no such folder, and not a Hugging Face repo id (org/name)")
    return HubSource(
        spec,
        revision,
        token,
        Path(workdir),
        endpoint=endpoint,
        cache_dir=cache_dir,
        disk_check=disk_check,
        retries=retries,
        backoff=backoff,
        download_streams=download_streams,
    )


def _weight_map_from_index(index: Any) -> dict[str, str]:
    mapping = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(mapping, dict) or not mapping:
        raise ConvertError(f"{INDEX_FILE}: no 'weight_map' object with at least one tensor")
    named: set[str] = set()  # each shard once, with the first tensor naming it (92k tensors, 163 shards)
    for tensor, shard in mapping.items():
        if type(shard) is not str or shard not in named:
            check_shard_name(shard, INDEX_FILE, tensor)
            named.add(shard)
    return dict(mapping)


def _is_plain_relative(name: str) -> bool:
    parts = name.split("/")
    return "\\" not in name and not _DRIVE.match(name) and all(p not in ("", ".", "..") for p in parts)


def _local_header(shard: str, path: Path) -> dict[str, HeaderTensor]:
    from colitools.formats.errors import SafetensorsError
    from colitools.formats.safetensors_io import SafetensorsFile

    try:
        with SafetensorsFile(path) as f:
            return {n: HeaderTensor(t.dtype, tuple(t.shape)) for n, t in f.tensors.items()}
    except SafetensorsError as exc:
        raise ConvertError(f"shard {shard}: {exc}") from None
