"""A planned mirror: the plan ``mirror stage`` records in the mirror directory (``.colibri-mirror-plan.json``,
``plan.to_json()``), read back to say which experts the plan put on the mirror (``usage show`` marks them).

An expert is on the mirror when its routed tensor (the one the engine assigns drives by, docs/CLI.md "mirror") is in
one of the plan's files: the same rule the plan's benefit and its read prediction use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from colitools.formats.errors import MirrorError
from colitools.formats.jsonfile import load_json_object
from colitools.mirror.plan import PLAN_FILE, SCHEMA
from colitools.mirror.scan import ExpertKey, discover_shards

__all__ = ["PlannedMirror", "planned_experts", "read_planned_mirror"]


@dataclass(frozen=True)
class PlannedMirror:
    """What a mirror's plan file says: where it is, the model it mirrors and the shard files it chose."""

    plan_file: Path
    model_root: Path
    source_dirs: tuple[Path, ...]  # the plan's shard directories after the model's
    files: tuple[str, ...]


def _strings(plan: dict, key: str, where: Path) -> list[str]:
    value = plan.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MirrorError(f"the mirror plan {where}: `{key}` is not a list of strings")
    return value


def read_planned_mirror(directory: str | os.PathLike) -> PlannedMirror | None:
    """The plan recorded in ``directory`` (None when it holds no plan file). One line naming the file when the
    plan is no JSON object (FormatError), has another schema or lacks ``model_root`` / ``source_dirs`` / ``files``
    (MirrorError)."""
    path = Path(directory) / PLAN_FILE
    if not path.is_file():
        return None
    plan = load_json_object(path)  # FormatError: one line naming the file
    if plan.get("schema") != SCHEMA:
        raise MirrorError(f"the mirror plan {path}: schema is {plan.get('schema')!r}, expected {SCHEMA!r}")
    model_root = plan.get("model_root")
    if not isinstance(model_root, str) or not model_root:
        raise MirrorError(f"the mirror plan {path}: `model_root` is not a path")
    files = plan.get("files")
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and isinstance(f.get("name"), str) for f in files
    ):
        raise MirrorError(f"the mirror plan {path}: `files` is not a list of {{name, ...}} objects")
    sources = [Path(p) for p in _strings(plan, "source_dirs", path)]
    return PlannedMirror(
        plan_file=path,
        model_root=Path(model_root),
        source_dirs=tuple(p for p in sources if p != Path(model_root)),
        files=tuple(f["name"] for f in files),
    )


def planned_experts(planned: PlannedMirror, n_experts: int | None = None) -> frozenset[ExpertKey]:
    """The experts whose routed tensor is in one of the plan's files, scanned in the plan's shard directories
    (``n_experts``: the model's routed expert count, for 1-D fused stacks). MirrorError when the model's shard
    directories are gone or a planned file is not among their shards."""
    directories = [planned.model_root, *planned.source_dirs]
    shards = {s.name: s for s in discover_shards(directories, None, n_experts)}
    missing = [name for name in planned.files if name not in shards]
    if missing:
        raise MirrorError(
            f"the mirror plan {planned.plan_file} names {missing[0]!r}, which is not a shard of {planned.model_root}"
        )
    marked: set[ExpertKey] = set()
    for name in planned.files:
        marked |= shards[name].routed
    return frozenset(marked)
