"""KDA, Kimi Delta Attention (Kimi-Linear ``kimi_linear`` and GLM-5.3-Flash ``glm5_next`` ``linear_attention``
layers): a Gated DeltaNet whose decay is per key channel instead of per head.

Per layer (transformers ``KimiLinearDeltaAttention`` / ``Glm5NextTextLinearAttention``, float32)::

    q, k, v = split(silu(causal_depthwise_conv1d([q_proj x | k_proj x | v_proj x])))   # kernel [3C, 1, K]
    g = f_b_proj(f_a_proj x) + dt_bias                         # [N, heads, head_dim], per channel
    g = -exp(A_log)[head] * softplus(g)                        # Kimi-Linear (log-space decay)
    g = linear_lower_bound * sigmoid(exp(A_log)[head] * g)     # GLM-5.3 (the "safe" lower bound)
    beta = sigmoid(b_proj x)                                   # per head
    o = kda_rule(l2norm(q) / sqrt(d), l2norm(k), v, g, beta)
    out = o_proj(RMSNorm(o) * o_norm * sigmoid(g_b_proj(g_a_proj x)))   # gated RMSNorm per head, eps rms_norm_eps

The state ``S [heads, dk, dv]``: ``S = S * exp(g_t)`` (each key channel its own decay), then
``S += k_t (beta_t (v_t - S^T k_t))^T`` and ``o_t = S^T q_t``. On disk the three convolutions are
``self_attn.{q,k,v}_conv1d.weight [C, 1, K]`` (transformers concatenates them into one ``conv1d``), the forget
gate's tensors sit directly under ``self_attn`` (transformers: ``self_attn.forget_gate.``); ``A_log`` is
``[1, 1, heads, 1]`` (Kimi-Linear) or ``[heads]`` (GLM-5.3). As in ``linear_attention.py``, a prefill runs
transformers' chunked form (``chunk_kimi_delta_attention``, chunks of 64), a one-token decode with a state the
recurrent one (``recurrent_kimi_delta_attention``); the conv and delta-rule state are this layer's cache.
"""

from __future__ import annotations

import numpy as np

from colitools.formats.families import kda_shapes
from colitools.formats.names import module_path
from colitools.runtime.attention import TokenMixer
from colitools.runtime.config import ModelArgs
from colitools.runtime.linear_attention import CHUNK, ConvState, _unit_lower_solve, l2norm
from colitools.runtime.ops import Linear, rms_norm, sigmoid, silu
from colitools.runtime.weights import Checkpoint

F32 = np.float32


