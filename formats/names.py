"""The tensor-name map: every checkpoint spelling of a tensor name, parsed once (gguf-py's ``TensorNameMap``).

A name is split on dots into :class:`TensorName`: the text-model root, the decoder layer, the module path inside
the layer, the routed-expert index, the tensor's own name (``leaf``), its projection normalised to
``gate``/``up``/``down`` (``gate_up`` for a fused stack), a role and the trailing suffix::

    model.language_model.layers.3.block_sparse_moe.experts.7.w1.weight.qs
    |------ root -------|                                                  root "model.language_model."
    |------- layer_prefix ------| 3                                        layer 3
                                  |---- module ---------| 7                module "block_sparse_moe.experts"
                                                           w1              leaf "w1" -> projection "gate"
                                                              weight.qs    suffix

Every spelling lives in one table below, with the architectures that use it; adding a spelling (a text root,
``ffn.experts.{E}.w1``, a router) is one line there. Parsing is a table lookup per component, cached per name.
Matching is by whole dot-separated components: ``xlm_head.weight`` is not an output head.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

# ----------------------------------------------------------------------------------------------- tables
# Text-model roots (docs/FORMATS.md §5), matched as a name prefix, longest first.
TEXT_ROOTS: dict[str, str] = {
    "model.": "text-only checkpoints: OLMoE, Qwen2/3-MoE, Mixtral, DeepSeek-V3, GLM-4 MoE (transformers)",
    "model.language_model.": "transformers' multimodal layout: GLM-5.3-Flash (glm5_next), Qwen3.5/3.6-MoE",
    "language_model.model.": "Kimi K2.5/K2.6 (kimi_k25) hub spelling, LLaVA-style wrappers",
    "language_model.": "the head of language_model.model. checkpoints (language_model.lm_head.weight)",
    "model.text_model.": "text towers of transformers vision-language wrappers (Idefics3-style)",
    "model.llm.": "Inkling-2 (inkling2) native names",
}
CANONICAL_ROOT = "model."  # the root the runtime's names are written with

LAYERS = "layers"  # ``{layer_prefix}.{L}.``: the decoder-layer container
EXPERTS = "experts"  # ``{...}.experts.{E}.{projection}``: the routed-expert container

# Per-expert (and dense / shared-expert) MLP projections -> the normalised projection.
PROJECTIONS: dict[str, str] = {
    "gate_proj": "gate",  # transformers (Qwen, OLMoE, DeepSeek, GLM)
    "up_proj": "up",
    "down_proj": "down",
    "w1": "gate",  # Mixtral, Kimi-Linear (block_sparse_moe.experts.{E}.w1/w3/w2), DeepSeek-V4 (ffn.experts)
    "w3": "up",
    "w2": "down",
}
PROJECTION_ORDER = ("gate", "up", "down")  # an expert's tensors in the pairs layout (docs/FORMATS.md §4)
CANONICAL_PROJECTION = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}  # the spelling we write
# Projections some exports store without a ``.weight`` suffix (``...experts.{E}.w1``).
SUFFIXLESS_PROJECTIONS = frozenset({"w1", "w2", "w3"})  # Mixtral

# Merged per-expert blobs ``{...}.experts.{E}.{leaf}``: several projections of one expert back to back in one
# tensor, their scales in ``{...}.experts.{E}.qs``; the layout is its target's (formats/targets/).
MERGED = "gate_up_down"  # the projection of a merged blob
MERGED_EXPERTS: dict[str, str] = {
    # colibri's OLMoE and Qwen3.6 engines (c/olmoe.c / c/qwen36.c load_expert_merged; convert_olmoe_merged.py,
    # convert_qwen36.py)
    "merged_weight": MERGED,
}
MERGED_SCALES = frozenset({"qs"})  # a merged blob's scales ``{...}.experts.{E}.qs``

# Fused expert stacks ``{...}.experts.{leaf}[.weight]`` [E, rows, cols] -> the projections they hold. How the
# rows / columns of a stack map onto gate / up / down is a fact of the family (``families.stack_orientation``),
# never a guess from shapes.
EXPERT_STACKS: dict[str, str] = {
    "gate_up_proj": "gate_up",  # transformers fused experts (Qwen3-MoE); gpt-oss [E, H, 2I] (transposed)
    "down_proj": "down",  # transformers fused experts: [E, H, I]; gpt-oss [E, I, H] (transposed)
    "w13_weight": "gate_up",  # Inkling native names: [E, 2I, H], gate and up rows interleaved
    "w2_weight": "down",  # Inkling native names: [E, H, I]
    "gate_proj": "gate",  # separate 3-D stacks [n, I, H] (Inkling)
    "up_proj": "up",  # separate 3-D stacks [n, I, H] (Inkling)
}
# Stacked shared experts ``{...}.shared_experts.{leaf}`` [n_shared, rows, cols] (no ``.weight`` suffix) -> the
# projections they hold; split along the first axis into ``{...}.shared_experts.{k}.{gate,up,down}_proj.weight``
# (docs/FORMATS.md "Stacked shared experts"), a gate/up stack in the family's orientation (formats/families.py).
SHARED_EXPERT_STACKS: dict[str, str] = {
    "shared_w13_weight": "gate_up",  # Inkling native names: [n, 2I, H], gate and up rows interleaved
    "shared_w2_weight": "down",  # Inkling native names: [n, H, I]
    "gate_proj": "gate",  # transformers' InklingSharedExperts parameters: [n, I, H]
    "up_proj": "up",  # [n, I, H]
    "down_proj": "down",  # [n, H, I]
}
# Inkling's native names (``oracles/inkling``, ``inkling_mm_model``: ``model.llm.*``) -> the text names colibri's
# Inkling engine looks up (``c/inkling.c`` ``model_init``), as ``c/tools/convert_inkling_int4.py`` (``RENAMES`` /
# ``SUBS``) and transformers 5.24 (``conversion_mapping.py`` ``inkling_mm_model``, text model) rename them: one
# table, read both ways (``inkling_text_name`` writes, ``inkling_native_name`` reads back). Whole names outside
# the layers; inside ``model.llm.layers.{L}.`` (-> ``model.layers.{L}.``) the rest of the name.
INKLING_GLOBAL_NAMES: dict[str, str] = {
    "model.llm.embed.weight": "model.embed_tokens.weight",
    # transformers 5.24 spells it model.language_model.embed_tokens.embed_norm.weight; the converter writes, and
    # c/inkling.c model_init looks up (optional: skipped without a word when absent), model.embed_norm.weight
    "model.llm.embed_norm.weight": "model.embed_norm.weight",
    "model.llm.norm.weight": "model.norm.weight",
    "model.llm.unembed.weight": "lm_head.weight",
}
INKLING_NATIVE_LAYERS, INKLING_TEXT_LAYERS = "model.llm.layers.", "model.layers."
INKLING_LAYER_NAMES: dict[str, str] = {
    "attn.wq_du.weight": "self_attn.q_proj.weight",
    "attn.wk_dv.weight": "self_attn.k_proj.weight",
    "attn.wv_dv.weight": "self_attn.v_proj.weight",
    "attn.wr_du.weight": "self_attn.r_proj.weight",
    "attn.wo_ud.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "attn.rel_logits_proj.proj": "self_attn.rel_logits_proj.proj",
    "attn.k_sconv.weight": "self_attn.k_sconv.conv1d.weight",
    "attn.v_sconv.weight": "self_attn.v_sconv.conv1d.weight",
    "attn_sconv.weight": "attn_sconv.conv1d.weight",
    "mlp_sconv.weight": "mlp_sconv.conv1d.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate.weight",  # the router [E + n_shared, H]
    "mlp.gate.bias": "mlp.gate.e_score_correction_bias",
    "mlp.gate.global_scale": "mlp.gate.global_scale",
    "mlp.global_scale": "mlp.global_scale",  # a dense layer's
    "mlp.w2_md.weight": "mlp.down_proj.weight",  # a dense layer's down projection
}
# Stacks, native -> text. Gate / up halves of an interleaved native stack are de-interleaved (transformers'
# ``Interleave`` op, the converter's ``deinterleave``): the text stacks hold gate rows first (routed experts) or
# are split into ``gate_proj`` / ``up_proj`` (shared experts); read back under their text names.
INKLING_STACK_NAMES: dict[str, tuple[str, ...]] = {
    "mlp.experts.w13_weight": ("mlp.experts.gate_up_proj",),  # [E, 2I, H]: the I gate rows, then the I up rows
    "mlp.experts.w2_weight": ("mlp.experts.down_proj",),  # [E, H, I]
    "mlp.shared_experts.shared_w13_weight": ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"),
    "mlp.shared_experts.shared_w2_weight": ("mlp.shared_experts.down_proj",),  # [n, H, I]
    "mlp.w13_dn.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),  # a dense layer's [2I, H]
}
# read back: a dense layer's down projection keeps its text name, like its gate_proj / up_proj (the runtime's dense
# MLP reads the three by those names)
_INKLING_NATIVE_OF = {v: k for k, v in INKLING_LAYER_NAMES.items() if k != "mlp.w2_md.weight"}
_INKLING_NATIVE_GLOBAL_OF = {v: k for k, v in INKLING_GLOBAL_NAMES.items()}
_INKLING_TEXT_TAILS = {v: v for v in INKLING_LAYER_NAMES.values()}  # a text name inside a layer: itself


# A transformers-saved Inkling (``save_pretrained`` of transformers 5.24) already has text names, under
# ``model.language_model.`` for the multimodal model, and its embedding norm inside the embedding module.
INKLING_TRANSFORMERS_ROOT = "model.language_model."
INKLING_TRANSFORMERS_NAMES: dict[str, str] = {
    "model.embed_tokens.embed_norm.weight": "model.embed_norm.weight",  # InklingTextModel's embed_tokens.embed_norm
}


def inkling_text_name(name: str) -> str | None:
    """The text name ``c/inkling.c`` looks up for Inkling tensor ``name`` (:data:`INKLING_GLOBAL_NAMES`,
    :data:`INKLING_LAYER_NAMES` for a native name; a text name, or a transformers one
    (:data:`INKLING_TRANSFORMERS_NAMES`), as the engine spells it), or None when it looks up none. A per-expert
    name of a split stack (``model.llm.layers.{L}.mlp.experts.{E}.gate_proj.weight``,
    ``...shared_experts.{k}.up_proj.weight``) keeps its tail under ``model.layers.{L}.``: its stack's text name is
    the writer's (formats/targets/)."""
    if name in INKLING_GLOBAL_NAMES:
        return INKLING_GLOBAL_NAMES[name]
    if name.startswith(INKLING_TRANSFORMERS_ROOT):
        name = CANONICAL_ROOT + name[len(INKLING_TRANSFORMERS_ROOT) :]
    name = INKLING_TRANSFORMERS_NAMES.get(name, name)
    if name in _INKLING_NATIVE_GLOBAL_OF:  # a text name already
        return name
    for prefix, table in ((INKLING_NATIVE_LAYERS, INKLING_LAYER_NAMES), (INKLING_TEXT_LAYERS, _INKLING_TEXT_TAILS)):
        if not name.startswith(prefix):
            continue
        layer, _, tail = name[len(prefix) :].partition(".")
        if not layer.isdecimal():
            return None
        parsed = parse_name(name)
        split = parsed.projection in ("gate", "up", "down") and (
            parsed.expert is not None or parsed.role is TensorRole.SHARED_EXPERT
        )
        text = tail if split else table.get(tail)
        return None if text is None else f"{INKLING_TEXT_LAYERS}{layer}.{text}"
    return None


