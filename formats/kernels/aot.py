"""Kernels compiled ahead of time: every numba function the converter, ``verify`` and the runtime call
(``EXPORTS``: the row kernels of ``encoders``, ``decoders`` and ``source_decoders``, the runtime's matmul kernels
and its thread pool's polls), compiled once (``colitools kernels --build``, which ``./dev`` runs after
installing) into one extension module, so that a process neither imports numba nor loads its cache. numba's
load is ~0.5-0.6 s of every process that touches a kernel (its first compile ~12 CPU-s); finding and importing
the module takes 1-2 ms (docs/INTERNALS.md, "Kernels compiled ahead of time").

The module is numba's ``pycc`` output for the same Python functions the JIT compiles (``.py_func`` of each
kernel, their callees compiled with their own options), each with its own decorator's options (``nogil``: the
GIL is released for the call; the codecs' ``error_model="numpy"`` without fastmath; the matmuls' fastmath) and
for this machine's CPU (``target_cpu="host"``), so it runs the same code as the JIT (the property tests run on
both). Its name carries a stamp of everything that code depends on: the kernel sources, the registry and
reference the codecs read their constants from, the runtime modules that hold its constants, the CPU (vendor,
family, model, feature flags), the Python ABI and numpy's major version. A module built for other sources or
another CPU is simply not found: the JIT kernels serve, and ``status()`` says why. ``COLITOOLS_AOT=0`` turns
the module off. ``kernels()`` is what the numba-free callers (``_encode``, ``_decode``, the runtime's
``kernels`` and ``threads``) run.

This module imports numba only to build, or when it falls back to the JIT.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np

from colitools.formats.errors import KernelBuildError

_HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "_aot_kernels_"
# Everything the compiled code depends on: a change to any of them is another module. (package, file): found from
# the package's own directory (an editable checkout and a wheel lay them out apart).
_SOURCES = (
    *(("colitools.formats.kernels", f) for f in ("_bits.py", "_row_encoders.py", "encoders.py", "decoders.py",
                                                  "source_decoders.py", "aot.py")),
    ("colitools.formats", "reference.py"), ("colitools.formats", "registry.py"),
    *(("colitools", f"runtime/{f}") for f in ("_jit_kernels.py", "_jit_threads.py", "kernels.py", "threads.py")),
)  # fmt: skip


_SCALARS = {"i": "int64", "f": "float32", "b": "boolean"}  # Export.args' scalar tokens, as numba types


@dataclass(frozen=True)
class Export:
    """One exported kernel: its module and function, its arguments, each the numpy dtype of a C-contiguous 2-D
    array (``"float32"``) or 1-D array (``"float32[]"``: decode tables, flag cells), ``"i"`` an int64, ``"f"`` a
    float32, ``"b"`` a bool; ``rows``: two int64 row bounds ``r0, r1`` follow; what it returns (numba's name)."""

    module: str
    function: str
    args: tuple[str, ...]
    returns: str = "int64"
    rows: bool = True

    @property
    def signature(self) -> str:
        """numba's signature string (numba's type names are numpy's dtype names)."""

        def one(a: str) -> str:
            if a in _SCALARS:
                return _SCALARS[a]
            return f"{a[:-2]}[::1]" if a.endswith("[]") else f"{a}[:, ::1]"

        args = (*self.args, "i", "i") if self.rows else self.args
        return f"{self.returns}({', '.join(one(a) for a in args)})"


_F, _U8, _T = "float32", "uint8", "float32[]"
_ENC, _DEC, _SRC = (f"colitools.formats.kernels.{m}" for m in ("encoders", "decoders", "source_decoders"))
_RT, _TH = "colitools.runtime._jit_kernels", "colitools.runtime._jit_threads"
EXPORTS = {
    # encoders.py: the encode drivers per source
    "rows_f32": Export(_ENC, "_encode_rows_f32", (_F, "i", "i", _U8, _F, _U8)),
    "rows_bf16": Export(_ENC, "_encode_rows_bf16", ("uint16", "i", "i", _U8, _F, _U8)),
    "rows_fp8": Export(_ENC, "_encode_rows_fp8", (_U8, _F, "i", "i", "i", "i", _U8, _F, _U8)),
    "fp8_e8m0": Export(_ENC, "_fp8_e8m0_blocks", (_F, _U8, _U8)),
    # decoders.py: the container formats back to float32, FP8 dequant, the planar64 reorder
    "decode_int8": Export(_DEC, "_decode_int8_rows", ("int8", _T, _F)),
    "decode_int4": Export(_DEC, "_decode_int4_rows", (_U8, _F, _F, "i")),
    "decode_int2": Export(_DEC, "_decode_int2_rows", (_U8, _T, _F)),
    "decode_int3": Export(_DEC, "_decode_int3_rows", (_U8, _F, _F)),
    "decode_mxfp4": Export(_DEC, "_decode_mxfp4_rows", (_U8, _U8, _T, _T, _F)),
    "dequant_fp8": Export(_DEC, "_dequant_fp8_rows", (_U8, _F, "i", "i", _F)),
    "planar_reorder": Export(_DEC, "_pairs_planar_rows", (_U8, _U8, "b")),
    # source_decoders.py: natively quantized sources to float32
    "src_nib_scaled": Export(_SRC, "_nib_scaled_rows", (_U8, _U8, _T, _T, "i", _F)),
    "src_int4": Export(_SRC, "_int4_rows", (_U8, _F, "i", _F)),
    "src_nvfp4": Export(_SRC, "_nvfp4_rows", (_U8, _U8, _T, _T, "f", _F)),
    "src_mxfp8": Export(_SRC, "_mxfp8_rows", (_U8, _U8, _T, _T, _F)),
    # the runtime's matmul kernels (colitools/runtime/kernels.py runs them)
    "rt_int4_prep": Export(_RT, "_int4_prep", (_F, "i", "i", "i", "b", _F, _F, _F), "void", rows=False),
    "rt_int4": Export(_RT, "_int4", (_U8, _F, _F, _F, _F, _F, "i"), "void"),
    "rt_int4_g64": Export(_RT, "_int4_g64", (_U8, _F, _F, _F, _F, _F), "void"),
    "rt_int3_g64": Export(_RT, "_int3_g64", (_U8, _F, _F, _F, _F), "void"),
    "rt_mxfp4": Export(_RT, "_mxfp4", (_U8, _U8, _F, _F, _F, _T, _T), "void"),
    "rt_fp8_b128": Export(_RT, "_fp8_b128", (_U8, _F, _F, _F, _T), "void"),
    "rt_int8_row": Export(_RT, "_int8_row", ("int8", _T, _F, _F), "void"),
    "rt_int2_row": Export(_RT, "_int2_row", (_U8, _T, _F, _F, _F), "void"),
    "rt_f32": Export(_RT, "_f32_rows", (_F, _F, _F), "void"),
    # the runtime thread pool's polls on its int64 flag cells (colitools/runtime/threads.py)
    "th_reach": Export(_TH, "_reach", ("int64[]", "i", "i", "i"), rows=False),
    "th_next_post": Export(_TH, "_next_post", ("int64[]", "i", "i", "i"), rows=False),
    "th_take": Export(_TH, "_take", ("int64[]", "i"), "boolean", rows=False),
    "th_finish_and_poll": Export(_TH, "_finish_and_poll", ("int64[]", "i", "i", "i"), rows=False),
    "th_set": Export(_TH, "_set", ("int64[]", "i", "i"), "void", rows=False),
    "th_set_then_read": Export(_TH, "_set_then_read", ("int64[]", "i", "i", "i"), rows=False),
}

_LOADED: dict[str, object] = {}
_KERNELS: dict[str, Kernels] = {}


class Kernels:
    """Every kernel of ``EXPORTS`` by its export name, from one source: the compiled-ahead module, or numba's JIT
    functions (``ahead`` says which)."""

    def __init__(self, source: dict[str, object], ahead: bool):
        self.__dict__.update(source)
        self.ahead = ahead


def jit_kernels() -> Kernels:
    """numba's JIT functions (imports numba and the kernel modules; compiles nothing yet)."""
    modules = {m: importlib.import_module(m) for m in {e.module for e in EXPORTS.values()}}
    return Kernels({n: getattr(modules[e.module], e.function) for n, e in EXPORTS.items()}, False)


def ahead_kernels(module) -> Kernels:
    """The functions of a compiled-ahead module (``load()``)."""
    return Kernels({n: getattr(module, n) for n in EXPORTS}, True)


def kernels() -> Kernels:
    """The compiled-ahead kernels when ``load()`` finds them built for these sources on this CPU, else numba's
    JIT ones (numba imported here, on the first large tensor). Resolved once per process."""
    k = _KERNELS.get("k")
    if k is None:
        module = load()
        k = _KERNELS["k"] = jit_kernels() if module is None else ahead_kernels(module)
    return k


def run(export: str, args: tuple, O: int, I: int) -> int:
    """``_threads._run_rows`` of one kernel over ``O`` rows of ``I`` elements: the smallest bad row or -1. The
    compiled-ahead functions trust their arguments' types as C functions do (numba's dispatcher checks them),
    so their arrays are checked first (``check_args``), once per tensor."""
    from colitools.formats.kernels._threads import _run_rows

    k = kernels()
    if k.ahead:
        args = check_args(export, args)
    return _run_rows(getattr(k, export), args, O, I)


def check_args(export: str, args: tuple) -> tuple:
    """``args`` as the compiled signature describes them, or TypeError: numba's dispatcher would pick or
    compile another version; a compiled-ahead function reads the memory as its signature says. The callers
    pass C-contiguous arrays of the right dtypes; an unaligned input view (a safetensors shard at an odd
    offset), which the JIT types differently, is copied (the outputs are the callers' own ``np.empty``)."""
    out = list(args)
    for k, (want, a) in enumerate(zip(EXPORTS[export].args, args, strict=True)):
        if want in _SCALARS:
            continue
        ndim, dtype = (1, want[:-2]) if want.endswith("[]") else (2, want)
        if not (type(a) is np.ndarray and a.ndim == ndim and a.dtype.name == dtype and a.flags.c_contiguous):
            raise TypeError(
                f"compiled-ahead kernel {export}: argument {k} is {getattr(a, 'dtype', type(a).__name__)} "
                f"{list(getattr(a, 'shape', []))}, expected a {ndim}-D C-contiguous {dtype} array"
            )
        if not a.flags.aligned:
            out[k] = a.copy()
    return tuple(out)


def _cpu() -> str:
    """What the code generated for ``host`` depends on: on Linux the first processor's vendor, family, model
    and feature flags (/proc/cpuinfo, ~0.1 ms); elsewhere LLVM's own host CPU name and features."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            first = f.read(1 << 16).split("\n\n", 1)[0]
        keep = [
            line.split(":", 1)[1].strip()
            for line in first.splitlines()
            if line.split(":", 1)[0].strip() in ("vendor_id", "cpu family", "model", "flags")
        ]
        if len(keep) == 4:
            return f"{platform.machine()} {' | '.join(keep)}"
    except OSError:
        pass
    import llvmlite.binding as llvm

    return f"{platform.machine()} {llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}"


def _package_dir(package: str) -> str:
    """A package's directory (this one: ``_HERE``), without importing anything new (the packages named in
    ``_SOURCES`` are imported before this module is)."""
    if package == __package__:
        return _HERE
    return os.path.dirname(os.path.abspath(sys.modules[package].__file__))


def stamp() -> str:
    """16 hex digits of sha256 over the sources, the CPU, the Python ABI and numpy's major version."""
    h = hashlib.sha256()
    for package, rel in _SOURCES:
        with open(os.path.join(_package_dir(package), rel), "rb") as f:
            h.update(f.read())
    h.update(f"\0{_cpu()}\0{sys.implementation.cache_tag}\0{np.__version__.split('.')[0]}".encode())
    return h.hexdigest()[:16]


