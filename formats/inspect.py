"""What is in a container: the library behind ``colitools inspect`` and ``colitools formats``.

``open_model`` finds the shards of a path (one ``.safetensors`` file, or a model directory with or without
``model.safetensors.index.json``), checks that the index's ``weight_map`` covers exactly the tensors present and
loads ``config.json``; ``inspect_path`` resolves every tensor (``container.resolve_container``) and totals the
bytes per format. Only headers are read, never tensor data, so inspecting a terabyte model is instant.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from colitools.formats import model_config, names, planar_sidecar, source_encodings, targets
from colitools.formats.container import ResolvedTensor, check_shard_name, resolve_container
from colitools.formats.errors import ConfigError, FormatError
from colitools.formats.filenames import CONFIG_FILE, INDEX_FILE, MANIFEST_FILE
from colitools.formats.format_names import GROUPED_PREFIXES, copied_label, format_label
from colitools.formats.jsonfile import load_json_object
from colitools.formats.registry import (
    DEFAULT_GROUP_SIZE,
    FORMATS,
)
from colitools.formats.resolver import parse_layout
from colitools.formats.safetensors_io import SafetensorsFile, read_header

__all__ = [
    "FormatRow",
    "FormatTotal",
    "InspectReport",
    "ModelFiles",
    "ShardSummary",
    "SourceWeight",
    "conversion_state",
    "describe_formats",
    "incomplete_conversion",
    "inspect_path",
    "open_model",
    "source_weights",
    "tensor_label",
]


# ------------------------------------------------------------------------------------ finding shards
@dataclass
class ModelFiles:
    """The shards of a container (headers validated), its index and its config, as found on disk."""

    path: Path
    shards: list[SafetensorsFile]
    index: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    sidecar: list[SafetensorsFile] = field(
        default_factory=list
    )  # planar sidecar layer files (also in shards)
    merged_group_size: int | None = None  # expert_gs of a target's metadata file (formats/targets/)


def _index_shards(directory: Path, index: dict[str, Any]) -> dict[str, list[str]]:
    """shard file name -> tensor names, from a parsed index (validated)."""
    index_path = directory / INDEX_FILE
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError(f"{index_path}: weight_map is missing, empty or not an object")
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(check_shard_name(shard, str(index_path), tensor), []).append(tensor)
    return by_shard


def _check_index_coverage(
    directory: Path, by_shard: dict[str, list[str]], shards: Sequence[SafetensorsFile]
) -> None:
    """Every tensor the index maps is in its shard, and every tensor of a shard is mapped to that shard."""
    index_path = directory / INDEX_FILE
    mapped_to = {tensor: shard for shard, tensors in by_shard.items() for tensor in tensors}
    for shard in shards:
        for tensor in shard.tensors:
            if mapped_to.get(tensor) != shard.path.name:
                where = f"maps it to {mapped_to[tensor]}" if tensor in mapped_to else "does not list it"
                raise FormatError(
                    f"{index_path}: {shard.path.name} holds tensor {tensor}, but weight_map {where}"
                )
        for tensor in by_shard[shard.path.name]:
            if tensor not in shard.tensors:
                raise FormatError(
                    f"{index_path}: weight_map maps tensor {tensor} to {shard.path.name}, which does not hold it"
                )


def open_model(path: str | os.PathLike[str], *, sidecar: bool = True) -> ModelFiles:
    """Open the shards at ``path`` (headers only) and the model's index and config, if it is a directory.

    A directory with ``model.safetensors.index.json`` is the shards it names (coverage checked both ways);
    without an index it is every ``*.safetensors`` file in it. ``config.json`` is loaded when present. With
    ``sidecar`` (the default), the published layer files of a planar sidecar ``experts-int4g64/`` (docs/FORMATS.md
    §4, ``planar_sidecar.open_sidecar``) are the home of the routed experts: they follow the main shards in
    ``shards`` and are listed in ``sidecar``. A lone sidecar layer file is read with its folder's index.
    """
    root = Path(path)
    if root.is_file():
        if (
            root.parent.name == planar_sidecar.SIDECAR_DIR
            and planar_sidecar.layer_of_file(root.name) is not None
        ):
            index = planar_sidecar.read_index(root.parent.parent)
            if index is not None:
                layer = planar_sidecar.SidecarLayerFile(root, index)
                return ModelFiles(root, [layer], sidecar=[layer])
        return ModelFiles(root, [read_header(root)])
    if not root.is_dir():
        raise FormatError(f"{root}: no such file or directory")
    model = ModelFiles(root, [])
    if (root / CONFIG_FILE).is_file():
        model.config = load_json_object(root / CONFIG_FILE)
    model.merged_group_size = targets.merged_group_size(root)
    present = sorted(p.name for p in root.glob("*.safetensors") if p.is_file())
    if (root / INDEX_FILE).is_file():
        model.index = load_json_object(root / INDEX_FILE)
        by_shard = _index_shards(root, model.index)
        model.shards = [read_header(root / name) for name in sorted(by_shard)]
        _check_index_coverage(root, by_shard, model.shards)
        unlisted = [name for name in present if name not in by_shard]
        if unlisted:
            model.warnings.append(
                f"{len(unlisted)} *.safetensors file(s) not in {INDEX_FILE}, ignored: {', '.join(unlisted)}"
            )
        metadata = model.index.get("metadata")
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        data = sum(info.nbytes for s in model.shards for info in s.tensors.values())
        if total is not None and total != data:
            model.warnings.append(
                f"{INDEX_FILE}: metadata.total_size is {total}, the shards hold {data} bytes of tensor data"
            )
    else:
        if not present and planar_sidecar.read_index(root) is None:
            raise FormatError(f"{root}: no *.safetensors files and no {INDEX_FILE}")
        model.shards = [read_header(root / name) for name in present]
    if sidecar:
        model.sidecar = list(planar_sidecar.open_sidecar(root))
        model.shards += model.sidecar
    return model


def conversion_state(path: str | os.PathLike[str]) -> str | None:
    """The ``state`` a model folder's ``colitools.json`` records (``converting`` until the conversion
    finished, then ``complete``; docs/FORMATS.md §8), or None: no manifest (a foreign container, a source
    checkpoint, a single file), or one that cannot be read (``verify container`` reports that)."""
    manifest = Path(path) / MANIFEST_FILE
    if not manifest.is_file():
        return None
    try:
        state = load_json_object(manifest).get("state")
    except FormatError:
        return None
    return state if isinstance(state, str) else None


def incomplete_conversion(path: str | os.PathLike[str]) -> str | None:
    """``<path>: the conversion is not complete (...): rerun convert ...`` when the folder's manifest says it
    is still converting (an interrupted ``colitools convert``), else None."""
    state = conversion_state(path)
    if state is None or state == "complete":
        return None
    why = f"{MANIFEST_FILE} state {state!r}"
    return f"{path}: the conversion is not complete ({why}): rerun convert to finish"


# ----------------------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class ShardSummary:
    path: str
    tensors: int
    data_bytes: int
    file_bytes: int
    layout: str


@dataclass(frozen=True)
class FormatTotal:
    """Weights of one format: how many, and their bytes including their scale tensors."""

    format: str
    tensors: int
    bytes: int


@dataclass(frozen=True)
class InspectReport:
    path: str
    shards: list[ShardSummary]
    tensors: list[ResolvedTensor]
    totals: list[FormatTotal]
    config_checked: bool
    index: bool
    warnings: list[str]
    sidecar: list[str] = field(default_factory=list)  # the planar sidecar's layer files (also in ``shards``)
    unresolved: list[str] = field(default_factory=list)  # quantized weights whose [O, I] is unknown (§3)
    # per role (names.DETAIL_ROLES): format label -> weights; what the manifest's formats_per_role says
    formats_per_role: dict[str, dict[str, int]] = field(default_factory=dict)
    # a source checkpoint's natively quantized weights: role -> encoding -> {"tensors", "bytes"} (parts included)
    source_encodings: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @property
    def layout(self) -> str:
        """``pairs``, ``planar64-v8``, or ``mixed (...)`` when shards differ; ``... + sidecar planar64-v8`` when
        the routed experts are in a planar sidecar."""
        main = sorted({s.layout for s in self.shards if s.path not in self.sidecar})
        side = f"sidecar {planar_sidecar.CODES}" if self.sidecar else ""
        if not main:
            return side
        text = main[0] if len(main) == 1 else f"mixed ({', '.join(main)})"
        return f"{text} + {side}" if side else text

    @property
    def total_bytes(self) -> int:
        return sum(s.data_bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (stable keys; for ``inspect --json``)."""
        tensors = []
        for t in self.tensors:
            tensors.append(
                {
                    "name": t.name,
                    "file": t.file,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "bytes": t.nbytes,
                    "kind": t.kind,
                    "format": t.format.name if t.format else None,
                    "label": tensor_label(t),
                    "fmt": t.format.fmt if t.format else None,
                    "group_size": t.format.group_size if t.format else None,
                    "logical_shape": list(t.logical_shape) if t.logical_shape else None,
                    "stamp": t.stamp,
                    "scale": t.scale,
                    "scale_bytes": t.scale_nbytes,
                    "scale_of": t.scale_of,
                    "layout": t.layout,
                }
            )
        return {
            "path": self.path,
            "layout": self.layout,
            "index": self.index,
            "sidecar": list(self.sidecar),
            "config_checked": self.config_checked,
            "total_bytes": self.total_bytes,
            "shards": [asdict(s) for s in self.shards],
            "totals": [asdict(t) for t in self.totals],
            "tensors": tensors,
            "unresolved": list(self.unresolved),
            "formats_per_role": {r: dict(f) for r, f in self.formats_per_role.items()},
            "source_encodings": {
                r: {e: dict(c) for e, c in f.items()} for r, f in self.source_encodings.items()
            },
            "warnings": list(self.warnings),
        }


