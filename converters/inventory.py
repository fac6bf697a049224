"""The source inventory: every source tensor with its shard, dtype, shape and (FP8) scale, validated before any
work starts (docs/FORMATS.md §9).

Checks, each one ConvertError line naming the tensor / shard / numbers at fault:

* shard names in ``weight_map`` (absolute, path separators, ``..``, not ``*.safetensors`` -> refused);
* ``weight_map`` against the shard headers (a listed tensor missing from its shard, a shard missing from the
  source, a tensor present in a shard header but absent from ``weight_map``);
* dtypes (float or FP8; integer / bool tensors are copied unchanged, rule 0), FP8 weights without
  ``_scale_inv``, scales without their weight, scale grids that do not match ``weight_block_size`` (ceil grid);
* expert stacks: the family (``model_type``) must fix their orientation (``families.stack_orientation``);
* shapes against ``config.json`` (embeddings / head ``[vocab_size, hidden_size]``, routed experts
  ``[moe_intermediate_size, hidden_size]`` / ``[hidden_size, moe_intermediate_size]``, 2-D per-expert projections,
  fused expert tensors, the expert count);
* no linear weight of an integer dtype (rule 0 copies only the other non-float tensors);
* completeness (``model_config.check_complete``): every decoder layer, routed expert and projection the model
  needs, ``hidden_size`` and the expert count given.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from colitools.converters import recipe as rc
from colitools.converters.dequant import (
    FP8_SOURCE_DTYPES,
    SCALE_SUFFIX,
    Fp8Scheme,
    QuantScheme,
    check_scale_grid,
    check_source_dtype,
    quant_scheme,
)
from colitools.converters.sources import HeaderTensor, Source, check_shard_name
from colitools.formats import families, model_config, names, source_encodings
from colitools.formats.container import config_shapes
from colitools.formats.errors import ConvertError
from colitools.formats.names import natural_key  # the planner imports it from here too
from colitools.formats.source_encodings import SourceEncoding

COPY_DTYPES = ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")  # rule 0: copied unchanged


@dataclass(frozen=True)
class ScaleRef:
    """The FP8 scale tensor of a weight (it may live in another shard)."""

    name: str
    shard: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class QuantRef:
    """The companion tensors of a natively quantized source weight (§5), by role (its ``encoding``'s ``parts``:
    ``data`` (blocks / packed codes), ``scale``, ``scale_2`` (NVFP4), ``zero_point`` / ``g_idx`` / ``shape``
    (INT4)). ``group`` is the number of inputs per scale; ``exact`` says whether a format holds it losslessly
    (symmetric INT4 without act order, MXFP4); ``dropped`` names companions not converted (NVFP4
    ``input_scale``); ``weight_shape`` is a part, checked against the codes when the tensor is converted."""

    encoding: type[SourceEncoding]
    group: int
    parts: tuple[tuple[str, ScaleRef], ...]
    exact: bool = True
    dropped: tuple[str, ...] = ()
    rows: int | None = None  # rows per scale of an encoding with two grids (``Paired.rows``)

    @property
    def kind(self) -> str:
        """The encoding's name (``mxfp4``, ``int4``, ``nvfp4``, ``mxfp8``)."""
        return self.encoding.kind

    def part(self, role: str) -> ScaleRef | None:
        return dict(self.parts).get(role)

    @property
    def nbytes(self) -> int:
        return sum(HeaderTensor(r.dtype, r.shape).nbytes for _, r in self.parts)


