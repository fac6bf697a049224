"""The conversion recipe (docs/FORMATS.md §5): every source tensor -> a role -> a target format.

Rules apply in order, the first match decides (docs/FORMATS.md §5, rows 0-6):

0. non-float tensors (I64 ``ffn.gate.tid2eid``, ...): copied unchanged;
1. multimodal towers and projectors (``visual.``, ``vision_tower.``, ``mm_projector.``, ...): kept in their
   source dtype (``--towers keep``) or left out (``--towers drop``, listed in the manifest);
2. routers and their biases, every tensor that is not 2-D and not an expert stack (norms, biases, conv kernels
   ``[C, 1, K]``, ``A_log`` of any rank), 2-D parameters that are not linear weights (``hc_*``, sinks, ``*ape``,
   ``dt_bias``, ... :func:`colitools.formats.names.is_small_param`), stack biases: F32 always;
3. MTP layers (layer index ``>= num_hidden_layers``, or an ``mtp.`` module): ``--mtp``;
4. embeddings and heads (``embed_tokens``, ``lm_head``, ``head``, ``embed``, ``unembed``) and other lookup tables
   (Qwen3.8's PLE ``ngram_embedding`` row shards, :func:`colitools.formats.names.is_lookup_table`): ``--embed``;
5. routed experts (``.experts.{E}.`` names and expert stacks, split per expert in the family's orientation,
   ``families.stack_orientation``): ``--experts``;
6. every other 2-D weight: ``--dense``.

``choose_target`` then decides what is actually written for one ``[O, I]`` tensor, with the fallbacks of §6
(to int8-row, each with a reason) and the metadata stamp where the byte signature is ambiguous (§3).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from functools import lru_cache
from typing import Any

from colitools.converters.cached import cached_property
from colitools.formats import layouts, names, registry, resolver, source_encodings, targets
from colitools.formats.errors import ConvertError, FormatError, ParameterError, TargetRefused
from colitools.formats.format_names import NATIVE_OPTION, format_label
from colitools.formats.names import (
    PROJECTION_ORDER,
    Orientation,
    TensorRole,
    expert_tensor_name,
    is_mtp_module,
    is_tower,
    parse_name,
    shared_stack,
)
from colitools.formats.quantizers import QUANTIZERS, RTN, mode_for
from colitools.formats.registry import (
    DEFAULT_GROUP_SIZE,
    GROUP_SIZES,
    Float,
    Format,
    FormatChoice,
    by_name,
    parse_format_option,
    writer_group_size,
)
from colitools.formats.source_encodings import SourceEncoding

LAYOUTS = layouts.OPTION_NAMES  # the --layout values (formats/layouts.py)
DEFAULT_OPTIONS = {"experts": "int4-g64", "dense": "int8-row", "embed": "int8-row", "mtp": "int8-row"}
TOWERS = ("keep", "drop")  # the --towers values (rule 1)
SOURCE = "source"  # Target.fmt of a tensor copied in its source dtype, bytes unchanged (rules 0 and 1)
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2")
FALLBACK_FORMAT = registry.FALLBACK_FORMAT.name
BF16 = "bf16"  # Target.fmt of a float tensor stored as BF16 (the recipe option of the same name)


class Role(StrEnum):
    """Why a tensor gets its format (the recipe rule that matched)."""

    COPY = "copy"  # rule 0: non-float tensors, copied unchanged
    TOWER = "tower"  # rule 1: multimodal towers, source dtype unchanged
    FLOAT = "float"  # rule 2: routers, tensors that are not 2-D, small parameters: F32 always
    MTP = "mtp"
    EMBED = "embed"
    EXPERT = "expert"
    DENSE = "dense"


# ------------------------------------------------------------------------------------------------ names
# Every spelling lives in the tensor-name map (formats/names.py); these are the recipe's views of a parse.


@dataclass(frozen=True)
class LayerKey:
    """The decoder layer a tensor belongs to: ``prefix`` (e.g. ``model.layers``) and ``index``."""

    prefix: str
    index: int

    @property
    def name(self) -> str:
        return f"{self.prefix}.{self.index}"


@lru_cache(maxsize=1 << 18)  # as parse_name: planning asks it 2-3 times of each tensor
def layer_of(name: str) -> LayerKey | None:
    """The layer of ``name`` (``...layers.{N}....``), or None for global tensors (embeddings, final norm, head)."""
    parsed = parse_name(name)
    return LayerKey(parsed.layer_prefix, parsed.layer) if parsed.layer is not None else None


@dataclass(frozen=True)
class ExpertName:
    """A per-expert tensor name: ``{base}.{expert}.{proj}`` (``base`` ends in ``experts``).

    ``projection`` (``gate``/``up``/``down``) is set when ``proj`` is a projection's ``.weight``."""

    base: str
    expert: int
    proj: str
    projection: str | None = None
    bias: str | None = None  # the projection of a per-expert bias (``...experts.{E}.gate_proj.bias``)

    @property
    def order(self) -> tuple[int, int, str]:
        """Sort key inside one expert (pairs layout, §4): its weights gate, up, down, then its biases gate, up,
        down (written after the scales, ``expert_layouts.Grouped.trailing``), anything else after, by name."""
        if self.projection:
            return (0, PROJECTION_ORDER.index(self.projection), self.proj)
        if self.bias:
            return (1, PROJECTION_ORDER.index(self.bias), self.proj)
        return (2, 0, self.proj)

    @property
    def is_down(self) -> bool:
        return self.projection == "down"


