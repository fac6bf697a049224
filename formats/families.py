"""The model families: for each, the model types it covers, its geometry, how its expert stacks are laid out and
its own config spellings. The one owner of these facts (mlx-lm keeps them in one file per architecture; here the
bytes side keeps them so that the converter, which may not import the runtime, reads the same ones):

* the runtime's layer constructors take the ``[O, I]`` of their projections from the block geometries below
  (``gqa_shapes``, ``mla_shapes``, ...), and its family registry is :data:`MODEL_TYPES` (the family's ``name`` is
  its module, ``colitools/runtime/<name>.py``);
* the converter's shape checks read the same geometries from ``config.json`` (``Family.linear_shapes``, through
  ``model_config.linear_shapes`` and ``container.config_shapes``) and the stack orientation
  (``stack_orientation``, the inventory's stack checks and splits);
* the config facts read a family's own key spellings (``Family.key_aliases``, ``model_config.canonical_keys``).

A block geometry gives ``{leaf: (O, I)}`` of one module from its dimensions, leaving out a role whose dimensions
are not given (``None``): a config that does not say claims nothing. Adding a family is one ``Family`` here and
its lines in :data:`MODEL_TYPES` (docs/INTERNALS.md "How to add ... a model family").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from colitools.formats.names import Orientation

__all__ = [
    "MODEL_TYPES",
    "RUNNABLE_MODEL_TYPES",
    "Family",
    "family_of",
    "gated_deltanet_shapes",
    "gqa_shapes",
    "kda_layers",
    "known_model_types",
    "kda_shapes",
    "mla_shapes",
    "mlp_shapes",
    "native_stack_orientations",
    "shaped_orientation",
    "stack_orientation",
    "v4_shapes",
]

Shapes = dict[str, tuple[int, int]]  # leaf -> [O, I] inside one module
# (module, leaf) -> [O, I], in the runtime's canonical spelling
RoleShapes = dict[tuple[str, str], tuple[int, int]]


# ------------------------------------------------------------------------------------------ block geometry
def gqa_shapes(hidden: int, heads: int, kv_heads: int, head_dim: int, gated: bool = False) -> Shapes:
    """Grouped-query attention: ``q_proj [heads*head_dim, H]`` (twice as wide when ``gated``: ``[query | gate]``
    per head, Qwen3-Next / Qwen3.5), ``k_proj`` / ``v_proj [kv_heads*head_dim, H]``, ``o_proj [H, heads*head_dim]``."""
    kv = kv_heads * head_dim
    return {"q_proj": ((2 if gated else 1) * heads * head_dim, hidden), "k_proj": (kv, hidden),
            "v_proj": (kv, hidden), "o_proj": (hidden, heads * head_dim)}  # fmt: skip


def mla_shapes(hidden: int, heads: int, kv_lora: int, q_lora: int | None, nope: int | None, rope: int | None,
               v_head: int | None) -> Shapes:  # fmt: skip
    """Multi-head latent attention (DeepSeek-V3, GLM-5, Kimi-Linear): ``q_a_proj [q_lora, H]`` and ``q_b_proj
    [heads*(nope+rope), q_lora]`` (or ``q_proj [heads*(nope+rope), H]`` without a query LoRA),
    ``kv_a_proj_with_mqa [kv_lora+rope, H]``, ``kv_b_proj [heads*(nope+v_head), kv_lora]``, ``o_proj
    [H, heads*v_head]``; the query and latent roles need ``nope`` and ``rope``, the value roles ``v_head``."""
    out: Shapes = {}
    if nope is not None and rope is not None:
        q = heads * (nope + rope)
        if q_lora:
            out["q_a_proj"], out["q_b_proj"] = (q_lora, hidden), (q, q_lora)
        else:
            out["q_proj"] = (q, hidden)
        out["kv_a_proj_with_mqa"] = (kv_lora + rope, hidden)
        if v_head:
            out["kv_b_proj"] = (heads * (nope + v_head), kv_lora)
    if v_head:
        out["o_proj"] = (hidden, heads * v_head)
    return out


def gated_deltanet_shapes(hidden: int, nk: int, nv: int, dk: int, dv: int) -> Shapes:
    """Gated DeltaNet (``nk`` / ``nv`` key / value heads of ``dk`` / ``dv``): Qwen3-Next's fused ``in_proj_qkvz
    [2*nk*dk + 2*nv*dv, H]`` / ``in_proj_ba [2*nv, H]``, Qwen3.5's ``in_proj_qkv [2*nk*dk + nv*dv, H]``,
    ``in_proj_z [nv*dv, H]``, ``in_proj_a`` / ``in_proj_b [nv, H]``; ``out_proj [H, nv*dv]``."""
    kd, vd = nk * dk, nv * dv
    rows = {"in_proj_qkvz": 2 * kd + 2 * vd, "in_proj_ba": 2 * nv, "in_proj_qkv": 2 * kd + vd, "in_proj_z": vd,
            "in_proj_a": nv, "in_proj_b": nv}  # fmt: skip
    return {**{leaf: (n, hidden) for leaf, n in rows.items()}, "out_proj": (hidden, vd)}


def kda_shapes(hidden: int, heads: int, head_dim: int) -> Shapes:
    """Kimi Delta Attention (``C = heads*head_dim``): ``q_proj`` / ``k_proj`` / ``v_proj [C, H]``, ``o_proj
    [H, C]``, ``f_a_proj`` / ``g_a_proj [head_dim, H]``, ``f_b_proj`` / ``g_b_proj [C, head_dim]``, ``b_proj
    [heads, H]``."""
    c, d = heads * head_dim, head_dim
    return {"q_proj": (c, hidden), "k_proj": (c, hidden), "v_proj": (c, hidden), "o_proj": (hidden, c),
            "f_a_proj": (d, hidden), "f_b_proj": (c, d), "g_a_proj": (d, hidden), "g_b_proj": (c, d),
            "b_proj": (heads, hidden)}  # fmt: skip


def mlp_shapes(hidden: int, inter: int) -> Shapes:
    """A SwiGLU MLP (dense layers, shared experts): ``gate_proj`` / ``up_proj [inter, H]``, ``down_proj [H, inter]``."""
    return {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}


def v4_shapes(hidden: int, heads: int, head_dim: int, q_lora: int, o_groups: int, o_lora: int, index_heads: int,
              index_dim: int) -> RoleShapes:  # fmt: skip
    """DeepSeek-V4's attention on its native names (transformers 5.24 ``DeepseekV4Attention`` / ``Indexer``):
    ``attn.wq_a [q_lora, H]``, ``attn.wq_b [heads*head_dim, q_lora]``, ``attn.wkv [head_dim, H]`` (one K = V
    head), ``attn.wo_a [o_groups*o_lora, heads*head_dim/o_groups]`` (when the groups divide),
    ``attn.wo_b [H, o_groups*o_lora]``, the CSA indexer's ``wq_b [index_heads*index_dim, q_lora]``,
    ``weights_proj [index_heads, H]`` and compressor ``wkv`` / ``wgate [2*index_dim, H]``. The layer compressors'
    ``wkv`` / ``wgate`` are ``2*head_dim`` (CSA) or ``head_dim`` (HCA) wide by layer type: not here."""
    out: RoleShapes = {("attn", "wq_a"): (q_lora, hidden), ("attn", "wq_b"): (heads * head_dim, q_lora),
                       ("attn", "wkv"): (head_dim, hidden), ("attn", "wo_b"): (hidden, o_groups * o_lora)}  # fmt: skip
    if (heads * head_dim) % o_groups == 0:
        out[("attn", "wo_a")] = (o_groups * o_lora, heads * head_dim // o_groups)
    out[("attn.indexer", "wq_b")] = (index_heads * index_dim, q_lora)
    out[("attn.indexer", "weights_proj")] = (index_heads, hidden)
    compressor = (2 * index_dim, hidden)
    out[("attn.indexer.compressor", "wkv")] = out[("attn.indexer.compressor", "wgate")] = compressor
    return out


def v41_shapes(hidden: int, head_dim: int, index_dim: int, hc_mult: int, engram_cols: int,
               engram_dim: int) -> RoleShapes:  # fmt: skip
    """What DeepSeek-V4.1 Flash adds to :func:`v4_shapes` (colibri ``c/deepseek_v41.c`` ``model_load``): a KV source's
    compressor ``wkv`` / ``wgate [head_dim, H]`` (one series, no ``ape``), the indexer's key path
    ``wk [index_dim, head_dim]``, the engram projection ``wkv [H (hc_mult + 1), engram_cols engram_dim]``
    (``engram_cols`` = (max n-gram - 1) x engram heads)."""
    return {("attn.compressor", "wkv"): (head_dim, hidden), ("attn.compressor", "wgate"): (head_dim, hidden),
            ("attn.indexer", "wk"): (index_dim, head_dim),
            ("engram", "wkv"): (hidden * (hc_mult + 1), engram_cols * engram_dim)}  # fmt: skip


# --------------------------------------------------------------------------- blocks of config.json's geometry
# A block reads the text model's keys (``model_config.canonical_keys``; validated, never the runtime's defaults)
# and the routed-expert count, and claims the ``(module, leaf)`` roles those keys determine.
Block = Callable[[Mapping[str, Any], "int | None"], RoleShapes]
LayerBlock = Callable[[Mapping[str, Any]], dict[int, RoleShapes]]


def _in(module: str, shapes: Shapes) -> RoleShapes:
    return {(module, leaf): dims for leaf, dims in shapes.items()}


def gqa_block(text: Mapping[str, Any], experts: int | None, gated: bool = False) -> RoleShapes:
    """``self_attn`` by :func:`gqa_shapes`: ``head_dim``, else ``hidden_size / heads`` (when it divides);
    ``num_key_value_heads``, else the heads."""
    hidden, heads = text["hidden_size"], text.get("num_attention_heads")
    head_dim = heads and (text.get("head_dim") or (hidden // heads if hidden % heads == 0 else None))
    if not head_dim:
        return {}
    kv_heads = text.get("num_key_value_heads") or heads
    return _in("self_attn", gqa_shapes(hidden, heads, kv_heads, head_dim, gated))


def gated_gqa_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """:func:`gqa_block` with the output gate (``q_proj`` twice as wide)."""
    return gqa_block(text, experts, gated=True)


def mla_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """``self_attn`` by :func:`mla_shapes` when ``kv_lora_rank`` is given."""
    heads, kv_lora = text.get("num_attention_heads"), text.get("kv_lora_rank")
    if not (heads and kv_lora):
        return {}
    dims = (text.get(k) for k in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    return _in("self_attn", mla_shapes(text["hidden_size"], heads, kv_lora, *dims))


def gated_deltanet_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """``linear_attn`` by :func:`gated_deltanet_shapes` when ``linear_num_key_heads``, ``linear_num_value_heads``,
    ``linear_key_head_dim`` and ``linear_value_head_dim`` are all given."""
    keys = ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim")
    dims = [text.get(f"linear_{k}") for k in keys]
    return _in("linear_attn", gated_deltanet_shapes(text["hidden_size"], *dims)) if all(dims) else {}


def dense_mlp_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """The dense layers' ``mlp`` by :func:`mlp_shapes` of ``intermediate_size``."""
    inter = text.get("intermediate_size")
    return _in("mlp", mlp_shapes(text["hidden_size"], inter)) if inter else {}


