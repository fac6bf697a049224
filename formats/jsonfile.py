"""The reader of the small JSON objects of a model folder (``config.json``, the index, the planar sidecar's
``index.json``): one-line FormatErrors naming the file and where it is broken, never a traceback (deep nesting
and 5000-digit numbers included). Every library reader of a model folder's JSON goes through it: the converter's
sources, ``open_model`` (inspect, verify, the runtime's weights), the runtime's arguments, the mirror."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from colitools.formats.errors import FormatError


def load_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``; FormatError when it cannot be read, is not JSON or is not an object."""
    try:
        value = json.loads(Path(path).read_bytes())  # bytes: json detects UTF-8/16/32 as RFC 8259 allows
    except json.JSONDecodeError as exc:
        raise FormatError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:  # a number too long to convert, nesting too deep
        raise FormatError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(value, dict):
        raise FormatError(f"{path}: expected a JSON object")
    return value
