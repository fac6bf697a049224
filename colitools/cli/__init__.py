"""Command-line interface. Commands are thin: parse options, call one library function, print.

User errors (``ColitoolsError``) become one line on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import sys

from colitools.cli import (  # noqa: F401  (imported to register their commands)
    convert_cmd,
    formats_cmd,
    inspect_cmd,
    mirror_cmd,
    run_cmd,
    usage_cmd,
    verify_cmd,
)
from colitools.cli.app import app
from colitools.errors import ColitoolsError


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv, prog_name="colitools")
    except ColitoolsError as exc:
        print(f"colitools: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("colitools: interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as exc:  # disk full, permission denied, vanished file: one line naming the file
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        print(f"colitools: error: {exc.strerror or exc}{where}", file=sys.stderr)
        sys.exit(1)
