"""Which routed experts each shard holds, and how many bytes of each (docs/CLI.md "mirror" (plan), first step).

A routed-expert tensor is a per-expert tensor of an MoE layer (docs/FORMATS.md §4 names, parsed by the tensor-name
map ``colitools.formats.names``; its ``MOE_BLOCKS`` and ``PROJECTIONS`` hold the spellings)::

    ...layers.{L}.mlp.experts.{E}.{gate_proj,up_proj,down_proj}.weight        (+ ".qs" sidecar)
    ...layers.{L}.block_sparse_moe.experts.{E}.{w1,w2,w3}[.weight]             (Mixtral; + ".qs")
    ...layers.{L}.{mlp,block_sparse_moe}.experts.{E}.{proj}.weight_packed      (mxfp4 / K3 pairs)
    ...layers.{L}.{mlp,block_sparse_moe}.experts.{E}.{proj}.weight_scale       (their E8M0 scales)
    ...layers.{L}.{mlp,block_sparse_moe}.experts.{E}.{proj}.weight_scale_inv   (FP8 block scales of a source)
    ...layers.{L}.mlp.experts.{E}.merged_weight  (+ ...experts.{E}.qs)          (--target olmoe / qwen36 blobs)
    ...layers.{L}.mlp.experts.gate_up_proj / down_proj (+ .qs)                    (--target inkling fused stacks)
    layers.{L}.ffn.experts.{E}.{w1,w2,w3}.weight / .scale                      (--target deepseek_v4, released)

With ``--layout planar`` the routed experts live in the sidecar ``experts-int4g64/layer-NNN.safetensors``
(docs/FORMATS.md §4): ``discover_shards`` scans those files too, named by their path relative to the model folder
(``experts-int4g64/layer-003.safetensors``), so their bytes count as expert bytes.

Shared experts (``mlp.shared_experts.``, ``mlp.shared_expert.``) and routers are not routed experts. The
engine assigns an expert to a drive by its *routed tensor*, the first one it reads: ``gate_proj.weight``
(``gate_proj.weight_packed`` for mxfp4), ``w1`` / ``w1.weight``, ``w1.weight_packed``, or a merged blob
``merged_weight`` (formats/targets/), or a fused stack's ``gate_up_proj`` (every expert of its layer).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from colitools.formats import model_config, planar_sidecar, targets
from colitools.formats.errors import MirrorError
from colitools.formats.filenames import CONFIG_FILE, shard_files
from colitools.formats.jsonfile import load_json_object
from colitools.formats.names import (
    EXPERTS,
    MERGED,
    MOE_BLOCKS,
    SUFFIXLESS_PROJECTIONS,
    is_merged_scale,
    parse_name,
)
from colitools.formats.safetensors_io import SafetensorsFile

__all__ = [
    "ExpertKey",
    "ExpertTensor",
    "ModelGeometry",
    "ShardExperts",
    "classify_expert_tensor",
    "discover_shards",
    "model_geometry",
    "scan_shard",
]

ExpertKey = tuple[int, int]  # (layer, expert)

# The engine routes an expert by its first tensor: the gate projection's weight, codes or bare Mixtral name.
_ROUTED_SUFFIX = frozenset({"", "weight", "weight_packed"})
# What may follow a routed expert's projection: weights, codes and every scale spelling.
_EXPERT_SUFFIXES = frozenset(
    {"", "weight", "weight.qs", "qs", "weight_packed", "weight_scale", "weight_scale_inv",
     "scale"}  # scale: DeepSeek-V4's released ``w1.scale`` (--target deepseek_v4)
)  # fmt: skip

PLANAR_LAYOUT = planar_sidecar.CODES  # "planar64-v8"


@dataclass(frozen=True)
class ExpertTensor:
    """A routed-expert tensor: its expert, and whether it is the tensor the engine routes by."""

    layer: int
    expert: int
    routed: bool

    @property
    def key(self) -> ExpertKey:
        return (self.layer, self.expert)


def classify_expert_tensor(name: str) -> ExpertTensor | None:
    """The routed expert a tensor belongs to, or None for every other tensor (shared experts included)."""
    parsed = parse_name(name)
    block, _, container = parsed.module.partition(".")
    merged_blob = parsed.projection == MERGED and parsed.suffix == ""
    if (
        parsed.layer is not None
        and container == EXPERTS
        and block in MOE_BLOCKS
        and parsed.expert is not None
    ):
        if merged_blob or is_merged_scale(
            name
        ):  # a target's merged blob routes the expert (formats/targets/)
            return ExpertTensor(parsed.layer, parsed.expert, merged_blob)
    if (
        parsed.layer is None
        or parsed.expert is None
        or container != EXPERTS
        or block not in MOE_BLOCKS
        or parsed.projection is None
        or parsed.suffix not in _EXPERT_SUFFIXES
        # a bare projection name (no suffix) is only Mixtral's spelling; `gate_proj` always has a suffix
        or (parsed.suffix == "" and parsed.leaf not in SUFFIXLESS_PROJECTIONS)
    ):
        return None
    routed = parsed.projection == "gate" and parsed.suffix in _ROUTED_SUFFIX
    return ExpertTensor(parsed.layer, parsed.expert, routed)


@dataclass(frozen=True)
class ShardExperts:
    """One shard: its size and, per routed expert, the bytes of that expert's tensors it holds."""

    name: str
    path: Path
    size: int
    expert_bytes: dict[ExpertKey, int] = field(default_factory=dict)
    routed: frozenset[ExpertKey] = frozenset()  # experts whose routed tensor is in this shard
    layout: str = "pairs"  # "pairs" or the declared "planar64-v8"


