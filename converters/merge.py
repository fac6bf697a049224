"""``colitools merge PART_DIR... OUT``: the folders of ``convert --part 1/N .. N/N`` put together into the output
one machine writes, byte for byte (docs/INTERNALS.md, "Parts"; the share and the ``part`` section: ``parts.py``).

1. Read every part's ``colitools.json`` and refuse, in one line naming the folder and what differs, a folder that
   is not a finished part, a part of another recipe, source (repo and commit, a local path), plan, N or tool
   version, a source shard read with another identity by two parts, a part given twice, a part missing, files
   beside the shards that differ between parts.
2. Take every recorded file (each unit's files from its part, the other files from the first part) into a
   staging folder beside ``OUT`` (``.<OUT name>.merging``), checking its size and sha256 against its part's
   manifest: by a rename when the part and ``OUT`` are on one filesystem (every file is hashed first, then all
   are renamed: a bad file stops the merge before any moved), else by a copy hashed as it is written (the part
   keeps its files).
3. Write ``colitools.json`` (one machine's: the parts' units in plan order, ``state: complete``, ``shards``,
   ``run`` summed over the parts) and the planar sidecar's ``index.json``, then rename the staging folder to
   ``OUT``: ``OUT`` appears whole or not at all.

A clean stop (an error, Ctrl-C) during the renames moves the files back to their parts; after a SIGKILL they wait
in the staging folder, where a rerun of the same merge takes them (hashed again). Each part folder's lock is held
meanwhile (no ``convert`` works in it), and ``OUT``'s own (``.<OUT name>.merge.lock``).

Test-only knob: ``COLITOOLS_TEST_KILL_AT=moved:N`` (``copied:N``) SIGKILLs the process right after its N-th file
was renamed (copied) into the staging folder.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colitools.converters import parts
from colitools.converters.diskfloor import free_bytes
from colitools.converters.manifest import Manifest, ManifestError
from colitools.converters.source_identity import FINGERPRINT
from colitools.formats import planar_sidecar as sidecar
from colitools.formats.atomic import fsync_dir, parse_temp_name, temp_name, write_bytes_atomic
from colitools.formats.errors import ConvertError
from colitools.formats.filenames import LOCK_FILE, MANIFEST_FILE
from colitools.formats.lockfile import held_lock

KILL_AT_ENV = (
    "COLITOOLS_TEST_KILL_AT"  # the unit writer's knob (its "published:N"), here "moved:N" / "copied:N"
)

# what every part must share with the first: one machine's manifest keys besides units, state and the run figures
_SHARED = ("format", "tool", "recipe_fingerprint", "recipe", "source", "source_config", "source_quantization_config",
           "plan", "fallbacks", "formats_per_role", "dropped_towers", "budget", "copied_files", "format_totals",
           "experts_choice")  # fmt: skip


@dataclass
class PartFolder:
    """One part's folder as its manifest records it."""

    folder: Path
    data: dict[str, Any]

    @property
    def section(self) -> dict[str, Any]:
        return self.data[parts.PART_KEY]

    @property
    def label(self) -> str:
        return f"{self.section.get('index')}/{self.section.get('count')}"


@dataclass
class MergeReport:
    """What ``merge`` did; ``to_json`` is ``--json``'s object."""

    out: str
    parts: list[dict[str, Any]] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    moved: int = 0  # files renamed (a part on OUT's filesystem)
    copied: int = 0  # files copied (a part on another filesystem)
    wall_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "out": self.out, "parts": self.parts, "files": self.files, "bytes": self.bytes,
                "how": self.how, "moved": self.moved, "copied": self.copied,
                "wall_seconds": round(self.wall_seconds, 3)}  # fmt: skip

    @property
    def how(self) -> str:
        """``moved``, ``copied``, or ``moved and copied`` (parts on OUT's filesystem and on others)."""
        return " and ".join(w for w, n in (("moved", self.moved), ("copied", self.copied)) if n) or "moved"

    def text(self) -> list[str]:
        how = self.how
        lines = [f"merged {len(self.parts)} parts into {self.out}: {self.files} files, {self.bytes} bytes "
                 f"{how} and checked against their sha256"]  # fmt: skip
        lines += [
            f"  part {p['part']}: {p['folder']} ({p['units']} units, {p['files']} files)" for p in self.parts
        ]
        return lines