@dataclass(frozen=True)
class SourceTensor:
    """A source weight (not a scale): name, shard, exact dtype, shape, and its FP8 scale if any.

    A natively quantized weight (``quant`` set) is named and shaped as the float weight it decodes to (logical
    ``[..., O, I]``: gpt-oss ``..._blocks`` -> ``...``, ``.weight_packed`` -> ``.weight``); ``shard`` and
    ``dtype`` are those of its ``data`` part."""

    name: str
    shard: str
    dtype: str
    shape: tuple[int, ...]
    scale: ScaleRef | None = None
    quant: QuantRef | None = None

    @property
    def nbytes(self) -> int:
        if self.quant is not None:
            return self.quant.nbytes
        return HeaderTensor(self.dtype, self.shape).nbytes

    @property
    def shards(self) -> set[str]:
        """Every shard this weight reads (its scale / companions may live in other shards)."""
        out = {self.shard}
        if self.scale is not None:
            out.add(self.scale.shard)
        if self.quant is not None:
            out.update(r.shard for _, r in self.quant.parts)
        return out

    @property
    def scale_nbytes(self) -> int:
        return HeaderTensor(self.scale.dtype, self.scale.shape).nbytes if self.scale else 0


@dataclass
class Inventory:
    """Validated source tensors (weights, in a deterministic order) plus what the planner needs of the source."""

    tensors: dict[str, SourceTensor]
    config: dict[str, Any]
    fp8: Fp8Scheme | None
    shard_sizes: dict[str, int] = field(default_factory=dict)
    quant: QuantScheme = field(default_factory=lambda: QuantScheme(None))
    dropped: list[str] = field(default_factory=list)  # companions not converted (NVFP4 input_scale)

    @property
    def num_hidden_layers(self) -> int | None:
        """Base decoder layers (the config facts' ``num_hidden_layers``; MTP layers come after them)."""
        return model_config.num_hidden_layers(self.config)

    @property
    def shards(self) -> list[str]:
        return sorted(self.shard_sizes)

    @property
    def stack_orientation(self) -> names.Orientation | None:
        """How this family lays out expert stacks (``families.stack_orientation`` by the checkpoint's
        ``model_type``, else its text model's); transformers' layout when the config names no type at all;
        None when the type is one the table does not know."""
        return family_orientation(self.config)

    def orientation_of(self, src: SourceTensor) -> names.Orientation | None:
        """The orientation of expert stack ``src``: the family's for a float / FP8 stack, and for a natively
        quantized one the family's orientation of that encoding (``Family.native_orientation``: gpt-oss
        MXFP4 blocks are by rows, gate / up rows interleaved, while its float stacks are transposed); by its
        spelling where the family has two (``Family.spelled_orientation``: Inkling's text gate_up_proj)."""
        leaf = names.parse_name(src.name).leaf
        if src.quant is not None:
            return family_orientation(self.config, src.quant.kind, leaf)
        return family_orientation(self.config, None, leaf, self._module_stacks(src))

    def _module_stacks(self, src: SourceTensor) -> dict[str, tuple[int, ...]]:
        """The shapes of the gate_up / down stacks of ``src``'s expert module (``families.shaped_orientation``)."""
        fused = rc.fused_of(src.name)
        if fused is None:
            return {}
        spelled = {p: names.stack_name(fused.base, p) for p in ("gate_up", "down")}
        return {p: self.tensors[n].shape for p, n in spelled.items() if n in self.tensors}


def family_orientation(
    config: Mapping[str, Any],
    native: str | None = None,
    leaf: str | None = None,
    stacks: Mapping[str, tuple[int, ...]] | None = None,
) -> names.Orientation | None:
    """The family's orientation of an expert stack (``families.stack_orientation``), by the shapes of its module's
    ``stacks`` where the family's stacks come in two layouts (``families.shaped_orientation``)."""
    types = [t for t in (config.get("model_type"), model_config.text_config(config).get("model_type")) if t]
    if not types:
        return names.Orientation.ROWS
    for t in types:
        found = families.stack_orientation(t, native, leaf)
        if found is not None and stacks:
            hidden, width = model_config.hidden_size(config), model_config.expert_width(config)
            found = families.shaped_orientation(t, stacks, hidden, width) or found
        if found is not None:
            return found
    return None


