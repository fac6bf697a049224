"""The options of ``colitools convert`` and the summary it returns (library and CLI share both)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colitools.converters.allocation import parse_size
from colitools.converters.diskfloor import GB, gb
from colitools.converters.parts import Part, parse_part
from colitools.converters.recipe import Budget, ExpertsChoice, Recipe, Role, choose_experts, classify
from colitools.formats import targets
from colitools.formats.errors import ConvertError, ParameterError
from colitools.formats.format_names import option_group_size, role_formats_line
from colitools.formats.layouts import QPACK

if TYPE_CHECKING:
    from colitools.converters.inventory import Inventory

DEFAULT_MIN_FREE_GB = 5.0
# bench/README.md: download_ahead.py (200 MB/s link, 25 MB/s per connection: 12 fill it with slack for each
# request's gap, 8 only just), download.py (x6.0 at 30 MB/s per connection, x7.2 at 12)
DEFAULT_DOWNLOAD_STREAMS = 12
MAX_DOWNLOAD_STREAMS = 64


@dataclass(frozen=True)
class ConvertOptions:
    """Everything ``convert`` can be told. Format options are recipe names (docs/FORMATS.md §5); None = default
    (the target's, else the recipe's). ``target`` is given by name or as the object; it is resolved here, once
    (an unknown name is a TargetRefused), and travels as the ``Target`` (formats/targets/)."""

    experts: str | None = None
    dense: str | None = None
    embed: str | None = None
    mtp: str | None = None
    experts_down: str | None = None  # --experts-down: the routed experts' down projections (None: ``experts``)
    group_size: int | None = None
    layout: str | None = None  # a --layout value (formats/layouts.py); None: the target's, else pairs
    towers: str | None = None  # --towers keep | drop (FORMATS §5 rule 1); None: the target's, else keep
    target: targets.Target | str = targets.GENERIC  # --target (formats/targets/): whose loader reads it
    quantizer: str = "rtn"  # --quantizer rtn | mse (FORMATS §11; formats/quantizers.py)
    target_size: int | str | None = None  # --target-size (FORMATS §12): bytes, or a size such as 25GiB
    target_bpw: float | None = None  # --target-bpw (FORMATS §12): bits per weight
    usage: str | None = None  # --usage: a routing history weighting a budget's routed experts
    min_free_gb: float = DEFAULT_MIN_FREE_GB
    on_low_disk: str = "wait"
    keep_source: bool = False
    workers: int = 1
    download_streams: int = DEFAULT_DOWNLOAD_STREAMS  # --download-streams: Range streams per downloaded file
    replace: bool = False  # --replace: into a folder holding another conversion, copying its unchanged tensors
    upload_repo: str | None = None  # --upload-repo: the Hub repo the output goes to (checked before any work)
    stream_upload: bool = False  # --stream-upload: each unit's files once recorded (converters/stream_upload.py)
    token: str | None = None
    revision: str | None = None
    dry_run: bool = False
    progress: bool | None = None  # tqdm bars; None = only when stderr is a terminal
    part: Part | str | None = None  # --part K/N: this share of the units only (converters/parts.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "part", parse_part(self.part))  # ParameterError for a malformed K/N
        if not math.isfinite(self.min_free_gb) or self.min_free_gb < 0:
            raise ParameterError(f"`min_free_gb={self.min_free_gb:g}`: must be a number >= 0")
        if self.workers < 1:
            raise ParameterError(f"`workers={self.workers}`: must be at least 1")
        if not 1 <= self.download_streams <= MAX_DOWNLOAD_STREAMS:
            raise ParameterError(
                f"`download_streams={self.download_streams}`: must be between 1 and {MAX_DOWNLOAD_STREAMS}"
            )
        if self.stream_upload and self.upload_repo is None:
            raise ParameterError("`stream_upload` sends the output to `upload_repo`: give the repo")
        if isinstance(self.target, str):
            object.__setattr__(self, "target", targets.by_name(self.target))  # TargetRefused for an unknown name
        self._check_budget()

    def _check_budget(self) -> None:
        """A size budget (FORMATS §12): one of ``target_size`` / ``target_bpw``, which replace the per-role format
        options; ``usage`` only with one. ParameterError (one line) otherwise."""
        if self.target_size is not None:
            object.__setattr__(self, "target_size", parse_size(self.target_size))
        if self.target_size is not None and self.target_bpw is not None:
            raise ParameterError("`target_size` and `target_bpw` are two budgets: give one")
        which = "target_size" if self.target_size is not None else "target_bpw"
        if self.target_bpw is not None and not (math.isfinite(self.target_bpw) and 0 < self.target_bpw <= 32):
            raise ParameterError(f"`target_bpw={self.target_bpw:g}`: bits per weight in (0, 32]")
        if self.target_size is None and self.target_bpw is None:
            if self.usage is not None:
                raise ParameterError("`usage` weights a size budget's routed experts: give `target_size` or `target_bpw`")
            return
        given = [f"`{k}={getattr(self, k)}`" for k in ("experts", "dense", "embed", "mtp", "group_size")
                 if getattr(self, k) is not None]  # fmt: skip
        if given:
            raise ParameterError(f"`{which}` chooses every tensor's format: it replaces {', '.join(given)}")

    def budget(self) -> Budget | None:
        """The size budget asked for (its allocation empty: ``converters/budget.py`` fills it), or None."""
        if self.target_size is None and self.target_bpw is None:
            return None
        usage = None
        if self.usage is not None:
            try:
                usage = hashlib.sha256(Path(self.usage).read_bytes()).hexdigest()
            except OSError as exc:
                raise ParameterError(f"`usage={self.usage}`: {exc.strerror or exc}") from None
        return Budget(self.target_size, self.target_bpw, usage)

    def recipe(self) -> Recipe:
        recipe = Recipe.from_options(
            self.experts, self.dense, self.embed, self.mtp, self.group_size, self.layout, self.towers, self.target,
            self.quantizer, self.experts_down,
        )
        if self.part is not None and recipe.layout == QPACK.option:  # before any work
            raise ParameterError(
                "`part` with `layout=qpack`: merge does not write a QPACK container's manifest yet; convert it on "
                "one machine"
            )
        budget = self.budget()
        if budget is not None:
            recipe = replace(recipe, budget=budget)
        if self.group_size is not None and not any(
            option_group_size(v) for v in (recipe.experts, recipe.dense, recipe.embed, recipe.mtp)
        ):  # int3-g64 and the row formats have no group size to set: never ignore the option silently
            chosen = ", ".join(f"`{k}={getattr(recipe, k)}`" for k in ("experts", "dense", "embed", "mtp"))
            raise ConvertError(
                f"`group_size={self.group_size}` applies to int4-g* formats, and no option uses one ({chosen})"
            )
        return recipe

    def source_recipe(self, inventory: Inventory) -> tuple[Recipe, ExpertsChoice]:
        """The recipe for this source: ``experts`` defaults to ``native`` where a registered format holds the
        routed experts' source encoding exactly and the target reads it (``recipe.choose_experts``)."""
        nhl = inventory.num_hidden_layers
        natives = set()
        for name, src in inventory.tensors.items():
            q = src.quant
            if q is None or classify(name, len(src.shape), nhl, "F32") is not Role.EXPERT:
                continue
            form = q.encoding.native_form(src.shape[-2], src.shape[-1], group=q.group, exact=q.exact,
                                          fused=len(src.shape) == 3)  # fmt: skip
            natives.add((q.encoding, form))
        given = self.experts is not None or self.group_size is not None
        return choose_experts(self.recipe(), given=given, natives=sorted(natives, key=lambda n: n[0].kind))

    @property
    def min_free_bytes(self) -> int:
        return int(self.min_free_gb * GB)


