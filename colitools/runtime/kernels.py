"""Matmul kernels that read packed codes directly (no dequantized copy of the weight).

Every kernel computes ``Y[n, o] = sum_i W[o, i] * X[n, i]`` for the rows ``o0 <= o < o1`` of a weight ``W[O, I]``
held in one of the container formats (docs/FORMATS.md §2/§4). Kernels are serial and release the GIL; a big call is
split by rows over the kernels' thread pool (``colitools.formats.kernels.threads``). For each row, every input
vector ``n`` is processed while the row's codes are still in L1, and the arithmetic for one ``(n, o)`` is the same
whatever ``N`` is, so a token gets bit-identical expert outputs in a prefill batch and in a one-token decode step.

Offset codes (int4 ``nib - 8``, int3 ``u - 4``) are folded out of the inner loop: a group computes
``sum(u * x) - offset * sum(x)`` with the group sums of ``x`` precomputed once per call. int4 kernels convert a
byte and its high nibble (``b >> 4`` on uint32: numba types integer ops on small ints as int64, and 64-bit lanes
would halve the vector width) and take four rows per pass over ``x``. Results differ from a float64 reference
by float32 rounding only (~1e-6 relative), far inside the oracle margins.

The kernels are numba functions (``_jit_kernels.py``, each registered with its compiled-ahead arguments beside
it); this module is numba-free, declares them as the kernel set ``KERNELS`` (``colitools.formats.kernels.aot``:
the runtime registers its set downward, nothing in ``formats`` names it) and runs them, or the same functions
compiled ahead of time, whichever ``KERNELS.kernels()`` resolves: ``colitools run`` then starts without numba.
"""

from __future__ import annotations

import numpy as np

from colitools.formats import reference as ref
from colitools.formats.errors import RuntimeModelError
from colitools.formats.kernels import aot, threads
from colitools.formats.registry import MatmulKind, matmul_format

F32 = np.float32

# The code base's one decode tables (formats/reference.py): E2M1 nibble (bit 3 = sign) -> value, E8M0 scale
# byte -> 2^(byte - 127), e4m3fn byte -> value.
MXFP4_LUT = ref.E2M1_SIGNED
E8M0_LUT = ref.E8M0_TO_F32
E4M3_LUT = ref.E4M3_TO_F32

# The int4 kernels take INT4_ROWS rows per pass over x (each x load feeds them all): the rows of a pass are the
# aligned block 4q .. 4q+3 of the whole matrix, the last block repeating row O - 1, so a row's arithmetic
# depends on its index only, never on how a call was split (split bounds are multiples of INT4_ROWS) or on N.
INT4_ROWS = 4
# While a block runs, the codes and scales of the block this many blocks ahead are prefetched: an expert read
# once per step (the streaming case) then waits less on memory; for a cache-resident matrix it costs one hint
# per 64 bytes.
PREFETCH_BLOCKS = 2


def _jit_modules():
    from colitools.runtime import _jit_kernels

    return (_jit_kernels,)


# The matmul kernels, compiled ahead of time into colitools/runtime/_aot_runtime_<stamp>; their code reads
# INT4_ROWS and PREFETCH_BLOCKS of this file.
KERNELS = aot.KernelSet("runtime", __file__, _jit_modules, constants=("kernels.py",))


# ------------------------------------------------------------------------------------------------ the wrapper
SPLIT_MACS = 1 << 21  # a call with at least this many multiply-adds is split by rows across the pool
CHUNK_MACS = 1 << 19  # ... into chunks of at least this many (~40 us of int4 work), at most 8 per worker
BLAS_MIN_ROWS = 16  # float32 weights: BLAS sgemm from this many input vectors on, the numba kernel below


def _pad(x: np.ndarray, width: int) -> np.ndarray:
    if x.shape[1] == width:
        return x
    out = np.zeros((x.shape[0], width), dtype=F32)
    out[:, : x.shape[1]] = x
    return out


