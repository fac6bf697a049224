"""The encoders on the kernels (``encode``, ``encode_from_bf16`` and ``encode_from_bf16_measured``, ``encode_from_f16``,
``encode_from_fp8_block`` and ``encode_from_fp8_measured``, ``encode_fp8_e8m0``, ``encode_from_fp8_e8m0``),
numba-free: the output arrays are planned here; the rows are encoded by the numba drivers of ``_jit_encoders`` or
by the same drivers compiled ahead of time, whichever ``aot.CODECS`` resolves once per process. Byte-identical to
the numpy reference either way (the package's entry points, ``_dispatch``, send small tensors to that reference
instead)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError
from colitools.formats.kernels import aot
from colitools.formats.kernels._dispatch import _fp8_operands, _matrix, _reference_encode, _writable

F32 = np.float32
_FP8_B = ref.FP8_BLOCK  # fp8-e4m3-e8m0's block edge (128)


def _plan(fmt_name: str, O: int, I: int, gs: int | None, name: str):
    """Kernel code, effective group size, the output arrays the kernels fill (codes, f32 scales, u8
    scales) and the scales as returned (a view shaped as the registry's ``scale_grid``). Resolved once per
    call from the format class, outside the kernels."""
    cls = _writable(fmt_name, O, I, gs, name)
    if cls.kernel_code is None:  # never another format's kernel: ``_dispatch`` sends it to its reference
        raise EncodeError(f"tensor {name or '?'}: format {fmt_name} has no row kernel (no kernel_code)")
    codes = np.empty(cls.weight_shape(O, I, gs), np.uint8)
    grid = cls.scale_grid(O, I, gs)  # [O] (one per row), [O, G] or mxfp4's [O, I/32] E8M0 bytes
    per_row = math.prod(grid[1:])  # Python ints: np.prod costs ~5 us per tensor
    if cls.scale_numpy == np.uint8:
        sf, su = np.empty((O, 0), F32), np.empty((O, per_row), np.uint8)
    else:
        sf, su = np.empty((O, per_row), F32), np.empty((O, 0), np.uint8)
    scales = (su if cls.scale_numpy == np.uint8 else sf).reshape(grid)
    return cls.kernel_code, int(gs or 0), codes, sf, su, scales


def _raise_nonfinite(w_f32: np.ndarray, name: str) -> None:
    """Error path only: the registry's exact message (first bad [o, i] and the count)."""
    from colitools.formats.registry import _check_finite

    _check_finite(w_f32, name)
    raise EncodeError(f"tensor {name or '?'}: non-finite value")  # pragma: no cover (kernel/ref disagree)


def encode(fmt_name: str, w: np.ndarray, gs: int | None, *, name: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Encode float32 ``w[O, I]`` to ``(codes uint8 [O, row_bytes], scales)``, byte-identical to the reference.

    ``fmt_name`` is a format's stamp string (``int8-row``, ``int4-row``, ``int2-row``, ``int4-grouped`` with
    any ``gs``, ``int3-g64``, ``mxfp4``). The group-size writer rule is the caller's (the registry's) job.
    Raises EncodeError naming the tensor and the first bad ``[o, i]`` for NaN/inf input."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise EncodeError(f"tensor {name or '?'}: expected a 2-D weight, got shape {list(w.shape)}")
    w = np.ascontiguousarray(w, dtype=F32)
    O, I = w.shape
    fmt, g, codes, sf, su, scales = _plan(fmt_name, O, I, gs, name)
    if w.size == 0:
        return _reference_encode(fmt_name, w, gs)
    if aot.CODECS.run("rows_f32", (w, fmt, g, codes, sf, su), O, I) >= 0:
        _raise_nonfinite(w, name)
    return codes, scales


