"""``colitools verify quality OUTPUT [--source SRC]``: what a conversion lost, tensor by tensor, at any size.

Every figure is ``formats/error_stats.ErrorStats`` (FORMATS §11: sums in a fixed order over the source's decoded
values ``w`` and the output's decoded values ``w'``), summed per role, per layer, per format and over the whole model
(sums add; no ratio is ever averaged).

* With ``source`` (a local folder or a Hub repo id, opened as ``convert`` opens it: ``sources.open_source``) the
  figures are recomputed: the conversion is planned again from the source with the recipe the manifest recorded
  (``runner.load_plan``: the same inventory, native pairing, expert stacks split per expert, target renames), and
  each planned tensor's source values are read and decoded to float32 as the unit writer reads them
  (``unit_writer._source_values`` / ``_dequant``, a native encoding's ``decode``), its output tensor decoded by
  the format registry's decoders (``kernels.decode``, the reference where a format has no kernel; a target's
  merged blob or fused stack by its resolved ``parts``; the planar sidecar's codes reordered to pairs:
  ``quality_output.py``). Whole tensors on the converter's encoder threads, in order, a bounded amount ahead,
  big plain tensors by float32 row slabs: memory does not grow with the model. A tensor whose output the
  resolver leaves unresolved, or that a target stored in a stack the container gives no parts for (Inkling's
  shared-expert stacks), is listed as not compared, never guessed.
* Without it, the figures ``convert`` recorded in the manifest are reported (``units[...]["errors"]``:
  ``{tensor: [n, sse, ssw, ssq, dot, max_abs]}``); with both, every recomputed tensor is compared with its
  recorded figures (``agree``) and each disagreement is listed (the CLI exits 4); a float tensor written in the
  source's own bytes (a tower) is compared (0) but needs no record.

A source that is not this output's source (a tensor the output does not hold, another shape) is a VerifyError
naming the tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from colitools.converters.manifest import Manifest
from colitools.formats import names
from colitools.formats.atomic import check_png_path
from colitools.formats.error_stats import REL_BOUND, SUM_ORDER, TINY, ErrorStats, total
from colitools.formats.errors import ColitoolsError, ManifestError, VerifyError
from colitools.formats.filenames import MANIFEST_FILE
from colitools.formats.inspect import incomplete_conversion, open_model
from colitools.verify.quality_output import OutputWeight, OutputWeights, TensorQuality

__all__ = ["Disagreement", "QualityReport", "TensorQuality", "agree", "weight_quality"]

SCHEMA = "colitools.verify.quality/1"
# Recorded and recomputed sums agree when they differ by at most REL_TOL of the larger one (plus ABS_TOL of the
# tensor's ||w||^2 + ||w'||^2, for a sum near zero). Both follow FORMATS §11's order, whose float32 block sums are
# the same bit for bit wherever computed (rows are rows in both); only float64 additions differ in order (a tensor
# cut into row slabs of another size, chunks): below ~1e-13 of the sum even for 1e9 terms, while changing one
# element of a 10-million-element tensor moves its sse by ~1e-7. ``n`` and ``max_abs`` (a maximum: no rounding)
# must be equal.
REL_TOL = 1e-9
ABS_TOL = 1e-15
# A unit recorded without ``error_order`` (colitools before FORMATS §11's order: float64 sums, and the maximum in
# float64 on the numpy path) agrees within the order's own bound of the exact sums, twice over
OLD_ORDER_REL_TOL = 2 * REL_BOUND
OLD_ORDER_MAX_REL = 2.0**-23
SLAB_BYTES = 16 << 20  # float32 bytes per row slab of a big plain tensor
# Threads beyond one per core reading and comparing tensors of a unit whose tensors are compared a float32 slab
# at a time (``_small``): direct reads have no kernel readahead, so while one thread waits on the drive another
# keeps each core busy (bench/README.md ``quality.py``)
READ_THREADS = 2
_BF16 = np.dtype(ml_dtypes.bfloat16)


# ------------------------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class Disagreement:
    """A tensor whose recorded figures are not the recomputed ones (either may be None: not there)."""

    name: str
    recorded: ErrorStats | None
    recomputed: ErrorStats | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "why": self.why,
            "recorded": self.recorded.to_json() if self.recorded else None,
            "recomputed": self.recomputed.to_json() if self.recomputed else None,
        }


@dataclass
class QualityReport:
    """Outcome of ``weight_quality``. ``figures`` says where the figures come from: ``recomputed`` (from the
    source) or ``recorded`` (the manifest's). ``ok`` is False only when recorded and recomputed disagree."""

    path: str
    source: str | None
    figures: str
    tensors: list[TensorQuality] = field(default_factory=list)
    not_compared: list[tuple[str, str]] = field(default_factory=list)  # (tensor, why)
    copied: set[str] = field(
        default_factory=set
    )  # float tensors written in the source's bytes (never recorded)
    recorded: int = 0  # tensors the manifest has figures for
    disagreements: list[Disagreement] = field(default_factory=list)
    quantizer: str | None = None  # the recipe's ``quantizer`` as recorded (None: not recorded)
    bytes_read: int = 0  # source and output tensor bytes read (recomputed)
    seconds: float = 0.0
    plot: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.disagreements

    @property
    def whole(self) -> ErrorStats:
        return total(t.stats for t in self.tensors)

    def by(self, key: Callable[[TensorQuality], Any]) -> dict[Any, ErrorStats]:
        """The figures summed per ``key(tensor)``, keys in first-seen order."""
        sums: dict[Any, list[ErrorStats]] = defaultdict(list)
        for t in self.tensors:
            sums[key(t)].append(t.stats)
        return {k: total(v) for k, v in sums.items()}

    @property
    def per_role(self) -> dict[str, ErrorStats]:
        order = {r: i for i, r in enumerate(names.DETAIL_ROLES)}
        found = self.by(lambda t: t.role)
        return {r: found[r] for r in sorted(found, key=lambda r: (order.get(r, 99), r))}

    @property
    def per_format(self) -> dict[str, ErrorStats]:
        found = self.by(lambda t: t.format)
        return {f: found[f] for f in sorted(found)}

    @property
    def per_layer(self) -> dict[int | None, ErrorStats]:
        found = self.by(lambda t: t.layer)
        return {k: found[k] for k in sorted(found, key=lambda k: (k is not None, k or 0))}

    def per_role_layer_format(self) -> dict[tuple[str, int | None, str], ErrorStats]:
        """The figures of each (role, layer, format): what ``--plot`` draws."""
        return self.by(lambda t: (t.role, t.layer, t.format))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "path": self.path,
            "source": self.source,
            "figures": self.figures,
            "ok": self.ok,
            "quantizer": self.quantizer,
            "tensors_compared": len(self.tensors),
            "whole": self.whole.to_json(),
            "per_role": {r: s.to_json() for r, s in self.per_role.items()},
            "per_format": {f: s.to_json() for f, s in self.per_format.items()},
            "per_layer": {
                ("global" if k is None else str(k)): s.to_json() for k, s in self.per_layer.items()
            },
            "tensors": [t.to_json() for t in self.tensors],
            "not_compared": [{"name": n, "why": w} for n, w in self.not_compared],
            "recorded": self.recorded,
            "disagreements": [d.to_json() for d in self.disagreements],
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
            "plot": self.plot,
            "warnings": list(self.warnings),
        }


