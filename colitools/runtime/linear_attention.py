"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5-MoE ``linear_attention`` layers).

Per layer (transformers ``Qwen3NextGatedDeltaNet`` / ``Qwen3_5MoeGatedDeltaNet``, float32)::

    q, k, v, z, b, a = in_proj(x)            # fused head-grouped (Qwen3-Next) or separate (Qwen3.5)
    q, k, v = split(silu(causal_depthwise_conv1d([q | k | v])))     # kernel [C, 1, K], no bias
    beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)     # per value head, log-space decay
    o = gated_delta_rule(l2norm(q) / sqrt(dk), l2norm(k), v, g, beta)
    out = out_proj(RMSNorm(o) * w * silu(z))                        # gated RMSNorm per value head, plain w

The delta rule keeps a state ``S [value_heads, dk, dv]`` per layer: ``S = S * exp(g_t)``, then
``S += k_t (beta_t (v_t - S^T k_t))^T`` and ``o_t = S^T q_t``; key heads serve ``value_heads / key_heads``
consecutive value heads. A prefill (more than one token, or no state yet) runs transformers' chunked form
(``torch_chunk_gated_delta_rule``, chunks of 64 with the UT transform, solved here by forward substitution), a
one-token decode with a state its recurrent form (``torch_recurrent_gated_delta_rule``), as transformers
does; the two are the same function up to float32 rounding.

