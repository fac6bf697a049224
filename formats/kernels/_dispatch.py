"""The public entry points of the fast codecs, without numba until a tensor is big enough to need it.

A tensor of fewer than ``SMALL_ELEMS`` elements is encoded / decoded by the numpy reference (``registry`` /
``reference.py`` / ``planar.py``), which the kernels equal byte for byte by contract (property tests, and
``tests/formats/test_kernel_dispatch.py`` for this switch): a conversion of a tiny model then neither imports
numba nor compiles or loads a kernel (about 1 CPU-s saved per process, 16 CPU-s on a first run). Larger
tensors go to the kernels through ``encoders`` / ``decoders`` (numba-free; the numba drivers are ``_jit_*``),
imported on first use, unless the whole plan fits the start-up budget below (numba's load, or, before the
encoders were ever compiled here, their compile). Validation (dtype, shape, group size, FP8 grid, writable
format) and the NaN/inf error message are the same on both paths. A format without a row kernel (no
``kernel_code``) takes its reference on every path, whatever the size (``_no_row_kernel``).

This module and ``__init__`` import nothing of numba: keep it so (``--help`` and tiny conversions stay fast).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading

import ml_dtypes
import numpy as np

from colitools.formats import planar, quantizers, registry
from colitools.formats import reference as ref
from colitools.formats.errors import EncodeError, FormatError
from colitools.formats.quantizers import RTN

F32 = np.float32

# Below this many elements the numpy reference runs instead of a kernel (same bytes). Tests that exercise the
# kernels on small tensors set it to 0 (which also turns the start-up budget below off).
SMALL_ELEMS = 1 << 16

# Start-up budget ("ski rental"): the first use of the numba kernels in a process costs about 0.5-0.65 CPU-s
# (importing numba, initialising its CPU target, loading the cached drivers), as much as the numpy reference
# needs for ~85M elements of int8-row. Until the kernels are in use, larger encodes still go to the reference
# while their total weighted size stays within this budget (mxfp4's reference is ~8x slower per element); the
# first encode that would exceed it loads the kernels, which serve every large tensor from then on. A
# passthrough conversion (native experts, a few dense tensors) then never pays the start-up; a real model's
# first large tensor does, as before. Same bytes either way. Measured: a BF16 checkpoint of 56.6M 2-D elements,
# default recipe, whole process, 4 alternating runs: 0.91-1.15 s on the reference, 0.99-1.26 s on the kernels.
STARTUP_BUDGET_ELEMS = 64 << 20
# Until the encoders have been compiled once into numba's cache (the first conversion after an install, every
# conversion in a fresh CI environment), their first use costs ~12 CPU-s of compiling instead: the budget is
# then this, ~2-5 CPU-s of reference work (int4-g64 ~110 Mw/s, int8-row ~230 Mw/s on one thread), so a model
# of up to ~1 GB of BF16 converts in seconds on the reference and compiles nothing (`kernels_compiled`).
COMPILE_BUDGET_ELEMS = 512 << 20
_REFERENCE_COST = {"mxfp4": 8, "fp8-e4m3-e8m0": 5}  # reference Mw/s: int8-row ~150, fp8-e4m3-e8m0 ~32
_budget = {"spent": 0, "kernels": False}

# The encoders' sources: numba's cache entries are keyed on their size and mtime, and so is the marker.
_ENCODER_SOURCES = ("_jit_bits.py", "_jit_row_encoders.py", "_jit_encoders.py")
_compiled: dict[str, bool] = {}  # memo of kernels_compiled()


def _marker_path() -> str | None:
    """The file that says the encoders were compiled into numba's cache, kept beside that cache so that both
    live and go together: numba's own order (``NUMBA_CACHE_DIR``; the package's ``__pycache__`` when it is
    writable; the user-wide ``$XDG_CACHE_HOME/numba`` or ``~/.cache/numba``), named by the size and mtime of
    the encoder sources (an edit or a checkout makes numba recompile, and the marker is another one)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        stamps = [(n, os.stat(os.path.join(here, n))) for n in _ENCODER_SOURCES]
    except OSError:
        return None
    key = hashlib.sha256(repr([(n, st.st_size, st.st_mtime_ns) for n, st in stamps]).encode()).hexdigest()[
        :16
    ]
    name = f"colitools-encoders-{key}.compiled"
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.path.join(os.environ["NUMBA_CACHE_DIR"], name)
    tree = os.path.join(here, "__pycache__")
    if os.access(tree if os.path.isdir(tree) else here, os.W_OK):
        return os.path.join(tree, name)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "numba", name)


