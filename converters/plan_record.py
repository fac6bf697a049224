"""The recorded plan of a conversion in progress: ``.colitools-plan`` in the output folder, so a resume does not
plan again (planning DeepSeek-R1's 92k tensors reads 163 headers and classifies, sizes and groups every tensor:
seconds; loading the record: a fraction of that).

The file is the plan's key (64 hex digits and a newline), then the pickled ``ConversionPlan``. The key is a
sha256 over what the plan is made of: the identity of every file of the source as the ledger records a shard's
(``SourceFile.identity``: size, mtime_ns and ctime_ns of a local file; size and sha256 of a Hub file, whose
source is pinned to a commit), the source (``Source.describe``), the recipe's fingerprint and the code that
plans (sha256 of every ``.py`` of ``converters/`` and ``formats/``). So an edited config, index or shard header
(its shard's identity changes), another recipe or another colitools never reuse a record: they plan afresh,
and the ledger's own checks then apply as before. Written by the runner once the ledger is open (never by
``--dry-run``), removed before the manifest is marked complete (a finished output holds no leftover).

Unpickling runs only classes of ``colitools`` itself and the pure functions a target holds (``_PlanUnpickler``):
the record is a file of the user's
own output folder, beside the ledger that already steers the resume, and anything else in it is refused as
unreadable (the conversion then plans afresh).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import pickle
import types
from functools import cache
from pathlib import Path
from typing import Any

from colitools.converters.planner import ConversionPlan
from colitools.converters.sources import Source
from colitools.formats.atomic import write_bytes_atomic

PLAN_FILE = ".colitools-plan"
RECORD_VERSION = 1


def plan_key(src: Source, recipe_fingerprint: str) -> str:
    """The key a recorded plan must carry to be reused for ``src`` with this recipe (module docstring)."""
    files = src.files()
    facts = {
        "version": RECORD_VERSION,
        "code": _code_stamp(),
        "recipe": recipe_fingerprint,
        "source": src.describe(),
        "files": {name: files[name].identity() for name in sorted(files)},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def load_recorded(outdir: Path, key: str) -> ConversionPlan | None:
    """The plan recorded in ``outdir`` under ``key``; None when there is none, another key, or it cannot be read
    (then the caller plans afresh)."""
    try:
        with open(Path(outdir) / PLAN_FILE, "rb") as f:
            if f.readline().rstrip(b"\n") != key.encode():
                return None
            plan = _PlanUnpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        return None
    return plan if isinstance(plan, ConversionPlan) else None


def record(outdir: Path, plan: ConversionPlan, key: str) -> None:
    """Record ``plan`` under ``key`` in ``outdir`` (atomically). A plan that does not pickle is not recorded:
    the next run plans again, as it did before records existed."""
    buf = io.BytesIO()
    buf.write(key.encode() + b"\n")
    try:
        pickle.dump(plan, buf, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return
    write_bytes_atomic(Path(outdir) / PLAN_FILE, buf.getvalue())


def remove(outdir: Path) -> None:
    """Remove the record (the conversion is about to be marked complete)."""
    with contextlib.suppress(FileNotFoundError):
        (Path(outdir) / PLAN_FILE).unlink()


# modules whose functions a plan may hold (a target's name mapping, its metadata file): pure, no I/O; the targets'
# package's modules too (one per engine: formats/targets/)
_FUNCTION_MODULES = ("colitools.formats.names", "colitools.formats.targets")
_FUNCTION_PACKAGE = "colitools.formats.targets."


class _PlanUnpickler(pickle.Unpickler):
    """Unpickles only what a plan holds: classes (dataclasses, enums, format and encoding classes) defined in
    ``colitools``, the functions of ``_FUNCTION_MODULES`` and the builtin containers; nothing of another
    package, no other function."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "colitools" or module.startswith("colitools."):
            found = super().find_class(module, name)
            if isinstance(found, type) or (
                (module in _FUNCTION_MODULES or module.startswith(_FUNCTION_PACKAGE))
                and isinstance(found, types.FunctionType)
            ):
                return found
        raise pickle.UnpicklingError(f"a recorded plan refers to {module}.{name}")


@cache
def _code_stamp() -> str:
    """sha256 over the source of the packages that plan (``converters``, ``formats``): another colitools, or an
    edited one, plans afresh."""
    import colitools.converters
    import colitools.formats

    digest = hashlib.sha256()
    for package in (Path(colitools.converters.__file__).parent, Path(colitools.formats.__file__).parent):
        for path in sorted(package.rglob("*.py")):
            digest.update(path.relative_to(package).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()
