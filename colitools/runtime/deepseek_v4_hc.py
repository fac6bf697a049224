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
+ hc_eps)_i x_i``. The per-block mixing is GLM-5.3's too: it lives in ``hyper.HyperConnection`` (re-exported here).
"""

from __future__ import annotations

import numpy as np

from colitools.runtime.hyper import HyperConnection  # the same mixing as GLM-5.3's (one owner)
from colitools.runtime.ops import sigmoid

__all__ = ["HyperConnection", "HyperHead", "unweighted_rms_norm"]

F32 = np.float32


def unweighted_rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """``x * rsqrt(mean(x^2) + eps)`` over the last axis (transformers ``DeepseekV4UnweightedRMSNorm``)."""
    var = np.mean(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32)
    return x * (F32(1.0) / np.sqrt(var + F32(eps)))


class HyperHead:
    """The final collapse of the streams: ``hc_fn [n, n H]``, ``hc_base [n]``, ``hc_scale [1]``."""

    def __init__(self, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, hc_eps: float, norm_eps: float):
        self.fn, self.base, self.scale = fn.astype(F32), base.astype(F32), scale.astype(F32)
        self.hc_eps, self.norm_eps = F32(hc_eps), norm_eps

    @property
    def nbytes(self) -> int:
        return self.fn.nbytes + self.base.nbytes + self.scale.nbytes

    def __call__(self, streams: np.ndarray) -> np.ndarray:
        N = streams.shape[0]
        flat = unweighted_rms_norm(streams.reshape(N, -1), self.norm_eps)
        pre = sigmoid((flat @ self.fn.T) * self.scale[0] + self.base) + self.hc_eps
        return np.sum(pre[:, :, None] * streams, axis=1, dtype=F32).astype(F32)