def fused_stack_of(name: str) -> tuple[int, bool] | None:
    """``(layer, routes)`` of a fused expert stack or its scales (formats/targets/ ``FusedLayout``:
    ``...layers.{L}.mlp.experts.gate_up_proj`` / ``down_proj`` [+ ``.qs``]), or None. The stack holds every
    expert of its layer; ``gate_up_proj`` is the tensor the engine reads an expert from first (``slot_fill``)."""
    layout = targets.FUSED
    base = name[: -len(layout.scale_suffix)] if name.endswith(layout.scale_suffix) else name
    parsed = parse_name(base)
    block, _, container = parsed.module.partition(".")
    if (parsed.layer is None or parsed.expert is not None or parsed.suffix != "" or container != EXPERTS
            or block not in MOE_BLOCKS or parsed.leaf not in dict(layout.stacks)):  # fmt: skip
        return None
    return parsed.layer, base == name and parsed.leaf == layout.stacks[0][0]


def scan_shard(
    path: str | os.PathLike, name: str | None = None, n_experts: int | None = None
) -> ShardExperts:
    """Parse one shard's header (strictly, docs/FORMATS.md §1) and sum its routed-expert bytes per expert.
    ``name``: the shard's name in the plan (default the file name; a sidecar file's is its relative path).

    A fused expert stack (``fused_stack_of``) counts ``nbytes / E`` for each of its ``E`` experts: every expert
    has the same rows, expert ``e``'s are the ``e``-th ``1/E`` of the stack's bytes (and of its ``.qs``); ``E`` is
    the stack's first dimension when it is 3-D, else ``n_experts`` (config.json's routed expert count: colibri's
    converter writes the stacks 1-D)."""
    path = Path(path)
    shard_name = name or path.name
    with SafetensorsFile(path) as st:
        expert_bytes: dict[ExpertKey, int] = {}
        routed: set[ExpertKey] = set()
        for name, info in st.tensors.items():
            stack = fused_stack_of(name)
            if stack is not None:
                layer, routes = stack
                E = info.shape[0] if len(info.shape) == 3 else n_experts
                if not E or info.nbytes % E:
                    raise MirrorError(
                        f"{path}: fused expert stack {name} ({info.nbytes} bytes) does not split into "
                        f"{E or 'an unknown number of'} experts (config.json's routed expert count)"
                    )
                for e in range(E):
                    expert_bytes[(layer, e)] = expert_bytes.get((layer, e), 0) + info.nbytes // E
                    if routes:
                        routed.add((layer, e))
                continue
            tensor = classify_expert_tensor(name)
            if tensor is None:
                continue
            expert_bytes[tensor.key] = expert_bytes.get(tensor.key, 0) + info.nbytes
            if tensor.routed:
                routed.add(tensor.key)
        layout = st.metadata.get("colitools.layout", "pairs")
        if planar_sidecar.is_sidecar_file(shard_name):
            layout = PLANAR_LAYOUT  # the sidecar's codes (its __metadata__ names colibri's format instead)
        size = st.file_size
    return ShardExperts(shard_name, path, size, expert_bytes, frozenset(routed), layout)


def sidecar_shard_files(directory: str | os.PathLike) -> list[tuple[str, Path]]:
    """The planar sidecar's layer files of a model (or mirror) folder: ``(relative name, path)``, sorted."""
    folder = planar_sidecar.sidecar_dir(directory)
    if not folder.is_dir():
        return []
    return [
        (f"{planar_sidecar.SIDECAR_DIR}/{p.name}", p)
        for p in shard_files(folder)
        if planar_sidecar.layer_of_file(p.name) is not None
    ]


def discover_shards(
    directories: Sequence[str | os.PathLike], warnings: list[str] | None = None, n_experts: int | None = None
) -> list[ShardExperts]:
    """Scan every ``*.safetensors`` file (not hidden, not a symlink to a directory) of the directories
    (``n_experts``: config.json's routed expert count, for 1-D fused stacks, ``scan_shard``).

    The first directory holding a name wins; a later duplicate is ignored with a warning. Sorted by name.
    """
    found: dict[str, ShardExperts] = {}
    for directory in directories:
        directory = Path(directory)
        if not directory.is_dir():
            raise MirrorError(f"shard directory does not exist: {directory}")
        for name, path in [(p.name, p) for p in shard_files(directory)] + sidecar_shard_files(directory):
            if name in found:
                if warnings is not None:
                    warnings.append(f"duplicate shard {name} in {directory} ignored (first copy is used)")
                continue
            found[name] = scan_shard(path, name, n_experts)
    if not found:
        where = ", ".join(str(Path(d)) for d in directories)
        raise MirrorError(f"no *.safetensors shards found in {where}")
    return [found[name] for name in sorted(found)]


@dataclass(frozen=True)
class ModelGeometry:
    """What ``config.json`` says about routing: engine name (``model_type``), decoder layers, routed experts."""

    engine: str | None = None
    n_layers: int | None = None
    n_experts: int | None = None


def model_geometry(model_dir: str | os.PathLike) -> ModelGeometry:
    """Read ``config.json`` of a model directory (all fields None when absent): the config facts
    (``formats/model_config.py``, which validate it and unwrap ``text_config``); a count of 0 is None."""
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        return ModelGeometry()
    facts = model_config.read_facts(load_json_object(path), where=str(path))  # FormatError: one line
    return ModelGeometry(facts.model_type, facts.num_hidden_layers, facts.routed_experts or None)