def agree(recorded: ErrorStats, recomputed: ErrorStats, old_order: bool = False) -> str | None:
    """None when ``recorded`` and ``recomputed`` are the same figures up to summation order (``REL_TOL``; figures
    recorded before FORMATS §11's order, ``old_order``: ``OLD_ORDER_REL_TOL``), else every figure that differs,
    with both values (``sse 0.0 recorded, 1.0 recomputed; ...``)."""
    differ = []
    if recorded.n != recomputed.n:
        differ.append(f"n {recorded.n} recorded, {recomputed.n} recomputed")
    scale = ABS_TOL * (abs(recomputed.ssw) + abs(recomputed.ssq)) + (recomputed.n * TINY if old_order else 0.0)
    rel = OLD_ORDER_REL_TOL if old_order else REL_TOL
    for key in ("sse", "ssw", "ssq", "dot"):
        a, b = getattr(recorded, key), getattr(recomputed, key)
        if not abs(a - b) <= rel * max(abs(a), abs(b)) + scale:  # (a NaN never agrees)
            differ.append(f"{key} {a!r} recorded, {b!r} recomputed")
    if old_order and abs(recorded.max_abs - recomputed.max_abs) <= OLD_ORDER_MAX_REL * recomputed.max_abs:
        pass  # the old numpy path's float64 |d| against the float32 one
    elif recorded.max_abs != recomputed.max_abs:  # a maximum: no rounding to tolerate
        differ.append(f"max_abs {recorded.max_abs!r} recorded, {recomputed.max_abs!r} recomputed")
    return "; ".join(differ) or None