def build_inventory(
    headers: Mapping[str, Mapping[str, HeaderTensor]],
    weight_map: Mapping[str, str],
    config: Mapping[str, Any],
    shard_sizes: Mapping[str, int] | None = None,
) -> Inventory:
    """Validate and pair the source tensors.

    ``headers``: shard -> tensor -> ``HeaderTensor`` for every shard named in ``weight_map`` (a shard absent
    from ``headers`` is a missing shard). ``shard_sizes`` defaults to the sum of each shard's tensor bytes.
    ``config`` is validated first (the config facts, ``formats/model_config.py``)."""
    model_config.validate_config(config)
    check_weight_map(headers, weight_map)
    qscheme = quant_scheme(config)  # an unknown quant_method is refused here, before any work
    scheme = qscheme.fp8
    # one string object per shard name (the index's JSON gives each tensor its own copy): a recorded plan
    # (plan_record) pickles each once
    shard_names = {s: s for s in weight_map.values()}
    weight_map = {n: shard_names[s] for n, s in weight_map.items()}
    keys = {n: natural_key(n) for n in weight_map}  # once per name: every sort below uses them (92k names)
    ordered = sorted(weight_map, key=keys.__getitem__)
    natives, consumed = pair_native(headers, weight_map, qscheme, ordered)
    fp8 = any(headers[s][n].dtype in FP8_SOURCE_DTYPES and n not in consumed for n, s in weight_map.items())
    if fp8 and scheme is None:
        # FP8 tensors without quantization_config: the DeepSeek default, grid-checked below
        scheme = Fp8Scheme()
    block = scheme.block if scheme else None
    tensors: dict[str, SourceTensor] = dict(natives)
    for name in ordered:
        if name not in consumed and not name.endswith(SCALE_SUFFIX):
            tensors[name] = _source_tensor(name, headers, weight_map, block)
        elif name not in consumed and name[: -len(SCALE_SUFFIX)] not in weight_map:
            raise ConvertError(f"tensor {name}: scale without its weight {name[: -len(SCALE_SUFFIX)]}")
    sizes = (
        dict(shard_sizes)
        if shard_sizes is not None
        else {s: sum(t.nbytes for t in h.values()) for s, h in headers.items()}
    )
    if natives:  # their logical names come first so far
        tensors = {n: tensors[n] for n in sorted(tensors, key=lambda n: keys.get(n) or natural_key(n))}
    dropped = sorted((d for t in natives.values() for d in t.quant.dropped), key=natural_key)
    inv = Inventory(
        tensors,
        dict(config),
        scheme,
        {s: sizes.get(s, 0) for s in sorted(set(weight_map.values()))},
        qscheme,
        dropped,
    )
    check_config_shapes(inv)
    return inv


def check_weight_map(
    headers: Mapping[str, Mapping[str, HeaderTensor]], weight_map: Mapping[str, str]
) -> None:
    """``weight_map`` against the shard headers, both ways, and its shard names (ConvertError naming both)."""
    named: set[str] = set()
    for name, shard in weight_map.items():
        if shard not in named:  # each shard name once, with the first tensor that names it
            check_shard_name(shard, tensor=name)
            named.add(shard)
        if shard not in headers:
            raise ConvertError(f"tensor {name}: its shard {shard} is missing from the source")
        if name not in headers[shard]:
            raise ConvertError(
                f"tensor {name}: weight_map names shard {shard}, but that shard has no such tensor"
            )
    for shard, tensors in headers.items():
        for name in tensors:
            if weight_map.get(name) != shard:
                listed = weight_map.get(name)
                where = f"weight_map names {listed}" if listed else "it is not in weight_map"
                raise ConvertError(f"tensor {name}: present in shard {shard}, but {where}")


