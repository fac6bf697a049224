"""The resume ledger, stored in the output's ``colitools.json`` (FORMATS-SPEC §7; the type is ``manifest.Manifest``).

The same JSON file is the manifest of a finished conversion: tool version, source, recipe (and its
fingerprint), the plan's files, finished units with each file's name, size and sha256, fallbacks, and
``state`` (``converting`` until the end, then ``complete``). Every change is an atomic rewrite (temporary
file, fsync, rename, fsync of the folder), so a crash leaves either the previous or the next state.

On a rerun ``Ledger.open`` refuses another recipe (naming the differing options), another source, or a plan
whose files differ; drops units whose files are missing or have the wrong size (they are redone); and removes
temporaries left by a crashed writer. Everything except the ``run`` section (times, durations) is
deterministic, so two runs of the same conversion produce the same ``colitools.json`` apart from ``run``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import colitools
from colitools.converters.manifest import MANIFEST_FILE, MANIFEST_VERSION, Manifest, ManifestError
from colitools.converters.planner import ConversionPlan, Unit
from colitools.converters.unit_writer import FileRecord
from colitools.errors import ConvertError
from colitools.formats.atomic import parse_temp_name


@dataclass
class ResumeState:
    """What ``Ledger.open`` found: units already finished, units dropped because their files were damaged,
    and temporaries removed."""

    finished: list[str]
    dropped: list[str]
    removed_temporaries: list[str]


class Ledger:
    """The ``colitools.json`` of one output folder during a conversion."""

    def __init__(self, outdir: Path, data: dict[str, Any]):
        self.outdir = outdir
        self.path = outdir / MANIFEST_FILE
        self.manifest = Manifest(data)

    @property
    def data(self) -> dict[str, Any]:
        """The manifest's JSON object, as it will be written."""
        return self.manifest.data

    # ------------------------------------------------------------------------------------------ opening
    @classmethod
    def open(cls, outdir: Path, plan: ConversionPlan, source: dict[str, str]) -> tuple[Ledger, ResumeState]:
        """Open (or start) the ledger of ``outdir`` for ``plan`` from ``source`` (``Source.describe()``).

        Raises ConvertError for a folder holding another conversion (recipe, source or plan differ) or
        safetensors files without a ledger."""
        outdir = Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        path = outdir / MANIFEST_FILE
        fresh = cls._fresh(outdir, plan, source)
        removed = _remove_temporaries(outdir)
        if not path.exists():
            stray = sorted(p.name for p in outdir.glob("*.safetensors"))
            if stray:
                raise ConvertError(
                    f"{outdir}: holds {stray[0]} (and {len(stray) - 1} more) but no {MANIFEST_FILE}; "
                    "refusing to mix with another conversion (use an empty output folder)"
                )
            ledger = cls(outdir, fresh)
            ledger.save()
            return ledger, ResumeState([], [], removed)
        try:
            old = Manifest.load(path)
        except (OSError, ManifestError) as exc:
            raise ConvertError(
                f"{path}: unreadable resume ledger ({exc}); use an empty output folder"
            ) from None
        cls._check_same(path, old.data, fresh, plan)
        ledger = cls(outdir, fresh)
        finished, dropped = [], []
        planned = {u.key: u for u in plan.units}
        for key, rec in old.units.items():
            unit = planned.get(key)
            if unit is None:
                continue
            if ledger._files_intact(unit, rec):
                ledger.data["units"][key] = rec
                finished.append(key)
            else:
                dropped.append(key)
        ledger.data["units"] = _ordered(ledger.data["units"], plan)
        ledger.save()
        return ledger, ResumeState(finished, dropped, removed)

    @staticmethod
    def _fresh(outdir: Path, plan: ConversionPlan, source: dict[str, str]) -> dict[str, Any]:
        qc = plan.inventory.config.get("quantization_config")
        return {
            "format": MANIFEST_VERSION,
            "tool": {"name": "colitools", "version": colitools.__version__},
            "state": "converting",
            "source": dict(source),
            "source_quantization_config": qc,
            "recipe": plan.recipe.as_dict(),
            "recipe_fingerprint": plan.recipe.fingerprint(),
            "plan": {
                "units": [u.key for u in plan.units],
                "files": [{"name": f.name, "size": f.size} for f in plan.files],
                "in_bytes": plan.in_bytes,
                "out_bytes": plan.out_bytes,
            },
            "fallbacks": [f.as_dict() for f in plan.fallbacks],
            "formats_per_role": plan.role_formats(),
            "dropped_towers": list(plan.dropped),
            "units": {},
        }

    @staticmethod
    def _check_same(path: Path, old: dict, fresh: dict, plan: ConversionPlan) -> None:
        if old.get("recipe_fingerprint") != fresh["recipe_fingerprint"]:
            diffs = plan.recipe.differences(old.get("recipe") or {})
            raise ConvertError(
                f"{path}: this folder holds a conversion with another recipe ({'; '.join(diffs) or 'fingerprint differs'}); "
                "rerun with the recorded options or use another output folder"
            )
        if old.get("source") != fresh["source"]:
            before, now = old.get("source") or {}, fresh["source"]
            hint = "use another output folder"
            if before.get("kind") == now.get("kind") == "hf" and before.get("repo_id") == now.get("repo_id"):
                hint = f"the repo moved on: resume with --revision {before.get('revision')}, or use another output folder"
            raise ConvertError(
                f"{path}: this folder holds a conversion of another source ({_show_source(before)}, "
                f"now {_show_source(now)}); {hint}"
            )
        if (old.get("plan") or {}).get("files") != fresh["plan"]["files"]:
            raise ConvertError(
                f"{path}: the recorded plan's files differ from this run's plan (another colitools version?); "
                "use another output folder"
            )

    def _files_intact(self, unit: Unit, rec: Any) -> bool:
        files = rec.get("files") if isinstance(rec, dict) else None
        if not isinstance(files, list) or [f.get("name") for f in files] != [f.name for f in unit.files]:
            return False
        for f, out in zip(files, unit.files, strict=True):
            p = self.outdir / out.name
            if f.get("size") != out.size or not p.is_file() or p.stat().st_size != out.size:
                return False
        return True

    # ------------------------------------------------------------------------------------------ updates
    def is_finished(self, key: str) -> bool:
        return key in self.data["units"]

    def record_unit(self, unit: Unit, files: Iterable[FileRecord], plan: ConversionPlan) -> None:
        """Record a finished unit (its files are published) and rewrite the ledger atomically."""
        self.data["units"][unit.key] = {
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in files]
        }
        self.data["units"] = _ordered(self.data["units"], plan)
        self.save()

    def file_records(self) -> list[FileRecord]:
        return [FileRecord(f["name"], f["size"], f["sha256"]) for f in self.manifest.file_records()]

    def finish(self, extra: dict[str, Any]) -> None:
        """Mark the conversion complete and add the manifest sections (``shards``, ``run``...)."""
        self.data["state"] = "complete"
        self.data.update(extra)
        self.save()

    def save(self) -> None:
        self.manifest.dump(self.path)


def _ordered(units: dict[str, Any], plan: ConversionPlan) -> dict[str, Any]:
    order = {u.key: i for i, u in enumerate(plan.units)}
    return {k: units[k] for k in sorted(units, key=lambda k: order.get(k, len(order)))}


def _remove_temporaries(outdir: Path) -> list[str]:
    removed = []
    for p in sorted(outdir.iterdir()):
        # temporaries of our writers (SafetensorsWriter, the atomic rewrites of the index, config, ledger)
        if parse_temp_name(p.name) is not None and p.is_file():
            p.unlink()
            removed.append(p.name)
    return removed


def _show_source(src: Any) -> str:
    if isinstance(src, dict):
        if src.get("kind") == "hf":
            return f"{src.get('repo_id')}@{src.get('revision')}"
        return str(src.get("path"))
    return repr(src)
