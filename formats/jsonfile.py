"""The reader of the small JSON objects of a model folder (``config.json``, the index, the planar sidecar's
``index.json``): one-line FormatErrors naming the file and where it is broken, never a traceback (deep nesting
and 5000-digit numbers included). Every library reader of a model folder's JSON goes through it: the converter's
sources, ``open_model`` (inspect, verify, the runtime's weights), the runtime's arguments and engram sidecar, the
mirror's receipt. The other JSON files of ours (the manifest, an oracle reference) are parsed by
``parse_json_object`` under their reader's error class.

Python's ``json`` accepts a lone surrogate escape (``"e\\udfff"``), a string that is no Unicode text: nothing can
print it to a UTF-8 terminal or write it to a UTF-8 file. ``invalid_text`` finds one; every reader of ours
refuses it (docs/FORMATS.md §1), as the upstream safetensors reader does.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from colitools.formats.errors import ColitoolsError, FormatError

__all__ = ["invalid_text", "is_text", "load_json_object", "parse_json_object", "shown_text"]

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a high or low surrogate, paired or not


def is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text (no lone surrogate: it encodes as UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_text(value: str, limit: int = 60) -> str:
    """``value`` as an ASCII JSON string literal (surrogates escaped), cut to about ``limit`` characters."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 4] + '..."'


def invalid_text(raw: bytes, value: Any) -> str | None:
    """The first string of ``value`` (an object key or a value, at any depth), parsed from the JSON text ``raw``,
    that is no Unicode text; None when there is none (at once when ``raw`` holds no surrogate escape)."""
    if not _SURROGATE_ESCAPE.search(raw):
        return None
    stack = [value]
    while stack:
        item = stack.pop()
        strings: Iterable[str] = ()
        if isinstance(item, str):
            strings = (item,)
        elif isinstance(item, dict):
            strings = item.keys()
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        bad = next((s for s in strings if not is_text(s)), None)
        if bad is not None:
            return bad
    return None


def parse_json_object(
    raw: bytes, where: str | None = None, error: type[ColitoolsError] = FormatError
) -> dict[str, Any]:
    """The JSON object the text ``raw`` holds (UTF-8, -16 or -32, as RFC 8259 allows). ``error`` (a reader of
    another kind of file passes its own class) with the problem, after ``where: `` when given, when it is not
    JSON, is nested too deeply, is not an object or holds a string that is no Unicode text (``invalid_text``)."""
    at = f"{where}: " if where else ""
    try:
        # strict decoding: json.loads(bytes) would let an encoded lone surrogate through ('surrogatepass')
        value = json.loads(raw.decode(json.detect_encoding(raw)))
    except json.JSONDecodeError as exc:
        raise error(f"{at}invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{at}not {exc.encoding.upper().removesuffix('-SIG')} text (byte {exc.start})") from None
    except RecursionError:  # a hostile or broken file: arrays / objects nested deeper than the parser's stack
        raise error(f"{at}not valid JSON: nested too deeply") from None
    except ValueError as exc:  # a number too long to convert
        raise error(f"{at}not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise error(f"{at}expected a JSON object")
    bad = invalid_text(raw, value)
    if bad is not None:
        raise error(f"{at}the string {shown_text(bad)} is not Unicode text (a lone surrogate escape)")
    return value


def load_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``; FormatError when it cannot be read, is not JSON, is not an object or holds
    a string that is no Unicode text (``parse_json_object``)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_json_object(raw, str(path))
