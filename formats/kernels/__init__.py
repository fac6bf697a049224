"""Fast numba codecs, byte-identical to the numpy reference in ``reference.py`` (docs/FORMATS.md §2).

Every encoder performs the reference's float32 operations in the same order: ``amax``, one float32 true
division ``amax / qmax``, the ``1e-8`` floor, then per element one float32 true division ``w / s``, ``np.rint``
(LLVM ``rint``: round half to even in the default rounding mode), clip, pack. mxfp4 sums its squared errors in
float64 in element order, like the reference's ``cumsum`` (from FP8, only when a float32 sum of the same terms
with a proven error bound leaves the choice open: ``_jit_encoders``, "mxfp4 from FP8"). No ``fastmath``: nothing
is reassociated.

Two tricks keep the kernels vectorised without changing a bit of output:

* ``amax`` is computed on the float32 *bit patterns* with the sign cleared: for non-negative floats, integer
  order is float order, so an unsigned integer max (which LLVM vectorises without fastmath) gives the same
  ``amax``; and every NaN/inf has bits ``>= 0x7F800000``, so the same pass detects non-finite input with no
  separate ``np.isfinite`` sweep. Only when a kernel reports a bad row does Python build the exact message.
* Fused sources: BF16 is upcast exactly (f32 bits = bf16 bits << 16), F16 by the CPU's own conversion where it
  has one (``_half``: x86 F16C, AArch64), else by its bit fields (``_f16_f32``: the numpy cast, subnormals
  and NaN payloads included); FP8 e4m3fn is decoded exactly by bit arithmetic (equal to the ml_dtypes table
  ``E4M3_TO_F32`` for all 256 bytes, tested; unlike a table lookup it vectorises; behind a NaN check, by one
  multiply, ``_e4m3_finite``) times the block scale (one float32 multiply, as ``reference.dequant_fp8_block``).
  Each row is materialised in a float32 buffer (L2-resident) and encoded from there, except for int4 groups of
  even size (int4-g64, the experts' format; from BF16, F16 and FP8), and, from FP8, int3-g64 groups and
  int8-row, which are encoded straight from the source bits: the amax is taken on the BF16 / F16 bit patterns,
  or on the e4m3 bytes times the block scale (see ``_int_groups_fp8``), and each value is upcast / dequantised
  again in registers where it is quantised (~1.7x faster).
* FP8 outputs whose group or block lies in one source scale block depend on each byte alone. int4 / int3
  groups compare the byte's magnitude with level thresholds (its level is monotone in it), from a table per
  group amax byte whose few exact ties the per-element rule decides once per (scale block, amax byte), 32
  bytes to a vector (``_jit_encoders``, "int4 / int3 groups from FP8"); fp8-e4m3-e8m0 looks each code up in a
  256-entry table made per block by the per-element rule (127 magnitudes; a set sign bit flips the code's);
  mxfp4 finds each code by comparing the byte's magnitude with seven thresholds (the E2M1 index is monotone in
  it), made per (scale block, exponent) by binary search on the E2M1 bounds, and a block's exponent and whether
  e0 + 1 competes once per (scale block, amax byte) (``_jit_encoders``, "mxfp4 from FP8").
* Explicit vectors: where LLVM's vectoriser takes 8 bytes at a time (byte reductions, nibble and bit-plane
  packing), ``_jit_bits`` writes the 32-byte vector in portable LLVM IR itself (``_mag_max32``,
  ``_level_bytes32`` / ``_level_bytes64``, ``_pack_nibbles32``, ``_int3_planes32``, ``_mx_nibbles32``).
* Index and refcount hygiene: see "shared pieces" below.

Parallelism: the kernels are serial and release the GIL (``nogil``); ``threads.run_rows`` spreads row chunks over
the kernels' one thread pool (``threads``, which the runtime's matmuls use too), using ``set_threads(n)``
threads (process-wide; default ``NUMBA_NUM_THREADS``, at most the CPU count; ``numba.set_num_threads`` does not
apply: reading it costs a GIL round trip per call). Unlike a ``prange`` kernel this is safe to call from several
Python threads at once.

Start-up and compile time: importing this package does not import numba; with the kernels compiled ahead of
time (``aot``, ``colitools kernels``) nothing ever does. The entry points (``_dispatch``)
send tensors below ``_dispatch.SMALL_ELEMS`` elements to the numpy reference (the same bytes), so a tiny
conversion never loads a kernel; the numba modules are imported on the first large tensor. Kernels are cached
on disk (``cache=True``): in the package's ``__pycache__``, or, when that is read-only (a site-packages
install), numba's user-wide cache (``$XDG_CACHE_HOME/numba`` / ``~/.cache/numba``); ``NUMBA_CACHE_DIR``
overrides both.

Modules, one naming rule (here and in ``colitools/runtime``): a module that imports numba is ``_jit_<name>.py``
and registers its kernels beside their ``@njit`` (``aot.export``); every other module is numba-free and calls
them only through ``aot`` (compiled ahead of time, else the JIT). Numba-free: ``_dispatch`` (the public entry
points and their checks), ``encoders`` / ``decoders`` (the always-kernel encoders and decoders: they plan the
outputs and run ``aot.CODECS.run``), ``aot`` (the kernel sets, their modules compiled ahead of time, else numba's
JIT functions), ``threads`` (the one thread pool, ``run_rows``). numba: ``_jit_bits`` (JIT options, constants,
bit intrinsics, shared inline helpers, e4m3 decode), ``_jit_row_encoders`` (float32 row encoders and the format
dispatch), ``_jit_encoders`` (encode drivers per source), ``_jit_decoders`` (decoders, FP8 dequant, planar64
reorder, natively quantized sources), ``_jit_threads`` (the pool's atomics and polls).
"""

from __future__ import annotations

from colitools.formats.kernels._dispatch import _reference_encode as _reference_encode
from colitools.formats.kernels._dispatch import (
    decode,
    default_threads,
    dequant_fp8_block,
    encode,
    encode_fp8_e8m0,
    encode_from_bf16,
    encode_from_bf16_measured,
    encode_from_f16,
    encode_from_fp8_block,
    encode_from_fp8_e8m0,
    encode_from_fp8_measured,
    kernel_threads,
    pairs_to_planar,
    plan_encodes,
    planar_to_pairs,
    set_threads,
    use_kernels,
)
from colitools.formats.reference import E4M3_TO_F32  # the one table, = _jit_bits.E4M3_TO_F32

__all__ = [
    "encode",
    "encode_from_bf16",
    "encode_from_bf16_measured",
    "encode_from_fp8_measured",
    "encode_from_f16",
    "encode_from_fp8_block",
    "encode_from_fp8_e8m0",
    "encode_fp8_e8m0",
    "decode",
    "dequant_fp8_block",
    "pairs_to_planar",
    "planar_to_pairs",
    "plan_encodes",
    "kernel_threads",
    "default_threads",
    "set_threads",
    "use_kernels",
    "E4M3_TO_F32",
]
