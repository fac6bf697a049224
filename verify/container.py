"""``colitools verify container DIR``: is a converted folder complete and sound?

Checks, in order: every shard's header is valid and the index covers exactly the tensors present; every
tensor resolves to one format from its bytes (docs/FORMATS.md §3) and the container holds every tensor its
``config.json`` needs (``model_config.check_complete``); every scale tensor is finite (F32 ``.qs``) or not the E8M0
NaN byte (mxfp4), every float tensor (F32 / BF16 / F16: routers, norms, biases, float weights) finite; and, when the folder has a ``colitools.json`` manifest, the conversion is
complete and every recorded file has the recorded size and sha256. Problems are collected (not raised) so one
run reports all of them: a missing, truncated or header-corrupted shard is reported and the other shards are
still checked. Only a path that holds no shard to check (not a folder or file, no ``*.safetensors`` and no
index naming any) raises ``FormatError``. With a planar sidecar (``experts-int4g64/``, FORMATS §4) its
index and layer files are checked too (``_check_sidecar``), and its layer files resolve with the main shards
as the home of the routed experts.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from colitools.converters.manifest import MANIFEST_FILE, Manifest, ManifestError
from colitools.formats import qpack
from colitools.formats.container import resolve_container
from colitools.formats.digest import sha256_file
from colitools.formats.errors import ColitoolsError, FormatError
from colitools.formats.filenames import CONFIG_FILE, INDEX_FILE
from colitools.formats.inspect import ModelFiles, container_sources, counted_label, open_model
from colitools.formats.jsonfile import is_text, load_json_object
from colitools.formats.planar_sidecar import check_sidecar
from colitools.formats.safetensors_io import read_header


@dataclass
class ContainerReport:
    """Outcome of ``verify_container``: ``problems`` empty means the folder is sound."""

    path: str
    shards: int = 0
    tensors: int = 0
    formats: dict[str, int] = field(default_factory=dict)
    hashed_files: int = 0  # files whose sha256 was computed
    hashed_bytes: int = 0
    matched_files: int = 0  # of those, files whose sha256 is the manifest's
    matched_bytes: int = 0
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
            "matched_files": self.matched_files,
            "matched_bytes": self.matched_bytes,
            "problems": self.problems,
            "warnings": self.warnings,
        }


def verify_container(
    path: str | os.PathLike[str], *, hashes: bool = True, progress: bool = False
) -> ContainerReport:
    """Verify the converted folder (or single file) at ``path``; see the module docstring."""
    root = Path(path)
    report = ContainerReport(str(root))
    broken: set[str] = set()  # shards already reported (missing, truncated, bad header): one problem per file
    try:
        model = open_model(root, sidecar=False)
    except ColitoolsError as exc:
        if not root.is_dir():
            raise  # one file, or nothing at all: nothing else can be checked
        model = _open_each_shard(root, report, broken, exc)
    side = _check_sidecar(root, report) if root.is_dir() else []
    if root.is_dir() and (root / qpack.MANIFEST).is_file():  # --layout qpack: what colibri's qpack.c checks
        report.problems.extend(f"{root}: QPACK container: {p}" for p in qpack.check(root))
    shards = model.shards + side
    report.shards = len(shards)
    report.warnings.extend(model.warnings)
    try:
        resolved = resolve_container(
            shards, config=model.config, report_unresolved=True, merged_group_size=model.merged_group_size
        )
    except ColitoolsError as exc:
        report.problems.append(str(exc))
        resolved = {}
    report.tensors = len(resolved)
    shard_by_name = {str(s.path): s for s in shards}
    sources, _ = container_sources(shards, resolved, model.config)  # its warnings: inspect's
    for t in resolved.values():
        label = counted_label(t, sources)  # every tensor but scales and companions, as inspect counts them
        if label is not None:
            report.formats[label] = report.formats.get(label, 0) + 1
        if t.kind == "scale":
            _check_scale(shard_by_name[t.file], t.name, t.dtype, report)
        if t.kind == "float":
            _check_float(shard_by_name[t.file], t.name, report)
        if t.kind == "unresolved":  # a foreign container's weight whose [O, I] nothing gives (§3)
            report.problems.append(t.problem or f"tensor {t.name}: [O, I] unknown")
    if root.is_dir():
        _check_manifest(root, report, broken, hashes=hashes, progress=progress)
    report.problems = [_printable(p) for p in report.problems]
    report.warnings = [_printable(w) for w in report.warnings]
    return report


def _printable(line: str) -> str:
    """``line`` with anything that is no Unicode text (a lone surrogate some file held) escaped: the report is
    printed and written as UTF-8."""
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_sidecar(root: Path, report: ContainerReport) -> list:
    """The planar sidecar's own checks (``planar_sidecar.check_sidecar``: index keys and values, complete and
    done, raw headers, records); returns its layer files that opened, for the container checks."""
    files, problems = check_sidecar(root)
    report.problems.extend(problems)
    return files


def _open_each_shard(root: Path, report: ContainerReport, broken: set[str], failure: ColitoolsError) -> ModelFiles:
    """``open_model`` stopped at the first bad file: open every shard on its own, report each one that fails,
    and continue with the ones that open. The shards are the index's (when it can be read), else every
    ``*.safetensors`` file. FormatError (``failure``) when there is no shard to check at all."""
    names: list[str] = []
    config = None
    with contextlib.suppress(FormatError):
        config = load_json_object(root / CONFIG_FILE)
    if (root / INDEX_FILE).exists():
        try:
            weight_map = load_json_object(root / INDEX_FILE).get("weight_map")
            if isinstance(weight_map, dict):
                names = sorted({v for v in weight_map.values() if isinstance(v, str)})
        except FormatError as exc:  # names the file
            report.problems.append(str(exc))
    if not names:
        names = sorted(p.name for p in root.glob("*.safetensors") if p.is_file())
    if not names:
        raise failure
    shards = []
    for name in names:
        f = root / name
        if "/" in name or name.startswith(".") or not is_text(name):
            continue  # not a shard name (FORMATS §8): the index is the problem, reported below
        if not f.is_file():
            report.problems.append(f"{f}: missing (named by {INDEX_FILE})")
            broken.add(name)
            continue
        try:
            shards.append(read_header(f))
        except (ColitoolsError, OSError) as exc:
            report.problems.append(str(exc) if str(f) in str(exc) else f"{f}: {exc}")
            broken.add(name)
    if not broken and str(failure) not in report.problems:
        report.problems.append(str(failure))  # every shard opens: the failure was elsewhere (index coverage...)
    return ModelFiles(root, shards, config=config)


def _check_float(shard: Any, name: str, report: ContainerReport) -> None:
    """A float tensor holds no NaN / inf (the converter refuses them; a file changed since is reported)."""
    bad = ~np.isfinite(shard.read(name))  # F32 / BF16 / F16 as stored: no float32 copy
    if bad.any():
        report.problems.append(
            f"{shard.path.name}: float tensor {name} has {int(bad.sum())} non-finite value(s), "
            f"first at flat index {int(np.flatnonzero(bad.ravel())[0])}"
        )


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


def _check_manifest(root: Path, report: ContainerReport, broken: set[str], *, hashes: bool, progress: bool) -> None:
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
        report.problems.append(
            f"{path}: {len(missing)} planned file(s) not recorded as finished, e.g. {missing[0]}"
        )
    bar = None
    if progress and hashes:
        from tqdm import tqdm

        total = sum(int(r.get("size", 0)) for r in records)
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="sha256", leave=False)
    try:
        for rec in records:
            name, size, digest = rec.get("name"), rec.get("size"), rec.get("sha256")
            if name in broken:
                continue  # already reported
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
                else:
                    report.matched_files += 1
                    report.matched_bytes += int(size)
    finally:
        if bar:
            bar.close()
