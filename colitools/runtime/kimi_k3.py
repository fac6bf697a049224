"""Kimi K3 (``kimi_k3``; no transformers model: the architecture as colibri's ``c/kimi_k3.c`` and its numpy
reference ``c/tools/k3_ref.py`` run it after ``modeling_kimi_linear.py``, read for facts only). Kimi-Linear's
hybrid stack (``kimi_linear.py``: KDA at ``linear_attn_config.kda_layers``, MLA without RoPE elsewhere) with:

```
x = embed[ids]; blocks = []                                # attention residuals: blocks [N, B, H]
for layer L (x: the running prefix sum):
    h = x if not blocks else res(blocks + [x], self_attention_res)
    if L % attn_res_block_size == 0: blocks += [x]; p = Attn(RMSNorm_in(h))      # a block starts
    else:                                           p = x + Attn(RMSNorm_in(h))
    x = p + FFN(RMSNorm_post(res(blocks + [p], mlp_res)))
logits = lm_head(RMSNorm_final(res(blocks + [x], output_attn_res)))
```
* ``res(states, r)``: per position, softmax over the states ``s`` of ``(s . (res_norm * res_proj)) /
  sqrt(mean(s^2) + rms_norm_eps)`` (the RMS-normed state projected on ``res_proj``), mixing the raw states.
* Attention, both kinds with a full-rank sigmoid output gate ``g_proj``: KDA (``kda.py``) with GLM-5.3's
  lower-bounded forget gate (``gate_lower_bound``), ``A_log`` stored ``[head_dim]`` (the heads' values
  zero-padded), ``o_proj(RMSNorm(o) * sigmoid(g_proj x))``; gated MLA without RoPE (``rms_norm_eps`` in
  ``q_a_layernorm`` / ``kv_a_layernorm``), ``o_proj(attention * sigmoid(g_proj x))``.
* SiTU-GLU everywhere (dense, shared and routed experts): ``down((b1 tanh(g / b1) sigmoid(g)) * (b2 tanh(u /
  b2)))``, ``b1 = activation_situ_beta``, ``b2 = activation_situ_linear_beta``.
* LatentMoE (layers from ``first_k_dense_replace``): sigmoid router + ``e_score_correction_bias`` top-k, weights
  the raw scores renormalised (``/ (sum + 1e-20)``); ``z = routed_expert_down_proj x`` into the
  ``routed_expert_hidden_size`` latent where the routed experts run, ``routed_expert_up_proj(RMSNorm(sum_e w_e
  E_e(z)))`` back, plus ``num_shared_experts`` shared experts at full width.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.names import layer_path, module_path
from colitools.runtime.attention import MLAAttention
from colitools.runtime.config import (
    ConfigKeys,
    KDAArgs,
    MLAArgs,
    ModelArgs,
    RopeArgs,
    mla_args,
    mla_head_dim,
    noaux_tc_args,
)
from colitools.runtime.experts import Expert, ExpertStore, expert_sources
from colitools.runtime.family import LayerContext, ModelIO, RuntimeFamily
from colitools.runtime.kda import KimiDeltaAttention
from colitools.runtime.kimi_linear import LAYER_TYPES, kda_layer_types
from colitools.runtime.moe import noaux_tc
from colitools.runtime.ops import Linear, rms_norm, sigmoid, softmax

F32 = np.float32


@dataclass(kw_only=True)
class KimiK3Args(ModelArgs):
    """The hybrid schedule, KDA, MLA, the attention-residual blocks, SiTU-GLU and the LatentMoE latent."""

    layer_types: list[str]
    kda: KDAArgs
    mla: MLAArgs
    res_block: int  # attn_res_block_size
    situ: tuple[float, float]  # activation_situ_beta, activation_situ_linear_beta
    latent: int  # routed_expert_hidden_size
    shared_inter: int  # num_shared_experts * moe_intermediate_size


def _k3_args(c: ConfigKeys, base: dict[str, Any]) -> KimiK3Args:
    n_layers = base["num_hidden_layers"]
    moe_layers, routing = noaux_tc_args(c, base)
    mla = dataclasses.replace(mla_args(c, base), latent_norm_eps=base["rms_norm_eps"])
    kda = KDAArgs(
        conv_kernel=int(c.need("linear_conv_kernel_dim")),
        num_heads=int(c.need("linear_num_heads")),
        head_dim=int(c.need("linear_head_dim")),
        lower_bound=float(c["linear_lower_bound"]),
        a_log_4d=False,
    )
    if kda.num_heads > kda.head_dim:
        raise RuntimeModelError(
            f"{c.where}: A_log is stored [head_dim]: {kda.num_heads} KDA heads do not fit"
        )
    args = KimiK3Args(
        **{**base, "moe_layers": moe_layers, "head_dim": mla_head_dim(mla)},
        layer_types=kda_layer_types(c, n_layers, LAYER_TYPES, ["full_attention"] * n_layers),
        kda=kda, mla=mla, routing=routing,
        rope=RopeArgs(dim=0),  # NoPE: the "rope" key slice passes through unrotated
        res_block=int(c.need("attn_res_block_size")),
        situ=(float(c.need("activation_situ_beta")), float(c.need("activation_situ_linear_beta"))),
        latent=int(c.need("routed_expert_hidden_size")),
        shared_inter=routing.shared_expert_intermediate_size,
    )  # fmt: skip
    return args  # attn_res_block_size >= 1: validated with the config facts (formats/model_config.py)


# ------------------------------------------------------------------------------------------- pieces
def situ_glu(g: np.ndarray, u: np.ndarray, b1: float, b2: float) -> np.ndarray:
    """SiTU-GLU: ``(b1 tanh(g / b1) sigmoid(g)) * (b2 tanh(u / b2))``."""
    b1, b2 = F32(b1), F32(b2)
    return ((b1 * np.tanh(g / b1) * sigmoid(g)) * (b2 * np.tanh(u / b2))).astype(F32)


def attn_res(states: np.ndarray, x: np.ndarray, query: np.ndarray, eps: float) -> np.ndarray:
    """Attention residual of ``states [N, B, H]`` and the partial state ``x [N, H]`` for ``query [H]``
    (``res_norm.weight * res_proj.weight``): softmax over the B + 1 entries of their RMS-normed projection on the
    query, mixing the raw entries."""
    v = np.concatenate([states, x[:, None]], axis=1)  # [N, B+1, H]
    ms = np.mean(np.square(v, dtype=np.float64), axis=-1)
    scores = np.einsum("nbh,h->nb", v.astype(np.float64), query.astype(np.float64)) / np.sqrt(ms + eps)
    return np.einsum("nb,nbh->nh", softmax(scores.astype(F32)), v).astype(F32)


def res_query(ckpt, prefix: str, H: int) -> np.ndarray:
    """``<prefix>_norm.weight * <prefix>_proj.weight``: the score vector of one attention residual."""
    return ckpt.vector(f"{prefix}_norm.weight", H) * ckpt.vector(f"{prefix}_proj.weight", H)


class SituMLP:
    """``down_proj(situ(gate_proj x, up_proj x))`` (dense layers, shared experts)."""

    def __init__(self, ckpt, prefix: str, H: int, inter: int, situ: tuple[float, float]):
        self.gate = Linear.load(ckpt, f"{prefix}.gate_proj", inter, H)
        self.up = Linear.load(ckpt, f"{prefix}.up_proj", inter, H)
        self.down = Linear.load(ckpt, f"{prefix}.down_proj", H, inter)
        self.situ = situ

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.down(situ_glu(self.gate(x), self.up(x), *self.situ))


class SituExpert(Expert):
    """A routed expert with SiTU-GLU: ``w2(situ(w1 z, w3 z))`` in the latent."""

    __slots__ = ("situ",)

    def __init__(self, gate, up, down, biases, situ: tuple[float, float]):
        super().__init__(gate, up, down, biases)
        self.situ = situ

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.down.matmul(situ_glu(self.gate.matmul(x), self.up.matmul(x), *self.situ))


class K3DeltaAttention(KimiDeltaAttention):
    """KDA with a full-rank output gate ``g_proj [C, H]`` and ``A_log`` stored ``[head_dim]`` (first heads used)."""

    def load_a_log(self, ckpt, p, kda):
        return ckpt.vector(f"{p}.A_log", kda.head_dim)[: self.nh].copy()

    def load_gate(self, ckpt, p, load):
        return [Linear.load(ckpt, f"{p}.g_proj", self.C, self.q.weight.I)]


class GatedMLA(MLAAttention):
    """MLA (no RoPE) whose attention output is gated, ``o_proj(attn * sigmoid(g_proj x))``."""

    def __init__(self, args: KimiK3Args, ckpt, layer: int, rope):
        super().__init__(args, ckpt, layer, rope, None)
        p, nv = module_path(layer, "self_attn"), args.num_attention_heads * args.mla.v_head_dim
        self.g = Linear.load(ckpt, f"{p}.g_proj", nv, args.hidden_size)
        self.out, self.o = self.o, _identity  # the parent's o_proj applies after the gate

    @property
    def nbytes(self) -> int:
        return (
            self.out.nbytes
            + self.g.nbytes
            + sum(m.nbytes for m in (self.kv_a, self.kv_b))
            + (self.q_a.nbytes + self.q_b.nbytes if self.q_lora else self.q_proj.nbytes)
        )

    def __call__(self, x, positions, cos, sin, shared_selection=None):
        attended, _ = super().__call__(x, positions, cos, sin)
        return self.out(attended * sigmoid(self.g(x))), None


def _identity(x: np.ndarray) -> np.ndarray:
    return x


class LatentMoE:
    """Sigmoid + correction-bias top-k, routed SiTU experts in the latent, ``routed_expert_norm``, back up, plus
    the shared experts at full width."""

    def __init__(self, args: KimiK3Args, ckpt, layer: int, ctx: LayerContext):
        p, H, E, L = module_path(layer, "mlp"), args.hidden_size, args.num_experts, args.latent
        self.args, self.usage = args, ctx.layer_usage(layer)
        self.router = Linear(ckpt.resident(f"{p}.gate.weight", E, H))
        self.bias = ckpt.vector(f"{p}.gate.e_score_correction_bias", E)
        self.down = Linear.load(ckpt, f"{p}.routed_expert_down_proj", L, H)
        self.up = Linear.load(ckpt, f"{p}.routed_expert_up_proj", H, L)
        self.norm = ckpt.vector(f"{p}.routed_expert_norm.weight", L)
        self.shared = SituMLP(ckpt, f"{p}.shared_experts", H, args.shared_inter, args.situ)

        def make(gate, up, down, biases=None):
            return SituExpert(gate, up, down, biases, args.situ)

        latent_args = dataclasses.replace(args, hidden_size=L)  # the routed experts' width
        self.store = ExpertStore(ckpt, layer, expert_sources(latent_args, ckpt, layer), E, None, make)
        ctx.stores[layer] = self.store

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in (self.router, self.down, self.up, self.shared)) + self.norm.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        a = self.args
        idx, w = noaux_tc(self.router(x), self.bias, a.num_experts_per_tok, 1, 1, True, 1.0)
        if self.usage is not None:
            self.usage.record(idx, w)
        z = self.down(x)
        u = np.zeros_like(z)
        for e in (int(e) for e in np.unique(idx)):  # ascending expert order
            tok, pos = np.nonzero(idx == e)
            u[tok] += self.store.get(e)(z[tok]) * w[tok, pos][:, None]
        return self.up(rms_norm(u, self.norm, a.rms_norm_eps)) + self.shared(x)


# ------------------------------------------------------------------------------------------- layers
class K3Layer:
    """A decoder layer whose inputs are attention residuals over the block states (``carry`` ``[N, B, H]``)."""

    def __init__(self, ctx: LayerContext, layer: int):
        args, ckpt, p, H = ctx.args, ctx.ckpt, layer_path(layer), ctx.args.hidden_size
        if args.layer_types[layer] == "linear_attention":
            self.attn = K3DeltaAttention(args, ckpt, layer)
        else:
            self.attn = GatedMLA(args, ckpt, layer, ctx.rope)
        if args.moe_layers[layer]:
            self.ffn = LatentMoE(args, ckpt, layer, ctx)
        else:
            self.ffn = SituMLP(ckpt, module_path(layer, "mlp"), H, args.intermediate_size, args.situ)
        self.norm_in = ckpt.vector(f"{p}.input_layernorm.weight", H)
        self.norm_post = ckpt.vector(f"{p}.post_attention_layernorm.weight", H)
        self.attn_query = res_query(ckpt, f"{p}.self_attention_res", H)
        self.mlp_query = res_query(ckpt, f"{p}.mlp_res", H)
        self.eps, self.boundary = args.rms_norm_eps, layer % args.res_block == 0

    @property
    def nbytes(self) -> int:
        return self.norm_in.nbytes + self.norm_post.nbytes + self.attn.nbytes + self.ffn.nbytes

    def reset(self) -> None:
        self.attn.reset()

    def __call__(self, x, positions, cos, sin, blocks):
        h = attn_res(blocks, x, self.attn_query, self.eps) if blocks.shape[1] else x
        a = self.attn(rms_norm(h, self.norm_in, self.eps), positions, cos, sin)
        a = a[0] if isinstance(a, tuple) else a
        if self.boundary:
            blocks, p = np.concatenate([blocks, x[:, None]], axis=1), a
        else:
            p = x + a
        mix = attn_res(blocks, p, self.mlp_query, self.eps)
        return p + self.ffn(rms_norm(mix, self.norm_post, self.eps)), blocks


class K3IO(ModelIO):
    """``embed_tokens``; empty block states to start; the output attention residual, ``model.norm``,
    ``lm_head``."""

    def __init__(self, args: KimiK3Args, ckpt):
        super().__init__(args, ckpt)
        self.out_query = res_query(ckpt, "model.output_attn_res", args.hidden_size)

    def carry(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.zeros((x.shape[0], 0, x.shape[1]), dtype=F32)

    def logits(self, x: np.ndarray, blocks: np.ndarray, all_logits: bool) -> np.ndarray:
        if not all_logits:
            x, blocks = x[-1:], blocks[-1:]
        return self.lm_head(rms_norm(attn_res(blocks, x, self.out_query, self.eps), self.norm, self.eps))


class KimiK3(RuntimeFamily):
    defaults = {"kimi_k3": {"rms_norm_eps": 1e-5, "linear_lower_bound": -5.0}}  # c/kimi_k3.c load_cfg's

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> KimiK3Args:
        return _k3_args(c, base)

    def layer(self, ctx: LayerContext, layer: int) -> K3Layer:
        return K3Layer(ctx, layer)

    def io(self, args: KimiK3Args, ckpt) -> K3IO:
        return K3IO(args, ckpt)


FAMILY = KimiK3()