def module_name() -> str:
    return PREFIX + stamp()


def user_dir() -> str:
    """Where the module is built when the package's directory is not writable (a system-wide install):
    ``$XDG_CACHE_HOME/colitools/kernels``, else ``~/.cache/colitools/kernels``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "colitools", "kernels")


def search_dirs() -> list[str]:
    """Where ``load`` looks, in order: this package's directory, then ``user_dir()``."""
    return [_HERE, user_dir()]


def default_dest() -> str:
    """Where ``build`` writes: this package's directory when it is writable, else ``user_dir()``."""
    return _HERE if os.access(_HERE, os.W_OK) else user_dir()


def built_files(dest: str | None = None) -> list[str]:
    """The compiled-ahead modules present in ``dest`` (default: every ``search_dirs()``), current or stale."""
    dirs = search_dirs() if dest is None else [dest]
    return [p for d in dirs for p in sorted(glob.glob(os.path.join(d, PREFIX + "*")))]


def current(dest: str | None = None, name: str | None = None) -> str | None:
    """The module built for these sources on this CPU and this Python (its extension suffix) in ``dest``
    (default: the first of ``search_dirs()`` that has one), or None. ``name``: ``module_name()`` if known."""
    name = name or module_name()
    wanted = {name + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES}
    return next((p for p in built_files(dest) if os.path.basename(p) in wanted), None)


