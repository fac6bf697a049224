"""The kernels' row thread pool: ``_run_rows`` spreads row chunks of a serial, GIL-free kernel on threads
(numba-free: it also runs the drivers compiled ahead of time, ``aot``)."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

from colitools.formats.kernels import _dispatch

# ------------------------------------------------------------------------------------------ threading
_POOL: ThreadPoolExecutor | None = None
_MIN_PARALLEL_ELEMS = 1 << 18  # below this, threads cost more than they save
_CHUNK_ELEMS = 1 << 20  # rows per work item ~ this many elements (cache-friendly, few dispatches)


_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=max(1, _DEFAULT_THREADS - 1), thread_name_prefix="colitools-kernel"
            )
        return _POOL


_DEFAULT_THREADS = _dispatch.default_threads()  # NUMBA_NUM_THREADS when set, at most the CPU count


def _run_rows(kernel, args: tuple, O: int, I: int) -> int:
    """Run ``kernel(*args, r0, r1)`` over row chunks on ``kernels.set_threads`` threads (default
    ``NUMBA_NUM_THREADS``, at most the CPU count; the calling thread included); return the smallest
    non-negative result (first bad row) or -1."""
    threads = min(_dispatch.kernel_threads() or _DEFAULT_THREADS, O)
    if threads <= 1 or O * I < _MIN_PARALLEL_ELEMS:
        return int(kernel(*args, 0, O))
    rows = max(1, min(_CHUNK_ELEMS // max(I, 1), -(-O // (4 * threads))))
    counter = itertools.count()

    def worker() -> int:
        bad = -1
        while True:
            r0 = next(counter) * rows  # itertools.count is atomic under the GIL
            if r0 >= O:
                return bad
            r = int(kernel(*args, r0, min(O, r0 + rows)))
            if r >= 0 and (bad < 0 or r < bad):
                bad = r

    futures = [_pool().submit(worker) for _ in range(threads - 1)]
    results = [worker()] + [f.result() for f in futures]
    bad = [r for r in results if r >= 0]
    return min(bad) if bad else -1
