"""The kernels compiled ahead of time (``formats/kernels/aot.py``): each kernel set (the codecs with the thread
pool's polls, the runtime's matmuls) built for this checkout by ``./dev``, loaded without numba, byte-identical to
the numpy reference (and so to the JIT: the property tests of test_codecs_properties run on both), found only for
the sources and CPU they were built for, built atomically, and every ``_jit_*`` module of a set covered by its
stamp."""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import reference as ref
from colitools.formats.kernels import aot, encoders
from tests.conftest import KERNEL_SETS, use_drivers

F32 = np.float32


@pytest.mark.parametrize("kset", KERNEL_SETS, ids=lambda k: k.name)
def test_each_compiled_ahead_module_is_built_for_this_checkout_and_this_cpu(kset):
    status = kset.status()
    assert status["loaded"], status["reason"]
    assert os.path.basename(status["file"]).startswith(kset.module_name() + ".")
    assert status["built"] == [status["file"]]  # a rebuild removes the stale ones
    assert os.path.dirname(status["file"]) == kset.home  # beside the set's own sources (a writable checkout)
    assert status["kernels"] == sorted(kset.exports())  # its own export table: every registered kernel


def test_the_export_tables_are_the_registrations_beside_the_kernels():
    """What a module was built with (its embedded table) is what the ``@export`` decorators say now."""
    for kset in KERNEL_SETS:
        table = aot.export_table(kset.load())
        assert table == {name: spec for name, (spec, _) in kset.exports().items()}, kset.name
    assert not set(aot.CODECS.exports()) & set(KERNEL_SETS[1].exports())


def test_a_large_encode_runs_compiled_ahead_without_importing_numba():
    code = (
        "import sys, numpy as np, ml_dtypes\n"
        "from colitools.formats import kernels, reference\n"
        "from colitools.formats.kernels import _dispatch\n"
        "w = (np.random.default_rng(0).standard_normal((512, 1024)) * 0.02).astype(np.float32)\n"
        "assert w.size >= _dispatch.SMALL_ELEMS\n"
        "assert kernels.plan_encodes([('int4-grouped', w.size)])\n"  # no start-up to save: the kernels at once
        "c, s = kernels.encode_from_bf16('int4-grouped', w.astype(ml_dtypes.bfloat16), 64)\n"
        "from colitools.formats.kernels import aot\n"
        "assert aot.CODECS._kernels.ahead, 'the JIT ran'\n"
        "assert 'numba' not in sys.modules and 'llvmlite' not in sys.modules, 'numba imported'\n"
        "c2, s2 = reference.encode_int4_grouped(w.astype(ml_dtypes.bfloat16).astype(np.float32), 64)\n"
        "assert c.tobytes() == c2.tobytes() and s.tobytes() == s2.tobytes()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={k: v for k, v in os.environ.items() if k != "COLITOOLS_AOT"},
    )


def test_a_runtime_matmul_runs_compiled_ahead_without_importing_numba():
    """The runtime's set (declared by colitools/runtime/kernels.py) and the pool's polls, split over two threads."""
    code = (
        "import os, sys, numpy as np\n"
        "os.environ['COLITOOLS_THREADS'] = '2'\n"
        "from colitools.formats import reference\n"
        "from colitools.runtime import kernels\n"
        "rng = np.random.default_rng(1)\n"
        "w = (rng.standard_normal((512, 1024)) * 0.02).astype(np.float32)\n"
        "codes, scales = reference.encode_int4_grouped(w, 64)\n"
        "q = kernels.QTensor('int4', codes, scales, 512, 1024, 64)\n"
        "x = rng.standard_normal((8, 1024)).astype(np.float32)\n"
        "y = q.matmul(x)\n"
        "assert 8 * 512 * 1024 >= kernels.SPLIT_MACS\n"
        "assert kernels.KERNELS._kernels.ahead, 'the JIT ran'\n"
        "assert 'numba' not in sys.modules and 'llvmlite' not in sys.modules, 'numba imported'\n"
        "want = x.astype(np.float64) @ reference.decode_int4_grouped(codes, scales, 512, 1024, 64).T\n"
        "assert np.abs(y - want).max() <= 2e-5 * np.abs(want).max()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={k: v for k, v in os.environ.items() if k != "COLITOOLS_AOT"},
    )


