"""Fixtures choosing which kernels run: the ones compiled ahead of time (``aot``, built for this machine by
``./dev``) or numba's JIT ones, for every kernel set (the codecs with the thread pool's polls, the runtime's
matmuls). The codecs must equal the numpy reference byte for byte on both; the runtime's matmul kernels and
thread-pool polls must pass the same tests on both."""

from __future__ import annotations

import signal

import pytest

from colitools.formats.kernels import aot
from colitools.runtime import kernels as runtime_kernels

KERNEL_SETS = (aot.CODECS, runtime_kernels.KERNELS)

# Ctrl-C reaches colitools with SIGINT's default disposition, but a suite started in the background of a
# non-interactive shell (`./dev test &`) inherits SIGINT ignored, and so would every process it spawns: Python
# then installs no KeyboardInterrupt handler and the tests that press Ctrl-C on a conversion or a stage see it
# finish instead (15 failures, 311 errors of the bad-input harness's setup). The processes the tests start get
# what a terminal gives them: the pytest process (each xdist worker loads this file) takes Python's own handler
# back, and exec resets a handled signal to its default in the children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
