"""Loading weights: checkpoint name mapping, resident dense weights and stored-expert descriptions.

A model directory is either a converted container (U8 codes + ``.qs`` scales, mxfp4 pairs, float tensors; any
format the resolver knows, pairs or planar layout) or an unconverted checkpoint (F32/BF16/F16, or FP8 e4m3 with
``weight_scale_inv`` block scales). ``Checkpoint`` opens every shard once, resolves every tensor with
``resolve_container`` and maps checkpoint names onto the runtime's canonical names (``sanitize``). Dense weights
are read once at load and stay resident in kernel-ready form (``qtensor``: quantized codes as stored, float
sources and FP8 with non-128 blocks as float32); routed experts are described by ``Stored`` records (file, byte
ranges, format) that the ``ExpertStore`` reads on demand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from colitools.formats import model_config, qpack, source_encodings
from colitools.formats.container import resolve_container
from colitools.formats.dtypes import numpy_dtype
from colitools.formats.errors import ColitoolsError, FormatError, RuntimeModelError
from colitools.formats.inspect import open_model
from colitools.formats.names import canonical_name, expert_tensor_name, inkling_native_name, parse_name
from colitools.formats.planar import PLANAR_LAYOUT, planar_to_pairs
from colitools.formats.registry import UE8M0_FP8_FORMATS, Float, by_name, lookup
from colitools.formats.safetensors_io import SafetensorsFile, TensorInfo
from colitools.formats.source_encodings import (
    Fp8Block,
    Fp8Channel,
    Fp8Scheme,
    Mxfp4Blocks,
    Mxfp8,
    SourceEncoding,
)
from colitools.formats.targets import INKLING, SIGNED_NIBBLE_XOR, TARGETS
from colitools.runtime.kernels import QTensor

INKLING_TYPES = TARGETS[INKLING].model_types  # families whose text names are read by their native spelling

F32 = np.float32
FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")


def sanitize(name: str, model_type: str | None = None) -> str:
    """Canonical name of a checkpoint tensor (suffixes ``.qs``, ``_scale_inv``, ``weight_packed`` kept): the
    spellings of the tensor-name map (``formats/names.py``, mlx-lm's "sanitize") mapped onto the runtime's. An
    Inkling text name (``--target inkling``, colibri's ``convert_inkling_int4.py``) is read by its native spelling
    (``names.inkling_native_name``), which the runtime's Inkling uses."""
    if model_type in INKLING_TYPES:
        name = inkling_native_name(name)
    return canonical_name(name)


@dataclass(frozen=True)
class Stored:
    """Where and how one linear weight ``[O, I]`` is stored.

    ``form``: ``"float"`` (F32/BF16/F16 tensor), ``"<kind>-source"`` for a natively quantized source the runtime
    reads unconverted (``encoding``, one of ``RUNTIME_SOURCES``: ``fp8-source``, ``mxfp8-source``,
    ``fp8-channel-source``; recognised, decoded and sliced by that class), or a registry format name
    (``int4-grouped``, ``mxfp4``, ...). ``data``/``scale`` are absolute byte ranges in
    ``path``. ``row_offset`` selects rows of a fused ``[E, 2I, H]`` tensor (already folded into ``data``).
    ``pick`` ``(R, C, start, step, transposed)``: the bytes are one expert's whole slab ``[R, C]`` of a stack
    whose projections are interleaved or transposed; the weight is ``slab[start::step]`` (``transposed``:
    ``slab[:, start::step].T``, float only; with ``step`` 1 the ``O`` columns from ``start``: one half of a
    column-split ``gate_up [E, H, 2I]``)."""

    name: str
    form: str
    O: int
    I: int
    path: str
    data: tuple[int, int]
    dtype: str
    scale: tuple[int, int] | None = None
    scale_dtype: str | None = None
    gs: int | None = None
    planar: bool = False
    fp8_block: tuple[int, int] = (128, 128)
    pick: tuple[int, int, int, int, bool] | None = None
    signed_nibbles: bool = False  # int4 codes as signed nibbles (a qwen36 merged blob, formats/targets/)
    encoding: type[SourceEncoding] | None = None  # a source read unconverted (``form`` is ``source_form`` of it)

    @property
    def nbytes(self) -> int:
        return self.data[1] - self.data[0] + (self.scale[1] - self.scale[0] if self.scale else 0)

    @property
    def resident_nbytes(self) -> int:
        """Bytes this weight takes once read for a kernel (float sources become float32)."""
        if _decoded(self):
            return Float.weight_nbytes(self.O, self.I)
        if self.pick:  # the picked rows of a quantized stack slab (codes and scales alike)
            R, _, start, step, _ = self.pick
            return self.nbytes * len(range(start, R, step)) // R
        return self.nbytes


def _codes(st: Stored, data: bytes | memoryview) -> np.ndarray:
    """The stored codes as uint8; signed-nibble int4 (formats/targets/ ``MergedPart``) as pairs codes."""
    codes = np.frombuffer(data, dtype=np.uint8)
    return codes ^ np.uint8(SIGNED_NIBBLE_XOR) if st.signed_nibbles else codes


def decode_stored(st: Stored, data: bytes | memoryview, scale: bytes | memoryview | None) -> np.ndarray:
    """Float32 ``[O, I]`` of a stored weight from its bytes (the numpy reference decoders)."""
    if st.form == "float":
        w = np.frombuffer(data, dtype=numpy_dtype(st.dtype)).astype(F32)
        return _picked(w, st) if st.pick else w.reshape(st.O, st.I)
    if st.encoding is not None:  # a natively quantized source: its encoding class decodes it (numpy reference)
        q = np.frombuffer(data, dtype=np.uint8)
        s = np.frombuffer(scale, dtype=numpy_dtype(st.scale_dtype))
        if st.pick:  # rows of a stack slab (an MXFP8 stack, Inkling-2 as shipped): codes and scales alike
            q, s = _picked(q, st), _picked(s, st)
        parts = {"data": q.reshape(st.O, st.I), "scale": s}
        return st.encoding.decode(parts, st.O, st.I, block=st.fp8_block, fast=False)
    if st.pick:  # rows of a quantized stack slab
        codes = _picked(_codes(st, data), st)
        scale = _picked(np.frombuffer(scale, dtype=np.uint8), st).tobytes()
    else:
        codes = _codes(st, data).reshape(st.O, -1)
    if st.planar:
        codes = planar_to_pairs(codes)
    fmt = by_name(st.form)
    scales = np.frombuffer(scale, dtype=fmt.scale_numpy)
    try:
        return fmt.decode(codes, scales, st.O, st.I, st.gs)
    except ColitoolsError as exc:
        raise RuntimeModelError(f"tensor {st.name}: {exc}") from None


def _picked(slab: np.ndarray, st: Stored) -> np.ndarray:
    """``st``'s weight out of its expert's whole slab (``Stored.pick``), contiguous ``[O, I]``."""
    R, C, start, step, transposed = st.pick
    slab = slab.reshape(R, -1) if not transposed else slab.reshape(R, C)
    w = slab[:, start::step][:, : st.O].T if transposed else slab[start::step]
    return np.ascontiguousarray(w)


# The natively quantized sources the runtime reads unconverted (F8_E4M3 codes + a scale; docs/FORMATS.md §5), in the
# order recognition tries them; their classes recognise, check, decode and size them. Any other is converted first.
RUNTIME_SOURCES: tuple[type[SourceEncoding], ...] = (Fp8Block, Mxfp8, Fp8Channel)
# scale dtypes the runtime reads as one its encoding names (a float widened exactly; a signed byte as E8M0 bytes)
_SCALE_READ_AS = {"F16": "F32", "F64": "F32", "I8": "U8"}


def source_form(encoding: type[SourceEncoding]) -> str:
    """``Stored.form`` of a source read unconverted: ``fp8-source``, ``mxfp8-source``, ``fp8-channel-source``."""
    return f"{encoding.kind}-source"


@dataclass(frozen=True)
class _Header:
    """A header entry as an encoding class reads it (a scale's dtype read as ``_SCALE_READ_AS`` says)."""

    dtype: str
    shape: tuple[int, ...]


def _pair(encoding: type[SourceEncoding], name: str, info: TensorInfo, infos: dict, scheme=None):
    """``encoding.pair`` of weight ``name`` from its and its companions' header entries (``infos``: canonical name
    -> (path, entry, resolved)): the ``Paired`` weight, or None when the encoding does not claim it;
    RuntimeModelError (one line, the class's) for companions that do not fit."""
    data = encoding.parts[0]
    if info.dtype not in data.dtypes or not name.endswith(data.suffix):
        return None
    stem = name[: len(name) - len(data.suffix)]
    view = {name: info}
    for n in {name + Fp8Block.part("scale").suffix, *(stem + p.suffix for p in encoding.parts[1:])}:
        if n in infos:
            t = infos[n][1]
            view[n] = _Header(_SCALE_READ_AS.get(t.dtype, t.dtype), tuple(t.shape))
    try:
        return encoding.pair(name, view, scheme)
    except FormatError as exc:
        read_as = [f"{n} is stored as {infos[n][1].dtype}" for n in view
                   if n != name and view[n].dtype != infos[n][1].dtype]  # fmt: skip
        raise RuntimeModelError(f"{exc}{' (' + ', '.join(read_as) + ')' if read_as else ''}") from None


def _held(st: Stored) -> str | None:
    """The registry format whose kernel runs a source's bytes as they are (``native_form``: FP8 128x128 blocks
    are fp8-e4m3-b128's), or None when the source is decoded to float32 when read."""
    return st.encoding.native_form(st.O, st.I, block=st.fp8_block).fmt


def _source_encoding(name: str, tensors: dict[str, TensorInfo]) -> str | None:
    """The label of the natively quantized source encoding whose data tensor ``name`` is (``NVFP4``), for a
    refusal that names it; None when no encoding of the registry claims it."""
    for encoding in source_encodings.ENCODINGS.values():
        if not encoding.paired or not name.endswith(encoding.parts[0].suffix):
            continue
        try:
            if encoding.pair(name, tensors, None) is not None:
                return encoding.label
        except ColitoolsError:  # its companions do not fit: not this encoding's weight
            continue
    return None


def decoded_at_load(form: str) -> bool:
    """A registry format without a runtime kernel that the runtime still runs, decoded once to float32 when read:
    DeepSeek-V4.1's UE8M0 FP8 grids (fp8-e4m3-e8m0-t32 tiles, -r32 row groups; their values are exact floats) and
    the MLX-affine experts of a QPACK container (FORMATS §2.12)."""
    fmt = next((f for f in UE8M0_FP8_FORMATS if f.name == form), None) or lookup(form)
    return fmt is not None and fmt.matmul_kind is None and (fmt in UE8M0_FP8_FORMATS or not fmt.pairs)


def _decoded(st: Stored) -> bool:
    """Whether the kernels take ``st`` as float32 (decoded once when read): float sources, the sources no kernel
    format holds (``_held``: MXFP8, FP8 per channel, FP8 with other blocks than 128x128), the kernel-less formats
    ``decoded_at_load``."""
    return st.form == "float" or (st.encoding is not None and _held(st) is None) or decoded_at_load(st.form)


def qtensor(st: Stored, data: memoryview, scale: memoryview | None) -> QTensor:
    """The kernel-ready form of one stored projection (codes kept as stored; float sources as float32)."""
    if _decoded(st):
        return QTensor(Float.matmul_kind, decode_stored(st, data, scale), None, st.O, st.I, None)
    codes = _codes(st, data)
    if st.pick:  # rows of a quantized stack slab: codes and scales hold the same rows
        codes = _picked(codes, st)
        scale = memoryview(_picked(np.frombuffer(scale, dtype=np.uint8), st).reshape(-1))
    if st.encoding is not None:  # a source's bytes as the kernel of the format holding them (FP8 128x128 blocks)
        s = np.frombuffer(scale, dtype=numpy_dtype(st.scale_dtype)).astype(F32)
        return QTensor(by_name(_held(st)).matmul_kind, codes, s, st.O, st.I, None)
    fmt = by_name(st.form)
    kind = fmt.matmul_kind_of(st.planar)
    if kind is None:
        raise RuntimeModelError(f"tensor {st.name}: no runtime kernel for format {st.form}")
    scales = np.frombuffer(scale, dtype=fmt.scale_numpy)
    if hasattr(fmt, "kernel_scales"):  # E8M0 block scales (fp8-e4m3-e8m0): the fp8 kernel's float32, exact
        scales = fmt.kernel_scales(scales)
    return QTensor(kind, codes, scales, st.O, st.I, st.gs)


def _qpack_experts(folder: Path, family: str | None) -> dict[str, Stored]:
    """The routed experts of a QPACK v1 container in ``folder`` (``--layout qpack``, formats/qpack.py), by their
    canonical per-expert names: each projection's codes and its scalars (scales then biases, adjacent) in its
    layer file, decoded at load; none without a ``manifest.json``. RuntimeModelError for a container its engine
    would refuse."""
    try:
        found = qpack.projections(folder)
    except FormatError as exc:
        raise RuntimeModelError(f"QPACK container: {exc}") from None
    out = {}
    for p in found:
        name = sanitize(qpack.weight_name(p), family)
        out[name] = Stored(name, p.form, p.O, p.I, str(p.path), p.data, "U8", p.scales, p.scale_dtype, p.gs)
    return out


class Checkpoint:
    """Every tensor of a model directory, by canonical name, with positional reads."""

    def __init__(self, model_dir: str | Path, config: dict):
        self.dir = Path(model_dir)
        self.files, merged_gs = _open_shards(self.dir)
        self.fp8_block = _fp8_block(config)
        try:
            # config.json gives [O, I] by role to a foreign container's weights without colitools.shapes
            # (colibri's converter writes none); a weight that neither gives is refused, named (§3).
            resolved = resolve_container(self.files, config=config or None, merged_group_size=merged_gs)
        except ColitoolsError as exc:
            raise RuntimeModelError(f"{self.dir}: {exc}") from None
        self.infos = {}  # canonical name -> (path, TensorInfo, ResolvedTensor)
        family = self.family = model_config.model_type(config) if config else None
        for f in self.files:
            for name, info in f.tensors.items():
                self.infos[sanitize(name, family)] = (str(f.path), info, resolved[name])
        # a merged expert blob (formats/targets/) is read as its gate / up / down projections, by their names
        self.merged: dict[str, Stored] = {}
        for f in self.files:
            for name, info in f.tensors.items():
                res = resolved[name]
                if not res.parts:
                    continue
                parsed = parse_name(name)
                sinfo = f.tensors.get(res.scale) or self.infos[sanitize(res.scale, family)][1]
                for part in res.parts:  # a merged blob's own expert, or each expert of a fused stack
                    expert = parsed.expert if part.expert is None else part.expert
                    vname = sanitize(expert_tensor_name(parsed.expert_base, expert, part.projection), family)
                    self.merged[vname] = Stored(
                        vname, part.fmt, part.O, part.I, str(f.path),
                        (info.begin + part.data[0], info.begin + part.data[1]), info.dtype,
                        (sinfo.begin + 4 * part.scales[0], sinfo.begin + 4 * part.scales[1]), sinfo.dtype,
                        part.gs, signed_nibbles=part.signed_nibbles,
                    )  # fmt: skip
        self.merged.update(_qpack_experts(self.dir, family))
        self._fds: dict[str, int] = {}
        self.bytes_read = 0

    # ---------------------------------------------------------------------------------------------- lookup
    def has(self, name: str) -> bool:
        return name in self.infos or _base(name) + ".weight_packed" in self.infos or name in self.merged

    def stored(self, name: str, O: int, I: int) -> Stored:
        """Describe linear weight ``name`` (canonical, ending in ``.weight``), expected ``[O, I]``."""
        packed = _base(name) + ".weight_packed"
        if name not in self.infos and packed in self.infos:
            name = packed
        if name not in self.infos and name in self.merged:  # a part of a merged expert blob
            st = self.merged[name]
            if (st.O, st.I) != (O, I):
                raise RuntimeModelError(f"tensor {name} is [{st.O}, {st.I}], the model expects [{O}, {I}]")
            return st
        if name not in self.infos:
            raise RuntimeModelError(f"{self.dir}: missing tensor {name}")
        path, info, res = self.infos[name]
        if res.kind == "quantized":
            if tuple(res.logical_shape) != (O, I):
                raise RuntimeModelError(
                    f"tensor {name} is {list(res.logical_shape)}, the model expects [{O}, {I}]"
                )
            _, sinfo, _ = self.infos[sanitize(res.scale, self.family)]
            if by_name(res.format.name).matmul_kind is None and not decoded_at_load(res.format.name):
                raise RuntimeModelError(f"tensor {name}: {res.format.name} is not executable by the runtime")
            return Stored(
                name, res.format.name, O, I, path, (info.begin, info.end), info.dtype,
                (sinfo.begin, sinfo.end), sinfo.dtype, res.format.group_size, res.layout == PLANAR_LAYOUT,
            )  # fmt: skip
        for encoding in RUNTIME_SOURCES:  # a source read unconverted: its class recognises and checks it
            paired = _pair(encoding, name, info, self.infos, Fp8Scheme(self.fp8_block))  # (FP8 blocks: config's)
            if paired is None:
                continue
            _check_shape(name, info.shape, O, I)
            _, sinfo, _ = self.infos[dict(paired.parts)["scale"]]
            return Stored(
                name, source_form(encoding), O, I, path, (info.begin, info.end), info.dtype,
                (sinfo.begin, sinfo.end), sinfo.dtype, fp8_block=self.fp8_block, encoding=encoding,
            )  # fmt: skip
        if info.dtype in FLOAT_DTYPES:
            _check_shape(name, info.shape, O, I)
            return Stored(name, "float", O, I, path, (info.begin, info.end), info.dtype)
        encoding = _source_encoding(name, {n: i for n, (_, i, _) in self.infos.items()})
        if encoding is not None:
            raise RuntimeModelError(
                f"tensor {name}: an {encoding} source weight ({info.dtype} {list(info.shape)}), which the runtime "
                f"does not read; convert the model first (colitools convert decodes {encoding})"
            )
        raise RuntimeModelError(
            f"tensor {name}: {info.dtype} {list(info.shape)} is not a weight the runtime reads"
        )

    def fused_expert(self, name: str, expert: int, n_experts: int, rows: slice, O: int, I: int) -> Stored:
        """Rows ``rows`` of expert ``expert`` of a fused float tensor ``[E, R, I]`` (gate_up_proj / down_proj)."""
        path, info, _ = self.infos[name]
        if info.dtype not in FLOAT_DTYPES or len(info.shape) != 3 or info.shape[0] != n_experts:
            raise RuntimeModelError(
                f"fused expert tensor {name} is {info.dtype} {list(info.shape)}, "
                f"expected a float [{n_experts}, R, {I}]"
            )
        E, R, C = info.shape
        if C != I or rows.stop > R or rows.stop - rows.start != O:
            raise RuntimeModelError(
                f"fused expert tensor {name} is {list(info.shape)}; cannot take [{O}, {I}]"
            )
        isz = numpy_dtype(info.dtype).itemsize
        begin = info.begin + (expert * R + rows.start) * C * isz
        return Stored(f"{name}[{expert}]", "float", O, I, path, (begin, begin + O * I * isz), info.dtype)

    def stack_expert(self, name: str, expert: int, n_experts: int, pick: tuple[int, int, bool],
                     O: int, I: int) -> Stored:  # fmt: skip
        """Expert ``expert``'s ``[O, I]`` of a float stack ``[E, R, C]`` whose projections are interleaved or
        transposed: ``pick = (start, step, transposed)`` (rows ``start::step`` of the expert's slab, or those
        columns, transposed; ``step`` 1 and transposed: the ``O`` columns from ``start``, a column half). The whole
        slab is read (one range, shared by the projections it holds)."""
        path, info, _ = self._info(name)
        start, step, transposed = pick
        mx = None if transposed else _pair(Mxfp8, name, info, self.infos)  # an MXFP8 stack, its scales checked
        readable = info.dtype in FLOAT_DTYPES or mx is not None
        if not readable or len(info.shape) != 3 or info.shape[0] != n_experts:
            raise RuntimeModelError(
                f"expert stack {name} is {info.dtype} {list(info.shape)}, expected a float [{n_experts}, R, C]"
            )
        E, R, C = info.shape
        # a column half (step 1), or every picked column
        cols = O if step == 1 and start + O <= C else len(range(start, C, step))
        got = (cols, R) if transposed else (len(range(start, R, step)), C)
        if got != (O, I):
            raise RuntimeModelError(f"expert stack {name} is {list(info.shape)}; cannot take [{O}, {I}]")
        n = R * C * numpy_dtype(info.dtype).itemsize
        begin = info.begin + expert * n
        if mx is not None:  # codes + E8M0 scales, one expert's slab of each sized by the encoding's parts
            sname = dict(mx.parts)["scale"]
            spath, sinfo, _ = self.infos[sname]
            ns = Mxfp8.part("scale").nbytes(sinfo.dtype, R, C)
            if spath != path:
                raise RuntimeModelError(f"MXFP8 expert stack {name} and its scales {sname} are in different shards")
            return Stored(f"{name}[{expert}]", source_form(Mxfp8), O, I, path, (begin, begin + n), info.dtype,
                          (sinfo.begin + expert * ns, sinfo.begin + (expert + 1) * ns), sinfo.dtype,
                          pick=(R, C, start, step, False), encoding=Mxfp8)  # fmt: skip
        return Stored(f"{name}[{expert}]", "float", O, I, path, (begin, begin + n), info.dtype,
                      pick=(R, C, start, step, transposed))  # fmt: skip

    def mxfp4_stack_expert(self, blocks: str, scales: str, expert: int, n_experts: int, pick: tuple[int, int],
                           O: int, I: int) -> Stored:  # fmt: skip
        """Expert ``expert``'s ``[O, I]`` of a native MXFP4 stack (``names.MXFP4_STACK_SUFFIXES``: blocks U8
        ``[E, R, I/32, 16]`` + E8M0 scales ``[E, R, I/32]``): rows ``start::step`` (``pick``) of its slab, kept
        as mxfp4 codes. The expert's whole slab is read (one range per tensor, shared by gate and up)."""
        start, step = pick
        (path, binfo, _), (spath, sinfo, _) = self._info(blocks), self._info(scales)
        data, scale = Mxfp4Blocks.parts
        # the encoding recognises the pair and checks the scales against the blocks (its FormatError names them)
        paired = Mxfp4Blocks.pair(blocks, {blocks: binfo, scales: sinfo}, None)
        E, R, cols = paired.shape if paired is not None and len(paired.shape) == 3 else (None, -1, None)
        if (E, cols) != (n_experts, I) or len(range(start, R, step)) != O:
            raise RuntimeModelError(
                f"MXFP4 expert stack {blocks} is {binfo.dtype} {list(binfo.shape)} with scales {sinfo.dtype} "
                f"{list(sinfo.shape)}; cannot take [{O}, {I}] (expected U8 {data.prose(('E',))} + U8 "
                f"{scale.prose(('E',))} with E = {n_experts}, I = {I})"
            )
        nb, ns = data.nbytes(binfo.dtype, R, I), scale.nbytes(sinfo.dtype, R, I)  # one expert's slab of each
        b0, s0 = binfo.begin + expert * nb, sinfo.begin + expert * ns
        if spath != path:  # an expert's ranges are read per file; keep the record simple
            raise RuntimeModelError(
                f"MXFP4 expert stack {blocks} and its scales {scales} are in different shards"
            )
        fmt = Mxfp4Blocks.native_form(O, I).fmt  # its codes and scales are mxfp4's, kept
        return Stored(f"{blocks}[{expert}]", fmt, O, I, path, (b0, b0 + nb), "U8", (s0, s0 + ns), "U8",
                      pick=(R, nb // R, start, step, False))  # fmt: skip

    def _info(self, name: str):
        if name not in self.infos:
            raise RuntimeModelError(f"{self.dir}: missing tensor {name}")
        return self.infos[name]

    def stack_bias(self, name: str, expert: int, n_experts: int, start: int, step: int, n: int) -> Stored:
        """Expert ``expert``'s bias (entries ``start::step`` of row ``expert``) of a float stack bias ``[E, R]``,
        as a ``[n, 1]`` float ``Stored`` (the whole row is read)."""
        path, info, _ = self.infos[name]
        if info.dtype not in FLOAT_DTYPES or len(info.shape) != 2 or info.shape[0] != n_experts or \
                len(range(start, info.shape[1], step)) != n:  # fmt: skip
            raise RuntimeModelError(
                f"expert stack bias {name} is {info.dtype} {list(info.shape)}; cannot take {n} entries per expert"
            )
        R = info.shape[1]
        size = R * numpy_dtype(info.dtype).itemsize
        begin = info.begin + expert * size
        return Stored(f"{name}[{expert}]", "float", n, 1, path, (begin, begin + size), info.dtype,
                      pick=(R, 1, start, step, False))  # fmt: skip

    def vector_stored(self, name: str, n: int) -> Stored:
        """A 1-D float tensor ``[n]`` as a ``[n, 1]`` float ``Stored`` (an expert's bias, read with it)."""
        if name not in self.infos:
            raise RuntimeModelError(f"{self.dir}: missing tensor {name}")
        path, info, _ = self.infos[name]
        if info.dtype not in FLOAT_DTYPES or info.shape != (n,):
            raise RuntimeModelError(
                f"tensor {name} is {info.dtype} {list(info.shape)}, expected a float [{n}]"
            )
        return Stored(name, "float", n, 1, path, (info.begin, info.end), info.dtype)

    # ---------------------------------------------------------------------------------------------- reads
    def pread(self, path: str, begin: int, end: int) -> bytes:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        n = end - begin
        data = os.pread(fd, n, begin)
        while len(data) < n:  # short reads are legal; EOF is not
            more = os.pread(fd, n - len(data), begin + len(data))
            if not more:
                raise RuntimeModelError(f"{path}: unexpected end of file at byte {begin + len(data)}")
            data += more
        self.bytes_read += n
        return data

    def read_stored(self, st: Stored) -> tuple[bytes, bytes | None]:
        data = self.pread(st.path, *st.data)
        return data, (self.pread(st.path, *st.scale) if st.scale else None)

    def dense(self, name: str, O: int, I: int) -> np.ndarray:
        """Float32 ``[O, I]`` of a weight, decoded."""
        st = self.stored(name, O, I)
        return decode_stored(st, *self.read_stored(st))

    def resident(self, name: str, O: int, I: int) -> QTensor:
        """A dense (resident) linear weight in kernel-ready form: codes kept as stored, float as float32."""
        st = self.stored(name, O, I)
        data, scale = self.read_stored(st)
        return qtensor(st, memoryview(data), memoryview(scale) if scale is not None else None)

    def vector(self, name: str, n: int) -> np.ndarray:
        """Float32 ``[n]`` of a 1-D tensor (norm weights, biases, correction biases)."""
        return self.array(name, (n,))

    def array(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Float32 of a float tensor stored with exactly ``shape`` (vectors, conv1d kernels ``[C, 1, K]``)."""
        if name not in self.infos:
            raise RuntimeModelError(f"{self.dir}: missing tensor {name}")
        path, info, _ = self.infos[name]
        if info.dtype not in FLOAT_DTYPES or tuple(info.shape) != tuple(shape):
            raise RuntimeModelError(
                f"tensor {name} is {info.dtype} {list(info.shape)}, expected a float {list(shape)}"
            )
        raw = self.pread(path, info.begin, info.end)
        return np.frombuffer(raw, dtype=numpy_dtype(info.dtype)).astype(F32).reshape(shape)

    def int_array(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Int64 of an integer tensor (I64 / I32 / I16 / I8 / U8) stored with exactly ``shape``: a table the
        converter copies unchanged (DeepSeek-V4's hash-routing ``ffn.gate.tid2eid``)."""
        if name not in self.infos:
            raise RuntimeModelError(f"{self.dir}: missing tensor {name}")
        path, info, _ = self.infos[name]
        if info.dtype not in ("I64", "I32", "I16", "I8", "U8") or tuple(info.shape) != tuple(shape):
            raise RuntimeModelError(
                f"tensor {name} is {info.dtype} {list(info.shape)}, expected an integer {list(shape)}"
            )
        raw = self.pread(path, info.begin, info.end)
        return np.frombuffer(raw, dtype=numpy_dtype(info.dtype)).astype(np.int64).reshape(shape)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for f in self.files:
            f.close()


def _open_shards(model_dir: Path) -> tuple[list[SafetensorsFile], int | None]:
    """The model folder's shards, headers validated, as ``colitools inspect`` finds them (``open_model``: the
    index's shards, names checked by ``check_shard_name`` and coverage both ways, or every ``*.safetensors``),
    and the ``expert_gs`` of a target's metadata file (formats/targets/ ``merged_group_size``)."""
    model = open_model(model_dir)
    return model.shards, model.merged_group_size


def _base(name: str) -> str:
    return name[: -len(".weight")] if name.endswith(".weight") else name


def _check_shape(name: str, shape: tuple[int, ...], O: int, I: int) -> None:
    if tuple(shape) != (O, I):
        raise RuntimeModelError(f"tensor {name} is {list(shape)}, the model expects [{O}, {I}]")


def _fp8_block(config: dict) -> tuple[int, int]:
    return model_config.fp8_block_size(config) or (128, 128)