The state (the conv's last ``K - 1`` inputs and ``S``) is this layer's part of the runtime's cache: it grows
with every call and ``reset()`` empties it, like the attention layers' KV buffers.
"""

from __future__ import annotations

import numpy as np

from colitools.formats.families import gated_deltanet_shapes
from colitools.formats.names import module_path
from colitools.runtime.attention import TokenMixer
from colitools.runtime.config import ModelArgs
from colitools.runtime.ops import Linear, rms_norm, sigmoid, silu
from colitools.runtime.weights import Checkpoint

F32 = np.float32
CHUNK = 64  # transformers' chunk_size
L2_EPS = 1e-6  # transformers l2norm eps (FLA's)


def l2norm(x: np.ndarray) -> np.ndarray:
    """``x * rsqrt(sum(x^2) + 1e-6)`` over the last axis (transformers / FLA ``l2norm``)."""
    return x * (F32(1.0) / np.sqrt(np.sum(x * x, axis=-1, keepdims=True, dtype=F32) + F32(L2_EPS)))


def softplus(x: np.ndarray) -> np.ndarray:
    """``torch.nn.functional.softplus`` (beta 1, threshold 20): ``x`` above 20, else ``log1p(exp(x))``."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, F32(20))))).astype(F32)


class ConvState:
    """Causal depthwise conv1d over the channels of ``[N, C]`` with the last ``K - 1`` inputs as state."""

    def __init__(self, weight: np.ndarray):
        self.w = np.ascontiguousarray(weight[:, 0, :].T)  # [K, C]
        self.K, self.C = self.w.shape
        self.reset()

    def reset(self) -> None:
        self.past = np.zeros((self.K - 1, self.C), dtype=F32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        N = x.shape[0]
        full = np.concatenate([self.past, x], axis=0)  # [K - 1 + N, C]
        out = full[0:N] * self.w[0]
        for j in range(1, self.K):
            out = out + full[j : j + N] * self.w[j]
        self.past = full[N:].copy() if self.K > 1 else self.past
        return out


def recurrent_delta_rule(q, k, v, g, beta, state):
    """transformers ``torch_recurrent_gated_delta_rule`` on ``[N, Hv, d]`` inputs (q, k already l2-normed and
    q scaled); returns ``(out [N, Hv, dv], state [Hv, dk, dv])``."""
    out = np.empty_like(v)
    S = state
    for t in range(q.shape[0]):
        S = S * np.exp(g[t])[:, None, None]
        kv_mem = np.sum(S * k[t][:, :, None], axis=-2, dtype=F32)  # [Hv, dv]
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.sum(S * q[t][:, :, None], axis=-2, dtype=F32)
    return out, S


def _unit_lower_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``X`` with ``(I + strictly_lower(L)) X = B`` (batched ``[..., C, C]`` / ``[..., C, d]``): transformers'
    ``solve_triangular(..., upper=False, unitriangular=True)`` by forward substitution."""
    X = np.empty_like(B)
    X[..., 0, :] = B[..., 0, :]
    for i in range(1, L.shape[-1]):
        X[..., i, :] = B[..., i, :] - (L[..., i : i + 1, :i] @ X[..., :i, :])[..., 0, :]
    return X


def chunked_delta_rule(q, k, v, g, beta, state, chunk: int = CHUNK):
    """transformers ``torch_chunk_gated_delta_rule`` on ``[N, Hv, d]`` inputs (q, k already l2-normed and q
    scaled), ``state`` ``[Hv, dk, dv]``; returns ``(out [N, Hv, dv], state)``."""
    N = q.shape[0]
    pad = (chunk - N % chunk) % chunk
    q, k, v = (np.pad(t.transpose(1, 0, 2), ((0, 0), (0, pad), (0, 0))) for t in (q, k, v))  # [Hv, T, d]
    g, beta = (np.pad(t.T, ((0, 0), (0, pad))) for t in (g, beta))  # [Hv, T]
    Hv, T, dk = k.shape
    dv = v.shape[-1]
    nc = T // chunk
    v_beta = (v * beta[..., None]).reshape(Hv, nc, chunk, dv)
    k_beta = (k * beta[..., None]).reshape(Hv, nc, chunk, dk)
    q, k = q.reshape(Hv, nc, chunk, dk), k.reshape(Hv, nc, chunk, dk)
    cum = np.cumsum(g.reshape(Hv, nc, chunk), axis=-1, dtype=F32)
    upper = np.triu(np.ones((chunk, chunk), dtype=bool), 1)
    pairwise = np.exp(np.where(upper, F32(-np.inf), cum[..., :, None] - cum[..., None, :]))
    kt = k.swapaxes(-1, -2)
    ut = (k_beta @ kt) * pairwise
    intra = (q @ kt) * pairwise
    new_values = _unit_lower_solve(ut, v_beta)
    k_cumdecay = _unit_lower_solve(ut, k_beta * np.exp(cum)[..., None])
    qd = q * np.exp(cum)[..., None]
    kd = k * np.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = np.exp(cum[..., -1])[..., None, None]  # [Hv, nc, 1, 1]
    S = state.astype(F32)
    out = np.empty((Hv, nc, chunk, dv), dtype=F32)
    for i in range(nc):
        v_new = new_values[:, i] - k_cumdecay[:, i] @ S
        out[:, i] = qd[:, i] @ S + intra[:, i] @ v_new
        S = S * chunk_decay[:, i] + kd[:, i].swapaxes(-1, -2) @ v_new
    return out.reshape(Hv, T, dv)[:, :N].transpose(1, 0, 2), S


class GatedDeltaNet(TokenMixer):
    """One ``linear_attn`` layer with its conv and recurrent state (``args.linear_attention``; shapes
    ``formats/families.gated_deltanet_shapes``)."""

    def __init__(self, args: ModelArgs, ckpt: Checkpoint, layer: int):
        la = args.linear_attention
        p = module_path(layer, "linear_attn")
        H = args.hidden_size
        self.nk, self.nv = la.num_key_heads, la.num_value_heads
        self.dk, self.dv = la.key_head_dim, la.value_head_dim
        self.rep = self.nv // self.nk
        self.kd, self.vd = self.nk * self.dk, self.nv * self.dv
        C = 2 * self.kd + self.vd
        self.fused = la.fused_projections
        shapes = gated_deltanet_shapes(H, self.nk, self.nv, self.dk, self.dv)

        def load(leaf: str) -> Linear:
            return Linear.load(ckpt, f"{p}.{leaf}", *shapes[leaf])

        if self.fused:
            self.in_qkvz, self.in_ba = load("in_proj_qkvz"), load("in_proj_ba")
            self.projections = [self.in_qkvz, self.in_ba]
        else:
            self.in_qkv, self.in_z, self.in_b, self.in_a = (
                load(f"in_proj_{k}") for k in ("qkv", "z", "b", "a")
            )
            self.projections = [self.in_qkv, self.in_z, self.in_b, self.in_a]
        self.conv = ConvState(ckpt.array(f"{p}.conv1d.weight", (C, 1, la.conv_kernel)))
        self.A = -np.exp(ckpt.vector(f"{p}.A_log", self.nv))  # float32, as transformers' -A_log.float().exp()
        self.dt_bias = ckpt.vector(f"{p}.dt_bias", self.nv)
        self.norm = ckpt.vector(f"{p}.norm.weight", self.dv)  # the gated norm scales by w itself
        self.out = load("out_proj")
        self.projections.append(self.out)
        self.eps = args.rms_norm_eps
        self.gate = silu  # the gated norm's activation of z (Qwen3.8's output_gate_type may make it sigmoid)
        self.state: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.projections) + self.conv.w.nbytes

    def reset(self) -> None:
        self.conv.reset()
        self.state = None

    def _project(self, x: np.ndarray):
        """``(mixed_qkv [N, C], z [N, Hv, dv], b [N, Hv], a [N, Hv])``."""
        N = x.shape[0]
        if not self.fused:
            return (self.in_qkv(x), self.in_z(x).reshape(N, self.nv, self.dv), self.in_b(x), self.in_a(x))
        # Qwen3-Next: per key head [q (dk) | k (dk) | v (rep*dv) | z (rep*dv)] and [b (rep) | a (rep)]
        qkvz = self.in_qkvz(x).reshape(N, self.nk, 2 * self.dk + 2 * self.rep * self.dv)
        ba = self.in_ba(x).reshape(N, self.nk, 2 * self.rep)
        d0, d1, d2 = self.dk, 2 * self.dk, 2 * self.dk + self.rep * self.dv
        q, k = qkvz[..., :d0].reshape(N, -1), qkvz[..., d0:d1].reshape(N, -1)
        v, z = qkvz[..., d1:d2].reshape(N, -1), qkvz[..., d2:].reshape(N, self.nv, self.dv)
        b, a = ba[..., : self.rep].reshape(N, self.nv), ba[..., self.rep :].reshape(N, self.nv)
        return np.concatenate([q, k, v], axis=-1), z, b, a

    def __call__(self, x: np.ndarray, positions=None, cos=None, sin=None) -> np.ndarray:
        N = x.shape[0]
        mixed, z, b, a = self._project(x)
        mixed = silu(self.conv(mixed))
        q = mixed[:, : self.kd].reshape(N, self.nk, self.dk)
        k = mixed[:, self.kd : 2 * self.kd].reshape(N, self.nk, self.dk)
        v = np.ascontiguousarray(mixed[:, 2 * self.kd :]).reshape(N, self.nv, self.dv)
        beta = sigmoid(b)
        g = (self.A * softplus(a + self.dt_bias)).astype(F32)
        if self.rep > 1:  # key head j serves value heads j*rep .. j*rep + rep - 1
            q, k = np.repeat(q, self.rep, axis=1), np.repeat(k, self.rep, axis=1)
        q, k = l2norm(q), l2norm(k)
        if self.state is not None and N == 1:  # transformers: q / sqrt(dk) here, q * dk^-0.5 when chunked
            o, self.state = recurrent_delta_rule(q / F32(self.dk**0.5), k, v, g, beta, self.state)
        else:
            state = self.state if self.state is not None else np.zeros((self.nv, self.dk, self.dv), F32)
            o, self.state = chunked_delta_rule(q * F32(self.dk**-0.5), k, v, g, beta, state)
        o = rms_norm(o, self.norm, self.eps) * self.gate(z)
        return self.out(o.reshape(N, self.vd))
