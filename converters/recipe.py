"""The conversion recipe (docs/FORMATS.md §5): every source tensor -> a role -> a target format.

Rules apply in order, the first match decides:

1. routers and 1-D tensors (``mlp.gate.weight``, ``block_sparse_moe.gate.weight``, ``shared_expert_gate.weight``,
   ``e_score_correction_bias``, anything with fewer than 2 dims): F32 always;
2. MTP layers (layer index ``>= num_hidden_layers``): ``--mtp``;
3. ``embed_tokens.weight`` / ``lm_head.weight``: ``--embed``;
4. routed experts (``.experts.{E}.`` names, Mixtral ``block_sparse_moe.experts.{E}.w1/w2/w3`` included, and fused
   ``mlp.experts.gate_up_proj`` / ``mlp.experts.down_proj``, split per expert, §4): ``--experts``;
5. every other 2-D weight: ``--dense``.

``choose_target`` then decides what is actually written for one ``[O, I]`` tensor, with the fallbacks of §6
(to int8-row, each with a reason) and the metadata stamp where the byte signature is ambiguous (§3).
"""

# ruff: noqa: E741  (O and I are the spec's names for out_features and in_features)
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from functools import lru_cache

from colitools.errors import ConvertError, FormatError
from colitools.formats import layouts, registry, resolver
from colitools.formats.format_names import GROUPED_OPTION_PREFIX, NATIVE_OPTION
from colitools.formats.names import (
    PROJECTION_ORDER,
    TensorRole,
    expert_tensor_name,
    parse_name,
)
from colitools.formats.registry import (
    DEFAULT_GROUP_SIZE,
    GROUP_SIZES,
    Float,
    Format,
    by_name,
    parse_format_option,
    writer_group_size,
)

LAYOUTS = layouts.OPTION_NAMES  # the --layout values (formats/layouts.py)
DEFAULT_OPTIONS = {"experts": "int4-g64", "dense": "int8-row", "embed": "int8-row", "mtp": "int8-row"}
FALLBACK_FORMAT = registry.FALLBACK_FORMAT.name
BF16 = "bf16"  # Target.fmt of a float tensor stored as BF16 (the recipe option of the same name)


class Role(StrEnum):
    """Why a tensor gets its format (the recipe rule that matched)."""

    FLOAT = "float"  # rule 1: routers and tensors with < 2 dims, F32 always
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

    @property
    def order(self) -> tuple[int, str]:
        """Sort key inside one expert: gate, up, down first (pairs layout, §4), anything else after, by name."""
        rank = PROJECTION_ORDER.index(self.projection) if self.projection else len(PROJECTION_ORDER)
        return (rank, self.proj)

    @property
    def is_down(self) -> bool:
        return self.projection == "down"


def expert_of(name: str) -> ExpertName | None:
    """Parse a per-expert name (``...experts.{E}.gate_proj.weight``, Mixtral ``...experts.{E}.w1.weight``)."""
    parsed = parse_name(name)
    if parsed.expert is None:
        return None
    projection = parsed.projection if parsed.suffix == "weight" else None
    return ExpertName(parsed.expert_base, parsed.expert, parsed.expert_tensor, projection)


@dataclass(frozen=True)
class FusedExperts:
    """A fused expert tensor: ``{base}.gate_up_proj`` ``[E, 2I, H]`` (gate rows first) or ``{base}.down_proj``
    ``[E, H, I]`` (§4), split per expert on output."""

    base: str
    projection: str  # "gate_up" | "down" (names.EXPERT_STACKS)


def fused_of(name: str) -> FusedExperts | None:
    parsed = parse_name(name)
    if parsed.expert is not None or parsed.expert_base is None:  # not an expert stack
        return None
    return FusedExperts(parsed.expert_base, parsed.projection)


@dataclass(frozen=True)
class ExpertSlice:
    """One output tensor cut from a fused source tensor: expert ``expert``, rows ``[row0, row1)`` of its slab."""

    out_name: str
    expert: int
    row0: int
    row1: int