@pytest.mark.parametrize("source", ["f32", "bf16", "fp8", "fp8-e8m0"])
def test_every_compiled_ahead_driver_gives_the_reference_bytes_on_a_threaded_tensor(monkeypatch, source):
    """Above the size the row pool splits (test_codecs_properties covers every format and odd shapes)."""
    use_drivers(monkeypatch, "ahead")
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((300, 1120)) * 0.02).astype(F32)
    if source == "fp8-e8m0":
        c, s = encoders.encode_fp8_e8m0(w)
        rc, rs = ref.encode_fp8_e8m0(w)
        assert c.tobytes() == rc.tobytes() and s.tobytes() == rs.tobytes()
        return
    for fmt, gs in [("int4-grouped", 64), ("int3-g64", None), ("mxfp4", None), ("int8-row", None)]:
        if source == "f32":
            got, want = encoders.encode(fmt, w, gs), ref_encode(fmt, w, gs)
        elif source == "bf16":
            b = w.astype(ml_dtypes.bfloat16)
            got, want = encoders.encode_from_bf16(fmt, b, gs), ref_encode(fmt, b.astype(F32), gs)
        else:
            q = (rng.integers(0, 256, w.shape, dtype=np.uint16).astype(np.uint8)) & 0xF7  # no NaN bytes
            s = rng.random((3, 9)).astype(F32)
            got = encoders.encode_from_fp8_block(fmt, q, s, 128, gs)
            want = ref_encode(fmt, ref.dequant_fp8_block(q, s, (128, 128)), gs)
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == np.asarray(want[1]).tobytes(), (
            fmt
        )


def ref_encode(fmt, w, gs):
    from colitools.formats import kernels

    return kernels._reference_encode(fmt, w, gs)


def test_an_unaligned_source_view_is_copied_and_a_wrong_array_refused(monkeypatch):
    use_drivers(monkeypatch, "ahead")
    w = (np.random.default_rng(2).standard_normal((64, 2048)) * 0.02).astype(ml_dtypes.bfloat16)
    raw = np.zeros(w.nbytes + 1, np.uint8)
    raw[1:] = w.view(np.uint8).ravel()
    odd = np.frombuffer(raw.data, np.uint16, offset=1).reshape(w.shape)  # a shard's tensor at an odd offset
    assert not odd.flags.aligned and odd.flags.c_contiguous
    got = encoders.encode_from_bf16("int4-grouped", odd, 64)
    want = ref.encode_int4_grouped(w.astype(F32), 64)
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
    args = (w.view(np.uint16).astype(np.int16), 3, 64, np.empty((64, 1024), np.uint8), np.empty((64, 32), F32),
            np.empty((64, 0), np.uint8))  # fmt: skip
    with pytest.raises(
        TypeError, match="argument 0 is int16 \\[64, 2048\\], expected a 2-D C-contiguous uint16"
    ):
        aot.CODECS.check_args("rows_bf16", args)


def test_a_module_built_for_other_sources_or_turned_off_is_not_used(monkeypatch):
    kset = aot.CODECS
    monkeypatch.setattr(kset, "_loaded", {})
    monkeypatch.setattr(kset, "stamp", lambda: "0123456789abcdef")  # an edited kernel, another CPU
    assert kset.load() is None
    assert "not built for these sources on this CPU (_aot_codecs_0123456789abcdef" in kset.status()["reason"]
    monkeypatch.undo()
    monkeypatch.setattr(kset, "_loaded", {})
    monkeypatch.setenv("COLITOOLS_AOT", "0")
    assert kset.load() is None and kset.status()["reason"] == "turned off (COLITOOLS_AOT=0)"


