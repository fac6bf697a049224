"""The replica routing rule (docs/FORMATS.md §7) and the read-share prediction built on it.

For drive weights ``w_0`` (primary), ``w_1``, ... the cumulative cuts out of 256 are
``cut[r] = round(256 * (w_0 + ... + w_r) / sum(w))``; expert ``e`` of layer ``L`` (``E`` experts per layer)
hashes to ``h = ((L*E + e) * 2654435761) mod 2^32``, ``bucket = (h >> 16) & 255``, and goes to the first
replica ``r`` with ``bucket < cut[r]``. An expert whose routed tensor is not on replica ``r`` is read from the
primary.

``round`` is C's ``round()`` (half away from zero), evaluated exactly on the decimal weights, so that the
cuts here are the engine's even at exact halves (Python's ``round`` would go to even).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from colitools.formats.errors import MirrorError, ParameterError

__all__ = [
    "ReadPrediction",
    "parse_disk_weights",
    "predict_reads",
    "replica_cuts",
    "replica_for",
]

HASH_MULTIPLIER = 2654435761
BUCKETS = 256


MAX_WEIGHT_RATIO = 10**12  # largest / smallest drive weight accepted


def parse_disk_weights(text: str, *, source: str = "`disk_weights`") -> list[Fraction]:
    """``"9,3"`` -> ``[9, 3]``: at least two positive finite numbers, primary first (ParameterError naming
    ``source``, the parameter or the environment variable the text came from)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        weights = [Fraction(p) for p in parts]
    except (ValueError, ZeroDivisionError):
        raise ParameterError(f"{source}: expected comma-separated positive numbers like 9,3, got {text!r}") from None
    if len(weights) < 2 or any(w <= 0 for w in weights):
        raise ParameterError(
            f"{source}: expected at least two positive weights (primary, mirror), got {text!r}"
        )
    if max(weights) / min(weights) > MAX_WEIGHT_RATIO:  # 1e400,1: the shares would overflow a float
        raise ParameterError(f"{source}: weights {text!r} differ by more than a factor {MAX_WEIGHT_RATIO:.0e}")
    return weights


def _as_fraction(w: float | int | Fraction) -> Fraction:
    if isinstance(w, float):
        if not math.isfinite(w) or w <= 0:
            raise MirrorError(f"disk weight {w} must be a positive finite number")
        return Fraction(repr(w))  # the decimal the user or the probe printed, not the binary expansion
    return Fraction(w)


def _round_half_away(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2)) if x >= 0 else -math.floor(-x + Fraction(1, 2))


def replica_cuts(weights: Sequence[float | int | Fraction]) -> list[int]:
    """Cumulative cuts out of 256 for the drive weights (the last one is always 256)."""
    ws = [_as_fraction(w) for w in weights]
    if not ws or any(w <= 0 for w in ws):
        raise MirrorError(f"disk weights must be positive, got {list(weights)}")
    total = sum(ws)
    cuts, running = [], Fraction(0)
    for w in ws:
        running += w
        cuts.append(_round_half_away(BUCKETS * running / total))
    return cuts


def replica_for(layer: int, expert: int, n_experts: int, cuts: Sequence[int]) -> int:
    """The replica index the engine reads expert ``(layer, expert)`` from, if that replica holds it."""
    h = ((layer * n_experts + expert) * HASH_MULTIPLIER) & 0xFFFFFFFF
    bucket = (h >> 16) & 255
    for r, cut in enumerate(cuts):
        if bucket < cut:
            return r
    return len(cuts) - 1  # unreachable: the last cut is 256