def split_fused(name: str, shape: tuple[int, ...]) -> list[ExpertSlice]:
    """Per-expert output tensors of fused tensor ``name`` with 3-D ``shape``, in expert order (gate before up)."""
    fused = fused_of(name)
    if fused is None or len(shape) != 3:
        raise ConvertError(f"tensor {name}: not a fused expert tensor [E, rows, cols] (shape {list(shape)})")
    E, rows, _ = shape
    out: list[ExpertSlice] = []
    if fused.projection == "gate_up":
        if rows % 2:
            raise ConvertError(
                f"tensor {name}: fused gate_up_proj needs an even row count (2I), got shape {list(shape)}"
            )
        half = rows // 2
        for e in range(E):
            out.append(ExpertSlice(expert_tensor_name(fused.base, e, "gate"), e, 0, half))
            out.append(ExpertSlice(expert_tensor_name(fused.base, e, "up"), e, half, rows))
    else:
        out = [ExpertSlice(expert_tensor_name(fused.base, e, "down"), e, 0, rows) for e in range(E)]
    return out


def is_router(name: str) -> bool:
    return parse_name(name).role is TensorRole.ROUTER


def is_embedding(name: str) -> bool:
    """An embedding or output-head weight (``embed_tokens.weight``, ``lm_head.weight``; rule 3)."""
    parsed = parse_name(name)
    return parsed.role in (TensorRole.EMBED, TensorRole.HEAD) and parsed.suffix == "weight"


def classify(name: str, ndim: int, num_hidden_layers: int | None) -> Role:
    """The recipe role of source tensor ``name`` with ``ndim`` dims (fused expert tensors: 3-D, rule 4).

    ``num_hidden_layers`` (from config.json) decides the MTP rule; None disables it. A tensor with more than
    two dims that is not a fused expert tensor cannot be classified: ConvertError naming it."""
    if ndim < 2 or is_router(name):
        return Role.FLOAT
    layer = layer_of(name)
    if layer is not None and num_hidden_layers is not None and layer.index >= num_hidden_layers:
        return Role.MTP
    fused = fused_of(name)
    if ndim > 2 and fused is None:
        raise ConvertError(
            f"tensor {name}: cannot classify a {ndim}-D tensor (only fused expert tensors "
            f"experts.gate_up_proj / experts.down_proj may have 3 dims)"
        )
    if is_embedding(name):
        return Role.EMBED
    if fused is not None or expert_of(name) is not None:
        return Role.EXPERT
    return Role.DENSE


