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
import re
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from functools import lru_cache

from colitools.errors import ConvertError, FormatError
from colitools.formats import resolver
from colitools.formats.registry import (
    DEFAULT_GROUP_SIZE,
    GROUP_SIZES,
    Format,
    by_name,
    parse_format_option,
    writer_group_size,
)

LAYOUTS = ("pairs", "planar")
DEFAULT_OPTIONS = {"experts": "int4-g64", "dense": "int8-row", "embed": "int8-row", "mtp": "int8-row"}
FALLBACK_FORMAT = "int8-row"


class Role(StrEnum):
    """Why a tensor gets its format (the recipe rule that matched)."""

    FLOAT = "float"  # rule 1: routers and tensors with < 2 dims, F32 always
    MTP = "mtp"
    EMBED = "embed"
    EXPERT = "expert"
    DENSE = "dense"


# ------------------------------------------------------------------------------------------------ names
_LAYER = re.compile(r"^(?P<prefix>(?:.*\.)?layers)\.(?P<index>\d+)\.")
_EXPERT = re.compile(r"^(?P<base>.*(?:^|\.)experts)\.(?P<expert>\d+)\.(?P<proj>.+)$")
_FUSED = re.compile(r"^(?P<base>(?:.*\.)?experts)\.(?P<kind>gate_up_proj|down_proj)(?P<suffix>\.weight)?$")
_ROUTER_SUFFIXES = (
    "mlp.gate.weight",
    "block_sparse_moe.gate.weight",
    "shared_expert_gate.weight",
    "e_score_correction_bias",
)
_EMBED_SUFFIXES = ("embed_tokens.weight", "lm_head.weight")
# Per-expert projection names in pairs order (gate, up, down); Mixtral: w1 = gate, w3 = up, w2 = down.
_PROJ_ORDER = {"gate_proj.weight": 0, "w1.weight": 0, "up_proj.weight": 1, "w3.weight": 1,
               "down_proj.weight": 2, "w2.weight": 2}  # fmt: skip
_DOWN_PROJS = ("down_proj.weight", "w2.weight")


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
    m = _LAYER.match(name)
    return LayerKey(m["prefix"], int(m["index"])) if m else None


@dataclass(frozen=True)
class ExpertName:
    """A per-expert tensor name: ``{base}.{expert}.{proj}`` (``base`` ends in ``experts``)."""

    base: str
    expert: int
    proj: str

    @property
    def order(self) -> tuple[int, str]:
        """Sort key inside one expert: gate, up, down first (pairs layout, §4), anything else after, by name."""
        return (_PROJ_ORDER.get(self.proj, 3), self.proj)

    @property
    def is_down(self) -> bool:
        return self.proj in _DOWN_PROJS


def expert_of(name: str) -> ExpertName | None:
    """Parse a per-expert name (``...experts.{E}.gate_proj.weight``, Mixtral ``...experts.{E}.w1.weight``)."""
    m = _EXPERT.match(name)
    return ExpertName(m["base"], int(m["expert"]), m["proj"]) if m else None


@dataclass(frozen=True)
class FusedExperts:
    """A fused expert tensor: ``{base}.gate_up_proj`` ``[E, 2I, H]`` (gate rows first) or ``{base}.down_proj``
    ``[E, H, I]`` (§4), split per expert on output."""

    base: str
    kind: str  # "gate_up_proj" | "down_proj"


def fused_of(name: str) -> FusedExperts | None:
    m = _FUSED.match(name)
    return FusedExperts(m["base"], m["kind"]) if m else None


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
    if fused.kind == "gate_up_proj":
        if rows % 2:
            raise ConvertError(
                f"tensor {name}: fused gate_up_proj needs an even row count (2I), got shape {list(shape)}"
            )
        half = rows // 2
        for e in range(E):
            out.append(ExpertSlice(f"{fused.base}.{e}.gate_proj.weight", e, 0, half))
            out.append(ExpertSlice(f"{fused.base}.{e}.up_proj.weight", e, half, rows))
    else:
        out = [ExpertSlice(f"{fused.base}.{e}.down_proj.weight", e, 0, rows) for e in range(E)]
    return out


