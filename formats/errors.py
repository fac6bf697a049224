"""Every error type of colitools, at the bottom of the dependency graph (``formats`` imports nothing of ours, and
every other package may import this module; ``colitools.errors`` re-exports it for the layers above).

Every error a user can cause (bad input file, wrong option, full disk) is a ``ColitoolsError``: the CLI prints
its message as one line on stderr and exits with ``exit_code``, never a traceback. Messages name the file, the
tensor and the numbers at fault, and a function's parameters in backticks: `` `group_size` ``, or with the value
given, `` `group_size=33` `` (the CLI prints a parameter of the command that ran as its flag, ``--group-size 33``).
An error propagates as raised: a caller catches one only to change its message (add the file or tensor it knows)
or to recover, never to give the same message another class.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

# ------------------------------------------------------------------------------- exit codes (docs/CLI.md)
# An error exits with its class's ``exit_code`` (1 unless the class says otherwise); these are the codes of the
# other outcomes a command reports. The signal stops' codes (130, 143, 129) are the console script's
# (``colitools/cli/__init__.py``, which imports only the standard library before it watches the signals).
EXIT_USAGE = 2  # a usage error: click's (an unknown option, a missing argument) and ParameterError's
EXIT_NOT_ADMITTED = 2  # mirror plan / stage: the plan was not admitted (or the mirror drive ran out of space)
EXIT_NOT_OK = 4  # a check that ran and found problems (verify, mirror verify, mirror stage's final verify)


class ColitoolsError(Exception):
    """Base class for errors reported to the user as one clear line."""

    exit_code: int = 1


# ---------------------------------------------------------------------------------------- formats: the bytes
class FormatError(ColitoolsError):
    """Bytes that do not follow the format specification.

    ``reason`` is a machine-readable kind (a ``ResolveReason``, None when unclassified); ``detail`` is the
    message about the tensor without its ``tensor <name>: `` prefix and without writer advice, for callers
    that record the reason in their own words (the recipe's fallback reasons)."""

    def __init__(self, message: str, *, reason: ResolveReason | None = None, detail: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.detail = detail

    @classmethod
    def about(cls, tensor: str, detail: str, reason: ResolveReason | None = None, advice: str = "") -> Self:
        """The error ``tensor <tensor>: <detail><advice>`` carrying ``reason`` and ``detail``."""
        return cls(f"tensor {tensor}: {detail}{advice}", reason=reason, detail=detail)


class ParameterError(ColitoolsError):
    """A parameter value outside its range or choices (`` `group_size=33` ``, `` `layout='diagonal'` ``): a usage
    error, exit code 2."""

    exit_code = EXIT_USAGE


class SafetensorsError(FormatError):
    """A malformed safetensors file (header, dtype, offsets, metadata)."""


class ResolveReason(StrEnum):
    """Why a tensor did not resolve (or would not resolve back when written): ``FormatError.reason``."""

    BAD_SHAPE = "bad-shape"  # logical [O, I] not positive
    NO_LAYOUT = "no-layout"  # weight bytes match no known layout
    SCALE_MISMATCH = "scale-mismatch"  # weight bytes fit a format, the scale bytes do not
    NO_GROUP_SIZE = "no-group-size"  # int4 scale bytes match no group size
    UNKNOWN_STAMP = "unknown-stamp"  # a stamp that names no format
    STAMP_MISMATCH = "stamp-mismatch"  # a stamp the bytes do not allow
    MXFP4_SHAPE = "mxfp4-shape"  # mxfp4 pair with I % 32 != 0 or the wrong byte counts
    BAD_GROUP_SIZE = "bad-group-size"  # a group size given for a format that has none (or vice versa)
    UNKNOWN_FORMAT = "unknown-format"  # a writer asked for a format name the registry does not know
    COLLIDES = "collides"  # writer: the bytes would resolve as another format and no stamp may settle it
    NEEDS_STAMP = "needs-stamp"  # writer: ambiguous bytes need a stamp, and this tensor may not be stamped
    NOT_ENCODABLE = "not-encodable"  # the format cannot hold this [O, I] (e.g. mxfp4 with I % 32 != 0)
    ROUNDTRIP = "roundtrip"  # writer: its own bytes resolve to something else (a bug, never a fallback)
    BAD_METADATA = "bad-metadata"  # shard __metadata__ that is not valid JSON / values


class ResolveError(FormatError):
    """A tensor whose byte counts do not resolve to exactly one known format."""


class EncodeError(FormatError):
    """A tensor that cannot be encoded (NaN/inf input, unsupported shape for the format)."""


class ConfigError(FormatError):
    """A ``config.json`` whose keys have the wrong type or range (``formats.model_config``)."""


class UsageFileError(ColitoolsError):
    """A malformed or incompatible ``.coli_usage`` routing history."""


class KernelBuildError(ColitoolsError):
    """The compiled-ahead kernels could not be built (``formats/kernels/aot.py``; the JIT kernels still serve)."""


# ----------------------------------------------------------------------------------- converters: the pipeline
class ConvertError(ColitoolsError):
    """A conversion that cannot start or continue (bad source, recipe mismatch, missing shard)."""


class TargetRefused(ConvertError):
    """A ``--target`` (formats/targets/) refusing the source or the recipe before work starts (wrong model
    type, a format or layout its loader cannot read): a usage error, exit code 2."""

    exit_code = EXIT_USAGE


class DiskFloorStop(ConvertError):
    """Free disk space fell below the floor with ``--on-low-disk stop``; the run can be resumed."""

    exit_code = 3


class ManifestError(ColitoolsError):
    """A ``colitools.json`` that is not a manifest (``converters/manifest.py``); the message is the reason only
    (callers name the file)."""


class UploadError(ColitoolsError):
    """An upload that cannot start (incomplete output, no token) or that the Hub refused (``colitools upload``)."""


# ------------------------------------------------------------------------------- runtime, mirror, verify
class RuntimeModelError(ColitoolsError):
    """A model the reference runtime cannot execute (unknown family, missing tensor, bad shape)."""


class MirrorError(ColitoolsError):
    """A mirror plan/stage/verify failure caused by input or environment."""


class MirrorReserveStop(MirrorError):
    """Free space on the mirror drive fell below the reserve during the copy; rerun once there is room."""

    exit_code = EXIT_NOT_ADMITTED


class VerifyError(ColitoolsError):
    """A verification that could not be carried out (as opposed to one that ran and found mismatches)."""