def softplus20(x: np.ndarray) -> np.ndarray:
    """transformers' KDA softplus: ``x`` above 20, else ``log(1 + exp(x))`` (not ``log1p``)."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log(F32(1.0) + np.exp(np.minimum(x, F32(20))))).astype(F32)


def recurrent_kda(q, k, v, g, beta, state):
    """``recurrent_kimi_delta_attention`` on ``[N, H, d]`` inputs (q, k l2-normed, q scaled), ``g [N, H, dk]``;
    returns ``(out [N, H, dv], state [H, dk, dv])``."""
    out = np.empty_like(v)
    S = state
    for t in range(q.shape[0]):
        S = S * np.exp(g[t])[:, :, None]
        kv_mem = np.sum(S * k[t][:, :, None], axis=-2, dtype=F32)
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.sum(S * q[t][:, :, None], axis=-2, dtype=F32)
    return out, S


def chunked_kda(q, k, v, g, beta, state, chunk: int = CHUNK):
    """``chunk_kimi_delta_attention`` on ``[N, H, d]`` inputs (q, k l2-normed, q scaled), ``g [N, H, dk]``,
    ``state [H, dk, dv]``; returns ``(out [N, H, dv], state)``."""
    N = q.shape[0]
    pad = (chunk - N % chunk) % chunk
    q, k, v, g = (np.pad(t.transpose(1, 0, 2), ((0, 0), (0, pad), (0, 0))) for t in (q, k, v, g))  # [H, T, d]
    beta = np.pad(beta.T, ((0, 0), (0, pad)))  # [H, T]
    H, T, dk = k.shape
    dv = v.shape[-1]
    nc = T // chunk
    v_beta = (v * beta[..., None]).reshape(H, nc, chunk, dv)
    k_beta = (k * beta[..., None]).reshape(H, nc, chunk, dk)
    q, k = q.reshape(H, nc, chunk, dk), k.reshape(H, nc, chunk, dk)
    cum = np.cumsum(g.reshape(H, nc, chunk, dk), axis=-2, dtype=F32)  # [H, nc, c, dk]
    upper = np.triu(np.ones((chunk, chunk), dtype=bool), 1)
    diff = cum[..., :, None, :] - cum[..., None, :, :]  # [H, nc, i, j, dk] = g_i - g_j
    decay = np.exp(np.where(upper[..., None], F32(-np.inf), diff))
    ut = np.einsum("hnid,hnjd,hnijd->hnij", k_beta, k, decay, optimize=True)
    ut = np.where(np.triu(np.ones((chunk, chunk), dtype=bool))[None, None], F32(0), ut)  # strictly lower
    intra = np.einsum("hnid,hnjd,hnijd->hnij", q, k, decay, optimize=True)
    intra = np.where(upper[None, None], F32(0), intra)
    new_values = _unit_lower_solve(ut, v_beta)
    k_cumdecay = _unit_lower_solve(ut, k_beta * np.exp(cum))
    qd = q * np.exp(cum)
    kd = k * np.exp(cum[..., -1:, :] - cum)
    last = np.exp(cum[..., -1, :])  # [H, nc, dk]
    S = state.astype(F32)
    out = np.empty((H, nc, chunk, dv), dtype=F32)
    for i in range(nc):
        v_new = new_values[:, i] - k_cumdecay[:, i] @ S
        out[:, i] = qd[:, i] @ S + intra[:, i] @ v_new
        S = S * last[:, i][:, :, None] + kd[:, i].swapaxes(-1, -2) @ v_new
    return out.reshape(H, T, dv)[:, :N].transpose(1, 0, 2), S


class KimiDeltaAttention(TokenMixer):
    """One KDA ``self_attn`` layer with its conv and recurrent state (``args.kda``; shapes
    ``formats/families.kda_shapes``)."""

    def __init__(self, args: ModelArgs, ckpt: Checkpoint, layer: int):
        kda = args.kda
        p = module_path(layer, "self_attn")
        H = args.hidden_size
        self.nh, self.d = kda.num_heads, kda.head_dim
        C = self.nh * self.d
        self.C = C
        shapes = kda_shapes(H, self.nh, self.d)

        def load(leaf: str) -> Linear:
            return Linear.load(ckpt, f"{p}.{leaf}", *shapes[leaf])

        self.q, self.k, self.v = load("q_proj"), load("k_proj"), load("v_proj")
        K = kda.conv_kernel
        self.conv = ConvState(
            np.concatenate([ckpt.array(f"{p}.{n}_conv1d.weight", (C, 1, K)) for n in ("q", "k", "v")], axis=0)
        )
        self.f_a, self.f_b = load("f_a_proj"), load("f_b_proj")
        self.dt_bias = ckpt.vector(f"{p}.dt_bias", C)
        self.decay_rate = np.exp(self.load_a_log(ckpt, p, kda)).reshape(self.nh, 1)  # [H, 1]
        self.lower_bound = kda.lower_bound
        self.b = load("b_proj")
        self.gate = self.load_gate(ckpt, p, load)
        self.o_norm = ckpt.vector(f"{p}.o_norm.weight", self.d)
        self.o = load("o_proj")
        self.projections = [self.q, self.k, self.v, self.f_a, self.f_b, self.b, *self.gate, self.o]
        self.eps = args.rms_norm_eps
        self.chunk = CHUNK  # transformers' chunk size; any size gives the same function (tests use a small one)
        self.state: np.ndarray | None = None

    def load_a_log(self, ckpt: Checkpoint, p: str, kda) -> np.ndarray:
        """``A_log`` per head: ``[1, 1, heads, 1]`` (Kimi-Linear) or ``[heads]`` (GLM-5.3)."""
        return ckpt.array(f"{p}.A_log", (1, 1, self.nh, 1) if kda.a_log_4d else (self.nh,))

    def load_gate(self, ckpt: Checkpoint, p: str, load) -> list[Linear]:
        """The output gate's projections, applied in order: ``g_a_proj`` then ``g_b_proj``."""
        return [load("g_a_proj"), load("g_b_proj")]

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.projections) + self.conv.w.nbytes

    def reset(self) -> None:
        self.conv.reset()
        self.state = None

    def forget_gate(self, x: np.ndarray) -> np.ndarray:
        """Log-space decay ``[N, heads, head_dim]``."""
        g = (self.f_b(self.f_a(x)) + self.dt_bias).reshape(x.shape[0], self.nh, self.d)
        if self.lower_bound is not None:
            return (F32(self.lower_bound) * sigmoid(self.decay_rate * g)).astype(F32)
        return (-self.decay_rate * softplus20(g)).astype(F32)

    def __call__(self, x: np.ndarray, positions=None, cos=None, sin=None) -> np.ndarray:
        N, C = x.shape[0], self.C
        mixed = silu(self.conv(np.concatenate([self.q(x), self.k(x), self.v(x)], axis=-1)))
        q = l2norm(mixed[:, :C].reshape(N, self.nh, self.d))
        k = l2norm(mixed[:, C : 2 * C].reshape(N, self.nh, self.d))
        v = np.ascontiguousarray(mixed[:, 2 * C :]).reshape(N, self.nh, self.d)
        g = self.forget_gate(x)
        beta = sigmoid(self.b(x))
        q = q * F32(1 / (self.d**0.5))
        if self.state is not None and N == 1:
            o, self.state = recurrent_kda(q, k, v, g, beta, self.state)
        else:
            state = self.state if self.state is not None else np.zeros((self.nh, self.d, self.d), F32)
            o, self.state = chunked_kda(q, k, v, g, beta, state, self.chunk)
        gate = x
        for m in self.gate:
            gate = m(gate)
        gate = gate.reshape(N, self.nh, self.d)
        o = rms_norm(o, self.o_norm, self.eps) * sigmoid(gate)
        return self.o(o.reshape(N, C))