@dataclass
class ConvertSummary:
    """What a conversion did (or, with ``dry_run``, would do). ``to_dict`` is the ``--json`` output."""

    source: dict[str, str]
    outdir: str
    dry_run: bool
    recipe: dict[str, str]
    units_total: int
    units_skipped: int = 0  # finished by an earlier run
    units_converted: int = 0
    tensors_copied: int = 0  # --replace: tensors copied from the previous output instead of encoded (reuse.py)
    units_redone: list[str] = field(default_factory=list)  # recorded, but files damaged or sources changed
    redo_reasons: dict[str, str] = field(default_factory=dict)  # redone unit -> why
    # source shard -> what changed (folder, mtime, ctime) and its content fingerprint still the recorded one
    sources_rechecked: dict[str, str] = field(default_factory=dict)
    bytes_in: int = 0  # source tensor bytes read by this run
    bytes_out: int = 0  # output bytes written by this run
    total_out_bytes: int = 0  # all output shards
    peak_disk_bytes: int = 0  # planned peak on the output volume
    format_totals: dict[str, dict[str, int]] = field(default_factory=dict)
    formats_per_role: dict[str, dict[str, int]] = field(default_factory=dict)
    dropped_towers: list[str] = field(default_factory=list)  # --towers drop: tensors left out
    fallbacks: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. `colitools run` will not execute this model
    experts_choice: dict[str, Any] = field(default_factory=dict)  # recipe.ExpertsChoice.as_dict()
    budget: dict[str, Any] | None = None  # a size budget's allocation (converters/budget.py report)
    disk_waits: int = 0
    wall_seconds: float = 0.0
    upload: dict[str, Any] | None = None  # --stream-upload: the upload's report (publish.UploadReport.to_json)
    plan: dict[str, Any] | None = None  # the whole plan, for --dry-run
    part: dict[str, Any] | None = None  # --part K/N: its units, source bytes and shards (converters/parts.py)

    @property
    def gb_per_s(self) -> float:
        return self.bytes_in / GB / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gb_per_s"] = round(self.gb_per_s, 4)
        d["wall_seconds"] = round(self.wall_seconds, 3)
        if d["plan"] is None:
            del d["plan"]
        if d["part"] is None:
            del d["part"]
        if d["budget"] is None:
            del d["budget"]
        elif not self.dry_run:  # the per-tensor formats: in --dry-run's JSON and in colitools.json
            d["budget"] = {k: v for k, v in d["budget"].items() if k != "tensors"}
        if d["upload"] is None:
            del d["upload"]
        return d

    def text(self) -> str:
        """The human summary (one block)."""
        src = self.source.get("path") or f"{self.source.get('repo_id')}@{self.source.get('revision')}"
        lines = []
        if self.dry_run:
            lines.append(f"plan: {self.units_total} units from {src} -> {self.outdir}")
            for u in (self.plan or {}).get("units", []):
                lines.append(
                    f"  {u['unit']:<28} in {gb(u['in_bytes']):>10}  out {gb(u['out_bytes']):>10}  "
                    f"shards {', '.join(u['shards'])}  -> {', '.join(u['files'])}"
                    + ("  (done, skipped)" if u.get("finished") else "")
                )
            if self.units_skipped or self.units_redone:
                lines.append(
                    f"{self.units_skipped} of {self.units_total} units already done in {self.outdir} (skipped), "
                    f"{self.units_total - self.units_skipped} to convert"
                )
            p = self.plan or {}
            # the units still to convert, as --json's bytes_in / bytes_out; the whole plan's when some are done
            whole = (f" (the whole plan: in {gb(p.get('in_bytes', 0))}, out {gb(p.get('out_bytes', 0))})"
                     if (self.bytes_in, self.bytes_out) != (p.get("in_bytes", 0), p.get("out_bytes", 0)) else "")  # fmt: skip
            lines.append(f"bytes in {gb(self.bytes_in)}, out {gb(self.bytes_out)}{whole}, "
                         f"peak disk {gb(self.peak_disk_bytes)}")  # fmt: skip
            if self.tensors_copied:
                lines.append(f"{self.tensors_copied} tensors would be copied from the previous output, not encoded")
        else:
            done = f"converted {self.units_converted} of {self.units_total} units"
            if self.units_skipped:
                done += f" ({self.units_skipped} already done)"
            if self.tensors_copied:
                done += f", {self.tensors_copied} tensors copied from the previous output"
            lines.append(f"{done}: {src} -> {self.outdir}")
            lines.append(
                f"bytes in {gb(self.bytes_in)}, out {gb(self.bytes_out)} (output total {gb(self.total_out_bytes)}), "
                f"wall {self.wall_seconds:.1f} s, {self.gb_per_s:.3f} GB/s"
            )
        if self.part is not None:
            p = self.part
            lines.append(f"part {p['part']}: {p['units']} of the plan's {self.units_total} units, in "
                         f"{gb(p['in_bytes'])}, source shards {', '.join(p['shards']) or 'none'}")  # fmt: skip
        if self.experts_choice.get("line"):
            lines.append(self.experts_choice["line"])
        if self.budget is not None:
            from colitools.converters.budget import report_lines

            lines.extend(report_lines(self.budget))
        lines.append("formats per role:")
        lines.extend(role_formats_line(role, fmts) for role, fmts in self.formats_per_role.items())
        if self.dropped_towers:
            lines.append(f"towers dropped: {len(self.dropped_towers)} tensors (listed in the manifest)")
        lines.append("formats: " + "; ".join(
            f"{f} {t['tensors']} tensors {gb(t['bytes'])}" for f, t in self.format_totals.items()))  # fmt: skip
        lines.append(f"fallbacks: {len(self.fallbacks)}")
        for fb in self.fallbacks:
            lines.append(f"  {fb['tensor']}: {fb['requested']} -> {fb['written']} ({fb['reason']})")
        for unit in self.units_redone:
            verb = "to redo" if self.dry_run else "redone"
            lines.append(f"{verb}: {unit} ({self.redo_reasons.get(unit, 'its files were damaged')})")
        if self.sources_rechecked:
            (shard, what), more = next(iter(self.sources_rechecked.items())), len(self.sources_rechecked) - 1
            lines.append(f"source shards re-checked by content, the same bytes (their units kept): {shard} ({what})"
                         + (f" and {more} more" if more else ""))  # fmt: skip
        if self.disk_waits:
            lines.append(f"waited for disk space {self.disk_waits} time(s)")
        return "\n".join(lines)