def shared_experts_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """``mlp.shared_experts`` by :func:`mlp_shapes` of ``shared_expert_intermediate_size``, else ``n_shared_experts
    * moe_intermediate_size``, and Qwen2-MoE's sigmoid gate ``mlp.shared_expert_gate [1, H]``."""
    hidden, width = text["hidden_size"], text.get("shared_expert_intermediate_size")
    if not width and text.get("n_shared_experts") and text.get("moe_intermediate_size"):
        width = text["n_shared_experts"] * text["moe_intermediate_size"]
    if not width:
        return {}
    gate = {("mlp", "shared_expert_gate"): (1, hidden)}
    return {**_in("mlp.shared_experts", mlp_shapes(hidden, width)), **gate}


def router_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """The router ``mlp.gate [experts, H]``."""
    return {("mlp", "gate"): (experts, text["hidden_size"])} if experts else {}


def deepseek_v4_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """DeepSeek-V4's native names when ``o_groups`` and ``o_lora_rank`` are given: :func:`v4_shapes` (``head_dim``
    512, ``q_lora_rank`` 1024, ``index_n_heads`` 64, ``index_head_dim`` 128 unless given), ``ffn.gate [experts,
    H]`` and ``ffn.shared_experts.w1`` / ``w3 [n_shared*moe_intermediate, H]`` / ``w2``."""
    hidden, heads = text["hidden_size"], text.get("num_attention_heads")
    if not (heads and text.get("o_groups") and text.get("o_lora_rank")):
        return {}
    out = v4_shapes(hidden, heads, text.get("head_dim") or 512, text.get("q_lora_rank") or 1024, text["o_groups"],
                    text["o_lora_rank"], text.get("index_n_heads") or 64, text.get("index_head_dim") or 128)  # fmt: skip
    shared = (text.get("n_shared_experts") or 0) * (text.get("moe_intermediate_size") or 0)
    if shared:
        mlp = mlp_shapes(hidden, shared)
        out.update({("ffn.shared_experts", w): mlp[leaf]
                    for w, leaf in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))})  # fmt: skip
    if experts:
        out[("ffn", "gate")] = (experts, hidden)
    return out


