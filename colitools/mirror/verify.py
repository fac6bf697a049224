"""``mirror verify``: is a mirror ready, file by file (docs/CLI.md "mirror" (verify)).

Receipt mode (the mirror has ``.colibri-mirror.json``): the receipt's schema and file names are checked first
(a bare ``*.safetensors`` name: no path separators, no ``..``, no duplicates; entries failing this are never
opened), then the size and sha256 of every mirror file, and with a model directory the primary copies too;
then every other file of the mirror the engine would read (named as a primary shard, with its size and header
bytes: a leftover of an earlier, larger stage), whose sha256 must be the primary's (``in_receipt`` False).
Full-mirror mode (no receipt, a model given): every primary shard must be in the mirror with the same size, a
parseable identical header and the same sha256.

Per file it also reports the engine's own acceptance test: a mirror file is used only if its size and its
safetensors header bytes equal the primary's (``engine_accepts``; None when no primary copy is at hand).
"""

from __future__ import annotations

import os
import re
import stat
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from colitools.formats.container import shard_name_problem
from colitools.formats.errors import FormatError, MirrorError, SafetensorsError
from colitools.formats.filenames import shard_files
from colitools.formats.jsonfile import load_json_object, parse_json_object
from colitools.formats.safetensors_io import MAX_HEADER_BYTES, SafetensorsFile
from colitools.mirror.fileops import Progress, sha256_file
from colitools.mirror.plan import SCHEMA

__all__ = [
    "RECEIPT",
    "FileCheck",
    "MirrorVerification",
    "StatSignature",
    "safe_shard_name",
    "stat_signature",
    "verify_mirror",
]

RECEIPT = ".colibri-mirror.json"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

StatSignature = tuple[int, int, int, int, int]  # dev, inode, size, mtime_ns, ctime_ns


def stat_signature(path: Path) -> StatSignature | None:
    """Identity of a file's current content as far as the filesystem tells (None if it is not a file)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def safe_shard_name(name: object) -> bool:
    """A receipt entry may only name a plain ``*.safetensors`` file inside the mirror directory (the shard-name
    rule of docs/FORMATS.md §8 ("Model directories"), shared with index validation)."""
    return shard_name_problem(name) is None


@dataclass
class FileCheck:
    """The verdict on one mirror file."""

    name: str
    expected_size: int | None = None
    size: int | None = None
    sha256: str | None = None
    problems: list[str] = field(default_factory=list)
    engine_accepts: bool | None = None
    primary: str | None = None
    in_receipt: bool | None = None  # receipt mode: False for a file the engine reads that the receipt omits

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "ok": self.ok,
            "expected_size": self.expected_size,
            "size": self.size,
            "sha256": self.sha256,
            "engine_accepts": self.engine_accepts,
            "primary": self.primary,
            "in_receipt": self.in_receipt,
            "problems": list(self.problems),
        }


@dataclass
class MirrorVerification:
    """Result of ``verify_mirror``: ``ready`` when the receipt (or full mirror) checks out completely."""

    mode: str  # "receipt", "full" or "none"
    mirror_root: Path
    model_root: Path | None
    files: list[FileCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # not tied to one file (receipt, missing receipt)

    @property
    def ready(self) -> bool:
        return not self.problems and bool(self.files) and all(f.ok for f in self.files)

    @property
    def failures(self) -> list[str]:
        return list(self.problems) + [f"{f.name}: {p}" for f in self.files for p in f.problems]

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "ready": self.ready,
            "mode": self.mode,
            "mirror_root": str(self.mirror_root),
            "model_root": str(self.model_root) if self.model_root else None,
            "file_count": len(self.files),
            "mirrored_bytes": sum(f.size or 0 for f in self.files if f.ok),
            "engine_accepts_all": all(f.engine_accepts for f in self.files) if self.files else False,
            "problems": list(self.problems),
            "failures": self.failures,
            "files": [f.to_json() for f in self.files],
        }


def read_raw_header(path: Path) -> bytes | None:
    """The first ``8 + N`` bytes of a safetensors file as the engine compares them (None if impossible)."""
    try:
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                return None
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES:
                return None
            body = f.read(n)
            return prefix + body if len(body) == n else None
    except OSError:
        return None


class _Hasher:
    """sha256 of files, reusing digests the caller already computed for an unchanged stat signature."""

    def __init__(self, trusted: Mapping[str, tuple[StatSignature, str]] | None, progress: Progress | None):
        self.trusted = trusted or {}
        self.progress = progress

    def __call__(self, path: Path, *, from_device: bool = False) -> str:
        known = self.trusted.get(str(path))
        if known is not None and known[0] == stat_signature(path):
            if self.progress is not None:
                self.progress(known[0][2])
            return known[1]
        return sha256_file(path, progress=self.progress, from_device=from_device)


def _find_primary(name: str, directories: Sequence[Path]) -> Path | None:
    for d in directories:
        candidate = d / name
        if candidate.is_file():
            return candidate
    return None


def _check_engine_acceptance(check: FileCheck, mirror_file: Path, primary: Path | None) -> bytes | None:
    """Set ``engine_accepts``; returns the primary's header bytes (None without a parseable primary)."""
    if primary is None:
        return None
    primary_header = read_raw_header(primary)
    mirror_sig = stat_signature(mirror_file)  # None: missing, a symlink or not a regular file
    same_size = mirror_sig is not None and mirror_sig[2] == primary.stat().st_size
    check.engine_accepts = bool(
        same_size and primary_header is not None and read_raw_header(mirror_file) == primary_header
    )
    return primary_header


