"""The manifest of a converted folder, ``colitools.json``: one type, one load, one dump.

The converter's resume ledger (``ledger.py``) writes it on every change and reads it back on a rerun; the
runner adds the final sections through the ledger; ``verify container`` reads it to check that the conversion
is complete and that every recorded file has its recorded size and sha256.

The JSON object: ``format`` (``MANIFEST_VERSION``), ``tool``, ``state`` (``converting`` until the end, then
``complete``), ``source``, ``source_quantization_config``, ``recipe``, ``recipe_fingerprint``, ``plan``
(``units``, ``files`` with name and size, ``in_bytes``, ``out_bytes``), ``fallbacks``, ``units`` (unit key ->
``{"files": [{"name", "size", "sha256"}]}``), and once complete ``shards``, ``copied_files`` and ``run``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colitools.formats.atomic import write_json_atomic
from colitools.formats.errors import ManifestError
from colitools.formats.filenames import MANIFEST_FILE, inside_name_problem
from colitools.formats.jsonfile import parse_json_object, shown_text

__all__ = ["MANIFEST_FILE", "MANIFEST_VERSION", "Manifest", "ManifestError"]

MANIFEST_VERSION = 1


@dataclass
class Manifest:
    """The JSON object of one ``colitools.json``, kept as parsed (``dump`` writes exactly what ``data`` holds)."""

    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Parse ``path``. ``OSError`` when it cannot be read; ``ManifestError`` when it is not UTF-8 JSON
        holding an object, holds a string that is no Unicode text, or records a file name that is absolute or
        leaves the folder (``filenames.inside_name_problem``)."""
        data = parse_json_object(Path(path).read_bytes(), error=ManifestError)
        _check_file_names(data)
        return cls(data)

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Publish atomically (temporary file, fsync, rename, fsync of the folder): one line per section member
        (a unit's record, a planned file, a shard) under each top-level section (``json_lines``, expand 2). The
        ledger rewrites it after every unit, so it must stay cheap when it holds thousands."""
        write_json_atomic(path, self.data, expand=2)

    @property
    def state(self) -> Any:
        """``"converting"`` or ``"complete"`` (whatever the file says; None when absent)."""
        return self.data.get("state")

    @property
    def units(self) -> dict[str, Any]:
        """Finished units as recorded (unit key -> record), ``{}`` when absent; records are not checked."""
        return self.data.get("units") or {}

    def planned_files(self) -> list[Any]:
        """Names of the files the plan will write (``plan.files``), in plan order."""
        files = (self.data.get("plan") or {}).get("files", []) if isinstance(self.data.get("plan"), dict | None) else None
        if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in files):
            raise ManifestError("plan.files is not a list of {name, size} objects")
        return [f["name"] for f in files]

    def file_records(self) -> list[dict[str, Any]]:
        """Every recorded file of every finished unit (``{"name", "size", "sha256"}``), in unit order.

        ``ManifestError`` when ``units`` is missing or not unit -> ``{"files": [...]}``."""
        try:
            records = [f for unit in self.data["units"].values() for f in unit["files"]]
        except (KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(str(exc)) from None
        for f in records:
            if not (
                isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("sha256"), str)
                and type(f.get("size")) is int and f["size"] >= 0
            ):  # fmt: skip
                raise ManifestError(f"a file record is not {{name, size, sha256}}: {str(f)[:80]}")
        return records


def _recorded_names(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(where, name)`` of every file name the manifest records: ``plan.files``, each unit's ``files``,
    ``shards`` and ``copied_files`` (entries of another shape are left to the accessors' checks)."""

    def names(where: str, items: Any) -> list[tuple[str, Any]]:
        items = items if isinstance(items, list) else []
        return [(where, f.get("name") if isinstance(f, dict) else f) for f in items]

    plan, units = data.get("plan"), data.get("units")
    found = names("plan.files", plan.get("files")) if isinstance(plan, dict) else []
    for key, unit in units.items() if isinstance(units, dict) else ():
        found += names(f"units[{key!r}].files", unit.get("files") if isinstance(unit, dict) else None)
    return found + names("shards", data.get("shards")) + names("copied_files", data.get("copied_files"))


def _check_file_names(data: dict[str, Any]) -> None:
    """A recorded file name that is a string must stay inside the output folder: verify and the resume ledger
    stat, hash and compare the files they name."""
    for where, name in _recorded_names(data):
        why = inside_name_problem(name) if isinstance(name, str) else None
        if why is not None:
            raise ManifestError(f"{where}: file name {shown_text(name)} is refused: {why}")
