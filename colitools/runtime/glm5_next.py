"""GLM-5.3-Flash (``glm5_next``, text type ``glm5_next_text``; transformers ``modeling_glm5_next.py``).

* ``layer_types``: KDA linear attention (``kda.py``, with the ``linear_lower_bound`` forget gate
  ``bound * sigmoid(exp(A_log) * g)``) or ``indexed_attention`` (``full_attention`` is read as it); default
  KDA except every 4th layer (``i % 4 == 3``).
* Indexed attention: MLA without RoPE (``qk_rope_head_dim`` 0, ``q_lora_rank`` required), ``q_a_layernorm`` /
  ``kv_a_layernorm`` with ``rms_norm_eps``, plus the DSA indexer with k-pool compression (``KPoolIndexer``);
  ``indexer_types`` ``shared`` layers reuse the previous full layer's selection (as GLM-5).
* Hyper-connections on every block (``hyper.py``): ``hc_mult`` streams, ``layers.L.hc_{attn,ffn}_{fn,base,scale}``,
  the mean of the streams before ``model.norm``.
* Clamped SwiGLU everywhere (dense MLP, shared and routed experts): ``silu(min(gate, limit)) * clip(up, -limit,
  limit)``, ``swiglu_limit``; DeepSeek ``noaux_tc`` routing; dense layers per ``mlp_layer_types`` (default the
  first 3).
* The multimodal checkpoint keeps the text model under ``model.language_model.`` (read as ``model.``); the vision
  tower is not run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.names import layer_path, module_path
from colitools.runtime.attention import NEG_INF, KVBuffer, MLAAttention, causal_mask
from colitools.runtime.config import (
    ConfigKeys,
    HyperArgs,
    IndexerArgs,
    KDAArgs,
    MLAArgs,
    ModelArgs,
    RopeArgs,
    mla_args,
    mla_head_dim,
    noaux_tc_args,
)
from colitools.runtime.deepseek_v3 import indexer_types
from colitools.runtime.experts import Expert
from colitools.runtime.family import LayerContext, ModelIO, RuntimeFamily
from colitools.runtime.hyper import HyperConnection, HyperDecoderLayer, HyperStreams
from colitools.runtime.kda import KimiDeltaAttention
from colitools.runtime.ops import MLP, Linear, layer_norm, norm_weight, silu, softmax
from colitools.runtime.weights import Checkpoint

F32 = np.float32

_TEXT = {  # transformers 5.24 Glm5NextTextConfig
    "rms_norm_eps": 1e-5, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 0, "qk_nope_head_dim": 256, "v_head_dim": 256, "index_topk": 2048, "index_head_dim": 128,
    "index_n_heads": 32, "swiglu_limit": 10.0, "linear_head_dim": 128, "linear_num_heads": 64,
    "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0, "hc_mult": 4, "hc_eps": 1e-6,
    "hc_sinkhorn_iters": 20, "index_kpool": 16, "index_kpool_always_select_tail": True,
    "max_position_embeddings": 1048576,
}  # fmt: skip
LAYER_TYPES = ("linear_attention", "indexed_attention")


@dataclass(kw_only=True)
class Glm5NextArgs(ModelArgs):
    """KDA / indexed-attention layers, MLA with the k-pool indexer, hyper-connections, clamped SwiGLU."""

    layer_types: list[str]  # per layer "linear_attention" | "indexed_attention"
    kda: KDAArgs
    mla: MLAArgs
    indexer: IndexerArgs
    hyper: HyperArgs
    swiglu_limit: float


def _layer_types(c: ConfigKeys, n: int) -> list[str]:
    types = c.get("layer_types") or ["linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(n)]
    types = ["indexed_attention" if t == "full_attention" else t for t in types]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise RuntimeModelError(f"{c.where}: layer_types must list {n} of {', '.join(LAYER_TYPES)}, got {types}")
    return types


def _kpool(c: ConfigKeys) -> tuple[int, int]:
    """``(index_topk, index_kpool)``: the selected keys are whole pools."""
    topk, kpool = int(c.need("index_topk")), int(c.need("index_kpool"))
    if kpool < 1 or topk % kpool:
        raise RuntimeModelError(f"{c.where}: index_topk {topk} is not a multiple of index_kpool {kpool}")
    return topk, kpool


class KPoolIndexer:
    """GLM-5.3's DSA indexer with k-pool compression (transformers ``Glm5NextTextIndexer``).

    ``k = LayerNorm(wk x)`` (eps 1e-6, with bias) per key; complete pools of ``P = index_kpool`` keys from
    position 0, pool key ``sum_j softmax_j(gate x_j + ape_j) * k_j`` per channel; a query scores the pools whose
    last key it sees, ``sum_h w_h n_heads^-0.5 relu(q_h . pool * D^-0.5)`` with ``q = wq_b(q_resid)``,
    ``w = weights_proj(x)``, keeps the top ``index_topk / P`` (of the cache's complete pools; all it sees when
    fewer) and, with ``index_kpool_always_select_tail``, the keys of its incomplete pool. Ties: lower pool
    first (the oracles are seed-checked to have none at the boundary)."""

    def __init__(self, args: Glm5NextArgs, ckpt: Checkpoint, layer: int):
        p, ix = module_path(layer, "self_attn.indexer"), args.indexer
        H = args.hidden_size
        self.nh, self.D, self.P = ix.n_heads, ix.head_dim, ix.kpool
        self.select = ix.topk // self.P
        self.tail = ix.kpool_tail
        self.wq_b = Linear.load(ckpt, f"{p}.wq_b", self.nh * self.D, args.mla.q_lora_rank)
        self.wk = Linear.load(ckpt, f"{p}.wk", self.D, H)
        self.k_norm_w = ckpt.vector(f"{p}.k_norm.weight", self.D)
        self.k_norm_b = ckpt.vector(f"{p}.k_norm.bias", self.D)
        self.weights_proj = Linear.load(ckpt, f"{p}.weights_proj", self.nh, H)
        self.gate = ckpt.array(f"{p}.index_kpool_compress_gate", (self.D, H))
        self.ape = ckpt.array(f"{p}.index_kpool_compress_ape", (self.P, self.D))
        self.kc, self.gc = KVBuffer(), KVBuffer()

    @property
    def nbytes(self) -> int:
        n = self.wq_b.nbytes + self.wk.nbytes + self.weights_proj.nbytes
        return n + self.gate.nbytes + self.ape.nbytes

    def reset(self) -> None:
        self.kc.reset()
        self.gc.reset()

    def pool_keys(self, K: np.ndarray, G: np.ndarray) -> np.ndarray:
        """``[pools, D]`` of the complete pools of the cached keys ``K`` / gate scores ``G`` ``[T, D]``."""
        n_pools = K.shape[0] // self.P
        k = K[: n_pools * self.P].reshape(n_pools, self.P, self.D)
        w = softmax(G[: n_pools * self.P].reshape(n_pools, self.P, self.D) + self.ape, axis=1)
        return np.sum(w * k, axis=1, dtype=F32)

    def __call__(self, x, q_resid, positions, cos, sin) -> np.ndarray:
        """Boolean ``[N, T]`` of the keys each query attends to (causal by construction)."""
        N, P = x.shape[0], self.P
        q = self.wq_b(q_resid).reshape(N, self.nh, self.D)
        K = self.kc.append(layer_norm(self.wk(x), self.k_norm_w, self.k_norm_b, 1e-6))
        G = self.gc.append(x @ self.gate.T)
        T = K.shape[0]
        pools = self.pool_keys(K, G)  # [Pn, D]
        n_pools = pools.shape[0]
        selected = np.zeros((N, T), dtype=bool)
        if n_pools:
            scores = np.maximum((q @ pools.T) * F32(self.D**-0.5), F32(0))  # [N, nh, Pn]
            w = self.weights_proj(x) * F32(self.nh**-0.5)
            index = (w[:, None, :] @ scores)[:, 0, :]  # [N, Pn]
            ends = (np.arange(n_pools) + 1) * P - 1
            visible = ends[None, :] <= positions[:, None]
            index = np.where(visible, index, NEG_INF)
            k_sel = min(self.select, n_pools)
            top = np.argsort(-index, axis=-1, kind="stable")[:, :k_sel]
            for i in range(N):
                for j in top[i]:
                    if visible[i, j]:
                        selected[i, j * P : (j + 1) * P] = True
        if self.tail:
            for i, pos in enumerate(positions):
                count = (int(pos) + 1) % P
                selected[i, int(pos) + 1 - count : int(pos) + 1] = True
        return selected & causal_mask(positions, T)


class ClampedExpert(Expert):
    """A GLM-5.3 routed expert: ``down(silu(min(gate, limit)) * clip(up, -limit, limit))``."""

    __slots__ = ("limit",)

    def __init__(self, gate, up, down, biases=None, limit: float = 10.0):
        super().__init__(gate, up, down, biases)
        self.limit = F32(limit)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        gate = np.minimum(self.gate.matmul(x), self.limit)
        up = np.clip(self.up.matmul(x), -self.limit, self.limit)
        return self.down.matmul(silu(gate) * up)


class ClampedMLP(MLP):
    """The dense MLP / shared experts with GLM-5.3's clamped SwiGLU."""

    def __init__(self, ckpt: Checkpoint, prefix: str, hidden: int, inter: int, limit: float):
        super().__init__(ckpt, prefix, hidden, inter)
        self.limit = F32(limit)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        gate = np.minimum(self.gate(x), self.limit)
        up = np.clip(self.up(x), -self.limit, self.limit)
        return self.down(silu(gate) * up)


