"""Fixtures choosing which encode drivers the kernels run: the ones compiled ahead of time (``aot``, built for
this machine by ``./dev``) or numba's JIT ones. Both must equal the numpy reference byte for byte."""

from __future__ import annotations

import pytest

from colitools.formats.kernels import _encode, aot


def use_drivers(monkeypatch, kind: str) -> None:
    """Make the encoders run ``kind`` ("ahead" or "jit") drivers for one test. "ahead" fails (not skips)
    when the compiled-ahead module is not built here: ``./dev`` builds it, and the tests check what runs."""
    if kind == "ahead":
        module = aot.load()
        assert module is not None, f"compiled-ahead kernels: {aot.status()['reason']}"
        monkeypatch.setitem(_encode._DRIVERS, "d", _encode.ahead_drivers(module))
    else:
        monkeypatch.setattr(aot, "_LOADED", {"module": None, "reason": "the test asks for the JIT"})
        monkeypatch.setitem(_encode._DRIVERS, "d", _encode.jit_drivers())


@pytest.fixture(params=["ahead", "jit"])
def kernel_drivers(request, monkeypatch) -> str:
    """Runs the test once on each kind of encode driver."""
    use_drivers(monkeypatch, request.param)
    return request.param


@pytest.fixture
def jit_only(monkeypatch) -> None:
    """The encoders as without a compiled-ahead module: the start-up budget and the compile marker apply."""
    use_drivers(monkeypatch, "jit")