def kernels_compiled() -> bool:
    """Whether the encoders were compiled here before (their marker exists; read once per process)."""
    if "yes" not in _compiled:
        path = _marker_path()
        _compiled["yes"] = path is not None and os.path.exists(path)
    return _compiled["yes"]


def _note_compiled() -> None:
    """After an encode on the kernels: they are in numba's cache now; leave the marker (best effort)."""
    if _compiled.get("yes"):
        return
    _compiled["yes"] = True
    path = _marker_path()
    if path is not None:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a"):
                pass


def ahead_of_time() -> bool:
    """Whether the encode drivers compiled ahead of time load here (``aot``): their start-up is then under a
    millisecond and the budget below is 0 (checked on the first large tensor, then memoised by ``aot``)."""
    from colitools.formats.kernels import aot

    return aot.CODECS.load() is not None


def _startup_budget() -> int:
    if ahead_of_time():
        return 0
    return STARTUP_BUDGET_ELEMS if kernels_compiled() else max(STARTUP_BUDGET_ELEMS, COMPILE_BUDGET_ELEMS)


# Threads of the kernels' row pool (``set_threads``); None: ``numba.config.NUMBA_NUM_THREADS`` capped at the
# CPU count. Read on every kernel call, so it is a plain value here, not ``numba.get_num_threads()`` (whose
# ctypes call releases and retakes the GIL: ~0.3 ms per call, up to a switch interval on a busy process).
_threads: dict[str, int | None] = {"n": None}
_thread_local = threading.local()  # .n: this thread's own count (set_threads(n, this_thread=True))


def set_threads(n: int | None, *, this_thread: bool = False) -> None:
    """Threads the kernels spread one tensor's rows over (the calling thread included); ``None`` restores the
    default (``NUMBA_NUM_THREADS``, at most the CPU count). Process-wide, unlike ``numba.set_num_threads``;
    ``this_thread=True`` sets it for calls made from the calling thread only (the converter's encoder
    threads, which each encode whole tensors, use 1)."""
    if n is not None and (not isinstance(n, int | np.integer) or isinstance(n, bool) or n < 1):
        raise ValueError(f"kernel threads must be a positive integer, got {n!r}")
    value = None if n is None else int(n)
    if this_thread:
        _thread_local.n = value
    else:
        _threads["n"] = value


def default_threads() -> int:
    """The default thread count without importing numba: ``NUMBA_NUM_THREADS`` when set, at most the CPU count
    (``_threads`` takes numba's own reading of the same variable)."""
    cpus = os.cpu_count() or 1
    try:
        n = int(os.environ.get("NUMBA_NUM_THREADS") or cpus)
    except ValueError:
        n = cpus
    return max(1, min(n, cpus))


def kernel_threads() -> int | None:
    """The calling thread's kernel thread count (``set_threads``), None for the default."""
    return getattr(_thread_local, "n", None) or _threads["n"]


def plan_encodes(work) -> bool:
    """Announce the encodes ahead: ``work`` is ``(format name, elements)`` per tensor to encode. When the
    tensors the reference would take add up to more than the start-up budget, the reference would only delay
    the inevitable kernel start-up (and run single-threaded meanwhile): the kernels then serve every large
    tensor from the first one on. Returns whether they will. Same bytes either way."""
    if SMALL_ELEMS <= 0 or _budget["kernels"]:
        return _budget["kernels"] or SMALL_ELEMS <= 0
    cost = sum(n * _REFERENCE_COST.get(fmt, 1) for fmt, n in work if n >= SMALL_ELEMS)
    if _budget["spent"] + cost > _startup_budget():
        _budget["kernels"] = True
    return _budget["kernels"]


def use_kernels() -> None:
    """From now on every tensor of ``SMALL_ELEMS`` elements or more goes to the kernels: a ``--workers`` process
    takes the decision of the parent that planned the whole conversion (its own plan is one unit)."""
    _budget["kernels"] = True


def _small(n: int) -> bool:
    return n < SMALL_ELEMS