@lru_cache(maxsize=1 << 18)  # as parse_name: planning asks it 2-3 times of each tensor
def expert_of(name: str) -> ExpertName | None:
    """Parse a per-expert name (``...experts.{E}.gate_proj.weight``, Mixtral ``...experts.{E}.w1.weight``)."""
    parsed = parse_name(name)
    if parsed.expert is None:
        return None
    projection = parsed.projection if parsed.suffix == "weight" else None
    bias = parsed.projection if parsed.suffix == "bias" and parsed.projection in PROJECTION_ORDER else None
    return ExpertName(parsed.expert_base, parsed.expert, parsed.expert_tensor, projection, bias)


@dataclass(frozen=True)
class FusedExperts:
    """An expert stack: ``{base}.gate_up_proj`` / ``w13_weight`` / ``down_proj`` / ``w2_weight`` / a separate
    ``gate_proj`` / ``up_proj`` ``[E, rows, cols]``, or a stack bias ``{base}.gate_up_proj_bias`` ``[E, out]``
    (``bias``), split per expert on output in the family's orientation (§6 "Expert stacks")."""

    base: str
    projection: str  # "gate_up" | "gate" | "up" | "down" (names.EXPERT_STACKS / STACK_BIASES)
    bias: bool = False


@lru_cache(maxsize=1 << 18)  # as parse_name: planning asks it 2-3 times of each tensor
def fused_of(name: str) -> FusedExperts | None:
    parsed = parse_name(name)
    if parsed.expert is not None or parsed.expert_base is None:  # not an expert stack
        return None
    return FusedExperts(parsed.expert_base, parsed.projection, parsed.role is TensorRole.STACK_BIAS)


@dataclass(frozen=True)
class ExpertSlice:
    """One output tensor cut from a stack: expert ``expert``, rows ``row0:row1:step`` of its slab ``[rows,
    cols]`` (``transposed``: those columns of the slab, transposed; a stack bias: those entries of row
    ``expert``)."""

    out_name: str
    expert: int
    row0: int
    row1: int
    step: int = 1
    transposed: bool = False

    @property
    def count(self) -> int:
        return len(range(self.row0, self.row1, self.step))

    @property
    def contiguous(self) -> bool:
        """Rows ``[row0, row1)`` of the slab, as stored (one positional read, FP8 scale rows apply)."""
        return self.step == 1 and not self.transposed

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The output tensor's shape: ``(O, I)`` for a weight, ``(n,)`` for a bias."""
        if len(shape) == 2:
            return (self.count,)
        return (self.count, shape[1] if self.transposed else shape[2])

    def pick(self, slab):
        """This slice of ``slab`` (the expert's ``[rows, cols]`` slab, or its bias row), contiguous."""
        import numpy as np

        if slab.ndim == 1:
            return np.ascontiguousarray(slab[self.row0 : self.row1 : self.step])
        if self.transposed:
            return np.ascontiguousarray(slab[:, self.row0 : self.row1 : self.step].T)
        return np.ascontiguousarray(slab[self.row0 : self.row1 : self.step])


def split_fused(
    name: str, shape: tuple[int, ...], orientation: Orientation = Orientation.ROWS
) -> list[ExpertSlice]:
    """Per-expert output tensors of stack ``name`` with ``shape`` (3-D; a stack bias 2-D), in expert order
    (gate before up), laid out as the family's ``orientation`` says."""
    fused = fused_of(name)
    if fused is None or len(shape) != (2 if fused.bias else 3):
        raise ConvertError(f"tensor {name}: not a fused expert tensor [E, rows, cols] (shape {list(shape)})")
    transposed = orientation.transposed and not fused.bias
    E = shape[0]
    n = shape[-1] if transposed or fused.bias else shape[1]  # the stack's output axis
    suffix = "bias" if fused.bias else "weight"
    out: list[ExpertSlice] = []
    if fused.projection == "gate_up":
        if n % 2:
            raise ConvertError(
                f"tensor {name}: fused gate/up stack needs an even row count (2I), got shape {list(shape)}"
            )
        half = n // 2
        interleaved = orientation.interleaved
        for e in range(E):
            for k, proj in enumerate(("gate", "up")):
                out_name = expert_tensor_name(fused.base, e, proj, suffix)
                if interleaved:
                    out.append(ExpertSlice(out_name, e, k, n, 2, transposed))
                else:
                    out.append(ExpertSlice(out_name, e, k * half, (k + 1) * half, 1, transposed))
    else:
        out = [
            ExpertSlice(expert_tensor_name(fused.base, e, fused.projection, suffix), e, 0, n, 1, transposed)
            for e in range(E)
        ]
    return out