def inkling_native_name(text: str) -> str:
    """The native spelling of an Inkling text name (the inverse of :func:`inkling_text_name`; the runtime reads
    native names); a transformers spelling (``model.language_model.``, :data:`INKLING_TRANSFORMERS_NAMES`) too.
    Stacks keep their text names (their rows are not interleaved); anything else is unchanged."""
    if text.startswith(INKLING_TRANSFORMERS_ROOT):
        text = CANONICAL_ROOT + text[len(INKLING_TRANSFORMERS_ROOT) :]
    text = INKLING_TRANSFORMERS_NAMES.get(text, text)
    if text in _INKLING_NATIVE_GLOBAL_OF:
        return _INKLING_NATIVE_GLOBAL_OF[text]
    if text.startswith(INKLING_TEXT_LAYERS):
        layer, _, tail = text[len(INKLING_TEXT_LAYERS) :].partition(".")
        if layer.isdecimal() and tail in _INKLING_NATIVE_OF:
            return f"{INKLING_NATIVE_LAYERS}{layer}.{_INKLING_NATIVE_OF[tail]}"
    return text


# Biases of an expert stack ``{...}.experts.{leaf}`` [E, out], split like their stack (stored F32).
STACK_BIASES: dict[str, str] = {
    "gate_up_proj_bias": "gate_up",  # gpt-oss [E, 2I], gate / up interleaved like its stack's columns
    "down_proj_bias": "down",  # gpt-oss [E, H]
}


