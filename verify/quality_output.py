"""The output side of ``verify quality``: a converted folder's weights by the name the converter gives them
(``TensorJob.out_name``, the key of the figures ``convert`` records), and their float32 values.

A weight is found under any format's or target spelling's tensor names (the registry's ``tensor_names``), or as a
projection of a target's merged blob / fused stack (its resolved ``parts``, ``names.expert_tensor_name`` as
``inspect`` counts them); it is decoded by the registry's decoders (``kernels.decode``, bit-identical to the
reference; the reference where a format has no kernel), a planar record's codes reordered to pairs first
(``kernels.planar_to_pairs``), by row ranges where its format's scales allow (``OutputWeights.row_slabs``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats import kernels, model_config, names, qpack, targets
from colitools.formats.container import ResolvedTensor, resolve_container
from colitools.formats.dtypes import numpy_dtype
from colitools.formats.error_stats import ErrorStats, encoded_error, tensor_error
from colitools.formats.errors import ConfigError, FormatError, VerifyError
from colitools.formats.expert_layouts import SIGNED_NIBBLE_XOR, MergedPart
from colitools.formats.format_names import format_label
from colitools.formats.inspect import ModelFiles, tensor_label
from colitools.formats.planar import PLANAR_LAYOUT
from colitools.formats.registry import FORMATS, by_name

__all__ = ["OutputWeight", "OutputWeights", "TensorQuality"]


@dataclass(frozen=True)
class TensorQuality:
    """One output tensor: its name as the converter names it (``TensorJob.out_name``, the key of the recorded
    figures), role (``names.DETAIL_ROLES``), decoder layer (None: a global tensor), format label and figures."""

    name: str
    role: str
    layer: int | None
    format: str
    stats: ErrorStats

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "layer": self.layer,
            "format": self.format,
            **self.stats.to_json(),
        }


@dataclass(frozen=True)
class OutputWeight:
    """Where one logical output tensor is: its resolved tensor, and for a projection inside a target's merged
    blob or fused stack, its ``part``."""

    name: str
    tensor: ResolvedTensor | None
    part: MergedPart | None = None
    qpack: qpack.Projection | None = None  # an expert projection of a QPACK container (``--layout qpack``)

    @property
    def label(self) -> str:
        if self.qpack is not None:
            return format_label(self.qpack.form, self.qpack.gs)
        if self.part is not None:
            return format_label(self.part.fmt, self.part.gs)
        return tensor_label(self.tensor) or self.tensor.dtype

    @property
    def ndim(self) -> int:
        """Logical dims (a quantized weight and a part are 2-D)."""
        if self.qpack is not None:
            return 2
        return len(self.tensor.shape) if self.tensor.kind == "float" and self.part is None else 2

    @property
    def shape(self) -> tuple[int, ...]:
        if self.qpack is not None:
            return (self.qpack.O, self.qpack.I)
        if self.part is not None:
            return (self.part.O, self.part.I)
        if self.tensor.kind == "quantized":
            return tuple(self.tensor.logical_shape or ())
        return tuple(self.tensor.shape)

    @property
    def nbytes(self) -> int:
        if self.qpack is not None:
            return self.qpack.data[1] - self.qpack.data[0] + self.qpack.scales[1] - self.qpack.scales[0]
        if self.part is not None:
            return self.part.data[1] - self.part.data[0] + 4 * (self.part.scales[1] - self.part.scales[0])
        return self.tensor.nbytes + self.tensor.scale_nbytes


class OutputWeights:
    """The weights of a converted folder by the name the converter gives them (``TensorJob.out_name``): a
    stored weight under any format's or target spelling's tensor names (the registry's ``tensor_names``), or a
    projection of a merged blob / fused stack (``names.expert_tensor_name`` of its ``parts``, as ``inspect``
    counts them)."""

    def __init__(self, model: ModelFiles):
        self.model = model
        self.resolved = resolve_container(model.shards, config=model.config, report_unresolved=True,
                                          merged_group_size=model.merged_group_size)  # fmt: skip
        self.files = {str(s.path): s for s in model.shards}
        self.num_hidden_layers = _num_hidden_layers(model.config)
        self.parts: dict[str, OutputWeight] = {}
        for t in self.resolved.values():
            p = names.parse_name(t.name) if t.parts else None
            for part in t.parts:
                expert = p.expert if part.expert is None else part.expert
                name = names.expert_tensor_name(p.expert_base, expert, part.projection)
                self.parts[name] = OutputWeight(name, t, part)
        try:
            for p in qpack.projections(model.path if model.path.is_dir() else model.path.parent):
                self.parts[qpack.weight_name(p)] = OutputWeight(qpack.weight_name(p), None, qpack=p)
        except FormatError as exc:
            raise VerifyError(f"QPACK container: {exc}") from None
        self._spellings = [*FORMATS.values(), *targets.SPELLINGS]

    def stored_names(self, name: str) -> list[str]:
        """The names a weight ``name`` may be stored under (every format's and spelling's weight name)."""
        return list(dict.fromkeys([name, *(s.tensor_names(name)[0] for s in self._spellings)]))

    def find(self, name: str) -> OutputWeight | None:
        """The weight the converter wrote as ``name`` (quantized or float), or None."""
        if name in self.parts:
            return self.parts[name]
        for stored in self.stored_names(name):
            t = self.resolved.get(stored)
            if t is not None and t.kind in ("quantized", "float"):
                return OutputWeight(name, t)
        return None

    def role(self, w: OutputWeight) -> str:
        return names.detail_role(w.name, w.ndim, num_hidden_layers=self.num_hidden_layers)

    def quality(self, w: OutputWeight, stats: ErrorStats) -> TensorQuality:
        return TensorQuality(w.name, self.role(w), names.parse_name(w.name).layer, w.label, stats)

    def decode(self, w: OutputWeight, rows: tuple[int, int] | None = None) -> np.ndarray:
        """The float32 values of ``w`` (rows ``[r0, r1)`` of a 2-D one: ``row_slabs`` says which may be cut)."""
        if w.qpack is not None:
            return w.qpack.decode()
        stored = self.stored(w, rows)
        if stored is not None:
            return _decode(*stored)
        t = w.tensor
        shard = self.files[t.file]
        if rows is None:
            return shard.read(t.name).astype(np.float32)
        row = shard.tensors[t.name].nbytes // t.shape[0]
        raw = shard.read_range(shard.tensors[t.name].begin + rows[0] * row, (rows[1] - rows[0]) * row)
        return raw.view(numpy_dtype(t.dtype)).astype(np.float32).reshape(rows[1] - rows[0], -1)

    def error(self, w: OutputWeight, source: np.ndarray, rows: tuple[int, int] | None = None) -> ErrorStats:
        """``tensor_error(source, self.decode(w, rows))``; a stored int8-row / int4 weight's codes decoded inside
        the sums kernel (``error_stats.encoded_error``: the same figures, no float32 copy of the decoded values)."""
        stored = self.stored(w, rows) if w.qpack is None else None
        fused = encoded_error(source, *stored) if stored is not None else None
        return fused if fused is not None else tensor_error(source, self.decode(w, rows))

    def stored(self, w: OutputWeight, rows: tuple[int, int] | None = None) -> tuple | None:
        """``(format name, codes, scales, O, I, gs)`` of a quantized ``w`` as stored (rows ``[r0, r1)`` of a 2-D
        one; codes in pairs order), which ``_decode`` decodes; None for a float tensor (or a qpack one)."""
        t, part = w.tensor, w.part
        shard = self.files[t.file]
        info = shard.tensors[t.name]
        if part is not None:
            codes = shard.read_range(info.begin + part.data[0], part.data[1] - part.data[0])
            if part.signed_nibbles:
                codes = codes ^ np.uint8(SIGNED_NIBBLE_XOR)
            sshard, sinfo = self._scale(t)
            scales = sshard.read_range(
                sinfo.begin + 4 * part.scales[0], 4 * (part.scales[1] - part.scales[0])
            )
            return part.fmt, codes.reshape(part.O, -1), scales.view(np.float32), part.O, part.I, part.gs
        if t.kind == "float":
            return None
        O, I = t.logical_shape
        fmt = by_name(t.format.name)
        gs = t.format.group_size
        sshard, sinfo = self._scale(t)
        r0, r1 = rows if rows is not None else (0, O)
        row = info.nbytes // O
        codes = shard.read_range(info.begin + r0 * row, (r1 - r0) * row).reshape(r1 - r0, -1)
        grid = fmt.scale_grid(O, I, gs)
        align = 1 if fmt.rowwise_scales else fmt.row_align  # rows per row of the scale grid
        g0, g1 = r0 // align, -(-r1 // align)
        srow = sinfo.nbytes // grid[0]
        scales = sshard.read_range(sinfo.begin + g0 * srow, (g1 - g0) * srow).view(fmt.scale_numpy)
        if t.layout == PLANAR_LAYOUT:
            codes = kernels.planar_to_pairs(codes)
        return fmt.name, codes, scales, r1 - r0, I, gs

    def _scale(self, t: ResolvedTensor):
        for shard in self.model.shards:  # a scale lives beside its weight, almost always in the same file
            if t.scale in shard.tensors:
                return shard, shard.tensors[t.scale]
        raise VerifyError(f"tensor {t.name}: its scale tensor {t.scale} is in no shard")  # pragma: no cover

    def row_slabs(self, w: OutputWeight) -> int:
        """Rows that may be decoded apart (1 for row-wise formats and floats, a block format's scale rows), or 0
        when the tensor is decoded whole (a part, a planar record, a 1-D float)."""
        t = w.tensor
        if w.qpack is not None or w.part is not None or t.layout == PLANAR_LAYOUT or w.ndim != 2:
            return 0
        if t.kind == "float":
            return 1
        fmt = by_name(t.format.name)
        return 1 if fmt.rowwise_scales else fmt.row_align if fmt.row_align > 1 else 0


def _decode(
    fmt_name: str, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None
) -> np.ndarray:
    """Float32 ``[O, I]`` of stored codes: the kernels where the format has them (bit-identical), else the
    registry's reference decoder."""
    fmt = by_name(fmt_name)
    if fmt.kernel_code is not None:
        return kernels.decode(fmt.name, codes, scales, O, I, gs)
    c = np.ascontiguousarray(codes).view(np.uint8).reshape(fmt.weight_shape(O, I, gs))
    s = np.ascontiguousarray(scales).view(fmt.scale_numpy).reshape(fmt.scale_grid(O, I, gs))
    return np.asarray(fmt.decode(c, s, O, I, gs), np.float32)


def _num_hidden_layers(config: Mapping[str, Any] | None) -> int | None:
    if not config:
        return None
    with contextlib.suppress(ConfigError):
        return model_config.num_hidden_layers(config)
    return None
