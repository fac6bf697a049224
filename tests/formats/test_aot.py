"""The encode drivers compiled ahead of time (``formats/kernels/aot.py``): built for this checkout by ``./dev``,
loaded without numba, byte-identical to the numpy reference (and so to the JIT: the property tests of
test_codecs_properties run on both), found only for the sources and CPU they were built for, and built
atomically."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import reference as ref
from colitools.formats.kernels import _encode, aot
from tests.conftest import use_drivers

F32 = np.float32


def test_the_compiled_ahead_module_is_built_for_this_checkout_and_this_cpu():
    status = aot.status()
    assert status["loaded"], status["reason"]
    assert os.path.basename(status["file"]).startswith(aot.module_name() + ".")
    assert status["built"] == [status["file"]]  # a rebuild removes the stale ones


def test_a_large_encode_runs_compiled_ahead_without_importing_numba():
    code = (
        "import sys, numpy as np, ml_dtypes\n"
        "from colitools.formats import kernels, reference\n"
        "from colitools.formats.kernels import _dispatch, _encode\n"
        "w = (np.random.default_rng(0).standard_normal((512, 1024)) * 0.02).astype(np.float32)\n"
        "assert w.size >= _dispatch.SMALL_ELEMS\n"
        "assert kernels.plan_encodes([('int4-grouped', w.size)])\n"  # no start-up to save: the kernels at once
        "c, s = kernels.encode_from_bf16('int4-grouped', w.astype(ml_dtypes.bfloat16), 64)\n"
        "from colitools.formats.kernels import aot\n"
        "assert aot._KERNELS['k'].ahead, 'the JIT ran'\n"
        "assert 'numba' not in sys.modules and 'llvmlite' not in sys.modules, 'numba imported'\n"
        "c2, s2 = reference.encode_int4_grouped(w.astype(ml_dtypes.bfloat16).astype(np.float32), 64)\n"
        "assert c.tobytes() == c2.tobytes() and s.tobytes() == s2.tobytes()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={k: v for k, v in os.environ.items() if k != "COLITOOLS_AOT"})


@pytest.mark.parametrize("source", ["f32", "bf16", "fp8", "fp8-e8m0"])
def test_every_compiled_ahead_driver_gives_the_reference_bytes_on_a_threaded_tensor(monkeypatch, source):
    """Above the size the row pool splits (test_codecs_properties covers every format and odd shapes)."""
    use_drivers(monkeypatch, "ahead")
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((300, 1120)) * 0.02).astype(F32)
    if source == "fp8-e8m0":
        c, s = _encode.encode_fp8_e8m0(w)
        rc, rs = ref.encode_fp8_e8m0(w)
        assert c.tobytes() == rc.tobytes() and s.tobytes() == rs.tobytes()
        return
    for fmt, gs in [("int4-grouped", 64), ("int3-g64", None), ("mxfp4", None), ("int8-row", None)]:
        if source == "f32":
            got, want = _encode.encode(fmt, w, gs), ref_encode(fmt, w, gs)
        elif source == "bf16":
            b = w.astype(ml_dtypes.bfloat16)
            got, want = _encode.encode_from_bf16(fmt, b, gs), ref_encode(fmt, b.astype(F32), gs)
        else:
            q = (rng.integers(0, 256, w.shape, dtype=np.uint16).astype(np.uint8)) & 0xF7  # no NaN bytes
            s = rng.random((3, 9)).astype(F32)
            got = _encode.encode_from_fp8_block(fmt, q, s, 128, gs)
            want = ref_encode(fmt, ref.dequant_fp8_block(q, s, (128, 128)), gs)
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == np.asarray(want[1]).tobytes(), fmt


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
    got = _encode.encode_from_bf16("int4-grouped", odd, 64)
    want = ref.encode_int4_grouped(w.astype(F32), 64)
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
    args = (w.view(np.uint16).astype(np.int16), 3, 64, np.empty((64, 1024), np.uint8), np.empty((64, 32), F32),
            np.empty((64, 0), np.uint8))  # fmt: skip
    with pytest.raises(TypeError, match="argument 0 is int16 \\[64, 2048\\], expected a 2-D C-contiguous uint16"):
        aot.check_args("rows_bf16", args)


def test_a_module_built_for_other_sources_or_turned_off_is_not_used(monkeypatch):
    monkeypatch.setattr(aot, "_LOADED", {})
    monkeypatch.setattr(aot, "stamp", lambda: "0123456789abcdef")  # an edited kernel, another CPU
    assert aot.load() is None
    assert "not built for these sources on this CPU (_aot_kernels_0123456789abcdef" in aot.status()["reason"]
    monkeypatch.setattr(aot, "_LOADED", {})
    monkeypatch.undo()
    monkeypatch.setattr(aot, "_LOADED", {})
    monkeypatch.setenv("COLITOOLS_AOT", "0")
    assert aot.load() is None and aot.status()["reason"] == "turned off (COLITOOLS_AOT=0)"


def test_the_stamp_covers_the_sources_and_the_cpu(monkeypatch, tmp_path):
    for package, rel in aot._SOURCES:  # a copy of the files the compiled code depends on
        copy = tmp_path / package / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(open(os.path.join(aot._package_dir(package), rel), "rb").read())
    base = aot.stamp()
    monkeypatch.setattr(aot, "_package_dir", lambda package: str(tmp_path / package))
    assert aot.stamp() == base
    with open(tmp_path / "colitools.formats" / "registry.py", "a") as f:  # the kernels' format codes live there
        f.write("\n")
    edited = aot.stamp()
    with open(tmp_path / "colitools" / "runtime" / "_jit_threads.py", "a") as f:  # the runtime's polls
        f.write("\n")
    runtime = aot.stamp()
    monkeypatch.setattr(aot, "_cpu", lambda: "x86_64 AuthenticAMD | 25 | 1 | fpu sse2")
    assert len({base, edited, runtime, aot.stamp()}) == 4


@pytest.mark.slow
def test_build_is_atomic_removes_stale_modules_and_gives_the_reference_bytes(tmp_path):
    stale = tmp_path / (aot.PREFIX + "0123456789abcdef.cpython-311-x86_64-linux-gnu.so")
    stale.write_bytes(b"old")
    path = aot.build(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]  # no temp dir, the stale module gone
    assert os.path.basename(path).startswith(aot.module_name() + ".")
    spec = importlib.util.spec_from_file_location(aot.module_name(), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    w = (np.random.default_rng(5).standard_normal((40, 256)) * 0.02).astype(F32)
    codes, sf = np.empty((40, 128), np.uint8), np.empty((40, 4), F32)
    from colitools.formats.registry import Int4Grouped

    assert module.rows_f32(w, Int4Grouped.kernel_code, 64, codes, sf, np.empty((40, 0), np.uint8), 0, 40) == -1
    want = ref.encode_int4_grouped(w, 64)
    assert codes.tobytes() == want[0].tobytes() and sf.tobytes() == want[1].tobytes()


def test_a_damaged_module_is_not_loaded_and_says_why(monkeypatch):
    """A truncated / foreign file under the current name: the JIT serves, and status() names the file."""
    name = aot.PREFIX + "feedfacefeedface"
    path = os.path.join(os.path.dirname(aot.__file__), name + ".cpython-311-x86_64-linux-gnu.so")
    with open(path, "wb") as f:
        f.write(b"\x7fELF not really")
    try:
        monkeypatch.setattr(aot, "_LOADED", {})
        monkeypatch.setattr(aot, "module_name", lambda: name)
        assert aot.load() is None
        assert aot.status()["reason"].startswith(f"{path} does not load: ")
    finally:
        os.unlink(path)


def test_a_read_only_install_builds_and_loads_from_the_users_cache(monkeypatch, tmp_path):
    """A system-wide install: the package's directory is not writable, so the module goes to (and is found in)
    $XDG_CACHE_HOME/colitools/kernels."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert aot.user_dir() == str(tmp_path / "cache" / "colitools" / "kernels")
    installed = aot.current()
    here = aot._HERE
    monkeypatch.setattr(aot, "_HERE", str(tmp_path / "read-only"))  # os.access: not writable
    assert aot.default_dest() == aot.user_dir()
    monkeypatch.setattr(aot, "_HERE", here)
    os.makedirs(aot.user_dir())
    copy = os.path.join(aot.user_dir(), os.path.basename(installed))
    with open(installed, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    monkeypatch.setattr(aot, "search_dirs", lambda: [str(tmp_path / "empty"), aot.user_dir()])
    monkeypatch.setattr(aot, "_LOADED", {})
    assert aot.load() is not None and aot.status()["file"] == copy


def test_a_killed_builds_leftovers_are_removed_by_the_next_build(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".aot-build-{int(dead.stdout)}-abc"  # that process is gone
    live = tmp_path / f".aot-build-{os.getpid()}-def"  # a build in progress (this process)
    left.mkdir()
    live.mkdir()
    aot._remove_dead_builds(str(tmp_path))
    assert not left.exists() and live.exists()


def test_a_build_that_cannot_compile_is_one_error_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "/nonexistent/cc")  # distutils' compiler: no C compiler on this machine
    with pytest.raises(aot.KernelBuildError, match="building the compiled-ahead kernels failed .*numba's JIT"):
        aot.build(str(tmp_path))
    assert os.listdir(tmp_path) == []
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.access(ro, os.W_OK):  # root ignores the mode: a path that is not a directory instead
        ro = tmp_path / "file"
        ro.write_text("")
    with pytest.raises(aot.KernelBuildError, match="is not a writable directory"):
        aot.build(str(ro))


def test_cli_kernels_reports_the_module_as_json_and_text():
    env = {k: v for k, v in os.environ.items() if k != "COLITOOLS_AOT"}
    out = subprocess.run([sys.executable, "-m", "colitools", "kernels", "--json"], capture_output=True, text=True,
                         check=True, env=env)  # fmt: skip
    status = json.loads(out.stdout)
    assert status["loaded"] and status["module"] == aot.module_name()
    text = subprocess.run([sys.executable, "-m", "colitools", "kernels"], capture_output=True, text=True, check=True,
                          env={**env, "COLITOOLS_AOT": "0"})  # fmt: skip
    assert text.stdout.strip() == "kernels: numba JIT; compiled-ahead module turned off (COLITOOLS_AOT=0)"
