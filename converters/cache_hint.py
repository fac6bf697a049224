"""A Hub that refuses the connection while the Hugging Face cache holds the whole model: say HF_HUB_OFFLINE=1.

A refused connection (nothing listens at ``HF_ENDPOINT``: a local mirror down, a proxy gone) is an answer, not a
timeout, and the backoff of a 5xx (~62 s) would only repeat it. When the cache holds a snapshot of the requested
revision with every file a conversion reads (``config.json``, and the index with every shard it names, or the one
``model.safetensors``), ``HubSource`` retries once quickly and stops with one line naming ``HF_HUB_OFFLINE=1``,
which converts from that cache (``sources.HubSource._cached_snapshot``).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

from colitools.formats.filenames import CONFIG_FILE, INDEX_FILE, SINGLE_FILE


def is_connection_refused(exc: BaseException) -> bool:
    """Whether a transport error is a refused TCP connection (``ECONNREFUSED`` anywhere in its cause chain)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def cached_snapshot(cache_dir: Path, repo_id: str, revision: str) -> Path | None:
    """The cache's snapshot folder of ``repo_id`` at ``revision`` (a branch or tag through ``refs/``, or a
    commit) when it holds every file a conversion reads, else None. Reads only that repo's folder."""
    base = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    try:
        ref = base / "refs" / revision
        commit = ref.read_text().strip() if ref.is_file() else revision
        snapshot = base / "snapshots" / commit
        if not (snapshot / CONFIG_FILE).is_file():
            return None
        index = snapshot / INDEX_FILE
        if not index.is_file():
            return snapshot if (snapshot / SINGLE_FILE).is_file() else None
        shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        return snapshot if all((snapshot / s).is_file() for s in shards) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def offline_hint(cache_dir: Path, repo_id: str, revision: str) -> str:
    """``; the Hugging Face cache holds ... set HF_HUB_OFFLINE=1`` when it does (``cached_snapshot``), else ""."""
    if cached_snapshot(cache_dir, repo_id, revision) is None:
        return ""
    return (f"; the Hugging Face cache ({cache_dir}) holds every file of {repo_id}@{revision}: set HF_HUB_OFFLINE=1 "
            "to convert from it")  # fmt: skip
