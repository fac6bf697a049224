"""Fixtures choosing which kernels run: the ones compiled ahead of time (``aot``, built for this machine by
``./dev``) or numba's JIT ones. The codecs must equal the numpy reference byte for byte on both; the runtime's
matmul kernels and thread-pool polls must pass the same tests on both."""

from __future__ import annotations

import pytest

from colitools.formats.kernels import aot


def use_drivers(monkeypatch, kind: str) -> None:
    """Make the codecs run ``kind`` ("ahead" or "jit") kernels for one test. "ahead" fails (not skips)
    when the compiled-ahead module is not built here: ``./dev`` builds it, and the tests check what runs."""
    if kind == "ahead":
        module = aot.load()
        assert module is not None, f"compiled-ahead kernels: {aot.status()['reason']}"
        monkeypatch.setitem(aot._KERNELS, "k", aot.ahead_kernels(module))
    else:
        monkeypatch.setattr(aot, "_LOADED", {"module": None, "reason": "the test asks for the JIT"})
        monkeypatch.setitem(aot._KERNELS, "k", aot.jit_kernels())


@pytest.fixture(params=["ahead", "jit"])
def kernel_drivers(request, monkeypatch) -> str:
    """Runs the test once on each kind of kernel."""
    use_drivers(monkeypatch, request.param)
    return request.param


@pytest.fixture
def jit_only(monkeypatch) -> None:
    """The encoders as without a compiled-ahead module: the start-up budget and the compile marker apply."""
    use_drivers(monkeypatch, "jit")