def _source_tensor(
    name: str, headers: Mapping[str, Mapping[str, HeaderTensor]], weight_map: Mapping[str, str], block
) -> SourceTensor:
    """A source weight that no native encoding claimed: float, FP8 with its ``_scale_inv`` (grid checked against
    ``block``), or a non-float tensor copied unchanged (rule 0; never a routed expert's weight)."""
    shard = weight_map[name]
    info = headers[shard][name]
    sname = name + SCALE_SUFFIX
    if info.dtype in COPY_DTYPES and sname not in weight_map:
        check_copied(name, info)
        return SourceTensor(name, shard, info.dtype, tuple(info.shape))
    check_source_dtype(name, info.dtype, sname in weight_map)
    scale = None
    if sname in weight_map:
        if info.dtype not in FP8_SOURCE_DTYPES:
            raise ConvertError(f"tensor {sname}: scale of {name}, which is {info.dtype}, not FP8")
        sinfo = headers[weight_map[sname]][sname]
        assert block is not None
        if len(info.shape) < 2:
            raise ConvertError(f"tensor {name}: FP8 weight of shape {list(info.shape)} (needs 2 dims)")
        check_scale_grid(name, info.shape, sname, sinfo.dtype, sinfo.shape, block)
        scale = ScaleRef(sname, weight_map[sname], sys.intern(sinfo.dtype), sinfo.shape)
    return SourceTensor(name, shard, sys.intern(info.dtype), tuple(info.shape), scale)


def check_copied(name: str, info: HeaderTensor) -> None:
    """Rule 0 copies non-float tensors unchanged (DeepSeek-V4's I64 ``tid2eid``), but a routed expert's weight
    (a per-expert projection ``[O, I]``, or an expert stack) of an integer dtype that no source encoding claimed
    is not one: it is refused before work starts, naming the tensor and its dtype."""
    if names.is_tower(name):
        return
    ex, stack = rc.expert_of(name), rc.fused_of(name)
    if (ex is not None and ex.projection is not None and len(info.shape) == 2) or (
        stack is not None and not stack.bias and len(info.shape) == 3
    ):
        known = ", ".join(dict.fromkeys(e.label for e in source_encodings.ENCODINGS.values()))  # each once
        raise ConvertError(
            f"tensor {name}: a routed expert weight stored as {info.dtype} {list(info.shape)}; only float weights "
            f"and the natively quantized encodings colitools reads ({known}) can be converted"
        )


# ------------------------------------------------------------------------------ natively quantized sources
def pair_native(
    headers: Mapping[str, Mapping[str, HeaderTensor]],
    weight_map: Mapping[str, str],
    scheme: QuantScheme,
    order: list[str] | None = None,
) -> tuple[dict[str, SourceTensor], set[str]]:
    """Pair the companion tensors of natively quantized weights (§5) into one ``SourceTensor`` each, so that
    blocks, scales, packed codes, ``weight_shape`` and ``input_scale`` are not converted as tensors of their
    own: each registered source encoding (``formats/source_encodings/``) recognises its own tensor pairs.
    ``order``: the source names in natural order, when the caller sorted them already. Returns ``(logical name
    -> SourceTensor, every consumed source name)``. A companion without its weight, or a scale grid that does
    not fit, is the registry's FormatError naming both."""
    tensors = {n: headers[s][n] for n, s in weight_map.items()}
    paired, consumed = source_encodings.pair_tensors(tensors, scheme, order)

    def ref(n: str) -> ScaleRef:
        return ScaleRef(n, weight_map[n], tensors[n].dtype, tuple(tensors[n].shape))

    out = {}
    for name, p in paired.items():
        data = dict(p.parts)["data"]
        q = QuantRef(
            p.encoding, p.group, tuple((role, ref(n)) for role, n in p.parts), p.exact, p.dropped, p.rows
        )
        out[name] = SourceTensor(name, weight_map[data], tensors[data].dtype, p.shape, None, q)
    return out, consumed


# a float or FP8 tensor's kind is one of a few values, one object each (asked for each of 92k tensors)
_float_kind = lru_cache(maxsize=None)(rc.SourceKind)


def source_kind(src: SourceTensor, fp8_block: tuple[int, int] | None, fused: bool = False) -> rc.SourceKind:
    """What the recipe needs to know of a source tensor (its FP8 block, or its native quantization)."""
    if src.quant is None:
        return _float_kind(src.dtype, fp8_block, fused)
    q = src.quant
    return rc.SourceKind(
        src.dtype, None, fused, native=q.encoding, native_group=q.group, native_exact=q.exact, native_rows=q.rows
    )