def kda_layers(text: Mapping[str, Any]) -> dict[int, RoleShapes]:
    """Per ``linear_attention`` layer of ``layer_types``, its ``self_attn`` by :func:`kda_shapes`
    (``linear_num_heads``, ``linear_head_dim``)."""
    hidden, heads, d, types = (text.get(k) for k in ("hidden_size", "linear_num_heads", "linear_head_dim",
                                                      "layer_types"))  # fmt: skip
    if not (hidden and heads and d and isinstance(types, list)):
        return {}
    shapes = _in("self_attn", kda_shapes(hidden, heads, d))
    return {i: shapes for i, t in enumerate(types) if t == "linear_attention"}


def qsa_indexer_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """Qwen3.8's QSA indexer ``self_attn.indexer.index_qk_proj [(indexer_n_heads + indexer_kv_heads) *
    indexer_head_dim, H]`` (the queries, then the one key head) when the three are given."""
    n, kv, d = (text.get(f"indexer_{k}") for k in ("n_heads", "kv_heads", "head_dim"))
    if not (n and kv and d):
        return {}
    return {("self_attn.indexer", "index_qk_proj"): ((n + kv) * d, text["hidden_size"])}


def gated_residual_shapes(hidden: int, streams: int, rank: int) -> Shapes:
    """Qwen3.8's gated residual over ``streams`` hyper-connection streams of ``hidden``: the low-rank input mixer
    ``input_mix_weight_down [rank, streams*H]`` / ``input_mix_weight_up [streams*H, rank]`` and the block
    injection ``block_inject_weight [streams, streams*H]`` (the final mixer has none)."""
    wide = streams * hidden
    return {"input_mix_weight_down": (rank, wide), "input_mix_weight_up": (wide, rank),
            "block_inject_weight": (streams, wide)}  # fmt: skip


