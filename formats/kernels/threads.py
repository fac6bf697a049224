"""The one thread pool of the kernels: serial, GIL-free numba kernels run side by side on it.

Three uses: a codec call's row chunks (``run_rows``: ``kernels.set_threads`` threads, default
``NUMBA_NUM_THREADS`` at most the CPU count), the runtime's routed experts of one MoE step (one task per expert)
and its big matmuls (embedding head, dense projections, a cache-resident expert matvec of ~0.2 ms) split by rows
(``COLITOOLS_THREADS`` threads, default the CPU count). Work submitted from inside a worker runs inline, so
nothing nests; while one caller drives the helpers, a second caller runs its items itself.

Hand-off latency matters for the split matmuls: a futex wake-up of a sleeping thread costs 20-40 us on a busy
2-core VM, a sixth of a 0.2 ms call. So each helper thread, after a task, polls its flag cells for
``SPIN_SECONDS`` in compiled code with the GIL released (what OpenBLAS's own threads do) and takes the next task
without a wake-up; only after that window does it sleep on a condition. Every poll read yields the CPU
(``sched_yield``), so a polling thread never keeps a thread with work off a shared core. The caller polls for
the helper's finish before it blocks, and a caller that ran every item itself takes its posted task back
(compare-exchange on the task cell) rather than wait for a helper that has not started. The flags are int64
cells read and written with sequentially consistent atomics (``_load`` / ``_store`` / ``_swap_if`` in
``_jit_threads.py``), so a poll sees the other thread's store and neither side can miss the other's "about to
sleep" mark. This module is numba-free: it runs those compiled polls as ``aot.CODECS.kernels()`` resolves them
(compiled ahead of time, else numba's JIT).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from colitools.formats.kernels import _dispatch, aot

T = TypeVar("T")
R = TypeVar("R")

SPIN_SECONDS = 1e-4  # an idle helper polls this long for its next task before it sleeps
CALLER_SPIN_DIVISOR = 10  # a caller waiting for a helper polls SPIN_SECONDS / this, then sleeps
# A helper that sees a post waits this long before it takes the GIL: the caller holds it until it enters its
# own compiled chunk a few microseconds later, and a thread that blocks on the GIL sleeps (a wake-up again).
SETTLE_SECONDS = 4e-6

_local = threading.local()
_helpers: list[_Helper] = []
_lock = threading.Lock()  # guards _helpers
_driving = threading.Lock()  # one caller at a time drives the helpers; a second runs its items inline


def n_workers() -> int:
    try:
        return max(1, int(os.environ.get("COLITOOLS_THREADS", "0")) or (os.cpu_count() or 1))
    except ValueError:
        return os.cpu_count() or 1


def _mark_worker() -> None:
    _local.worker = True


def in_worker() -> bool:
    return getattr(_local, "worker", False)


# A helper's flag cells, a cache line apart. TASK: n > 0 = task n posted, -n = task n taken (by the helper,
# which runs it, or back by the caller, which ran every item itself); FINISHED: the last task run.
TASK, FINISHED, CALLER_BLOCKED = 0, 8, 16


_spin_iters: int | None = None


def _spin_reads() -> int:
    """Poll reads in ``SPIN_SECONDS``, measured once (a poll that never ends early, timed)."""
    global _spin_iters
    if _spin_iters is None:
        cell = np.zeros(1, np.int64)
        aot.CODECS.kernels().th_reach(cell, 0, 1, 10)  # compile / load
        n = 1 << 12
        t0 = time.perf_counter()
        aot.CODECS.kernels().th_reach(cell, 0, 1, n)
        _spin_iters = max(100, int(n * SPIN_SECONDS / max(time.perf_counter() - t0, 1e-9)))
    return _spin_iters


# ------------------------------------------------------------------------------------------------ helpers


class _Helper:
    """One pool thread running one task at a time: ``post(task) -> n``, then ``wait(n)``."""

    def __init__(self, index: int):
        self.k = aot.CODECS.kernels()  # the compiled polls (th_*: ahead of time, else numba's JIT)
        self.flags = np.zeros(24, np.int64)
        self.task: Callable[[], None] | None = None
        self.error: BaseException | None = None
        self.work = threading.Condition()  # the helper sleeps on it for a post
        self.done = threading.Condition()  # the caller sleeps on it for a finish
        self.notified = 0  # the task number the helper last signalled on ``done``
        self.posted = 0  # the last task number posted
        self.asleep = False  # waiting on ``work`` (past its polling window)
        self.spins = True  # the posted task: poll for the next after it (``post(spin=)``), else sleep at once
        self.spin = _spin_reads()
        self.settle = int(self.spin * SETTLE_SECONDS / SPIN_SECONDS)
        self.name = f"colitools-{index}"
        threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def _run(self) -> None:
        _mark_worker()
        k = self.k
        seen = 0
        v = k.th_next_post(self.flags, seen, self.spin, self.settle)
        while True:
            if v <= seen:  # nothing within the polling window: sleep until a post
                with self.work:
                    self.asleep = True
                    # v is the value the loop tested: a posted number (> seen >= 0). Read again after the loop,
                    # it could already be -v (the caller ran every item and took the task back), and taking
                    # "-v" would succeed and run a task that is gone (CI: 'NoneType' object is not callable)
                    while (v := int(self.flags[TASK])) <= seen:
                        self.work.wait()
                    self.asleep = False
            seen = v
            spin, settle = (self.spin, self.settle) if self.spins else (0, 0)  # read before the finish
            if not k.th_take(self.flags, seen):  # the caller ran every item itself and took the task back
                v = k.th_next_post(self.flags, seen, spin, settle)
                continue
            try:
                self.task()
            except BaseException as e:  # handed to the caller in wait()
                self.error = e
            self.task = None  # keeps nothing of the call (its arrays) alive; the next post sets it again
            # finish and poll for the next task in one compiled call: the GIL is free once the caller sees it
            v = k.th_finish_and_poll(self.flags, seen, spin, settle)
            if v < 0:  # the caller went to sleep before the finish: wake it
                with self.done:
                    self.notified = seen
                    self.done.notify()
                v = k.th_next_post(self.flags, seen, spin, settle)

    def post(self, task: Callable[[], None], spin: bool = True) -> int:
        """Post ``task``; ``spin``: after it, the helper polls for the next one (and the caller for its finish)
        before sleeping, else both sleep at once (a wake-up per call, as a plain thread pool)."""
        self.task, self.spins = task, spin  # read by the helper only once it has taken the new task number
        with self.work:
            n = self.posted = self.posted + 1
            self.k.th_set(self.flags, TASK, n)
            self.work.notify()
        return n

    def wait(self, n: int) -> BaseException | None:
        """Called once the caller's own work is done: take task ``n`` back if the helper has not started it
        (it was not needed: no wait for a wake-up), else wait for its finish. The exception it raised, if any."""
        k = self.k
        if k.th_take(self.flags, n):
            self.task = None
            return None
        reads = self.spin // CALLER_SPIN_DIVISOR if self.spins else 0
        if k.th_reach(self.flags, FINISHED, n, reads) != n:
            with self.done:
                if k.th_set_then_read(self.flags, CALLER_BLOCKED, 1, FINISHED) != n:
                    while self.notified != n:
                        self.done.wait()
            k.th_set(self.flags, CALLER_BLOCKED, 0)
        err, self.error = self.error, None
        return err


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads (and no thread holding a lock): start afresh."""
    global _lock, _driving
    _helpers.clear()
    _lock, _driving = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _get_helpers(k: int) -> list[_Helper]:
    with _lock:
        while len(_helpers) < k:
            _helpers.append(_Helper(len(_helpers)))
        return _helpers[:k]


