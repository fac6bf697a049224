"""Kernels compiled ahead of time. Every numba function a numba-free module calls is registered beside its
``@njit`` with the arguments it is compiled for (``@export(name, args)``, in a ``_jit_*`` module); the functions
of one package form a ``KernelSet`` (``CODECS`` below: the codecs and the thread pool's polls of
``formats/kernels``; the runtime declares its matmul kernels as its own set, ``colitools/runtime/kernels.py``,
registering downward: nothing here names it). ``colitools kernels --build`` (run by ``./dev`` after installing)
compiles each set once into one extension module, so that a process neither imports numba nor loads its cache:
numba's load is ~0.5-0.6 s of every process that touches a kernel (its first compile ~12 CPU-s); finding and
importing a module takes 1-2 ms (docs/INTERNALS.md, "Kernels compiled ahead of time").

A module is numba's ``pycc`` output for the same Python functions the JIT compiles (``.py_func`` of each
kernel, their callees compiled with their own options), each with its own decorator's options (``nogil``: the
GIL is released for the call; the codecs' ``error_model="numpy"`` without fastmath; the matmuls' fastmath) and
for this machine's CPU (``target_cpu="host"``), so it runs the same code as the JIT (the property tests run on
both). It carries its own export table (``_export_table``), so a process that loads it knows every signature
without importing the ``_jit_*`` modules. Its name carries a stamp of everything that code depends on: the
set's ``_jit_*`` sources, the numba-free modules they read constants from, this file, the CPU (vendor, family,
model, feature flags), the Python ABI and numpy's major version. A module built for other sources or another
CPU is simply not found: the JIT kernels serve, and ``status()`` says why. ``COLITOOLS_AOT=0`` turns the
modules off.

This module imports numba only to build, or when a set falls back to the JIT.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from colitools.formats.errors import KernelBuildError

_HERE = os.path.dirname(os.path.abspath(__file__))
_SCALARS = {"i": "int64", "f": "float32", "b": "boolean"}  # Export.args' scalar tokens, as numba types
_TABLE_FUNCTION = "_export_table"  # a compiled module's own export table (JSON bytes)


@dataclass(frozen=True)
class Export:
    """One exported kernel: its arguments, each the numpy dtype of a C-contiguous 2-D array (``"float32"``) or
    1-D array (``"float32[]"``: decode tables, flag cells), ``"i"`` an int64, ``"f"`` a float32, ``"b"`` a
    bool; ``rows``: two int64 row bounds ``r0, r1`` follow; what it returns (numba's name)."""

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


_REGISTERED: dict[str, dict[str, tuple[Export, object]]] = {}  # module -> export name -> (Export, dispatcher)


def export(name: str, args: Iterable[str], returns: str = "int64", *, rows: bool = True):
    """Decorator over a numba dispatcher (``@export(...)`` above ``@njit``): compile it ahead of time as ``name``
    with these arguments (``Export``). The kernel set of its package finds it when it imports the module."""
    spec = Export(tuple(args), returns, rows)

    def register(dispatcher):
        table = _REGISTERED.setdefault(dispatcher.py_func.__module__, {})
        if name in table:
            raise ValueError(f"kernel export {name!r} registered twice in {dispatcher.py_func.__module__}")
        table[name] = (spec, dispatcher)
        return dispatcher

    return register


class Kernels:
    """Every kernel of a set by its export name, from one source: the compiled-ahead module, or numba's JIT
    functions (``ahead`` says which)."""

    def __init__(self, source: dict[str, object], ahead: bool):
        self.__dict__.update(source)
        self.ahead = ahead


SETS: dict[str, KernelSet] = {}  # every set declared in this process, by name


class KernelSet:
    """The exported numba functions of one package, compiled ahead of time into one module
    ``_aot_<name>_<stamp>`` in the package's directory (``anchor``: a file of it; a read-only install:
    ``user_dir()``).

    ``jit_modules`` imports and returns the package's ``_jit_*`` modules (numba); ``constants`` names, relative to
    the package's directory, the numba-free files their compiled code reads constants from. The stamp hashes
    every ``_jit_*.py`` of the directory, ``constants`` and this file: an edit to any of them is another module."""

    def __init__(self, name: str, anchor: str, jit_modules: Callable[[], Iterable[ModuleType]], constants=()):
        self.name, self.home = name, os.path.dirname(os.path.abspath(anchor))
        self.prefix = f"_aot_{name}_"
        self._jit_modules, self.constants = jit_modules, tuple(constants)
        self._loaded: dict[str, object] = {}  # "module", "reason", "table"
        self._kernels: Kernels | None = None
        SETS[name] = self

    # ------------------------------------------------------------------------------------------- the kernels
    def exports(self) -> dict[str, tuple[Export, object]]:
        """export name -> (``Export``, numba dispatcher) of every registered function (imports numba)."""
        found: dict[str, tuple[Export, object]] = {}
        for module in self._jit_modules():
            for name, entry in _REGISTERED.get(module.__name__, {}).items():
                if name in found:
                    raise ValueError(f"kernel export {name!r} registered twice in set {self.name}")
                found[name] = entry
        return found

    def jit_kernels(self) -> Kernels:
        """numba's JIT functions (imports numba and the kernel modules; compiles nothing yet)."""
        return Kernels({n: d for n, (_, d) in self.exports().items()}, False)

    def ahead_kernels(self, module: ModuleType) -> Kernels:
        """The functions of a compiled-ahead module (``load()``), by its own export table."""
        return Kernels({n: getattr(module, n) for n in export_table(module)}, True)

    def kernels(self) -> Kernels:
        """The compiled-ahead kernels when ``load()`` finds them built for these sources on this CPU, else numba's
        JIT ones (numba imported here, on the first use). Resolved once per process."""
        if self._kernels is None:
            module = self.load()
            self._kernels = self.jit_kernels() if module is None else self.ahead_kernels(module)
        return self._kernels

    def run(self, export: str, args: tuple, O: int, I: int) -> int:
        """``threads.run_rows`` of one kernel over ``O`` rows of ``I`` elements: the smallest bad row or -1. The
        compiled-ahead functions trust their arguments' types as C functions do (numba's dispatcher checks
        them), so their arrays are checked first (``check_args``), once per call."""
        from colitools.formats.kernels.threads import run_rows  # the pool itself runs on CODECS' polls

        k = self.kernels()
        if k.ahead:
            args = self.check_args(export, args)
        return run_rows(getattr(k, export), args, O, I)

    def check_args(self, export: str, args: tuple) -> tuple:
        """``args`` as the compiled signature describes them, or TypeError: numba's dispatcher would pick or
        compile another version; a compiled-ahead function reads the memory as its signature says. The callers
        pass C-contiguous arrays of the right dtypes; an unaligned input view (a safetensors shard at an odd
        offset), which the JIT types differently, is copied (the outputs are the callers' own ``np.empty``)."""
        module = self.load()
        wanted = export_table(module)[export].args if module is not None else self.exports()[export][0].args
        return check_args(export, wanted, args)

    # ------------------------------------------------------------------------------------- finding a module
    def sources(self) -> list[str]:
        """The files the compiled code depends on: the set's ``_jit_*.py``, its ``constants``, this file."""
        jit = sorted(glob.glob(os.path.join(self.home, "_jit_*.py")))
        return [*jit, *(os.path.normpath(os.path.join(self.home, c)) for c in self.constants), __file__]

    def stamp(self) -> str:
        """16 hex digits of sha256 over the sources, the CPU, the Python ABI and numpy's major version."""
        h = hashlib.sha256()
        for path in self.sources():
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(f"\0{_cpu()}\0{sys.implementation.cache_tag}\0{np.__version__.split('.')[0]}".encode())
        return h.hexdigest()[:16]

    def module_name(self) -> str:
        return self.prefix + self.stamp()

    def search_dirs(self) -> list[str]:
        """Where ``load`` looks, in order: the package's directory, then ``user_dir()``."""
        return [self.home, user_dir()]

    def default_dest(self) -> str:
        """Where ``build`` writes: the package's directory when it is writable, else ``user_dir()``."""
        return self.home if os.access(self.home, os.W_OK) else user_dir()

    def built_files(self, dest: str | None = None) -> list[str]:
        """This set's compiled modules in ``dest`` (default: every ``search_dirs()``), current or stale."""
        dirs = self.search_dirs() if dest is None else [dest]
        return [p for d in dirs for p in sorted(glob.glob(os.path.join(d, self.prefix + "*")))]

    def current(self, dest: str | None = None, name: str | None = None) -> str | None:
        """The module built for these sources on this CPU and this Python (its extension suffix) in ``dest``
        (default: the first of ``search_dirs()`` that has one), or None. ``name``: ``module_name()`` if known."""
        name = name or self.module_name()
        wanted = {name + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES}
        return next((p for p in self.built_files(dest) if os.path.basename(p) in wanted), None)

    def load(self) -> ModuleType | None:
        """The compiled-ahead module for these sources on this CPU, or None (``status()["reason"]`` says why).
        Once per process."""
        if "module" not in self._loaded:
            module, reason = None, ""
            if os.environ.get("COLITOOLS_AOT", "").strip() == "0":
                reason = "turned off (COLITOOLS_AOT=0)"
            elif (path := self.current(name=(name := self.module_name()))) is None:
                reason = f"not built for these sources on this CPU ({name}; `colitools kernels --build`)"
            else:
                module, reason = _import_module(name, path)
            self._loaded.update(module=module, reason=reason)
        return self._loaded["module"]

    def status(self) -> dict:
        """Whether this set runs compiled ahead of time in this process, and from which file or why not."""
        module = self.load()
        return {
            "set": self.name,
            "loaded": module is not None,
            "module": self.module_name(),
            "file": getattr(module, "__file__", None),
            "reason": self._loaded["reason"],
            "built": self.built_files(),
            "kernels": sorted(export_table(module) if module is not None else self.exports()),
        }

    def forget(self) -> None:
        """Resolve the module and the kernels again on next use (after a build)."""
        self._loaded.clear()
        self._kernels = None

    # ------------------------------------------------------------------------------------------------ build
    def build(self, dest: str | None = None, *, verbose: bool = False) -> str:
        """Compile the set's kernels for this machine into ``dest`` (default: ``default_dest()``) and return the
        module's path. Written under a temporary name and renamed, so a killed build leaves no module under a
        final name; older modules of this set are removed after. Needs numba and a C compiler (~10-20 s)."""
        if dest is None:
            dest = self.default_dest()
            with contextlib.suppress(OSError):
                os.makedirs(dest, exist_ok=True)
        if not os.path.isdir(dest) or not os.access(dest, os.W_OK):
            raise KernelBuildError(
                f"cannot build the compiled-ahead kernels: {dest} is not a writable directory"
            )
        name = self.module_name()
        _remove_dead_builds(dest)
        tmp = tempfile.mkdtemp(prefix=f".aot-build-{os.getpid()}-", dir=dest)
        try:
            built = _compile(name, self.exports(), tmp, verbose)
            final = os.path.join(dest, os.path.basename(built))
            os.replace(built, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for old in self.built_files(dest):
            if os.path.basename(old) != os.path.basename(final):
                with contextlib.suppress(OSError):
                    os.unlink(old)
        self.forget()
        importlib.invalidate_caches()
        return final


def check_args(export: str, wanted: tuple[str, ...], args: tuple) -> tuple:
    """``KernelSet.check_args`` against the argument tokens ``wanted`` (``Export.args``)."""
    out = list(args)
    for k, (want, a) in enumerate(zip(wanted, args, strict=True)):
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


def export_table(module: ModuleType) -> dict[str, Export]:
    """A compiled module's exports as it was built (its ``_export_table`` function: JSON bytes), read once."""
    table = getattr(module, "__colitools_exports__", None)
    if table is None:
        read = getattr(module, _TABLE_FUNCTION)
        buf = np.empty(read(np.empty(0, np.uint8)), np.uint8)
        read(buf)
        raw = json.loads(buf.tobytes())
        table = {n: Export(tuple(e["args"]), e["returns"], e["rows"]) for n, e in raw.items()}
        module.__colitools_exports__ = table
    return table


def _import_module(name: str, path: str) -> tuple[ModuleType | None, str]:
    """The extension module at ``path`` with its export table, or None and why it does not load."""
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        export_table(module)
        return module, ""
    except (ImportError, AttributeError, ValueError) as e:  # damaged, foreign, a missing library, no table
        return None, f"{path} does not load: {' '.join(str(e).split())}"


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


def user_dir() -> str:
    """Where a module is built when its package's directory is not writable (a system-wide install):
    ``$XDG_CACHE_HOME/colitools/kernels``, else ``~/.cache/colitools/kernels``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "colitools", "kernels")


def kernel_sets() -> list[KernelSet]:
    """The sets declared in this process (``CODECS``; the runtime's once ``colitools.runtime.kernels`` is
    imported)."""
    return list(SETS.values())


def status() -> dict:
    """``{"loaded": every set loaded, "sets": [KernelSet.status() of each]}``."""
    sets = [s.status() for s in kernel_sets()]
    return {"loaded": all(s["loaded"] for s in sets), "sets": sets}


def build_missing(*, force: bool = False) -> list[dict]:
    """Build every declared set that has no module for these sources on this CPU (every set with ``force``):
    ``[{"set", "file", "seconds"}]`` of those built."""
    built = []
    for kset in kernel_sets():
        if force or kset.current() is None:
            started = time.monotonic()
            path = kset.build()
            built.append({"set": kset.name, "file": path, "seconds": round(time.monotonic() - started, 1)})
    return built


# --------------------------------------------------------------------------------------------- building
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
        CPUTargetOptions.parse_as_flags(flags, options.get(func, {}))
        return base(typingctx, targetctx, func, args, return_type, flags, locals, **kwargs)

    compiler.compile_extra = compile_extra
    try:
        yield
    finally:
        compiler.compile_extra = base


def _table_function(exports: dict[str, tuple[Export, object]]):
    """The module's ``_export_table(out: uint8[::1]) -> int64``: the JSON of every export's ``Export``, written
    into ``out`` when it is large enough; the byte count (a read with an empty ``out`` asks for the size)."""
    raw = {n: {"args": list(e.args), "returns": e.returns, "rows": e.rows} for n, (e, _) in exports.items()}
    table = np.frombuffer(
        json.dumps(raw, sort_keys=True).encode(), np.uint8
    ).copy()  # a constant of the module

    def _export_table(out):
        n = table.size
        if out.size >= n:
            out[:n] = table
        return n

    return _export_table


def _compile(name: str, exports: dict[str, tuple[Export, object]], tmp: str, verbose: bool) -> str:
    """numba's ``pycc`` over ``exports`` (and the export table) into ``tmp``; the built file's path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending-deprecation notice: it is still numba's AOT compiler
        try:
            from numba.pycc import CC
        except ImportError as e:  # a numba without pycc (announced for removal)
            raise KernelBuildError(
                f"cannot build the compiled-ahead kernels: {e}; conversions use numba's JIT kernels instead"
            ) from e
    options = {}
    try:
        cc = CC(name)  # numba >= 0.68 looks for the C compiler here already
        cc.output_dir, cc.target_cpu, cc.verbose = tmp, "host", verbose
        for export_name, (spec, dispatcher) in exports.items():
            options[dispatcher.py_func] = dispatcher.targetoptions
            cc.export(export_name, spec.signature)(dispatcher.py_func)
        cc.export(_TABLE_FUNCTION, "int64(uint8[::1])")(_table_function(exports))
        with _jit_flags(options), open(os.devnull, "w") as quiet, \
                contextlib.redirect_stdout(sys.stderr if verbose else quiet):  # fmt: skip
            cc.compile()
    except Exception as e:  # a missing C compiler / Python headers (distutils' errors), LLVM's
        raise KernelBuildError(
            f"building the compiled-ahead kernels failed ({type(e).__name__}: {' '.join(str(e).split())}); "
            "conversions use numba's JIT kernels instead (the same bytes)"
        ) from e
    (built,) = glob.glob(os.path.join(tmp, name + "*"))
    return built


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


# ------------------------------------------------------------------------------------- formats' own set
def _codec_modules() -> tuple[ModuleType, ...]:
    from colitools.formats.kernels import (
        _jit_affine,
        _jit_decoders,
        _jit_encoders,
        _jit_mse,
        _jit_stats,
        _jit_threads,
    )

    return _jit_encoders, _jit_decoders, _jit_threads, _jit_mse, _jit_stats, _jit_affine


# The codecs (encode drivers, container and source decoders, FP8 dequant, planar64 reorder, the mse scale search,
# the error figures) and the thread pool's polls. Their compiled code reads the format codes and decode tables of registry / reference, and the pool's
# flag-cell indices of threads; the error figures' lanes and blocks are error_stats'.
CODECS = KernelSet(
    "codecs", __file__, _codec_modules,
    constants=(
        "threads.py", "../reference.py", "../registry.py", "../quantizers.py", "../affine.py", "../error_stats.py"
    ),
)
