"""The thread pool: results in item order from the caller and the helpers, exceptions reach the caller, work
submitted inside a worker runs inline, and a helper that went to sleep (idle past its polling window) or a caller
that blocked (a task longer than its window) still hands over every task."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from colitools.formats.kernels import threads


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setenv("COLITOOLS_THREADS", "2")


@pytest.mark.parametrize("spin", [True, False])
def test_results_in_item_order(two_threads, spin):
    def work(i):
        time.sleep(0.0005 * (i % 3))  # uneven items: the threads finish out of order
        return i * i

    for _ in range(3):
        assert threads.parallel_map(work, list(range(20)), spin=spin) == [i * i for i in range(20)]


def _until_asleep(h) -> None:
    deadline = time.monotonic() + 30
    while not h.asleep and time.monotonic() < deadline:  # past its polling window (however busy the machine)
        time.sleep(0.001)
    assert h.asleep


@pytest.mark.parametrize("spin", [True, False])
def test_helper_sleeps_and_wakes(two_threads, spin):
    (h,) = threads._get_helpers(1)
    for k in range(3):
        _until_asleep(h)
        helper_ran = threading.Event()

        def work(i, helper_ran=helper_ran):
            if threading.current_thread() is threading.main_thread():
                helper_ran.wait(30)  # the caller holds its item until the woken helper has taken the other
            else:
                helper_ran.set()
            return i

        assert threads.parallel_map(work, [k, k + 1], spin=spin) == [k, k + 1]
        assert helper_ran.is_set()


@pytest.mark.parametrize("spin", [True, False])
def test_caller_blocks_for_a_long_helper_task(two_threads, spin):
    (h,) = threads._get_helpers(1)
    for _ in range(2):
        started = threading.Event()

        def work(i, started=started):
            if threading.current_thread() is threading.main_thread():
                started.wait(30)  # the helper has its item: the caller cannot take the task back
            else:
                started.set()
                # the caller outwaits its polling window (however busy the machine) and sleeps
                time.sleep(0.5)
            return i

        assert threads.parallel_map(work, [0, 1], spin=spin) == [0, 1]
        assert started.is_set() and h.notified == h.posted  # the helper woke the sleeping caller


@pytest.mark.parametrize("spin", [True, False])
def test_exception_reaches_the_caller_and_pool_recovers(two_threads, spin):
    def work(i):
        time.sleep(0.001)
        if i == 3:
            raise ValueError("item 3")
        return i

    for _ in range(2):
        with pytest.raises(ValueError, match="item 3"):
            threads.parallel_map(work, list(range(8)), spin=spin)
    assert threads.parallel_map(work, [0, 1, 2], spin=spin) == [0, 1, 2]


def test_nested_work_runs_inline(two_threads):
    def outer(i):
        assert threads.in_worker()
        return threads.parallel_map(lambda j: (threads.in_worker(), i + j), [10, 20])

    out = threads.parallel_map(outer, [1, 2, 3])
    assert out == [[(True, 11), (True, 21)], [(True, 12), (True, 22)], [(True, 13), (True, 23)]]
    assert not threads.in_worker()


def test_concurrent_callers_each_get_their_results(two_threads):
    """Two user threads calling at once: one drives the helpers, the other runs its items inline."""
    out = {}

    def caller(c):
        out[c] = [
            threads.parallel_map(lambda i: (time.sleep(0.0005), c * 100 + i)[1], list(range(6)))
            for _ in range(5)
        ]

    ts = [threading.Thread(target=caller, args=(c,)) for c in (1, 2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == {c: [[c * 100 + i for i in range(6)]] * 5 for c in (1, 2)}


def test_flag_cells(kernel_drivers):
    """The compiled polls, compiled ahead of time and JIT (the ``th_*`` kernels)."""
    from colitools.formats.kernels import aot

    k = aot.CODECS.kernels()
    T, F, B = threads.TASK, threads.FINISHED, threads.CALLER_BLOCKED
    cells = np.zeros(24, np.int64)
    k.th_set(cells, F, 5)
    assert cells[F] == 5 and k.th_set_then_read(cells, B, 1, F) == 5 and cells[B] == 1
    assert k.th_reach(cells, F, 6, 100) == 5  # not reached: gives up after 100 reads
    assert k.th_reach(cells, F, 4, 100) == 5
    assert k.th_next_post(cells, 0, 100, 0) == 0  # nothing posted
    k.th_set(cells, T, 3)
    assert k.th_next_post(cells, 2, 100, 10) == 3 and k.th_next_post(cells, 3, 100, 0) == 3
    # task 3 is taken once: by the helper or by the caller, never both
    assert k.th_take(cells, 3) and cells[T] == -3 and not k.th_take(cells, 3)
    assert k.th_next_post(cells, 0, 100, 0) == -3  # a taken task is no post
    assert k.th_finish_and_poll(cells, 3, 100, 0) == -1 and cells[F] == 3  # the caller sleeps: notify
    cells[B] = 0
    assert k.th_finish_and_poll(cells, 3, 100, 0) == -3  # no later post within the window


def test_a_task_the_caller_took_back_never_runs(two_threads):
    """The caller runs every item when the helper is late, takes the posted task back and returns."""
    (h,) = threads._get_helpers(1)
    ran = []
    _until_asleep(h)
    with h.work:  # an asleep helper cannot take anything while we hold its condition
        assert h.asleep
        n = h.post(lambda: ran.append(1))
        assert h.wait(n) is None and h.task is None
    time.sleep(20 * threads.SPIN_SECONDS)
    assert ran == []
    assert threads.parallel_map(lambda i: (time.sleep(0.002), i)[1], [0, 1, 2]) == [0, 1, 2]


def test_row_chunks_bounds():
    assert threads.row_chunks(10, 4) == [(0, 8), (8, 10)] or threads.n_workers() != 2
    for O in (1, 5, 131, 2048):
        chunks = threads.row_chunks(O, 4)
        assert chunks[0][0] == 0 and chunks[-1][1] == O
        assert all(a % 4 == 0 and a < b for a, b in chunks)
        assert all(b == c for (_, b), (c, _) in zip(chunks, chunks[1:], strict=False))


def test_forked_child_starts_its_own_helpers(two_threads):
    threads.parallel_map(lambda i: i, [0, 1])  # the parent has a helper
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's helper thread does not exist here
        try:
            ok = threads.parallel_map(lambda i: (time.sleep(0.001), i * 2)[1], list(range(6))) == [
                0,
                2,
                4,
                6,
                8,
                10,
            ]
            os.write(w, b"1" if ok and len(threads._helpers) == 1 else b"0")
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


def test_run_rows_covers_every_row_once_on_both_threads_and_gives_the_first_bad_row(monkeypatch):
    """A codec call's row chunks on the pool (no polling between calls): every row in exactly one chunk, the
    helper takes part, and the smallest bad row any chunk reports is the result."""
    from colitools.formats.kernels import _dispatch

    monkeypatch.setattr(_dispatch, "_threads", {"n": 2})
    O, I = 64, 1 << 14  # 1 M elements: split (>= 2^18), 8 chunks of 8 rows for 2 threads
    seen, helper_took = [], threading.Event()

    def kernel(r0, r1):
        if threading.current_thread() is threading.main_thread():
            helper_took.wait(30)  # the caller holds its first chunk until the woken helper has one
        else:
            helper_took.set()
        seen.append((r0, r1, threading.current_thread() is threading.main_thread()))
        return min((r for r in (45, 20) if r0 <= r < r1), default=-1)  # rows 20 and 45 are "bad": the first

    assert threads.run_rows(kernel, (), O, I) == 20
    rows = sorted(r for r0, r1, _ in seen for r in range(r0, r1))
    assert rows == list(range(O)) and helper_took.is_set() and {main for *_, main in seen} == {True, False}
    monkeypatch.setattr(_dispatch, "_threads", {"n": 1})
    seen.clear()
    helper_took.set()
    assert threads.run_rows(kernel, (), O, I) == 20 and [(a, b) for a, b, _ in seen] == [(0, O)]  # one thread