class Orientation(StrEnum):
    """How a family lays out its expert stacks (docs/FORMATS.md §5 "Expert stacks"); which one a family uses is
    a fact of the family (``formats/families.py``, ``stack_orientation``), never a guess from shapes."""

    ROWS = "rows"  # gate_up [E, 2I, H] gate rows first, down [E, H, I] (transformers, Qwen3)
    ROWS_INTERLEAVED = (
        "rows-interleaved"  # w13 [E, 2I, H] gate / up rows interleaved, down [E, H, I] (Inkling)
    )
    TRANSPOSED_INTERLEAVED = "transposed-interleaved"  # gate_up [E, H, 2I] gate / up columns interleaved,
    # down [E, I, H] (gpt-oss float stacks)
    TRANSPOSED = "transposed"  # gate_up [E, H, 2I] gate = the first I columns, up = the last I (transformers'
    # ``chunk(2, dim=-1)``), down [E, I, H] (Qwen3-VL-MoE as published, Llama-4)

    @property
    def transposed(self) -> bool:
        """Stacks hold an expert's projections as ``[in, out]`` (``gate_up [E, H, 2I]``, ``down [E, I, H]``)."""
        return self in (Orientation.TRANSPOSED_INTERLEAVED, Orientation.TRANSPOSED)

    @property
    def interleaved(self) -> bool:
        """Gate and up alternate (rows or columns ``0, 2, ...`` / ``1, 3, ...``) instead of gate first."""
        return self in (Orientation.ROWS_INTERLEAVED, Orientation.TRANSPOSED_INTERLEAVED)


# MXFP4 source spellings (gpt-oss, docs/FORMATS.md §5): ``<base>_blocks`` U8 ``[..., O, I/32, 16]`` and
# ``<base>_scales`` U8 ``[..., O, I/32]`` (E8M0) for the float weight ``<base>`` (``...experts.gate_up_proj``);
# two E2M1 codes a byte, low nibble first; never transposed (blocks run along the input).
MXFP4_BLOCKS = "_blocks"
MXFP4_SCALES = "_scales"
MXFP4_STACK_SUFFIXES = (MXFP4_BLOCKS, MXFP4_SCALES)

# MoE blocks that hold ``experts.{E}`` directly inside a layer.
MOE_BLOCKS = frozenset({
    "mlp",  # Qwen2/3-MoE, OLMoE, DeepSeek-V3, GLM-4 MoE, gpt-oss, Qwen3.5/3-Next, GLM-5.3-Flash
    "block_sparse_moe",  # Mixtral, Kimi-Linear
    "ffn",  # DeepSeek-V4 native names (ffn.experts.{E}.w1, ffn.gate.weight)
    "feed_forward",  # Llama-4 (feed_forward.experts.gate_up_proj, feed_forward.router.weight)
})  # fmt: skip
SHARED_EXPERT_MODULES = frozenset({
    "shared_experts",  # DeepSeek-V3, GLM-4 MoE
    "shared_expert",  # Qwen2-MoE
})  # fmt: skip
# Module spellings -> the runtime's canonical spelling (mlx-lm's ``sanitize``).
MODULE_ALIASES: dict[str, str] = {
    "block_sparse_moe": "mlp",  # Mixtral (its router block_sparse_moe.gate too)
    "shared_expert": "shared_experts",  # Qwen2-MoE
    "router": "gate",  # gpt-oss (mlp.router.weight / mlp.router.bias), Llama-4 (feed_forward.router.weight)
    "feed_forward": "mlp",  # Llama-4 (its shared expert feed_forward.shared_expert, dense feed_forward.gate_proj)
}