# ----------------------------------------------------------------------------------------------- recipe
@dataclass(frozen=True)
class Recipe:
    """The format options of one conversion (§6) and the output layout. Part of the resume fingerprint."""

    experts: str = DEFAULT_OPTIONS["experts"]
    dense: str = DEFAULT_OPTIONS["dense"]
    embed: str = DEFAULT_OPTIONS["embed"]
    mtp: str = DEFAULT_OPTIONS["mtp"]
    layout: str = layouts.PAIRS.option

    @classmethod
    def from_options(
        cls,
        experts: str | None = None,
        dense: str | None = None,
        embed: str | None = None,
        mtp: str | None = None,
        group_size: int | None = None,
        layout: str = layouts.PAIRS.option,
    ) -> Recipe:
        """Build and validate a recipe from CLI-style options.

        ``group_size`` is the group size of every int4-grouped choice: the default ``--experts`` becomes
        ``int4-g{group_size}``, an option given as ``int4-g{group_size}`` is accepted, and an option naming a
        different ``int4-g*`` is refused as a contradiction."""
        if group_size is not None and group_size not in GROUP_SIZES:
            raise ConvertError(f"--group-size {group_size} is not one of {', '.join(map(str, GROUP_SIZES))}")
        if layout not in LAYOUTS:
            raise ConvertError(f"--layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
        given = {"experts": experts, "dense": dense, "embed": embed, "mtp": mtp}
        values: dict[str, str] = {}
        for option, value in given.items():
            if value is None:
                value = DEFAULT_OPTIONS[option]
                if group_size is not None and value.startswith("int4-g"):
                    value = f"int4-g{group_size}"
            try:
                choice = parse_format_option(value)
            except FormatError as exc:
                raise ConvertError(f"--{option}: {exc}") from None
            if group_size is not None and choice.gs is not None and choice.gs != group_size:
                raise ConvertError(f"--{option} {value} contradicts --group-size {group_size}")
            values[option] = value
        return cls(layout=layout, **values)

    def option_for(self, role: Role) -> str:
        """The format option governing ``role`` (``f32`` for rule 1)."""
        return (
            "f32"
            if role is Role.FLOAT
            else getattr(self, role.value if role is not Role.EXPERT else "experts")
        )

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the recipe (what the resume ledger compares)."""
        blob = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def differences(self, recorded: dict[str, str]) -> list[str]:
        """Human-readable ``--option recorded -> now`` for every option that differs from ``recorded``."""
        out = []
        for key, now in self.as_dict().items():
            before = recorded.get(key)
            if before != now:
                out.append(f"--{key} {before} (recorded) vs {now} (now)")
        return out


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

    @property
    def format_class(self) -> type[Format]:
        return Float if self.fmt == BF16 else by_name(self.fmt)

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
            return f"{GROUPED_OPTION_PREFIX}{self.gs}"
        return self.fmt

    def tensor_names(self, out_name: str) -> tuple[str, str | None]:
        """``(weight tensor name, scale tensor name or None)`` for output tensor ``out_name``."""
        return self.format_class.tensor_names(out_name)


@dataclass(frozen=True)
class SourceKind:
    """What the source tensor is: ``fp8_block`` = (rows, cols) of its FP8 scale blocks, None for float."""

    dtype: str
    fp8_block: tuple[int, int] | None = None
    fused: bool = False
    native: str | None = None  # natively quantized source kind (dequant.MXFP4 / INT4 / NVFP4 / MXFP8)
    native_group: int | None = None  # inputs per scale of that encoding
    native_exact: bool = True  # False: asymmetric / act-order INT4, NVFP4, MXFP8 (no format holds it exactly)


def choose_target(name: str, role: Role, option: str, O: int, I: int, source: SourceKind) -> Target:
    """Decide the format written for output tensor ``name`` (logical ``[O, I]``) of ``role`` under recipe
    ``option``, applying the fallbacks of §6 and the stamping rules of §3.

    A fallback goes to int8-row and carries its reason. Routed experts are never stamped: an expert whose
    bytes would be ambiguous falls back instead. (The decision does not depend on the name: it is computed
    once per distinct ``(role, option, O, I, source)``, which keeps planning a 100k-tensor model fast.)"""
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
NATIVE_DECODED = "decoded"  # Fallback.reason prefix of a native tensor whose own form no format holds exactly


@lru_cache(maxsize=4096)
def _choose_native(expert: bool, default: str, O: int, I: int, source: SourceKind) -> Target:
    """``native`` (§6): keep the source's own quantization where a format holds it exactly — FP8 128x128 blocks
    -> fp8, MXFP4 -> mxfp4 (nibbles and E8M0 bytes copied), symmetric INT4 group ``g`` -> int4-grouped gs ``g``
    (int4-row when ``I <= g``; int8-row when gs ``g`` would not resolve back). Anything else gets the option's
    ``default`` on its decoded values; a natively quantized source that is decoded so carries a Fallback."""

    def decoded(what: str) -> Target:
        t = _choose_target(expert, False, default, O, I, source)
        if t.fallback is not None:  # the default itself fell back: that reason is the one to record
            return t
        reason = f"{NATIVE_DECODED}: {what}, no format holds it exactly; written as {t.label}"
        return replace(t, fallback=Fallback("", NATIVE_OPTION, t.label, reason))

    if source.native is None:
        if source.fp8_block == (128, 128) and not source.fused:
            return _choose_target(expert, False, "fp8", O, I, source)
        return _choose_target(expert, False, default, O, I, source)
    kind, g = source.native, source.native_group
    if not source.native_exact:
        what = {"int4": "asymmetric or act-order INT4"}.get(kind, kind.upper())
        return decoded(f"{what} source")
    if kind == "mxfp4":
        t = _choose_target(expert, False, "mxfp4", O, I, source)
        return t if t.fallback is not None else replace(t, native=True)
    if kind == "int4":
        if g is not None and I <= g:
            t = _choose_target(expert, False, registry.Int4Row.name, O, I, source)
        elif g in GROUP_SIZES and writer_group_size(I, g) == g:
            t = _choose_target(expert, False, f"{GROUPED_OPTION_PREFIX}{g}", O, I, source)
        else:
            t = _choose_target(expert, False, FALLBACK_FORMAT, O, I, source)
            reason = f"INT4 group size {g} at I = {I} would not resolve back as int4-grouped; decoded"
            return replace(t, fallback=Fallback("", NATIVE_OPTION, FALLBACK_FORMAT, reason))
        return t if t.fallback is not None else replace(t, native=True)
    return decoded(f"{kind.upper()} source")  # pragma: no cover - nvfp4 / mxfp8 are never exact


def _reason(exc: FormatError) -> str:
    """The fallback reason recorded in the manifest. An error that classifies itself (``exc.reason``: every
    error of the registry's and resolver's writer checks) gives its ``detail``, the message without the
    leading ``tensor <name>:`` and the writer advice; anything else its whole message."""
    return exc.detail if exc.reason is not None and exc.detail is not None else str(exc)
