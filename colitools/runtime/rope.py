"""Rotary position embeddings: default, linear, YaRN and llama3 frequencies; half and interleaved layouts; partial
rotary.

Frequencies are computed in float32 the way transformers 5.24 does (``modeling_rope_utils``), so cos/sin agree
with the oracle to the last bit or two.
"""

from __future__ import annotations

import math

import numpy as np

from colitools.runtime.config import RopeArgs

F32 = np.float32


def _get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def inv_freq_and_scaling(rope: RopeArgs) -> tuple[np.ndarray, float]:
    """``(inv_freq float32 [dim/2], attention_scaling)`` for a rope configuration."""
    dim, base = rope.dim, rope.theta
    exps = np.arange(0, dim, 2, dtype=F32) / F32(dim)
    pos_freqs = np.power(F32(base), exps, dtype=F32)  # base ** (2i/d) in float32, as torch does
    if rope.rope_type in ("default", "linear"):
        inv = (F32(1.0) / pos_freqs).astype(F32)
        if rope.rope_type == "linear":
            inv = (inv / F32(rope.factor or 1.0)).astype(F32)
        return inv, 1.0
    if rope.rope_type == "llama3":
        return _llama3_inv_freq((F32(1.0) / pos_freqs).astype(F32), rope), 1.0
    # YaRN (transformers _compute_yarn_parameters)
    factor = float(rope.factor)
    orig = float(rope.original_max_position_embeddings)
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = _get_mscale(factor, rope.mscale) / _get_mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = _get_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers: prevent a singularity
    inv_extra = (F32(1.0) / pos_freqs).astype(F32)
    inv_inter = (F32(1.0) / (F32(factor) * pos_freqs)).astype(F32)
    ramp = np.clip((np.arange(dim // 2, dtype=F32) - F32(low)) / F32(high - low), 0, 1).astype(F32)
    extrapolation = (F32(1) - ramp).astype(F32)
    inv = inv_inter * (F32(1) - extrapolation) + inv_extra * extrapolation
    return inv.astype(F32), float(attention_factor)


def _llama3_inv_freq(inv: np.ndarray, rope: RopeArgs) -> np.ndarray:
    """transformers ``_compute_llama3_parameters`` in float32: wavelengths above ``old / low_freq_factor`` divided
    by ``factor``, below ``old / high_freq_factor`` kept, the band between interpolated. torch evaluates
    ``scalar / tensor`` as ``reciprocal(tensor) * scalar`` (two roundings), and so does this."""
    factor, low = F32(rope.factor), F32(rope.low_freq_factor)
    old = float(rope.original_max_position_embeddings)
    low_wavelen, high_wavelen = F32(old / rope.low_freq_factor), F32(old / rope.high_freq_factor)
    wavelen = ((F32(1) / inv) * F32(2 * math.pi)).astype(F32)
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv).astype(F32)
    smooth = (
        ((F32(1) / wavelen) * F32(old) - low) / F32(rope.high_freq_factor - rope.low_freq_factor)
    ).astype(F32)
    smoothed = ((F32(1) - smooth) * scaled / factor + smooth * scaled).astype(F32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(F32)


class Rope:
    """Applies RoPE to the first ``dim`` values of each head (the rest pass through)."""

    def __init__(self, rope: RopeArgs):
        self.dim = rope.dim
        self.interleaved = rope.interleaved
        self.inv_freq, self.scaling = inv_freq_and_scaling(rope)

    def cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``cos, sin`` float32 ``[N, dim/2]`` (the half the layouts share)."""
        freqs = positions.astype(F32)[:, None] * self.inv_freq[None, :]
        cos = (np.cos(freqs) * F32(self.scaling)).astype(F32)
        sin = (np.sin(freqs) * F32(self.scaling)).astype(F32)
        return cos, sin

    def apply(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate ``x[N, heads, D]`` (D >= dim); ``cos``/``sin`` from ``cos_sin``.

        Half layout rotates pairs ``(i, i + dim/2)``; interleaved rotates ``(2i, 2i+1)`` and, like transformers'
        ``apply_rotary_pos_emb_interleave``, writes the result de-interleaved (evens then odds). q and k get the
        same permutation, so their dot products are those of the interleaved rotation."""
        d = self.dim
        c, s = cos[:, None, :], sin[:, None, :]
        rot = x[..., :d]
        if self.interleaved:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        else:
            x1, x2 = rot[..., : d // 2], rot[..., d // 2 :]
        out = np.empty_like(x, dtype=F32)
        out[..., : d // 2] = x1 * c - x2 * s
        out[..., d // 2 : d] = x2 * c + x1 * s
        out[..., d:] = x[..., d:]
        return out