# Routers and routing parameters, matched as the last components of a name.
ROUTERS: dict[str, str] = {
    "mlp.gate.weight": "Qwen2/3-MoE, OLMoE, DeepSeek-V3, GLM-4 MoE, Qwen3.5/3-Next, GLM-5.3-Flash, Kimi K2.5",
    "mlp.gate.bias": "routers with a bias",
    "block_sparse_moe.gate.weight": "Mixtral, Kimi-Linear",
    "shared_expert_gate.weight": "Qwen2-MoE, Qwen3.5/3-Next (the sigmoid gate of its shared expert)",
    "e_score_correction_bias": "DeepSeek-V3, GLM-4 MoE, Kimi-Linear (noaux_tc routing bias)",
    "mlp.router.weight": "gpt-oss",
    "mlp.router.bias": "gpt-oss (router bias)",
    "ffn.gate.weight": "DeepSeek-V4 native names",
    "ffn.gate.bias": "DeepSeek-V4 (score bias)",
    "feed_forward.router.weight": "Llama-4 (sigmoid of its top-1 logit scales the expert's input)",
}
EMBEDDINGS = frozenset({
    "embed_tokens",  # transformers (every family)
    "embed",  # DeepSeek-V4 native names (embed.weight)
})  # fmt: skip
# Modules whose ``embed`` / ``head`` leaves are tables of their own, not the model's token embedding / head: weights
OWN_TABLE_MODULES = (
    "engram",  # DeepSeek-V4.1 ``layers.{L}.engram.embed``: an n-gram hash table [rows, engram_head_dim]
    "markov_head",  # DeepSeek-V4.1 DSpark ``mtp.{S}.markov_head.embed`` / ``.head`` [vocab, dspark_markov_rank]
)
HEADS = frozenset({
    "lm_head",  # transformers (every family)
    "head",  # DeepSeek-V4 (head.weight)
    "unembed",  # unembed.weight (native exports)
})  # fmt: skip
# Row-addressable lookup tables besides the token embedding (docs/FORMATS.md §5 rule 4: ``--embed``), matched on
# the leaf or, for a table stored in row shards (``{table}.shard_{k}.weight``), on the module's last component.
# Not ``[vocab_size, hidden_size]``: no config shape is implied for them.
LOOKUP_TABLES: dict[str, str] = {
    "ngram_embedding": "Qwen3.8 (qwen4_exp) PLE hashed n-gram table, in split_ngram_parts row shards "
    "ple.ple_embedding.ngram_embedding.shard_{k}.weight",
}
TABLE_SHARD_PREFIX = "shard_"
NORM_ENDINGS = ("norm",)  # input_layernorm, post_attention_layernorm, q_norm, kv_a_layernorm, model.norm

# Multimodal towers (docs/FORMATS.md §5 rule 1): a name whose first component (after an optional ``model.``) is
# one of these belongs to a vision / audio encoder or its projector.
TOWER_MODULES: dict[str, str] = {
    "visual": "Qwen3.5/3.6-MoE, GLM-5.3-Flash (model.visual.*)",
    "vision_tower": "Kimi K2.5 (vision_tower.*, model.vision_tower.*), LLaVA-style wrappers",
    "vision_model": "Idefics / Llama-4-style wrappers",
    "audio_tower": "audio encoders",
    "audio": "Inkling native audio encoder (model.audio.*)",
    "audio_model": "Inkling (audio encoder)",
    "vision_encoder": "Inkling vision encoder",
    "mm_projector": "Kimi K2.5 projector",
    "multi_modal_projector": "LLaVA-style projectors",
    "vision_projector": "vision projectors",
    "audio_projector": "audio projectors",
    "vision": "DeepSeek-V4.1 Flash vision tower (vision.patch_embed, vision.blocks.N)",
    "aligner": "DeepSeek-V4.1 Flash vision aligner into the text width (aligner.w1 / w2)",
}
MTP_MODULES = frozenset({"mtp"})  # DeepSeek-V4 / GLM-5 native ``mtp.{k}.*`` next-token-prediction modules

# Rule 2's small float parameters that are 2-D but not linear weights, matched on the leaf (docs/FORMATS.md §5).
SMALL_PARAM_PREFIXES: dict[str, str] = {
    "hc_": "hyper-connections: DeepSeek-V4, GLM-5.3-Flash (hc_attn_fn, hc_ffn_base, hc_head.hc_fn, ...)",
}
SMALL_PARAM_SUFFIXES: dict[str, str] = {
    "ape": "absolute position embeddings of compressors: DeepSeek-V4 compressor.ape, GLM-5.3-Flash *_ape",
    "sinks": "attention sinks: gpt-oss self_attn.sinks",
    "attn_sink": "attention sinks: DeepSeek-V4 attn.attn_sink",
}
SMALL_PARAMS: dict[str, str] = {
    "dt_bias": "Gated DeltaNet / KDA: Qwen3.5/3-Next, Kimi-Linear, GLM-5.3-Flash",
    "A_log": "Gated DeltaNet / KDA decay (any rank; Kimi-Linear 4-D)",
    "global_scale": "NVFP4 global scales",
    "q_weight": "DeepSeek-V4.1 engram.q_weight [hc_mult, H]: per-stream gate weights, F32 like hc_*",
    "k_weight": "DeepSeek-V4.1 engram.k_weight [hc_mult, H]: per-stream gate weights, F32 like hc_*",
    "rel_pos": "relative-position tables (Inkling)",
    "rel_bias": "relative-position tables (Inkling)",
    "scale": "per-head L2-clip scales: Inkling-2 attn.q_l2_clip.scale / rel_l2_clip.scale [heads, d]",
    "attn_sink_proj": "Inkling-2 attn.attn_sink_proj.weight [heads, H]: per-head sink logits, F32 like sinks",
    # placed by closest row: the static taps of a dynamic short convolution are a conv kernel ([K, C] here)
    "static_w": "Inkling-2 k_sconv.static_w / v_sconv.static_w [K, C]: conv taps, F32 like conv kernels [C, 1, K]",
    # placed by closest row (docs/FORMATS.md "Placements"): a bare parameter used as a small linear map
    "index_kpool_compress_gate": "GLM-5.3-Flash indexer k-pool gate [index_head_dim, H], F32 like its *_ape",
}
# Modules whose every tensor is a rule-2 small parameter (matched on any inner component of a name).
SMALL_PARAM_MODULES: dict[str, str] = {
    "attn_res": "Inkling-2 block attention-residual queries (attn_res.attn_queries.N, mlp_queries.N)",
    "rel_logits_proj": "Inkling / Inkling-2 relative-position logits table (attn.rel_logits_proj.proj)",
}
CONV_MARKERS = ("conv",)  # conv1d kernels [C, 1, K]: linear_attn.conv1d, q_conv1d, Inkling short convolutions
SSM_PARAMS = frozenset({"A_log", "dt_bias", "D"})  # linear-attention state parameters