def load():
    """The compiled-ahead module for these sources on this CPU, or None (``status()["reason"]`` says why).
    Once per process."""
    if "module" not in _LOADED:
        module, reason = None, ""
        if os.environ.get("COLITOOLS_AOT", "").strip() == "0":
            reason = "turned off (COLITOOLS_AOT=0)"
        elif (path := current(name=(name := module_name()))) is None:
            reason = f"not built for these sources on this CPU ({name}; `colitools kernels --build`)"
        else:
            try:
                spec = importlib.util.spec_from_file_location(f"{__package__}.{name}", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            except ImportError as e:  # built, but does not load here (a damaged file, a missing library)
                module, reason = None, f"{path} does not load: {' '.join(str(e).split())}"
        _LOADED.update(module=module, reason=reason)
    return _LOADED["module"]


def status() -> dict:
    """Whether the kernels run compiled ahead of time in this process, and from which file or why not."""
    module = load()
    return {
        "loaded": module is not None,
        "module": module_name(),
        "file": getattr(module, "__file__", None),
        "reason": _LOADED["reason"],
        "built": built_files(),
        "kernels": sorted(EXPORTS),
    }


@contextlib.contextmanager
def _jit_flags(options: dict):
    """pycc compiles every exported function with one ``Flags()`` of its own: give each the options of its own
    numba decorator instead (``options``: py_func -> the dispatcher's ``targetoptions``: ``nogil`` releases the
    GIL, ``fastmath``, ``error_model`` ...), parsed as numba's JIT parses them, as ``cc.export`` has no way to."""
    from numba.core.cpu import CPUTargetOptions
    from numba.pycc import compiler

    base = compiler.compile_extra

    def compile_extra(typingctx, targetctx, func, args, return_type, flags, locals, **kwargs):
        flags = flags.copy()
        CPUTargetOptions.parse_as_flags(flags, options[func])
        return base(typingctx, targetctx, func, args, return_type, flags, locals, **kwargs)

    compiler.compile_extra = compile_extra
    try:
        yield
    finally:
        compiler.compile_extra = base


def _remove_dead_builds(dest: str) -> None:
    """The temporary directories of builds whose process is gone (killed mid-build); a live one is left."""
    for path in glob.glob(os.path.join(dest, ".aot-build-*")):
        try:
            pid = int(os.path.basename(path).split("-")[2])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            continue


def build(dest: str | None = None, *, verbose: bool = False) -> str:
    """Compile the kernels for this machine into ``dest`` (default: ``default_dest()``) and return the module's
    path.
    Written under a temporary name and renamed, so a killed build leaves no module under a final name; older
    modules of the same prefix are removed after. Needs numba and a C compiler (~10-20 s on 2 cores)."""
    if dest is None:
        dest = default_dest()
        with contextlib.suppress(OSError):
            os.makedirs(dest, exist_ok=True)
    if not os.path.isdir(dest) or not os.access(dest, os.W_OK):
        raise KernelBuildError(f"cannot build the compiled-ahead kernels: {dest} is not a writable directory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending-deprecation notice: it is still numba's AOT compiler
        try:
            from numba.pycc import CC
        except ImportError as e:  # a numba without pycc (announced for removal)
            raise KernelBuildError(
                f"cannot build the compiled-ahead kernels: {e}; conversions use numba's JIT kernels instead"
            ) from e

    name = module_name()
    _remove_dead_builds(dest)
    tmp = tempfile.mkdtemp(prefix=f".aot-build-{os.getpid()}-", dir=dest)
    try:
        cc = CC(name)
        cc.output_dir = tmp
        cc.target_cpu = "host"
        cc.verbose = verbose
        options = {}
        for export, spec in EXPORTS.items():
            dispatcher = getattr(importlib.import_module(spec.module), spec.function)
            options[dispatcher.py_func] = dispatcher.targetoptions
            cc.export(export, spec.signature)(dispatcher.py_func)
        try:
            with _jit_flags(options), open(os.devnull, "w") as quiet, \
                    contextlib.redirect_stdout(sys.stderr if verbose else quiet):
                cc.compile()
        except Exception as e:  # a missing C compiler / Python headers (distutils' errors), LLVM's
            raise KernelBuildError(
                f"building the compiled-ahead kernels failed ({type(e).__name__}: {' '.join(str(e).split())}); "
                "conversions use numba's JIT kernels instead (the same bytes)"
            ) from e
        (built,) = glob.glob(os.path.join(tmp, name + "*"))
        final = os.path.join(dest, os.path.basename(built))
        os.replace(built, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in built_files(dest):
        if os.path.basename(old) != os.path.basename(final):
            with contextlib.suppress(OSError):
                os.unlink(old)
    _LOADED.clear()
    _KERNELS.clear()
    importlib.invalidate_caches()
    return final
