"""The runtime's one thread pool: serial, GIL-free numba kernels run side by side on it.

Two uses: the routed experts of one MoE step run concurrently (one task per expert), and one big matmul
(embedding head, dense projections of a large model) is split by rows. Work submitted from inside a worker runs
inline, so nothing nests. ``COLITOOLS_THREADS`` overrides the size (default: the CPU count).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_local = threading.local()
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def n_workers() -> int:
    try:
        return max(1, int(os.environ.get("COLITOOLS_THREADS", "0")) or (os.cpu_count() or 1))
    except ValueError:
        return os.cpu_count() or 1


def _mark_worker() -> None:
    _local.worker = True


def in_worker() -> bool:
    return getattr(_local, "worker", False)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                n_workers() - 1, thread_name_prefix="colitools", initializer=_mark_worker
            )
        return _pool


def parallel_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]``, concurrently when there is more than one item and more than one CPU.

    The calling thread works too: it and ``n_workers() - 1`` pool threads take items from a shared counter
    until none are left, so one wake-up per helper thread is the only hand-off cost."""
    n = len(items)
    if n < 2 or n_workers() < 2 or in_worker():
        return [fn(x) for x in items]
    results: list = [None] * n
    counter = itertools.count()  # next() is atomic under the GIL

    def drain() -> None:
        while (i := next(counter)) < n:
            results[i] = fn(items[i])

    helpers = [_get_pool().submit(drain) for _ in range(min(n_workers() - 1, n - 1))]
    _local.worker = True
    try:
        drain()
    finally:
        _local.worker = False
        for h in helpers:
            h.result()
    return results


def row_chunks(O: int, align: int = 1) -> list[tuple[int, int]]:
    """Split ``range(O)`` into one chunk per worker (bounds multiples of ``align``)."""
    n = n_workers()
    step = -(-O // n)
    step = -(-step // align) * align
    return [(o, min(o + step, O)) for o in range(0, O, step)]