def _hyper_connection(args: Glm5NextArgs, ckpt: Checkpoint, layer: int, block: str) -> HyperConnection:
    return HyperConnection.load(ckpt, f"{layer_path(layer)}.hc_{block}", args.hidden_size, args.hyper.mult,
                                args.hyper.sinkhorn_iters, args.hyper.eps, args.rms_norm_eps)  # fmt: skip


def hyper_layer(ctx: LayerContext, layer: int) -> HyperDecoderLayer:
    """KDA or indexed attention, then clamped routed experts (plus shared) or a clamped dense MLP, on streams."""
    args, ckpt = ctx.args, ctx.ckpt
    if args.layer_types[layer] == "linear_attention":
        attn = KimiDeltaAttention(args, ckpt, layer)
    else:
        indexer = KPoolIndexer(args, ckpt, layer) if args.indexer.full[layer] else None
        attn = MLAAttention(args, ckpt, layer, ctx.rope, indexer)
    limit, H = args.swiglu_limit, args.hidden_size
    if args.moe_layers[layer]:

        def make(gate, up, down, biases=None):
            return ClampedExpert(gate, up, down, biases, limit)

        ffn = ctx.sparse_moe(layer, make=make)
        ffn.shared = ClampedMLP(ckpt, module_path(layer, "mlp.shared_experts"), H,
                                args.routing.shared_expert_intermediate_size, limit)  # fmt: skip
    else:
        ffn = ClampedMLP(ckpt, module_path(layer, "mlp"), H, args.intermediate_size, limit)
    p = layer_path(layer)
    return HyperDecoderLayer(
        attn, ffn, norm_weight(ckpt, f"{p}.input_layernorm.weight", H),
        norm_weight(ckpt, f"{p}.post_attention_layernorm.weight", H), args.rms_norm_eps,
        _hyper_connection(args, ckpt, layer, "attn"), _hyper_connection(args, ckpt, layer, "ffn"),
    )  # fmt: skip


