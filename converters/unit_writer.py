"""Executes one planned unit: read -> dequantize -> encode -> hash + write, tensors overlapping.

Pipeline: ``encoder_threads()`` threads (one per core) each read and encode whole tensors (pread, numba and
numpy all release the GIL; no per-tensor fork-join), up to ``ENCODE_AHEAD_BYTES`` of source ahead; the
calling thread hands the results in order to a sink thread per output file, which writes and hashes them
(``FileSink``, at most ``QUEUE_BYTES`` queued) and starts their writeback early. Memory is therefore bounded
by constants plus the largest single source tensor (one fused-expert slab for fused tensors) and its encoded
form, not by the model's size. An expert's scale tensors wait for its codes (docs/FORMATS.md §4); they are
small.

Encoding goes straight from the source bits whenever the kernels can (``kernels.encode_from_bf16`` /
``encode_from_f16`` / ``encode_from_fp8_block``, fused expert slabs included): no float32 copy of a tensor is
made on that path.

Every output file goes through ``SafetensorsWriter`` (temporary name, fsync, atomic rename). The file's sha256 is
computed from the very bytes handed to the writer, so the ledger never has to re-read what was written.

Test-only knobs (environment variables; never set them in production):
``COLITOOLS_TEST_SLOW_TENSOR_SECONDS`` sleeps after every tensor written, so a test can SIGKILL the process
mid-unit; ``COLITOOLS_TEST_KILL_AT=published:N`` SIGKILLs the process right after it published its N-th file
and before the ledger records it (the narrowest window of a crash).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import math
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from colitools.converters import reuse
from colitools.converters.dequant import expected_scale_shape, is_fp8, to_float32
from colitools.converters.planner import OutputFile, OutputGroup, TensorJob, Unit
from colitools.formats import kernels, planar_sidecar, qpack
from colitools.formats import reference as ref
from colitools.formats.dtypes import numpy_dtype
from colitools.formats.error_stats import ErrorStats, encoded_error, from_rows, tensor_error
from colitools.formats.errors import ConvertError, EncodeError, SafetensorsError
from colitools.formats.expert_layouts import SIGNED_NIBBLE_XOR, Stack
from colitools.formats.quantizers import RTN
from colitools.formats.reference import E4M3_TO_F32, encode_bf16
from colitools.formats.registry import Fp8E4m3E8m0
from colitools.formats.registry import _check_finite as check_finite  # the encoders' own message
from colitools.formats.safetensors_io import SafetensorsFile, SafetensorsWriter
from colitools.formats.source_encodings import FP8_BLOCK

BF16 = numpy_dtype("BF16")
SLOW_TENSOR_ENV = "COLITOOLS_TEST_SLOW_TENSOR_SECONDS"
KILL_AT_ENV = "COLITOOLS_TEST_KILL_AT"
_published = 0  # files published by this process (for KILL_AT "published:N")


@dataclass(frozen=True)
class FileRecord:
    """A published output file, as the ledger and the manifest record it."""

    name: str
    size: int
    sha256: str


@dataclass
class UnitResult:
    key: str
    files: list[FileRecord] = field(default_factory=list)
    in_bytes: int = 0
    # what each written tensor lost against its source values (formats/error_stats.py), by output name
    errors: dict[str, ErrorStats] = field(default_factory=dict)
    copied: int = 0  # tensors copied from a previous output's file (``convert --replace``, converters/reuse.py)


_KNOWN_HEADERS: dict[Path, SafetensorsFile] = {}  # closed readers of recent units' shards (their headers)
_KNOWN_MAX = 8


class ShardReader:
    """Open source shards of one unit; reads whole tensors or one expert slab of a fused tensor.

    A shard's header is parsed and validated once per process, not once per unit that reads it (a one-file
    checkpoint of 1,300 tensors took 0.08 CPU-s per unit): a reader reuses the header of the last reader of
    the same path while the file is unchanged (``SafetensorsFile(known=...)``: same inode, size, mtime). No
    descriptor outlives its unit (a released shard's space is freed at once)."""

    def __init__(self, paths: Mapping[str, Path], direct: bool = False):
        self._paths = dict(paths)
        self._direct = direct  # ``SafetensorsFile(direct=...)``: large uncached ranges read around the page cache
        self._open: dict[str, SafetensorsFile] = {}
        self._lock = threading.Lock()  # encoder threads share the reader

    def _file(self, shard: str) -> SafetensorsFile:
        f = self._open.get(shard)
        if f is None:
            with self._lock:
                if shard not in self._open:
                    path = Path(self._paths[shard])
                    known = _KNOWN_HEADERS.get(path)
                    self._open[shard] = SafetensorsFile(path, known=known, direct=self._direct)
                f = self._open[shard]
        return f

    def _info(self, shard: str, name: str, dtype: str, shape: tuple[int, ...]):
        f = self._file(shard)
        info = f.tensors.get(name)
        if info is None:
            raise ConvertError(f"tensor {name}: not in shard {shard} any more ({f.path})")
        if info.dtype != dtype or tuple(info.shape) != tuple(shape):
            raise ConvertError(
                f"tensor {name}: shard {shard} now has {info.dtype} {list(info.shape)}, planned {dtype} {list(shape)}"
            )
        return f, info

    def read(self, shard: str, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        f, _ = self._info(shard, name, dtype, shape)
        return f.read(name)

    def read_slab_rows(self, part, e: int, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of slab ``e`` of ``part`` ``[E, rows, ...]`` (a source tensor or a companion: anything
        with ``shard``, ``name``, ``dtype``, ``shape``), in one positional read."""
        return self._rows(part, part.shape[1] * e + r0, part.shape[1] * e + r1, part.shape[2:])

    def read_rows(self, part, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of ``part`` ``[rows, ...]`` (a row slab of a big tensor), in one positional read."""
        return self._rows(part, r0, r1, part.shape[1:])

    def _rows(self, part, r0: int, r1: int, rest: tuple[int, ...]) -> np.ndarray:
        f, info = self._info(part.shard, part.name, part.dtype, part.shape)
        dt = numpy_dtype(part.dtype)
        row_bytes = math.prod(rest) * dt.itemsize
        try:  # one positional read on the shard's open descriptor
            buf = f.read_range(info.begin + r0 * row_bytes, (r1 - r0) * row_bytes)
        except SafetensorsError as exc:  # the file shrank behind the reader: name the tensor too
            raise ConvertError(f"tensor {part.name}: {exc}") from None
        return buf.view(dt).reshape(r1 - r0, *rest)  # safetensors data is little-endian

    def close(self) -> None:
        for f in self._open.values():
            f.close()
            _KNOWN_HEADERS.pop(f.path, None)
            _KNOWN_HEADERS[f.path] = f
            while len(_KNOWN_HEADERS) > _KNOWN_MAX:
                del _KNOWN_HEADERS[next(iter(_KNOWN_HEADERS))]
        self._open.clear()


def _source_values(
    job: TensorJob, reader: ShardReader, block: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The job's source values (exact dtype, 2-D ``[O, I]`` or the 0/1-D shape) and its FP8 scale grid rows
    (``block``: the source's FP8 block; a slice of an FP8 stack that is not a row range comes decoded, float32)."""
    src = job.source
    scale = None
    if src.quant is not None:  # natively quantized: every companion, cut to the job's rows
        parts = {}
        sl = job.fused_pick
        for role, part in src.quant.parts:
            if role == "scale_2" or (job.fused_rows is None and sl is None):
                parts[role] = reader.read(part.shard, part.name, part.dtype, part.shape)
            elif sl is not None and sl.step == 1:  # rows [row0, row1) of the expert's slab: only those are read
                parts[role] = reader.read_slab_rows(part, sl.expert, sl.row0, sl.row1)
            elif sl is not None:  # rows row0::step of the expert's slab (gpt-oss MXFP4: gate / up interleaved)
                slab = reader.read_slab_rows(part, sl.expert, 0, part.shape[1])
                parts[role] = np.ascontiguousarray(slab[sl.row0 : sl.row1 : sl.step])
            else:
                parts[role] = reader.read_slab_rows(part, *job.fused_rows)
        return parts, None
    if job.fused_pick is not None:  # an interleaved / transposed stack slice or a stack-bias slice
        sl = job.fused_pick
        if len(src.shape) == 3 and sl.contiguous and src.scale is None:  # rows of a float stack: only those
            return reader.read_slab_rows(src, sl.expert, sl.row0, sl.row1), None
        if len(src.shape) == 3:
            slab = reader.read_slab_rows(src, sl.expert, 0, src.shape[1])
        else:
            slab = reader.read(src.shard, src.name, src.dtype, src.shape)[sl.expert]
        if src.scale is not None:  # FP8 blocks span the slab's rows and columns: decode it whole, exactly
            grid = reader.read_slab_rows(src.scale, sl.expert, 0, src.scale.shape[1])
            slab = FP8_BLOCK.decode({"data": slab, "scale": grid}, *slab.shape, block=block, fast=True)
        return sl.pick(slab), None
    if job.fused_rows is None:
        values = reader.read(src.shard, src.name, src.dtype, src.shape)
        if src.scale is not None:
            scale = reader.read(src.scale.shard, src.scale.name, src.scale.dtype, src.scale.shape)
        return values, scale
    e, r0, r1 = job.fused_rows
    values = reader.read_slab_rows(src, e, r0, r1)
    if src.scale is not None:
        scale = reader.read(src.scale.shard, src.scale.name, src.scale.dtype, src.scale.shape)[e]
    return values, scale


def _dequant(
    job: TensorJob, values: np.ndarray, scale: np.ndarray | None, block: tuple[int, int] | None
) -> np.ndarray:
    """The job's source values as float32, exactly: an FP8 tensor (or a slab starting on a scale-block boundary)
    whose scale grid fits dequantised by the kernel (the bits of numpy's; numpy's LUT indexing and repeat cost
    ~3 CPU-s a GB), anything else by ``to_float32`` (which also names a malformed source)."""
    if scale is None:
        return to_float32(job.out_name, values)
    grid = _fp8_grid(job, scale, block)
    fits = values.ndim == 2 and block is not None and grid is not None and is_fp8(values, scale)
    if fits and tuple(np.shape(grid)) == expected_scale_shape(values.shape, block):
        return kernels.dequant_fp8_block(values, grid, block, name=job.out_name)
    if job.fused_rows is not None:
        # A slab of rows [r0, r1) of an FP8 fused tensor: row r uses scale row r // br (the slab's own grid).
        _, r0, r1 = job.fused_rows
        br, bc = block
        rows = np.asarray(scale).astype(np.float32)[np.arange(r0, r1) // br]
        q = E4M3_TO_F32[np.ascontiguousarray(values).view(np.uint8)]  # exact e4m3fn decode
        return q * np.repeat(rows, bc, axis=1)[:, : q.shape[1]]
    return to_float32(job.out_name, values, scale=scale, block=block)


def _fp8_e8m0_passthrough(
    job: TensorJob, values: np.ndarray, scale: np.ndarray | None, block: tuple[int, int] | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """fp8-e4m3-e8m0 from an FP8 source without re-encoding: a whole (not fused) tensor with 128x128 blocks whose
    every ``weight_scale_inv`` is an exact power of two ``2^k`` (``-127 <= k <= 127``) keeps its e4m3 bytes and
    gets the E8M0 bytes ``k + 127`` (the same values, docs/FORMATS.md §2.9). None otherwise (re-encoded from the
    dequantized values)."""
    if scale is None or block != (128, 128) or job.fused_rows is not None or job.fused_pick is not None:
        return None
    if np.dtype(values.dtype).itemsize != 1 or values.ndim != 2:
        return None
    s = np.asarray(scale).astype(np.float64)  # F32 / BF16 scales widen exactly
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        return None
    m, e = np.frexp(s)
    k = e.astype(np.int64) - 1
    if not (np.all(m == 0.5) and np.all((k >= -127) & (k <= 127))) or _has_nan_codes(values):
        return None  # (a NaN code: re-encoded, which refuses it as every encoder does)
    return np.ascontiguousarray(values).view(np.uint8), (k + 127).astype(np.uint8)


def _check_float_finite(job: TensorJob, w: np.ndarray) -> None:
    """A float tensor written (``f32`` / ``bf16``, or a float kept as the source stored it; rule 2's routers, norms
    and biases too) holds no NaN / inf: EncodeError naming the first bad index and the count, the message of the
    quantized recipes' encoders (``[o, i]`` of a 2-D tensor, the index in its own shape otherwise)."""
    if np.isfinite(w).all():
        return
    w = np.asarray(w, np.float32).reshape(job.shape)
    if w.ndim == 2:
        check_finite(w, job.out_name)
    bad = ~np.isfinite(w)
    at = np.unravel_index(int(np.flatnonzero(bad)[0]), w.shape)
    raise EncodeError(
        f"tensor {job.out_name}: non-finite value {w[at]} at [{', '.join(str(int(k)) for k in at)}] "
        f"({int(bad.sum())} non-finite in total)"
    )


_CHECKED_SOURCE_DTYPES = ("F32", "BF16", "F16", "F64")  # float tensors kept as stored: checked as written


def _check_fp8_finite(name: str, codes: np.ndarray, scales: np.ndarray, block) -> None:
    """fp8 passthrough: the values a reader decodes, ``e4m3(q) * s``, must be finite, as a quantized recipe
    requires of its input. Cheap on the scale grid and the code bytes (``|e4m3| <= 448``); only when that check
    fails are the values decoded, to name the first bad ``[o, i]`` as the encoders do."""
    s = np.abs(scales, dtype=np.float64)
    if np.isfinite(s).all() and s.max(initial=0.0) * ref.E4M3_MAX <= _F32_MAX and not _has_nan_codes(codes):
        return
    w = FP8_BLOCK.decode({"data": codes, "scale": scales}, *codes.shape, block=block, fast=True)
    check_finite(w, name)


_F32_MAX = float(np.finfo(np.float32).max)
_NAN_CHUNK = 1 << 20  # bytes checked per step: no tensor-sized temporary


def _has_nan_codes(values: np.ndarray) -> bool:
    """Whether e4m3fn bytes ``values`` hold a NaN (``0x7F`` / ``0xFF``: e4m3fn has no inf)."""
    flat = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
    buf = np.empty(min(flat.size, _NAN_CHUNK), np.uint8)
    for k in range(0, flat.size, _NAN_CHUNK):
        part = buf[: min(_NAN_CHUNK, flat.size - k)]
        np.bitwise_or(flat[k : k + part.size], 0x80, out=part)
        if (part == 0xFF).any():
            return True
    return False


def _fp8_grid(job: TensorJob, scale: np.ndarray, block: tuple[int, int] | None) -> np.ndarray | None:
    """The scale grid of the rows ``job`` encodes, when the fused FP8 kernel can take them: the whole tensor's,
    or, for rows ``[r0, r1)`` of a fused expert slab starting on a scale-block boundary, that slab's grid rows
    (row ``r`` uses grid row ``r // br`` either way). None otherwise (the slab's own float32 dequant)."""
    if job.fused_rows is None:
        return scale
    _, r0, r1 = job.fused_rows
    if block is None or r0 % block[0]:
        return None
    return np.asarray(scale)[r0 // block[0] : -(-r1 // block[0])]


def stack_codes(stack: Stack, parts: list[np.ndarray]) -> np.ndarray:
    """A target's stacked tensor (formats/expert_layouts.py ``Stack``: a merged expert blob, a fused stack) from
    its members' weights, back to back in member order: one-byte codes as U8 (int8-row codes keep their two's
    complement bytes; the sink stores them under the stack's dtype), int4 pairs bytes XOR ``SIGNED_NIBBLE_XOR``
    where the loader reads signed nibbles (``pack_int4``; not the ``plain_members``, a mixed slab's int8-row
    down), float weights in their stored dtype."""
    if stack.signed_nibbles:
        xor = np.uint8(SIGNED_NIBBLE_XOR)
        return np.concatenate([
            np.asarray(p).reshape(-1).view(np.uint8) ^ (np.uint8(0) if k in stack.plain_members else xor)
            for k, p in zip(stack.members, parts, strict=True)
        ])  # fmt: skip
    flat = np.concatenate([np.asarray(p).reshape(-1) for p in parts])
    return flat.view(np.uint8) if flat.dtype == np.int8 else flat


def _put_stack(sink: FileSink, st: Stack, members: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
    """A target's stacked tensor: its members' codes back to back, then their scales; the members are dropped,
    so a layer holds at most one stack's codes (a target puts the jobs of its first stack first). A QPACK layer
    file's stack is its expert records (``qpack.layer_bytes``)."""
    if st.kind == "qpack":
        sink.put(st.name, qpack.layer_bytes([members[k] for k in st.members], st.shape[0]))
        for k in st.members:
            del members[k]
        return
    sink.put(st.name, stack_codes(st, [members[k][0] for k in st.members]))
    if st.scale is not None:
        scales = [np.asarray(members[k][1], np.float32).reshape(-1) for k in st.members]
        sink.put(st.scale, np.concatenate(scales))
    for k in st.members:
        del members[k]


def encode_job(
    job: TensorJob,
    values: np.ndarray,
    scale: np.ndarray | None,
    block: tuple[int, int] | None,
    planar: bool,
    measured: list[ErrorStats] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(weight array, scale array or None)`` exactly as written for ``job``, from its source values. Given a
    ``measured`` list, an encoder that takes the written tensor's error figures as it writes (a whole BF16 tensor,
    or an FP8 one with its scale grid, to int8-row / int4: ``kernels.encode_from_bf16_measured`` /
    ``encode_from_fp8_measured``) appends them (``job_error``'s figures)."""
    t = job.target
    if t.is_source:  # rules 0 and 1: the source tensor unchanged (its dtype, its bytes)
        if job.source.dtype in _CHECKED_SOURCE_DTYPES:  # a float kept as stored holds no NaN / inf either
            _check_float_finite(job, values)
        return np.ascontiguousarray(values), None
    if job.source.quant is not None:
        codes, scales = _encode_native(job, values)
        return (kernels.pairs_to_planar(codes) if planar and scales is not None else codes), scales
    if t.is_passthrough:  # fp8-e4m3-b128: bytes unchanged, .qs = weight_scale_inv as F32
        codes, qs = np.ascontiguousarray(values).view(np.uint8), np.asarray(scale).astype(np.float32)
        _check_fp8_finite(job.out_name, codes, qs, block)
        return codes, qs
    if t.is_float:
        w = _dequant(job, values, scale, block).reshape(job.shape)
        w = encode_bf16(w) if t.is_bf16 else w
        _check_float_finite(job, w)  # finite, as the encoders require (rule 2's F32 tensors too)
        return w, None
    fmt, gs = t.format_class, t.gs
    grid = _fp8_grid(job, scale, block) if scale is not None else None
    kept = _fp8_e8m0_passthrough(job, values, scale, block) if fmt is Fp8E4m3E8m0 else None
    if kept is not None:  # a 128x128 FP8 source whose scales are powers of two: its bytes, bit for bit
        codes, scales = kept
    elif fmt is Fp8E4m3E8m0 and grid is not None:  # the FP8 dequant fused into its block encoder
        codes, scales = kernels.encode_from_fp8_e8m0(values, grid, block, name=job.out_name)
    elif fmt.kernel_code is None:  # not a row codec (fp8-e4m3-e8m0, the affine formats): from float32
        w = _dequant(job, values, scale, block)
        codes, scales = fmt.encode(w, gs, name=job.out_name, fast=True, quantizer=t.quantizer)
    elif t.quantizer != RTN:  # the mse search (FORMATS §11): BF16 / F16 values as they are (the kernels read
        # their bits), any other source dequantised exactly to float32 first
        w = values if scale is None and values.dtype in (BF16, np.float16) else _dequant(job, values, scale, block)
        codes, scales = fmt.encode(w, gs, name=job.out_name, fast=True, quantizer=t.quantizer)
    elif values.dtype == numpy_dtype("BF16"):  # a whole [O, I] tensor, or one expert's rows of a fused one
        if measured is None or values.shape != (job.O, job.I):
            codes, scales = kernels.encode_from_bf16(t.fmt, values, gs, name=job.out_name)
        else:  # its rows are job_error's rows: the same figures
            codes, scales, rows = kernels.encode_from_bf16_measured(t.fmt, values, gs, name=job.out_name)
            if rows is not None:
                measured.append(from_rows(job.O * job.I, rows))
    elif values.dtype == np.float16:  # the same, upcast a row at a time: no float32 copy of the tensor
        codes, scales = kernels.encode_from_f16(t.fmt, values, gs, name=job.out_name)
    elif grid is not None:  # the FP8 dequant fused into the encoder: no float32 copy of the tensor
        if measured is None:
            codes, scales = kernels.encode_from_fp8_block(t.fmt, values, grid, block, gs, name=job.out_name)
        else:  # ... and into the figures' sums too (``job_error``'s figures)
            codes, scales, rows = kernels.encode_from_fp8_measured(t.fmt, values, grid, block, gs, name=job.out_name)
            if rows is not None:
                measured.append(from_rows(int(np.size(values)), rows))
    else:
        codes, scales = fmt.encode(_dequant(job, values, scale, block), gs, name=job.out_name, fast=True)
    if planar:
        codes = kernels.pairs_to_planar(codes)
    return codes, scales


def _encode_native(job: TensorJob, parts: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """A natively quantized source tensor (§5, §6): its encoding's own bytes kept when the target keeps them
    (``native``: ``SourceEncoding.keep``, e.g. MXFP4 nibbles and E8M0 bytes copied, INT4 codes repacked into
    pairs with scales widened exactly to F32), else decoded to float32 by its kernel and encoded (or stored as a
    float tensor)."""
    t, q, O, I = job.target, job.source.quant, job.O, job.I
    name = job.out_name
    q.encoding.check_parts(name, parts, job.source.shape)  # compressed-tensors weight_shape, ...
    if t.native:
        codes, scales = q.encoding.keep(parts, O, I, t.gs, name=name)
        if scales.dtype.kind != "f" or np.isfinite(scales).all():  # (E8M0 bytes: keep refuses 0xFF itself)
            return codes, scales
        w = None  # a NaN / inf scale: refused as the decoded path refuses it
    else:
        w = q.encoding.decode(parts, O, I, group=q.group, exact=q.exact)
    if w is None or not np.isfinite(w).all():
        raise ConvertError(f"tensor {name}: the {q.kind} source decodes to NaN or inf (a NaN scale byte)")
    if t.is_float:
        w = w.reshape(job.shape)
        return (encode_bf16(w) if t.is_bf16 else w), None
    return t.format_class.encode(w, t.gs, name=name, fast=True, quantizer=t.quantizer)


def encode_measured(
    job: TensorJob, values: np.ndarray, scale: np.ndarray | None, block: tuple[int, int] | None
) -> tuple[np.ndarray, np.ndarray | None, ErrorStats | None]:
    """``encode_job`` (pairs order) and ``job_error`` of what it wrote, the figures taken by the encoder itself
    where it can (no second pass over the tensor)."""
    measured: list[ErrorStats] = []
    codes, scales = encode_job(job, values, scale, block, False, measured)
    error = measured[0] if measured else job_error(job, values, scale, block, codes, scales)
    return codes, scales, error


def job_error(
    job: TensorJob,
    values: np.ndarray,
    scale: np.ndarray | None,
    block: tuple[int, int] | None,
    codes: np.ndarray,
    scales: np.ndarray | None,
) -> ErrorStats | None:
    """What ``job``'s written tensor (``codes`` / ``scales`` as ``encode_job`` returned them, pairs order) lost
    against its source values (formats/error_stats.py), both decoded exactly to float32; None for a tensor
    copied in its source dtype (rules 0 and 1: not a float weight, or bytes unchanged)."""
    t = job.target
    if t.is_source:
        return None
    if job.source.quant is not None:
        q = job.source.quant
        if t.native:  # the source's own codes kept: lossless by construction (``SourceEncoding.keep``)
            return _lossless(_decoded(job, codes, scales))
        source = q.encoding.decode(values, job.O, job.I, group=q.group, exact=q.exact)
    elif t.is_passthrough:  # fp8 bytes and scales unchanged: lossless
        return _lossless(_decoded(job, codes, scales))
    elif scale is None and values.dtype == BF16 and values.size == job.O * job.I:
        source = values.reshape(job.O, job.I)  # compared from its bits (error_stats: exact widening)
    else:
        source = _dequant(job, values, scale, block)
    if not t.is_float:  # int8-row / int4: decoded inside the sums kernel, a block of rows at a time
        fused = encoded_error(source, t.format_class.name, codes, scales, job.O, job.I, t.gs)
        if fused is not None:
            return fused
    return tensor_error(source, _decoded(job, codes, scales))


def _lossless(decoded: np.ndarray) -> ErrorStats:
    stats = tensor_error(decoded, decoded)
    return ErrorStats(stats.n, 0.0, stats.ssw, stats.ssw, stats.ssw, 0.0)


def _decoded(job: TensorJob, codes: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
    """The float32 values a reader decodes from ``encode_job``'s result (a float tensor as stored)."""
    t = job.target
    if t.is_float:  # F32, or BF16 (ml_dtypes: widened exactly)
        return np.asarray(codes).astype(np.float32, copy=False)
    fmt = t.format_class
    if fmt.kernel_code is not None:
        return kernels.decode(fmt.name, codes, scales, job.O, job.I, t.gs)
    return fmt.decode(codes, scales, job.O, job.I, t.gs)


def _as_bytes(array: np.ndarray) -> memoryview:
    """Little-endian C-order bytes of ``array`` (what the writer stores, and what the hash sees)."""
    a = np.ascontiguousarray(array)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return memoryview(a.reshape(-1).view(np.uint8))


class FileSink:
    """Writes one output file on a background thread and hashes it on another, so that disk writes, sha256
    and the final fsync overlap with each other and with the encoding of the next tensors (and of the next
    unit): a tensor goes writer -> hasher, in order, so the digest sees the file's bytes in file order while
    the writer is already on the next tensor (write and sha256 each take a core's worth at ~1-2 GB/s).

    The queue holds at most ``QUEUE_BYTES`` of encoded tensors not yet hashed (or one tensor, if it is
    larger), so memory stays bounded by the largest tensor. ``put`` re-raises a failure of the threads;
    ``result`` waits for publication and returns the record."""

    QUEUE_BYTES = 32 << 20
    WRITEBACK_BYTES = 16 << 20  # start the disk writing every this many bytes (see ``_start_writeback``)

    def __init__(self, out: OutputFile, outdir: Path):
        self.out = out
        self._expected = {name: (dtype, shape) for name, dtype, shape in out.entries}
        if out.is_sidecar or out.qpack_layer is not None:  # experts-int4g64/, packed_experts/ (the ledger
            (outdir / out.name).parent.mkdir(parents=True, exist_ok=True)  # creates it too; a worker may be first)
        self._writer = SafetensorsWriter(
            outdir / out.name, out.entries, out.metadata, metadata_last=out.is_sidecar,
            raw=out.qpack_layer is not None,
        )
        self._digest = hashlib.sha256()
        self._fd: int | None = None  # read-only descriptor of the temporary file, to start its writeback
        self._synced = out.size - out.data_size  # bytes whose writeback has been started (or not needed)
        self._end = self._synced  # bytes written
        try:
            with open(self._writer.temp_path, "rb") as fh:
                self._digest.update(fh.read(out.size - out.data_size))  # the header the writer just wrote
            self._fd = os.open(self._writer.temp_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except BaseException:
            self._writer.abort()
            raise
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._queued = 0  # bytes put and not yet written
        self._room = threading.Condition()
        self._error: BaseException | None = None
        self._record: FileRecord | None = None
        self._hash_queue: queue.SimpleQueue = queue.SimpleQueue()  # written views, in order; None: done
        self._hasher = threading.Thread(target=self._hash_run, name=f"sha256-{out.name}", daemon=True)
        self._hasher.start()
        self._thread = threading.Thread(target=self._run, name=f"sink-{out.name}", daemon=True)
        self._thread.start()

    def put(self, name: str, array: np.ndarray, part: bool = False) -> None:
        """Queue tensor ``name`` (``part``: its next row slab; the slabs, in order, make the whole tensor)."""
        view = _checked(self._expected, name, array, part)
        with self._room:
            while self._queued and self._queued + view.nbytes > self.QUEUE_BYTES and self._error is None:
                self._room.wait()
            if self._error is not None:
                raise self._error
            self._queued += view.nbytes
        self._queue.put((name, view, part))

    def _written(self, nbytes: int) -> None:
        with self._room:
            self._queued -= nbytes
            self._room.notify()

    def finish(self) -> None:
        """All tensors are queued: close (fsync, atomic rename) once they are written."""
        self._queue.put(_CLOSE)

    def abort(self) -> None:
        self._queue.put(_ABORT)
        self._thread.join()

    def result(self) -> FileRecord:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._record is not None
        return self._record

    def _start_writeback(self, end: int) -> None:
        """Have the kernel start writing ``[synced, end)`` to disk now, without waiting for it: the final fsync
        of the file (on the critical path for the last unit) then finds little left to write, and the disk
        works while the next tensors are encoded. ``POSIX_FADV_DONTNEED`` starts writeback of dirty pages
        (WB_SYNC_NONE) and drops only pages that are already clean."""
        if self._fd is None or not hasattr(os, "posix_fadvise"):
            return
        if end - self._synced >= self.WRITEBACK_BYTES:
            with contextlib.suppress(OSError):  # advice only: never a reason to fail a conversion
                os.posix_fadvise(self._fd, self._synced, end - self._synced, os.POSIX_FADV_DONTNEED)
            self._synced = end

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _run(self) -> None:
        try:
            self._drain_queue()
        finally:
            self._close_fd()
            self._stop_hasher()

    def _hash_run(self) -> None:
        """The hasher thread: every written view, in file order (hashlib releases the GIL on large buffers)."""
        while True:
            view = self._hash_queue.get()
            if view is None:
                return
            self._digest.update(view)
            self._written(view.nbytes)

    def _stop_hasher(self) -> None:
        """Let the hasher finish what the writer handed it, and wait for it (idempotent)."""
        if self._hasher.is_alive():
            self._hash_queue.put(None)
            self._hasher.join()

    def _drain_queue(self) -> None:
        failed = False
        while True:
            item = self._queue.get()
            if item is _ABORT or (failed and item is _CLOSE):
                self._writer.abort()
                return
            if failed:
                self._written(item[1].nbytes)  # drain what was queued after the failure
                continue
            try:
                if item is _CLOSE:
                    self._close_fd()  # before the rename (some systems cannot rename an open file)
                    self._writer.close()
                    self._stop_hasher()
                    self._record = FileRecord(self.out.name, self.out.size, self._digest.hexdigest())
                    _after_publish()
                    return
                name, view, part = item
                (self._writer.write_part if part else self._writer.write)(name, view)
                self._hash_queue.put(view)  # the hasher releases its bytes (``_written``)
                self._end += view.nbytes
                self._start_writeback(self._end)
            except BaseException as exc:  # reported to the encoding thread by put() / result()
                with self._room:
                    self._error = exc
                    self._room.notify_all()
                self._writer.abort()
                failed = True
                if item is _CLOSE:
                    return


_CLOSE, _ABORT = object(), object()


def _checked(expected, name: str, array: np.ndarray, part: bool = False) -> memoryview:
    dtype, shape = expected[name]
    want = numpy_dtype(dtype)
    a = np.asarray(array)
    if a.dtype != want:
        # same-width kinds, or one-byte codes stored under a target's dtype (I8 / F8_E4M3 / F8_E8M0 bytes)
        if a.dtype.itemsize == want.itemsize and (a.dtype.kind == want.kind or a.dtype == np.uint8):
            a = a.view(want)
        else:  # pragma: no cover - a planning/encoding mismatch is a bug, reported with the numbers
            raise ConvertError(f"tensor {name}: encoder produced {a.dtype}, planned {dtype}")
    if (a.size > math.prod(shape)) if part else (a.size != math.prod(shape)):
        raise ConvertError(f"tensor {name}: encoder produced {a.size} elements, planned shape {list(shape)}")
    return _as_bytes(a)


def _after_publish() -> None:
    global _published
    _published += 1
    spec = os.environ.get(KILL_AT_ENV, "")
    if spec.startswith("published:") and int(spec.split(":", 1)[1]) == _published:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class PendingUnit:
    """A unit whose tensors are all encoded; its files may still be writing. ``wait`` returns the result once
    every file is published."""

    key: str
    in_bytes: int
    sinks: list[FileSink]
    errors: dict[str, ErrorStats] = field(default_factory=dict)
    copied: int = 0

    def wait(self) -> UnitResult:
        try:
            files = [s.result() for s in self.sinks]
        except BaseException:
            for s in self.sinks:
                s.abort()
            raise
        return UnitResult(self.key, files, self.in_bytes, self.errors, self.copied)


ENCODE_AHEAD_BYTES = 32 << 20  # source bytes being read / encoded ahead of the writer (at least one tensor)
BIG_TENSOR_ELEMS = 1 << 24  # a tensor this large is encoded on every kernel thread (its rows split)


def encoder_threads() -> int:
    """Threads reading and encoding whole tensors at once: the kernels' thread count (``kernels.set_threads``,
    1 in a ``--workers`` process; default ``NUMBA_NUM_THREADS``), at most the CPU count."""
    return max(1, min(kernels.kernel_threads() or kernels.default_threads(), os.cpu_count() or 1))


def _encoder_init() -> None:
    kernels.set_threads(1, this_thread=True)  # whole tensors in parallel, no per-tensor fork-join


class _Ahead:
    """Reads and encodes the jobs of a unit on a thread pool, in order, at most ``ENCODE_AHEAD_BYTES`` of
    source ahead of the consumer (a larger tensor goes alone). ``take()`` returns the next job's result
    (or raises its error), in job order, so the files get the same bytes in the same order as one thread."""

    def __init__(self, pool: ThreadPoolExecutor, work: list, fn: Callable):
        self._pool, self._work, self._fn = pool, work, fn
        self._queue: collections.deque[tuple[Future, int]] = collections.deque()
        self._next = 0
        self._inflight = 0

    def _fill(self) -> None:
        while self._next < len(self._work):
            nbytes = self._work[self._next][0].in_bytes
            if self._queue and self._inflight + nbytes > ENCODE_AHEAD_BYTES:
                return
            self._queue.append((self._pool.submit(self._fn, *self._work[self._next]), nbytes))
            self._inflight += nbytes
            self._next += 1

    def prime(self) -> None:
        """Start the first jobs now (``take`` would, later)."""
        self._fill()

    def take(self):
        self._fill()
        fut, nbytes = self._queue.popleft()
        try:
            return fut.result()
        finally:
            self._inflight -= nbytes
            self._fill()

    def cancel(self) -> None:
        self._next = len(self._work)
        for fut, _ in self._queue:
            fut.cancel()


SLAB_BYTES = 16 << 20  # source bytes per row slab of a big tensor (``_slab_rows``)


def _slab_rows(
    job: TensorJob, out: OutputFile, group: OutputGroup, block: tuple[int, int] | None
) -> int | None:
    """Rows per slab when ``job`` is encoded by row slabs (read, encoded and written a slab at a time, so memory
    holds a few slabs, never the tensor: docs/FORMATS.md §9), else None. A 2-D tensor of more than
    ``SLAB_BYTES`` whose rows encode independently: a plain source (not natively quantized, not a slice of a
    stack) written by a row codec, as a float or as its source bytes, into a main shard. FP8 slabs are whole
    rows of scale blocks (the fused kernel reads grid row ``r // br``)."""
    src, t = job.source, job.target
    if src.quant is not None or job.fused_rows is not None or job.fused_pick is not None or group.stacks:
        return None
    if len(src.shape) != 2 or tuple(job.shape) != tuple(src.shape) or out.planar or out.is_sidecar:
        return None
    if t.is_passthrough or not (t.is_source or t.is_float or t.format_class.kernel_code is not None):
        return None  # fp8-e4m3-b128 / -e8m0: checked and chosen over the whole tensor
    row_bytes = src.nbytes // max(job.O, 1)
    if src.nbytes <= SLAB_BYTES or row_bytes == 0:
        return None
    rows = max(1, SLAB_BYTES // row_bytes)
    if src.scale is not None and block is not None:
        rows = max(block[0], rows // block[0] * block[0])
    return rows if rows < job.O else None


class _Slabs:
    """A big job (``_slab_rows``) encoded in the consuming thread, slab by slab: each encoded on the kernels'
    threads and queued for the sink while the next one is read."""

    def __init__(self, job: TensorJob, rows: int, reader: ShardReader, block: tuple[int, int] | None):
        self.job, self.rows, self.reader, self.block = job, rows, reader, block
        self.error: ErrorStats | None = None  # the slabs' figures added up (row sums: the tensor's)

    def put(self, sink: FileSink, wname: str) -> np.ndarray | None:
        """Every slab's codes into ``sink`` as parts of ``wname``; returns the scales of all rows (or None)."""
        job, reader = self.job, self.reader
        src = job.source
        sc = src.scale
        grid = None if sc is None else reader.read(sc.shard, sc.name, sc.dtype, sc.shape)
        scales = []
        starts = range(0, job.O, self.rows)
        # the next slab is read on a thread of its own while this one is encoded: a read is one core's copy
        # from the page cache, which would otherwise leave the other core idle (memory: one more slab)
        with ThreadPoolExecutor(1, "slab-read") as pool:
            read = lambda r0: reader.read_rows(src, r0, min(job.O, r0 + self.rows))  # noqa: E731
            ahead = pool.submit(read, 0)
            for r0 in starts:
                values = ahead.result()
                if r0 + self.rows < job.O:
                    ahead = pool.submit(read, r0 + self.rows)
                s = self._encode(sink, wname, values, grid, r0)
                if s is not None:
                    scales.append(s)
                del values
        return np.concatenate(scales) if scales else None

    def _encode(self, sink: FileSink, wname: str, values: np.ndarray, grid, r0: int) -> np.ndarray | None:
        """Slab ``values`` (rows ``r0``...) encoded and queued; returns its scales (or None)."""
        job, reader, block = self.job, self.reader, self.block
        r1 = r0 + values.shape[0]
        rows_grid = None if grid is None else np.asarray(grid)[r0 // block[0] : -(-r1 // block[0])]
        slab = replace(job, O=r1 - r0, shape=(r1 - r0, job.I))
        try:
            codes, s, error = encode_measured(slab, values, rows_grid, block)
        except (ConvertError, EncodeError):
            # the whole tensor's message (its first bad [o, i], its count): encoded whole, on this path only
            encode_job(job, *_source_values(job, reader, block), block, False)
            raise
        if error is not None:
            self.error = error if self.error is None else self.error + error
        sink.put(wname, codes, part=True)
        return s


def _read_encode(
    job: TensorJob, out: OutputFile, group: OutputGroup, reader: ShardReader, block: tuple[int, int] | None
):
    """One job on an encoder thread: its source read, encoded (and its sidecar scales made); a big one is
    handed back as ``_Slabs``, to be encoded as it is written."""
    rows = _slab_rows(job, out, group, block)
    if rows is not None:
        return _Slabs(job, rows, reader, block)
    values, scale = _source_values(job, reader, block)
    big = job.O * job.I >= BIG_TENSOR_ELEMS
    if big:  # few of these: split its rows over every kernel thread
        kernels.set_threads(None, this_thread=True)
    try:
        codes, scales, error = encode_measured(job, values, scale, block)
    finally:
        if big:
            kernels.set_threads(1, this_thread=True)
    if out.planar and scales is not None:  # planar64-v8 code order (docs/FORMATS.md §4)
        codes = kernels.pairs_to_planar(codes)
    if out.is_sidecar:  # one F32 scale per (row, 64-block), docs/FORMATS.md §4
        scales = planar_sidecar.block_scales(scales, job.O, job.I)
    return codes, scales, error


def _write_group(
    sink: FileSink, group: OutputGroup, ahead: _Ahead, on_tensor, slow: float, errors: dict[str, ErrorStats],
    copying: reuse.Copying | None = None,
) -> None:
    """One group's encoded jobs (taken from ``ahead`` in job order) into ``sink``: each weight, its scale
    right after it (an interleaved record) or after the group's weights (§4: an expert's scales follow its
    codes); a target's stacks (formats/expert_layouts.py ``Stack``) instead, each once its members are encoded.
    Each job's error figures go to ``errors`` under its output name. ``copying``: the jobs of this file copied
    from a donor file (``convert --replace``, converters/reuse.py), put from it instead of ``ahead``."""
    if copying is not None and copying.whole_group(group, sink, errors, on_tensor):
        return
    scales_after: list[tuple[str, np.ndarray]] = []
    members: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # a target's stacks' members
    pending = list(group.stacks)
    cut = len(group.jobs) - group.trailing  # an expert's biases follow its scales (§4)
    for k, job in enumerate(group.jobs):
        if k == cut:
            _put_all(sink, scales_after)
        if copying is not None and copying.job(job, group, sink, scales_after, errors, on_tensor):
            continue
        taken = ahead.take()
        wname, sname = job.target.tensor_names(job.out_name)
        if isinstance(taken, _Slabs):  # its codes written slab by slab (never a stack's member)
            codes, scales = None, taken.put(sink, wname)
            error = taken.error
        else:
            codes, scales, error = taken
        if error is not None:
            errors[job.out_name] = error
        if group.stacks:
            members[k] = (codes, scales)
            while pending and all(m in members for m in pending[0].members):
                _put_stack(sink, pending.pop(0), members)  # written once complete, then freed
        else:
            if codes is not None:
                sink.put(wname, codes)
            if sname is not None and group.interleaved:  # a target's record: scale next
                sink.put(sname, scales)
            elif sname is not None:
                scales_after.append((sname, scales))
        del codes, scales
        if on_tensor is not None:
            on_tensor(job.in_bytes)
        if slow:
            time.sleep(slow)
    _put_all(sink, scales_after)  # an expert's scales follow its codes (§4)


def _put_all(sink: FileSink, tensors: list[tuple[str, np.ndarray]]) -> None:
    """Put ``tensors`` in order, and forget them."""
    for name, data in tensors:
        sink.put(name, data() if callable(data) else data)  # a donor's scale is read when its turn comes
    tensors.clear()


def start_unit(
    unit: Unit,
    shard_paths: Mapping[str, Path],
    outdir: Path,
    block: tuple[int, int] | None,
    on_tensor: Callable[[int], None] | None = None,
    donor: Mapping[str, reuse.FileCopy] | None = None,
) -> PendingUnit:
    """Read and encode the tensors of ``unit`` on ``encoder_threads()`` threads, whole tensors in parallel and
    up to ``ENCODE_AHEAD_BYTES`` ahead; this thread hands the results, in order, to a sink thread per file,
    which hashes and writes. Returns before the files are published. ``donor``: per file, the tensors copied
    from a previous output's file instead (``convert --replace``, converters/reuse.py); when that file is not
    its recorded bytes the unit is written again without it, before anything is published."""
    if donor:
        try:
            return _start_unit(unit, shard_paths, Path(outdir), block, on_tensor, donor)
        except reuse._DonorChanged:
            pass
    return _start_unit(unit, shard_paths, Path(outdir), block, on_tensor, None)


def _start_unit(unit: Unit, shard_paths: Mapping[str, Path], outdir: Path, block: tuple[int, int] | None,
                on_tensor, donor: Mapping[str, reuse.FileCopy] | None) -> PendingUnit:  # fmt: skip
    slow = float(os.environ.get(SLOW_TENSOR_ENV) or 0)
    reader = ShardReader(shard_paths)
    sinks: list[FileSink] = []
    errors: dict[str, ErrorStats] = {}
    copies: dict[str, reuse.Copying] = {}
    try:
        for f in unit.files:
            if (c := (donor or {}).get(f.name)) is not None:
                copies[f.name] = reuse.Copying(outdir, c, f)
    except reuse._DonorChanged:
        for c in copies.values():
            c.close()
        raise
    work = [
        (job, out, group, reader, block) for out in unit.files for group in out.groups for job in group.jobs
        if out.name not in copies or not copies[out.name].copies(group, job)
    ]  # fmt: skip
    with ThreadPoolExecutor(encoder_threads(), "encode", initializer=_encoder_init) as pool:
        ahead = _Ahead(pool, work, _read_encode)
        try:
            ahead.prime()  # the encoders read while this thread opens the unit's files
            for out in unit.files:
                if out.name in copies and copies[out.name].copy.keep:  # the previous output's file, unchanged
                    sinks.append(reuse.KeptFile(outdir, copies[out.name].copy, out, errors, on_tensor))
                    continue
                sink = FileSink(out, outdir)
                sinks.append(sink)
                for group in out.groups:
                    _write_group(sink, group, ahead, on_tensor, slow, errors, copies.get(out.name))
                if out.name in copies:
                    copies[out.name].verify()  # the donor's bytes are its record's, or nothing is published
                sink.finish()
        except BaseException:
            ahead.cancel()
            for s in sinks:
                s.abort()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            reader.close()
            for c in copies.values():
                c.close()
    return PendingUnit(unit.key, unit.in_bytes, sinks, errors, sum(len(c.copy.jobs) for c in copies.values()))


def encode_work(jobs: Iterable[TensorJob]) -> Iterator[tuple[str, int]]:
    """``(format name, elements)`` of every job that runs an encoder (``kernels.plan_encodes``)."""
    for job in jobs:
        t = job.target
        if not (t.is_source or t.is_passthrough or t.is_float or t.native or job.source.quant is not None):
            yield t.fmt, job.O * job.I


def convert_unit(
    unit: Unit,
    shard_paths: Mapping[str, Path],
    outdir: Path,
    block: tuple[int, int] | None,
    on_tensor: Callable[[int], None] | None = None,
    donor: Mapping[str, reuse.FileCopy] | None = None,
) -> UnitResult:
    """Convert one unit and wait until its files are published (worker processes use this)."""
    kernels.plan_encodes(encode_work(unit.jobs))
    return start_unit(unit, shard_paths, outdir, block, on_tensor, donor).wait()