def parallel_map(
    fn: Callable[[T], R], items: Sequence[T], workers: int | None = None, *, spin: bool = True
) -> list[R]:
    """``[fn(x) for x in items]``, concurrently when there is more than one item and ``workers`` (default
    ``n_workers()``) is more than one.

    The calling thread works too: it and up to ``workers - 1`` helper threads take items from a shared counter
    until none are left. ``spin``: the helpers poll for the next call before they sleep (``SPIN_SECONDS``), for
    calls a wake-up would slow (the runtime's ~0.2 ms matvecs); ``spin=False`` for calls of milliseconds."""
    n = len(items)
    workers = n_workers() if workers is None else workers
    if n < 2 or workers < 2 or in_worker() or not _driving.acquire(blocking=False):
        return [fn(x) for x in items]
    try:
        results: list = [None] * n
        counter = itertools.count()  # next() is atomic under the GIL

        def drain() -> None:
            while (i := next(counter)) < n:
                results[i] = fn(items[i])

        posted = [(h, h.post(drain, spin)) for h in _get_helpers(min(workers - 1, n - 1))]
        _local.worker = True
        try:
            drain()
        finally:
            _local.worker = False
            errors = [h.wait(k) for h, k in posted]  # every helper is idle again before anything is raised
        for err in errors:
            if err is not None:
                raise err
        return results
    finally:
        _driving.release()


def row_chunks(O: int, align: int = 1, parts: int | None = None) -> list[tuple[int, int]]:
    """Split ``range(O)`` into ``parts`` chunks (default one per worker), bounds multiples of ``align``.

    More chunks than workers balance the load: ``parallel_map``'s threads take chunks from a shared counter,
    so a helper that starts late (a wake-up, a busy core) takes fewer and nobody waits for a fixed half."""
    n = parts or n_workers()
    step = -(-O // n)
    step = -(-step // align) * align
    return [(o, min(o + step, O)) for o in range(0, O, step)]


# ------------------------------------------------------------------------------------------- codec rows
_MIN_PARALLEL_ELEMS = 1 << 18  # below this, threads cost more than they save
_CHUNK_ELEMS = 1 << 20  # rows per work item ~ this many elements (cache-friendly, few dispatches)
_CODEC_THREADS = _dispatch.default_threads()  # NUMBA_NUM_THREADS when set, at most the CPU count


def run_rows(kernel: Callable[..., int], args: tuple, O: int, I: int) -> int:
    """Run ``kernel(*args, r0, r1)`` over row chunks of ``O`` rows of ``I`` elements on ``kernels.set_threads``
    threads (default ``NUMBA_NUM_THREADS``, at most the CPU count; the calling thread included); return the
    smallest non-negative result (first bad row) or -1."""
    threads = min(_dispatch.kernel_threads() or _CODEC_THREADS, O)
    if threads <= 1 or O * I < _MIN_PARALLEL_ELEMS:
        return int(kernel(*args, 0, O))
    rows = max(1, min(_CHUNK_ELEMS // max(I, 1), -(-O // (4 * threads))))
    chunks = [(r0, min(O, r0 + rows)) for r0 in range(0, O, rows)]
    # No polling between calls: a codec call's chunks take >= 0.1 ms, and on a machine with more runnable threads
    # than cores a polling helper (sched_yield per read) reacts a time slice late: measured on 2 shared cores at
    # load 7, [2048, 2048] BF16 -> int4-g64, the helper ran 1-6 % of the chunks polling, 52 % sleeping.
    bad = [r for r in parallel_map(lambda c: int(kernel(*args, *c)), chunks, threads, spin=False) if r >= 0]
    return min(bad) if bad else -1