class Glm5Next(RuntimeFamily):
    defaults = {"glm5_next": _TEXT, "glm5_next_text": _TEXT}

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> Glm5NextArgs:
        """Layer schedule, KDA geometry, MLA (no RoPE) + k-pool indexer, hyper-connections, clamped SwiGLU."""
        n = base["num_hidden_layers"]
        types = _layer_types(c, n)
        if c.get("mlp_layer_types") is None:
            c["mlp_layer_types"] = ["dense"] * min(3, n) + ["sparse"] * (n - 3)
        moe_layers, routing = noaux_tc_args(c, base)
        rope_dim = int(c.need("qk_rope_head_dim"))
        if rope_dim:
            raise RuntimeModelError(f"{c.where}: glm5_next attention has no RoPE, got qk_rope_head_dim {rope_dim}")
        if not c.get("q_lora_rank"):
            raise RuntimeModelError(f"{c.where}: {c.model_type} needs q_lora_rank")
        topk, kpool = _kpool(c)
        bound = c.get("linear_lower_bound")
        # q_lora_rank is required here (the indexer reads the query LoRA); q_a / kv_a norms take rms_norm_eps
        mla = replace(mla_args(c, base, rope_dim=0), q_lora_rank=int(c["q_lora_rank"]),
                      latent_norm_eps=base["rms_norm_eps"])  # fmt: skip
        kda = KDAArgs(conv_kernel=int(c["linear_conv_kernel_dim"]), num_heads=int(c["linear_num_heads"]),
                      head_dim=int(c["linear_head_dim"]), lower_bound=float(bound) if bound is not None else None,
                      a_log_4d=False)  # fmt: skip
        indexer = IndexerArgs(topk=topk, head_dim=int(c.need("index_head_dim")), n_heads=int(c.need("index_n_heads")),
                              full=indexer_types(c, n), kpool=kpool,
                              kpool_tail=bool(c.get("index_kpool_always_select_tail", True)))  # fmt: skip
        hyper = HyperArgs(mult=int(c["hc_mult"]), eps=float(c["hc_eps"]), sinkhorn_iters=int(c["hc_sinkhorn_iters"]))
        swiglu_limit = float(c["swiglu_limit"])
        if hyper.mult < 1 or hyper.sinkhorn_iters < 1:
            raise RuntimeModelError(f"{c.where}: hc_mult and hc_sinkhorn_iters must be >= 1")
        return Glm5NextArgs(
            **{**base, "moe_layers": moe_layers, "head_dim": mla_head_dim(mla)},
            layer_types=types, kda=kda, mla=mla, indexer=indexer, hyper=hyper, swiglu_limit=swiglu_limit,
            routing=routing, rope=RopeArgs(dim=0),
        )  # fmt: skip

    def layer(self, ctx: LayerContext, layer: int) -> HyperDecoderLayer:
        return hyper_layer(ctx, layer)

    def io(self, args: Glm5NextArgs, ckpt: Checkpoint) -> ModelIO:
        return HyperIO(args, ckpt)


class HyperIO(ModelIO):
    """``embed_tokens`` into ``hc_mult`` streams; their mean (the hyper head) before ``model.norm``."""

    def __init__(self, args: Glm5NextArgs, ckpt: Checkpoint):
        super().__init__(args, ckpt)
        self.streams = HyperStreams(args.hyper.mult)

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        return self.streams.expand(self.embed(ids))

    def logits(self, x: np.ndarray, carry, all_logits: bool) -> np.ndarray:
        return super().logits(self.streams.head(x), carry, all_logits)


FAMILY = Glm5Next()