def _load_receipt(path: Path, result: MirrorVerification) -> list | None:
    raw = path.read_bytes()
    try:
        receipt = parse_json_object(raw, f"receipt {path.name}")
    except FormatError as exc:
        result.problems.append(str(exc))
        return None
    if receipt.get("schema") != SCHEMA:
        result.problems.append(f"receipt schema is {receipt.get('schema')!r}, expected {SCHEMA!r}")
        return None
    files = receipt.get("files")
    if not isinstance(files, list) or not files:
        result.problems.append("receipt lists no files")
        return None
    return files


def verify_mirror(
    mirror: str | os.PathLike,
    model: str | os.PathLike | None = None,
    *,
    source_dirs: Sequence[str | os.PathLike] = (),
    progress: Progress | None = None,
    trusted_digests: Mapping[str, tuple[StatSignature, str]] | None = None,
) -> MirrorVerification:
    """Verify a mirror directory (receipt mode, or full-mirror mode when there is no receipt but a model).

    ``trusted_digests`` maps absolute paths to ``(stat_signature, sha256)`` computed moments ago by the
    caller (``stage`` passes the hashes it just verified); any file whose signature changed is hashed again.
    Raises ``MirrorError`` only when verification cannot run (no such mirror directory).
    """
    mirror_root = Path(os.path.abspath(mirror))
    model_root = Path(os.path.abspath(model)) if model is not None else None
    if not mirror_root.is_dir():
        raise MirrorError(f"mirror directory does not exist: {mirror_root}")
    if model_root is not None and not model_root.is_dir():
        raise MirrorError(f"model directory does not exist: {model_root}")
    hasher = _Hasher(trusted_digests, progress)
    primaries = [model_root] if model_root is not None else []
    primaries += [Path(os.path.abspath(d)) for d in source_dirs]

    receipt_path = mirror_root / RECEIPT
    if receipt_path.is_file():
        result = MirrorVerification("receipt", mirror_root, model_root)
        files = _load_receipt(receipt_path, result)
        if files is not None:
            receipt_model = _receipt_model_root(receipt_path)
            acceptance_dirs = primaries or ([receipt_model] if receipt_model and receipt_model.is_dir() else [])
            _verify_receipt_files(result, files, primaries, acceptance_dirs, hasher)
            _verify_unlisted(result, acceptance_dirs, hasher)
        return result
    if model_root is None:
        result = MirrorVerification("none", mirror_root, None)
        result.problems.append(f"no receipt {RECEIPT} in {mirror_root}; pass `model` for a full-mirror check")
        return result
    result = MirrorVerification("full", mirror_root, model_root)
    _verify_full(result, primaries, hasher)
    return result


def _receipt_model_root(path: Path) -> Path | None:
    try:
        value = load_json_object(path).get("model_root")
    except FormatError:
        return None
    return Path(value) if isinstance(value, str) and os.path.isabs(value) else None


