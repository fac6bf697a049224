"""DeepSeek-V4's activation rounding (``colitools run --act-quant official``): the quantize-dequantize steps
DeepSeek's own inference applies to activations, as colibri's engine reproduces them (c/deepseek_v4.c:
``coli_fp8_activation_qdq_ref``, ``coli_fp4_activation_qdq_ref``, ``coli_hadamard_bf16_ref``,
``coli_bf16_round``), so the runtime can be compared token for token with that engine and with DeepSeek's
inference rather than with transformers' float activations (the default, ``ActQuant.mode`` None).

* Before every FP8 projection (``attn.wq_a`` / ``wq_b`` / ``wkv`` / ``wo_a`` / ``wo_b``, ``attn.indexer.wq_b``,
  the shared experts) and every FP4 routed expert (gate / up on the input, down on the hidden): the input in
  blocks of 128 along the row, each block scaled by a UE8M0 power of two ``2^ceil(log2(max(amax, 1e-4) / 448))``
  and rounded to e4m3fn (nearest, ties to even), then multiplied back.
* The KV head's non-rope part and the attention compressor's entries' non-rope part: the same e4m3 rounding in
  blocks of 64, then BF16 (round to nearest even).
* The lightning indexer's queries (per head, after BF16 and RoPE) and its compressor's entries: a Hadamard
  rotation (Sylvester order, ``/ sqrt(d)``, BF16), then e2m1 in blocks of 32 (scale
  ``2^ceil(log2(max(amax, 6 * 2^-126) / 6))``, nearest of the 16 codes, ties to the smaller magnitude), then BF16.
* BF16 activations between the steps, where the engine rounds them (``coli_bf16_round_array``): every projection's
  output, the norms' outputs, the hyper-connection states, the roped query / key / compressed entry, the
  attention's probabilities (before the value product; the denominator sums them unrounded) and output, each
  routed expert's gate / up and its activation times its routing weight (applied before ``w2``), the MoE sum with
  the shared expert.
* Sums in index order: every RMS norm's mean square (the blocks' and the final norm, the query's low-rank and
  per-head norms, the KV and compressor norms; ``ordered_mean_square``) and the hyper-connections' mixes
  (``deepseek_v4_hc.reference_mixes``: ``ordered_mean_square`` and ``ordered_dot``) add their terms (each
  rounded to F32) one after another from the first channel, as ``coli_v4_rmsnorm`` / ``coli_v4_hc_pre`` /
  ``final_hidden`` loop; DeepSeek's reference leaves the order to torch. numpy's pairwise mean and BLAS dot
  differ in the last bit, which the BF16 rounding of the block input turns into whole BF16 steps on some
  channels (the 128-wide check's divergences, docs/FORMATS.md §4).
* The hyper-connections' scaled mixes ``mixes * scale + base`` (before the sigmoids and the Sinkhorn softmax) as one
  fused multiply-add (``fma``): DeepSeek's ``hc_split_sinkhorn`` is a CUDA kernel, which contracts it by default,
  and colibri's engine build does the same; the other multiply-adds keep two roundings, as DeepSeek's torch code
  (``hc_post``, ``hc_head``) writes them.
* Every row alone (``ActQuant.row_by_row``): a layer and the head take a batch of positions one row at a time, so
  a row's arithmetic is decode's whatever the batch (prefill = token-by-token decode, bit for bit). The engine
  evaluates every row alike; numpy's multi-row matmuls sum in another order than its one-row ones (~3e-6), and
  an emulated rounding can magnify that to a different code (0.44 in the logits on the 128-wide fixture).
  Matvecs alone would not do: the attention's sums over a prefill's masked keys are ordered otherwise too.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from colitools.runtime.ops import rms_norm as float_rms_norm

F32 = np.float32
OFFICIAL = "official"
MODES = (OFFICIAL,)
FP8_MAX, FP8_FLOOR = F32(448.0), F32(1e-4)
FP4_MAX, FP4_FLOOR = F32(6.0), F32(6.0 * 2.0**-126)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], F32)  # the magnitudes of codes 0..7


def _blocks(x: np.ndarray, block: int) -> tuple[np.ndarray, int]:
    """``x [..., n]`` as ``[..., ceil(n / block), block]`` (zero padded: zeros change no block's amax), and n."""
    n = x.shape[-1]
    pad = -n % block
    if pad:
        x = np.concatenate([x, np.zeros((*x.shape[:-1], pad), F32)], axis=-1)
    return x.reshape(*x.shape[:-1], -1, block), n


def _pow2_scale(amax: np.ndarray, top: np.float32, floor: np.float32) -> np.ndarray:
    """``2^ceil(log2(max(amax, floor) / top))`` exactly (``frexp``: a power of two keeps its own exponent),
    the exponent clamped to [-127, 127] as a UE8M0 byte holds it."""
    mantissa, exponent = np.frexp(np.maximum(amax, floor) / top)
    exponent = np.where(mantissa == 0.5, exponent - 1, exponent)
    return np.ldexp(F32(1.0), np.clip(exponent, -127, 127)).astype(F32)


def fp8_qdq(x: np.ndarray, block: int) -> np.ndarray:
    """e4m3fn quantize-dequantize of ``x`` along its last axis in blocks of ``block`` (UE8M0 scales)."""
    b, n = _blocks(np.asarray(x, F32), block)
    scale = _pow2_scale(np.max(np.abs(b), axis=-1, keepdims=True), FP8_MAX, FP8_FLOOR)
    codes = np.clip(b / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    return (codes.astype(F32) * scale).reshape(*x.shape[:-1], -1)[..., :n]


def fp4_qdq(x: np.ndarray, block: int) -> np.ndarray:
    """e2m1 quantize-dequantize of ``x`` along its last axis in blocks of ``block`` (UE8M0 scales)."""
    b, n = _blocks(np.asarray(x, F32), block)
    scale = _pow2_scale(np.max(np.abs(b), axis=-1, keepdims=True), FP4_MAX, FP4_FLOOR)
    v = np.clip(b / scale, -FP4_MAX, FP4_MAX)
    nearest = np.argmin(np.abs(np.abs(v)[..., None] - E2M1), axis=-1)  # first of two equal: the smaller
    out = np.copysign(E2M1[nearest], v) * scale
    return out.reshape(*x.shape[:-1], -1)[..., :n].astype(F32)


def ordered_mean_square(x: np.ndarray) -> np.ndarray:
    """``mean(x^2)`` over the last axis, kept as ``[..., 1]``: the squares rounded to F32 and summed in index order,
    one F32 rounding per addition (``np.cumsum`` is sequential), then divided by the width."""
    total = np.cumsum(np.square(x, dtype=F32), axis=-1, dtype=F32)[..., -1:]
    return (total / F32(x.shape[-1])).astype(F32)


def ordered_dot(x: np.ndarray, w_t: np.ndarray) -> np.ndarray:
    """``x [N, K] @ w_t [K, M]`` with every product rounded to F32 and each output's products summed in index
    order, one F32 rounding per addition (``[N, M]``)."""
    products = np.asarray(x, F32)[:, :, None] * np.asarray(w_t, F32)[None, :, :]  # [N, K, M]
    return np.cumsum(products, axis=1, dtype=F32)[:, -1, :]


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """F32 fused multiply-add ``a * b + c`` with one rounding: the product of two F32 is exact in F64, the sum is
    rounded to odd in F64 (TwoSum gives its error; an inexact sum with an even last bit moves one step toward it),
    and an F64 rounded to odd rounds to the same F32 as the exact value."""
    a, b, c = (np.asarray(v, F32).astype(np.float64) for v in np.broadcast_arrays(a, b, c))
    p = a * b
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to BF16 (nearest, ties to even) and back."""
    return np.asarray(x, F32).astype(ml_dtypes.bfloat16).astype(F32)


def hadamard(x: np.ndarray) -> np.ndarray:
    """The Walsh-Hadamard transform of the last axis (a power of two), butterflies of widths 1, 2, 4, ... as
    ``coli_hadamard_bf16_ref`` runs them, times ``1 / sqrt(n)``, rounded to BF16."""
    y = np.array(x, F32, copy=True)
    n = y.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hadamard: {n} is not a power of two")
    width = 1
    while width < n:
        v = y.reshape(*y.shape[:-1], n // (2 * width), 2, width)
        left, right = v[..., 0, :].copy(), v[..., 1, :].copy()
        v[..., 0, :], v[..., 1, :] = left + right, left - right
        width *= 2
    return bf16(y * (F32(1.0) / np.sqrt(F32(n))))


class ActQuant:
    """The model's activation rounding (one per model, in ``V4Args``): ``mode`` None (float activations, as
    transformers) or ``official``; every method is the identity when off."""

    def __init__(self) -> None:
        self.mode: str | None = None

    @property
    def on(self) -> bool:
        return self.mode is not None

    def matvec_input(self, x: np.ndarray) -> np.ndarray:
        """Before an FP8 / FP4 matvec: e4m3 in blocks of 128."""
        return fp8_qdq(x, 128) if self.on else x

    def nope(self, x: np.ndarray, rope_dim: int) -> np.ndarray:
        """A KV head's / compressed entry's non-rope channels (the leading ``d - rope_dim``): e4m3 in blocks of
        64, then BF16; the rope channels BF16."""
        if not self.on:
            return x
        d = x.shape[-1] - rope_dim
        return np.concatenate([bf16(fp8_qdq(x[..., :d], 64)), bf16(x[..., d:])], axis=-1)

    def rotated_fp4(self, x: np.ndarray) -> np.ndarray:
        """The indexer's queries and keys: Hadamard, e2m1 in blocks of 32, BF16."""
        return bf16(fp4_qdq(hadamard(x), 32)) if self.on else x

    def round_bf16(self, x: np.ndarray) -> np.ndarray:
        return bf16(x) if self.on else x

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        """RMS norm over the last axis (``weight`` None: unweighted); when on, ``ordered_mean_square``'s order."""
        if not self.on:
            return float_rms_norm(x, weight if weight is not None else F32(1.0), eps)
        y = x * (F32(1.0) / np.sqrt(ordered_mean_square(x) + F32(eps)))
        return y if weight is None else weight * y

    def row_by_row(self, fn, rows: np.ndarray, *per_row: np.ndarray):
        """``fn(rows, *per_row)``, or, when on and there are several rows, ``fn`` on each row alone in order
        (``rows[i : i + 1]`` with the same slice of every ``per_row`` array; state such as the KV caches then grows
        as in decode) with the results concatenated along the first axis (a tuple result: element-wise)."""
        if not self.on or rows.shape[0] < 2:
            return fn(rows, *per_row)
        outs = [fn(rows[i : i + 1], *(a[i : i + 1] for a in per_row)) for i in range(rows.shape[0])]
        if isinstance(outs[0], tuple):
            return tuple(np.concatenate(parts) for parts in zip(*outs, strict=True))
        return np.concatenate(outs)


def attend_bf16(
    q: np.ndarray, kv: np.ndarray, allowed: np.ndarray, scale: float, sinks: np.ndarray
) -> np.ndarray:
    """One shared K = V head with per-head sinks, as the engine's ``sparse_attention`` rounds it: ``q [N, h,
    D]``, ``kv [T, D]``, ``allowed [N, T]`` -> ``[N, h * D]``: ``p_t = exp(s_t - max_t s)``, the denominator
    ``exp(sink - max) + sum p_t`` unrounded, the numerator ``sum bf16(p_t) kv_t``, the quotient in BF16."""
    scores = np.where(allowed[:, None, :], (q @ kv.T) * F32(scale), -np.inf).astype(F32)  # [N, h, T]
    top = np.max(scores, axis=-1, keepdims=True)
    p = np.exp(scores - top).astype(F32)
    den = np.exp(sinks.astype(F32)[None, :, None] - top) + np.sum(p, axis=-1, keepdims=True, dtype=F32)
    out = (bf16(p) @ kv) / den
    return bf16(out).reshape(q.shape[0], -1)


class QuantizedInput:
    """An FP8 projection whose input is rounded first (``ActQuant.matvec_input``)."""

    __slots__ = ("linear", "quant")

    def __init__(self, linear, quant: ActQuant):
        self.linear, self.quant = linear, quant

    @property
    def nbytes(self) -> int:
        return self.linear.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        q = self.quant
        return q.round_bf16(self.linear(q.matvec_input(x)))
