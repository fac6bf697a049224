"""compressed-tensors' ``quantization_config``: its ``config_groups`` split by format, each encoding reading only
its own (``_ct_weights``, ``_ct_scheme``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from colitools.formats.errors import ConfigError
from colitools.formats.source_encodings import Int4Scheme

PACK_QUANTIZED, MXFP4_PACK_QUANTIZED = "pack-quantized", "mxfp4-pack-quantized"  # compressed-tensors formats
FLOAT_QUANTIZED = "float-quantized"


def _ct_weights(qc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(format, weights)`` of every ``config_groups`` scheme of a compressed-tensors config that quantizes
    weights (a group's own ``format``, else the top level's, else pack-quantized); ConfigError for a malformed
    group or a format no encoding reads."""
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise ConfigError(
            f"config.json: quantization_config.config_groups is a {type(groups).__name__}, expected an object"
        )
    schemes = [g for g in groups.values() if isinstance(g, Mapping) and g.get("weights")]
    for key, g in groups.items():
        if isinstance(g, Mapping) and g.get("weights") and not isinstance(g["weights"], Mapping):
            raise ConfigError(
                f"config.json: quantization_config.config_groups.{key}.weights is a "
                f"{type(g['weights']).__name__}, expected an object"
            )
    known = {PACK_QUANTIZED, MXFP4_PACK_QUANTIZED, FLOAT_QUANTIZED}
    formats = {fmt, *(g.get("format") for g in schemes)} - {None}
    if formats - known:
        raise ConfigError(
            "config.json: quantization_config.format "
            f"{sorted(formats - known, key=str)[0]!r} of quant_method 'compressed-tensors' is not "
            f"supported (only {PACK_QUANTIZED!r}, {MXFP4_PACK_QUANTIZED!r}, {FLOAT_QUANTIZED!r})"
        )
    return [(g.get("format") or fmt or PACK_QUANTIZED, g["weights"]) for g in schemes]


def _ct_scheme(qc: Mapping[str, Any], fmt: str) -> Int4Scheme | None:
    """The weight scheme of format ``fmt`` in a compressed-tensors config: pack-quantized INT4 (one scheme for its
    weights: group size, symmetry, act order), or mxfp4-pack-quantized (checked: 4-bit float, groups of 32;
    it has no scheme of its own: None)."""
    weights = [w for f, w in _ct_weights(qc) if f == fmt]
    if fmt == MXFP4_PACK_QUANTIZED:
        for w in weights:
            if (w.get("num_bits"), w.get("type"), w.get("group_size")) != (4, "float", 32):
                raise ConfigError(
                    f"config.json: compressed-tensors {MXFP4_PACK_QUANTIZED} weights with num_bits "
                    f"{w.get('num_bits')!r} type {w.get('type')!r} group_size {w.get('group_size')!r} are not "
                    "supported (only 4-bit float in groups of 32)"
                )
        return None
    if not weights:
        return Int4Scheme()
    for w in weights:
        if w.get("num_bits") != 4 or w.get("type", "int") != "int":
            raise ConfigError(
                "config.json: compressed-tensors weights with num_bits "
                f"{w.get('num_bits')!r} type {w.get('type', 'int')!r} are not supported (only 4-bit int)"
            )
    sizes = {w.get("group_size") for w in weights}
    gs = sizes.pop() if len(sizes) == 1 else None
    return Int4Scheme(
        gs if isinstance(gs, int) and gs > 0 else None,
        symmetric=all(w.get("symmetric", True) for w in weights),
        actorder=any(w.get("actorder") not in (None, False, "static") for w in weights),
    )