def _reference_encodes(fmt_name: str, n: int) -> bool:
    """Whether an encode of ``n`` elements runs on the numpy reference (same bytes as the kernels)."""
    if n < SMALL_ELEMS:
        return True
    if _budget["kernels"] or SMALL_ELEMS <= 0 or ("numba" in sys.modules and kernels_compiled()):
        return False  # the start-up is paid already (numba is loaded, the encoders are in its cache)
    if ahead_of_time():
        return False  # no start-up to pay
    cost = n * _REFERENCE_COST.get(fmt_name, 1)
    if _budget["spent"] + cost <= _startup_budget():
        _budget["spent"] += cost
        return True
    _budget["kernels"] = True
    return False


def _no_row_kernel(fmt_name: str) -> bool:
    """A format without a row kernel (``kernel_code`` None) encodes on its numpy reference on every path, whatever
    the size: a kernel is only speed (fp8-e4m3-e8m0's own block kernel is ``encode_fp8_e8m0``, not these)."""
    cls = registry.lookup(fmt_name)
    return cls is not None and cls.kernel_code is None


# ------------------------------------------------------------------------------------------ validation
def _writable(fmt_name: str, O: int, I: int, gs: int | None, name: str) -> type[registry.Format]:
    """The format class, after the checks every encode path makes before any work."""
    cls = registry.lookup(fmt_name)
    if cls is None or not cls.writable:  # f32, fp8-e4m3-b128 (passthrough), e8-iq3-lattice
        raise EncodeError(f"tensor {name or '?'}: format {fmt_name} cannot be written by colitools' encoders")
    if cls.grouped and (not isinstance(gs, int | np.integer) or gs < 1):
        raise FormatError(f"tensor {name or '?'}: {fmt_name} needs a positive group size, got {gs}")
    cls.check_encodable(O, I, name=name)
    return cls


def _matrix(a: np.ndarray, raw: type, exact: type, name: str) -> np.ndarray:
    """A 2-D C-contiguous view of ``a`` as the raw integer dtype ``raw`` (``a`` is ``raw`` or ``exact``)."""
    a = np.asarray(a)
    if a.ndim != 2:
        raise EncodeError(f"tensor {name or '?'}: expected a 2-D weight, got shape {list(a.shape)}")
    if a.dtype not in (np.dtype(raw), np.dtype(exact)):
        raise EncodeError(
            f"tensor {name or '?'}: expected {np.dtype(exact).name} or {np.dtype(raw).name}, got {a.dtype}"
        )
    return np.ascontiguousarray(a).view(raw)


def _block(block) -> tuple[int, int]:
    br, bc = (block, block) if isinstance(block, int | np.integer) else tuple(block)
    if br < 1 or bc < 1:
        raise FormatError(f"FP8 block size must be positive, got {block}")
    return int(br), int(bc)


def _fp8_operands(q, scale_inv, block, name: str):
    q = _matrix(q, np.uint8, ml_dtypes.float8_e4m3fn, name)
    br, bc = _block(block)
    M, N = q.shape
    grid = (ref.ceil_div(M, br), ref.ceil_div(N, bc))
    s = np.ascontiguousarray(np.asarray(scale_inv).astype(F32))
    if s.size != grid[0] * grid[1]:
        raise EncodeError(
            f"tensor {name or '?'}: FP8 scale_inv has shape {list(s.shape)}, expected {list(grid)} "
            f"for [{M}, {N}] with {br}x{bc} blocks"
        )
    return q, s.reshape(grid), br, bc


def _reference_encode(fmt_name: str, w: np.ndarray, gs: int | None) -> tuple[np.ndarray, np.ndarray]:
    return registry.by_name(fmt_name)._encode_reference(w, gs)


def _compiled_now(result):
    """``result`` of an encode on the kernels, after marking the JIT ones compiled (``_note_compiled``)."""
    from colitools.formats.kernels import aot

    if not aot.CODECS.kernels().ahead:
        _note_compiled()
    return result


def _reference_checked(fmt_name: str, w: np.ndarray, gs: int | None, name: str):
    """The numpy reference encode of float32 ``w`` after the kernels' checks (same errors, same bytes)."""
    _writable(fmt_name, *w.shape, gs, name)
    registry._check_finite(w, name)
    return _reference_encode(fmt_name, w, gs)


