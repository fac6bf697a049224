"""Fixtures choosing which kernels run: the ones compiled ahead of time (``aot``, built for this machine by
``./dev``) or numba's JIT ones, for every kernel set (the codecs with the thread pool's polls, the runtime's
matmuls). The codecs must equal the numpy reference byte for byte on both; the runtime's matmul kernels and
thread-pool polls must pass the same tests on both."""

from __future__ import annotations

import pytest

from colitools.formats.kernels import aot
from colitools.runtime import kernels as runtime_kernels

KERNEL_SETS = (aot.CODECS, runtime_kernels.KERNELS)


def use_drivers(monkeypatch, kind: str) -> None:
    """Make every kernel set run ``kind`` ("ahead" or "jit") kernels for one test. "ahead" fails (not skips)
    when a compiled-ahead module is not built here: ``./dev`` builds them, and the tests check what runs."""
    for kset in KERNEL_SETS:
        if kind == "ahead":
            module = kset.load()
            assert module is not None, f"compiled-ahead kernels ({kset.name}): {kset.status()['reason']}"
            monkeypatch.setattr(kset, "_kernels", kset.ahead_kernels(module))
        else:
            monkeypatch.setattr(kset, "_loaded", {"module": None, "reason": "the test asks for the JIT"})
            monkeypatch.setattr(kset, "_kernels", kset.jit_kernels())


@pytest.fixture(params=["ahead", "jit"])
def kernel_drivers(request, monkeypatch) -> str:
    """Runs the test once on each kind of kernel."""
    use_drivers(monkeypatch, request.param)
    return request.param


@pytest.fixture
def jit_only(monkeypatch) -> None:
    """The encoders as without a compiled-ahead module: the start-up budget and the compile marker apply."""
    use_drivers(monkeypatch, "jit")