def merge(part_dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
          progress: bool | None = None) -> MergeReport:  # fmt: skip
    """Merge the part folders into ``out`` (module docstring). ConvertError (one line) for anything refused;
    nothing is published under ``out`` unless the whole merge succeeds."""
    started = time.monotonic()
    if not part_dirs:
        raise ConvertError("no part folder given: `colitools merge PART_DIR... OUT`")
    out = Path(out).expanduser().resolve()
    folders = [Path(p).expanduser().resolve() for p in part_dirs]
    _check_out(out, folders)
    staging = out.parent / f".{out.name}.merging"
    with contextlib.ExitStack() as stack:
        stack.enter_context(held_lock(out.parent / f".{out.name}.merge.lock",
                                      lambda: ConvertError(f"{out}: another colitools merge is writing it")))  # fmt: skip
        for folder in dict.fromkeys(folders):  # each folder once (one given twice is refused below)
            _lock_part(stack, folder)
        found = sorted((_read_part(f) for f in folders), key=lambda p: p.section["index"])
        _check_parts(found)
        plan = _owners(found)
        staging.mkdir(exist_ok=True)
        local = {name: v for name, v in plan.items() if _same_filesystem(v[0].folder, staging)}
        remote = {name: v for name, v in plan.items() if name not in local}
        total = sum(digest["size"] for _, digest in plan.values())
        try:
            _check_staging(staging, plan)
            _check_room(staging, remote)
            with _bar(progress, total) as bar:
                _copy_all(remote, staging, bar)  # first: a refused copy has moved nothing yet
                _move_all(local, staging, bar)
            _write_manifest(found, staging)
        except BaseException:
            _remove_empty(staging)  # a staging folder holding files waits for the rerun
            raise
        fsync_dir(staging)
        os.replace(staging, out)  # OUT is absent or an empty folder (``_check_out``)
        fsync_dir(out.parent)
    report = MergeReport(str(out), files=len(plan), bytes=total, moved=len(local), copied=len(remote))
    for p in found:
        units = p.section.get("units") or []
        files = sum(1 for owner, _ in plan.values() if owner is p)
        report.parts.append({"part": p.label, "folder": str(p.folder), "units": len(units), "files": files})
    report.wall_seconds = time.monotonic() - started
    return report


def _lock_part(stack: contextlib.ExitStack, folder: Path) -> None:
    """Hold ``folder``'s convert lock (no ``convert`` works in it meanwhile). A folder we cannot write to (a
    read-only mount, whose files are then copied) cannot hold the lock, nor a conversion: it goes unlocked."""
    if not folder.is_dir():
        return  # refused by _read_part, in its words
    busy = lambda: ConvertError(  # noqa: E731
        f"{folder}: a colitools convert is working in this folder; merge it once it has finished"
    )
    try:
        stack.enter_context(held_lock(folder / LOCK_FILE, busy))
    except PermissionError:
        pass
    except OSError as exc:
        if exc.errno != errno.EROFS:
            raise


def _check_out(out: Path, folders: list[Path]) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertError(f"{out}: exists and is not an empty folder; merge into a new folder")
    for folder in folders:
        if folder == out or out in folder.parents or folder in out.parents:
            raise ConvertError(f"{out}: the merged folder is, holds or is inside the part folder {folder}; "
                               "merge into a folder beside the parts")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)