# ------------------------------------------------------------------------------------------ the entry point
def weight_quality(
    output: str | os.PathLike[str],
    source: str | None = None,
    *,
    revision: str | None = None,
    token: str | None = None,
    plot: str | os.PathLike[str] | None = None,
    progress: bool = False,
    workdir: str | os.PathLike[str] | None = None,
) -> QualityReport:
    """The weight-level quality of the conversion in ``output`` (module docstring): recomputed from ``source``
    when given, else the figures its manifest recorded; ``plot``: also draw error per layer into that PNG.

    ``revision`` / ``token`` are a Hub source's (default revision: the commit the manifest recorded, when
    ``source`` is the recorded repo). Shards a Hub source downloads go to ``workdir`` (default: a temporary
    folder) and are deleted once no later tensor needs them. VerifyError (one line) when the folder is no
    complete colitools conversion, when the source is not its source, or, without ``source``, when the manifest
    recorded no figures."""
    started = time.monotonic()
    if plot is not None:
        check_png_path(plot)
    root = Path(output)
    manifest = _manifest(root)
    model = open_model(root)
    try:
        weights = OutputWeights(model)
        recorded = _recorded(manifest)
        report = QualityReport(str(root), source, "recomputed" if source is not None else "recorded")
        report.quantizer = (manifest.data.get("recipe") or {}).get("quantizer")
        report.recorded = len(recorded)
        if source is None:
            if not recorded:
                raise VerifyError(
                    f"{root / MANIFEST_FILE}: records no error figures: {root} was converted by a colitools that "
                    "did not record errors; pass the source (`source`) to compute them"
                )
            _from_record(report, weights, recorded)
        else:
            _recompute(report, weights, manifest, source, revision, token, progress, workdir)
            _compare(report, recorded, _old_order(manifest))
    finally:
        for shard in model.shards:
            shard.close()
    if plot is not None:
        from colitools.verify.quality_plot import plot_quality

        plot_quality(report, plot, title=f"{root.name}: relative error per layer ({report.figures})")
        report.plot = str(plot)
    report.seconds = time.monotonic() - started
    return report


def _manifest(root: Path) -> Manifest:
    path = root / MANIFEST_FILE
    if not root.is_dir():
        what = "not a folder" if root.exists() else "no such folder"
        raise VerifyError(f"{root}: {what} (verify quality reads a converted model folder)")
    if not path.is_file():
        raise VerifyError(
            f"{path}: not found: {root} is not a colitools conversion (its manifest names the recipe)"
        )
    try:
        manifest = Manifest.load(path)
    except (OSError, ManifestError) as exc:
        raise VerifyError(f"{path}: unreadable manifest ({exc})") from None
    why = incomplete_conversion(root)
    if why is not None:
        raise VerifyError(why)
    return manifest


