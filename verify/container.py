"""``colitools verify container DIR``: is a converted folder complete and sound?

Checks, in order: every shard's header is valid and the index covers exactly the tensors present; every
tensor resolves to one format from its bytes (docs/FORMATS.md §3); every scale tensor is finite (F32 ``.qs``) or
not the E8M0 NaN byte (mxfp4); and, when the folder has a ``colitools.json`` manifest, the conversion is
complete and every recorded file has the recorded size and sha256. Problems are collected (not raised) so one
run reports all of them; a folder that cannot be opened at all raises ``FormatError``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from colitools.converters.manifest import MANIFEST_FILE, Manifest, ManifestError
from colitools.formats.container import resolve_container
from colitools.formats.digest import sha256_file
from colitools.formats.errors import ColitoolsError
from colitools.formats.format_names import format_label
from colitools.formats.inspect import open_model


@dataclass
class ContainerReport:
    """Outcome of ``verify_container``: ``problems`` empty means the folder is sound."""

    path: str
    shards: int = 0
    tensors: int = 0
    formats: dict[str, int] = field(default_factory=dict)
    hashed_files: int = 0
    hashed_bytes: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "colitools.verify.container/1",
            "path": self.path,
            "ok": self.ok,
            "shards": self.shards,
            "tensors": self.tensors,
            "formats": dict(sorted(self.formats.items())),
            "hashed_files": self.hashed_files,
            "hashed_bytes": self.hashed_bytes,
            "problems": self.problems,
            "warnings": self.warnings,
        }


def verify_container(path: str | os.PathLike[str], *, hashes: bool = True, progress: bool = False) -> ContainerReport:
    """Verify the converted folder (or single file) at ``path``; see the module docstring."""
    root = Path(path)
    report = ContainerReport(str(root))
    model = open_model(root)  # raises FormatError for an unreadable container: nothing else can be checked
    report.shards = len(model.shards)
    report.warnings.extend(model.warnings)
    try:
        resolved = resolve_container(model.shards, config=model.config)
    except ColitoolsError as exc:
        report.problems.append(str(exc))
        resolved = {}
    report.tensors = len(resolved)
    shard_by_name = {s.path.name: s for s in model.shards}
    for t in resolved.values():
        if t.kind in ("quantized", "float") and t.format is not None:
            label = format_label(t.format.name, t.format.group_size, t.dtype if t.kind == "float" else None)
            report.formats[label] = report.formats.get(label, 0) + 1
        if t.kind == "scale":
            _check_scale(shard_by_name[Path(t.file).name], t.name, t.dtype, report)
    if root.is_dir():
        _check_manifest(root, report, hashes=hashes, progress=progress)
    return report


def _check_scale(shard: Any, name: str, dtype: str, report: ContainerReport) -> None:
    values = shard.read(name)
    if dtype == "F32":
        bad = ~np.isfinite(values)
        if bad.any():
            report.problems.append(
                f"{shard.path.name}: scale tensor {name} has {int(bad.sum())} non-finite value(s), "
                f"first at flat index {int(np.flatnonzero(bad.ravel())[0])}"
            )
    elif dtype in ("U8", "F8_E8M0"):
        raw = np.asarray(values).view(np.uint8)
        if (raw == 0xFF).any():  # E8M0 0xFF is NaN
            report.problems.append(f"{shard.path.name}: E8M0 scale tensor {name} holds the NaN byte 0xFF")


def _check_manifest(root: Path, report: ContainerReport, *, hashes: bool, progress: bool) -> None:
    path = root / MANIFEST_FILE
    if not path.is_file():
        report.warnings.append(f"no {MANIFEST_FILE}: sizes and sha256 not checked against a manifest")
        return
    try:
        manifest = Manifest.load(path)
        records = manifest.file_records()
        planned = manifest.planned_files()
    except (OSError, ManifestError) as exc:
        report.problems.append(f"{path}: unreadable manifest ({exc})")
        return
    if manifest.state != "complete":
        report.problems.append(f"{path}: conversion state is {manifest.state!r}, not 'complete' (resume it)")
    recorded = {r.get("name") for r in records}
    missing = [n for n in planned if n not in recorded]
    if missing:
        report.problems.append(f"{path}: {len(missing)} planned file(s) not recorded as finished, e.g. {missing[0]}")
    bar = None
    if progress and hashes:
        from tqdm import tqdm

        total = sum(int(r.get("size", 0)) for r in records)
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="sha256", leave=False)
    try:
        for rec in records:
            name, size, digest = rec.get("name"), rec.get("size"), rec.get("sha256")
            f = root / str(name)
            if not f.is_file():
                report.problems.append(f"{f}: recorded in {MANIFEST_FILE} but missing")
                continue
            if f.stat().st_size != size:
                report.problems.append(f"{f}: size {f.stat().st_size}, manifest says {size}")
                continue
            if hashes:
                actual = sha256_file(f, bar.update if bar else None)
                report.hashed_files += 1
                report.hashed_bytes += int(size)
                if actual != digest:
                    report.problems.append(f"{f}: sha256 {actual}, manifest says {digest}")
    finally:
        if bar:
            bar.close()