@dataclass(frozen=True)
class ReadPrediction:
    """Predicted split of routed-expert bytes read between the primary and the mirror."""

    weights: tuple[float, ...]
    cuts: tuple[int, ...]
    expert_bytes_read: int  # sum over experts of count * expert bytes (the whole workload)
    primary_bytes: int
    mirror_bytes: int
    mirror_share_full: float  # the mirror's share if every shard were mirrored
    # the mirror lives on the primary's own device: the reads still split, but one device serves both, so
    # there is no bandwidth to gain
    same_device: bool = False

    @property
    def mirror_share(self) -> float:
        return self.mirror_bytes / self.expert_bytes_read if self.expert_bytes_read else 0.0

    @property
    def primary_share(self) -> float:
        return 1.0 - self.mirror_share if self.expert_bytes_read else 1.0

    def _gain(self, mirror_share: float) -> float:
        # Both drives read in parallel; drive r moves share_r of the bytes at a speed proportional to w_r.
        # Time relative to the primary alone = max(s0, s1 * w0 / w1); gain = its inverse.
        if self.same_device:
            return 1.0
        w0, w1 = self.weights[0], self.weights[1]
        return 1.0 / max(1.0 - mirror_share, mirror_share * w0 / w1)

    @property
    def bandwidth_gain(self) -> float:
        """Predicted aggregate read-bandwidth multiplier over the primary alone (1.0 = no gain)."""
        return self._gain(self.mirror_share) if self.expert_bytes_read else 1.0

    @property
    def full_mirror_gain(self) -> float:
        return self._gain(self.mirror_share_full) if self.expert_bytes_read else 1.0

    def to_json(self) -> dict:
        return {
            "disk_weights": list(self.weights),
            "cuts": list(self.cuts),
            "expert_bytes_read": self.expert_bytes_read,
            "primary_bytes_read": self.primary_bytes,
            "mirror_bytes_read": self.mirror_bytes,
            "primary_share": self.primary_share,
            "mirror_share": self.mirror_share,
            "bandwidth_gain": self.bandwidth_gain,
            "full_mirror_share": self.mirror_share_full,
            "full_mirror_bandwidth_gain": self.full_mirror_gain,
            "same_device": self.same_device,
        }


def predict_reads(
    counts: Mapping[tuple[int, int], int],
    n_experts: int,
    expert_bytes: Mapping[tuple[int, int], int],
    mirrored_bytes: Mapping[tuple[int, int], int],
    mirrored_routed: Iterable[tuple[int, int]],
    weights: Sequence[float | int | Fraction],
    *,
    same_device: bool = False,
) -> ReadPrediction:
    """Split the expert bytes the usage history reads between the primary and the mirror (replica 1).

    ``expert_bytes`` are each expert's bytes over the whole model, ``mirrored_bytes`` the part of them in
    mirrored shards, ``mirrored_routed`` the experts whose routed tensor is mirrored. An expert routed to the
    mirror reads its mirrored bytes there and the rest from the primary; replicas beyond the mirror hold
    nothing here, so their experts are read from the primary. ``same_device``: the mirror shares the primary's
    device, so the predicted gain is 1.0 whatever the weights say.
    """
    cuts = replica_cuts(weights)
    routed = set(mirrored_routed)
    total = primary = mirror = full_mirror = 0
    for key, n in counts.items():
        size = expert_bytes.get(key, 0)
        if n <= 0 or size == 0:
            continue
        read = n * size
        total += read
        on_mirror = replica_for(key[0], key[1], n_experts, cuts) == 1
        if on_mirror:
            full_mirror += read
        if on_mirror and key in routed:
            moved = n * mirrored_bytes.get(key, 0)
            mirror += moved
            primary += read - moved
        else:
            primary += read
    return ReadPrediction(
        weights=tuple(float(_as_fraction(w)) for w in weights),
        cuts=tuple(cuts),
        expert_bytes_read=total,
        primary_bytes=primary,
        mirror_bytes=mirror,
        mirror_share_full=full_mirror / total if total else 0.0,
        same_device=same_device,
    )


def env_disk_weights() -> list[Fraction] | None:
    """``COLI_DISK_WEIGHTS`` (the engine's own setting) when set, else None."""
    text = os.environ.get("COLI_DISK_WEIGHTS", "").strip()
    return parse_disk_weights(text, source="COLI_DISK_WEIGHTS") if text else None