def _recorded(manifest: Manifest) -> dict[str, ErrorStats]:
    """Every tensor's recorded figures (``units[key]["errors"]``), checked: six numbers each."""
    out: dict[str, ErrorStats] = {}
    if not isinstance(manifest.units, dict):
        raise VerifyError(f"{MANIFEST_FILE}: units is not an object")
    for key, unit in manifest.units.items():
        errors = unit.get("errors") if isinstance(unit, dict) else None
        if errors is None:
            continue
        if not isinstance(errors, dict):
            raise VerifyError(f"{MANIFEST_FILE}: units[{key!r}].errors is not an object")
        for name, values in errors.items():
            ok = isinstance(values, list) and len(values) == 6 and all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values
            )  # fmt: skip
            if not ok or values[0] != int(values[0]) or values[0] < 0:
                raise VerifyError(
                    f"{MANIFEST_FILE}: units[{key!r}].errors[{name!r}] is not [n, sse, ssw, ssq, dot, max_abs]: "
                    f"{str(values)[:80]}"
                )
            out[name] = ErrorStats(int(values[0]), *(float(v) for v in values[1:]))
    return out


# ---------------------------------------------------------------------------------------- recorded figures
def _from_record(report: QualityReport, weights: OutputWeights, recorded: Mapping[str, ErrorStats]) -> None:
    for name, stats in recorded.items():
        w = weights.find(name)
        if w is None:
            report.warnings.append(
                f"tensor {name}: recorded in {MANIFEST_FILE}, but the output holds no such weight"
            )
            w_role = names.detail_role(name, 2, num_hidden_layers=weights.num_hidden_layers)
            report.tensors.append(TensorQuality(name, w_role, names.parse_name(name).layer, "?", stats))
            continue
        report.tensors.append(weights.quality(w, stats))


def _old_order(manifest: Manifest) -> set[str]:
    """The tensors whose figures a unit recorded without ``error_order`` (before FORMATS §11's order)."""
    return {name for unit in manifest.units.values() if isinstance(unit, dict) and isinstance(unit.get("errors"), dict)
            and unit.get("error_order") != SUM_ORDER for name in unit["errors"]}  # fmt: skip


def _compare(report: QualityReport, recorded: Mapping[str, ErrorStats], old_order: set[str]) -> None:
    """Each recomputed tensor against its recorded figures (when the manifest recorded any)."""
    if not recorded:
        return
    done = {t.name for t in report.tensors}
    skipped = {n for n, _ in report.not_compared}
    for t in report.tensors:
        mine = recorded.get(t.name)
        if mine is None and t.name in report.copied:
            continue  # the source's own bytes: convert records no figures for them (lossless by construction)
        why = "not recorded" if mine is None else agree(mine, t.stats, t.name in old_order)
        if why is not None:
            report.disagreements.append(Disagreement(t.name, mine, t.stats, why))
    for name, stats in recorded.items():
        if name not in done and name not in skipped:
            report.disagreements.append(
                Disagreement(name, stats, None, "recorded, but the source makes no such tensor")
            )


# ---------------------------------------------------------------------------------------- recomputation
def _recompute(report: QualityReport, weights: OutputWeights, manifest: Manifest, spec: str,
               revision: str | None, token: str | None, progress: bool, workdir) -> None:  # fmt: skip
    from colitools.converters.inventory import COPY_DTYPES
    from colitools.converters.runner import load_plan
    from colitools.converters.sources import open_source

    recorded_source = manifest.data.get("source") or {}
    if revision is None and recorded_source.get("kind") == "hf" and recorded_source.get("repo_id") == spec:
        revision = recorded_source.get("revision")  # the commit it was converted from
    with contextlib.ExitStack() as stack:
        work = Path(workdir) if workdir is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="colitools-quality-")))  # fmt: skip
        try:
            src = open_source(spec, revision, token, workdir=work)
        except ColitoolsError as exc:
            raise VerifyError(f"`source`: {exc}") from None
        with contextlib.redirect_stderr(io.StringIO()):  # planning's own note on natively decoded tensors
            plan = load_plan(src, _options(manifest))
        matched = _match(weights, plan, COPY_DTYPES, report)
        _stream(report, weights, src, plan, matched, progress)


