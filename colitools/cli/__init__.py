"""Command-line interface. Commands are thin: parse options, call one library function, print (``output``).

Every failure is one line on stderr, ``colitools: error: ...``, never a traceback; with ``--json`` also one JSON
object on stdout (``output.fail``). Exit codes: 0 success; 1 an error that stopped the command
(``ColitoolsError``, OS errors); 2 a usage error (unknown command or option, a missing required option, an option
value outside its range or choices: ``ParameterError``) and, for ``mirror plan`` / ``stage``, a plan that was not
admitted; 3 ``convert --on-low-disk stop`` met the disk floor; 4 a check that ran and found problems; 130
interrupted (Ctrl-C / SIGINT), 143 terminated (SIGTERM) and 129 hung up (SIGHUP: a closed terminal, an ssh drop),
each a clean stop, with the resume hint for ``convert`` and ``mirror stage``. A stdout closed early (``| head``)
ends the command quietly: exit 1 when a write found it closed, no message.

This module is the console script's entry point and imports only the standard library: typer, click and the
command modules (``boundary``) are imported after the interrupt handler is in place, so a Ctrl-C while they load
is reported like any other.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process ended by it
EXIT_HUNG_UP = 129  # 128 + SIGHUP
EXIT_CLOSED_PIPE = 1  # a write found stdout closed (typer's own code for it, kept for our own writes)
_STOPS = {  # the signals that stop a command cleanly, but SIGINT: (exit code, what the line says)
    signal.SIGTERM: (EXIT_TERMINATED, "terminated (SIGTERM)"),
    signal.SIGHUP: (EXIT_HUNG_UP, "hung up (SIGHUP)"),
}


class _InterruptWatch:
    """SIGINT, SIGTERM and SIGHUP handler: remembers the signal, then raises KeyboardInterrupt as Python's own
    SIGINT handler does, so a SIGTERM or a hangup (a closed terminal, an ssh drop) is the same clean stop as a
    Ctrl-C (locks and temporaries removed, finished work kept).

    Typer turns a KeyboardInterrupt into a silent ``Exit(130)``, and an interrupt raised inside a finalizer is
    dropped by Python; the flag survives both, so ``main`` always reports it. After the first signal its
    default action is restored: a second one ends the process at once (while cleanup is still running)."""

    def __init__(self) -> None:
        self.hit: int | None = None  # the signal that stopped the command

    def install(self) -> None:
        # not when the process was started with a signal ignored (SIGINT: nohup, `&` in a script)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self)
        for signum in _STOPS:  # (not SIGHUP under nohup: ignored from the start)
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, self)

    def __call__(self, signum, frame) -> None:
        self.hit = self.hit or signum
        signal.signal(signum, signal.SIG_DFL)
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the command named by ``argv`` (default ``sys.argv[1:]``) and exit."""
    args = list(sys.argv[1:] if argv is None else argv)
    own = argv is None  # the process's own command line (not a caller's ``argv`` in its process: tests, scripts)
    if own and args[:1] == ["convert"]:
        # convert makes no BLAS call: without this, importing numpy starts and spins OpenBLAS's thread pool
        # (~0.1 CPU-s on 2 cores while the start-up runs on one); set before numpy is first imported
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    watch = _InterruptWatch()
    watch.install()
    code: int | None = None
    try:
        from colitools.cli import output

        output.begin({}, as_json="--json" in args)  # until boundary.run_app knows the command's own flags
        from colitools.cli import boundary  # typer, click and every command: the imports a Ctrl-C may land in

        code = boundary.run_app(args)
    except KeyboardInterrupt:
        watch.hit = watch.hit or signal.SIGINT
    except BrokenPipeError:  # stdout closed early (`| head`) under a write of ours outside typer's own catch
        code = EXIT_CLOSED_PIPE
        _quiet_streams()
    if watch.hit or code == EXIT_INTERRUPTED:
        from colitools.cli import output

        exit_code, what = _STOPS.get(watch.hit, (EXIT_INTERRUPTED, "interrupted"))
        try:
            code = output.interrupted(args, exit_code, what=what)
        except OSError:  # the terminal is gone (a hangup), stdout closed: the code says it
            code = exit_code
            _quiet_streams()
    if own and not code and not watch.hit and args[:1] == ["convert"]:
        _exit_now()
    sys.exit(code or 0)


def _quiet_streams() -> None:
    """Point stdout and stderr at /dev/null: a stream that cannot be written any more (a closed pipe, a hung-up
    terminal) would otherwise fail again at the interpreter's exit flush ("Exception ignored", exit code 120)."""
    import contextlib

    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(null, stream.fileno())
        os.close(null)


def _exit_now() -> None:
    """End a finished ``convert`` process with exit code 0 without tearing the interpreter down (freeing every
    module and the plan's objects one by one: ~0.1 s after the last file is published, on one core, in every
    conversion). Safe there: every file the conversion wrote went through descriptors it fsynced and closed,
    and nothing else is left to finish. So: only when no other non-daemon thread is alive; the exit handlers
    (``atexit``) still run and the standard streams are flushed first; any doubt (a stream that cannot be
    flushed) returns to the ordinary exit."""
    import atexit
    import contextlib
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe, a closed stream: Python's own exit reports it
        return
    atexit._run_exitfuncs()
    with contextlib.suppress(OSError, ValueError):  # what a handler printed
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)
