"""Float32 building blocks shared by every family: norms, softmax, SiLU, dense linear layers and MLPs.

All math is float32 and follows transformers' float32 forward: RMSNorm is ``w * (x * rsqrt(mean(x^2) + eps))``,
softmax subtracts the row max, SiLU is ``x * sigmoid(x)``.
"""

from __future__ import annotations

import numpy as np

from colitools.formats.families import mlp_shapes
from colitools.formats.registry import Float, lookup
from colitools.runtime.kernels import QTensor
from colitools.runtime.weights import Checkpoint, decode_stored, qtensor

F32 = np.float32


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis (float32)."""
    var = np.mean(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32)
    return weight * (x * (F32(1.0) / np.sqrt(var + F32(eps))))


def norm_weight(ckpt: Checkpoint, name: str, n: int, zero_centred: bool = False) -> np.ndarray:
    """An RMSNorm weight ``[n]``; ``zero_centred`` (Qwen3-Next, Qwen3.5: the checkpoint stores ``w``, the norm
    scales by ``1 + w``) returns ``1 + w`` in float32, as transformers computes it."""
    w = ckpt.vector(name, n)
    return (w + F32(1.0)).astype(F32) if zero_centred else w


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis with biased variance (``torch.nn.LayerNorm``)."""
    mean = np.mean(x, axis=-1, keepdims=True, dtype=F32)
    d = x - mean
    var = np.mean(np.square(d), axis=-1, keepdims=True, dtype=F32)
    return (d / np.sqrt(var + F32(eps))) * weight + bias


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Float32 softmax; rows that are entirely ``-inf`` are not expected (causal rows always see themselves)."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True, dtype=F32)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives the right limit, -0
        return x / (F32(1.0) + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-x))


class Linear:
    """A resident dense layer ``y = x @ W.T (+ b)``. ``W`` is a ``QTensor``: a quantized weight keeps its codes
    and runs a kernel (int8-row dense weights take a quarter of float32's memory and bandwidth); a float weight
    is float32."""

    __slots__ = ("weight", "bias")

    def __init__(self, weight: QTensor, bias: np.ndarray | None = None):
        self.weight = weight
        self.bias = bias

    @classmethod
    def load(cls, ckpt: Checkpoint, prefix: str, O: int, I: int, bias: bool | None = False) -> Linear:
        """``prefix.weight`` (and ``prefix.bias``: True = required, None = if present)."""
        b = None
        if bias or (bias is None and ckpt.has(prefix + ".bias")):
            b = ckpt.vector(prefix + ".bias", O)
        return cls(ckpt.resident(prefix + ".weight", O, I), b)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + (0 if self.bias is None else self.bias.nbytes)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self.weight.matmul(x)
        return y + self.bias if self.bias is not None else y


class Embedding:
    """Token embeddings (and other lookup tables: DeepSeek-V4.1's engram rows). Row-wise quantized tables keep
    their codes and decode only the looked-up rows (with the registry's reference decoder, so values equal a full
    decode); other storage is decoded at load."""

    def __init__(self, ckpt: Checkpoint, name: str, V: int, H: int):
        st = ckpt.stored(name, V, H)
        data, scale = ckpt.read_stored(st)
        self.V, self.H = V, H
        fmt = lookup(st.form)  # None for "float" / "fp8-source"
        if fmt is not None and fmt.rowwise_scales and not st.planar:
            self.table = None
            self.fmt, self.gs = fmt, st.gs
            if fmt.matmul_kind is None:  # a table no kernel multiplies (fp8-e4m3-e8m0-r32): rows only, no head
                self.q = None
                self.codes = np.frombuffer(data, dtype=np.uint8).reshape(V, -1)
                self.scales = np.frombuffer(scale, dtype=fmt.scale_numpy).reshape(V, -1)
            else:
                self.q = qtensor(st, memoryview(data), memoryview(scale))
                self.codes, self.scales = self.q.codes.view(np.uint8), self.q.scales
        else:
            self.table = decode_stored(st, data, scale)
            self.q = QTensor(Float.matmul_kind, self.table, None, V, H, None)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes if self.q is not None else self.codes.nbytes + self.scales.nbytes

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        if self.table is not None:
            return self.table[ids]
        return self.fmt.decode(self.codes[ids], self.scales[ids], len(ids), self.H, self.gs).astype(F32)


class MLP:
    """``down(silu(gate(x)) * up(x))`` with resident weights (dense layers, shared experts; shapes
    ``formats/families.mlp_shapes``)."""

    def __init__(self, ckpt: Checkpoint, prefix: str, hidden: int, inter: int):
        shapes = mlp_shapes(hidden, inter)
        self.gate, self.up, self.down = (
            Linear.load(ckpt, f"{prefix}.{leaf}", *shapes[leaf])
            for leaf in ("gate_proj", "up_proj", "down_proj")
        )

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.down(silu(self.gate(x)) * self.up(x))