def encode_from_bf16(
    fmt_name: str, w_bf16: np.ndarray, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``kernels.encode_from_bf16`` (its operands and errors; ``_dispatch``) on the kernels, whatever the size."""
    wb = _matrix(w_bf16, np.uint16, ml_dtypes.bfloat16, name)
    O, I = wb.shape
    fmt, g, codes, sf, su, scales = _plan(fmt_name, O, I, gs, name)
    if wb.size == 0:
        return _reference_encode(fmt_name, wb.view(ml_dtypes.bfloat16).astype(F32), gs)
    if aot.CODECS.run("rows_bf16", (wb, fmt, g, codes, sf, su), O, I) >= 0:
        _raise_nonfinite(wb.view(ml_dtypes.bfloat16).astype(F32), name)
    return codes, scales


# formats whose figures ``encode_from_bf16_measured`` / ``encode_from_fp8_measured`` take as they encode
# (``_jit_stats.rows_bf16_measured`` / ``rows_fp8_measured``)
MEASURED_FORMATS = ("int8-row", "int4-row", "int4-grouped")


def encode_from_bf16_measured(
    fmt_name: str, w_bf16: np.ndarray, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``encode_from_bf16`` of a ``MEASURED_FORMATS`` format and the per-row error figures of what it wrote
    (``[O, 5]``, ``error_stats.row_sums``' order), each block of rows measured as soon as it is encoded."""
    wb = _matrix(w_bf16, np.uint16, ml_dtypes.bfloat16, name)
    O, I = wb.shape
    fmt, g, codes, sf, su, scales = _plan(fmt_name, O, I, gs, name)
    rows = np.empty((O, 5), np.float64)
    if aot.CODECS.run("rows_bf16_measured", (wb, fmt, g, codes, sf, su, rows), O, I) >= 0:
        _raise_nonfinite(wb.view(ml_dtypes.bfloat16).astype(F32), name)
    return codes, scales, rows


def encode_from_fp8_measured(
    fmt_name: str, q: np.ndarray, scale_inv: np.ndarray, block, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``encode_from_fp8_block`` of a ``MEASURED_FORMATS`` format and the per-row error figures of what it wrote
    against the exact dequant (``[O, 5]``, ``error_stats.row_sums``' order), each block of rows measured as soon
    as it is encoded, the dequant done inside the sums (``_jit_stats.rows_fp8_measured``)."""
    q, s, br, bc = _fp8_operands(q, scale_inv, block, name)
    O, I = q.shape
    fmt, g, codes, sf, su, scales = _plan(fmt_name, O, I, gs, name)
    rows = np.empty((O, 5), np.float64)
    if aot.CODECS.run("rows_fp8_measured", (q, s, br, bc, fmt, g, codes, sf, su, rows), O, I) >= 0:
        with np.errstate(all="ignore"):  # the error path: inf * 0 and overflow are expected here
            w = ref.dequant_fp8_block(q, s, (br, bc))
        _raise_nonfinite(w, name)
    return codes, scales, rows


def encode_from_f16(
    fmt_name: str, w_f16: np.ndarray, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``encode(fmt_name, f16 -> f32, gs)`` with the exact upcast fused in (a row at a time). ``w_f16`` is
    ``[O, I]`` float16 or uint16 (the raw half bits)."""
    wh = _matrix(w_f16, np.uint16, np.float16, name)
    O, I = wh.shape
    fmt, g, codes, sf, su, scales = _plan(fmt_name, O, I, gs, name)
    if wh.size == 0:
        return _reference_encode(fmt_name, wh.view(np.float16).astype(F32), gs)
    if aot.CODECS.run("rows_f16", (wh, fmt, g, codes, sf, su), O, I) >= 0:
        _raise_nonfinite(wh.view(np.float16).astype(F32), name)
    return codes, scales


def encode_from_fp8_block(
    fmt_name: str, q: np.ndarray, scale_inv: np.ndarray, block, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``kernels.encode_from_fp8_block`` (its operands and errors; ``_dispatch``) on the kernels, whatever the
    size."""
    q, s, br, bc = _fp8_operands(q, scale_inv, block, name)
    O, I = q.shape
    fmt, g, codes, sf, su, scales = _plan(fmt_name, O, I, gs, name)
    if q.size == 0:
        return _reference_encode(fmt_name, ref.dequant_fp8_block(q, s, (br, bc)), gs)
    if aot.CODECS.run("rows_fp8", (q, s, br, bc, fmt, g, codes, sf, su), O, I) >= 0:
        with np.errstate(all="ignore"):  # the error path: inf * 0 and overflow are expected here
            w = ref.dequant_fp8_block(q, s, (br, bc))
        _raise_nonfinite(w, name)
    return codes, scales


def encode_from_fp8_e8m0(
    q: np.ndarray, s: np.ndarray, br: int, bc: int, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``encode_fp8_e8m0(reference.dequant_fp8_block(q, s, (br, bc)))`` with the dequant fused in, for e4m3 bytes
    ``q[O, I]`` and a float32 grid ``s`` of source blocks whose sides are multiples of 128 (checked by the
    caller, ``_dispatch``). NaN / inf: the registry's EncodeError, as the unfused path."""
    O, I = q.shape
    codes = np.empty((O, I), np.uint8)
    scales = np.empty((-(-O // _FP8_B), -(-I // _FP8_B)), np.uint8)
    if (
        q.size
        and aot.CODECS.run("fp8_e8m0_fp8", (q, s, br, bc, codes, scales), scales.shape[0], _FP8_B * I) >= 0
    ):
        with np.errstate(all="ignore"):  # the error path: inf * 0 and overflow are expected here
            w = ref.dequant_fp8_block(q, s, (br, bc))
        _raise_nonfinite(w, name)
    return codes, scales


def encode_fp8_e8m0(w: np.ndarray, name: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``reference.encode_fp8_e8m0`` (byte-identical) for finite float32 ``w[O, I]``, block rows split over the
    kernel threads. The caller checks finiteness (the registry's message)."""
    w = np.ascontiguousarray(w, dtype=F32)
    if w.ndim != 2:
        raise EncodeError(f"tensor {name or '?'}: expected a 2-D weight, got shape {list(w.shape)}")
    O, I = w.shape
    codes = np.empty((O, I), np.uint8)
    scales = np.empty((-(-O // _FP8_B), -(-I // _FP8_B)), np.uint8)
    if w.size:
        aot.CODECS.run("fp8_e8m0", (w, codes, scales), scales.shape[0], _FP8_B * I)
    return codes, scales