def tensor_label(t: ResolvedTensor) -> str | None:
    """The user-facing format name of a weight (``format_names.format_label``: a float by its dtype), or None
    for a tensor with no format (scales, integer tensors)."""
    if t.format is None or t.kind == "scale":
        return None
    return format_label(t.format.name, t.format.group_size, t.dtype if t.kind == "float" else None)


def _total_label(t: ResolvedTensor) -> str:
    if t.kind == "unresolved":
        return "unresolved"
    return tensor_label(t) or f"other ({t.dtype})"


def role_formats(
    tensors: Sequence[ResolvedTensor],
    num_hidden_layers: int | None = None,
    sources: Mapping[str, SourceWeight] | None = None,
) -> dict[str, dict[str, int]]:
    """Formats per role of a container's weights (scales not counted), by the roles the converter counts
    (``names.detail_role`` on the stored names): a tensor in its source dtype that is no weight format
    (``other``: integer tensors) or a float tower tensor is ``<dtype> (copied)``; each projection of a merged
    expert blob counts on its own. Equal to the manifest's ``formats_per_role`` for a colitools conversion.
    A source checkpoint's natively quantized weight (``sources``, by every part's name) counts once, under its
    logical weight's role, as its encoding (``SourceWeight.encoding``); its companions are not weights."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    sources = sources or {}
    for t in tensors:
        if t.kind == "scale":
            continue
        if t.name in sources:
            sw = sources[t.name]
            if t.name == sw.data:
                counts[sw.role][sw.encoding] += 1
            continue
        if (
            t.parts
        ):  # a target's merged blob / fused stack: one weight per expert projection (formats/targets/)
            p = names.parse_name(t.name)
            for part in t.parts:
                expert = p.expert if part.expert is None else part.expert
                part_name = names.expert_tensor_name(p.expert_base, expert, part.projection)
                counts[names.detail_role(part_name, 2, num_hidden_layers=num_hidden_layers)][
                    _total_label(t)
                ] += 1
            continue
        ndim = 2 if t.kind in ("quantized", "unresolved") else len(t.shape)
        copied = t.kind == "other"
        if t.kind == "float" and _is_stack(t.name, ndim):  # a source's float expert stack: its experts' role
            counts[_stack_role(t.name, num_hidden_layers)][f"{_total_label(t)}{_stack_of(t.shape)}"] += 1
            continue
        if t.kind == "float" and ndim == 2 and names.parse_name(t.name).role is names.TensorRole.STACK_BIAS:
            counts["routed experts"][f"{_total_label(t)} biases, fused stack of {t.shape[0]} experts"] += 1
            continue
        role = names.detail_role(t.name, ndim, copied=copied, num_hidden_layers=num_hidden_layers)
        label = (
            copied_label(t.dtype) if copied or (role == "tower" and t.kind == "float") else _total_label(t)
        )
        counts[role][label] += 1
    return names.order_role_formats(counts)


def _is_stack(name: str, ndim: int) -> bool:
    return (
        ndim == 3
        and names.parse_name(name).role is names.TensorRole.EXPERT_STACK
        and not names.is_tower(name)
    )


def _stack_role(name: str, num_hidden_layers: int | None) -> str:
    """The role of an expert stack's experts (``routed experts``, or ``mtp`` in an MTP layer)."""
    p = names.parse_name(name)
    projection = "gate" if p.projection == "gate_up" else p.projection
    first = names.expert_tensor_name(p.expert_base, 0, projection)
    return names.detail_role(first, 2, num_hidden_layers=num_hidden_layers)