# ------------------------------------------------------------------------------------------ public API
def encode(
    fmt_name: str, w: np.ndarray, gs: int | None, *, name: str = "", quantizer: str = RTN
) -> tuple[np.ndarray, np.ndarray]:
    """Encode float32 ``w[O, I]`` to ``(codes uint8 [O, row_bytes], scales)``, byte-identical to the reference.

    ``fmt_name`` is a format's stamp string (``int8-row``, ``int4-row``, ``int2-row``, ``int4-grouped`` with
    any ``gs``, ``int3-g64``, ``mxfp4``). The group-size writer rule is the caller's (the registry's) job.
    ``quantizer``: an encoder mode (``quantizers.MODES``; FORMATS §11) of a format with ``mse_scales``.
    Raises EncodeError naming the tensor and the first bad ``[o, i]`` for NaN/inf input. ``w`` may also hold
    BF16 or F16 values (``ml_dtypes.bfloat16``, ``float16``): read as their bits, upcast exactly."""
    w = np.asarray(w)
    fmt = registry.lookup(fmt_name)
    if quantizer != RTN or (fmt is not None and not fmt.pairs):  # an mse mode, or an affine format's own fit
        return _mse_encode(fmt_name, w, gs, name, quantizer)
    if w.dtype == _BF16:
        return encode_from_bf16(fmt_name, w, gs, name)
    if w.dtype == np.float16:
        return encode_from_f16(fmt_name, w, gs, name)
    if w.ndim == 2 and (_no_row_kernel(fmt_name) or _reference_encodes(fmt_name, w.size)):
        return _reference_checked(fmt_name, np.ascontiguousarray(w, dtype=F32), gs, name)
    from colitools.formats.kernels import encoders

    return _compiled_now(encoders.encode(fmt_name, w, gs, name=name))


def _mse_encode(fmt_name: str, w: np.ndarray, gs: int | None, name: str, quantizer: str):
    """``encode`` with an mse mode, or of an affine format in any mode: the reference's packing around the group
    search or fit, which runs on the kernel (``kernels/mse.py`` / ``kernels/affine.py``, byte-identical to
    ``quantizers.mse_groups`` / ``affine.fit_groups``; they refuse NaN / inf themselves) for a tensor of
    ``SMALL_ELEMS`` or more; an int4 tensor of whole groups (``mse.fits_int4``) packed by the kernel itself, from
    float32, BF16 or F16 values."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise EncodeError(f"tensor {name or '?'}: expected a 2-D weight, got shape {list(w.shape)}")
    cls = _writable(fmt_name, *w.shape, gs, name)
    if not cls.mse_scales:
        raise FormatError(f"tensor {name or '?'}: format {fmt_name} has no scales for quantizer {quantizer!r}")
    from colitools.formats.kernels import affine, mse

    int4_pairs = cls.pairs and cls.matmul_kind is registry.MatmulKind.INT4  # int4-row, int4-grouped
    n = (gs if cls.grouped else w.shape[1]) if int4_pairs else 0
    direct = quantizer != RTN and not _small(w.size) and mse.fits_int4(*w.shape, n)
    if not direct or w.dtype not in _DIRECT_MSE_DTYPES:
        w = np.ascontiguousarray(w, dtype=F32)
    if _small(w.size):  # below SMALL_ELEMS the numpy search (same bytes)
        registry._check_finite(w, name)
        return cls._encode_reference(w, gs, quantizer)
    try:  # the symmetric formats' scale search, or the affine formats' own fit (FORMATS §2.12)
        if direct:
            codes, s = mse.mse_int4(w, n, quantizers.signed(quantizer))
            return codes, s.reshape(cls.scale_grid(*w.shape, gs))
        return cls._encode_reference(w, gs, quantizer, mse.mse_groups if cls.pairs else affine.fit_groups)
    except mse._NonFiniteGroup:  # the kernel checks as it searches: the error names the first bad [o, i]
        registry._check_finite(np.asarray(w, dtype=F32), name)
        raise


_BF16 = np.dtype(ml_dtypes.bfloat16)
_DIRECT_MSE_DTYPES = (np.dtype(F32), _BF16, np.dtype(np.float16))  # mse.mse_int4's inputs


def encode_from_bf16(
    fmt_name: str, w_bf16: np.ndarray, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``encode(fmt_name, bf16 -> f32, gs)`` with the exact upcast fused in. ``w_bf16`` is ``[O, I]`` uint16
    (the raw BF16 bits) or ``ml_dtypes.bfloat16``."""
    wb = _matrix(w_bf16, np.uint16, ml_dtypes.bfloat16, name)
    if _no_row_kernel(fmt_name) or _reference_encodes(fmt_name, wb.size):
        return _reference_checked(fmt_name, wb.view(ml_dtypes.bfloat16).astype(F32), gs, name)
    from colitools.formats.kernels import encoders

    return _compiled_now(encoders.encode_from_bf16(fmt_name, wb, gs, name=name))