# ---------------------------------------------------------------------------------------- config checks
def check_config_shapes(inv: Inventory) -> None:
    """Shapes that ``config.json`` pins: a mismatch is an error naming the tensor, both shapes and the key.

    The numbers are the config facts (``formats/model_config.py``: text model, expert count and width)."""
    facts = model_config.read_facts(inv.config)
    model_config.check_decoder_layers(inv.config, inv.tensors)  # none past the decoder and its MTP layers
    H, V, E, moe_i = facts.hidden_size, facts.vocab_size, facts.routed_experts, facts.expert_width
    # per-expert tensors run in routed_expert_hidden_size (Kimi K3's LatentMoE latent) where the config sets one
    EH, eh_key = (
        (H, "hidden_size")
        if facts.expert_hidden in (None, H)
        else (facts.expert_hidden, "routed_expert_hidden_size")
    )
    two_i = 2 * moe_i if moe_i else None
    transposed = {"gate_up": ((E, H, two_i), "[experts, hidden_size, 2 x expert width]"),
                  "down": ((E, moe_i, H), "[experts, expert width, hidden_size]")}  # fmt: skip
    by_rows = {"gate_up": ((E, two_i, H), "[experts, 2 x moe_intermediate_size, hidden_size]"),
               "down": ((E, H, moe_i), "[experts, hidden_size, moe_intermediate_size]")}  # fmt: skip
    for table in (transposed, by_rows):
        table["gate"] = table["up"] = ((E, moe_i, H), "[experts, expert width, hidden_size]")
    bias_shapes = {
        "gate_up": ((E, two_i), "[experts, 2 x expert width]"),
        "down": ((E, H), "[experts, hidden_size]"),
    }

    for name, t in inv.tensors.items():
        if (t.dtype in COPY_DTYPES and t.quant is None) or names.is_tower(name):
            continue  # rules 0 and 1: copied as they are
        if rc.is_embedding(name) and (V or H):
            _expect(name, t.shape, (V, H), "vocab_size x hidden_size")
            continue
        fused = rc.fused_of(name)
        if fused is not None and len(t.shape) == (2 if fused.bias else 3):
            orientation = _stack_orientation(inv, name, t)
            stack_shapes = transposed if orientation.transposed else by_rows
            want, keys = (bias_shapes if fused.bias else stack_shapes)[fused.projection]
            _expect(name, t.shape, want, keys)
            continue
        shared = names.shared_stack(name)
        if shared is not None and len(t.shape) == 3:
            if inv.stack_orientation is None and shared.projection == "gate_up":
                raise ConvertError(
                    f"tensor {name}: a stacked shared gate/up expert, but the family "
                    f"{model_config.model_type(inv.config)!r} does not fix how its rows are laid out (known: "
                    f"{', '.join(families.known_model_types())})"
                )
            continue
        ex = rc.expert_of(name)
        if ex is not None and ex.projection is not None and len(t.shape) != 2:
            raise ConvertError(
                f"tensor {name}: a routed expert's {ex.projection} projection stored {len(t.shape)}-D "
                f"{list(t.shape)}; per-expert weights are 2-D [O, I] (config.json: [{moe_i}, {EH}] / [{EH}, {moe_i}])"
            )
        if ex is None or len(t.shape) != 2:
            continue
        if E is not None and ex.expert >= E:
            raise ConvertError(f"tensor {name}: expert index {ex.expert} >= config.json expert count {E}")
        if ex.projection in ("gate", "up"):
            _expect(name, t.shape, (moe_i, EH), f"moe_intermediate_size x {eh_key}")
        elif ex.is_down:
            _expect(name, t.shape, (EH, moe_i), f"{eh_key} x moe_intermediate_size")
    _check_copied_weights(inv)
    model_config.check_complete(inv.config, inv.tensors)  # every layer, expert and projection the model needs


