"""One conversion over several machines: ``convert --part K/N`` converts a share of the plan's units into a folder
of its own, ``colitools merge`` (``converters/merge.py``) puts the parts together (docs/INTERNALS.md, "Parts").

The share (``assign``): the plan's units in processing order, cut into ``N`` contiguous runs of about equal
source bytes. Unit ``i``, with ``before`` bytes of the units ahead of it and ``b`` of its own, goes to part
``floor(N * (before + b / 2) / total) + 1``: its midpoint's place in the whole. Contiguous runs keep shard
locality (the units reading one shard are neighbours in processing order: a shard is fetched by one part, or by
the two on either side of a cut; the exception is the globals unit, which reads the first and the last shard), and a part's bytes are within one unit's bytes of ``total / N``. A part may hold
no unit (``N`` above the unit count): it still writes its small files and its manifest, and ``merge`` takes it.

A part's folder is an ordinary resumable output folder whose ``colitools.json`` holds the whole plan's ledger
(the same ``plan``, ``recipe``, ``source`` as one machine's), only this part's units, and a ``part`` section
(``PART_KEY``): ``index`` and ``count`` (K and N), ``units`` (the share), ``complete``, and once complete what
``merge`` needs to write one machine's manifest: ``files`` (size and sha256 of every file beside the unit files:
index, config, copied files; they depend only on the source and the plan), ``sidecar_index`` (the planar
sidecar's finished ``index.json``), ``requantization_line`` and ``requantized_exact`` (whether this part's
natively quantized experts all came out unchanged; the whole's warning is dropped when every part's did).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colitools.formats.errors import ConvertError, ParameterError
from colitools.formats.filenames import DOWNLOAD_DIR, LOCK_FILE, MANIFEST_FILE
from colitools.formats.planar_sidecar import INDEX_NAME, sidecar_dir

PART_KEY = "part"  # the section of a part's colitools.json
_PART = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
MAX_PARTS = 100_000


@dataclass(frozen=True)
class Part:
    """Part ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def units(self, units: Sequence[Any]) -> list[Any]:
        """This part's share of ``units`` (the plan's, in processing order), in that order."""
        return [u for u, k in zip(units, assign([u.in_bytes for u in units], self.count), strict=True)
                if k == self.index]  # fmt: skip


def parse_part(text: str | Part | None) -> Part | None:
    """``"K/N"`` (1 <= K <= N) as a ``Part``; ParameterError in one line otherwise."""
    if text is None or isinstance(text, Part):
        return text
    m = _PART.match(str(text))
    if not m:
        raise ParameterError(f"`part={text!r}`: expected K/N, e.g. 1/3 (part K of N, counted from 1)")
    k, n = int(m[1]), int(m[2])
    if not 1 <= n <= MAX_PARTS or not 1 <= k <= n:
        hint = " (parts count from 1: with a 0-based index use $((INDEX+1)))" if k == 0 else ""
        raise ParameterError(f"`part={text!r}`: K must be 1..N and N 1..{MAX_PARTS}{hint}")
    return Part(k, n)


def assign(unit_bytes: Sequence[int], count: int) -> list[int]:
    """The part (1-based) of each unit, by the midpoint rule of the module docstring; units without bytes
    (all of them) weigh one each. Integer arithmetic: the same answer on every machine."""
    weights = list(unit_bytes) if sum(unit_bytes) > 0 else [1] * len(unit_bytes)
    total = sum(weights)
    parts, before = [], 0
    for b in weights:
        parts.append(min(count, (count * (2 * before + b)) // (2 * total) + 1))
        before += b
    return parts


# ----------------------------------------------------------------------------------------- a part's folder
def recorded_part(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``part`` section of a manifest's data (None: a whole conversion's, or no manifest)."""
    section = (data or {}).get(PART_KEY)
    return section if isinstance(section, dict) else None


def check_folder(out: Path, part: Part | None) -> dict[str, Any] | None:
    """Refuse an output folder whose manifest records another part (or a whole conversion when ``part`` is
    given, or a part when it is not): its units would be mixed. Returns the recorded section."""
    from colitools.converters.manifest import Manifest, ManifestError

    path = out / MANIFEST_FILE
    try:
        data = Manifest.load(path).data
    except (OSError, ManifestError):
        return None  # no ledger yet, or an unreadable one (the ledger refuses it in its own words)
    section = recorded_part(data)
    had = f"{section.get('index')}/{section.get('count')}" if section else None
    now = str(part) if part else None
    if had != now and (
        data.get("units") or section
    ):  # a ledger of no unit yet is anyone's (a kill at its start)
        held = f"part {had} of a conversion" if had else "a whole conversion (no `part`)"
        asked = f"part {now}" if now else "the whole conversion"
        raise ConvertError(f"{path}: this folder holds {held}, not {asked}; use another output folder")
    return section


def start(data: dict[str, Any], part: Part, units: Iterable[Any]) -> None:
    """Record in the ledger's ``data`` that it is ``part``'s, of ``units`` (keys); not complete yet."""
    data[PART_KEY] = {
        "index": part.index,
        "count": part.count,
        "units": [u.key for u in units],
        "complete": False,
    }


def is_finished(section: dict[str, Any] | None, finished: Iterable[str]) -> bool:
    """Whether the recorded part is complete with every one of its units still standing."""
    return bool(section and section.get("complete")) and set(section.get("units") or ()) <= set(finished)


def finish(data: dict[str, Any], out: Path, unit_files: Iterable[str], *, sidecar_index: dict | None,
           requantization_line: str | None, requantized_exact: bool) -> None:  # fmt: skip
    """Complete the ``part`` section of ``data`` (what ``merge`` needs, module docstring): digests of every file
    of ``out`` beside the unit files and our own (``side_files``)."""
    section = data[PART_KEY]
    section["files"] = {name: file_digest(out / name) for name in side_files(out, unit_files)}
    section["sidecar_index"] = sidecar_index
    section["requantization_line"] = requantization_line
    section["requantized_exact"] = requantized_exact
    section["complete"] = True


_OURS = {MANIFEST_FILE, LOCK_FILE, DOWNLOAD_DIR}


def side_files(out: Path, unit_files: Iterable[str]) -> list[str]:
    """Files of the folder ``out`` that are neither unit files, nor ours (manifest, lock, downloads, plan record,
    budget cache, temporaries: hidden), nor the planar sidecar's ``index.json`` (a part's lists its layers only)."""
    from colitools.converters.budget import CACHE_FILE
    from colitools.converters.plan_record import PLAN_FILE

    skip = set(unit_files) | _OURS | {PLAN_FILE, CACHE_FILE}
    names = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
    sidecar = sidecar_dir(out)
    if sidecar.is_dir():
        names += sorted(f"{sidecar.name}/{p.name}" for p in sidecar.iterdir()
                        if p.is_file() and p.name != INDEX_NAME and not p.name.startswith("."))  # fmt: skip
    return [n for n in names if n not in skip]


def file_digest(path: Path, progress=None) -> dict[str, Any]:
    """``{"size", "sha256"}`` of a file, read once (``progress.update`` per block read)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
            size += len(block)
            if progress is not None:
                progress.update(len(block))
    return {"size": size, "sha256": h.hexdigest()}
