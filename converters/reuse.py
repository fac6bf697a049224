"""Converting again into an existing output (``convert --replace``, docs/FORMATS.md §10 "Converting again").

Every finished unit records, per tensor it wrote, a **reuse key** (``unit_keys``): a sha256 over what decides the
tensor's bytes: the job as planned (its source tensor: name, shard, dtype, shape, the slab or slice it is cut
from, its FP8 scale or native companions; its role, target format, group size, quantizer, the loader's
spelling; its output name and shape), the file kind it lands in (a main shard, the planar layout, the planar
sidecar: what ``--layout`` changes of a tensor's bytes), the target, the source's FP8 block, the content identity of the source shards it reads
(size and fingerprint of a local file, size and sha256 of a Hub file: ``content_identity``) and the colitools
version. The encoders are deterministic, so two tensors with the same key have the same bytes.

``--replace`` into a folder holding another conversion of the same source (another budget, recipe, quantizer)
keeps the previous ledger's records as the **donor** (``DONOR_FILE``, written before the new ledger replaces the
old one) and converts every unit with the new options, but a tensor whose key the donor holds is copied byte for
byte from the donor's file instead of being read and encoded (``plan_unit`` decides per output file, in the main
process; the writer streams the donor file: converters/donor_copy.py). The donor file is read once, front to back, and its
sha256 checked against the donor's record before the new file is published; a mismatch (a file replaced since)
converts that unit again without the donor. The new output is published as a fresh one is: the index and
``complete`` at the end; the old index is removed before the first new file is written (``unpublish``).

Disk: the files are replaced in place, one unit at a time (each new file is written under a temporary name beside
the old one, then renamed over it), so the peak is the larger of the two outputs plus the units in flight, not two
outputs. The price: the previous output is given up when the re-conversion starts; a killed re-conversion is a
resumable conversion with the new options (its donor record kept, its units already written recorded), never the
old output and never a mix marked complete. Donor files no planned file replaced are deleted at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import colitools
from colitools.converters.donor_copy import Copying as Copying  # re-exported: the unit writer's names
from colitools.converters.donor_copy import DonorStream as DonorStream
from colitools.converters.donor_copy import FileCopy
from colitools.converters.donor_copy import KeptFile as KeptFile
from colitools.converters.donor_copy import _DonorChanged as _DonorChanged
from colitools.converters.planner import ConversionPlan, OutputFile, OutputGroup, TensorJob, Unit
from colitools.formats import planar_sidecar as sidecar
from colitools.formats.atomic import write_json_atomic
from colitools.formats.error_stats import SUM_ORDER
from colitools.formats.errors import SafetensorsError
from colitools.formats.filenames import INDEX_FILE
from colitools.formats.jsonfile import load_json_object
from colitools.formats.safetensors_io import SafetensorsWriter, read_header

DONOR_FILE = ".colitools-donor.json"  # the previous conversion's records while a --replace runs
DONOR_VERSION = 1
KEY_VERSION = 1  # bump when what decides a tensor's bytes gains a field the key does not hold


# ------------------------------------------------------------------------------------------------- keys
def _canon(obj: Any) -> Any:
    """``obj`` as plain JSON values, the same on every run: dataclasses field by field, enums by value, classes
    and functions by their qualified name."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _canon(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return _canon(obj.value)
    if isinstance(obj, (list, tuple)):
        return [_canon(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _canon(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, type) or callable(obj):
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    text = repr(obj)
    if " at 0x" in text:  # pragma: no cover - a new field type: a key must never hold an address
        raise TypeError(f"reuse key: {type(obj).__name__} has no stable form")
    return text


def content_identity(recorded: Mapping[str, Any] | None) -> Any:
    """What of a shard's recorded identity (the ledger's) says its bytes: size and fingerprint (local) or
    size and sha256 (Hub); a record with neither (an earlier colitools: size and times) as it is."""
    if not isinstance(recorded, Mapping):
        return recorded
    for content in ("fingerprint", "sha256"):
        if content in recorded:
            return {"size": recorded.get("size"), content: recorded[content]}
    return dict(recorded)


def _recorded(identities: Any, shard: str) -> Any:
    """The identity the ledger records for ``shard`` (``SourceIdentities.recorded``, or a plain mapping)."""
    recorded = getattr(identities, "recorded", None)
    return recorded(shard) if callable(recorded) else identities.get(shard)


def _file_kind(f: OutputFile) -> str:
    return "sidecar" if f.is_sidecar else "planar" if f.planar else "main"


def _canon_job(job: TensorJob, targets: dict[int, Any]) -> dict[str, Any]:
    """``_canon(job)``, its target's form computed once per target object (a plan shares a few among all its
    jobs; ``targets``: id -> form, for objects alive meanwhile)."""
    out = {}
    for f in dataclasses.fields(job):
        value = getattr(job, f.name)
        if f.name == "target":
            out[f.name] = targets[id(value)] if id(value) in targets else targets.setdefault(id(value), _canon(value))
        else:
            out[f.name] = _canon(value)
    return out


def job_key(job: TensorJob, f: OutputFile, plan: ConversionPlan, identities: Any,
            targets: dict[int, Any] | None = None) -> str:  # fmt: skip
    """The reuse key of ``job`` written into ``f`` (module docstring), 32 hex digits."""
    fp8 = plan.inventory.fp8
    blob = {
        "v": [KEY_VERSION, colitools.__version__],
        "target": plan.recipe.target.name,
        "file": _file_kind(f),
        "block": list(fp8.block) if fp8 else None,
        "sources": {s: content_identity(_recorded(identities, s)) for s in sorted(job.shards)},
        "job": _canon_job(job, {} if targets is None else targets),
    }
    text = json.dumps(blob, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def unit_keys(unit: Unit, plan: ConversionPlan, identities: Any) -> dict[str, str]:
    """Output tensor name -> reuse key, for every job of ``unit`` (what its ledger record keeps as ``keys``)."""
    targets: dict[int, Any] = {}
    return {j.out_name: job_key(j, f, plan, identities, targets) for f in unit.files for j in f.jobs}


# ------------------------------------------------------------------------------------------ donor record
def replaces(recorded: Mapping[str, Any], fresh: Mapping[str, Any]) -> bool:
    """Whether a ``--replace`` run replaces the ``recorded`` ledger: it holds another recipe or plan (the same
    recipe and plan are resumed as always)."""
    files = (recorded.get("plan") or {}).get("files") if isinstance(recorded.get("plan"), dict) else None
    return recorded.get("recipe_fingerprint") != fresh["recipe_fingerprint"] or files != fresh["plan"]["files"]


def as_recorded(fresh: dict[str, Any], recorded: Mapping[str, Any]) -> dict[str, Any]:
    """``fresh`` (a new ledger) with the recorded recipe and plan: what the ledger's checks compare when only
    the source must be the same."""
    plan = recorded.get("plan") if isinstance(recorded.get("plan"), dict) else {}
    return {**fresh, "recipe_fingerprint": recorded.get("recipe_fingerprint"), "plan": {**fresh["plan"], "files": plan.get("files")}}


def keep_donor(outdir: Path, previous: Mapping[str, Any]) -> None:
    """Record the ledger about to be replaced (``previous``: its JSON) as the donor, atomically, before the new
    ledger is written: its finished units first, then the records of an earlier donor (a re-conversion replaced
    before it finished) whose files none of them names."""
    records = [_record(u) for u in (previous.get("units") or {}).values() if isinstance(u, dict)]
    records = [r for r in records if r is not None]
    named = {f["name"] for r in records for f in r["files"]}
    for r in load_donor(outdir):
        if not any(f["name"] in named for f in r["files"]):
            records.append(r)
    write_json_atomic(outdir / DONOR_FILE, {"version": DONOR_VERSION, "records": records})


def _record(unit: Mapping[str, Any]) -> dict[str, Any] | None:
    files, keys = unit.get("files"), unit.get("keys")
    if not isinstance(files, list) or not isinstance(keys, dict) or not keys:
        return None  # converted before reuse keys (an earlier colitools): nothing to copy from it
    if unit.get("errors") and unit.get("error_order") != SUM_ORDER:
        return None  # its figures summed in an earlier order (FORMATS §11): encoded again, so a unit holds one order
    return {"files": files, "keys": keys, "errors": unit.get("errors") or {}}


def load_donor(outdir: Path) -> list[dict[str, Any]]:
    """The donor's records (``keep_donor``); none when there is no donor (or its record is unreadable: then
    nothing is copied, everything is encoded)."""
    path = outdir / DONOR_FILE
    if not path.is_file():
        return []
    try:
        data = load_json_object(path)
    except Exception:  # noqa: BLE001 - a damaged donor record only costs the copies
        return []
    records = data.get("records") if data.get("version") == DONOR_VERSION else None
    return [r for r in records or [] if isinstance(r, dict) and _well_formed(r)]


def _well_formed(r: dict) -> bool:
    files = r.get("files")
    return (
        isinstance(files, list)
        and all(isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("sha256"), str)
                and type(f.get("size")) is int for f in files)
        and isinstance(r.get("keys"), dict) and isinstance(r.get("errors"), dict)
    )  # fmt: skip


def unpublish(outdir: Path) -> None:
    """The previous output's index removed (a reader sees no model until the new one is complete)."""
    with contextlib.suppress(FileNotFoundError):
        (outdir / INDEX_FILE).unlink()


def finish(outdir: Path, plan: ConversionPlan) -> list[str]:
    """Before the new output is marked complete: delete the donor's files that no planned file replaced, then
    its record. Returns the names deleted."""
    planned = {f.name for f in plan.files}
    gone = []
    for r in load_donor(outdir):
        for f in r["files"]:
            name = f["name"]
            if name not in planned and _inside(outdir, name) and (outdir / name).is_file():
                (outdir / name).unlink()
                gone.append(name)
    folder = sidecar.sidecar_dir(outdir)
    if gone and not plan.sidecar_files and folder.is_dir():  # a planar output converted again as pairs
        with contextlib.suppress(FileNotFoundError):
            (folder / sidecar.INDEX_NAME).unlink()
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: nothing foreign is deleted
    with contextlib.suppress(FileNotFoundError):
        (outdir / DONOR_FILE).unlink()
    return gone


def _inside(outdir: Path, name: str) -> bool:
    """A recorded file name that stays inside the output folder (a damaged record never deletes elsewhere)."""
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


# ------------------------------------------------------------------------------------------------ plans
def planned_copies(outdir: Path, replaced: Mapping[str, Any] | None, plan: ConversionPlan, identities: Any,
                   pending: list[Unit]) -> int:  # fmt: skip
    """How many tensors of ``pending`` a run would copy instead of encode (``--dry-run``): from ``replaced``
    (the ledger a ``--replace`` run would keep as the donor) or the donor a re-conversion already kept."""
    records = [r for u in ((replaced or {}).get("units") or {}).values() if isinstance(u, dict) and (r := _record(u))]
    donor = Donor(outdir, records or load_donor(outdir), plan, identities)
    if not donor.records:
        return 0
    return sum(len(c.jobs) for u in pending for c in donor.plan_unit(u).values())


class Donor:
    """The donor of a ``--replace`` conversion: its records by reuse key, its files' headers read on demand."""

    def __init__(self, outdir: Path, records: list[dict[str, Any]], plan: ConversionPlan, identities: Any):
        self.outdir, self.plan, self.identities = outdir, plan, identities
        self._by_key: dict[str, tuple[int, str]] = {}
        for i, r in enumerate(records):
            for name, key in r["keys"].items():
                self._by_key.setdefault(key, (i, name))
        self.records = records
        self._headers: dict[str, Any] = {}

    @classmethod
    def open(cls, outdir: Path, plan: ConversionPlan, identities: Any) -> Donor | None:
        records = load_donor(outdir)
        return cls(outdir, records, plan, identities) if records else None

    def _header(self, name: str, size: int):
        if name not in self._headers:
            path = self.outdir / name
            try:
                ok = _inside(self.outdir, name) and path.is_file() and path.stat().st_size == size
                self._headers[name] = read_header(path).tensors if ok else None
            except (OSError, SafetensorsError):
                self._headers[name] = None
        return self._headers[name]

    def plan_unit(self, unit: Unit) -> dict[str, FileCopy]:
        """New file name -> what it copies from the donor (files that copy nothing are absent)."""
        out = {}
        for f in unit.files:
            copy = self._plan_file(f)
            if copy is not None:
                out[f.name] = copy
        return out

    def _plan_file(self, f: OutputFile) -> FileCopy | None:
        hits: dict[str, tuple[int, str]] = {}
        targets: dict[int, Any] = {}
        for j in f.jobs:
            hit = self._by_key.get(job_key(j, f, self.plan, self.identities, targets))
            if hit is not None and hit[1] == j.out_name:
                hits[j.out_name] = hit
        if not hits:
            return None
        where = Counter()  # the donor file holding each hit's weight: the most common one is used
        for j in f.jobs:
            if j.out_name in hits:
                for df in self.records[hits[j.out_name][0]]["files"]:
                    header = self._header(df["name"], df["size"])
                    if header is not None and j.weight_entry[0] in header:
                        where[(df["name"], df["size"], df["sha256"])] += 1
        if not where:
            return None
        (name, size, sha), _ = where.most_common(1)[0]
        header = self._header(name, size)
        ours = {n for n, (i, _) in hits.items() if any(df["name"] == name for df in self.records[i]["files"])}
        jobs = _copyable(f, ours, header)  # only tensors whose key that file's own record holds
        if not jobs:
            return None
        errors = {}
        for n in jobs:
            e = self.records[hits[n][0]]["errors"].get(n)
            if e is not None:
                errors[n] = e
        return FileCopy(name, size, sha, frozenset(jobs), errors, self._same_file(f, name, size, jobs))

    def _same_file(self, f: OutputFile, name: str, size: int, jobs: set[str]) -> bool:
        """The donor file ``name`` is ``f`` as a fresh conversion writes it: the same name and size, every job
        copied, the same header bytes (names, dtypes, shapes, offsets, metadata). Main shards only."""
        if f.is_sidecar or name != f.name or size != f.size or jobs != {j.out_name for j in f.jobs}:
            return False
        want = SafetensorsWriter.header_bytes(f.entries, f.metadata)
        try:
            with open(self.outdir / name, "rb") as fh:
                return fh.read(len(want)) == want
        except OSError:
            return False


def _group_entries(f: OutputFile, g: OutputGroup) -> list[tuple[str, str, tuple[int, ...]]]:
    return g.sidecar_entries if f.is_sidecar else g.entries


def _owners(f: OutputFile) -> list[tuple[tuple[str, str, tuple[int, ...]], tuple[str, ...]]]:
    """Each entry of ``f`` in file order with the jobs it is made of (one job's weight or scale; a stack's:
    every job of its group)."""
    out = []
    for g in f.groups:
        if g.stacks:
            jobs = tuple(j.out_name for j in g.jobs)
            out += [(e, jobs) for e in _group_entries(f, g)]
            continue
        owner = {}
        for j in g.jobs:
            owner[j.weight_entry[0]] = (j.out_name,)
            if j.scale_entry is not None:
                owner[j.scale_entry[0]] = (j.out_name,)
        out += [(e, owner[e[0]]) for e in _group_entries(f, g)]
    return out


def _copyable(f: OutputFile, hits: set[str], header: Mapping[str, Any]) -> set[str]:
    """The jobs of ``f`` copied from the donor file of ``header``: each a hit whose every entry is in the donor
    with the same dtype and shape, at offsets that rise in ``f``'s order (the donor is read front to back once);
    a stack's jobs only all together."""
    owners = _owners(f)
    ok = set(hits)
    for (name, dtype, shape), jobs in owners:
        info = header.get(name)
        if info is None or info.dtype != dtype or tuple(info.shape) != tuple(shape):
            ok -= set(jobs)
        elif not set(jobs) <= hits:
            ok -= set(jobs)
    last = 0
    for (name, _, _), jobs in owners:
        if not set(jobs) <= ok:
            continue
        info = header[name]
        if info.begin < last:
            ok -= set(jobs)
        else:
            last = info.end
    return ok
