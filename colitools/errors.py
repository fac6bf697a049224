"""The error types of colitools, re-exported for the layers above ``formats`` (every class is defined in
``colitools.formats.errors``, the bottom of the dependency graph)."""

from __future__ import annotations

from colitools.formats.errors import (
    ColitoolsError,
    ConfigError,
    ConvertError,
    DiskFloorStop,
    EncodeError,
    FormatError,
    KernelBuildError,
    ManifestError,
    MirrorError,
    MirrorReserveStop,
    ParameterError,
    ResolveError,
    ResolveReason,
    RuntimeModelError,
    SafetensorsError,
    TargetRefused,
    UploadError,
    UsageFileError,
    VerifyError,
)

__all__ = [
    "ColitoolsError",
    "ConfigError",
    "ConvertError",
    "DiskFloorStop",
    "EncodeError",
    "FormatError",
    "KernelBuildError",
    "ManifestError",
    "MirrorError",
    "MirrorReserveStop",
    "ParameterError",
    "ResolveError",
    "ResolveReason",
    "RuntimeModelError",
    "SafetensorsError",
    "TargetRefused",
    "UploadError",
    "UsageFileError",
    "VerifyError",
]
