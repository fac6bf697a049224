"""The small-tensor switch of ``formats/kernels`` (``_dispatch.SMALL_ELEMS``): below it the numpy reference runs
instead of a numba kernel, with the same bytes, the same errors, and without importing numba."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from colitools.formats import kernels, reference
from colitools.formats.errors import EncodeError
from colitools.formats.kernels import _dispatch, decoders, encoders

F32 = np.float32
CASES = [("int8-row", None), ("int4-row", None), ("int2-row", None), ("int4-grouped", 64), ("int4-grouped", 32),
         ("int4-grouped", 128), ("int3-g64", None), ("mxfp4", None)]  # fmt: skip
SHAPES = [(64, 64), (3, 200), (17, 288), (6, 64)]  # the fixture's shapes, partial groups


def _same(a, b) -> None:
    (ca, sa), (cb, sb) = a, b
    assert (ca.dtype, ca.shape, sa.dtype, sa.shape) == (cb.dtype, cb.shape, sb.dtype, sb.shape)
    assert ca.tobytes() == cb.tobytes() and sa.tobytes() == sb.tobytes()


def _w(shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape) * 0.02
    w[0, : min(5, shape[1])] = [0.0, -0.0, 1e-40, 3e38, -0.25][: min(5, shape[1])]
    return w.astype(F32)


# mxfp4 needs I % 32 == 0: the (mxfp4, I = 200) pair is not a case (its refusal is tested with the kernels)
@pytest.mark.parametrize(
    "fmt,gs,shape", [(f, g, s) for f, g in CASES for s in SHAPES if not (f == "mxfp4" and s[1] % 32)]
)
def test_small_path_gives_the_kernels_bytes_for_every_source(fmt, gs, shape):
    assert np.prod(shape) < _dispatch.SMALL_ELEMS
    w = _w(shape)
    _same(kernels.encode(fmt, w, gs), encoders.encode(fmt, w, gs))
    bf = w.astype(ml_dtypes.bfloat16)
    _same(kernels.encode_from_bf16(fmt, bf, gs), encoders.encode_from_bf16(fmt, bf, gs))
    q = (np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8) & 0xF7).astype(np.uint8)  # no NaN
    grid = np.random.default_rng(2).random((-(-shape[0] // 128), -(-shape[1] // 128))).astype(F32)
    _same(
        kernels.encode_from_fp8_block(fmt, q, grid, 128, gs),
        encoders.encode_from_fp8_block(fmt, q, grid, 128, gs),
    )
    codes, scales = kernels.encode(fmt, w, gs)
    a = kernels.decode(fmt, codes, scales, *shape, gs)
    b = decoders.decode(fmt, codes, scales, *shape, gs)
    assert a.dtype == b.dtype == F32 and a.tobytes() == b.tobytes()


def test_small_path_fp8_dequant_and_planar_reorder_match_the_kernels():
    q = np.random.default_rng(3).integers(0, 256, (40, 200), dtype=np.uint8)
    grid = np.random.default_rng(4).random((1, 2)).astype(F32)
    assert kernels.dequant_fp8_block(q, grid).tobytes() == decoders.dequant_fp8_block(q, grid).tobytes()
    codes = np.random.default_rng(5).integers(0, 256, (9, 64), dtype=np.uint8)
    assert kernels.pairs_to_planar(codes).tobytes() == decoders.pairs_to_planar(codes).tobytes()
    assert kernels.planar_to_pairs(codes).tobytes() == decoders.planar_to_pairs(codes).tobytes()


def test_threshold_switches_paths_with_identical_bytes(monkeypatch):
    w = _w((300, 256))  # 76800 elements: above the default threshold
    big = kernels.encode("int4-grouped", w, 64)
    monkeypatch.setattr(_dispatch, "SMALL_ELEMS", w.size + 1)
    _same(kernels.encode("int4-grouped", w, 64), big)


def test_small_path_raises_the_kernels_errors():
    w = _w((8, 64))
    w[3, 7] = np.nan
    for path in (kernels.encode, encoders.encode):
        with pytest.raises(EncodeError, match=r"tensor t: non-finite value nan at \[3, 7\] \(1 non-finite"):
            path("int8-row", w, None, name="t")
    with pytest.raises(EncodeError, match="cannot be written"):
        kernels.encode("f32", _w((4, 64)), None, name="t")
    q = np.zeros((4, 64), np.uint8)
    q[1, 2] = 0x7F  # e4m3fn NaN
    with pytest.raises(EncodeError, match=r"non-finite value nan at \[1, 2\]"):
        kernels.encode_from_fp8_block("int4-grouped", q, np.ones((1, 1), F32), 128, 64, name="t")
    with pytest.raises(EncodeError, match="scale_inv has shape"):
        kernels.encode_from_fp8_block("int4-grouped", q, np.ones((2, 2), F32), 128, 64, name="t")


def test_importing_the_package_and_encoding_a_small_tensor_imports_no_numba():
    code = (
        "import sys, numpy as np\n"
        "from colitools.formats import kernels\n"
        "kernels.encode('int4-grouped', np.ones((64, 64), np.float32), 64)\n"
        "kernels.encode_from_bf16('int8-row', np.ones((64, 64), np.uint16), None)\n"
        "assert 'numba' not in sys.modules, 'numba imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_startup_budget_keeps_a_few_large_encodes_off_numba_with_the_same_bytes():
    # above SMALL_ELEMS, within STARTUP_BUDGET_ELEMS: the reference, and numba is never imported
    code = (
        "import sys, numpy as np\n"
        "from colitools.formats import kernels\n"
        "from colitools.formats.kernels import _dispatch\n"
        "_dispatch._compiled['yes'] = True\n"  # the encoders are in numba's cache: the start-up budget applies
        "w = (np.random.default_rng(0).standard_normal((512, 1024)) * 0.02).astype(np.float32)\n"
        "assert w.size >= _dispatch.SMALL_ELEMS\n"
        "c, s = kernels.encode('int8-row', w, None)\n"
        "assert 'numba' not in sys.modules, 'numba imported'\n"
        "_dispatch.STARTUP_BUDGET_ELEMS = 0\n"
        "c2, s2 = kernels.encode('int8-row', w, None)\n"
        "assert 'numba' in sys.modules and _dispatch._budget['kernels']\n"
        "assert c.tobytes() == c2.tobytes() and s.tobytes() == s2.tobytes()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "COLITOOLS_AOT": "0"})


def test_a_plan_above_the_startup_budget_uses_the_kernels_from_its_first_large_tensor():
    # a tensor within the budget alone, announced as part of a larger plan: the kernels encode it
    code = (
        "import sys, numpy as np\n"
        "from colitools.formats import kernels\n"
        "from colitools.formats.kernels import _dispatch\n"
        "_dispatch._compiled['yes'] = True\n"
        "w = (np.random.default_rng(0).standard_normal((512, 1024)) * 0.02).astype(np.float32)\n"
        "ref = kernels.encode('int8-row', w[:8], None)\n"  # small: the reference, no numba
        "assert not kernels.plan_encodes([('int8-row', 100), ('int8-row', w.size)])\n"  # within the budget
        "assert 'numba' not in sys.modules\n"
        "big = _dispatch.STARTUP_BUDGET_ELEMS\n"
        "assert kernels.plan_encodes([('int8-row', w.size), ('int4-grouped', big)])\n"
        "c, s = kernels.encode('int8-row', w, None)\n"
        "assert 'numba' in sys.modules, 'the kernels were not used'\n"
        "from colitools.formats import reference\n"
        "c2, s2 = reference.encode_int8_row(w)\n"
        "assert c.tobytes() == c2.tobytes() and s.tobytes() == s2.tobytes()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "COLITOOLS_AOT": "0"})


def test_plan_encodes_counts_only_tensors_the_reference_would_take_within_the_budget(monkeypatch, jit_only):
    n = _dispatch.STARTUP_BUDGET_ELEMS
    monkeypatch.setitem(_dispatch._compiled, "yes", True)  # compiled before: the start-up budget
    before = dict(_dispatch._budget)
    try:
        _dispatch._budget.update(spent=0, kernels=False)
        # small tensors always take the reference: any number of them never loads the kernels
        assert not kernels.plan_encodes([("int8-row", _dispatch.SMALL_ELEMS - 1)] * (n // 1000))
        assert not kernels.plan_encodes([("int8-row", n)])
        assert kernels.plan_encodes([("mxfp4", n // 8 + 1)])  # mxfp4's reference costs 8x per element
    finally:
        _dispatch._budget.clear()
        _dispatch._budget.update(before)


def test_set_threads_validates_and_is_per_thread_on_request():
    import threading

    assert _dispatch.kernel_threads() is None  # the default: NUMBA_NUM_THREADS at most the CPU count
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive integer"):
            kernels.set_threads(bad)
    seen = {}
    try:
        kernels.set_threads(2)
        kernels.set_threads(1, this_thread=True)
        other = threading.Thread(target=lambda: seen.update(other=_dispatch.kernel_threads()))
        other.start()
        other.join()
        assert (_dispatch.kernel_threads(), seen["other"]) == (1, 2)
    finally:
        kernels.set_threads(None, this_thread=True)
        kernels.set_threads(None)
    assert _dispatch.kernel_threads() is None


def test_before_the_encoders_were_ever_compiled_the_budget_is_their_compile_cost(monkeypatch, tmp_path, jit_only):
    """A fresh install / CI environment: numba would compile the encoders (~12 CPU-s), so a plan up to
    COMPILE_BUDGET_ELEMS stays on the reference; once a kernel encode ran, the marker beside numba's cache
    (here NUMBA_CACHE_DIR) says they are compiled, and the start-up budget applies again."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_dispatch, "_compiled", {})
    monkeypatch.setattr(_dispatch, "_budget", {"spent": 0, "kernels": False})
    assert not _dispatch.kernels_compiled()
    mid = 4 * _dispatch.STARTUP_BUDGET_ELEMS  # over the start-up budget, within the compile budget
    assert mid < _dispatch.COMPILE_BUDGET_ELEMS
    assert not kernels.plan_encodes([("int4-grouped", mid)])
    assert kernels.plan_encodes([("int4-grouped", _dispatch.COMPILE_BUDGET_ELEMS + 1)])
    marker = _dispatch._marker_path()
    assert marker is not None and marker.startswith(str(tmp_path)) and not os.path.exists(marker)
    w = (np.random.default_rng(0).standard_normal((512, 256)) * 0.02).astype(np.float32)
    codes, scales = kernels.encode("int4-grouped", w, 64)  # the plan above chose the kernels: this marks them
    assert os.path.exists(marker)
    want_codes, want_scales = reference.encode_int4_grouped(w, 64)
    assert codes.tobytes() == want_codes.tobytes() and scales.tobytes() == want_scales.tobytes()
    monkeypatch.setattr(_dispatch, "_compiled", {})  # a new process reads the marker
    monkeypatch.setattr(_dispatch, "_budget", {"spent": 0, "kernels": False})
    assert _dispatch.kernels_compiled()
    assert kernels.plan_encodes([("int4-grouped", mid)])