# Trailing suffixes of a tensor name (what follows its leaf), longest first when matched.
SUFFIXES = (
    "weight.qs",  # colitools codes' F32 scales (docs/FORMATS.md §2)
    "weight",
    "bias",
    "qs",
    "weight_packed",  # mxfp4 codes (compressed-tensors naming)
    "weight_scale",  # mxfp4 E8M0 scales
    "weight_scale_inv",  # FP8 block scales of a DeepSeek-style source
)
WEIGHT_SUFFIXES = ("weight", "weight_packed")  # a linear weight as stored: float / codes, or mxfp4 codes


class TensorRole(StrEnum):
    """What a name says a tensor is (the recipe's rules combine it with dtype and shape)."""

    ROUTER = "router"
    EMBED = "embed"
    HEAD = "head"
    EXPERT = "expert"  # a per-expert tensor ``...experts.{E}.{leaf}...``
    EXPERT_STACK = "expert_stack"  # a fused stack ``...experts.gate_up_proj`` [E, rows, cols]
    STACK_BIAS = "stack_bias"  # the bias of a fused stack ``...experts.gate_up_proj_bias`` [E, out]
    SHARED_EXPERT = "shared_expert"
    NORM = "norm"
    OTHER = "other"


@dataclass(frozen=True)
class TensorName:
    """One parsed tensor name. ``layer_prefix`` is the whole text before the layer index (``model.layers``);
    ``module`` the path between the layer (or the root) and the expert index or the leaf (``self_attn``,
    ``mlp.experts``, ``mlp.shared_experts``; ``""`` for ``model.norm.weight``); ``expert_base`` the whole text
    before the expert index of a per-expert tensor, or before the leaf of an expert stack
    (``model.layers.3.mlp.experts``). For a per-expert tensor ``leaf`` is the component after the index and
    ``suffix`` all the rest; otherwise ``suffix`` is the longest :data:`SUFFIXES` entry the name ends with."""

    name: str
    root: str
    layer_prefix: str | None
    layer: int | None
    module: str
    expert: int | None
    expert_base: str | None
    leaf: str
    projection: str | None  # gate | up | down | gate_up (an expert stack) | gate_up_down (merged) | None
    role: TensorRole
    suffix: str

    @property
    def expert_tensor(self) -> str:
        """What follows ``experts.{E}.`` in a per-expert name (``gate_proj.weight``, ``w1.weight.qs``)."""
        return f"{self.leaf}.{self.suffix}" if self.suffix or self.name.endswith(".") else self.leaf


# a name ends in a router spelling at a component boundary: it is the spelling, or ends in "." + the spelling
_ROUTER_ENDINGS = tuple("." + s for s in ROUTERS)
# (".{suffix}", its component count), most components first: a name ends in a suffix after a leaf
_SUFFIX_ENDINGS = [
    ("." + s, s.count(".") + 1) for s in sorted(SUFFIXES, key=lambda s: s.count("."), reverse=True)
]