def gated_residual_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """``attn_hyper_connection`` / ``mlp_hyper_connection`` by :func:`gated_residual_shapes` of ``hc_count`` and
    ``hc_lowrank`` (the final ``hyper_connection_mixer``'s mixer too), and the PLE projections ``ple.key_proj [hc_count*H, ple_embed_dim]`` / ``ple.value_proj
    [H, ple_embed_dim]`` (``ple_embed_dim`` defaults to ``hidden_size``, as transformers' Qwen4ExpTextConfig)."""
    hidden, streams, rank = text["hidden_size"], text.get("hc_count"), text.get("hc_lowrank")
    if not (streams and rank):
        return {}
    shapes = gated_residual_shapes(hidden, streams, rank)
    out = {**_in("attn_hyper_connection", shapes), **_in("mlp_hyper_connection", shapes)}
    # the final mixer (no layer, no injection): container.config_shapes matches it by module and leaf too
    final = ("input_mix_weight_down", "input_mix_weight_up")
    out.update(_in("hyper_connection_mixer", {k: shapes[k] for k in final}))
    if text.get("ple_layer_ids"):
        ple = text.get("ple_embed_dim") or hidden
        out.update({("ple", "key_proj"): (streams * hidden, ple), ("ple", "value_proj"): (hidden, ple)})
    return out


def ngram_head_vocab_sizes(base: int, heads: int, ple_index: int) -> list[int]:
    """The hash moduli of the ``heads`` n-gram heads of the ``ple_index``-th PLE layer (transformers'
    ``Qwen4ExpTextNGramEmbedding``): global head ``g = ple_index * heads + h`` hashes modulo the ``(g+1)``-th
    prime ``>= base``."""
    primes: list[int] = []
    p = max(base, 2)
    while len(primes) < (ple_index + 1) * heads:
        if all(p % d for d in range(2, math.isqrt(p) + 1)):
            primes.append(p)
        p += 1
    return primes[ple_index * heads :]