def _read_part(folder: Path) -> PartFolder:
    """A part's folder and manifest; ConvertError when it is not a finished part."""
    path = folder / MANIFEST_FILE
    if not folder.is_dir():
        raise ConvertError(f"{folder}: no such folder (the output folder of one part)")
    try:
        data = Manifest.load(path).data
    except FileNotFoundError:
        raise ConvertError(f"{folder}: no {MANIFEST_FILE}; not the output folder of a part") from None
    except (OSError, ManifestError) as exc:
        raise ConvertError(f"{path}: unreadable ({exc})") from None
    section = parts.recorded_part(data)
    if section is None:
        raise ConvertError(f"{folder}: a whole conversion, not a part (no `part` in its {MANIFEST_FILE})")
    if not all(type(section.get(k)) is int for k in ("index", "count")) or not isinstance(
        section.get("units"), list
    ):
        raise ConvertError(f"{path}: its `part` section is not {{index, count, units}}")
    part = PartFolder(folder, data)
    done = [u for u in section["units"] if u in (data.get("units") or {})]
    if not section.get("complete") or len(done) != len(section["units"]):
        raise ConvertError(f"{folder}: part {part.label} is not finished ({len(done)} of its {len(section['units'])} "
                           f"units done); rerun its conversion (the same command) to finish it")  # fmt: skip
    return part


def _check_parts(found: list[PartFolder]) -> None:
    """Refuse parts that do not make one conversion together (module docstring, item 1)."""
    first = found[0]
    count = first.section["count"]
    for p in found[1:]:
        if p.section["count"] != count:
            raise ConvertError(f"{p.folder}: part {p.label} of another split than {first.folder} (part {first.label}): "
                               "every part needs the same N")  # fmt: skip
        for key in _SHARED:
            if _shared(p.data, key) != _shared(first.data, key):
                raise ConvertError(f"{p.folder}: part {p.label} {_what_differs(key, first.data, p.data)} than "
                                   f"{first.folder} (part {first.label}); convert every part alike")  # fmt: skip
        if p.section.get("files") != first.section.get("files"):
            raise ConvertError(f"{p.folder}: part {p.label}'s files beside the shards (index, config, copied files) "
                               f"differ from {first.folder}'s; convert every part alike")  # fmt: skip
    seen: dict[int, Path] = {}
    for p in found:
        if p.section["index"] in seen:
            again = (
                "given twice" if seen[p.section["index"]] == p.folder else f"also {seen[p.section['index']]}"
            )
            raise ConvertError(f"{p.folder}: part {p.label} again ({again})")
        seen[p.section["index"]] = p.folder
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in seen]
    if missing:
        raise ConvertError(f"part {', '.join(missing)} missing: merge needs all {count} part folders "
                           f"(given: {', '.join(p.label for p in found)})")  # fmt: skip
    _check_units(found)
    _check_identities(found)


def _check_units(found: list[PartFolder]) -> None:
    planned = list((found[0].data.get("plan") or {}).get("units") or [])
    owner: dict[str, PartFolder] = {}
    for p in found:
        for key in p.section["units"]:
            if key in owner or key not in planned:
                raise ConvertError(f"{p.folder}: part {p.label}'s units are not a share of the plan the other parts "
                                   f"split ({key}); convert every part with the same colitools")  # fmt: skip
            owner[key] = p
    if len(owner) != len(planned):
        left = next(k for k in planned if k not in owner)
        raise ConvertError(f"unit {left} is in no part: convert every part with the same colitools")


def _check_identities(found: list[PartFolder]) -> None:
    """A source shard read by two parts must hold the same bytes for both (``_same_bytes``)."""
    seen: dict[str, tuple[Any, PartFolder]] = {}
    for p in found:
        for rec in (p.data.get("units") or {}).values():
            for shard, identity in ((rec or {}).get("sources") or {}).items():
                before = seen.setdefault(shard, (identity, p))
                if not _same_bytes(before[0], identity):
                    raise ConvertError(f"{p.folder}: part {p.label} read source shard {shard} as another file than "
                                       f"{before[1].folder} did ({_shown(identity)} vs {_shown(before[0])})")  # fmt: skip


def _same_bytes(a: Any, b: Any) -> bool:
    """Whether two recorded identities of one shard (``source_identity.py``) name the same bytes, as a resume
    decides: the same identity (a Hub file's size and sha256; a local file's stat), or a local file of the same
    size and content fingerprint (the same file rewritten, or a copy at the same path on another machine)."""
    if a == b:
        return True
    fa, fb = (x.get(FINGERPRINT) if isinstance(x, dict) else None for x in (a, b))
    return isinstance(fa, str) and fa == fb and a.get("size") == b.get("size")


