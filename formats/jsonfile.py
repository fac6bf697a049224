"""The reader of the small JSON objects of a model folder (``config.json``, the index, the planar sidecar's
``index.json``): one-line FormatErrors naming the file, never a traceback (deep nesting included)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from colitools.formats.errors import FormatError


def load_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; FormatError when it cannot be read, is not JSON or is not an object."""
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(value, dict):
        raise FormatError(f"{path}: expected a JSON object")
    return value
