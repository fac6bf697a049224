"""Manifold-constrained hyper-connections (mHC) and the hyper head (DeepSeek-V4, transformers 5.24
``DeepseekV4HyperConnection`` / ``DeepseekV4HyperHead``).

The residual is ``n = hc_mult`` parallel streams ``[N, n, H]``. Before a block, one projection of the normalised
flattened streams gives three weights::

    flat = x / rms(x)  (over n*H, eps rms_norm_eps)      mixes = flat @ fn.T     [(2 + n) n]
    pre  = sigmoid(mixes[:n] * scale[0] + base[:n]) + hc_eps
    post = 2 sigmoid(mixes[n:2n] * scale[1] + base[n:2n])
    comb = Sinkhorn(softmax(mixes[2n:] * scale[2] + base[2n:]) + hc_eps)   [n, n], ``hc_sinkhorn_iters`` passes

The block sees ``sum_i pre_i x_i``; afterwards ``x'_k = post_k * out + sum_j comb[j, k] x_j``. The hyper head
collapses the streams once more before the final norm: ``sum_i (sigmoid(flat @ hc_fn.T * hc_scale + hc_base)
+ hc_eps)_i x_i``. The per-block mixing is GLM-5.3's too: it lives in ``hyper.HyperConnection``.

Under ``--act-quant official`` (deepseek_v4_quant.py) the mixes are computed in DeepSeek's inference order
(``reference_mixes``): the raw flattened streams times ``fn``, then times ``rsqrt(mean(x^2) + eps)``, where
transformers normalises the streams first. The two differ in the last bit of a mix, and the BF16 rounding of the
block input that follows can turn that into a whole BF16 step on some channels (the 128-wide compatibility
check's first divergence from colibri's engine, which keeps DeepSeek's order: docs/FORMATS.md §4).
"""

from __future__ import annotations

import numpy as np

from colitools.runtime.deepseek_v4_quant import ActQuant, fma, ordered_dot, ordered_mean_square
from colitools.runtime.hyper import HyperConnection  # the same mixing as GLM-5.3's (one owner)
from colitools.runtime.ops import sigmoid

__all__ = ["HyperConnection", "HyperHead", "V4HyperConnection", "reference_mixes", "unweighted_rms_norm"]

F32 = np.float32


def reference_mixes(flat: np.ndarray, fn_t: np.ndarray, eps: float) -> np.ndarray:
    """DeepSeek's ``hc_pre`` / ``hc_head`` mixes of the flattened streams ``flat [N, n H]`` (``fn_t [n H, M]``):
    ``(flat @ fn_t) * rsqrt(mean(flat^2) + eps)``, the product of the raw streams scaled afterwards, both sums
    in index order (``ordered_dot``, ``ordered_mean_square``)."""
    return (ordered_dot(flat, fn_t) * (F32(1.0) / np.sqrt(ordered_mean_square(flat) + F32(eps)))).astype(F32)


class V4HyperConnection(HyperConnection):
    """``hyper.HyperConnection`` whose mixes follow DeepSeek's order when ``quant`` is on."""

    quant: ActQuant | None = None  # set by the family (its ``V4Args.act_quant``)

    def mixes(self, streams: np.ndarray) -> np.ndarray:
        if self.quant is None or not self.quant.on:
            return super().mixes(streams)
        return reference_mixes(streams.reshape(streams.shape[0], -1), self.fn_t, self.norm_eps)

    def scaled(self, m: np.ndarray, scale: np.float32, base: np.ndarray) -> np.ndarray:
        """``m * scale + base``; when ``quant`` is on one fused multiply-add, as DeepSeek's ``hc_split_sinkhorn``
        kernel (CUDA, which contracts it by default) and colibri's engine build compute it."""
        if self.quant is None or not self.quant.on:
            return super().scaled(m, scale, base)
        return fma(m, scale, base)


def unweighted_rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """``x * rsqrt(mean(x^2) + eps)`` over the last axis (transformers ``DeepseekV4UnweightedRMSNorm``)."""
    var = np.mean(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32)
    return x * (F32(1.0) / np.sqrt(var + F32(eps)))


class HyperHead:
    """The final collapse of the streams: ``hc_fn [n, n H]``, ``hc_base [n]``, ``hc_scale [1]``."""

    def __init__(self, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, hc_eps: float, norm_eps: float,
                 quant: ActQuant | None = None):  # fmt: skip
        self.fn, self.base, self.scale = fn.astype(F32), base.astype(F32), scale.astype(F32)
        self.hc_eps, self.norm_eps, self.quant = F32(hc_eps), norm_eps, quant

    @property
    def nbytes(self) -> int:
        return self.fn.nbytes + self.base.nbytes + self.scale.nbytes

    def __call__(self, streams: np.ndarray) -> np.ndarray:
        flat = streams.reshape(streams.shape[0], -1)
        if self.quant is not None and self.quant.on:
            mixes = reference_mixes(flat, self.fn.T, self.norm_eps)
        else:
            mixes = unweighted_rms_norm(flat, self.norm_eps) @ self.fn.T
        pre = sigmoid(mixes * self.scale[0] + self.base) + self.hc_eps
        return np.sum(pre[:, :, None] * streams, axis=1, dtype=F32).astype(F32)