def _shown(identity: Any) -> str:
    if not isinstance(identity, dict):
        return repr(identity)
    return ", ".join(f"{k} {str(v)[:16]}" for k, v in identity.items())


def _shared(data: dict[str, Any], key: str) -> Any:
    """``data[key]`` as the parts must share it: a size budget's allocation, not how long its measurement took
    (``budget.measurement``: seconds, cache hits)."""
    value = data.get(key)
    if key == "budget" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "measurement"}
    return value


def _what_differs(key: str, first: dict, other: dict) -> str:
    if key == "recipe" or key == "recipe_fingerprint":
        a, b = first.get("recipe") or {}, other.get("recipe") or {}
        diff = [
            f"{k}={b.get(k)!r}, not {a.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
        ]
        return f"has another recipe ({'; '.join(diff) or 'fingerprint differs'})"
    if key == "source":
        return (
            f"converted another source ({_source(other.get('source'))}, not {_source(first.get('source'))})"
        )
    if key == "tool":
        return f"was written by colitools {(other.get('tool') or {}).get('version')}, not {(first.get('tool') or {}).get('version')},"
    return f"has another `{key}`"


def _source(src: Any) -> str:
    if isinstance(src, dict) and src.get("kind") == "hf":
        return f"{src.get('repo_id')}@{src.get('revision')}"
    return str((src or {}).get("path") if isinstance(src, dict) else src)


def _owners(found: list[PartFolder]) -> dict[str, tuple[PartFolder, dict[str, Any]]]:
    """Every file of the merged folder but the manifest and the sidecar index: name -> (its part, {size, sha256})."""
    files: dict[str, tuple[PartFolder, dict[str, Any]]] = {}
    for p in found:
        for key in p.section["units"]:
            for f in p.data["units"][key].get("files") or []:
                files[f["name"]] = (p, {"size": f["size"], "sha256": f["sha256"]})
    for name, digest in (found[0].section.get("files") or {}).items():
        files[name] = (found[0], digest)
    return files


def _check_staging(staging: Path, plan: dict[str, tuple[PartFolder, dict[str, Any]]]) -> None:
    """An earlier merge's staging folder: its temporaries go, a file no part records is refused."""
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        name = str(path.relative_to(staging))
        if parse_temp_name(path.name) is not None:
            path.unlink()
        elif name not in plan and name not in (MANIFEST_FILE, f"{sidecar.SIDECAR_DIR}/{sidecar.INDEX_NAME}"):
            raise ConvertError(f"{staging}: holds {name}, which none of these parts records (left by another merge?); "
                               "move it away")  # fmt: skip


def _remove_empty(folder: Path) -> None:
    """Remove ``folder`` when nothing but empty folders is in it."""
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _check_room(staging: Path, remote: dict[str, tuple[PartFolder, dict[str, Any]]]) -> None:
    """Refuse a copy the free space of OUT's filesystem cannot hold (``diskfloor.free_bytes``), before it starts."""
    need = sum(d["size"] for name, (_, d) in remote.items() if not (staging / name).is_file())
    free = free_bytes(staging)
    if need > free:
        raise ConvertError(f"{staging.parent}: {free:,} bytes free, and copying the parts' files here needs "
                           f"{need:,}; free space, or merge on the parts' filesystem (where files are moved)")  # fmt: skip