def _colitools_imports(path: str) -> set[str]:
    """The modules of ours ``path`` imports (``from package import module`` names the module)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module:
            found |= {
                f"{n.module}.{a.name}" if _is_module(f"{n.module}.{a.name}") else n.module for a in n.names
            }
    return {m for m in found if m.startswith("colitools.")}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name inside a module, not a submodule
        return False


def _file_of(module: str) -> str:
    return os.path.normpath(importlib.util.find_spec(module).origin)


@pytest.mark.parametrize("kset", KERNEL_SETS, ids=lambda k: k.name)
def test_the_stamp_covers_every_file_the_compiled_code_reads(kset):
    """Every ``_jit_*`` module of the set's package is a source, and so is every module of ours they import
    (their constants: format codes, decode tables, flag-cell indices, row blocks), except the kernel machinery
    the decorators come from (``aot`` itself is a source anyway)."""
    sources = set(kset.sources())
    jit = sorted(glob.glob(os.path.join(kset.home, "_jit_*.py")))
    assert jit and set(jit) <= sources and aot.__file__ in sources
    read = {_file_of(m) for path in jit for m in _colitools_imports(path)}
    assert read <= sources, sorted(read - sources)


def test_the_stamp_changes_with_every_source_and_the_cpu(monkeypatch, tmp_path):
    kset = KERNEL_SETS[1]  # the runtime's: its sources live in two packages
    copies = []
    for k, path in enumerate(kset.sources()):  # a copy of the files the compiled code depends on
        copies.append(tmp_path / f"{k}-{os.path.basename(path)}")
        copies[-1].write_bytes(open(path, "rb").read())
    base = kset.stamp()
    monkeypatch.setattr(kset, "sources", lambda: [str(c) for c in copies])
    assert kset.stamp() == base
    stamps = {base}
    for copy in copies:
        with open(copy, "a") as f:
            f.write("\n")
        stamps.add(kset.stamp())
    monkeypatch.setattr(aot, "_cpu", lambda: "x86_64 AuthenticAMD | 25 | 1 | fpu sse2")
    stamps.add(kset.stamp())
    assert len(stamps) == len(copies) + 2
    assert aot.CODECS.stamp() != kset.stamp()


def test_one_naming_rule_a_module_imports_numba_iff_it_is_a_jit_module():
    """formats/ and colitools/: numba (and llvmlite) at module level only in ``_jit_*.py``, and every ``_jit_*``
    module imports numba or another ``_jit_*`` module; a ``_jit_*`` module is imported only by another one or by the
    function that declares its kernel set (``aot._codec_modules``, ``runtime.kernels._jit_modules``). ``aot``
    imports numba inside its build functions only."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bad = []
    for path in sorted(glob.glob(os.path.join(root, "formats", "**", "*.py"), recursive=True)
                       + glob.glob(os.path.join(root, "colitools", "**", "*.py"), recursive=True)):  # fmt: skip
        tree = ast.parse(open(path, encoding="utf-8").read())
        jit = os.path.basename(path).startswith("_jit_")
        top_numba = top_jit = False
        for node in ast.walk(tree):
            names = _imported_names(node)
            numba = any(n.split(".")[0] in ("numba", "llvmlite") for n in names)
            of_jit = any(n.rsplit(".", 1)[-1].startswith("_jit_") for n in names)
            top = node in tree.body
            top_numba, top_jit = top_numba or (top and numba), top_jit or (top and of_jit)
            if numba and top and not jit:
                bad.append(f"{path}: imports numba at module level outside a _jit_ module")
            if of_jit and not jit and node not in _set_loaders(tree):
                bad.append(f"{path}: imports a _jit_ module outside a kernel set's loader")
        if jit and not (top_numba or top_jit):
            bad.append(f"{path}: a _jit_ module without numba")
    assert not bad, "\n".join(bad)