def _options(manifest: Manifest):
    """The ``ConvertOptions`` of the recorded recipe (its keys that are options; ``experts`` as chosen, so a
    ``native`` default is planned again as it was)."""
    from colitools.converters.options import ConvertOptions

    recipe = manifest.data.get("recipe")
    if not isinstance(recipe, dict):
        raise VerifyError(f"{MANIFEST_FILE}: no recipe recorded")
    known = {f.name for f in dataclasses.fields(ConvertOptions)}
    given = {k: v for k, v in recipe.items() if k in known and k not in ("dry_run", "progress", "workers")}
    try:
        return ConvertOptions(**given, progress=False, min_free_gb=0.0)
    except (ColitoolsError, TypeError) as exc:
        raise VerifyError(f"{MANIFEST_FILE}: its recipe {recipe} cannot be planned again: {exc}") from None


def _match(weights: OutputWeights, plan, copy_dtypes, report: QualityReport) -> list:
    """``(unit, job, OutputWeight)`` of every planned float weight; VerifyError for a tensor the output does not
    hold as planned (another source). Copied non-float tensors are not weights. Not compared (listed, never
    guessed): a tensor the resolver left unresolved, and one a target stored in a stack the container does not
    describe as parts (``Stack`` of the plan present, its members not readable apart)."""
    stack_of = {
        id(g.jobs[k]): st
        for u in plan.units
        for f in u.files
        for g in f.groups
        for st in g.stacks
        for k in st.members
    }
    out = []
    claimed: set[tuple[str, str | None, int | None]] = set()
    for unit in plan.units:
        for job in unit.jobs:
            if job.target.is_source and job.source.dtype in copy_dtypes:
                continue  # rule 0: an integer tensor copied unchanged
            w = weights.find(job.out_name)
            if w is None:
                _not_found(weights, job, stack_of.get(id(job)), report, claimed)
                continue
            want = (job.O, job.I) if len(job.shape) == 2 else tuple(job.shape)
            if tuple(w.shape) != tuple(want):
                raise VerifyError(
                    f"tensor {job.out_name}: the source makes it {list(want)}, {weights.model.path} holds "
                    f"{list(w.shape)}: `source` is not the source of this conversion"
                )
            if job.target.is_source:
                report.copied.add(job.out_name)
            claimed.add(_key(w))
            out.append((unit, job, w))
    stored = (
        OutputWeight(t.name, t)
        for t in weights.resolved.values()
        if t.kind in ("quantized", "float") and not t.parts
    )
    for w in [*weights.parts.values(), *stored]:
        if _key(w) not in claimed:
            report.not_compared.append((w.name, "no tensor of the source makes it"))
    return out


def _key(w: OutputWeight) -> tuple[str, str | None, int | None]:
    if w.qpack is not None:  # an expert projection of a QPACK container: its own place
        return (str(w.qpack.path), w.qpack.proj, w.qpack.expert)
    return (w.tensor.name, w.part.projection if w.part else None, w.part.expert if w.part else None)


def _not_found(weights: OutputWeights, job, stack, report: QualityReport, claimed: set) -> None:
    """A planned tensor ``find`` does not give: not compared when the output holds it in a form this cannot read
    apart, else VerifyError (the source makes a tensor this output does not have)."""
    held = [n for n in weights.stored_names(job.out_name) if n in weights.resolved]
    if held:
        t = weights.resolved[held[0]]
        report.not_compared.append((job.out_name, t.problem or f"stored as {t.kind} {t.dtype}"))
        return
    if stack is not None and stack.name in weights.resolved:
        report.not_compared.append(
            (job.out_name, f"stored in the stack {stack.name}, which has no parts to read apart")
        )
        claimed.add((stack.name, None, None))
        return
    raise VerifyError(
        f"tensor {job.out_name}: the source makes it, but {weights.model.path} holds no such weight: "
        f"`source` is not the source of this conversion"
    )