def _stack_of(shape: Sequence[int]) -> str:
    return f", fused stack of {shape[0]} experts" if len(shape) == 3 else ""


# ------------------------------------------------------------------------------- source checkpoints
@dataclass(frozen=True)
class SourceWeight:
    """A natively quantized weight of a source checkpoint, as ``inspect`` reports it: its logical ``name``,
    ``data`` tensor and every ``parts`` name (companions: ``_scale_inv``, ``_scales``, ``weight_scale``, ...),
    its ``role`` (``names.detail_role`` of the logical weight, a stack's experts' role), ``encoding`` (the
    registry's ``describe``, plus ``fused stack of E experts``) and ``nbytes`` (every part)."""

    name: str
    data: str
    parts: tuple[str, ...]
    role: str
    encoding: str
    nbytes: int


def source_weights(
    tensors: Mapping[str, Any], config: Mapping[str, Any] | None, num_hidden_layers: int | None = None
) -> tuple[dict[str, SourceWeight], list[str]]:
    """Every natively quantized weight of a source (``tensors``: name -> header entry), recognised by every
    encoding of the source-encoding registry (FP8 blocks included), by each of its parts' names; and the
    warnings (a ``quantization_config`` colitools does not read: its weights are then not recognised)."""
    warnings: list[str] = []
    try:
        scheme = source_encodings.read_quant_config(config or {})
    except ConfigError as exc:
        warnings.append(str(exc))
        scheme = source_encodings.QuantScheme(None)
    try:
        paired, _ = source_encodings.pair_tensors(
            tensors, scheme, encodings=source_encodings.ENCODINGS.values()
        )
    except FormatError as exc:  # a form the registry does not recognise yet: the rest is still reported
        return {}, [*warnings, f"source encodings not read: {exc}"]
    out: dict[str, SourceWeight] = {}
    for p in paired.values():
        stack = len(p.shape) == 3 and names.parse_name(p.name).role is names.TensorRole.EXPERT_STACK
        role = _stack_role(p.name, num_hidden_layers) if stack else names.detail_role(
            p.name, 2, num_hidden_layers=num_hidden_layers
        )  # fmt: skip
        parts = tuple(n for _, n in p.parts) + p.dropped
        nbytes = sum(tensors[n].nbytes for n in parts)
        described = p.encoding.describe(p, scheme.of(p.encoding)) + _stack_of(p.shape)
        sw = SourceWeight(p.name, dict(p.parts)["data"], parts, role, described, nbytes)
        out.update((n, sw) for n in parts)
    return out, warnings