def is_router(name: str) -> bool:
    return name.endswith(_ROUTER_SUFFIXES)


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
    if name.endswith(_EMBED_SUFFIXES):
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
    layout: str = "pairs"

    @classmethod
    def from_options(
        cls,
        experts: str | None = None,
        dense: str | None = None,
        embed: str | None = None,
        mtp: str | None = None,
        group_size: int | None = None,
        layout: str = "pairs",
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

    @property
    def is_float(self) -> bool:
        return self.fmt in ("f32", "bf16")

    @property
    def format_class(self) -> type[Format]:
        return by_name("f32" if self.fmt == "bf16" else self.fmt)

    @property
    def label(self) -> str:
        """The recipe-style name of what is written (``int4-g64``, ``int8-row``, ``bf16``, ...)."""
        if self.fmt == "int4-grouped":
            return f"int4-g{self.gs}"
        return self.fmt

    def tensor_names(self, out_name: str) -> tuple[str, str | None]:
        """``(weight tensor name, scale tensor name or None)`` for output tensor ``out_name``."""
        if self.is_float:
            return out_name, None
        if self.fmt == "mxfp4":
            base = out_name[: -len(".weight")] if out_name.endswith(".weight") else out_name
            return f"{base}.weight_packed", f"{base}.weight_scale"
        return out_name, f"{out_name}.qs"


@dataclass(frozen=True)
class SourceKind:
    """What the source tensor is: ``fp8_block`` = (rows, cols) of its FP8 scale blocks, None for float."""

    dtype: str
    fp8_block: tuple[int, int] | None = None
    fused: bool = False


def choose_target(name: str, role: Role, option: str, O: int, I: int, source: SourceKind) -> Target:
    """Decide the format written for output tensor ``name`` (logical ``[O, I]``) of ``role`` under recipe
    ``option``, applying the fallbacks of §6 and the stamping rules of §3.

    A fallback goes to int8-row and carries its reason. Routed experts are never stamped: an expert whose
    bytes would be ambiguous falls back instead. (The decision does not depend on the name: it is computed
    once per distinct ``(role, option, O, I, source)``, which keeps planning a 100k-tensor model fast.)"""
    routed = role is Role.EXPERT or expert_of(name) is not None  # MTP layers have routed experts too
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
        return Target("f32")
    choice = parse_format_option(option)
    if choice.option in ("f32", "bf16"):
        return Target(choice.option)

    def fallback(reason: str) -> Target:
        try:  # int8-row is ambiguous only against e8-iq3-lattice (I == 98), which a stamp settles
            stamp = resolver.stamp_for(name, FALLBACK_FORMAT, O, I, None, allow_stamp=True)
        except FormatError as exc:  # pragma: no cover - not reachable with the spec's signatures
            raise ConvertError(
                f"tensor {name}: even the {FALLBACK_FORMAT} fallback would not resolve back: {exc}"
            ) from None
        return Target(FALLBACK_FORMAT, None, stamp, Fallback(name, option, FALLBACK_FORMAT, reason))

    fmt_name = choice.fmt.name
    gs: int | None = None
    if choice.option == "fp8":
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
    elif fmt_name == "int4-grouped":
        gs = writer_group_size(I, choice.gs or DEFAULT_GROUP_SIZE)
        if gs is None:  # I <= gs: one group per row is int4-row (same values and bytes), docs/FORMATS.md §2.3
            fmt_name = "int4-row"
    try:
        choice.fmt.check_encodable(O, I, name=name)
    except FormatError as exc:
        return fallback(_reason(name, exc))
    try:  # §3: stamp only genuinely ambiguous signatures, never a routed expert; else fall back
        stamp = resolver.stamp_for(name, fmt_name, O, I, gs, allow_stamp=role is not Role.EXPERT)
        resolver.check_roundtrip(name, fmt_name, gs, O, I, stamp)
    except FormatError as exc:
        return fallback(_reason(name, exc))
    return Target(fmt_name, gs, stamp)


def _reason(name: str, exc: Exception) -> str:
    """An error message as a fallback reason: without the leading ``tensor <name>:`` and the advice."""
    text = str(exc)
    for prefix in (f"tensor {name}: ", f"tensor {name or '?'}: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text.replace("; write int8-row instead", "")