def is_embedding(name: str) -> bool:
    """An embedding or output-head weight (``embed_tokens.weight``, ``lm_head.weight``; rule 3)."""
    parsed = parse_name(name)
    return parsed.role in (TensorRole.EMBED, TensorRole.HEAD) and parsed.suffix == "weight"


def is_float_dtype(dtype: str | None) -> bool:
    return dtype is None or dtype in FLOAT_DTYPES


def classify(name: str, ndim: int, num_hidden_layers: int | None, dtype: str | None = None) -> Role:
    """The recipe role of source tensor ``name`` with ``ndim`` dims and source ``dtype`` (rules 0-6).

    ``num_hidden_layers`` (from config.json) decides the MTP rule; None disables it. Every tensor gets a role:
    one that is not 2-D and not an expert stack is rule 2 (F32)."""
    if not is_float_dtype(dtype):
        return Role.COPY
    if is_tower(name):
        return Role.TOWER
    fused = fused_of(name)
    stack = fused is not None and ndim == (2 if fused.bias else 3)
    if fused is not None and fused.bias:
        return Role.FLOAT  # stack biases: split per expert, F32
    shared = ndim == 3 and shared_stack(name) is not None  # stacked shared experts: split, rule 6 (or 3)
    if not stack and not shared and names.keeps_f32(name, ndim):  # rule 2 (formats/names.py owns its spellings)
        return Role.FLOAT
    layer = layer_of(name)
    if layer is not None and num_hidden_layers is not None and layer.index >= num_hidden_layers:
        return Role.MTP
    if is_mtp_module(name):
        return Role.MTP
    if is_embedding(name) or names.is_lookup_table(name):  # Qwen3.8's PLE n-gram tables too
        return Role.EMBED
    if stack or expert_of(name) is not None:
        return Role.EXPERT
    return Role.DENSE


def split_shared(name: str, shape: tuple[int, ...], orientation: Orientation = Orientation.ROWS) -> list[ExpertSlice]:
    """Per-shared-expert output tensors of the stacked shared expert ``name`` ``[n, rows, cols]``
    (``names.shared_stack``): ``{base}.{k}.{gate,up,down}_proj.weight`` in k order (gate before up); a gate/up
    stack's rows interleaved or halved as the family's ``orientation`` says (transposed stacks are refused)."""
    stack = shared_stack(name)
    if stack is None or len(shape) != 3:
        raise ConvertError(f"tensor {name}: not a stacked shared expert [n, rows, cols] (shape {list(shape)})")
    if orientation.transposed:
        raise ConvertError(f"tensor {name}: a stacked shared expert in the {orientation} orientation is not supported")
    n, rows = shape[0], shape[1]
    if stack.projection != "gate_up":
        return [ExpertSlice(stack.expert_name(k, stack.projection), k, 0, rows) for k in range(n)]
    if rows % 2:
        raise ConvertError(f"tensor {name}: stacked shared gate/up needs an even row count, got shape {list(shape)}")
    half, out = rows // 2, []
    for k in range(n):
        for i, proj in enumerate(("gate", "up")):
            if orientation is Orientation.ROWS_INTERLEAVED:
                out.append(ExpertSlice(stack.expert_name(k, proj), k, i, rows, 2))
            else:
                out.append(ExpertSlice(stack.expert_name(k, proj), k, i * half, (i + 1) * half))
    return out


# ----------------------------------------------------------------------------------------------- budget
BUDGET_ROLES = (Role.EXPERT, Role.DENSE, Role.EMBED, Role.MTP)  # rules 3-6: what a size budget chooses (§10)
BUDGET_OBJECTIVE = "sum over tensors of importance x squared error (float64, as decoded)"


