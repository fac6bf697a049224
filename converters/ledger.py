"""The resume ledger, stored in the output's ``colitools.json`` (docs/FORMATS.md §10; the type is ``manifest.Manifest``).

The same JSON file is the manifest of a finished conversion: tool version, source, recipe (and its
fingerprint), the plan's files, finished units with each file's name, size and sha256, fallbacks, and
``state`` (``converting`` until the end, then ``complete``). Every change is an atomic rewrite (temporary
file, fsync, rename, fsync of the folder), so a crash leaves either the previous or the next state.

On a rerun ``Ledger.open`` refuses another recipe (naming the differing options), another source, or a plan
whose files differ; drops units whose files are missing or have the wrong size, and units whose source shards
changed since they were converted (each unit records the identity of the shards it read: size + mtime_ns +
ctime_ns + a content fingerprint of a local file, size + sha256 of a Hub file; ``source_identity.py`` decides
when a shard is the same, reading it only when its metadata or folder changed); dropped units are redone; and
removes temporaries left by a crashed writer. A local source folder moved (or linked) elsewhere is the same source
when the shards its finished units read have their recorded content there; when none has, it is another source.
``Ledger.examine`` makes the same checks without writing anything. Everything except the ``run`` section (times,
durations) is deterministic, so two runs of the same conversion produce the same ``colitools.json`` apart from
``run``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

import colitools
from colitools.converters import output, reuse
from colitools.converters.budget import CACHE_FILE as BUDGET_CACHE_FILE
from colitools.converters.manifest import MANIFEST_FILE, MANIFEST_VERSION, Manifest, ManifestError
from colitools.converters.plan_record import PLAN_FILE
from colitools.converters.planner import ConversionPlan, Unit
from colitools.converters.source_identity import SourceIdentities
from colitools.converters.unit_writer import FileRecord
from colitools.formats.atomic import parse_temp_name
from colitools.formats.error_stats import SUM_ORDER, ErrorStats
from colitools.formats.errors import ConvertError
from colitools.formats.filenames import DOWNLOAD_DIR, LOCK_FILE, SHARD_SUFFIX
from colitools.formats.planar_sidecar import sidecar_dir


@dataclass
class ResumeState:
    """What the ledger of an output folder holds for this plan: units already finished, units to redo (with
    why: their files are damaged, or a source shard they read changed), temporaries of a crashed writer
    (removed by ``Ledger.open``, only listed by ``Ledger.examine``), and whether the recorded conversion is
    complete with nothing left to do."""

    finished: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    removed_temporaries: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # dropped unit -> why it is redone
    rechecked: dict[str, str] = field(default_factory=dict)  # source shard -> what changed, same content
    complete: bool = False  # state "complete", every unit stands, every copied file present: nothing to do
    kept: dict[str, Any] = field(default_factory=dict, repr=False)  # finished unit -> its record
    donor: dict[str, Any] | None = field(default=None, repr=False)  # --replace: the ledger replaced (reuse.py)


class Ledger:
    """The ``colitools.json`` of one output folder during a conversion.

    ``identities``: the source shards' identities of this run (``SourceIdentities``); every recorded unit stores
    those of the shards it read (``SourceIdentities.recorded``), and a rerun redoes a finished unit whose shards
    are not the same bytes any more (``SourceIdentities.change``)."""

    def __init__(self, outdir: Path, data: dict[str, Any], identities: SourceIdentities):
        self.outdir = outdir
        self.path = outdir / MANIFEST_FILE
        self.manifest = Manifest(data)
        self.identities = identities

    @property
    def data(self) -> dict[str, Any]:
        """The manifest's JSON object, as it will be written."""
        return self.manifest.data

    # ------------------------------------------------------------------------------------------ opening
    @classmethod
    def examine(
        cls, outdir: Path, plan: ConversionPlan, source: dict[str, str], identities: SourceIdentities,
        replace: bool = False,
    ) -> ResumeState:
        """What a conversion of ``plan`` would find in ``outdir``, read-only (``--dry-run``, and the check that
        lets a rerun on a complete output do nothing, not even take the lock).

        Raises ConvertError for a folder holding another conversion (recipe, source or plan differ),
        an unreadable ledger, or files of its own but no ledger (``_check_foreign``). ``replace`` (``convert
        --replace``): a folder holding another conversion of the same source (another recipe or plan) is not
        refused: its ledger is returned as ``donor`` (converters/reuse.py), no unit kept."""
        outdir = Path(outdir)
        if not outdir.is_dir():
            return ResumeState()
        path = outdir / MANIFEST_FILE
        temporaries = _temporaries(outdir)
        if not path.exists():
            _check_foreign(outdir, temporaries)
            return ResumeState(removed_temporaries=temporaries)
        try:
            old = Manifest.load(path)
        except (OSError, ManifestError) as exc:
            raise ConvertError(
                f"{path}: unreadable resume ledger ({exc}); use an empty output folder"
            ) from None
        fresh = cls._fresh(plan, source)
        if replace and reuse.replaces(old.data, fresh):  # the same source is still required
            cls._check_same(path, old.data, reuse.as_recorded(fresh, old.data), plan)
            return ResumeState(removed_temporaries=temporaries, donor=old.data)
        moved = cls._check_same(path, old.data, cls._fresh(plan, source), plan)
        state = ResumeState(removed_temporaries=temporaries)
        planned = {u.key: u for u in plan.units}
        source_changes = []  # per recorded unit: why its shards are not the converted bytes (None: they are)
        for key, rec in old.units.items():
            unit = planned.get(key)
            if unit is None:
                continue
            changed = _sources_changed(unit, rec, identities, moved)
            source_changes.append(changed)
            why = _files_damaged(outdir, unit, rec) or changed
            if why:
                state.dropped.append(key)
                state.reasons[key] = why
            else:
                state.kept[key] = rec
                state.finished.append(key)
        if moved and source_changes and None not in source_changes:  # not one shard as recorded: not moved
            raise ConvertError(
                f"{path}: this folder holds a conversion of another source ({_show_source(old.data.get('source'))}, "
                f"now {_show_source(source)}; {source_changes[0]}); use another output folder"
            )
        state.rechecked = dict(identities.rechecked)
        copied = old.data.get("copied_files")
        state.complete = (
            old.state == "complete"
            and len(state.finished) == len(plan.units)
            and not temporaries
            and isinstance(copied, list)
            and all(isinstance(n, str) and (outdir / n).is_file() for n in copied)
        )
        return state

    @classmethod
    def open(
        cls, outdir: Path, plan: ConversionPlan, source: dict[str, str], identities: SourceIdentities,
        replace: bool = False,
    ) -> tuple[Ledger, ResumeState]:
        """Open (or start) the ledger of ``outdir`` for ``plan`` from ``source`` (``Source.describe()``), whose
        shards have ``identities`` now: ``examine``, then remove the temporaries, keep the units that still
        stand and write the ledger. Raises ConvertError as ``examine`` does."""
        outdir = Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        state = cls.examine(outdir, plan, source, identities, replace)
        _unlink(outdir, state.removed_temporaries)
        if state.donor is not None:  # recorded before the new ledger replaces it (converters/reuse.py)
            reuse.keep_donor(outdir, state.donor)
        ledger = cls(outdir, cls._fresh(plan, source), identities)
        # kept units record their shards as they are now (after a move or a chmod, the next rerun reads nothing)
        shards = {u.key: u.shards for u in plan.units}
        kept = {k: {**r, "sources": {s: identities.recorded(s) for s in shards[k]}} for k, r in state.kept.items()}
        ledger.data["units"] = _ordered(kept, plan)
        ledger.save()
        if state.donor is not None:
            reuse.unpublish(outdir)
        output.write_sidecar_index(outdir, plan, state.finished)  # resume: done = the layers still intact
        return ledger, state

    @staticmethod
    def _fresh(plan: ConversionPlan, source: dict[str, str]) -> dict[str, Any]:
        qc = plan.inventory.config.get("quantization_config")
        return {
            "format": MANIFEST_VERSION,
            "tool": {"name": "colitools", "version": colitools.__version__},
            "state": "converting",
            "source": dict(source),
            # the source's config.json (its quantization_config beside it): what a rerun names when it changed
            "source_config": {k: v for k, v in plan.inventory.config.items() if k != "quantization_config"},
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
            **({"budget": plan.budget} if plan.budget is not None else {}),
            "units": {},
        }

    @staticmethod
    def _check_same(path: Path, old: dict, fresh: dict, plan: ConversionPlan) -> bool:
        """Refuse another recipe, source or plan. Returns whether the source is a local folder at another path than
        the recorded one: the same source only if its shards have the recorded content (``examine`` decides)."""
        before, now = old.get("source") or {}, fresh["source"]
        moved = before != now and before.get("kind") == now.get("kind") == "local" and set(before) == set(now)
        if old.get("recipe_fingerprint") != fresh["recipe_fingerprint"]:
            diffs = plan.recipe.differences(old.get("recipe") or {})
            raise ConvertError(
                f"{path}: this folder holds a conversion with another recipe ({'; '.join(diffs) or 'fingerprint differs'}); "
                "rerun with the recorded options, add `replace` to convert it again with these (its unchanged "
                "tensors copied), or use another output folder"
            )
        if before != now and not moved:
            hint = "use another output folder"
            if before.get("kind") == now.get("kind") == "hf" and before.get("repo_id") == now.get("repo_id"):
                hint = f"the repo moved on: resume with `revision={before.get('revision')}`, or use another output folder"
            raise ConvertError(
                f"{path}: this folder holds a conversion of another source ({_show_source(before)}, "
                f"now {_show_source(now)}); {hint}"
            )
        if (old.get("plan") or {}).get("files") != fresh["plan"]["files"]:
            if moved:
                raise ConvertError(
                    f"{path}: this folder holds a conversion of another source ({_show_source(before)}, now "
                    f"{_show_source(now)}: the plan's files differ); use another output folder"
                )
            changed = _config_changes(old, fresh)
            if changed:
                raise ConvertError(
                    f"{path}: config.json changed since this folder's conversion started ({changed}), and with it "
                    "the files of the plan; convert with the recorded config.json or use another output folder"
                )
            raise ConvertError(
                f"{path}: the recorded plan's files differ from this run's plan (another colitools version?); "
                "use another output folder"
            )
        return moved

    # ------------------------------------------------------------------------------------------ updates
    def is_finished(self, key: str) -> bool:
        return key in self.data["units"]

    def record_unit(
        self,
        unit: Unit,
        files: Iterable[FileRecord],
        plan: ConversionPlan,
        errors: Mapping[str, ErrorStats] | None = None,
    ) -> None:
        """Record a finished unit (its files are published), its tensors' reuse keys (converters/reuse.py) and
        rewrite the ledger atomically. ``errors``: what
        each written tensor lost (formats/error_stats.py), kept as ``errors: {tensor: [n, sse, ssw, ssq, dot,
        max_abs]}`` (``ErrorStats`` field order; ``verify quality`` reports them without the source) and the order
        they were summed in (``error_order``)."""
        self.data["units"][unit.key] = {
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in files],
            "sources": {s: self.identities.recorded(s, restat=True) for s in unit.shards},
        }
        self.data["units"][unit.key]["keys"] = reuse.unit_keys(unit, plan, self.identities)
        if errors:
            self.data["units"][unit.key]["errors"] = {name: list(astuple(e)) for name, e in sorted(errors.items())}
            self.data["units"][unit.key]["error_order"] = SUM_ORDER  # FORMATS §11's order (verify's tolerance)
        self.data["units"] = _ordered(self.data["units"], plan)
        self.save()
        output.write_sidecar_index(self.outdir, plan, self.data["units"])  # planar: done (and complete)

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


