"""The CLI boundary: runs the typer application and turns every failure into its one line and exit code.

Imported by the entry point (``colitools.cli.main``) once its interrupt handler is in place; importing it
registers every command. The flags of the command about to run are read from its click parameters, so a library
message naming `` `group_size` `` prints as ``--group-size`` (``output.with_flags``).
"""

from __future__ import annotations

import typer

from colitools.cli import (  # noqa: F401  (imported to register their commands)
    convert_cmd,
    formats_cmd,
    inspect_cmd,
    kernels_cmd,
    merge_cmd,
    mirror_cmd,
    output,
    run_cmd,
    targets_cmd,
    upload_cmd,
    usage_cmd,
    verify_cmd,
)
from colitools.cli.app import app
from colitools.formats.errors import EXIT_USAGE, ColitoolsError

try:  # typer >= 0.22 carries its own copy of click; older ones use click itself
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as _click_errors
_ABORTS = tuple({typer.Abort, getattr(_click_errors, "Abort", typer.Abort)})


def _command_at(root, args: list[str]):
    """The click command ``args`` name: the words before the first option walk down the groups."""
    command = root
    for word in args:
        sub = getattr(command, "commands", {}).get(word) if not word.startswith("-") else None
        if sub is None:
            break
        command = sub
    return command


def _flags(command) -> dict[str, str]:
    """Parameter name -> its long flag (``group_size`` -> ``--group-size``) for every option of ``command``."""
    flags = {}
    for param in getattr(command, "params", ()):
        long = [o for o in param.opts if o.startswith("--")]
        if long and param.name:
            flags[param.name] = long[0]
    return flags


def run_app(args: list[str]) -> int:
    """Run the command ``args`` name; returns its exit code, having printed any failure (``output.fail``).
    An interrupt is left to the caller (it is reported the same whether or not this module finished loading)."""
    root = typer.main.get_command(app)
    flags = _flags(_command_at(root, args))
    options = args[: args.index("--")] if "--" in args else args
    output.begin(flags, as_json="--json" in flags.values() and "--json" in options)
    try:
        return root(args=args, prog_name="colitools", standalone_mode=False) or 0
    except _click_errors.NoArgsIsHelpError as exc:  # `colitools mirror`: the group's help, as a usage error
        exc.show()
        return EXIT_USAGE
    except _click_errors.UsageError as exc:
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        return output.fail(exc.format_message().rstrip(".") + where, EXIT_USAGE)
    except _ABORTS:  # click's form of an interrupt (or EOF) at a prompt
        raise KeyboardInterrupt from None
    except ColitoolsError as exc:
        return output.fail(str(exc), exc.exit_code)
    except OSError as exc:  # disk full, permission denied, vanished file: one line naming the file
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return output.fail(f"{exc.strerror or exc}{where}", 1)
    except _click_errors.ClickException as exc:
        return output.fail(exc.format_message(), exc.exit_code)
