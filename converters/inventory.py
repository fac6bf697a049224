"""The source inventory: every source tensor with its shard, dtype, shape and (FP8) scale, validated before any
work starts (docs/FORMATS.md §9).

Checks, each one ConvertError line naming the tensor / shard / numbers at fault:

* shard names in ``weight_map`` (absolute, path separators, ``..``, not ``*.safetensors`` -> refused);
* ``weight_map`` against the shard headers (a listed tensor missing from its shard, a shard missing from the
  source, a tensor present in a shard header but absent from ``weight_map``);
* dtypes (float or FP8; integer / bool tensors are copied unchanged, rule 0), FP8 weights without
  ``_scale_inv``, scales without their weight, scale grids that do not match ``weight_block_size`` (ceil grid);
* expert stacks: the family (``model_type``) must fix their orientation (``names.STACK_ORIENTATION``);
* shapes against ``config.json`` (embeddings / head ``[vocab_size, hidden_size]``, routed experts
  ``[moe_intermediate_size, hidden_size]`` / ``[hidden_size, moe_intermediate_size]``, fused expert tensors,
  the expert count).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from colitools.converters import dequant as dq
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
from colitools.errors import ConvertError
from colitools.formats import model_config, names
from colitools.formats.names import natural_key  # the planner imports it from here too

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
    """The companion tensors of a natively quantized source weight (§5), by role: ``data`` (blocks / packed
    codes), ``scale``, and ``scale_2`` (NVFP4); ``zero_point`` / ``g_idx`` for asymmetric / act-order INT4.
    ``group`` is the number of inputs per scale; ``exact`` says whether a format holds it losslessly (symmetric
    INT4 without act order, MXFP4); ``dropped`` names companions not converted (NVFP4 ``input_scale``);
    ``weight_shape`` is a part, checked against the codes when the tensor is converted."""

    kind: str
    group: int
    parts: tuple[tuple[str, ScaleRef], ...]
    exact: bool = True
    dropped: tuple[str, ...] = ()

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
        """How this family lays out expert stacks (``names.STACK_ORIENTATION`` by the checkpoint's
        ``model_type``, else its text model's); transformers' layout when the config names no type at all;
        None when the type is one the table does not know."""
        return family_orientation(self.config)

    def orientation_of(self, src: SourceTensor) -> names.Orientation | None:
        """The orientation of expert stack ``src``: the family's for a float / FP8 stack, and for a natively
        quantized one the family's orientation of that encoding (``names.NATIVE_STACK_ORIENTATION``: gpt-oss
        MXFP4 blocks are by rows, gate / up rows interleaved, while its float stacks are transposed); by its
        spelling where the family has two (``names.SPELLED_STACK_ORIENTATION``: Inkling's text gate_up_proj)."""
        leaf = names.parse_name(src.name).leaf
        return family_orientation(self.config, src.quant.kind if src.quant is not None else None, leaf)


def family_orientation(
    config: Mapping[str, Any], native: str | None = None, leaf: str | None = None
) -> names.Orientation | None:
    types = [t for t in (config.get("model_type"), model_config.text_config(config).get("model_type")) if t]
    if not types:
        return names.Orientation.ROWS
    for t in types:
        found = names.stack_orientation(t, native, leaf)
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
    for name, shard in weight_map.items():
        check_shard_name(shard, tensor=name)
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
    qscheme = quant_scheme(config)  # an unknown quant_method is refused here, before any work
    scheme = qscheme.fp8
    natives, consumed = pair_native(headers, weight_map, qscheme)
    fp8 = any(headers[s][n].dtype in FP8_SOURCE_DTYPES and n not in consumed for n, s in weight_map.items())
    if fp8 and scheme is None:
        # FP8 tensors without quantization_config: the DeepSeek default, grid-checked below
        scheme = Fp8Scheme()
    block = scheme.block if scheme else None

    scales = {n for n in weight_map if n.endswith(SCALE_SUFFIX)}
    tensors: dict[str, SourceTensor] = {}
    for name, t in natives.items():
        tensors[name] = t
    for name in sorted(weight_map, key=natural_key):
        if name in consumed:
            continue
        if name in scales:
            base = name[: -len(SCALE_SUFFIX)]
            if base not in weight_map:
                raise ConvertError(f"tensor {name}: scale without its weight {base}")
            continue
        shard = weight_map[name]
        info = headers[shard][name]
        sname = name + SCALE_SUFFIX
        scale = None
        if not (info.dtype in COPY_DTYPES and sname not in weight_map):
            check_source_dtype(name, info.dtype, sname in weight_map)
        if sname in weight_map:
            if info.dtype not in FP8_SOURCE_DTYPES:
                raise ConvertError(f"tensor {sname}: scale of {name}, which is {info.dtype}, not FP8")
            sinfo = headers[weight_map[sname]][sname]
            assert block is not None
            if len(info.shape) < 2:
                raise ConvertError(f"tensor {name}: FP8 weight of shape {list(info.shape)} (needs 2 dims)")
            check_scale_grid(name, info.shape, sname, sinfo.dtype, sinfo.shape, block)
            scale = ScaleRef(sname, weight_map[sname], sinfo.dtype, sinfo.shape)
        tensors[name] = SourceTensor(name, shard, info.dtype, tuple(info.shape), scale)
    sizes = (
        dict(shard_sizes)
        if shard_sizes is not None
        else {s: sum(t.nbytes for t in h.values()) for s, h in headers.items()}
    )
    tensors = {n: tensors[n] for n in sorted(tensors, key=natural_key)}
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


# ------------------------------------------------------------------------------ natively quantized sources
MXFP4_BLOCKS, MXFP4_SCALES = names.MXFP4_BLOCKS, names.MXFP4_SCALES
PACKED, CT_SCALE, CT_SHAPE, CT_ZERO, CT_GIDX = (
    ".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point", ".weight_g_idx",
)  # fmt: skip
NV_SCALE, NV_SCALE_2, NV_INPUT = "_scale", "_scale_2", ".input_scale"


def pair_native(
    headers: Mapping[str, Mapping[str, HeaderTensor]], weight_map: Mapping[str, str], scheme: QuantScheme
) -> tuple[dict[str, SourceTensor], set[str]]:
    """Pair the companion tensors of natively quantized weights (§5) into one ``SourceTensor`` each, so that
    blocks, scales, packed codes, ``weight_shape`` and ``input_scale`` are not converted as tensors of their
    own. Returns ``(logical name -> SourceTensor, every consumed source name)``. A companion without its
    weight, or a scale grid that does not fit, is a ConvertError naming both."""

    def info(n: str) -> HeaderTensor:
        return headers[weight_map[n]][n]

    def ref(n: str) -> ScaleRef:
        h = info(n)
        return ScaleRef(n, weight_map[n], h.dtype, tuple(h.shape))

    out: dict[str, SourceTensor] = {}
    consumed: set[str] = set()

    def add(name: str, data: str, shape: tuple[int, ...], q: QuantRef) -> None:
        if name in out or (name in weight_map and name != data):
            raise ConvertError(f"tensor {data}: its decoded name {name} is also a tensor of the source")
        out[name] = SourceTensor(name, weight_map[data], info(data).dtype, shape, None, q)
        consumed.update(r.name for _, r in q.parts)
        consumed.update(q.dropped)

    def need(n: str, what: str, of: str) -> None:
        if n not in weight_map:
            raise ConvertError(f"tensor {of}: {what} without its {n}")

    for n in sorted(weight_map, key=natural_key):
        h = info(n)
        shape = tuple(h.shape)
        if n.endswith(MXFP4_BLOCKS) and h.dtype == "U8":  # gpt-oss MXFP4
            base = n[: -len(MXFP4_BLOCKS)]
            sname = base + MXFP4_SCALES
            need(sname, "MXFP4 blocks", n)
            s = ref(sname)
            if len(shape) < 3 or shape[-1] != 16 or s.shape != shape[:-1] or s.dtype != "U8":
                raise ConvertError(
                    f"tensor {sname}: MXFP4 scales {s.dtype} {list(s.shape)} do not fit blocks {n} {list(shape)} "
                    "(expected U8 [..., O, I/32] for blocks [..., O, I/32, 16])"
                )
            add(
                base,
                n,
                (*shape[:-2], shape[-2] * 32),
                QuantRef(dq.MXFP4, 32, (("data", ref(n)), ("scale", s))),
            )
        elif n.endswith(PACKED):  # compressed-tensors pack-quantized
            base = n[: -len(PACKED)]
            need(base + CT_SCALE, "packed INT4 weight", n)
            if h.dtype != "I32" or len(shape) != 2:
                raise ConvertError(
                    f"tensor {n}: packed INT4 weight {h.dtype} {list(shape)} (expected I32 [O, I/8])"
                )
            s = ref(base + CT_SCALE)
            O, I = shape[0], shape[1] * 8
            if (
                len(s.shape) != 2
                or s.shape[0] != O
                or not s.shape[1]
                or s.dtype not in ("BF16", "F16", "F32")
            ):
                raise ConvertError(
                    f"tensor {s.name}: INT4 scale {s.dtype} {list(s.shape)} does not fit {n} {list(shape)}"
                )
            ct = scheme.int4 or dq.Int4Scheme()
            g = ct.group_size or -(-I // s.shape[1])
            if -(-I // g) != s.shape[1]:
                raise ConvertError(
                    f"tensor {s.name}: {s.shape[1]} scale groups per row do not fit I = {I} with group size {g}"
                )
            parts = [("data", ref(n)), ("scale", s)]
            zero, gidx = base + CT_ZERO, base + CT_GIDX
            for role, extra in (("zero_point", zero), ("g_idx", gidx), ("shape", base + CT_SHAPE)):
                if extra in weight_map:
                    parts.append((role, ref(extra)))
            exact = zero not in weight_map and gidx not in weight_map and ct.symmetric and not ct.actorder
            add(base + ".weight", n, (O, I), QuantRef(dq.INT4, g, tuple(parts), exact))
        elif (
            h.dtype == "U8" and n + NV_SCALE in weight_map and n + NV_SCALE_2 in weight_map
        ):  # modelopt NVFP4
            s, s2 = ref(n + NV_SCALE), ref(n + NV_SCALE_2)
            if len(shape) != 2:
                raise ConvertError(f"tensor {n}: NVFP4 weight of shape {list(shape)} (expected [O, I/2])")
            O, I = shape[0], shape[1] * 2
            if s.dtype != "F8_E4M3" or s.shape != (O, -(-I // 16)):
                raise ConvertError(
                    f"tensor {s.name}: NVFP4 scale {s.dtype} {list(s.shape)} does not fit {n} {list(shape)} "
                    f"(expected F8_E4M3 [{O}, {-(-I // 16)}])"
                )
            if s2.dtype != "F32" or HeaderTensor(s2.dtype, s2.shape).nbytes != 4:
                raise ConvertError(
                    f"tensor {s2.name}: NVFP4 scale_2 {s2.dtype} {list(s2.shape)} (expected F32 scalar)"
                )
            stem = n[: -len(".weight")] if n.endswith(".weight") else n
            dropped = tuple(x for x in (stem + NV_INPUT,) if x in weight_map)
            add(
                n,
                n,
                (O, I),
                QuantRef(dq.NVFP4, 16, (("data", ref(n)), ("scale", s), ("scale_2", s2)), False, dropped),
            )
        elif (
            h.dtype in FP8_SOURCE_DTYPES
            and n + NV_SCALE in weight_map
            and info(n + NV_SCALE).dtype == "U8"
            and n + SCALE_SUFFIX not in weight_map
        ):  # MXFP8: e4m3 values + E8M0 scale per 32 inputs
            s = ref(n + NV_SCALE)
            if len(shape) != 2 or s.shape != (shape[0], -(-shape[1] // 32)):
                raise ConvertError(
                    f"tensor {s.name}: MXFP8 scale {list(s.shape)} does not fit {n} {list(shape)} "
                    f"(expected U8 [O, ceil(I/32)])"
                )
            add(n, n, shape, QuantRef(dq.MXFP8, 32, (("data", ref(n)), ("scale", s)), False))
    for n in weight_map:
        if n in consumed:
            continue
        if n.endswith(MXFP4_SCALES) and n[: -len(MXFP4_SCALES)] + MXFP4_BLOCKS in weight_map:
            continue  # pragma: no cover - consumed above
        for suffix, what in (
            (MXFP4_SCALES, MXFP4_BLOCKS),
            (CT_SHAPE, PACKED),
            (CT_ZERO, PACKED),
            (CT_GIDX, PACKED),
        ):
            if n.endswith(suffix) and n[: -len(suffix)] + what not in weight_map:
                raise ConvertError(f"tensor {n}: companion without its weight {n[: -len(suffix)] + what}")
    return out, consumed


def source_kind(src: SourceTensor, fp8_block: tuple[int, int] | None, fused: bool = False) -> rc.SourceKind:
    """What the recipe needs to know of a source tensor (its FP8 block, or its native quantization)."""
    if src.quant is None:
        return rc.SourceKind(src.dtype, fp8_block, fused)
    q = src.quant
    return rc.SourceKind(src.dtype, None, fused, native=q.kind, native_group=q.group, native_exact=q.exact)


# ---------------------------------------------------------------------------------------- config checks
def check_config_shapes(inv: Inventory) -> None:
    """Shapes that ``config.json`` pins: a mismatch is an error naming the tensor, both shapes and the key.

    The numbers are the config facts (``formats/model_config.py``: text model, expert count and width)."""
    facts = model_config.read_facts(inv.config)
    H, V, E, moe_i = facts.hidden_size, facts.vocab_size, facts.routed_experts, facts.expert_width
    # per-expert tensors run in routed_expert_hidden_size (Kimi K3's LatentMoE latent) where the config sets one
    EH, eh_key = (H, "hidden_size") if facts.expert_hidden in (None, H) else (facts.expert_hidden,
                                                                              "routed_expert_hidden_size")
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

    def expect(name: str, shape: tuple[int, ...], want: tuple[int | None, ...], keys: str) -> None:
        if len(shape) != len(want) or any(
            w is not None and s != w for s, w in zip(shape, want, strict=False)
        ):
            shown = [w if w is not None else "*" for w in want]
            raise ConvertError(
                f"tensor {name}: shape {list(shape)} does not match config.json {keys} (expected {shown})"
            )

    for name, t in inv.tensors.items():
        if (t.dtype in COPY_DTYPES and t.quant is None) or names.is_tower(name):
            continue  # rules 0 and 1: copied as they are
        if rc.is_embedding(name) and (V or H):
            expect(name, t.shape, (V, H), "vocab_size x hidden_size")
            continue
        fused = rc.fused_of(name)
        if fused is not None and len(t.shape) == (2 if fused.bias else 3):
            orientation = inv.orientation_of(t)
            if orientation is None:
                family = model_config.model_type(inv.config)
                if t.quant is not None and inv.stack_orientation is not None:
                    raise ConvertError(
                        f"tensor {name}: a natively quantized ({t.quant.kind}) expert stack, but the family "
                        f"{family!r} does not fix how "
                        f"the rows of its {t.quant.kind} stacks hold gate / up (its float stacks are "
                        f"{inv.stack_orientation}; known: "
                        f"{', '.join(f'{m} {k}' for m, k in sorted(names.NATIVE_STACK_ORIENTATION))})"
                    )
                raise ConvertError(
                    f"tensor {name}: an expert stack, but the family {family!r} "
                    "does not fix how its experts are laid out (known: "
                    f"{', '.join(sorted(names.STACK_ORIENTATION))}); convert a per-expert export instead"
                )
            stack_shapes = transposed if orientation is names.Orientation.TRANSPOSED_INTERLEAVED else by_rows
            want, keys = (bias_shapes if fused.bias else stack_shapes)[fused.projection]
            expect(name, t.shape, want, keys)
            continue
        shared = names.shared_stack(name)
        if shared is not None and len(t.shape) == 3:
            if inv.stack_orientation is None and shared.projection == "gate_up":
                raise ConvertError(
                    f"tensor {name}: a stacked shared gate/up expert, but the family "
                    f"{model_config.model_type(inv.config)!r} does not fix how its rows are laid out (known: "
                    f"{', '.join(sorted(names.STACK_ORIENTATION))})"
                )
            continue
        ex = rc.expert_of(name)
        if ex is None or len(t.shape) != 2:
            continue
        if E is not None and ex.expert >= E:
            raise ConvertError(f"tensor {name}: expert index {ex.expert} >= config.json expert count {E}")
        if ex.projection in ("gate", "up"):
            expect(name, t.shape, (moe_i, EH), f"moe_intermediate_size x {eh_key}")
        elif ex.is_down:
            expect(name, t.shape, (EH, moe_i), f"{eh_key} x moe_intermediate_size")


# ------------------------------------------------------------------------------------------ shard headers
def read_source_headers(source: Source, shards: list[str]) -> dict[str, dict[str, HeaderTensor]]:
    """Header entries of every shard, without downloading tensor data (``Source.header``)."""
    return {shard: source.header(shard) for shard in shards}