_LINEAR_ROLES = (rc.Role.DENSE, rc.Role.EMBED, rc.Role.MTP, rc.Role.EXPERT)  # what a float 2-D weight would get


def _check_copied_weights(inv: Inventory) -> None:
    """Rule 0 copies non-float tensors, never a linear weight: an integer tensor that ``config.json`` gives an
    ``[O, I]`` (``container.config_shapes``: attention, MLP, router, embeddings, head) or that is a 2-D
    ``.weight`` the recipe would quantize were it float (rules 3-6), and that no source encoding claimed, is
    refused naming it (an attention projection stored I16 would otherwise be copied as "non-float")."""
    copied = [n for n, t in inv.tensors.items() if t.dtype in COPY_DTYPES and t.quant is None and not names.is_tower(n)]
    implied = config_shapes(inv.config, copied)
    nhl = inv.num_hidden_layers
    for name in copied:
        t = inv.tensors[name]
        weight = names.parse_name(name).suffix in names.WEIGHT_SUFFIXES and len(t.shape) == 2
        if name in implied or (weight and rc.classify(name, 2, nhl, "F32") in _LINEAR_ROLES):
            O, I = implied.get(name, (None, None))
            said = f" (config.json implies [{_dim(O)}, {_dim(I)}])" if name in implied else ""
            raise ConvertError(
                f"tensor {name}: a linear weight{said} stored as {t.dtype} {list(t.shape)}; only float weights and "
                "the natively quantized encodings colitools reads can be converted"
            )


def _dim(d: int | None) -> str:
    return "?" if d is None else str(d)


def _expect(name: str, shape: tuple[int, ...], want: tuple[int | None, ...], keys: str) -> None:
    if len(shape) != len(want) or any(w is not None and s != w for s, w in zip(shape, want, strict=False)):
        shown = [w if w is not None else "*" for w in want]
        raise ConvertError(
            f"tensor {name}: shape {list(shape)} does not match config.json {keys} (expected {shown})"
        )


def _stack_orientation(inv: Inventory, name: str, t: SourceTensor) -> names.Orientation:
    """The orientation of expert stack ``t``; ConvertError when the family does not fix it."""
    orientation = inv.orientation_of(t)
    if orientation is not None:
        return orientation
    family = model_config.model_type(inv.config)
    if t.quant is not None and inv.stack_orientation is not None:
        raise ConvertError(
            f"tensor {name}: a natively quantized ({t.quant.kind}) expert stack, but the family "
            f"{family!r} does not fix how "
            f"the rows of its {t.quant.kind} stacks hold gate / up (its float stacks are "
            f"{inv.stack_orientation}; known: "
            f"{', '.join(f'{m} {k}' for m, k in families.native_stack_orientations())})"
        )
    raise ConvertError(
        f"tensor {name}: an expert stack, but the family {family!r} "
        "does not fix how its experts are laid out (known: "
        f"{', '.join(families.known_model_types())}); convert a per-expert export instead"
    )


# ------------------------------------------------------------------------------------------ shard headers
HEADER_READS = 8  # a Hub source's shard headers read at a time


def read_source_headers(source: Source, shards: list[str]) -> dict[str, dict[str, HeaderTensor]]:
    """Header entries of every shard, without downloading tensor data (``Source.header``). A Hub source's are read
    ``HEADER_READS`` at a time: each is two HTTP round trips, and one after another they held back the first
    download (~30 ms each on the bench's local server, a round trip to the Hub each elsewhere); the first
    shard that fails, in order, raises its error."""
    if not source.is_remote or len(shards) < 2:
        return {shard: source.header(shard) for shard in shards}
    pool = ThreadPoolExecutor(HEADER_READS, thread_name_prefix="header")
    try:
        return dict(zip(shards, pool.map(source.header, shards), strict=True))
    finally:
        pool.shutdown(cancel_futures=True)
