"""The source inventory: every source tensor with its shard, dtype, shape and (FP8) scale, validated before any
work starts (FORMATS-SPEC §5).

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

from colitools.converters import recipe as rc
from colitools.converters.dequant import (
    FP8_SOURCE_DTYPES,
    SCALE_SUFFIX,
    Fp8Scheme,
    check_scale_grid,
    check_source_dtype,
    fp8_scheme,
)
from colitools.converters.sources import HeaderTensor, Source, check_shard_name
from colitools.errors import ConvertError
from colitools.formats import model_config, names
from colitools.formats.errors import ConfigError
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
class SourceTensor:
    """A source weight (not a scale): name, shard, exact dtype, shape, and its FP8 scale if any."""

    name: str
    shard: str
    dtype: str
    shape: tuple[int, ...]
    scale: ScaleRef | None = None

    @property
    def nbytes(self) -> int:
        return HeaderTensor(self.dtype, self.shape).nbytes

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


def family_orientation(config: Mapping[str, Any]) -> names.Orientation | None:
    types = [t for t in (config.get("model_type"), model_config.text_config(config).get("model_type")) if t]
    if not types:
        return names.Orientation.ROWS
    for t in types:
        found = names.stack_orientation(t)
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
    try:
        model_config.validate_config(config)
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
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
    scheme = fp8_scheme(config)
    fp8 = any(headers[s][n].dtype in FP8_SOURCE_DTYPES for n, s in weight_map.items())
    if fp8 and scheme is None:
        # FP8 tensors without quantization_config: the DeepSeek default, grid-checked below
        scheme = Fp8Scheme()
    block = scheme.block if scheme else None

    scales = {n for n in weight_map if n.endswith(SCALE_SUFFIX)}
    tensors: dict[str, SourceTensor] = {}
    for name in sorted(weight_map, key=natural_key):
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
    inv = Inventory(
        tensors, dict(config), scheme, {s: sizes.get(s, 0) for s in sorted(set(weight_map.values()))}
    )
    check_config_shapes(inv)
    return inv


# ---------------------------------------------------------------------------------------- config checks
def check_config_shapes(inv: Inventory) -> None:
    """Shapes that ``config.json`` pins: a mismatch is an error naming the tensor, both shapes and the key.

    The numbers are the config facts (``formats/model_config.py``: text model, expert count and width)."""
    try:
        facts = model_config.read_facts(inv.config)
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
    H, V, E, moe_i = facts.hidden_size, facts.vocab_size, facts.routed_experts, facts.expert_width
    orientation = inv.stack_orientation
    two_i = 2 * moe_i if moe_i else None
    if orientation is names.Orientation.TRANSPOSED_INTERLEAVED:
        stack_shapes = {"gate_up": ((E, H, two_i), "[experts, hidden_size, 2 x expert width]"),
                        "down": ((E, moe_i, H), "[experts, expert width, hidden_size]")}  # fmt: skip
    else:
        stack_shapes = {"gate_up": ((E, two_i, H), "[experts, 2 x moe_intermediate_size, hidden_size]"),
                        "down": ((E, H, moe_i), "[experts, hidden_size, moe_intermediate_size]")}  # fmt: skip
    stack_shapes["gate"] = stack_shapes["up"] = ((E, moe_i, H), "[experts, expert width, hidden_size]")
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
        if t.dtype in COPY_DTYPES or names.is_tower(name):
            continue  # rules 0 and 1: copied as they are
        if rc.is_embedding(name) and (V or H):
            expect(name, t.shape, (V, H), "vocab_size x hidden_size")
            continue
        fused = rc.fused_of(name)
        if fused is not None and len(t.shape) == (2 if fused.bias else 3):
            if orientation is None:
                raise ConvertError(
                    f"tensor {name}: an expert stack, but the family {model_config.model_type(inv.config)!r} "
                    "does not fix how its experts are laid out (known: "
                    f"{', '.join(sorted(names.STACK_ORIENTATION))}); convert a per-expert export instead"
                )
            want, keys = (bias_shapes if fused.bias else stack_shapes)[fused.projection]
            expect(name, t.shape, want, keys)
            continue
        ex = rc.expert_of(name)
        if ex is None or len(t.shape) != 2:
            continue
        if E is not None and ex.expert >= E:
            raise ConvertError(f"tensor {name}: expert index {ex.expert} >= config.json expert count {E}")
        if ex.projection in ("gate", "up"):
            expect(name, t.shape, (moe_i, H), "moe_intermediate_size x hidden_size")
        elif ex.is_down:
            expect(name, t.shape, (H, moe_i), "hidden_size x moe_intermediate_size")


# ------------------------------------------------------------------------------------------ shard headers
def read_source_headers(source: Source, shards: list[str]) -> dict[str, dict[str, HeaderTensor]]:
    """Header entries of every shard, without downloading tensor data (``Source.header``)."""
    return {shard: source.header(shard) for shard in shards}
