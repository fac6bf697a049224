"""The library never prints: what a user should know while it works is logged on the ``colitools`` logger, and
the CLI (``cli/output.py``) prints a warning as ``colitools: warning: ...`` and a note as ``colitools: note: ...``,
one line each on stderr."""

from __future__ import annotations

import logging

from colitools.cli import output


def test_library_warnings_and_notes_are_one_line_each_on_stderr(capsys):
    logger = logging.getLogger("colitools")
    handlers, level = list(logger.handlers), logger.level
    try:
        output.begin({}, as_json=False)
        logging.getLogger("colitools.converters.planner").warning("native: %d tensor(s)\n decoded", 3)
        logging.getLogger("colitools.runtime.deepseek_v3").info("%s: no DSA indexer", "/m")
        logging.getLogger("colitools.converters.sources").debug("not shown")
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "colitools: warning: native: 3 tensor(s) decoded",
        "colitools: note: /m: no DSA indexer",
    ]