def remove_temporaries(outdir: Path) -> list[str]:
    """Remove the temporaries of our writers in ``outdir`` (``_temporaries``); returns their names. For a holder
    of the folder's lock only: the runner calls it when a conversion stops cleanly (an error, Ctrl-C, SIGTERM,
    the disk floor), so the file of the unit in flight does not wait for the next run (``open`` removes what a
    SIGKILL left)."""
    names = _temporaries(outdir) if outdir.is_dir() else []
    _unlink(outdir, names)
    return names


def _unlink(outdir: Path, names: Iterable[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (outdir / name).unlink()


def _temporaries(outdir: Path) -> list[str]:
    """Temporaries of our writers (SafetensorsWriter, the atomic rewrites of the index, config, ledger), also
    those the planar sidecar's writers leave in experts-int4g64/; paths relative to ``outdir``."""
    folder = sidecar_dir(outdir)
    found = sorted(outdir.iterdir()) + (sorted(folder.iterdir()) if folder.is_dir() else [])
    return [str(p.relative_to(outdir)) for p in found if parse_temp_name(p.name) is not None and p.is_file()]


def _check_foreign(outdir: Path, temporaries: list[str]) -> None:
    """Refuse an output folder without a ledger that holds anything but what a conversion leaves before its
    ledger exists (the lock file, the download folder, writer temporaries): a conversion would write its
    ``config.json``, index and tokenizer files over the user's."""
    ours = {LOCK_FILE, DOWNLOAD_DIR, PLAN_FILE, BUDGET_CACHE_FILE, *temporaries}
    foreign = sorted(p.name for p in outdir.iterdir() if p.name not in ours)
    if not foreign:
        return
    shards = [n for n in foreign if n.endswith(SHARD_SUFFIX)]
    more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
    if shards:
        raise ConvertError(
            f"{outdir}: holds {shards[0]} (and {len(shards) - 1} more) but no {MANIFEST_FILE}; "
            "refusing to mix with another conversion (use an empty output folder)"
        )
    raise ConvertError(
        f"{outdir}: not empty ({foreign[0]}{more}) and not a colitools output (no {MANIFEST_FILE}); refusing to "
        "write into it (use an empty or new output folder)"
    )


def _files_damaged(outdir: Path, unit: Unit, rec: Any) -> str | None:
    """Why the recorded files of a finished unit cannot be kept (None: they have their planned names and sizes)."""
    files = rec.get("files") if isinstance(rec, dict) else None
    if not isinstance(files, list) or [f.get("name") if isinstance(f, dict) else None for f in files] != [
        f.name for f in unit.files
    ]:
        return "its ledger record is not this plan's"
    for f, out in zip(files, unit.files, strict=True):
        p = outdir / out.name
        if f.get("size") == out.size and f.get("uploaded") and not p.exists():
            continue  # on the Hub with its sha256, deleted here (converters/stream_upload.py)
        if f.get("size") != out.size or not p.is_file() or p.stat().st_size != out.size:
            return f"{out.name} is missing or has the wrong size"
    return None


def _sources_changed(unit: Unit, rec: Any, identities: SourceIdentities, moved: bool) -> str | None:
    """Why the source shards a finished unit read are not the bytes it converted (None: they are;
    ``SourceIdentities.change`` decides, reading a shard only when its metadata or folder changed)."""
    recorded = rec.get("sources") if isinstance(rec, dict) else None
    if not isinstance(recorded, dict):
        return "no source identity recorded (converted by an earlier colitools)"
    for shard in unit.shards:
        why = identities.change(shard, recorded.get(shard), moved)
        if why is not None:
            return f"source shard {shard} changed since it was converted ({why})"
    return None


def _config_changes(old: dict[str, Any], fresh: dict[str, Any], shown: int = 3) -> str:
    """The keys of the source ``config.json`` whose values differ between the recorded conversion and this run
    (``"num_hidden_layers": 2, now 3``), at most ``shown`` of them; "" when the ledger recorded no config (an
    earlier colitools) or it is the same."""
    if not isinstance(old.get("source_config"), dict):
        return ""

    def whole(record: dict[str, Any]) -> dict[str, Any]:
        return {**record["source_config"], "quantization_config": record.get("source_quantization_config")}

    diffs = _differences(whole(old), whole(fresh), "")
    more = f"; and {len(diffs) - shown} more" if len(diffs) > shown else ""
    return "; ".join(diffs[:shown]) + more


def _differences(before: Any, now: Any, where: str) -> list[str]:
    """``key.path: old value, now new value`` of every leaf that differs (objects compared key by key)."""
    if isinstance(before, dict) and isinstance(now, dict):
        keys = list(before) + [k for k in now if k not in before]
        return [
            d for k in keys for d in _differences(before.get(k, _ABSENT), now.get(k, _ABSENT), f"{where}{k}.")
        ]
    if before == now:
        return []
    return [f"{where.rstrip('.')}: {_shown(before)}, now {_shown(now)}"]


_ABSENT = object()


def _shown(value: Any, limit: int = 40) -> str:
    if value is _ABSENT:
        return "absent"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show_source(src: Any) -> str:
    if isinstance(src, dict):
        if src.get("kind") == "hf":
            return f"{src.get('repo_id')}@{src.get('revision')}"
        return str(src.get("path"))
    return repr(src)