def _verify_receipt_files(
    result: MirrorVerification, files: list, primaries: list[Path], acceptance_dirs: list[Path], hasher: _Hasher
) -> None:
    seen: set[str] = set()
    for index, entry in enumerate(files):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not safe_shard_name(name):
            shown = name if isinstance(name, str) else f"entry {index}"
            result.files.append(FileCheck(str(shown), problems=["refused: not a plain *.safetensors file name"]))
            continue
        check = FileCheck(name, in_receipt=True)
        result.files.append(check)
        if name in seen:
            check.problems.append("listed twice in the receipt")
            continue
        seen.add(name)
        size, digest = entry.get("size"), entry.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            check.problems.append(f"receipt size {size!r} is not a positive integer")
            continue
        if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
            check.problems.append("receipt sha256 is not 64 lowercase hex digits")
            continue
        check.expected_size = size
        path = result.mirror_root / name
        primary = _find_primary(name, acceptance_dirs)
        _check_engine_acceptance(check, path, primary)
        if not _check_mirror_file(check, path, size):
            continue
        check.sha256 = hasher(path, from_device=True)  # what the mirror drive holds, not the page cache
        if check.sha256 != digest:
            check.problems.append(f"sha256 {check.sha256} differs from the receipt's {digest}")
        if primaries:
            own = _find_primary(name, primaries)
            check.primary = str(own) if own else None
            if own is None:
                check.problems.append("primary copy not found in the model directories")
            elif own.stat().st_size != size:
                check.problems.append(f"primary copy is {own.stat().st_size} bytes, the receipt says {size}")
            elif hasher(own) != digest:
                check.problems.append("primary copy's sha256 no longer matches the receipt")
        elif primary is not None:
            check.primary = str(primary)
        if check.engine_accepts is False and not check.problems:  # e.g. the primary changed since staging
            check.problems.append("the engine would not accept it (size or header bytes differ from the primary)")


def _verify_unlisted(result: MirrorVerification, primaries: list[Path], hasher: _Hasher) -> None:
    """The mirror's files the receipt does not list that the engine would read all the same (named as a primary
    shard, with its size and header bytes): each must hold the primary's bytes (its sha256)."""
    listed = {f.name for f in result.files}
    names: dict[str, Path] = {}
    for d in primaries:
        for path in shard_files(d) if d.is_dir() else ():
            names.setdefault(path.name, path)
    for name in sorted(set(names) - listed):
        path = result.mirror_root / name
        if stat_signature(path) is None:  # absent, a symlink or not a regular file: the engine skips it
            continue
        check = FileCheck(name, in_receipt=False, primary=str(names[name]))
        _check_engine_acceptance(check, path, names[name])
        if not check.engine_accepts:
            continue  # the engine reads the primary
        result.files.append(check)
        check.expected_size = check.size = names[name].stat().st_size
        check.sha256 = hasher(path, from_device=True)
        if check.sha256 != hasher(names[name]):
            check.problems.append(
                "not in the receipt, yet the engine reads it (size and header as the primary's) and its sha256 "
                "differs from the primary's: remove it"
            )


def _check_mirror_file(check: FileCheck, path: Path, expected: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        check.problems.append("missing from the mirror")
        return False
    if stat.S_ISLNK(st.st_mode):
        check.problems.append("is a symlink, not a copy")
        return False
    if not stat.S_ISREG(st.st_mode):
        check.problems.append("is not a regular file")
        return False
    check.size = st.st_size
    if st.st_size != expected:
        check.problems.append(f"size {st.st_size} differs from the expected {expected}")
        return False
    return True


def _verify_full(result: MirrorVerification, primaries: list[Path], hasher: _Hasher) -> None:
    names: dict[str, Path] = {}
    for d in primaries:
        if not d.is_dir():
            raise MirrorError(f"shard directory does not exist: {d}")
        for path in shard_files(d):
            names.setdefault(path.name, path)
    if not names:
        result.problems.append(f"no *.safetensors shards in {', '.join(map(str, primaries))}")
        return
    for name in sorted(names):
        primary = names[name]
        check = FileCheck(name, expected_size=primary.stat().st_size, primary=str(primary))
        result.files.append(check)
        path = result.mirror_root / name
        primary_header = _check_engine_acceptance(check, path, primary)
        if not _check_mirror_file(check, path, check.expected_size):
            continue
        try:
            SafetensorsFile(path).close()
        except SafetensorsError as exc:
            check.problems.append(f"header does not parse: {exc}")
        if primary_header is not None and read_raw_header(path) != primary_header:
            check.problems.append("header bytes differ from the primary's")
        check.sha256 = hasher(path, from_device=True)
        if check.sha256 != hasher(primary):
            check.problems.append("sha256 differs from the primary's")