def encode_from_bf16_measured(
    fmt_name: str, w_bf16: np.ndarray, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``encode_from_bf16`` and, where its kernel encodes an int8-row / int4 tensor, the per-row error figures of
    what it wrote, taken as it writes them (``error_stats.from_rows`` sums them); None where it does not."""
    from colitools.formats.kernels import encoders

    wb = _matrix(w_bf16, np.uint16, ml_dtypes.bfloat16, name)
    if fmt_name not in encoders.MEASURED_FORMATS or wb.size == 0:
        return (*encode_from_bf16(fmt_name, wb, gs, name), None)
    if _reference_encodes(fmt_name, wb.size):
        return (*_reference_checked(fmt_name, wb.view(ml_dtypes.bfloat16).astype(F32), gs, name), None)
    return _compiled_now(encoders.encode_from_bf16_measured(fmt_name, wb, gs, name=name))


def encode_from_f16(
    fmt_name: str, w_f16: np.ndarray, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``encode(fmt_name, f16 -> f32, gs)`` with the exact upcast fused in. ``w_f16`` is ``[O, I]`` float16 or
    uint16 (the raw half bits)."""
    wh = _matrix(w_f16, np.uint16, np.float16, name)
    if _no_row_kernel(fmt_name) or _reference_encodes(fmt_name, wh.size):
        return _reference_checked(fmt_name, wh.view(np.float16).astype(F32), gs, name)
    from colitools.formats.kernels import encoders

    return _compiled_now(encoders.encode_from_f16(fmt_name, wh, gs, name=name))


def encode_from_fp8_block(
    fmt_name: str, q: np.ndarray, scale_inv: np.ndarray, block, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``encode(fmt_name, reference.dequant_fp8_block(q, scale_inv, block), gs)`` with the dequant fused in.

    ``q`` is ``[O, I]`` e4m3fn bytes (uint8 or ``ml_dtypes.float8_e4m3fn``), ``scale_inv`` F32/BF16
    ``[ceil(O/br), ceil(I/bc)]``, ``block`` an int or ``(br, bc)``."""
    qb, s, br, bc = _fp8_operands(q, scale_inv, block, name)
    if _small(qb.size) or _no_row_kernel(fmt_name):
        _writable(fmt_name, *qb.shape, gs, name)  # before the dequant, as the kernel path
        with np.errstate(all="ignore"):  # inf * 0 and overflow are refused just below, naming the tensor
            w = ref.dequant_fp8_block(qb, s, (br, bc))
        return _reference_checked(fmt_name, w, gs, name)
    from colitools.formats.kernels import encoders

    return _compiled_now(encoders.encode_from_fp8_block(fmt_name, qb, s, (br, bc), gs, name=name))


def encode_from_fp8_measured(
    fmt_name: str, q: np.ndarray, scale_inv: np.ndarray, block, gs: int | None, name: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``encode_from_fp8_block`` and, where its kernel encodes an int8-row / int4 tensor, the per-row error
    figures of what it wrote against the exact dequant, taken as it writes them; None where it does not."""
    from colitools.formats.kernels import encoders

    qb = _matrix(q, np.uint8, ml_dtypes.float8_e4m3fn, name)
    if fmt_name not in encoders.MEASURED_FORMATS or _small(qb.size):
        return (*encode_from_fp8_block(fmt_name, qb, scale_inv, block, gs, name), None)
    return _compiled_now(encoders.encode_from_fp8_measured(fmt_name, qb, scale_inv, block, gs, name=name))


def encode_fp8_e8m0(w: np.ndarray, name: str = "") -> tuple[np.ndarray, np.ndarray]:
    """fp8-e4m3-e8m0 of float32 ``w[O, I]`` (``reference.encode_fp8_e8m0``, byte-identical): the numpy
    reference below ``SMALL_ELEMS`` elements, else the kernel over block rows. NaN/inf: the registry's
    EncodeError naming the tensor and the first bad ``[o, i]``."""
    w = np.ascontiguousarray(w, dtype=F32)
    registry._check_finite(w, name)
    if _reference_encodes(registry.Fp8E4m3E8m0.name, w.size):
        return ref.encode_fp8_e8m0(w)
    from colitools.formats.kernels import encoders

    return _compiled_now(encoders.encode_fp8_e8m0(w, name))


def encode_from_fp8_e8m0(
    q: np.ndarray, scale_inv: np.ndarray, block, name: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``encode_fp8_e8m0(reference.dequant_fp8_block(q, scale_inv, block))``, byte-identical, with the errors
    of that path; the dequant fused into the block kernel when the source blocks' sides are multiples of 128
    (DeepSeek's 128x128: each output block has one source scale), else dequantised first."""
    qb, s, br, bc = _fp8_operands(q, scale_inv, block, name)
    B = ref.FP8_BLOCK
    if br % B or bc % B or _reference_encodes(registry.Fp8E4m3E8m0.name, qb.size):
        with np.errstate(all="ignore"):  # inf * 0 and overflow are refused just below, naming the tensor
            w = ref.dequant_fp8_block(qb, s, (br, bc))
        return encode_fp8_e8m0(w, name)
    from colitools.formats.kernels import encoders

    return _compiled_now(encoders.encode_from_fp8_e8m0(qb, s, br, bc, name))


def decode_operands(fmt_name: str, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None):
    """``(format class, codes, scales)`` checked and shaped for a decoder (the reference's and the kernels')."""
    cls = registry.lookup(fmt_name)
    if cls is None or cls.kernel_code is None:
        raise FormatError(f"no fast decoder for format {fmt_name!r}")
    if cls.grouped and not gs:
        raise FormatError(f"{fmt_name} decode needs the group size")
    c = np.ascontiguousarray(codes, dtype=np.uint8).reshape(cls.weight_shape(O, I, gs))
    s = np.ascontiguousarray(scales, dtype=cls.scale_numpy).reshape(cls.scale_grid(O, I, gs))
    return cls, c, s


def decode(
    fmt_name: str, codes: np.ndarray, scales: np.ndarray, O: int, I: int, gs: int | None = None
) -> np.ndarray:
    """Decode to float32 ``[O, I]``, bit-identical to the reference decoders (``fp8-e4m3-b128`` included)."""
    if O * I and _small(O * I):
        cls, c, s = decode_operands(fmt_name, codes, scales, O, I, gs)
        with np.errstate(all="ignore"):  # fp8: inf * 0 -> NaN without a warning, as the kernel
            return np.ascontiguousarray(cls.decode(c, s, O, I, gs), dtype=F32)
    from colitools.formats.kernels import decoders

    return decoders.decode(fmt_name, codes, scales, O, I, gs)


def dequant_fp8_block(q: np.ndarray, scale_inv: np.ndarray, block=(128, 128), *, name: str = "") -> np.ndarray:
    """Fast ``reference.dequant_fp8_block`` (bit-identical); a scale grid of the wrong size is an EncodeError
    naming tensor ``name``."""
    qb, s, br, bc = _fp8_operands(q, scale_inv, block, name)
    if _small(qb.size):
        with np.errstate(all="ignore"):  # as the kernel: inf * 0 -> NaN without a warning
            return np.ascontiguousarray(ref.dequant_fp8_block(qb, s, (br, bc)), dtype=F32)
    from colitools.formats.kernels import decoders

    return decoders.dequant_fp8_block(qb, s, (br, bc))


def pairs_to_planar(codes: np.ndarray) -> np.ndarray:
    """Fast ``planar.pairs_to_planar`` (byte-identical)."""
    if _small(2 * np.size(codes)):
        return planar.pairs_to_planar(codes)
    from colitools.formats.kernels import decoders

    return decoders.pairs_to_planar(codes)


def planar_to_pairs(codes: np.ndarray) -> np.ndarray:
    """Fast ``planar.planar_to_pairs`` (byte-identical)."""
    if _small(2 * np.size(codes)):
        return planar.planar_to_pairs(codes)
    from colitools.formats.kernels import decoders

    return decoders.planar_to_pairs(codes)


registry.set_fast_codecs(encode, encode_fp8_e8m0)  # Format.encode(fast=True) calls them (registry imports nothing here)