def _imported_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def _set_loaders(tree: ast.AST) -> set[ast.AST]:
    """The import statements inside the functions passed to ``KernelSet(...)`` as ``jit_modules``."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    sets = [n for n in calls if getattr(n.func, "attr", getattr(n.func, "id", "")) == "KernelSet"]
    called = {a.id for n in sets for a in n.args[2:3] if isinstance(a, ast.Name)}
    return {i for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in called for i in ast.walk(f)
            if isinstance(i, ast.Import | ast.ImportFrom)}  # fmt: skip


@pytest.mark.slow
def test_build_is_atomic_removes_stale_modules_and_gives_the_reference_bytes(tmp_path):
    """``KernelSet.build`` (one code path for every set) on the runtime's set, the quicker to compile (~15 s
    against the codecs' ~100: ``./dev`` has built the codecs' module already, and every codec test runs on it):
    no temporary left, the set's stale module removed, another set's kept, and the module it wrote loads and
    computes exactly what numpy does (integer-valued operands: every order of the float32 sums is exact)."""
    kset = KERNEL_SETS[1]
    stale = tmp_path / (kset.prefix + "0123456789abcdef.cpython-311-x86_64-linux-gnu.so")
    other = tmp_path / (KERNEL_SETS[0].prefix + "0123456789abcdef.cpython-311-x86_64-linux-gnu.so")
    stale.write_bytes(b"old")
    other.write_bytes(b"another set's")
    path = kset.build(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(
        [os.path.basename(path), other.name]
    )  # no temp dir, stale gone
    assert os.path.basename(path).startswith(kset.module_name() + ".")
    spec = importlib.util.spec_from_file_location(kset.module_name(), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(5)
    codes = rng.integers(-127, 128, (40, 256)).astype(np.int8)
    scales = (2.0 ** rng.integers(-8, 8, 40)).astype(F32)
    x = rng.integers(-16, 17, (3, 256)).astype(F32)
    y = np.zeros((3, 40), F32)
    module.rt_int8_row(codes, scales, x, y, 0, 40)
    want = (x.astype(np.int64) @ codes.T.astype(np.int64)).astype(np.float64) * scales  # exact: |sum| < 2^24
    assert y.tobytes() == want.astype(F32).tobytes()
    assert aot.export_table(module)["rt_int8_row"] == aot.Export(("int8", "float32[]", "float32", "float32"), "void")


def test_a_damaged_module_is_not_loaded_and_says_why(monkeypatch):
    """A truncated / foreign file under the current name: the JIT serves, and status() names the file."""
    kset = aot.CODECS
    name = kset.prefix + "feedfacefeedface"
    path = os.path.join(kset.home, name + ".cpython-311-x86_64-linux-gnu.so")
    with open(path, "wb") as f:
        f.write(b"\x7fELF not really")
    try:
        monkeypatch.setattr(kset, "_loaded", {})
        monkeypatch.setattr(kset, "module_name", lambda: name)
        assert kset.load() is None
        assert kset.status()["reason"].startswith(f"{path} does not load: ")
    finally:
        os.unlink(path)


def test_a_read_only_install_builds_and_loads_from_the_users_cache(monkeypatch, tmp_path):
    """A system-wide install: the package's directory is not writable, so the module goes to (and is found in)
    $XDG_CACHE_HOME/colitools/kernels."""
    kset = aot.CODECS
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert aot.user_dir() == str(tmp_path / "cache" / "colitools" / "kernels")
    installed = kset.current()
    here = kset.home
    monkeypatch.setattr(kset, "home", str(tmp_path / "read-only"))  # os.access: not writable
    assert kset.default_dest() == aot.user_dir()
    monkeypatch.setattr(kset, "home", here)
    os.makedirs(aot.user_dir())
    copy = os.path.join(aot.user_dir(), os.path.basename(installed))
    with open(installed, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    monkeypatch.setattr(kset, "search_dirs", lambda: [str(tmp_path / "empty"), aot.user_dir()])
    monkeypatch.setattr(kset, "_loaded", {})
    assert kset.load() is not None and kset.status()["file"] == copy


def test_a_killed_builds_leftovers_are_removed_by_the_next_build(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    left = tmp_path / f".aot-build-{int(dead.stdout)}-abc"  # that process is gone
    live = tmp_path / f".aot-build-{os.getpid()}-def"  # a build in progress (this process)
    left.mkdir()
    live.mkdir()
    aot._remove_dead_builds(str(tmp_path))
    assert not left.exists() and live.exists()


def test_a_build_that_cannot_compile_is_one_error_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "/nonexistent/cc")  # distutils' compiler: no C compiler on this machine
    kset = KERNEL_SETS[1]  # the smaller set: the same build path
    with pytest.raises(
        aot.KernelBuildError, match="building the compiled-ahead kernels failed .*numba's JIT"
    ):
        kset.build(str(tmp_path))
    assert os.listdir(tmp_path) == []
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.access(ro, os.W_OK):  # root ignores the mode: a path that is not a directory instead
        ro = tmp_path / "file"
        ro.write_text("")
    with pytest.raises(aot.KernelBuildError, match="is not a writable directory"):
        kset.build(str(ro))


def test_cli_kernels_reports_every_set_as_json_and_text():
    env = {k: v for k, v in os.environ.items() if k != "COLITOOLS_AOT"}
    out = subprocess.run([sys.executable, "-m", "colitools", "kernels", "--json"], capture_output=True, text=True,
                         check=True, env=env)  # fmt: skip
    status = json.loads(out.stdout)
    assert status["loaded"] and [s["set"] for s in status["sets"]] == ["codecs", "runtime"]
    assert [s["module"] for s in status["sets"]] == [k.module_name() for k in KERNEL_SETS]
    text = subprocess.run([sys.executable, "-m", "colitools", "kernels"], capture_output=True, text=True, check=True,
                          env={**env, "COLITOOLS_AOT": "0"})  # fmt: skip
    assert text.stdout.splitlines() == [
        f"kernels ({name}): numba JIT; compiled-ahead module turned off (COLITOOLS_AOT=0)"
        for name in ("codecs", "runtime")
    ]