# DeepSeek-V4: the released checkpoint's names (deepseek-ai's ``inference/model.py``; what ``c/deepseek_v4.c``
# looks up: ``coli_v4_layer_plan``'s ``add_spec`` writes ``layers.{L}.{leaf}``, no ``model.`` prefix) against
# the names transformers 5.24 saves a ``DeepseekV4ForCausalLM`` with (its ``conversion_mapping.py`` ``deepseek_v4``
# renamings reversed on save: ``attn.`` / ``ffn.`` / ``wq_a`` ... come back, but under ``model.``, with
# ``model.embed_tokens``, ``model.hc_head.hc_*`` and the attention's ``kv_norm`` saved as ``attn.norm``, as
# the fixture ``oracles/deepseek_v4`` holds them). One table, both directions; every other leaf is spelled
# the same in both (``attn.wq_a.weight``, ``ffn.experts.{E}.w1.weight``, ``hc_attn_fn``, ``attn.compressor.*``).
DEEPSEEK_V4_GLOBALS: dict[str, str] = {  # transformers-saved -> released
    "model.embed_tokens.weight": "embed.weight",
    "head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}
DEEPSEEK_V4_ROOTS: dict[str, str] = {"model.layers.": "layers.", "model.mtp.": "mtp."}  # saved -> released
DEEPSEEK_V4_LEAVES: dict[str, str] = {"attn.norm.weight": "attn.kv_norm.weight"}  # inside a layer
_V4_LAYER = re.compile(r"^(\d+)\.(.*)$")


def _v4_rename(name: str, roots: dict[str, str], leaves: dict[str, str]) -> str | None:
    for old, new in roots.items():
        if name.startswith(old):
            m = _V4_LAYER.match(name[len(old) :])
            if m is None:
                return None
            return f"{new}{m.group(1)}.{leaves.get(m.group(2), m.group(2))}"
    return None


def deepseek_v4_released_name(name: str) -> str:
    """The released DeepSeek-V4 checkpoint's name of a transformers-saved tensor name (``DEEPSEEK_V4_*``);
    a name the table does not know is returned unchanged (a released name stays one)."""
    if name in DEEPSEEK_V4_GLOBALS:
        return DEEPSEEK_V4_GLOBALS[name]
    return _v4_rename(name, DEEPSEEK_V4_ROOTS, DEEPSEEK_V4_LEAVES) or name


_V4_SAVED_GLOBALS = {v: k for k, v in DEEPSEEK_V4_GLOBALS.items()}
_V4_SAVED_ROOTS = {v: k for k, v in DEEPSEEK_V4_ROOTS.items()}
_V4_SAVED_LEAVES = {v: k for k, v in DEEPSEEK_V4_LEAVES.items()}


def deepseek_v4_saved_name(name: str) -> str | None:
    """The transformers-saved name of a released DeepSeek-V4 name, or None when ``name`` is not one (it has
    a text root, or is no released global): the inverse of :func:`deepseek_v4_released_name`."""
    if name in _V4_SAVED_GLOBALS:
        return _V4_SAVED_GLOBALS[name]
    if name.startswith(("model.", "language_model.")):
        return None
    return _v4_rename(name, _V4_SAVED_ROOTS, _V4_SAVED_LEAVES)


# the text roots by their components (one or two): a name's root is the two-component one its first two
# components spell when it goes on after them, else the one-component one of its first component
_ROOTS_BY_PARTS: dict[tuple[str, ...], str] = {tuple(r[:-1].split(".")): r for r in TEXT_ROOTS}
assert all(len(k) in (1, 2) for k in _ROOTS_BY_PARTS), "roots of one or two components"


def _root(name: str) -> str:
    first, _, rest = name.partition(".")
    if not rest:  # nothing after the first component's dot
        return ""
    second, _, after = rest.partition(".")
    if after:
        root = _ROOTS_BY_PARTS.get((first, second))
        if root is not None:
            return root
    return _ROOTS_BY_PARTS.get((first,), "")


def _from_last(rev: list[str], word: str) -> Iterator[int]:
    """The positions of component ``word`` that two more components follow, last first; ``rev`` is the name's
    components reversed (``list.index`` searches there, in C: planning parses every name of a checkpoint)."""
    n = len(rev)
    k = 2  # position n - 1 - k: two components after it
    while True:
        try:
            k = rev.index(word, k)
        except ValueError:
            return
        yield n - 1 - k
        k += 1


@lru_cache(maxsize=1 << 18)
def parse_name(name: str) -> TensorName:
    """Parse ``name`` once (cached). Never fails: a name the tables do not know is role ``other``."""
    parts = name.split(".")
    n = len(parts)
    root = _root(name)
    start = root.count(".")
    layer_prefix, layer = None, None
    rev = parts[::-1]
    for i in _from_last(rev, LAYERS):  # the last ``layers.{L}.``
        if parts[i + 1].isdecimal():
            layer_prefix, layer = ".".join(parts[: i + 1]), int(parts[i + 1])
            start = max(start, i + 2)
            break
    expert = expert_base = None
    for j in _from_last(rev, EXPERTS):  # the last ``experts.{E}.<something>``
        if parts[j + 1].isdecimal() and (n > j + 3 or parts[j + 2]):
            expert, expert_base = int(parts[j + 1]), ".".join(parts[: j + 1])
            leaf, suffix, leaf_at = parts[j + 2], ".".join(parts[j + 3 :]), j + 2
            module = ".".join(parts[min(start, j) : j + 1])
            projection = PROJECTIONS.get(leaf) or (MERGED_EXPERTS.get(leaf) if not suffix else None)
            break
    else:
        k = next((count for ending, count in _SUFFIX_ENDINGS if name.endswith(ending)), 0)
        leaf_at = n - k - 1
        leaf, suffix = parts[leaf_at], ".".join(parts[leaf_at + 1 :])
        module = ".".join(parts[start:leaf_at]) if start <= leaf_at else ""
        projection = PROJECTIONS.get(leaf)
        if (
            leaf_at > 0
            and parts[leaf_at - 1] == EXPERTS
            and leaf in EXPERT_STACKS
            and suffix in ("", "weight")
        ):
            projection, expert_base = EXPERT_STACKS[leaf], ".".join(parts[:leaf_at])
        elif leaf_at > 0 and parts[leaf_at - 1] == EXPERTS and leaf in STACK_BIASES and suffix == "":
            projection, expert_base = STACK_BIASES[leaf], ".".join(parts[:leaf_at])
    role = _role(name, leaf, module, expert, expert_base)
    return TensorName(
        name, root, layer_prefix, layer, module, expert, expert_base, leaf, projection, role, suffix
    )


def _role(name: str, leaf: str, module: str, expert: int | None, expert_base: str | None) -> TensorRole:
    if name.endswith(_ROUTER_ENDINGS) or name in ROUTERS:
        return TensorRole.ROUTER
    own_table = module.endswith(OWN_TABLE_MODULES)  # an engram / Markov table is not the model's embed / head
    if leaf in EMBEDDINGS and not own_table:
        return TensorRole.EMBED
    if leaf in HEADS and not own_table:
        return TensorRole.HEAD
    if expert is not None:
        return TensorRole.EXPERT
    if expert_base is not None:
        return TensorRole.STACK_BIAS if leaf in STACK_BIASES else TensorRole.EXPERT_STACK
    inner = module.split(".")
    if inner[-1] in SHARED_EXPERT_MODULES or (  # ``shared_experts.{k}.``: one expert of a split shared stack
        len(inner) > 1 and inner[-1].isdecimal() and inner[-2] in SHARED_EXPERT_MODULES
    ):
        return TensorRole.SHARED_EXPERT
    if leaf.endswith(NORM_ENDINGS):
        return TensorRole.NORM
    return TensorRole.OTHER


# --------------------------------------------------------------------------------------------- builders
def layer_path(layer: int, root: str = CANONICAL_ROOT) -> str:
    """``model.layers.{layer}``: the prefix of every tensor of decoder layer ``layer``."""
    return f"{root}{LAYERS}.{layer}"


def module_path(layer: int, module: str, root: str = CANONICAL_ROOT) -> str:
    """``model.layers.{layer}.{module}`` (``self_attn``, ``mlp``, ``mlp.experts``, ...)."""
    return f"{layer_path(layer, root)}.{module}"


def expert_tensor_name(expert_base: str, expert: int, projection: str, suffix: str = "weight") -> str:
    """``{expert_base}.{expert}.{gate|up|down}_proj[.{suffix}]``: the per-expert name we write (docs/FORMATS.md §4),
    also what an expert stack is split into."""
    name = f"{expert_base}.{expert}.{CANONICAL_PROJECTION[projection]}"
    return f"{name}.{suffix}" if suffix else name


def is_merged_expert(name: str) -> bool:
    """A merged per-expert blob (:data:`MERGED_EXPERTS`: ``...experts.{E}.merged_weight``)."""
    return parse_name(name).projection == MERGED


def is_merged_scale(name: str) -> bool:
    """A merged blob's scale tensor (:data:`MERGED_SCALES`: ``...experts.{E}.qs``)."""
    parsed = parse_name(name)
    return parsed.expert is not None and parsed.leaf in MERGED_SCALES and parsed.suffix == ""


def is_tower(name: str) -> bool:
    """A tensor of a multimodal tower or projector (rule 1): its first component, after an optional
    ``model.``, is a :data:`TOWER_MODULES` entry. Text-model names (under a text root) never are."""
    parts = name.split(".", 2)
    first = parts[1] if parts[0] == "model" and len(parts) > 1 else parts[0]
    return first in TOWER_MODULES


def is_lookup_table(name: str) -> bool:
    """A weight of a :data:`LOOKUP_TABLES` table (or one of its row shards): rule 4 like an embedding."""
    parsed = parse_name(name)
    if parsed.suffix != "weight":
        return False
    if parsed.leaf in LOOKUP_TABLES:
        return True
    return parsed.leaf.startswith(TABLE_SHARD_PREFIX) and parsed.module.rpartition(".")[2] in LOOKUP_TABLES


def _module_search(words: Iterable[str], prefixes: Iterable[str] = ()) -> Callable[[str], bool]:
    """A test of a dotted name: is one of its components but the last one of ``words``, or does it start with
    one of ``prefixes``? Substring searches (planning asks it of every tensor of a 92k-tensor checkpoint; a regex
    took 2 us a name): ``.word.`` in ``.name``; the first ``.prefix`` with a dot after it."""
    whole = tuple(f".{w}." for w in words)
    starts = tuple(f".{p}" for p in prefixes)
    assert not any("." in w for w in (*words, *prefixes)), "one component each"

    def test(name: str) -> bool:
        dotted = "." + name
        for w in whole:
            if w in dotted:
                return True
        for p in starts:
            at = dotted.find(p)  # a later match would be in the same or a later component: this one decides
            if at >= 0 and dotted.find(".", at + 1) >= 0:
                return True
        return False

    return test


_in_mtp_module = _module_search(MTP_MODULES)
_in_small_param_module = _module_search(SMALL_PARAM_MODULES, SMALL_PARAM_PREFIXES)
_SMALL_PARAM_PREFIXES = tuple(SMALL_PARAM_PREFIXES)
_SMALL_PARAM_SUFFIXES = tuple(SMALL_PARAM_SUFFIXES)


def is_mtp_module(name: str) -> bool:
    """A tensor of a native ``mtp.`` module (rule 3), wherever it sits under the root."""
    return _in_mtp_module(name)


def is_small_param(name: str) -> bool:
    """Rule 2's named small float parameters (hyper-connections, sinks, ``*ape``, ``dt_bias``, ``A_log``,
    relative-position tables, attention-residual queries, ``global_scale``), on the tensor's leaf, or every
    tensor under a module named so (or starting with a :data:`SMALL_PARAM_PREFIXES` entry)."""
    leaf = parse_name(name).leaf
    return (
        leaf in SMALL_PARAMS
        or leaf.startswith(_SMALL_PARAM_PREFIXES)
        or leaf.endswith(_SMALL_PARAM_SUFFIXES)
        or _in_small_param_module(name)
    )


@dataclass(frozen=True)
class SharedStack:
    """A stacked shared expert ``{base}.{leaf}`` (``base`` ends in ``shared_experts``) holding ``projection``
    (``gate_up`` | ``gate`` | ``up`` | ``down``) of every shared expert."""

    base: str
    projection: str

    def expert_name(self, k: int, projection: str) -> str:
        """``{base}.{k}.{gate|up|down}_proj.weight``: shared expert ``k``'s projection as written."""
        return f"{self.base}.{k}.{CANONICAL_PROJECTION[projection]}.weight"


def shared_stack(name: str) -> SharedStack | None:
    """The stacked shared expert ``name`` is (:data:`SHARED_EXPERT_STACKS`: a suffixless leaf right under a
    :data:`SHARED_EXPERT_MODULES` module), or None. Callers also check the tensor is 3-D."""
    base, _, leaf = name.rpartition(".")
    if leaf not in SHARED_EXPERT_STACKS or base.rpartition(".")[2] not in SHARED_EXPERT_MODULES:
        return None
    return SharedStack(base, SHARED_EXPERT_STACKS[leaf])


def keeps_f32(name: str, ndim: int) -> bool:
    """Rule 2 on an un-stacked tensor (docs/FORMATS.md §6): routers and their biases, every tensor that is not
    2-D (norms, biases, conv kernels, ``A_log`` of any rank), the named small 2-D parameters
    (:func:`is_small_param`) and stack biases. (An expert stack itself, 3-D, is rule 5: the recipe asks first.)"""
    role = parse_name(name).role
    return role in (TensorRole.ROUTER, TensorRole.STACK_BIAS) or ndim != 2 or is_small_param(name)


# The finer roles ``convert --dry-run``, ``inspect --summary`` and the manifest count formats by (docs/FORMATS.md
# §6 "Formats per role"), in the order they are printed.
DETAIL_ROLES = (
    "copied non-float", "tower", "router", "norm/1-D", "conv", "ssm params", "hc", "sinks", "small params",
    "embed", "head", "mtp", "routed experts", "shared experts", "attention", "dense mlp", "other",
)  # fmt: skip


def order_role_formats(counts) -> dict[str, dict[str, int]]:
    """``{role: {label: n}}`` with roles in :data:`DETAIL_ROLES` order and labels sorted: formats per role as the
    manifest, ``--dry-run`` and ``inspect`` report them."""
    order = {r: i for i, r in enumerate(DETAIL_ROLES)}
    return {r: dict(sorted(counts[r].items())) for r in sorted(counts, key=lambda r: (order.get(r, 99), r))}


ATTENTION_MODULES = frozenset({"self_attn", "attn", "attention", "linear_attn", "cross_attn"})
DENSE_MLP_MODULES = frozenset({"mlp", "ffn", "feed_forward", "block_sparse_moe"})


def detail_role(name: str, ndim: int, *, copied: bool = False, num_hidden_layers: int | None = None) -> str:
    """The finer role (:data:`DETAIL_ROLES`) of output tensor ``name`` (a weight as written: ``.weight``,
    mxfp4's ``.weight_packed``, a bias, a norm; per-expert names, stacks already split) with ``ndim`` logical
    dims. Rules in the recipe's order (docs/FORMATS.md §6 rows 0-6): ``copied`` (a non-float tensor copied
    unchanged), towers, rule 2's F32 tensors (router, conv, ssm params, hc, sinks, routed-expert biases,
    norm/1-D, small params), MTP (layer ``>= num_hidden_layers`` or an ``mtp.`` module), embed / head, routed
    experts, shared experts, attention, dense mlp, other. The converter (on its plan) and ``inspect`` (on a
    container) both ask this, so their counts agree."""
    parsed = parse_name(name)
    if copied:
        return "copied non-float"
    if is_tower(name):
        return "tower"
    if keeps_f32(name, ndim):
        leaf = parsed.leaf
        if parsed.role is TensorRole.ROUTER or (
            parsed.suffix == "bias" and parse_name(name[: -len("bias")] + "weight").role is TensorRole.ROUTER
        ):
            return "router"
        if any(m in leaf for m in CONV_MARKERS) or any(
            m in p for p in name.split(".")[-3:-1] for m in CONV_MARKERS
        ):
            return "conv"
        if leaf in SSM_PARAMS:
            return "ssm params"
        if any(p.startswith(tuple(SMALL_PARAM_PREFIXES)) for p in name.split(".")):
            return "hc"
        if leaf.endswith(("sinks", "attn_sink")):
            return "sinks"
        if parsed.expert is not None or parsed.role is TensorRole.STACK_BIAS:
            return "routed experts"
        return "norm/1-D" if ndim <= 1 else "small params"
    if (num_hidden_layers is not None and parsed.layer is not None and parsed.layer >= num_hidden_layers) or (
        is_mtp_module(name)
    ):
        return "mtp"
    if parsed.role in (TensorRole.EMBED, TensorRole.HEAD) and parsed.suffix in WEIGHT_SUFFIXES:
        return "head" if parsed.role is TensorRole.HEAD else "embed"
    if is_lookup_table(name):
        return "embed"
    if parsed.expert is not None:
        return "routed experts"
    if parsed.role is TensorRole.SHARED_EXPERT:
        return "shared experts"
    module = parsed.module.split(".")
    if any(m in ATTENTION_MODULES for m in module):
        return "attention"
    if any(m in DENSE_MLP_MODULES for m in module):
        return "dense mlp"
    return "other"


def stack_name(expert_base: str, projection: str) -> str:
    """The transformers spelling of an expert stack: ``{expert_base}.gate_up_proj`` / ``.down_proj``."""
    return f"{expert_base}.{next(k for k, v in EXPERT_STACKS.items() if v == projection)}"


def stack_names(expert_base: str, projection: str) -> tuple[str, ...]:
    """Every spelling of an expert stack (:data:`EXPERT_STACKS`), the transformers one first."""
    return tuple(f"{expert_base}.{k}" for k, v in EXPERT_STACKS.items() if v == projection)


@lru_cache(maxsize=1 << 18)
def canonical_name(name: str) -> str:
    """The runtime's spelling of a checkpoint name (mlx-lm's ``sanitize``): :data:`MODULE_ALIASES` applied to
    inner components, a per-expert projection spelled ``gate_proj``/``up_proj``/``down_proj``; suffixes kept.
    A name under another text root (:data:`TEXT_ROOTS`: ``model.language_model.``, ``language_model.model.``)
    is spelled under :data:`CANONICAL_ROOT`, an output head there (``language_model.lm_head.weight``) at the
    top (``lm_head.weight``); towers (not under a text root) keep their names. A released DeepSeek-V4 name
    (``layers.{L}.attn.kv_norm.weight``, ``embed.weight``, ``hc_head_fn``: ``--target deepseek_v4``) is first
    spelled as transformers saves it (:func:`deepseek_v4_saved_name`)."""
    name = deepseek_v4_saved_name(name) or name
    parts = name.split(".")
    for i in range(1, len(parts) - 1):
        parts[i] = MODULE_ALIASES.get(parts[i], parts[i])
    parsed = parse_name(name)
    if parsed.expert is not None and parsed.projection is not None and parsed.expert_base != EXPERTS:
        at = parsed.expert_base.count(".") + 2
        if at + 1 < len(parts):  # the projection is followed by a suffix
            parts[at] = CANONICAL_PROJECTION[parsed.projection]
    out = ".".join(parts)
    if parsed.root and parsed.root != CANONICAL_ROOT:
        rest = out[len(parsed.root) :]
        out = rest if rest.split(".", 1)[0] in HEADS else CANONICAL_ROOT + rest
    return out


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders ``layers.2`` before ``layers.10`` (numbers compared as numbers)."""
    parts = _DIGITS.split(name)  # the group's matches, the digit runs, at the odd indices
    parts[1::2] = map(int, parts[1::2])
    return tuple(parts)
