"""Command-line interface. Commands are thin: parse options, call one library function, print.

Every failure is one line on stderr, ``colitools: error: ...``, never a traceback. Exit codes: 0 success;
1 an error that stopped the command (``ColitoolsError``, OS errors); 2 a usage error (unknown command or
option, an option value out of range) and, for ``mirror plan`` / ``stage``, a plan that was not admitted;
3 ``convert --on-low-disk stop`` met the disk floor; 4 a check that ran and found problems; 130 interrupted
(Ctrl-C / SIGINT) and 143 terminated (SIGTERM), both a clean stop, with the resume hint for ``convert`` and
``mirror stage``.
"""

from __future__ import annotations

import logging
import signal
import sys

import typer

from colitools.cli import (  # noqa: F401  (imported to register their commands)
    convert_cmd,
    formats_cmd,
    inspect_cmd,
    kernels_cmd,
    mirror_cmd,
    run_cmd,
    usage_cmd,
    verify_cmd,
)
from colitools.cli.app import app
from colitools.errors import ColitoolsError

try:  # typer >= 0.22 carries its own copy of click; older ones use click itself
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as _click_errors
_ABORTS = tuple({typer.Abort, getattr(_click_errors, "Abort", typer.Abort)})

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process ended by it

_RESUMABLE = {
    ("convert",): "rerun the same command to resume (finished units are kept)",
    ("mirror", "stage"): "rerun the same command to resume (verified copies are kept)",
}


class _InterruptWatch:
    """SIGINT and SIGTERM handler: remembers the signal, then raises KeyboardInterrupt as Python's own SIGINT
    handler does, so a SIGTERM is the same clean stop as a Ctrl-C (locks and temporaries removed, finished work
    kept).

    Typer turns a KeyboardInterrupt into a silent ``Exit(130)``, and an interrupt raised inside a finalizer is
    dropped by Python; the flag survives both, so ``main`` always reports it. After the first signal its
    default action is restored: a second one ends the process at once (while cleanup is still running)."""

    def __init__(self) -> None:
        self.hit: int | None = None  # the signal that stopped the command

    def install(self) -> None:
        # not when the process was started with a signal ignored (SIGINT: nohup, `&` in a script)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self)

    def __call__(self, signum, frame) -> None:
        self.hit = self.hit or signum
        signal.signal(signum, signal.SIG_DFL)
        raise KeyboardInterrupt


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int) -> None:
    print(f"colitools: error: {_one_line(message)}", file=sys.stderr)
    sys.exit(code)


class _WarningLines(logging.Handler):
    """Warnings the library logs while it works (a download retried, a damaged cache file passed over), as
    ``colitools: warning: ...`` lines on stderr (without a handler, logging prints the bare message)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"colitools: {record.levelname.lower()}: {_one_line(record.getMessage())}", file=sys.stderr)


def _show_library_warnings() -> None:
    logger = logging.getLogger("colitools")
    if not any(isinstance(h, _WarningLines) for h in logger.handlers):
        logger.addHandler(_WarningLines())


def _interrupted(args: list[str], signum: int | None) -> None:
    words = tuple(a for a in args if not a.startswith("-"))
    hint = next((h for cmd, h in _RESUMABLE.items() if words[: len(cmd)] == cmd), None)
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    print(f"colitools: {what}" + (f"; {hint}" if hint else ""), file=sys.stderr)
    sys.exit(EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    watch = _InterruptWatch()
    watch.install()
    _show_library_warnings()
    try:
        code = app(args=args, prog_name="colitools", standalone_mode=False)
    except _click_errors.NoArgsIsHelpError as exc:  # `colitools mirror`: the group's help, as a usage error
        exc.show()
        sys.exit(EXIT_USAGE)
    except _click_errors.UsageError as exc:
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        _fail(exc.format_message().rstrip(".") + where, EXIT_USAGE)
    except _ABORTS:  # click's form of an interrupt (or EOF) at a prompt
        _interrupted(args, watch.hit)
    except KeyboardInterrupt:
        _interrupted(args, watch.hit)
    except ColitoolsError as exc:
        _fail(str(exc), exc.exit_code)
    except OSError as exc:  # disk full, permission denied, vanished file: one line naming the file
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        _fail(f"{exc.strerror or exc}{where}", 1)
    except _click_errors.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    if watch.hit:
        _interrupted(args, watch.hit)
    sys.exit(code or 0)
