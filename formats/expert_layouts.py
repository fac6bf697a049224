"""How a ``--target`` writes and reads routed experts (docs/FORMATS.md §4 "Targets"): one object per layout.

A layout owns its byte facts (names, dtypes, sizes, ``identify`` from byte counts), its write side (``group``:
the planner's groups of one output file -> what is written, refusing before any work what its loader cannot read)
and its read side (``scale_of`` claims a stored tensor, ``read`` resolves it from ``config.json``,
``check_resolved`` checks a whole container). ``formats/targets/`` gives each target one of them:

* ``ExpertRecord``: every projection its own weight and scale, as the generic container has them, optionally in
  a loader's formats only, its own record order (each weight directly followed by its scale) and spelling;
* ``MergedLayout``: one blob per expert (``c/olmoe.c`` / ``c/qwen36.c`` ``load_expert_merged``);
* ``FusedLayout``: one stack per layer over all its experts (``c/inkling.c``).

The write side sees the planner's tensors through ``PlannedTensor`` (the attributes it reads of a
``converters.planner.TensorJob``) and answers with ``Grouped`` (jobs in write order, ``Stack`` tensors made of
several of them); it raises FormatError (one line) for what the loader cannot read. Numpy-free.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from colitools.formats import model_config
from colitools.formats.errors import FormatError, ResolveError, TargetRefused
from colitools.formats.format_names import GROUP_SIZES
from colitools.formats.names import (
    CANONICAL_PROJECTION,
    TensorRole,
    is_merged_expert,
    natural_key,
    parse_name,
)

INT8_ROW, INT4_ROW, INT4_GROUPED = "int8-row", "int4-row", "int4-grouped"  # registry names of merged parts
BIAS_SUFFIX = "bias"  # a per-expert bias's name suffix (names.parse_name)
SIGNED_NIBBLE_XOR = 0x88  # a byte of pairs codes (v + 8 per nibble) XOR this = two signed nibbles (v & 0xF)
Entry = tuple[str, str, tuple[int, ...]]  # (tensor name, dtype, shape) as the writer plans it


# ------------------------------------------------------------------------------------- the planner's view
class WrittenAs(Protocol):
    """What a layout reads of the format chosen for a planned tensor (``converters.recipe.Target``)."""

    fmt: str
    gs: int | None
    fallback: Any  # a recorded fallback (``.reason``) or None

    @property
    def label(self) -> str: ...

    @property
    def is_float(self) -> bool: ...

    @property
    def is_source(self) -> bool: ...  # copied in the source's dtype, bytes unchanged


class PlannedTensor(Protocol):
    """What a layout reads of one planned output tensor (``converters.planner.TensorJob``)."""

    out_name: str
    O: int
    I: int
    expert: int | None
    expert_base: str | None
    target: WrittenAs
    source: Any  # the source tensor (``.name``)

    @property
    def routed(self) -> bool: ...  # a routed expert's tensor (recipe role ``experts``)

    @property
    def weight_entry(self) -> Entry: ...


@dataclass(frozen=True)
class Stack:
    """One written tensor made of several planned ones (a merged blob, a fused stack): the codes of ``members``
    (indices into the group's jobs) back to back in that order, stored ``dtype`` with ``shape``; their scales
    concatenated the same way as ``scale`` (F32, 1-D) when they have any. ``fmt`` / ``gs``: the codes' format;
    ``signed_nibbles``: int4 pairs bytes XOR ``SIGNED_NIBBLE_XOR`` (``pack_int4``'s two's complement nibbles)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    members: tuple[int, ...]
    scale: str | None = None
    n_scales: int = 0
    fmt: str | None = None
    gs: int | None = None
    signed_nibbles: bool = False
    down: str | None = None  # a merged blob's down projection in another format (the mixed slab: int8-row)
    plain_members: tuple[int, ...] = ()  # members kept as their own bytes in a signed-nibble stack (int8-row)
    kind: str = ""  # "qpack": a QPACK layer file's expert records (formats/qpack.py), members in record order

    @property
    def entries(self) -> list[Entry]:
        out = [(self.name, self.dtype, self.shape)]
        return out + ([(self.scale, "F32", (self.n_scales,))] if self.scale else [])


@dataclass(frozen=True)
class Grouped:
    """Planned tensors written back to back (the planner's ``OutputGroup``): ``jobs`` in write order; ``stacks``
    made of them (none: each its own weight, then the scales in the same order); ``interleaved``: each weight
    directly followed by its scale (a loader's expert record)."""

    jobs: tuple[Any, ...]
    stacks: tuple[Stack, ...] = ()
    interleaved: bool = False
    trailing: int = 0  # the last ``trailing`` jobs (an expert's biases) are written after the others' scales


def is_expert_bias(job: PlannedTensor) -> bool:
    """A per-expert bias (gpt-oss's split stack biases ``...experts.{E}.{gate,up,down}_proj.bias``, F32)."""
    return job.expert is not None and parse_name(job.out_name).suffix == BIAS_SUFFIX


def biases_last(jobs: Sequence[PlannedTensor]) -> tuple[tuple[PlannedTensor, ...], tuple[PlannedTensor, ...]]:
    """``(the other jobs, the expert biases)`` of one expert's group, each keeping its order. docs/FORMATS.md §4:
    an expert's record is its codes, then its scales, then its biases, each in gate, up, down order (the
    planner orders the jobs so)."""
    biases = tuple(j for j in jobs if is_expert_bias(j))
    return tuple(j for j in jobs if not is_expert_bias(j)), biases


def _plain(jobs: tuple[PlannedTensor, ...]) -> Grouped:
    rest, biases = biases_last(jobs)
    return Grouped(rest + biases, trailing=len(biases))


def written_as(t: WrittenAs, I: int, labels: tuple[str, ...]) -> bool:
    """``t`` writes one of ``labels``; int4-row at ``I`` counts as ``int4-g{I}`` (the same bytes and scales)."""
    return t.label in labels or (t.fmt == INT4_ROW and f"int4-g{I}" in labels)


def _why(job: PlannedTensor) -> str:
    return f" ({job.target.fallback.reason})" if job.target.fallback else ""


def _is_routed(jobs: Sequence[PlannedTensor]) -> bool:
    return jobs[0].expert is not None and jobs[0].routed


@dataclass(frozen=True)
class Spelling:
    """How a target's loader names and types format ``fmt``'s two tensors (a registry name): ``<base>
    {weight_suffix}`` stored as ``weight_dtype`` and ``<base>{scale_suffix}`` as ``scale_dtype`` (the bytes are
    the format's own). Readers pair such tensors by these facts (``container.resolve_container``)."""

    weight_suffix: str
    weight_dtype: str
    scale_suffix: str
    scale_dtype: str
    fmt: str

    def tensor_names(self, name: str) -> tuple[str, str]:
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        return base + self.weight_suffix, base + self.scale_suffix


@dataclass(frozen=True)
class LayoutRead:
    """What a layout's reader found for one stored tensor: its scale tensor, and either its format (registry
    name, group size) and ``parts`` or, when ``config.json`` cannot give its geometry, the ``problem``."""

    scale: str
    fmt: str | None = None
    gs: int | None = None
    parts: tuple[MergedPart, ...] = ()
    problem: str | None = None


class ExpertLayout:
    """The interface of a layout (the base reads nothing and writes the groups as they are)."""

    spelling: Spelling | None = (
        None  # the loader's names and dtypes of a routed expert's two tensors, if its own
    )

    def spelling_for(self, job: PlannedTensor) -> Spelling | None:
        """The loader's spelling of planned tensor ``job`` (None: its format's own names)."""
        return None

    def group(self, groups: Sequence[Sequence[PlannedTensor]], target: Any) -> list[Grouped]:
        """The groups of one output file as ``target`` writes them; FormatError (one line) for what its loader
        cannot read. ``target`` gives the message's ``name`` and ``loader`` and ``allowed("experts")``."""
        return [Grouped(tuple(g)) for g in groups]

    def scale_of(self, name: str, info: Any, infos: Mapping[str, Any]) -> str | None:
        """The scale tensor of ``name`` when ``name`` is one of this layout's stored tensors, else None."""
        return None

    def read(self, name: str, info: Any, infos: Mapping[str, Any], config: Mapping | None, where: str,
             group_size: int | None = None) -> LayoutRead:  # fmt: skip
        """``name`` (claimed by ``scale_of``) resolved from ``config.json``; ResolveError naming it."""
        raise NotImplementedError

    def check_resolved(self, resolved: Mapping[str, Any]) -> None:
        """A container-wide check of what ``read`` resolved (``container.ResolvedTensor`` by name)."""


# -------------------------------------------------------------------------------- per-projection records
@dataclass(frozen=True)
class ExpertRecord(ExpertLayout):
    """Routed experts as per-projection tensors, each its own weight and scale (the generic container's
    layout, ``PAIRS``). ``formats``: the labels every routed expert tensor must be written as (None: any);
    ``order``: the projections of an expert's record in this order, each weight directly followed by its
    scale (None: gate, up, down, weights then scales); ``spelling``: the loader's names and dtypes for such a
    tensor of one of ``formats`` (its bytes are the format's), also for the MTP layers' experts with
    ``spell_mtp``."""

    formats: tuple[str, ...] | None = None
    order: tuple[str, ...] | None = None
    spelling: Spelling | None = None
    spell_mtp: bool = False  # the MTP layers' experts (recipe role ``mtp``) take the spelling too

    def spelling_for(self, job: PlannedTensor) -> Spelling | None:
        mtp_expert = self.spell_mtp and job.expert is not None
        if self.spelling is None or not (job.routed or mtp_expert):
            return None
        t = job.target
        return self.spelling if not t.is_float and t.label in (self.formats or ()) else None

    def group(self, groups: Sequence[Sequence[PlannedTensor]], target: Any) -> list[Grouped]:
        return [self._record(tuple(g), target) if _is_routed(g) else _plain(tuple(g)) for g in groups]

    def _record(self, group: tuple[PlannedTensor, ...], target: Any) -> Grouped:
        jobs, biases = biases_last(group)
        for j in jobs:
            if self.formats is not None and not written_as(j.target, j.I, self.formats):
                raise TargetRefused(
                    f"`target={target.name}`: routed expert tensor {j.out_name} [{j.O}, {j.I}] would be written as "
                    f"{j.target.label}{_why(j)}; {target.loader} reads routed experts as "
                    f"{' or '.join(self.formats)} only (`experts={self.formats[0]}`)"
                )
        if self.order is None:
            return Grouped(jobs + biases, trailing=len(biases))
        rank = {p: k for k, p in enumerate(self.order)}
        ordered = sorted(jobs, key=lambda j: rank.get(parse_name(j.out_name).projection or "", len(rank)))
        return Grouped((*ordered, *biases), interleaved=True, trailing=len(biases))


PAIRS = ExpertRecord()


# ------------------------------------------------------------------------------------------ merged blobs
@dataclass(frozen=True)
class MergedPart:
    """One projection inside a merged expert blob: ``[O, I]`` in format ``fmt`` (group size ``gs``), its codes
    at bytes ``data`` of the blob and its scales at elements ``scales`` of the scale tensor (both half-open,
    relative to the tensor). ``signed_nibbles``: int4 codes as two's complement nibbles (low nibble = element
    2k), i.e. the pairs codes of docs/FORMATS.md §2.2 XOR ``SIGNED_NIBBLE_XOR``."""

    projection: str  # gate | up | down
    O: int
    I: int
    data: tuple[int, int]
    scales: tuple[int, int]
    fmt: str = INT8_ROW
    gs: int | None = None
    signed_nibbles: bool = False
    expert: int | None = None  # the routed expert (a fused stack's part); None: the blob's own expert


@dataclass(frozen=True)
class MergedLayout(ExpertLayout):
    """Routed experts as one blob per expert (``c/olmoe.c`` and ``c/qwen36.c`` ``load_expert_merged``).

    A blob holds gate ``[I, H]``, up ``[I, H]`` and down ``[H, I]`` back to back, all in one format: int8-row
    (I8, ``O*I`` bytes each; both engines) or int4 (U8, the whole blob's ``3*I*H`` values flattened and packed two
    per byte as signed nibbles, ``convert_qwen36.py`` ``pack_int4``; qwen36 only) with row scales (int4-row) or
    group scales along the input (int4-grouped, ``expert_gs`` of ``qwen36_meta.json``), or the **mixed slab**
    (``convert_qwen36.py --down-bits 8``, qwen36 only: int4 gate and up as above, then the down projection as
    int8-row, ``2*I*H`` bytes, ``qwen36_meta.json`` ``expert_down_bits`` 8, ``expert_down_gs`` 0). The scale
    tensor holds gate, up and down scales in that order. Which of these a target writes is its ``--experts`` /
    ``--experts-down`` values; readers accept every one, telling them apart by byte and scale counts as
    ``load_expert_merged`` does."""

    leaf: str = "merged_weight"  # ...experts.{E}.merged_weight (names.MERGED_EXPERTS)
    scale_leaf: str = "qs"  # ...experts.{E}.qs (names.MERGED_SCALES)
    projections: tuple[str, ...] = ("gate", "up", "down")
    fmt: str = INT8_ROW  # the format of a blob whose target does not choose another
    dtype: str = "I8"  # int8 codes as the converters store them (torch.int8); st.h reads U8 and I8 alike
    int4_dtype: str = "U8"  # packed int4 codes (pack_int4 returns uint8)
    dtypes: tuple[str, ...] = ("I8", "U8")  # what a reader accepts
    scale_dtype: str = "F32"
    formats: tuple[str, ...] = (INT8_ROW, INT4_ROW, INT4_GROUPED)  # what a reader accepts

    def names(self, expert_base: str, expert: int) -> tuple[str, str]:
        """``(blob name, scale name)`` of expert ``expert`` under ``expert_base`` (``model.layers.3.mlp.experts``)."""
        return f"{expert_base}.{expert}.{self.leaf}", f"{expert_base}.{expert}.{self.scale_leaf}"

    def blob_dtype(self, fmt: str) -> str:
        return self.dtype if fmt == INT8_ROW else self.int4_dtype

    def parts(
        self, hidden: int, inter: int, fmt: str = INT8_ROW, gs: int | None = None, down: str | None = None
    ) -> tuple[MergedPart, ...]:
        """The parts of one blob of an expert of width ``inter`` in a model of hidden size ``hidden``; ``down``:
        the down projection's format when it is not ``fmt`` (the mixed slab's int8-row)."""
        out, d, s = [], 0, 0
        for proj in self.projections:
            pf = down if proj == "down" and down else fmt
            int4 = pf != INT8_ROW
            O, I = (hidden, inter) if proj == "down" else (inter, hidden)
            nb = O * I // 2 if int4 else O * I
            ns = O * -(-I // gs) if pf == INT4_GROUPED and gs else O
            out.append(MergedPart(proj, O, I, (d, d + nb), (s, s + ns), pf, gs if pf == INT4_GROUPED else None,
                                  int4))  # fmt: skip
            d, s = d + nb, s + ns
        return tuple(out)

    def sizes(
        self, hidden: int, inter: int, fmt: str = INT8_ROW, gs: int | None = None, down: str | None = None
    ) -> tuple[int, int]:
        """``(blob bytes, scale elements)``: ``want_w`` / ``want_s`` of ``load_expert_merged``."""
        last = self.parts(hidden, inter, fmt, gs, down)[-1]
        return last.data[1], last.scales[1]

    def identify(
        self, hidden: int, inter: int, nbytes: int, n_scales: int, group_size: int | None = None
    ) -> tuple[str, int | None, str | None] | None:
        """``(format, group size, down format)`` of a blob of ``nbytes`` bytes with ``n_scales`` scales (down
        format None: the blob's own; int8-row: the mixed slab, ``2*I*H`` bytes), or None when no layout has those
        counts. ``group_size`` is the container's ``expert_gs`` (``qwen36_meta.json``; 0: row scales), which
        decides between layouts with equal counts (int4-g32 and int4-g48 at width 64, int4-row and int4-g64 at
        width 64), as it does in ``load_expert_merged``; without it such counts are None."""
        found = []
        if self.sizes(hidden, inter) == (nbytes, n_scales) and not group_size:
            found.append((INT8_ROW, None, None))
        if hidden % 2 == 0 and inter % 2 == 0:
            for down in (None, INT8_ROW):
                if self.sizes(hidden, inter, INT4_ROW, None, down) == (nbytes, n_scales) and not group_size:
                    found.append((INT4_ROW, None, down))
                found += [(INT4_GROUPED, g, down) for g in GROUP_SIZES if group_size in (None, g)
                          and self.sizes(hidden, inter, INT4_GROUPED, g, down) == (nbytes, n_scales)]  # fmt: skip
        return found[0] if len(found) == 1 else None

    @staticmethod
    def blob_format(jobs: Sequence[PlannedTensor]) -> tuple[str, int | None, str | None]:
        """``(format, group size, down format)`` of the blob of these parts: int4-grouped with the largest group
        size when any part is (a narrower part written int4-row has one group per row, the same bytes and
        scales), else the parts' format, group size None; down format int8-row when the down projection alone is
        int8-row and gate and up are int4 (the mixed slab), else None."""
        down = jobs[-1].target.fmt if len(jobs) == 3 else None
        mixed = down == INT8_ROW and all(j.target.fmt != INT8_ROW for j in jobs[:-1])
        body = jobs[:-1] if mixed else jobs
        grouped = [j.target.gs for j in body if j.target.fmt == INT4_GROUPED]
        fmt, gs = (INT4_GROUPED, max(grouped)) if grouped else (body[0].target.fmt, None)
        return fmt, gs, (INT8_ROW if mixed else None)

    # ---------------------------------------------------------------------------------------- write side
    def group(self, groups: Sequence[Sequence[PlannedTensor]], target: Any) -> list[Grouped]:
        """Each routed expert's group as one blob: exactly its gate, up and down projections, ``[I, H]``,
        ``[I, H]``, ``[H, I]``, all in one of the target's ``--experts`` formats; anything else is refused before
        work starts, naming the tensor. Other groups are returned as they are."""
        return [self._blob(tuple(g), target) if _is_routed(g) else Grouped(tuple(g)) for g in groups]

    def _blob(self, jobs: tuple[PlannedTensor, ...], target: Any) -> Grouped:
        first = jobs[0]
        projections = tuple(parse_name(j.out_name).projection for j in jobs)
        if projections != self.projections or len({j.expert_base for j in jobs}) != 1:
            raise TargetRefused(
                f"`target={target.name}`: expert {first.expert} of {first.expert_base} "
                f"({', '.join(j.out_name for j in jobs)}) is not one {'/'.join(self.projections)} record, which "
                f"{target.loader} reads as one merged blob"
            )
        fmt, gs, down = self.blob_format(jobs)
        self._check_parts(jobs, fmt, gs, down, target)
        H, I = first.I, first.O
        n_codes, n_scales = self.sizes(H, I, fmt, gs, down)
        if self.identify(H, I, n_codes, n_scales, gs or 0) != (fmt, gs, down):  # pragma: no cover
            raise FormatError(
                f"internal: merged {first.target.label} at hidden {H}, width {I} does not resolve back"
            )
        blob, scale = self.names(first.expert_base, first.expert)
        stack = Stack(blob, self.blob_dtype(fmt), (n_codes,), tuple(range(len(jobs))), scale, n_scales, fmt, gs,
                      signed_nibbles=fmt != INT8_ROW, down=down,
                      plain_members=(len(jobs) - 1,) if down else ())  # fmt: skip
        return Grouped(jobs, stacks=(stack,))

    def _check_parts(
        self, jobs: tuple[PlannedTensor, ...], fmt: str, gs: int | None, down: str | None, target: Any
    ) -> None:
        wanted = target.allowed("experts") or (self.fmt,)
        for k, j in enumerate(jobs):
            if down and k == len(jobs) - 1:
                self._check_down(j, target)
                continue
            same = (j.target.fmt, j.target.gs) == (fmt, gs) or (
                fmt == INT4_GROUPED and j.target.fmt == INT4_ROW and j.I <= gs
            )  # one group per row is a row scale: the same bytes and scales
            if j.target.label not in wanted or not same:
                raise TargetRefused(
                    f"`target={target.name}`: routed expert tensor {j.out_name} [{j.O}, {j.I}] would be written as "
                    f"{j.target.label}{_why(j)}; {target.loader} reads gate, up and down in one of "
                    f"{', '.join(wanted)} only"
                )
        gate, up, down = jobs
        where = f"`target={target.name}`: expert {gate.expert} of {gate.expert_base}"
        if (gate.O, gate.I) != (up.O, up.I) or (down.O, down.I) != (gate.I, gate.O):
            raise TargetRefused(
                f"{where}: gate {[gate.O, gate.I]}, up {[up.O, up.I]}, down {[down.O, down.I]} are not [I, H], "
                f"[I, H], [H, I]"
            )
        if fmt != INT8_ROW and (gate.O % 2 or gate.I % 2):
            raise TargetRefused(
                f"{where}: int4 merged blobs need an even hidden size and expert width (gate is "
                f"{[gate.O, gate.I]}); use `experts=int8-row`"
            )

    @staticmethod
    def _check_down(job: PlannedTensor, target: Any) -> None:
        """The down projection of a mixed slab: int8-row, where the target's loader reads that slab."""
        wanted = target.allowed("experts_down") or ()
        also = f" or the mixed slab with down as {', '.join(wanted)}" if wanted else ""
        if job.target.label not in wanted:
            raise TargetRefused(
                f"`target={target.name}`: routed expert tensor {job.out_name} [{job.O}, {job.I}] would be written as "
                f"{job.target.label} beside int4 gate and up; {target.loader} reads gate, up and down in one "
                f"format{also}"
            )

    # ----------------------------------------------------------------------------------------- read side
    def scale_of(self, name: str, info: Any, infos: Mapping[str, Any]) -> str | None:
        if not is_merged_expert(name):
            return None
        parsed = parse_name(name)
        return self.names(parsed.expert_base, parsed.expert)[1]

    def read(self, name: str, info: Any, infos: Mapping[str, Any], config: Mapping | None, where: str,
             group_size: int | None = None) -> LayoutRead:  # fmt: skip
        """A blob with its ``.qs``: byte counts checked exactly against ``config.json``'s hidden size and expert
        width, as ``load_expert_merged`` checks them; int8-row parts told from (signed-nibble) int4-row /
        int4-grouped parts by ``identify`` (``group_size``: the container's ``expert_gs``)."""
        scale = self.scale_of(name, info, infos)
        if scale not in infos:
            raise ResolveError(f"{where}: merged expert blob {name} has no scale tensor {scale}")
        sinfo = infos[scale]
        if info.dtype not in self.dtypes or sinfo.dtype != self.scale_dtype:
            raise ResolveError(
                f"{where}: merged expert blob {name} is {info.dtype} with {sinfo.dtype} scales {scale}; expected "
                f"{' or '.join(self.dtypes)} with {self.scale_dtype}"
            )
        facts = model_config.read_facts(config) if config else None
        if facts is None or not facts.expert_width:
            return LayoutRead(scale, problem=(
                f"{where}: merged expert blob {name} ({info.nbytes} bytes) needs config.json's hidden size and "
                f"expert width for its gate/up/down geometry, and {'there is none' if facts is None else 'it gives none'}"
            ))  # fmt: skip
        H, I = facts.hidden_size, facts.expert_width
        n_scales = sinfo.nbytes // 4
        found = self.identify(H, I, info.nbytes, n_scales, group_size) if sinfo.nbytes % 4 == 0 else None
        if found is None:
            want_w, want_s = self.sizes(H, I)
            gs = "" if group_size is None else f", expert_gs {group_size}"
            raise ResolveError(
                f"{where}: merged expert blob {name} is {info.nbytes} bytes with {n_scales} scales; config.json "
                f"(hidden {H}, expert width {I}{gs}) implies {want_w} bytes and {want_s} scales (int8-row), "
                f"{want_w // 2} bytes (int4) or {2 * want_w // 3} (int4 gate/up, int8-row down) with scales per "
                f"row or per group of qwen36_meta.json's expert_gs"
            )
        fmt, gs, down = found
        return LayoutRead(scale, fmt, gs, self.parts(H, I, fmt, gs, down))


MERGED = MergedLayout()


# ------------------------------------------------------------------------------------------ fused stacks
@dataclass(frozen=True)
class FusedLayout(ExpertLayout):
    """Routed experts as one fused stack per layer over all its experts (``c/inkling.c``: ``model_init``'s
    container detection and ``slot_fill``; written by ``c/tools/convert_inkling_int4.py``
    ``quantize_expert_tensor``). The one owner of these byte facts, used by the writer and every reader.

    ``{base}.gate_up_proj`` (U8, 1-D) holds expert ``e``'s ``2I`` rows, the ``I`` gate rows then the ``I`` up rows,
    at bytes ``[e * 2I * rowb, (e + 1) * 2I * rowb)`` with ``rowb`` bytes a row; ``{base}.down_proj`` its ``H`` rows
    of ``rowb'`` bytes. ``rowb == H`` (``rowb' == I``): int8-row codes (two's complement bytes); ``rowb == H / 2``:
    int4-row pairs codes (docs/FORMATS.md §2.2: low nibble = even column, value + 8). The engine tells them apart by
    ``rowb = nbytes / (E * 2I)`` of the first MoE layer's ``gate_up_proj`` (any other row size stops it) and reads
    ``down_proj`` in the same format. ``{stack}.qs`` (F32, 1-D): one scale per row, in row order (``E * 2I`` and
    ``E * H``); a weight is ``q[o, i] * scale[o]`` (``matmul_q`` / ``matmul_q4``). Only byte counts are read,
    never shapes (the converter writes both tensors 1-D). A float stack (``float_formats``, no ``.qs``) is
    ``[E, 2I, H]`` / ``[E, H, I]`` in the same row order. Shared experts are float stacks too
    (``shared_experts.{p}_proj [n, O, I]``)."""

    stacks: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("gate_up_proj", ("gate", "up")),
        ("down_proj", ("down",)),
    )
    scale_suffix: str = ".qs"
    # int8 codes too: the engine takes U8 (st dtype 3) as "container", anything else as float
    dtype: str = "U8"
    scale_dtype: str = "F32"
    formats: tuple[str, ...] = (INT8_ROW, INT4_ROW)
    # float stacks [E, 2I, H] / [E, H, I] (the converter's --xbits 0: the de-interleaved source stack, its dtype):
    # the engine reads an expert's rows with read_f32_slice and keeps them f32 or quantizes them at load
    float_formats: tuple[str, ...] = ("f32", "bf16")

    def names(self, expert_base: str) -> tuple[tuple[str, str], ...]:
        """``((stack name, scale name), ...)`` of a layer's stacks under ``expert_base``
        (``model.layers.3.mlp.experts``), gate_up first."""
        return tuple(
            (f"{expert_base}.{leaf}", f"{expert_base}.{leaf}{self.scale_suffix}") for leaf, _ in self.stacks
        )

    @staticmethod
    def row_bytes(fmt: str, width: int) -> int:
        return width if fmt == INT8_ROW else width // 2

    def geometry(self, leaf: str, hidden: int, inter: int) -> tuple[tuple[str, ...], int, int]:
        """``(projections, rows per expert, row width)`` of stack ``leaf``."""
        projections = dict(self.stacks)[leaf]
        return (projections, 2 * inter, hidden) if leaf == "gate_up_proj" else (projections, hidden, inter)

    def sizes(self, leaf: str, hidden: int, inter: int, experts: int, fmt: str) -> tuple[int, int]:
        """``(bytes, scales)`` of stack ``leaf`` over ``experts`` experts in ``fmt``."""
        _, rows, width = self.geometry(leaf, hidden, inter)
        return experts * rows * self.row_bytes(fmt, width), experts * rows

    def identify(
        self, leaf: str, hidden: int, inter: int, experts: int, nbytes: int, n_scales: int
    ) -> str | None:
        """The format of stack ``leaf`` from its byte and scale counts (the engine's ``rowb``), or None."""
        found = [f for f in self.formats if (f == INT8_ROW or (hidden % 2 == 0 and inter % 2 == 0))
                 and self.sizes(leaf, hidden, inter, experts, f) == (nbytes, n_scales)]  # fmt: skip
        return found[0] if len(found) == 1 else None

    def parts(self, leaf: str, hidden: int, inter: int, experts: int, fmt: str) -> tuple[MergedPart, ...]:
        """Every expert's projections in stack ``leaf``: bytes and scales relative to the stack and its scales."""
        projections, rows, width = self.geometry(leaf, hidden, inter)
        rb, out = self.row_bytes(fmt, width), []
        O = rows // len(projections)
        for e in range(experts):
            for k, proj in enumerate(projections):
                r0 = e * rows + k * O
                out.append(MergedPart(proj, O, width, (r0 * rb, (r0 + O) * rb), (r0, r0 + O), fmt, expert=e))
        return tuple(out)

    # ---------------------------------------------------------------------------------------- write side
    def group(self, groups: Sequence[Sequence[PlannedTensor]], target: Any) -> list[Grouped]:
        """A file's groups as fused stacks: every routed expert of one ``experts`` module in one group writing
        ``gate_up_proj`` (each expert's gate rows, then its up rows) and ``down_proj``, U8 1-D codes + F32 1-D
        ``.qs`` in one of ``formats``, or float ``[E, rows, cols]`` stacks (``float_formats``); every split shared
        expert's projection ``shared_experts.{k}.{p}_proj.weight`` in one float stack ``shared_experts.{p}_proj``
        ``[n, O, I]`` (shared expert k's rows at index k). Anything else is refused before work starts, named."""
        routed: dict[str, list[tuple[PlannedTensor, ...]]] = defaultdict(list)
        shared: dict[tuple[str, str], list[PlannedTensor]] = defaultdict(list)
        out: list[Grouped] = []
        for g in groups:
            first, parsed = g[0], parse_name(g[0].out_name)
            if _is_routed(g):
                routed[first.expert_base].append(tuple(g))
            elif len(g) == 1 and parsed.role is TensorRole.SHARED_EXPERT and parsed.projection in (
                "gate", "up", "down"
            ) and parsed.module.rpartition(".")[2].isdecimal():  # fmt: skip
                shared[(first.out_name.rsplit(".", 3)[0], parsed.projection)].append(
                    first
                )  # minus ".{k}.{p}.weight"
            else:
                out.append(Grouped(tuple(g)))
        for (base, proj), jobs in sorted(shared.items(), key=lambda kv: (natural_key(kv[0][0]), kv[0][1])):
            out.append(self._shared_stack(base, proj, jobs, target))
        for base, experts in sorted(routed.items(), key=lambda kv: natural_key(kv[0])):
            out.append(self._layer_stacks(base, experts, target))
        return out

    @staticmethod
    def _shared_stack(base: str, proj: str, jobs: list[PlannedTensor], target: Any) -> Grouped:
        def k_of(j: PlannedTensor) -> int:
            return int(parse_name(j.out_name).module.rpartition(".")[2])

        jobs = sorted(jobs, key=k_of)
        dtypes = {j.weight_entry[1] for j in jobs}
        name = f"{base}.{CANONICAL_PROJECTION[proj]}"
        if [k_of(j) for j in jobs] != list(range(len(jobs))) or len({(j.O, j.I) for j in jobs}) != 1 or len(
            dtypes
        ) != 1 or not all(j.target.is_float for j in jobs):  # fmt: skip
            raise TargetRefused(
                f"`target={target.name}`: shared experts {', '.join(j.out_name for j in jobs)} are not one float "
                f"stack {name} [n, O, I], which {target.loader} reads"
            )
        stack = Stack(name, dtypes.pop(), (len(jobs), jobs[0].O, jobs[0].I), tuple(range(len(jobs))))
        return Grouped(tuple(jobs), stacks=(stack,))

    def _layer_stacks(self, base: str, experts: list[tuple[PlannedTensor, ...]], target: Any) -> Grouped:
        # every expert's gate / up jobs first, then the down jobs: the writer writes gate_up_proj once its members
        # are encoded, before the down projections (one stack's codes in memory at a time)
        ordered = [j for g in sorted(experts, key=lambda g: g[0].expert) for j in g]
        jobs = tuple([j for j in ordered if not _is_down(j)] + [j for j in ordered if _is_down(j)])
        E, gate = len(experts), jobs[0]
        H, I = gate.I, gate.O
        fmt = self._layer_format(base, jobs, E, target)
        by = {(j.expert, parse_name(j.out_name).projection): k for k, j in enumerate(jobs)}
        stacks = []
        for (stack, scale), (leaf, projections) in zip(self.names(base), self.stacks, strict=True):
            members = tuple(by[(e, p)] for e in range(E) for p in projections)
            if fmt in self.float_formats:  # [E, rows, cols] in the jobs' float dtype, no scales
                _, rows, width = self.geometry(leaf, H, I)
                stacks.append(Stack(stack, gate.weight_entry[1], (E, rows, width), members, fmt=fmt))
                continue
            nbytes, n_scales = self.sizes(leaf, H, I, E, fmt)
            stacks.append(Stack(stack, self.dtype, (nbytes,), members, scale, n_scales, fmt))
        return Grouped(jobs, stacks=tuple(stacks))

    def _layer_format(self, base: str, jobs: tuple[PlannedTensor, ...], E: int, target: Any) -> str:
        """The one format of a layer's routed experts (a label of ``formats`` / ``float_formats``), checked:
        experts 0..E-1 with gate [I, H], up [I, H], down [H, I] each, even widths for int4."""
        gate = jobs[0]
        H, I = gate.I, gate.O
        labels = {j.target.label for j in jobs}
        fmt = labels.pop() if len(labels) == 1 else None
        allowed = self.formats + self.float_formats
        if fmt not in allowed:
            bad = next(
                j for j in jobs if j.target.label not in allowed or j.target.label != gate.target.label
            )
            raise TargetRefused(
                f"`target={target.name}`: routed expert tensor {bad.out_name} [{bad.O}, {bad.I}] would be written as "
                f"{bad.target.label}{_why(bad)}; {target.loader} reads one fused stack per layer, all its experts in "
                f"one of {', '.join(allowed)}"
            )
        shapes = {"gate": (I, H), "up": (I, H), "down": (H, I)}
        want = {(e, p) for e in range(E) for p in shapes}
        by = {(j.expert, parse_name(j.out_name).projection): j for j in jobs}
        if (
            set(by) != want
            or len(jobs) != len(want)
            or any((j.O, j.I) != shapes[p] for (_, p), j in by.items())
        ):
            raise TargetRefused(
                f"`target={target.name}`: the routed experts of {base} are not experts 0..{E - 1} with gate [I, H], "
                f"up [I, H], down [H, I] each, which {target.loader} reads as one fused stack"
            )
        if fmt == INT4_ROW and (H % 2 or I % 2):
            raise TargetRefused(
                f"`target={target.name}`: {base}: int4 fused stacks need an even hidden size and expert width "
                f"(hidden {H}, width {I}); use `experts=int8-row`"
            )
        return fmt

    # ----------------------------------------------------------------------------------------- read side
    def scale_of(self, name: str, info: Any, infos: Mapping[str, Any]) -> str | None:
        """A quantized stack ``...experts.gate_up_proj`` / ``down_proj`` in U8 with a ``.qs`` (a float stack of
        that name is a transformers stack, read in its family's orientation)."""
        parsed = parse_name(name)
        claimed = (
            parsed.expert_base is not None and parsed.expert is None and parsed.suffix == ""
            and parsed.leaf in dict(self.stacks) and info.dtype == self.dtype and name + self.scale_suffix in infos
        )  # fmt: skip
        return name + self.scale_suffix if claimed else None

    def read(self, name: str, info: Any, infos: Mapping[str, Any], config: Mapping | None, where: str,
             group_size: int | None = None) -> LayoutRead:  # fmt: skip
        """A stack with its ``.qs``: the row size ``nbytes / (E * rows)`` against ``config.json``'s hidden size,
        expert width and routed expert count, as the engine takes it (int8-row or int4-row rows), the scale count
        exactly one per row; ``parts`` gives every expert's projections."""
        leaf, scale = parse_name(name).leaf, name + self.scale_suffix
        sinfo = infos[scale]
        if sinfo.dtype != self.scale_dtype:
            raise ResolveError(
                f"{where}: fused expert stack {name} has {sinfo.dtype} scales {scale}; expected F32"
            )
        facts = model_config.read_facts(config) if config else None
        if facts is None or not facts.expert_width or not facts.routed_experts:
            return LayoutRead(scale, problem=(
                f"{where}: fused expert stack {name} ({info.nbytes} bytes) needs config.json's hidden size, expert "
                f"width and routed expert count for its rows, and {'there is none' if facts is None else 'it lacks one'}"
            ))  # fmt: skip
        H, I, E = facts.hidden_size, facts.expert_width, facts.routed_experts
        n_scales = sinfo.nbytes // 4
        fmt = self.identify(leaf, H, I, E, info.nbytes, n_scales) if sinfo.nbytes % 4 == 0 else None
        if fmt is None:
            want_b, want_s = self.sizes(leaf, H, I, E, INT8_ROW)
            raise ResolveError(
                f"{where}: fused expert stack {name} is {info.nbytes} bytes with {n_scales} scales; config.json "
                f"({E} experts, hidden {H}, expert width {I}) implies {want_b} bytes (int8-row) or {want_b // 2} "
                f"(int4-row) with {want_s} row scales"
            )
        return LayoutRead(scale, fmt, None, self.parts(leaf, H, I, E, fmt))

    def check_resolved(self, resolved: Mapping[str, Any]) -> None:
        """``c/inkling.c`` takes the first MoE layer's ``gate_up_proj`` for every stack: U8 means every stack is
        read as U8 rows of that one row format. A container whose quantized stacks differ, or that mixes them
        with float stacks, is one the engine misreads: a ResolveError naming two of them."""
        stacks = {
            n: t
            for n, t in resolved.items()
            if parse_name(n).leaf in dict(self.stacks) and parse_name(n).expert_base is not None
            and parse_name(n).suffix == "" and t.kind in ("quantized", "float")
        }  # fmt: skip
        quantized = {n: t for n, t in stacks.items() if t.parts}
        if not quantized:
            return
        first = next(iter(quantized.values()))
        for name, t in stacks.items():
            if t.format is None or first.format is None or t.format.name != first.format.name:
                got = t.format.label if t.format is not None else t.dtype
                raise ResolveError(
                    f"{t.file}: fused expert stack {name} is {got} but {first.name} is {first.format.label}; "
                    f"c/inkling.c reads every stack in one format (the first MoE layer's gate_up_proj row size)"
                )


def _is_down(job: PlannedTensor) -> bool:
    parsed = parse_name(job.out_name)
    return parsed.expert is not None and parsed.suffix == "weight" and parsed.projection == "down"


FUSED = FusedLayout()