def encodings_per_role(sources: Mapping[str, SourceWeight]) -> dict[str, dict[str, dict[str, int]]]:
    """role -> encoding -> {"tensors", "bytes"} of a source's natively quantized weights (roles in
    ``names.DETAIL_ROLES`` order)."""
    counts: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    for sw in {sw.data: sw for sw in sources.values()}.values():
        c = counts[sw.role].setdefault(sw.encoding, {"tensors": 0, "bytes": 0})
        c["tensors"] += 1
        c["bytes"] += sw.nbytes
    order = {r: i for i, r in enumerate(names.DETAIL_ROLES)}
    return {r: dict(sorted(counts[r].items())) for r in sorted(counts, key=lambda r: (order.get(r, 99), r))}


def _num_hidden_layers(config: dict[str, Any] | None) -> int | None:
    if config is None:
        return None
    try:
        return model_config.num_hidden_layers(config)
    except ConfigError:
        return None


def container_sources(
    shards: Sequence[Any], resolved: Mapping[str, ResolvedTensor], config: dict[str, Any] | None
) -> tuple[dict[str, SourceWeight], list[str]]:
    """``source_weights`` of a container's tensors that its formats do not claim (``other`` and ``float``: a
    source's natively quantized weights are among them)."""
    infos = {
        n: i
        for s in shards
        for n, i in s.tensors.items()
        if n in resolved and resolved[n].kind in ("other", "float")
    }
    return source_weights(infos, config, _num_hidden_layers(config))


def counted_label(t: ResolvedTensor, sources: Mapping[str, SourceWeight]) -> str | None:
    """The format a tensor counts under in a container's totals (``inspect``'s and ``verify container``'s):
    its stored format, a source weight's encoding (``sources``), ``other (<dtype>)``, ``unresolved``; None for
    a scale or a source weight's companion (they count with their weight)."""
    sw = sources.get(t.name)
    if t.kind == "scale" or (sw is not None and sw.data != t.name):
        return None
    return _total_label(t) if sw is None else sw.encoding


