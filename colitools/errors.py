"""Error types used outside ``formats`` (all derive from ``ColitoolsError``)."""

from __future__ import annotations

from colitools.formats.errors import (
    ColitoolsError,
    EncodeError,
    FormatError,
    ParameterError,
    ResolveError,
    SafetensorsError,
    UsageFileError,
)

__all__ = [
    "ColitoolsError",
    "ConvertError",
    "EncodeError",
    "FormatError",
    "MirrorError",
    "ParameterError",
    "ResolveError",
    "RuntimeModelError",
    "SafetensorsError",
    "TargetRefused",
    "UploadError",
    "UsageFileError",
    "VerifyError",
]


class ConvertError(ColitoolsError):
    """A conversion that cannot start or continue (bad source, recipe mismatch, missing shard)."""


class TargetRefused(ConvertError):
    """A ``--target`` (formats/targets.py) refusing the source or the recipe before work starts (wrong model
    type, a format or layout its loader cannot read): a usage error, exit code 2."""

    exit_code = 2


class DiskFloorStop(ConvertError):
    """Free disk space fell below the floor with ``--on-low-disk stop``; the run can be resumed."""

    exit_code = 3


class UploadError(ColitoolsError):
    """An upload that cannot start (incomplete output, no token) or that the Hub refused (``colitools upload``)."""


class MirrorError(ColitoolsError):
    """A mirror plan/stage/verify failure caused by input or environment."""


class RuntimeModelError(ColitoolsError):
    """A model the reference runtime cannot execute (unknown family, missing tensor, bad shape)."""


class VerifyError(ColitoolsError):
    """A verification that could not be carried out (as opposed to one that ran and found mismatches)."""