@dataclass(frozen=True)
class Budget:
    """A size budget (docs/FORMATS.md §12): ``size`` bytes of tensor data, or ``bpw`` bits per weight; ``usage``
    the sha256 of the routing history weighting the routed experts (None: none). ``formats``: the allocation,
    ``(tensor, recipe option)`` per tensor whose format it chose (empty until ``converters/budget.py`` chose),
    by the tensor's recipe name (before a target renames it)."""

    size: int | None = None
    bpw: float | None = None
    usage: str | None = None
    formats: tuple[tuple[str, str], ...] = ()

    def option_of(self, name: str, default: str) -> str:
        """The option allocated to tensor ``name``, else ``default``."""
        return self._lookup.get(name, default)

    @cached_property
    def _lookup(self) -> dict[str, str]:
        return dict(self.formats)

    def __getstate__(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def as_dict(self) -> dict[str, Any]:
        """What the recipe records (its fingerprint): the budget, the objective and a digest of the allocation
        (the per-tensor formats are in the manifest's ``budget`` section and in the index)."""
        d: dict[str, Any] = {"target_size": self.size} if self.size is not None else {"target_bpw": self.bpw}
        d["objective"] = BUDGET_OBJECTIVE
        if self.usage is not None:
            d["usage_sha256"] = self.usage
        if self.formats:
            blob = json.dumps(sorted(self.formats), separators=(",", ":")).encode()
            d["formats_sha256"] = hashlib.sha256(blob).hexdigest()
        return d


# ----------------------------------------------------------------------------------------------- recipe
@dataclass(frozen=True)
class Recipe:
    """The format options of one conversion (§6) and the output layout. Part of the resume fingerprint."""

    experts: str = DEFAULT_OPTIONS["experts"]
    dense: str = DEFAULT_OPTIONS["dense"]
    embed: str = DEFAULT_OPTIONS["embed"]
    mtp: str = DEFAULT_OPTIONS["mtp"]
    layout: str = layouts.PAIRS.option
    towers: str = "keep"  # rule 1: keep | drop
    target: targets.Target = targets.GENERIC  # --target (formats/targets/): recorded by name
    quantizer: str = RTN  # --quantizer rtn | mse (FORMATS §11): recorded only when not rtn
    budget: Budget | None = None  # --target-size / --target-bpw (§10): recorded only when given
    # --experts-down: the routed experts' down projections (rule 5), None: ``experts``; recorded only when given
    experts_down: str | None = None

    @classmethod
    def from_options(
        cls,
        experts: str | None = None,
        dense: str | None = None,
        embed: str | None = None,
        mtp: str | None = None,
        group_size: int | None = None,
        layout: str | None = None,
        towers: str | None = None,
        target: targets.Target = targets.GENERIC,
        quantizer: str = RTN,
        experts_down: str | None = None,
    ) -> Recipe:
        """Build and validate a recipe from CLI-style options.

        ``group_size`` is the group size of every int4-grouped choice: the default ``--experts`` becomes
        ``int4-g{group_size}``, an option given as ``int4-g{group_size}`` is accepted, and an option naming a
        different ``int4-g*`` is refused as a contradiction. ``target`` (formats/targets/) gives the defaults
        of its loader (``layout`` / ``towers`` None: the target's, else ``pairs`` / ``keep``) and refuses, in one line, an option, layout
        or towers value that loader cannot read."""
        tgt = target
        tgt.check_writable()
        layout = layout if layout is not None else tgt.default("layout") or layouts.PAIRS.option
        tgt.check_option("layout", layout)
        if group_size is not None and group_size not in GROUP_SIZES:
            raise ParameterError(f"`group_size={group_size}` is not one of {', '.join(map(str, GROUP_SIZES))}")
        if layout not in LAYOUTS:
            raise ParameterError(f"`layout={layout!r}`: choose one of {', '.join(LAYOUTS)}")
        towers = towers if towers is not None else tgt.default("towers") or "keep"
        if towers not in TOWERS:
            raise ParameterError(f"`towers={towers!r}`: choose one of {', '.join(TOWERS)}")
        given = {"experts": experts, "dense": dense, "embed": embed, "mtp": mtp}
        values: dict[str, str] = {}
        qpack = layout == layouts.QPACK.option
        for option, value in given.items():
            if value is None:
                value = tgt.default(option) or DEFAULT_OPTIONS[option]
                if qpack and option == "experts":
                    value = f"{QPACK_EXPERTS}{group_size or DEFAULT_GROUP_SIZE}"
                elif group_size is not None and value.startswith("int4-g"):
                    value = f"int4-g{group_size}"
            choice = _parsed(option, value, group_size)
            if not _check_qpack(option, value, choice, qpack):
                tgt.check_option(option, value)
            values[option] = value
        tgt.check_option("towers", towers)
        if quantizer not in QUANTIZERS:
            raise ParameterError(f"`quantizer={quantizer!r}`: choose one of {', '.join(QUANTIZERS)}")
        if experts_down is not None:
            choice = _parsed("experts_down", experts_down, group_size)
            if qpack or not choice.fmt or not choice.fmt.pairs:
                raise ParameterError(f"`experts_down={experts_down}`: a QPACK container holds one affine format")
            tgt.check_option("experts_down", experts_down)
        return cls(layout=layout, towers=towers, target=target, quantizer=quantizer, experts_down=experts_down,
                   **values)  # fmt: skip

    @property
    def quantizer_mode(self) -> str:
        """The encoders' mode for this recipe's ``quantizer``: ``mse`` writes negative scales only where the
        target's engine was run on them (``Target.signed_scales``) and the layout is pairs (docs/FORMATS.md
        §11), else ``mse-positive``."""
        signed = self.target.signed_scales and self.layout == layouts.PAIRS.option
        return mode_for(self.quantizer, signed)

    def option_for(self, role: Role) -> str:
        """The format option governing ``role`` (``f32`` for rule 1)."""
        if role in (Role.COPY, Role.TOWER):
            return SOURCE
        return (
            "f32"
            if role is Role.FLOAT
            else getattr(self, role.value if role is not Role.EXPERT else "experts")
        )

    def tensor_option(self, role: Role, name: str) -> str:
        """The format option of tensor ``name`` (its recipe name) of ``role``: the budget's allocation, else the
        role's option (``option_for``)."""
        option = self.option_for(role)
        if role is Role.EXPERT and self.experts_down is not None:
            parsed = expert_of(name)
            option = self.experts_down if parsed is not None and parsed.is_down else option
        return option if self.budget is None else self.budget.option_of(name, option)

    def with_option(self, role: Role, option: str) -> Recipe:
        """This recipe with ``role``'s option (rules 3-6) set to ``option``."""
        return replace(self, **{option_name(role): option})

    def as_dict(self) -> dict[str, str]:
        """The options as recorded; ``towers`` only when it is not the default ``keep``, ``target`` only when
        it is not ``generic``, ``quantizer`` only when it is not ``rtn`` and ``budget`` only when given (so the
        fingerprint of every such recipe is what it was before the option existed)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["target"] = self.target.name
        if self.budget is None:
            del d["budget"]
        else:
            d["budget"] = self.budget.as_dict()
        if d["towers"] == "keep":
            del d["towers"]
        if d["target"] == targets.GENERIC_NAME:
            del d["target"]
        if d["quantizer"] == RTN:
            del d["quantizer"]
        if d["experts_down"] is None:
            del d["experts_down"]
        return d

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the recipe (what the resume ledger compares)."""
        blob = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def differences(self, recorded: dict[str, str]) -> list[str]:
        """Human-readable `` `option=recorded` (recorded) vs now (now)`` for every option that differs from
        ``recorded``."""
        out = []
        for key, now in self.as_dict().items():
            before = recorded.get(key)
            if before != now:
                out.append(f"`{key}={before}` (recorded) vs {now} (now)")
        return out


def _parsed(option: str, value: str, group_size: int | None) -> FormatChoice:
    """``option=value`` parsed (ParameterError for an unknown format), its group size checked against
    ``group_size`` (ConvertError for a contradiction)."""
    try:
        choice = parse_format_option(value)
    except FormatError as exc:
        raise ParameterError(f"`{option}`: {exc}") from None
    if group_size is not None and choice.gs is not None and choice.gs != group_size:
        raise ConvertError(f"`{option}={value}` contradicts `group_size={group_size}`")
    return choice


QPACK_EXPERTS = "affine4-g"  # --layout qpack's default experts: affine4-g{group size} (MLX's and Swiftlet's)


def _check_qpack(option: str, value: str, choice: FormatChoice, qpack: bool) -> bool:
    """Whether ``option=value`` is a QPACK container's routed experts (an affine format with ``layout=qpack``,
    which the target's option list does not name); ParameterError for an affine format anywhere else (a pair
    would resolve as int4-grouped, FORMATS §2.12) and for ``layout=qpack`` experts of another format."""
    affine = choice.fmt is not None and not choice.fmt.pairs
    if qpack and option == "experts":
        if not affine:
            raise ParameterError(
                f"`layout=qpack` holds the routed experts as MLX-affine codes: `experts=affine4-g{{32,64,128}}` or "
                f"`affine8-g{{32,64,128}}`, not `{value}`"
            )
        return True
    if affine:
        raise ParameterError(
            f"`{option}={value}` is written only into a QPACK container's routed experts (`target=qwen36`, "
            f"`layout=qpack`, `experts={value}`)"
        )
    return False


# ------------------------------------------------------------------------------------------ target choice
@dataclass(frozen=True)
class Fallback:
    """A tensor that could not get the requested format and was written as int8-row instead (§6)."""

    tensor: str
    requested: str
    written: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    """What is written for one output tensor.

    ``fmt`` is a format stamp name (``f32``, ``int8-row``, ``int4-grouped``, ``mxfp4``, ``fp8-e4m3-b128``, ...)
    or ``bf16`` (a float tensor stored as BF16). ``gs`` is the int4-grouped group size actually written,
    ``stamp`` the ``colibri.fmt`` stamp when the byte signature is ambiguous, ``fallback`` set when the
    requested format could not be used."""

    fmt: str
    gs: int | None = None
    stamp: str | None = None
    fallback: Fallback | None = None
    native: bool = False  # the source's own quantization copied losslessly (``native``, §6)
    spelling: targets.Spelling | None = None  # a --target loader's names and dtypes for the format's tensors
    quantizer: str = RTN  # the encoder mode of its scales (``quantizers.MODES``, FORMATS §11)

    @cached_property  # a plan shares a few targets among all its tensors: asked ~7 times per tensor
    def format_class(self) -> type[Format]:
        return Float if self.fmt in (BF16, SOURCE) else by_name(self.fmt)

    def __getstate__(self) -> dict:
        """Its fields (a recorded plan pickles targets): not what it cached."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_quantizer(self, mode: str) -> Target:
        """This target with the encoder mode ``mode`` (``Recipe.quantizer_mode``) where it applies: a format
        whose scales a quantizer chooses (``Format.mse_scales``), encoded rather than kept native."""
        if mode == RTN or self.native or self.is_source or not self.format_class.mse_scales:
            return self
        return replace(self, quantizer=mode)

    @property
    def is_source(self) -> bool:
        """Written in the source tensor's own dtype, bytes unchanged (rules 0 and 1)."""
        return self.fmt == SOURCE

    @property
    def is_float(self) -> bool:
        return not self.format_class.quantized

    @property
    def is_bf16(self) -> bool:
        """A float tensor stored as BF16 (else float tensors are F32)."""
        return self.fmt == BF16

    @property
    def is_passthrough(self) -> bool:
        """Source bytes written unchanged (fp8-e4m3-b128): quantized, but not a format colitools encodes."""
        return self.format_class.quantized and not self.format_class.writable

    @property
    def label(self) -> str:
        """The recipe-style name of what is written (``int4-g64``, ``int8-row``, ``bf16``, ...)."""
        if self.fmt != BF16 and self.format_class.grouped:
            return format_label(self.format_class.name, self.gs)
        return self.fmt

    @cached_property  # asked of every tensor by the plan's summary figures
    def written_label(self) -> str:
        """The user-facing name of what this target writes (``Format.label``: floats by their stored dtype)."""
        return self.format_class.label(self.gs, "BF16" if self.is_bf16 else "F32")

    def tensor_names(self, out_name: str) -> tuple[str, str | None]:
        """``(weight tensor name, scale tensor name or None)`` for output tensor ``out_name``."""
        if self.spelling is not None:
            return self.spelling.tensor_names(out_name)
        return self.format_class.tensor_names(out_name)

    def coded(self, O: int, I: int, scale: bool = False) -> tuple[str, tuple[int, ...]]:
        """``(dtype, shape)`` of the weight (``scale``: the scale) tensor this quantized target writes for an
        ``[O, I]`` tensor. Once per shape: a plan's 92k tensors share a few targets and a few shapes."""
        key = (O, I, scale)
        known = self._coded.get(key)
        if known is None:
            fmt = self.format_class
            known = self._coded[key] = (
                (self.scale_dtype, fmt.scale_shape(O, I, self.gs))
                if scale
                else (self.weight_dtype, fmt.weight_shape(O, I, self.gs))
            )
        return known

    @cached_property
    def _coded(self) -> dict[tuple[int, int, bool], tuple[str, tuple[int, ...]]]:
        return {}

    @property
    def weight_dtype(self) -> str:
        """The safetensors dtype of the quantized weight (codes) tensor."""
        return self.spelling.weight_dtype if self.spelling is not None else self.format_class.weight_dtype

    @property
    def scale_dtype(self) -> str:
        return self.spelling.scale_dtype if self.spelling is not None else self.format_class.scale_dtype


@dataclass(frozen=True)
class SourceKind:
    """What the source tensor is: ``fp8_block`` = (rows, cols) of its FP8 scale blocks, None for float;
    ``native`` its natively quantized encoding (``formats/source_encodings/``), with its inputs per scale and
    whether a format holds it exactly."""

    dtype: str
    fp8_block: tuple[int, int] | None = None
    fused: bool = False
    native: type[SourceEncoding] | None = None  # a paired encoding (MXFP4, INT4, NVFP4, MXFP8)
    native_group: int | None = None  # inputs per scale of that encoding
    native_exact: bool = True  # False: asymmetric / act-order INT4, NVFP4, MXFP8 (no format holds it exactly)
    native_rows: int | None = None  # rows per scale where the encoding has two grids (DeepSeek-V4.1's FP8)

    @property
    def encoding(self) -> type[SourceEncoding] | None:
        """The source encoding of the tensor: its native one, FP8 block-scaled, or None (a float tensor)."""
        if self.native is not None:
            return self.native
        return source_encodings.FP8_BLOCK if self.fp8_block is not None else None


def choose_target(name: str, role: Role, option: str, O: int, I: int, source: SourceKind) -> Target:
    """Decide the format written for output tensor ``name`` (logical ``[O, I]``) of ``role`` under recipe
    ``option``, applying the fallbacks of §6 and the stamping rules of §3.

    A fallback goes to int8-row and carries its reason. Routed experts are never stamped: an expert whose
    bytes would be ambiguous falls back instead. (The decision does not depend on the name: it is computed
    once per distinct ``(role, option, O, I, source)``, which keeps planning a 100k-tensor model fast.)"""
    if role in (Role.COPY, Role.TOWER):
        return Target(SOURCE)
    routed = role is Role.EXPERT or expert_of(name) is not None  # MTP layers have routed experts too
    if option == NATIVE_OPTION and role is not Role.FLOAT:
        target = _choose_native(routed, DEFAULT_OPTIONS[_ROLE_OPTION[role]], O, I, source)
    else:
        target = _choose_target(routed, role is Role.FLOAT, option, O, I, source)
    if target.fallback is not None:
        fb = target.fallback
        target = replace(target, fallback=Fallback(name, fb.requested, fb.written, fb.reason))
    return target


@lru_cache(maxsize=4096)
def _choose_target(expert: bool, float_role: bool, option: str, O: int, I: int, source: SourceKind) -> Target:
    name = ""
    role = Role.EXPERT if expert else Role.FLOAT if float_role else Role.DENSE
    if role is Role.FLOAT:
        return Target(Float.name)
    choice = parse_format_option(option)
    if not choice.fmt.quantized:  # f32 or bf16
        return Target(choice.option)

    def fallback(reason: str) -> Target:
        # int8-row is ambiguous against e8-iq3-lattice (I == 98, O == 1) and colibri's UE8M0-FP8 signature
        # (§3 rule 7), both settled by a stamp; a routed expert is never stamped, so it is written F32 there.
        try:
            stamp = resolver.stamp_for(name, FALLBACK_FORMAT, O, I, None, allow_stamp=role is not Role.EXPERT)
        except FormatError as exc:
            if role is Role.EXPERT and exc.reason is resolver.ResolveReason.NEEDS_STAMP:
                why = f"{reason}; {FALLBACK_FORMAT} too would need a stamp ({_reason(exc)})"
                return Target(Float.name, None, None, Fallback(name, option, Float.name, why))
            raise ConvertError(  # pragma: no cover - not reachable with the spec's signatures
                f"tensor {name}: even the {FALLBACK_FORMAT} fallback would not resolve back: {exc}"
            ) from None
        return Target(FALLBACK_FORMAT, None, stamp, Fallback(name, option, FALLBACK_FORMAT, reason))

    fmt_name = choice.fmt.name
    gs: int | None = None
    if not choice.fmt.pairs:  # an affine format: a QPACK container's experts, its group size kept, no stamp
        if I % choice.gs:  # TargetRefused: a size budget leaves this candidate out
            raise TargetRefused(
                f"`{option}`: a routed expert [{O}, {I}] cannot be cut in groups of {choice.gs} (QPACK needs "
                f"I % group size == 0); choose another group size"
            )
        return Target(fmt_name, choice.gs)
    if not choice.fmt.writable:  # fp8: passthrough of the source's bytes
        if source.fp8_block != (128, 128):
            what = (
                f"FP8 with {source.fp8_block[0]}x{source.fp8_block[1]} blocks"
                if source.fp8_block
                else source.dtype
            )
            return fallback(
                f"fp8 passthrough needs an FP8 source with 128x128 blocks; the source tensor is {what}"
            )
        if source.fused:
            return fallback("fp8 passthrough of a fused expert tensor is not supported")
    elif choice.fmt.grouped:
        gs = writer_group_size(I, choice.gs or DEFAULT_GROUP_SIZE)
        if gs is None:  # I <= gs: one group per row is int4-row (same values and bytes), spec §2.4
            fmt_name = registry.Int4Row.name
    try:
        choice.fmt.check_encodable(O, I, name=name)
    except FormatError as exc:
        return fallback(_reason(exc))
    try:  # §3: stamp only genuinely ambiguous signatures, never a routed expert; else fall back
        stamp = resolver.stamp_for(name, fmt_name, O, I, gs, allow_stamp=role is not Role.EXPERT)
        resolver.check_roundtrip(name, fmt_name, gs, O, I, stamp)
    except FormatError as exc:
        return fallback(_reason(exc))
    return Target(fmt_name, gs, stamp)


_ROLE_OPTION = {Role.EXPERT: "experts", Role.DENSE: "dense", Role.EMBED: "embed", Role.MTP: "mtp"}


def option_name(role: Role) -> str:
    """The recipe option (``experts``, ``dense``, ``embed``, ``mtp``) that governs ``role`` (rules 3-6)."""
    return _ROLE_OPTION[role]
NATIVE_DECODED = "decoded"  # Fallback.reason prefix of a native tensor whose own form no format holds exactly


@lru_cache(maxsize=4096)
def _choose_native(expert: bool, default: str, O: int, I: int, source: SourceKind) -> Target:
    """``native`` (§6): keep the source's own quantization where a format holds it exactly, as its encoding's
    ``native_form`` says — FP8 128x128 blocks -> fp8, MXFP4 -> mxfp4 (nibbles and E8M0 bytes copied), symmetric
    INT4 group ``g`` -> int4-grouped gs ``g`` (int4-row when ``I <= g``; int8-row when gs ``g`` would not resolve
    back). Anything else gets the option's ``default`` on its decoded values; a natively quantized source that is
    decoded so carries a Fallback."""
    enc = source.encoding
    if enc is None:  # a float source: the option's default
        return _choose_target(expert, False, default, O, I, source)
    block = source.fp8_block
    if block is None and source.native_rows is not None:  # an encoding's own grid: rows x inputs per scale
        block = (source.native_rows, source.native_group)
    form = enc.native_form(O, I, group=source.native_group, exact=source.native_exact, block=block, fused=source.fused)
    if form.option is None:
        t = _choose_target(expert, False, default, O, I, source)
        if form.decoded is None or t.fallback is not None:  # FP8 blocks, or the default's own fallback
            return t
        reason = f"{NATIVE_DECODED}: {form.decoded}, no format holds it exactly; written as {t.label}"
        return replace(t, fallback=Fallback("", NATIVE_OPTION, t.label, reason))
    t = _choose_target(expert, False, form.option, O, I, source)
    if form.fallback is not None:  # the encoding's own form would not resolve back: a recorded fallback
        return replace(t, fallback=Fallback("", NATIVE_OPTION, form.option, form.fallback))
    return t if t.fallback is not None or not form.copies else replace(t, native=True)


def _reason(exc: FormatError) -> str:
    """The fallback reason recorded in the manifest. An error that classifies itself (``exc.reason``: every
    error of the registry's and resolver's writer checks) gives its ``detail``, the message without the
    leading ``tensor <name>:`` and the writer advice; anything else its whole message."""
    return exc.detail if exc.reason is not None and exc.detail is not None else str(exc)


# ------------------------------------------------------------------------- experts of a natively quantized source
@dataclass(frozen=True)
class ExpertsChoice:
    """How a conversion's ``experts`` option was chosen (the summary and the manifest's ``experts_choice``).

    ``option``: the value used; ``by``: ``given`` (the caller's ``experts`` or ``group_size``), ``target`` (its
    loader's default), ``native`` (the default for a source whose routed experts a registered format holds
    exactly, §6 ``native``) or ``default``; ``sources``: the routed experts' natively quantized encodings (their
    labels), empty for a float or FP8 source; ``kept``: the formats that hold them exactly (``mxfp4``,
    ``int4-g32``), empty when none does."""

    option: str
    by: str
    sources: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    why_not: str | None = None  # why ``native`` was not the default although a format holds the experts

    def as_dict(self) -> dict[str, Any]:
        return {"experts": self.option, "by": self.by, "sources": list(self.sources), "kept": list(self.kept)}

    @property
    def line(self) -> str | None:
        """One line for the human summary; None for a source without natively quantized routed experts."""
        if not self.sources:
            return None
        src = f"{'/'.join(self.sources)} routed experts"
        why = {
            "given": "as given",
            "target": "the target's default",
            "native": f"the default for {src}: kept byte for byte as {'/'.join(self.kept)}",
            "default": "the default",
        }[self.by]
        return f"experts: {self.option} ({why})"


NativeExperts = Iterable[tuple[type[SourceEncoding], source_encodings.NativeForm]]


def choose_experts(recipe: Recipe, *, given: bool, natives: NativeExperts) -> tuple[Recipe, ExpertsChoice]:
    """The recipe with its ``experts`` default chosen for this source: ``native`` when the caller chose no
    ``experts`` (nor ``group_size``), the target has no default of its own and reads ``native``, and a registered
    format holds some routed expert's source encoding exactly (``natives``: each natively quantized routed
    expert's encoding and ``native_form``); otherwise the recipe as it is. ``native`` decodes what no format holds
    into the default (int4-g64) as before, so it never writes less than the default would."""
    natives = list(natives)
    sources = tuple(dict.fromkeys(enc.label for enc, _ in natives))
    kept = tuple(dict.fromkeys(f.option for _, f in natives if f.copies and f.fallback is None and f.option))
    target = recipe.target
    if given:
        return recipe, ExpertsChoice(recipe.experts, "given", sources, kept)
    if target.default("experts") is not None:
        return recipe, ExpertsChoice(recipe.experts, "target", sources, kept)
    why_not = _native_ruled_out(recipe, kept)
    if kept and why_not is None:
        return replace(recipe, experts=NATIVE_OPTION), ExpertsChoice(NATIVE_OPTION, "native", sources, kept)
    return recipe, ExpertsChoice(recipe.experts, "default", sources, kept, why_not)


def _native_ruled_out(recipe: Recipe, kept: tuple[str, ...]) -> str | None:
    """Why ``native`` cannot write ``kept`` (the formats that hold the source's experts) for this recipe, or None:
    the target's loader refuses the option or has no reader for a format (``engine_formats``: a named
    ``--target generic`` has no mxfp4), or the layout cannot hold it (planar64-v8: int4-row / int4-g64 only)."""
    target, choices = recipe.target, [parse_format_option(k) for k in kept]
    allowed = target.allowed("experts")
    if allowed is not None and NATIVE_OPTION not in allowed:
        return f"`target={target.name}` refuses `experts=native`"
    if target.engine_formats is not None and any(c.fmt.name not in target.engine_formats for c in choices):
        return f"{target.loader} does not read {'/'.join(kept)}; convert without `target` to keep them (`experts=native`)"
    if recipe.layout == layouts.PLANAR.option and not all(c.fmt.planar_eligible(64, c.gs) for c in choices):
        return f"`experts=native` keeps them as {'/'.join(kept)} with `layout=pairs`"
    return None


def requantized_warning(choice: ExpertsChoice, requantized: Mapping[str, tuple[int, str]]) -> str | None:
    """The warning for natively quantized routed experts decoded and quantized a second time when the caller
    did not choose ``experts`` (``requantized``: encoding label -> (tensors, the format written)); None when
    there are none or the caller chose."""
    if choice.by == "given" or not requantized:
        return None
    parts = [f"{n} {label} tensors as {written}" for label, (n, written) in requantized.items()]
    if choice.kept and choice.why_not is not None:  # the target or the layout ruled native out
        why = choice.why_not
    elif choice.kept:
        why = f"`experts=native` keeps them as {'/'.join(choice.kept)}"
    else:
        held = "/".join(requantized)
        why = f"no registered format holds {held} exactly (`experts=native` decodes them too)"
    return (
        f"natively quantized routed experts are decoded and quantized a second time ({'; '.join(parts)}): "
        f"{why}"
    )