def _group_sums(xp: np.ndarray, group: int) -> np.ndarray:
    """Sums of ``xp[N, G * group]`` over each group of ``group`` columns -> ``[N, G]`` (float32)."""
    N, W = xp.shape
    return np.ascontiguousarray(xp.reshape(N, W // group, group).sum(axis=2, dtype=F32))


def _aligned(a: np.ndarray) -> np.ndarray:
    """``a`` itself, or an aligned copy of a view at an odd offset of a read buffer: every array a kernel gets
    is C-contiguous and aligned (the compiled-ahead kernels take them as their signature says)."""
    return a if a.flags.aligned else a.copy()


KINDS = tuple(MatmulKind)
_K = MatmulKind


class QTensor:
    """A linear weight ``[O, I]`` kept in its stored form; ``matmul(X[N, I]) -> Y[N, O]`` runs a kernel on it.

    ``kind`` is one of ``KINDS``: ``"int4"`` covers int4-row and int4-grouped (pairs order, ``gs`` None for one
    scale per row), ``"int4-planar"`` the planar64-v8 order; ``"f32"`` holds a float32 matrix (float sources).
    ``codes`` is a uint8 ``[O, row_bytes]`` view into the expert's read buffer; ``scales`` float32 (uint8 E8M0
    for mxfp4).
    """

    __slots__ = ("kind", "codes", "scales", "O", "I", "gs", "row_align")

    def __init__(
        self, kind: str, codes: np.ndarray, scales: np.ndarray | None, O: int, I: int, gs: int | None
    ):
        fmt = matmul_format(kind, gs)  # the registry owns every shape below
        if fmt is None:
            raise RuntimeModelError(f"no runtime kernel for weight kind {kind!r}")
        self.kind, self.O, self.I, self.gs, self.row_align = MatmulKind(kind), O, I, gs, fmt.row_align
        if not fmt.quantized:
            self.codes = _aligned(np.ascontiguousarray(codes, dtype=F32).reshape(O, I))
            self.scales = None
            return
        self.codes = codes.reshape(fmt.weight_shape(O, I, gs))
        if self.kind is _K.INT8_ROW:
            self.codes = self.codes.view(np.int8)
        self.codes = np.ascontiguousarray(self.codes)
        self.scales = np.ascontiguousarray(scales, dtype=fmt.scale_numpy).reshape(fmt.scale_grid(O, I, gs))
        if self.kind in (_K.INT4, _K.INT4_PLANAR):  # [O, G], int4-row as one group of the whole row
            self.scales = self.scales.reshape(O, -1)
        self.scales = _aligned(self.scales)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """``x[N, I]`` float32 -> ``[N, O]`` float32 (``x @ W.T``)."""
        x = np.ascontiguousarray(x, dtype=F32).reshape(-1, self.I)
        N, O = x.shape[0], self.O
        kind, codes, scales = self.kind, self.codes, self.scales
        if kind is _K.F32 and N >= BLAS_MIN_ROWS:
            return x @ codes.T
        k = KERNELS.kernels()  # compiled ahead of time, else numba's JIT (resolved once per process)
        y = np.empty((N, O), dtype=F32)
        rb = codes.shape[1]
        if kind is _K.F32:
            kernel, args = k.rt_f32, (codes, x, y)
        elif kind in (_K.INT4, _K.INT4_PLANAR):
            G = scales.shape[1]
            # int4-row and planar: G groups of rb // G bytes (int4-row: one group, the whole row)
            gbytes = rb // G if G == 1 or kind is _K.INT4_PLANAR else self.gs // 2
            xa, xd = np.empty((N, rb), F32), np.empty((N, rb), F32)
            xs = np.empty((N, G), F32)
            k.rt_int4_prep(x, rb, G, gbytes, kind is _K.INT4_PLANAR, xa, xd, xs)
            if gbytes == 32 and rb == 32 * G:
                kernel, args = k.rt_int4_g64, (codes, scales, xa, xd, xs, y)
            else:
                kernel, args = k.rt_int4, (codes, scales, xa, xd, xs, y, gbytes)
        elif kind is _K.INT3_G64:
            xp = _pad(x, scales.shape[1] * ref.INT3_GROUP)
            kernel, args = k.rt_int3_g64, (codes, scales, xp, _group_sums(xp, ref.INT3_GROUP), y)
        elif kind is _K.MXFP4:
            xe, xo = np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2])
            kernel, args = k.rt_mxfp4, (codes, scales, xe, xo, y, MXFP4_LUT, E8M0_LUT)
        elif kind is _K.FP8_B128:
            kernel, args = k.rt_fp8_b128, (codes, scales, x, y, E4M3_LUT)
        elif kind is _K.INT8_ROW:
            kernel, args = k.rt_int8_row, (codes, scales, x, y)
        else:  # int2-row
            xp = _pad(x, 4 * rb)
            kernel, args = k.rt_int2_row, (codes, scales, xp, xp.sum(axis=1, dtype=F32).reshape(N, 1), y)
        if N * O * self.I >= SPLIT_MACS and threads.n_workers() > 1 and not threads.in_worker():
            align = INT4_ROWS if kind in (_K.INT4, _K.INT4_PLANAR) else self.row_align
            parts = max(threads.n_workers(), min(8 * threads.n_workers(), N * O * self.I // CHUNK_MACS))
            threads.parallel_map(lambda r: kernel(*args, *r), threads.row_chunks(O, align, parts))
        else:
            kernel(*args, 0, O)
        return y