def test_the_marker_is_named_by_the_encoder_sources_and_lives_beside_numbas_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nb"))
    a = _dispatch._marker_path()
    assert os.path.dirname(a) == str(tmp_path / "nb") and os.path.basename(a).startswith("colitools-encoders-")
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    in_tree = _dispatch._marker_path()  # a writable checkout: the package's __pycache__, as numba's own cache
    assert os.path.dirname(in_tree) == os.path.join(os.path.dirname(_dispatch.__file__), "__pycache__")
    assert os.path.basename(in_tree) == os.path.basename(a)
    src = os.path.join(os.path.dirname(_dispatch.__file__), "_jit_encoders.py")
    st = os.stat(src)
    try:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # an edit: numba recompiles
        assert os.path.basename(_dispatch._marker_path()) != os.path.basename(a)
    finally:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_worker_takes_the_parents_choice_of_the_kernels(monkeypatch, jit_only):
    """A ``--workers`` process plans one unit; the parent planned them all: ``_worker_init`` passes its choice."""
    from colitools.converters import runner

    monkeypatch.setattr(_dispatch, "_budget", {"spent": 0, "kernels": False})
    monkeypatch.setattr(_dispatch, "_compiled", {"yes": False})  # a cold cache: a unit alone would stay off them
    monkeypatch.setattr(runner, "_die_with_parent", lambda pid: None)
    monkeypatch.setattr(_dispatch, "_threads", {"n": None})
    # _worker_init makes its process ignore SIGINT: restored here, or every process this test run starts later
    # inherits SIG_IGN (the mirror stage's Ctrl-C tests then hang)
    old_handler = signal.getsignal(signal.SIGINT)
    try:
        assert not _dispatch.plan_encodes([("int4-grouped", 4 * _dispatch.STARTUP_BUDGET_ELEMS)])
        runner._worker_init(1, os.getpid(), False)
        assert not _dispatch.plan_encodes([("int4-grouped", 4 * _dispatch.STARTUP_BUDGET_ELEMS)])
        runner._worker_init(1, os.getpid(), True)
        assert _dispatch.plan_encodes([]) and _dispatch.plan_encodes([("int4-grouped", _dispatch.SMALL_ELEMS)])
    finally:
        signal.signal(signal.SIGINT, old_handler)


def test_the_kernels_hand_their_encoders_to_the_registry():
    """``registry`` imports nothing of ``kernels/`` (which imports it): ``Format.encode(fast=True)`` calls the
    entry points ``kernels/_dispatch.py`` handed in when it was imported."""
    from colitools.formats import registry

    assert (registry._fast.encode, registry._fast.encode_fp8_e8m0) == (kernels.encode, kernels.encode_fp8_e8m0)
