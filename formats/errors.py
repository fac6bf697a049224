"""Error types of colitools.

Every error a user can cause (bad input file, wrong option, full disk) is a ``ColitoolsError``: the CLI prints
its message as one line on stderr and exits with ``exit_code``, never a traceback. Messages name the file, the
tensor and the numbers at fault. ``formats`` imports nothing of ours, so the base class lives here and the
other packages import it from ``colitools.formats.errors`` (re-exported by ``colitools.errors``).
"""

from __future__ import annotations


class ColitoolsError(Exception):
    """Base class for errors reported to the user as one clear line."""

    exit_code: int = 1


class FormatError(ColitoolsError):
    """Bytes that do not follow the format specification."""


class SafetensorsError(FormatError):
    """A malformed safetensors file (header, dtype, offsets, metadata)."""


class ResolveError(FormatError):
    """A tensor whose byte counts do not resolve to exactly one known format."""


class EncodeError(FormatError):
    """A tensor that cannot be encoded (NaN/inf input, unsupported shape for the format)."""


class UsageFileError(ColitoolsError):
    """A malformed or incompatible ``.coli_usage`` routing history."""


class ConfigError(FormatError):
    """A ``config.json`` whose keys have the wrong type or range (``formats.model_config``)."""
