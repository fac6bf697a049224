"""The one way the commands print: a result (lines for people or JSON for scripts), notes, warnings, a failure.

Library messages name parameters in backticks (`` `group_size` ``, `` `group_size=33` ``: formats/errors.py); every
line printed here names a parameter of the command that ran as its flag instead (``--group-size 33``), so the flags
are the command's own. With ``--json`` a failure is also one JSON object on stdout, on one line: ``{"ok": false,
"error": <the message of the error line>, "exit_code": N}`` (after a command's own fields, e.g. the report keys of
``verify container``); a ``--json`` result is the library's report as it is. Standard library only: the entry
point reports an interrupt through here before typer is imported.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ERROR_PREFIX = "colitools: error: "
WARNING_PREFIX = "colitools: warning: "
NOTE_PREFIX = "colitools: note: "

# `name` or `name=value` (the value as the message shows it: repr for free text, plain for numbers and choices)
_PARAMETER = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)(?:=([^`]*))?`")

# commands whose interrupted run resumes where it stopped, and what to tell the user
_RESUMABLE = {
    ("convert",): "rerun the same command to resume (finished units are kept)",
    ("mirror", "stage"): "rerun the same command to resume (verified copies are kept)",
    ("upload",): "rerun the same command to resume (files the Hub holds are not sent again)",
}


@dataclass
class _Running:
    """The command this process runs: its flags by parameter name, whether it prints JSON, and what its JSON
    failure object starts with."""

    flags: dict[str, str] = field(default_factory=dict)
    as_json: bool = False
    failure_fields: Callable[[str], Mapping[str, Any]] | None = None


_running = _Running()


def begin(flags: Mapping[str, str], *, as_json: bool) -> None:
    """Set up the printing for the command about to run (``colitools.cli.boundary``)."""
    global _running
    _running = _Running(dict(flags), as_json)
    logger = logging.getLogger("colitools")
    if not any(isinstance(h, _WarningLines) for h in logger.handlers):
        logger.addHandler(_WarningLines())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)  # the library's notes too (it logs no other INFO)


class _WarningLines(logging.Handler):
    """What the library logs while it works, so that it never prints itself: at warning level (a download retried,
    a damaged Hugging Face cache file passed over, natively quantized tensors decoded) as ``warn`` lines, at info
    level (run's dense attention without a DSA indexer) as ``colitools: note:`` lines on stderr (without a handler,
    logging would print a warning's bare message and drop a note)."""

    def emit(self, record: logging.LogRecord) -> None:
        message = " ".join(record.getMessage().split())
        if record.levelno >= logging.WARNING:
            warn(message)
        else:
            echo(NOTE_PREFIX + message, err=True)


def with_flags(message: str) -> str:
    """``message`` with each `` `parameter` `` / `` `parameter=value` `` of the running command as its flag
    (``--parameter`` / ``--parameter value``); a name the command has no option for is left as it is."""

    def flag(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        option = _running.flags.get(name)
        if option is None:
            return match.group(0)
        return option if value is None else f"{option} {value}"

    return _PARAMETER.sub(flag, message) if "`" in message else message


def echo(line: str = "", *, err: bool = False, end: str = "\n") -> None:
    """One line for people on stdout (stderr with ``err``), parameters named as flags."""
    print(with_flags(line), end=end, file=sys.stderr if err else sys.stdout, flush=True)


def emit(as_json: bool, data: Callable[[], Any], lines: Iterable[str], *, one_line: bool = False) -> None:
    """The command's result: ``data()`` as JSON for scripts (indented, or on ``one_line``), else ``lines`` for
    people (only the one that is printed is computed, when ``lines`` is a generator)."""
    if as_json:
        print(json.dumps(data()) if one_line else json.dumps(data(), indent=2), flush=True)
        return
    for line in lines:
        echo(line)


def warn(message: str) -> None:
    """``colitools: warning: <message>`` on stderr."""
    echo(WARNING_PREFIX + message, err=True)


def warn_each(warnings: Iterable[str], *, as_json: bool) -> None:
    """A report's warnings as ``warn`` lines, after its text (with ``--json`` they are in the JSON)."""
    if not as_json:
        for warning in warnings:
            warn(warning)


def failure_fields(fields: Callable[[str], Mapping[str, Any]]) -> None:
    """The fields, given the error message, that the ``--json`` failure object of this command starts with
    (before ``ok`` / ``error`` / ``exit_code``): for a command whose scripts expect its report's keys always."""
    _running.failure_fields = fields


def fail(message: str, code: int, *, prefix: str = ERROR_PREFIX) -> int:
    """Report a failure: one line on stderr (``prefix`` + the message on one line, parameters as flags) and,
    with ``--json``, the failure object on stdout, on one line (the last line of stdout). Returns ``code``."""
    text = " ".join(with_flags(str(message)).split())
    if _running.as_json:
        fields = _running.failure_fields(text) if _running.failure_fields is not None else {}
        print(json.dumps({**fields, "ok": False, "error": text, "exit_code": code}), flush=True)
    print(prefix + text, file=sys.stderr, flush=True)
    return code


def interrupted(args: Iterable[str], code: int, *, what: str = "interrupted") -> int:
    """Report an interrupt (``colitools: interrupted``, or ``what``: ``terminated (SIGTERM)``, with the resume
    hint of a resumable command)."""
    words = tuple(a for a in args if not a.startswith("-"))
    hint = next((h for command, h in _RESUMABLE.items() if words[: len(command)] == command), None)
    return fail(what + (f"; {hint}" if hint else ""), code, prefix="colitools: ")