def _stream(report: QualityReport, weights: OutputWeights, src, plan, matched: list, progress: bool) -> None:
    """Read, decode and compare each matched tensor, a unit's source shards on disk at a time (a Hub source's
    downloads deleted once no later unit reads them). As the converter encodes (``unit_writer``: its
    ``_Ahead`` and encoder threads), whole tensors are read and compared in order, at most
    ``ENCODE_AHEAD_BYTES`` of source ahead, on one thread per core (and ``READ_THREADS`` more for a unit of small
    tensors, ``_small``): the reads overlap the arithmetic. Both sets are read around the page cache where it does not hold them (``direct``:
    ``O_DIRECT``, no readahead, so the threads waiting on the drive are what keeps requests queued at it)."""
    from concurrent.futures import ThreadPoolExecutor

    from colitools.converters.unit_writer import ShardReader, _Ahead, _encoder_init, encoder_threads

    block = plan.inventory.fp8.block if plan.inventory.fp8 else None
    needed = Counter(s for unit, _, _ in _first_of_units(matched) for s in unit.shards)
    for shard in weights.model.shards:  # each descriptor opened here, once, not by two threads at a time
        shard.read_range(shard.data_start, 0)
        shard.direct = True
    bar = _bar(progress, sum(j.in_bytes + w.nbytes for _, j, w in matched))
    try:
        for unit, items in _by_unit(matched):
            paths = {s: src.local_copy(s) or src.ensure_local(s) for s in unit.shards}
            reader = ShardReader(paths, direct=True)
            try:
                threads = encoder_threads() + (READ_THREADS if _small(items, weights, block) else 0)
                with ThreadPoolExecutor(threads, "quality", initializer=_encoder_init) as pool:
                    work = [(job, w, weights, reader, block) for _, job, w in items]
                    ahead = _Ahead(pool, work, _tensor_stats)
                    try:
                        for _, job, w in items:
                            report.tensors.append(weights.quality(w, ahead.take()))
                            report.bytes_read += job.in_bytes + w.nbytes
                            bar.update(job.in_bytes + w.nbytes)
                    except BaseException:
                        ahead.cancel()
                        raise
            finally:
                reader.close()
            for s in unit.shards:
                needed[s] -= 1
                if not needed[s] and src.is_deletable(s):
                    src.release(s)
    finally:
        bar.close()


def _small(items: list, weights: OutputWeights, block) -> bool:
    """Whether every tensor of a unit is compared at most ``SLAB_BYTES`` of float32 at a time (whole, or by row
    slabs): only then are ``READ_THREADS`` more tensors in memory at once (peak RSS: bench/README.md)."""
    return all(
        _slab_rows(job, w, weights, block) is not None or 4 * math.prod(w.shape) <= SLAB_BYTES
        for _, job, w in items
    )


def _first_of_units(matched: list) -> Iterator:
    seen = set()
    for unit, job, w in matched:
        if unit.key not in seen:
            seen.add(unit.key)
            yield unit, job, w


def _by_unit(matched: list) -> Iterator[tuple[Any, list]]:
    items: list = []
    for item in matched:
        if items and item[0].key != items[0][0].key:
            yield items[0][0], items
            items = []
        items.append(item)
    if items:
        yield items[0][0], items