def counted_weights(t: ResolvedTensor) -> int:
    """How many weights a tensor counts for in a container's totals: each projection of a merged expert blob or
    fused stack (``parts``) on its own, as ``role_formats`` and the manifest's ``format_totals`` count them."""
    return len(t.parts) or 1


def inspect_path(path: str | os.PathLike[str]) -> InspectReport:
    """Resolve every tensor at ``path`` (a file or a model directory) and total the bytes per format.

    Raises a ColitoolsError (one line naming the file and tensor) for a malformed file, an index that does not
    match the shards, or a tensor that does not resolve. A quantized weight whose ``[O, I]`` neither
    ``colitools.shapes`` nor ``config.json`` gives (a foreign container, §3) is listed as ``unresolved`` (kind
    ``unresolved``, a warning, ``unresolved`` in the JSON) and the rest still resolves.
    """
    model = open_model(path)
    try:
        resolved = resolve_container(
            model.shards,
            config=model.config,
            report_unresolved=True,
            merged_group_size=model.merged_group_size,
        )
        shards = [
            ShardSummary(
                str(s.path),
                len(s.tensors),
                sum(i.nbytes for i in s.tensors.values()),
                s.file_size,
                parse_layout(s.metadata, where=str(s.path)),
            )
            for s in model.shards
        ]
    finally:
        for shard in model.shards:
            shard.close()
    unresolved = [t for t in resolved.values() if t.kind == "unresolved"]
    nhl = _num_hidden_layers(model.config)
    sources, source_warnings = container_sources(model.shards, resolved, model.config)
    totals: dict[str, list[int]] = {}
    for t in resolved.values():
        label = counted_label(t, sources)
        if label is None:
            continue
        sw = sources.get(t.name)
        count_bytes = totals.setdefault(label, [0, 0])
        count_bytes[0] += counted_weights(t)
        count_bytes[1] += t.nbytes + t.scale_nbytes if sw is None else sw.nbytes
    return InspectReport(
        path=str(model.path),
        shards=shards,
        tensors=list(resolved.values()),
        totals=[FormatTotal(label, n, b) for label, (n, b) in sorted(totals.items())],
        config_checked=model.config is not None,
        index=model.index is not None,
        warnings=model.warnings
        + _incomplete(model.path)
        + [f"unresolved: {t.problem}" for t in unresolved]
        + source_warnings,
        sidecar=[str(s.path) for s in model.sidecar],
        unresolved=[t.name for t in unresolved],
        formats_per_role=role_formats(list(resolved.values()), nhl, sources),
        source_encodings=encodings_per_role(sources),
    )


def _incomplete(path: Path) -> list[str]:
    why = incomplete_conversion(path) if path.is_dir() else None
    return [why] if why else []


# ------------------------------------------------------------------------------------ the format table
# Byte formulas as text are the format classes' own (``weight_formula`` / ``scale_formula``); the tests check
# them against the registry's byte arithmetic (evaluated with ``ceil`` = integer ceiling division).


@dataclass(frozen=True)
class FormatRow:
    """One line of ``colitools formats``."""

    ord: int
    name: str
    bits_per_weight: float  # including scales, at I = 4096 (int4-grouped at gs 64)
    weight_bytes: str
    scale_bytes: str
    scale_tensor: str
    group_sizes: tuple[int, ...] | None = None
    written: bool = True  # False: recognised by the resolver only
    options: tuple[str, ...] = ()  # the recipe options (``convert --experts`` ...) that write it


def describe_formats() -> list[FormatRow]:
    """The registry as a table: ordinal, name, bits per weight and the byte formulas (``colitools formats``)."""
    rows = []
    for ord_, fmt in sorted(FORMATS.items()):
        grouped = fmt.grouped
        rows.append(
            FormatRow(
                ord=ord_,
                name=fmt.name,
                bits_per_weight=round(fmt.bits_per_weight(4096, DEFAULT_GROUP_SIZE if grouped else None), 4),
                weight_bytes=fmt.weight_formula,
                scale_bytes=fmt.scale_formula,
                scale_tensor=fmt.scale_tensor_label,
                group_sizes=GROUPED_PREFIXES[fmt.name][1] if grouped else None,
                written=not fmt.read_only,
                options=fmt.option_names(),
            )
        )
    return rows
