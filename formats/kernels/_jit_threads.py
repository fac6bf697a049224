"""The compiled pieces of the kernels' thread pool (``threads.py`` describes the protocol): sequentially
consistent atomics on int64 flag cells and the polls built on them, serial and GIL-free, each registered with its
compiled-ahead arguments (``aot.export``). ``threads`` runs them as ``aot.CODECS`` resolves them (compiled ahead
of time, else numba's JIT)."""

from __future__ import annotations

import ctypes
import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from colitools.formats.kernels.aot import export
from colitools.formats.kernels.threads import CALLER_BLOCKED, FINISHED, TASK

_FLAGS = {"nogil": True, "cache": True}


# ------------------------------------------------------------------------------ atomics on int64 flag cells
@intrinsic
def _load(typingctx, flags, i):  # pragma: no cover - compiled
    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.load_atomic(builder.gep(a.data, [args[1]]), "seq_cst", 8)

    return types.int64(flags, i), codegen


@intrinsic
def _store(typingctx, flags, i, value):  # pragma: no cover - compiled
    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        builder.store_atomic(args[2], builder.gep(a.data, [args[1]]), "seq_cst", 8)
        return context.get_dummy_value()

    return types.void(flags, i, value), codegen


@intrinsic
def _swap_if(typingctx, flags, i, expected, value):  # pragma: no cover - compiled
    """``flags[i] = value`` if it holds ``expected`` (one seq_cst compare-exchange); whether it did."""

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.gep(a.data, [args[1]])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return types.boolean(flags, i, expected, value), codegen


# Each poll read offers the CPU to any other runnable thread (POSIX ``sched_yield``, what OpenBLAS's idle
# threads do): on a machine with more runnable threads than cores, a polling helper would otherwise hold the
# core the caller needs, and a split call would run slower than an unsplit one. The compiled code calls libc's
# symbol (resolved by the JIT in the process, by the dynamic linker for the compiled-ahead module). Without a POSIX libc
# (Windows) the poll uses the x86 spin-wait hint ``pause`` (the LLVM intrinsic: numba's JIT takes no inline asm).
_YIELD_SYMBOL = "sched_yield"
try:
    _HAS_YIELD = ctypes.CDLL(None).sched_yield is not None
except (OSError, AttributeError, TypeError):
    _HAS_YIELD = False
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def _yield_cpu(typingctx):  # pragma: no cover - compiled
    def codegen(context, builder, sig, args):
        if _HAS_YIELD:
            fnty = ir.FunctionType(ir.IntType(32), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, _YIELD_SYMBOL), [])
        elif _X86:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()

    return types.void(), codegen


@export("th_reach", ("int64[]", "i", "i", "i"), rows=False)
@njit(**_FLAGS)
def _reach(flags, i, target, iters):  # pragma: no cover - compiled
    """Read ``flags[i]`` until it is at least ``target`` (at most ``iters`` reads); the last value read."""
    v = _load(flags, i)
    for _ in range(iters):
        if v >= target:
            break
        _yield_cpu()
        v = _load(flags, i)
    return v


@export("th_next_post", ("int64[]", "i", "i", "i"), rows=False)
@njit(**_FLAGS)
def _next_post(flags, seen, iters, settle):  # pragma: no cover - compiled
    """A helper's poll for a task posted after ``seen`` (``flags[TASK] > seen``, at most ``iters`` reads, then
    ``settle`` reads); the last value of ``flags[TASK]`` read."""
    v = _load(flags, TASK)
    for _ in range(iters):
        if v > seen:
            for _ in range(settle):
                _yield_cpu()
            break
        _yield_cpu()
        v = _load(flags, TASK)
    return v


@export("th_take", ("int64[]", "i"), "boolean", rows=False)
@njit(**_FLAGS)
def _take(flags, n):  # pragma: no cover - compiled
    """Mark posted task ``n`` taken; False if the other side took it first (helper and caller both call it)."""
    return _swap_if(flags, TASK, n, -n)


@export("th_finish_and_poll", ("int64[]", "i", "i", "i"), rows=False)
@njit(**_FLAGS)
def _finish_and_poll(flags, n, iters, settle):  # pragma: no cover - compiled
    """A helper's end of task ``n``: ``flags[FINISHED] = n``; -1 if the caller has gone to sleep (it needs a
    notify), else ``_next_post`` after ``n``."""
    _store(flags, FINISHED, n)
    if _load(flags, CALLER_BLOCKED) != 0:
        return -1
    return _next_post(flags, n, iters, settle)


@export("th_set", ("int64[]", "i", "i"), "void", rows=False)
@njit(**_FLAGS)
def _set(flags, i, value):  # pragma: no cover - compiled
    _store(flags, i, value)


@export("th_set_then_read", ("int64[]", "i", "i", "i"), rows=False)
@njit(**_FLAGS)
def _set_then_read(flags, i, value, j):  # pragma: no cover - compiled
    """``flags[i] = value``, then read ``flags[j]`` (both seq_cst: the store is visible before the read)."""
    _store(flags, i, value)
    return _load(flags, j)
