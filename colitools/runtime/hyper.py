"""Manifold-constrained hyper-connections (mHC): ``hc`` residual streams per token instead of one
(GLM-5.3-Flash ``glm5_next``; transformers ``Glm5NextTextHyperConnection`` / ``Glm5NextTextHyperHead``).

Self-contained: numpy and the runtime's float32 helpers only; a family passes the three tensors of each
connection (``fn [(2 + hc) * hc, hc * H]``, ``base [(2 + hc) * hc]``, ``scale [3]``) and its head.

Per block (attention, then the feed-forward), on streams ``S [N, hc, H]``::

    m = rmsnorm_unweighted(S.reshape(N, hc * H), eps) @ fn^T          # [N, (2 + hc) * hc]
    pre  = sigmoid(m[:hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * sigmoid(m[hc:2hc] * scale[1] + base[hc:2hc])
    comb = softmax(m[2hc:].reshape(hc, hc) * scale[2] + base[2hc:], -1) + hc_eps
    comb = comb / (colsum + hc_eps); (iters - 1) x: rows then columns, each / (sum + hc_eps)   # Sinkhorn
    out  = block(sum_i pre_i S_i)
    S'   = post[:, None] * out + comb^T @ S

The embedding enters as ``hc`` copies (``HyperStreams.expand``); the head collapses the streams before the
final norm (GLM-5.3: the unweighted mean, ``HyperStreams.head``).
"""

from __future__ import annotations

import numpy as np

from colitools.runtime.ops import rms_norm, sigmoid, softmax

F32 = np.float32


class HyperConnection:
    """The pre / post / comb weights of one block's hyper-connection."""

    def __init__(self, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, hc: int, sinkhorn_iters: int,
                 hc_eps: float, norm_eps: float):  # fmt: skip
        self.fn_t = np.ascontiguousarray(fn.T.astype(F32))  # [hc * H, (2 + hc) * hc]
        self.base, self.scale = base.astype(F32), scale.astype(F32)
        self.hc, self.iters, self.eps, self.norm_eps = hc, sinkhorn_iters, F32(hc_eps), norm_eps
        self.ones = np.ones(fn.shape[1], dtype=F32)

    @classmethod
    def load(cls, ckpt, prefix: str, hidden: int, hc: int, sinkhorn_iters: int, hc_eps: float,
             norm_eps: float) -> HyperConnection:  # fmt: skip
        """The block's ``{prefix}_fn [(2 + hc) * hc, hc * hidden]``, ``{prefix}_base``, ``{prefix}_scale [3]`` from
        ``ckpt`` (a runtime ``Checkpoint``; ``prefix`` in its canonical spelling, e.g. ``model.layers.3.hc_attn``)."""
        n = (2 + hc) * hc
        return cls(ckpt.array(f"{prefix}_fn", (n, hc * hidden)), ckpt.vector(f"{prefix}_base", n),
                   ckpt.vector(f"{prefix}_scale", 3), hc, sinkhorn_iters, hc_eps, norm_eps)  # fmt: skip

    @property
    def nbytes(self) -> int:
        return self.fn_t.nbytes + self.base.nbytes + self.scale.nbytes

    def mixes(self, streams: np.ndarray) -> np.ndarray:
        """``m [N, (2 + hc) * hc]`` of streams ``[N, hc, H]``: the normalised flattened streams times ``fn``
        (transformers' order)."""
        return rms_norm(streams.reshape(streams.shape[0], -1), self.ones, self.norm_eps) @ self.fn_t

    def scaled(self, m: np.ndarray, scale: np.float32, base: np.ndarray) -> np.ndarray:
        """A slice of the mixes scaled and shifted: ``m * scale + base``."""
        return m * scale + base

    def weights(self, streams: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(pre [N, hc], post [N, hc], comb [N, hc, hc])`` of streams ``[N, hc, H]``."""
        N, hc = streams.shape[0], self.hc
        m = self.mixes(streams)
        b, s, z = self.base, self.scale, self.scaled
        pre = sigmoid(z(m[:, :hc], s[0], b[:hc])) + self.eps
        post = F32(2) * sigmoid(z(m[:, hc : 2 * hc], s[1], b[hc : 2 * hc]))
        comb = softmax(z(m[:, 2 * hc :].reshape(N, hc, hc), s[2], b[2 * hc :].reshape(hc, hc))) + self.eps
        comb = comb / (np.sum(comb, axis=-2, keepdims=True, dtype=F32) + self.eps)
        for _ in range(self.iters - 1):
            comb = comb / (np.sum(comb, axis=-1, keepdims=True, dtype=F32) + self.eps)
            comb = comb / (np.sum(comb, axis=-2, keepdims=True, dtype=F32) + self.eps)
        return pre.astype(F32), post.astype(F32), comb.astype(F32)

    def collapse(self, streams: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(post [N, hc], comb [N, hc, hc], block input [N, H] = sum_i pre_i stream_i)``."""
        pre, post, comb = self.weights(streams)
        return post, comb, np.sum(pre[:, :, None] * streams, axis=1, dtype=F32)

    @staticmethod
    def expand(streams: np.ndarray, out: np.ndarray, post: np.ndarray, comb: np.ndarray) -> np.ndarray:
        """The new streams ``x'_k = post_k * out + sum_j comb[j, k] x_j`` (``comb`` used transposed, as
        transformers does)."""
        return post[:, :, None] * out[:, None, :] + comb.swapaxes(-1, -2) @ streams

    def __call__(self, streams: np.ndarray, block) -> np.ndarray:
        """New streams after ``block`` (a function of the collapsed ``[N, H]`` input)."""
        post, comb, x = self.collapse(streams)
        return self.expand(streams, block(x), post, comb)


class HyperStreams:
    """Into and out of the streams: ``expand`` copies the embedding ``hc`` times, ``head`` takes their mean."""

    def __init__(self, hc: int):
        self.hc = hc

    def expand(self, x: np.ndarray) -> np.ndarray:
        return np.repeat(x[:, None, :], self.hc, axis=1)

    def head(self, streams: np.ndarray) -> np.ndarray:
        return np.mean(streams, axis=1, dtype=F32)


class HyperDecoderLayer:
    """A decoder layer on streams: ``S = attn_hc(S, norm_in -> attn)`` then ``S = ffn_hc(S, norm_post -> ffn)``;
    the call of ``family.DecoderLayer`` (``(streams, carry)`` out; the token mixer's ``mix`` sets the carry)."""

    def __init__(self, attn, ffn, norm_in, norm_post, eps: float, attn_hc: HyperConnection,
                 ffn_hc: HyperConnection):  # fmt: skip
        self.attn, self.ffn, self.norm_in, self.norm_post, self.eps = attn, ffn, norm_in, norm_post, eps
        self.attn_hc, self.ffn_hc = attn_hc, ffn_hc

    @property
    def nbytes(self) -> int:
        n = self.norm_in.nbytes + self.norm_post.nbytes + self.attn.nbytes + self.ffn.nbytes
        return n + self.attn_hc.nbytes + self.ffn_hc.nbytes

    def reset(self) -> None:
        self.attn.reset()

    def __call__(self, x, positions, cos, sin, carry):
        out_carry = carry

        def attn(h):
            nonlocal out_carry
            a, out_carry = self.attn.mix(rms_norm(h, self.norm_in, self.eps), positions, cos, sin, carry)
            return a

        x = self.attn_hc(x, attn)
        x = self.ffn_hc(x, lambda h: self.ffn(rms_norm(h, self.norm_post, self.eps)))
        return x, out_carry