def ple_table_layers(text: Mapping[str, Any]) -> dict[int, RoleShapes]:
    """Per PLE layer (1-based ``ple_layer_ids``), its n-gram table's row shards ``ple.ple_embedding.ngram_embedding.
    shard_{k} [rows / split_ngram_parts, ple_embed_dim / heads]``: ``heads = (ngram_size - 1) * heads_per_ngram``,
    ``rows`` the heads' prime vocabularies summed and rounded up to ``make_ngram_vocab_size_divisible_by``."""
    ids, order, per, base = (text.get(k) for k in ("ple_layer_ids", "ngram_size", "heads_per_ngram",
                                                    "ngram_vocab_size_base"))  # fmt: skip
    parts, pad = text.get("split_ngram_parts"), text.get("make_ngram_vocab_size_divisible_by")
    if not (isinstance(ids, list) and order and per and base and parts and pad):
        return {}
    heads = (order - 1) * per
    width = (text.get("ple_embed_dim") or text["hidden_size"]) // heads
    out: dict[int, RoleShapes] = {}
    for index, layer_id in enumerate(sorted(set(ids))):
        rows = -(-sum(ngram_head_vocab_sizes(base, heads, index)) // pad) * pad
        shard = (rows // parts, width)
        out[layer_id - 1] = {("ple.ple_embedding.ngram_embedding", f"shard_{k}"): shard for k in range(parts)}
    return out


def gated_mla_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """:func:`mla_block` with Kimi K3's full-rank sigmoid output gate ``self_attn.g_proj [heads*v_head, H]``."""
    out = mla_block(text, experts)
    heads, v_head = text.get("num_attention_heads"), text.get("v_head_dim")
    if out and heads and v_head:
        out[("self_attn", "g_proj")] = (heads * v_head, text["hidden_size"])
    return out


def latent_moe_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """Kimi K3's LatentMoE: ``mlp.routed_expert_down_proj [latent, H]`` into the routed experts' width
    ``routed_expert_hidden_size`` and ``mlp.routed_expert_up_proj [H, latent]`` back."""
    hidden, latent = text["hidden_size"], text.get("routed_expert_hidden_size")
    if not latent:
        return {}
    return {
        ("mlp", "routed_expert_down_proj"): (latent, hidden),
        ("mlp", "routed_expert_up_proj"): (hidden, latent),
    }


def k3_kda_layers(text: Mapping[str, Any]) -> dict[int, RoleShapes]:
    """:func:`kda_layers` with Kimi K3's full-rank output gate ``self_attn.g_proj [C, H]`` in place of the
    ``g_a_proj`` / ``g_b_proj`` pair (``c/kimi_k3.c`` ``model_init``)."""
    out: dict[int, RoleShapes] = {}
    for i, shapes in kda_layers(text).items():
        roles = {r: dims for r, dims in shapes.items() if r[1] not in ("g_a_proj", "g_b_proj")}
        roles[("self_attn", "g_proj")] = shapes[("self_attn", "q_proj")]
        out[i] = roles
    return out


# ------------------------------------------------------------------------------------------------ families
@dataclass(frozen=True)
class Family:
    """One model family's facts. ``name`` is also its runtime module (``colitools/runtime/<name>.py``)."""

    name: str
    blocks: tuple[Block, ...] = ()  # the per-layer linear roles config.json determines (``linear_shapes``)
    layer_blocks: tuple[LayerBlock, ...] = ()  # the roles of single layers (``layer_linear_shapes``)
    orientation: Orientation = Orientation.ROWS  # expert stacks (float / FP8 sources)
    # natively quantized stacks (codes by rows, docs/FORMATS.md §5): encoding -> how their rows hold gate / up
    native_orientation: Mapping[str, Orientation] = field(default_factory=dict)
    # a stack spelling laid out unlike the family's own: stack leaf -> orientation (before the family's)
    spelled_orientation: Mapping[str, Orientation] = field(default_factory=dict)
    # the orientation another writer saves the family's float stacks in, told from ``orientation`` by their shapes
    # against config.json (``shaped_orientation``): Qwen3-VL-MoE's transformers 5.24 save_pretrained, [E, 2I, H]
    saved_orientation: Orientation | None = None
    # config spellings of keys every other family spells the common way (transformers' ``attribute_map``):
    # its spelling -> the common key; and keys nested in a section of the config: section -> {key: common key}
    key_aliases: Mapping[str, str] = field(default_factory=dict)
    nested_key_aliases: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # the layer type of a layer a nested section's 1-based layer lists leave out (Kimi K3 lists only its
    # ``kda_layers``: the others are MLA); None: both lists must be given (Kimi-Linear, as transformers reads it)
    unlisted_layer_type: str | None = None
    # ``layer_types`` entries the family reads as another of its types (``model_config.canonical_keys``): the
    # spellings other writers give a layer type, read wherever the family is (converter, runtime, inspect)
    layer_type_aliases: Mapping[str, str] = field(default_factory=dict)
    gated_attention: bool = False  # full attention's q_proj is [query | gate] per head (Qwen3-Next, Qwen3.5)
    native_names: bool = False  # weights keep their own names and shapes (Inkling): no geometry claimed

    def linear_shapes(self, text: Mapping[str, Any], experts: int | None) -> RoleShapes:
        """``[O, I]`` by ``(module, leaf)`` of every per-layer linear role the text model's keys determine."""
        out: RoleShapes = {}
        if self.native_names or not text.get("hidden_size"):
            return out
        for block in self.blocks:
            out.update(block(text, experts))
        return out

    def layer_linear_shapes(self, text: Mapping[str, Any]) -> dict[int, RoleShapes]:
        """Per layer, the roles that replace :meth:`linear_shapes`' for that layer (KDA layers)."""
        out: dict[int, RoleShapes] = {}
        for block in self.layer_blocks:
            out.update(block(text))
        return out


def llama4_ffn_block(text: Mapping[str, Any], experts: int | None) -> RoleShapes:
    """Llama-4's feed-forward roles (``feed_forward`` spelled ``mlp``): the dense layers' MLP of
    ``intermediate_size_mlp``, the MoE layers' shared expert of ``intermediate_size`` (the expert width) and
    the router ``mlp.gate [experts, H]`` (``feed_forward.router``)."""
    hidden, dense, width = (
        text["hidden_size"],
        text.get("intermediate_size_mlp"),
        text.get("intermediate_size"),
    )
    out = _in("mlp", mlp_shapes(hidden, dense)) if dense else {}
    if width:
        out.update(_in("mlp.shared_experts", mlp_shapes(hidden, width)))
    return {**out, **router_block(text, experts)}


# the feed-forward roles of a MoE layer (or a dense one)
_MOE = (dense_mlp_block, shared_experts_block, router_block)

OLMOE = Family("olmoe", (gqa_block, router_block))
QWEN_MOE = Family("qwen_moe", (gqa_block, *_MOE))
MIXTRAL = Family("mixtral", (gqa_block, router_block))
DEEPSEEK_V3 = Family("deepseek_v3", (mla_block, *_MOE))
GLM4_MOE = Family("glm4_moe", (gqa_block, *_MOE))
QWEN3_NEXT = Family("qwen3_next", (gated_gqa_block, gated_deltanet_block, *_MOE), gated_attention=True)
GPT_OSS = Family(
    "gpt_oss", (gqa_block, router_block), orientation=Orientation.TRANSPOSED_INTERLEAVED,
    # transformers 5.24 integrations/mxfp4.py (_convert_moe_packed_tensors: decode [E, R, H] then transpose(1, 2)
    # to the float [E, H, R]; GptOssExperts takes gate = gate_up[..., ::2]): gate_up_proj_blocks [E, 2I, H/32, 16]
    # with gate = even rows, up = odd rows; down_proj_blocks [E, H, I/32, 16] by rows.
    native_orientation=MappingProxyType({"mxfp4": Orientation.ROWS_INTERLEAVED}),
)  # fmt: skip
DEEPSEEK_V4 = Family("deepseek_v4", (deepseek_v4_block,))
KIMI_LINEAR = Family(
    "kimi_linear", (mla_block, *_MOE), (kda_layers,),
    key_aliases=MappingProxyType({  # transformers KimiLinearConfig.attribute_map
        "num_experts_per_token": "num_experts_per_tok", "moe_renormalize": "norm_topk_prob",
        "num_expert_group": "n_group", "num_shared_experts": "n_shared_experts",
        "model_max_length": "max_position_embeddings",
    }),
    nested_key_aliases=MappingProxyType({  # hub configs: the KDA geometry in linear_attn_config
        "linear_attn_config": {
            "head_dim": "linear_head_dim", "num_heads": "linear_num_heads",
            "short_conv_kernel_size": "linear_conv_kernel_dim",
        },
    }),
)  # fmt: skip
GLM5_NEXT = Family("glm5_next", (mla_block, *_MOE), (kda_layers,))
# Kimi K3 (c/kimi_k3.c load_cfg, c/tools/k3_ref.py; no transformers model): Kimi-Linear's spellings, the KDA
# geometry and gate lower bound in linear_attn_config, MLA and KDA with full-rank g_proj gates, LatentMoE
KIMI_K3 = Family(
    "kimi_k3", (gated_mla_block, *_MOE, latent_moe_block), (k3_kda_layers,),
    key_aliases=KIMI_LINEAR.key_aliases,
    nested_key_aliases=MappingProxyType({
        "linear_attn_config": {**KIMI_LINEAR.nested_key_aliases["linear_attn_config"],
                               "gate_lower_bound": "linear_lower_bound"},
    }),
    unlisted_layer_type="full_attention",
)  # fmt: skip
# Inkling: native names (attn.wq_du, a router with extra rows for the shared experts, per-expert shared stacks);
# its native w13_weight interleaves gate / up rows, its text gate_up_proj (transformers' conversion_mapping.py
# Interleave op, c/tools/convert_inkling_int4.py deinterleave, --target inkling) holds the gate rows first
INKLING = Family("inkling", orientation=Orientation.ROWS_INTERLEAVED, native_names=True,
                 spelled_orientation=MappingProxyType({"gate_up_proj": Orientation.ROWS}))  # fmt: skip
INKLING2 = Family("inkling2", orientation=Orientation.ROWS_INTERLEAVED, native_names=True)
# Qwen3.8 (transformers 5.24 qwen4_exp; colibri c/qwen38.c): Qwen3.5's gated attention and Gated DeltaNet, QSA,
# hyper-connection gated residuals, PLE n-gram tables (issue 29)
# its QSA layers are ``indexed_attention`` in transformers 5.24, ``full_attention`` in the release, and
# ``qwen_sparse_attention`` as transformers 5.16.1 and colibri's c/tools/make_qwen38_tiny.py write them
QWEN38 = Family("qwen38", (gated_gqa_block, gated_deltanet_block, qsa_indexer_block, gated_residual_block, *_MOE),
                (ple_table_layers,), gated_attention=True,
                layer_type_aliases=MappingProxyType({"full_attention": "indexed_attention",
                                                     "qwen_sparse_attention": "indexed_attention"}))  # fmt: skip
# Qwen3-VL-MoE as published (Qwen3-VL-30B-A3B, 235B-A22B): gate_up_proj [E, H, 2I] with gate = the first I columns,
# down_proj [E, I, H]; transformers 5.24 transposes them on load (conversion_mapping.py ``qwen3_vl_moe``
# Transpose(1, 2)) and its save_pretrained writes them as it holds them, by rows [E, 2I, H] / [E, H, I]
QWEN3_VL_MOE = Family("qwen3_vl_moe", (gqa_block, *_MOE), orientation=Orientation.TRANSPOSED,
                      saved_orientation=Orientation.ROWS)  # fmt: skip
# Llama-4 (Scout, Maverick): Llama4TextExperts holds and saves gate_up_proj [E, H, 2I] (bmm, chunk(2, dim=-1))
LLAMA4 = Family("llama4", (gqa_block, llama4_ffn_block), orientation=Orientation.TRANSPOSED)
# DeepSeek-V4.1 Flash (colibri c/tools/make_dsv41_tiny.py, c/deepseek_v41.c cfg_load; no transformers class): V4's
# native attention / MoE names and geometry, the text model under ``text_config`` in colibri's short names with the
# released long ones beside them (the long ones win)
DEEPSEEK_V41 = Family(
    "deepseek_v41", (deepseek_v4_block,),
    key_aliases=MappingProxyType({
        "dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
        "moe_inter_dim": "moe_intermediate_size", "n_activated_experts": "num_experts_per_tok",
        "window_size": "sliding_window", "norm_eps": "rms_norm_eps", "route_scale": "routed_scaling_factor",
        "rope_head_dim": "qk_rope_head_dim", "max_seq_len": "max_position_embeddings",
        "kv_source_layers": "kv_source_layer_ids", "index_source_layers": "index_source_layer_ids",
        "candidate_source_layer": "candidate_source_layer_id", "engram_pad_id": "engram_pad_token_id",
    }),
)  # fmt: skip

# The model types ``colitools run`` executes -> their family (the checkpoint's top-level type; text types of
# multimodal wrappers listed too), in the order messages list them.
MODEL_TYPES: Mapping[str, Family] = MappingProxyType({
    "olmoe": OLMOE,
    "qwen2_moe": QWEN_MOE,
    "qwen3_moe": QWEN_MOE,
    "mixtral": MIXTRAL,
    "deepseek_v3": DEEPSEEK_V3,
    "glm4_moe": GLM4_MOE,
    "glm_moe_dsa": DEEPSEEK_V3,  # GLM-5
    "kimi_k25": DEEPSEEK_V3,  # text model deepseek_v3
    "deepseek_v32": DEEPSEEK_V3,  # transformers DeepseekV32NaiveMoe
    "qwen3_next": QWEN3_NEXT,
    "qwen3_5_moe": QWEN3_NEXT,
    "qwen3_5_moe_text": QWEN3_NEXT,
    "gpt_oss": GPT_OSS,
    "deepseek_v4": DEEPSEEK_V4,
    "kimi_linear": KIMI_LINEAR,
    "kimi_k3": KIMI_K3,
    "glm5_next": GLM5_NEXT,
    "glm5_next_text": GLM5_NEXT,
    "inkling_mm_model": INKLING,
    "inkling_text": INKLING,
    "inkling2": INKLING2,
    "inkling2_text": INKLING2,
    "qwen4_exp": QWEN38,  # Qwen3.8 (Qwen4ExpForConditionalGeneration)
    "qwen4_exp_text": QWEN38,
    "qwen3_vl_moe": QWEN3_VL_MOE,
    "qwen3_vl_moe_text": QWEN3_VL_MOE,
    "llama4": LLAMA4,
    "llama4_text": LLAMA4,
    "deepseek_v41": DEEPSEEK_V41,  # DeepSeek-V4.1 Flash (colibri's definition)
})  # fmt: skip
RUNNABLE_MODEL_TYPES: tuple[str, ...] = tuple(MODEL_TYPES)
# Types the converter knows but the runtime does not run: colibri's Inkling converter's ``inkling``.
_CONVERTED_ONLY: Mapping[str, Family] = MappingProxyType({"inkling": INKLING})


def family_of(model_type: str | None) -> Family | None:
    """The family of ``model_type`` (run or only converted), None for a type none covers."""
    if not isinstance(model_type, str):
        return None
    return MODEL_TYPES.get(model_type) or _CONVERTED_ONLY.get(model_type)


def known_model_types() -> list[str]:
    """Every model type a family covers (run or only converted), sorted: what a refusal lists."""
    return sorted({*MODEL_TYPES, *_CONVERTED_ONLY})


def stack_orientation(model_type: str | None, native: str | None = None, leaf: str | None = None
                      ) -> Orientation | None:  # fmt: skip
    """The family's expert-stack orientation, None when no family covers ``model_type`` (a stack is then refused).

    ``native``: the encoding of a natively quantized stack (``mxfp4``, ...): the family's ``native_orientation``,
    else its own orientation when that is by rows (codes are stored per output row), else None. ``leaf``: the
    stack's spelling (``gate_up_proj``), where the family spells stacks two ways (``spelled_orientation``)."""
    family = family_of(model_type)
    if family is None:
        return None
    if native is None and leaf in family.spelled_orientation:
        return family.spelled_orientation[leaf]
    if native is not None:
        if native in family.native_orientation:
            return family.native_orientation[native]
        if family.orientation.transposed:
            return None
    return family.orientation


def native_stack_orientations() -> list[tuple[str, str]]:
    """The sorted ``(model_type, encoding)`` pairs whose natively quantized stacks have an orientation of their own."""
    types = {*MODEL_TYPES, *_CONVERTED_ONLY}
    return sorted((t, enc) for t in types for enc in family_of(t).native_orientation)


def _stack_dims(orientation: Orientation, projection: str, hidden: int, width: int) -> tuple[int, int]:
    """The ``[rows, cols]`` of one expert's slab of a ``gate_up`` / ``down`` stack laid out as ``orientation``."""
    rows = {"gate_up": (2 * width, hidden), "down": (hidden, width)}[projection]
    return rows[::-1] if orientation.transposed else rows


def shaped_orientation(model_type: str | None, stacks: Mapping[str, tuple[int, ...]], hidden: int | None,
                       width: int | None) -> Orientation | None:  # fmt: skip
    """The orientation of one module's float expert stacks (``stacks``: projection ``gate_up`` / ``down`` -> the
    shape of each present), for a family whose stacks two writers lay out two ways (``saved_orientation``); None
    for any other family (its :func:`stack_orientation` holds) or without ``hidden`` and ``width``.

    The layout whose ``[rows, cols]`` every given stack matches against ``hidden_size`` and the expert width wins.
    Where both match (a square ambiguity: ``H == 2I`` leaves ``gate_up`` square, ``H == I`` leaves ``down``
    square; the module's other stack then decides, since both cannot be square at once) or neither does, the
    family's own (published) orientation is taken (the shape check then names what it expected)."""
    family = family_of(model_type)
    if family is None or family.saved_orientation is None or not (hidden and width):
        return None
    fits = [o for o in (family.orientation, family.saved_orientation)
            if all(tuple(shape[1:]) == _stack_dims(o, proj, hidden, width) for proj, shape in stacks.items())]  # fmt: skip
    return fits[0] if len(fits) == 1 else family.orientation