def _same_filesystem(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


def _mismatch(path: Path, part: PartFolder, want: dict[str, Any], got: dict[str, Any]) -> ConvertError:
    what = "size" if got["size"] != want["size"] else "sha256"
    return ConvertError(f"{path}: {what} {got[what]} is not the {want[what]} part {part.label}'s {MANIFEST_FILE} "
                        "records; delete the file and rerun that part's convert (it redoes the unit)")  # fmt: skip


def _move_all(plan: dict[str, tuple[PartFolder, dict[str, Any]]], staging: Path, bar) -> None:
    """One filesystem: hash every file where it is (in the staging folder already after a killed merge), then
    rename them all; a clean stop during the renames puts them back."""
    todo = []
    for name, (part, want) in plan.items():
        there, here = staging / name, part.folder / name
        src = there if there.is_file() and not here.is_file() else here
        if not src.is_file():
            raise ConvertError(f"{here}: missing (recorded by part {part.label}'s {MANIFEST_FILE})")
        got = parts.file_digest(src, bar)
        if got != want:
            raise _mismatch(src, part, want, got)
        if src == here:
            todo.append((here, there))
    done: list[tuple[Path, Path]] = []
    try:
        for here, there in todo:
            there.parent.mkdir(parents=True, exist_ok=True)
            os.replace(here, there)
            done.append((here, there))
            _test_kill("moved", len(done))
    except BaseException:
        for here, there in reversed(done):
            with contextlib.suppress(OSError):
                os.replace(there, here)
        raise
    for folder in {there.parent for _, there in todo} | {here.parent for here, _ in todo}:
        fsync_dir(folder)


def _copy_all(plan: dict[str, tuple[PartFolder, dict[str, Any]]], staging: Path, bar) -> None:
    """Another filesystem: copy each file, hashing what is written, under a temporary name renamed once its
    digest is the recorded one; a copy already in the staging folder (a killed merge) is hashed again."""
    copied = 0
    for name, (part, want) in plan.items():
        there, here = staging / name, part.folder / name
        if there.is_file() and parts.file_digest(there) == want:
            bar.update(want["size"])
            continue
        if not here.is_file():
            raise ConvertError(f"{here}: missing (recorded by part {part.label}'s {MANIFEST_FILE})")
        there.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(there)
        try:
            got = _copy_hashed(here, tmp, bar)
            if got != want:
                raise _mismatch(here, part, want, got)
            os.replace(tmp, there)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        copied += 1
        _test_kill("copied", copied)
    fsync_dir(staging)


def _test_kill(what: str, count: int) -> None:
    if os.environ.get(KILL_AT_ENV, "") == f"{what}:{count}":
        os.kill(os.getpid(), signal.SIGKILL)


def _copy_hashed(src: Path, dest: Path, bar) -> dict[str, Any]:
    h, size = hashlib.sha256(), 0
    with open(src, "rb") as fi, open(dest, "xb") as fo:
        while block := fi.read(1 << 22):
            h.update(block)
            fo.write(block)
            size += len(block)
            bar.update(len(block))
        fo.flush()
        os.fsync(fo.fileno())
    return {"size": size, "sha256": h.hexdigest()}


def _write_manifest(found: list[PartFolder], staging: Path) -> None:
    """One machine's ``colitools.json`` (the key order its ledger writes) and the planar sidecar's index."""
    data = dict(found[0].data)
    section = data.pop(parts.PART_KEY)
    recorded = {
        k: v for p in found for k, v in (p.data.get("units") or {}).items() if k in p.section["units"]
    }
    data["state"] = "complete"
    data["units"] = {k: recorded[k] for k in data["plan"]["units"]}
    line = section.get("requantization_line")
    if line and all(p.section.get("requantized_exact") for p in found):
        data["warnings"] = [w for w in data.get("warnings") or [] if w != line]
    merged = Manifest(data)
    data["shards"] = merged.file_records()
    runs = [p.data.get("run") or {} for p in found]
    data["run"] = {k: _summed([r.get(k) for r in runs]) for k in runs[0]}  # the counts of all parts' runs
    data["run"]["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if section.get("sidecar_index") is not None:
        folder = staging / sidecar.SIDECAR_DIR
        folder.mkdir(exist_ok=True)
        write_bytes_atomic(folder / sidecar.INDEX_NAME, sidecar.index_bytes(section["sidecar_index"]))
    merged.dump(staging / MANIFEST_FILE)


def _summed(values: list[Any]) -> Any:
    """A count of every part summed; any other value as the first part has it."""
    counts = all(type(v) is int for v in values)
    return sum(values) if counts else values[0]


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _bar(progress: bool | None, total: int):
    if not (progress if progress is not None else sys.stderr.isatty()):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="merge", dynamic_ncols=True)
