"""The encode drivers compiled ahead of time: the numba drivers of ``encoders``, compiled once (at install, or by
``colitools kernels --build``) into an extension module of this package, so that a conversion neither imports
numba nor loads its cache. numba's load is ~0.5-0.6 s of every process that encodes a large tensor; the module
imports in under a millisecond (docs/INTERNALS.md, "Kernels compiled ahead of time").

The module is numba's ``pycc`` output for the same Python functions the JIT compiles (``.py_func`` of each
driver, their callees compiled with their own options), with the JIT's flags (``nogil``: the GIL is released
for the call; ``error_model="numpy"``; no fastmath) and for this machine's CPU (``target_cpu="host"``), so it
gives the same bytes as the JIT and as the numpy reference (tests/formats/test_aot.py). Its name carries a
stamp of everything its code depends on: the kernel sources, the registry and reference they read their
constants from, the CPU (vendor, family, model, feature flags), the Python ABI and numpy's major version. A
module built for other sources or another CPU is simply not found: the JIT drivers serve (same bytes), and
``status()`` says why. ``COLITOOLS_AOT=0`` turns the module off.

This module imports numba only to build.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import os
import platform
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np

from colitools.formats.errors import ColitoolsError

_HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "_aot_encoders_"
# Everything the compiled code depends on, relative to this package: a change to any of them is another module.
_SOURCES = ("_bits.py", "_row_encoders.py", "encoders.py", "aot.py", "../reference.py", "../registry.py")


class KernelBuildError(ColitoolsError):
    """The compiled-ahead module could not be built (the JIT kernels still serve)."""


@dataclass(frozen=True)
class Export:
    """One exported driver: its function in ``encoders`` and its arguments before ``r0, r1``, each the numpy
    dtype of a 2-D C-contiguous array or ``"i"`` for an int64."""

    driver: str
    args: tuple[str, ...]

    @property
    def signature(self) -> str:
        """numba's signature string (numba's type names are numpy's dtype names)."""
        args = ["int64" if a == "i" else f"{a}[:, ::1]" for a in (*self.args, "i", "i")]
        return f"int64({', '.join(args)})"


EXPORTS = {
    "rows_f32": Export("_encode_rows_f32", ("float32", "i", "i", "uint8", "float32", "uint8")),
    "rows_bf16": Export("_encode_rows_bf16", ("uint16", "i", "i", "uint8", "float32", "uint8")),
    "rows_fp8": Export("_encode_rows_fp8", ("uint8", "float32", "i", "i", "i", "i", "uint8", "float32", "uint8")),
    "fp8_e8m0": Export("_fp8_e8m0_blocks", ("float32", "uint8", "uint8")),
}

_LOADED: dict[str, object] = {}


def check_args(export: str, args: tuple) -> tuple:
    """``args`` as the compiled signature describes them, or TypeError: numba's dispatcher would pick or
    compile another version; a compiled-ahead function reads the memory as its signature says. The encoders
    pass C-contiguous arrays of the right dtypes; an unaligned input view (a safetensors shard at an odd
    offset), which the JIT types differently, is copied (the outputs are the encoders' own ``np.empty``)."""
    out = list(args)
    for k, (want, a) in enumerate(zip(EXPORTS[export].args, args, strict=False)):
        if want == "i":
            continue
        if not (type(a) is np.ndarray and a.ndim == 2 and a.dtype.name == want and a.flags.c_contiguous):
            raise TypeError(
                f"compiled-ahead driver {export}: argument {k} is {getattr(a, 'dtype', type(a).__name__)} "
                f"{list(getattr(a, 'shape', []))}, expected a 2-D C-contiguous {want} array"
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


def stamp() -> str:
    """16 hex digits of sha256 over the sources, the CPU, the Python ABI and numpy's major version."""
    h = hashlib.sha256()
    for rel in _SOURCES:
        with open(os.path.join(_HERE, rel), "rb") as f:
            h.update(f.read())
    h.update(f"\0{_cpu()}\0{sys.implementation.cache_tag}\0{np.__version__.split('.')[0]}".encode())
    return h.hexdigest()[:16]


def module_name() -> str:
    return PREFIX + stamp()


def load():
    """The compiled-ahead module for these sources on this CPU, or None (``status()["reason"]`` says why).
    Once per process."""
    if "module" not in _LOADED:
        module, reason = None, ""
        if os.environ.get("COLITOOLS_AOT", "").strip() == "0":
            reason = "turned off (COLITOOLS_AOT=0)"
        else:
            name = module_name()
            try:
                module = importlib.import_module(f"{__package__}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{__package__}.{name}":
                    raise
                reason = f"not built for these sources on this CPU ({name}; `colitools kernels --build`)"
            except ImportError as e:  # built, but does not load here (a damaged file, a missing library)
                reason = f"{name} does not load: {e}"
        _LOADED.update(module=module, reason=reason)
    return _LOADED["module"]


def built_files(dest: str = _HERE) -> list[str]:
    """The compiled-ahead modules present in ``dest``, current or stale."""
    return sorted(glob.glob(os.path.join(dest, PREFIX + "*")))


def status() -> dict:
    """Whether the encoders run compiled ahead of time in this process, and from which file or why not."""
    module = load()
    return {
        "loaded": module is not None,
        "module": module_name(),
        "file": getattr(module, "__file__", None),
        "reason": _LOADED["reason"],
        "built": [os.path.basename(p) for p in built_files()],
        "drivers": sorted(EXPORTS),
    }


@contextlib.contextmanager
def _jit_flags():
    """pycc compiles the exported functions with ``Flags()`` of its own: give them the JIT's options
    (``_bits._JIT``) that change generated code, as numba's ``cc.export`` has no way to say so."""
    from numba.pycc import compiler

    base = compiler.Flags

    class Flags(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True  # nogil=True
            self.error_model = "numpy"

    compiler.Flags = Flags
    try:
        yield
    finally:
        compiler.Flags = base


def current(dest: str = _HERE) -> str | None:
    """The path of the module built for these sources on this CPU in ``dest``, or None."""
    name = module_name()
    return next((p for p in built_files(dest) if os.path.basename(p).split(".", 1)[0] == name), None)


def build(dest: str = _HERE, *, verbose: bool = False) -> str:
    """Compile the drivers for this machine into ``dest`` (default: this package) and return the module's path.
    Written under a temporary name and renamed, so a killed build leaves no module under a final name; older
    modules of the same prefix are removed after. Needs numba and a C compiler (~30-60 s on 2 cores)."""
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

    from colitools.formats.kernels import encoders

    name = module_name()
    tmp = tempfile.mkdtemp(prefix=".aot-build-", dir=dest)
    try:
        cc = CC(name)
        cc.output_dir = tmp
        cc.target_cpu = "host"
        cc.verbose = verbose
        for export, spec in EXPORTS.items():
            cc.export(export, spec.signature)(getattr(encoders, spec.driver).py_func)
        try:
            with _jit_flags(), open(os.devnull, "w") as quiet, contextlib.redirect_stdout(sys.stderr if verbose else quiet):
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
    importlib.invalidate_caches()
    return final