def _tensor_stats(job, w: OutputWeight, weights: OutputWeights, reader, block) -> ErrorStats:
    """The figures of one planned tensor: its source values as the converter reads them against the output's
    decoded values, by row slabs for a big plain 2-D tensor (no tensor-sized float32 copy)."""
    try:
        rows = _slab_rows(job, w, weights, block)
        if rows is None:
            return weights.error(w, _source_float32(job, reader, block))
        stats = ErrorStats()
        for r0 in range(0, job.O, rows):
            r1 = min(job.O, r0 + rows)
            stats = stats + weights.error(w, _source_rows(job, reader, block, r0, r1), (r0, r1))
        return stats
    except ColitoolsError as exc:
        if job.out_name in str(exc):
            raise
        raise VerifyError(f"tensor {job.out_name}: {exc}") from None  # the tensor it was reading


def _slab_rows(job, w: OutputWeight, weights: OutputWeights, block) -> int | None:
    """Rows per slab for a plain 2-D source tensor (not natively quantized, not a slice of a stack) whose float32
    values take more than ``SLAB_BYTES`` and whose output decodes by rows (an FP8 source: whole rows of its scale
    blocks); None: whole. Every big tensor is then compared a float32 slab at a time (an FP8 expert of
    DeepSeek-V3, [2048, 7168], is 59 MB as float32: several such copies per thread otherwise)."""
    src = job.source
    align = weights.row_slabs(w)
    if not align or src.quant is not None or job.fused_rows is not None or job.fused_pick is not None:
        return None
    if len(src.shape) != 2 or job.O * job.I * 4 <= SLAB_BYTES:
        return None
    if src.scale is not None:
        align = math.lcm(align, block[0])
    rows = max(align, (SLAB_BYTES // (4 * job.I)) // align * align)
    return rows if rows < job.O else None


def _source_float32(job, reader, block) -> np.ndarray:
    """The job's source values decoded to float32 as the converter decodes them (``unit_writer``; a whole FP8
    tensor by the kernel the converter uses for its stack slabs, bit-identical to ``dequant.to_float32``'s)."""
    from colitools.converters.unit_writer import _dequant, _source_values
    from colitools.formats.source_encodings import FP8_BLOCK

    values, scale = _source_values(job, reader, block)
    q = job.source.quant
    if q is not None:
        q.encoding.check_parts(job.out_name, values, job.source.shape)
        return q.encoding.decode(values, job.O, job.I, group=q.group, exact=q.exact)
    if scale is not None and job.fused_rows is None and np.ndim(values) == 2:
        return FP8_BLOCK.decode({"data": values, "scale": scale}, *values.shape, block=block, fast=True)
    if scale is None and values.dtype == _BF16 and values.size == job.O * job.I:
        return values.reshape(job.O, job.I)  # compared from its bits (error_stats), as convert recorded it
    return _dequant(job, values, scale, block)


def _source_rows(job, reader, block, r0: int, r1: int) -> np.ndarray:
    """Rows ``[r0, r1)`` of a plain 2-D source tensor as float32 (an FP8 one with its scale grid's rows)."""
    from colitools.converters.dequant import to_float32
    from colitools.formats.source_encodings import FP8_BLOCK

    src = job.source
    values = reader.read_rows(src, r0, r1)
    if src.scale is None:  # BF16 compared from its bits (error_stats), as convert recorded it
        return values if values.dtype == _BF16 else to_float32(job.out_name, values)
    sc = src.scale
    grid = reader.read(sc.shard, sc.name, sc.dtype, sc.shape)[r0 // block[0] : -(-r1 // block[0])]
    return FP8_BLOCK.decode({"data": values, "scale": grid}, *values.shape, block=block, fast=True)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(progress: bool, total_bytes: int):
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1000, desc="verify quality",
                leave=False, dynamic_ncols=True)  # fmt: skip


def worst(report: QualityReport, n: int = 10) -> list[TensorQuality]:
    """The ``n`` tensors of highest relative error (lossless ones never)."""
    lossy = [t for t in report.tensors if t.stats.sse > 0]
    return sorted(lossy, key=lambda t: -t.stats.rel_error)[:n]
