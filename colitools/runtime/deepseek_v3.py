"""DeepSeek-V3 (``deepseek_v3``), Kimi K2.5 (``kimi_k25``), DeepSeek-V3.2 (``deepseek_v32``) and GLM-5
(``glm_moe_dsa``).

MLA attention (``q_a -> RMSNorm -> q_b`` or a plain ``q_proj``; a shared latent ``kv_a`` with one roped key
slice for all heads; interleaved RoPE by default; YaRN with ``mscale^2`` on the softmax scale), group-limited
sigmoid routing (``noaux_tc``) with a shared expert, the first ``first_k_dense_replace`` layers dense.

* Kimi K2.5 is a multimodal wrapper around a DeepSeek-V3 text model (``text_config``, names under
  ``model.language_model.``; the vision tower and projector are never read). Its head is tied to the
  embeddings by the wrapper's ``tie_word_embeddings`` (transformers ties on the top-level config, default
  true), used when no ``lm_head.weight`` is stored.
* DeepSeek-V3.2 and GLM-5 add the DSA lightning indexer (``INDEXER_ROPE_INTERLEAVED``: V3.2's indexer rotates
  half-split pairs, GLM-5's interleaved; both main attentions are interleaved). V3.2 has an indexer in every
  layer; GLM-5's ``"shared"`` indexer layers reuse the previous full layer's selection.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from colitools.formats.errors import RuntimeModelError
from colitools.formats.names import module_path
from colitools.runtime.attention import DSAIndexer, MLAAttention
from colitools.runtime.config import (
    ConfigKeys,
    IndexerArgs,
    MLAArgs,
    ModelArgs,
    mla_args,
    mla_head_dim,
    noaux_tc_args,
    rope_args,
)
from colitools.runtime.family import DecoderLayer, LayerContext, RuntimeFamily
from colitools.runtime.rope import Rope

_DEEPSEEK_V3 = {  # transformers 5.24 DeepseekV3Config
    "rms_norm_eps": 1e-6, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 8,
    "topk_group": 4, "first_k_dense_replace": 3, "n_shared_experts": 1,
}  # fmt: skip

# The families with a DSA lightning indexer -> whether the indexer's RoPE rotates interleaved pairs (2i, 2i+1)
# (GLM-5: ``apply_rotary_pos_emb_interleave``) or half-split pairs (i, i + d/2) (DeepSeek-V3.2:
# ``apply_rotary_pos_emb``). The main MLA attention of both is interleaved.
log = logging.getLogger(__name__)

INDEXER_ROPE_INTERLEAVED = {"glm_moe_dsa": True, "deepseek_v32": False}


@dataclass(kw_only=True)
class DeepseekV3Args(ModelArgs):
    """MLA and, for DeepSeek-V3.2 / GLM-5, the DSA indexer."""

    mla: MLAArgs
    indexer: IndexerArgs | None = None


class DeepseekV3(RuntimeFamily):
    defaults = {  # transformers 5.24 DeepseekV3Config / Kimi_K25Config / DeepseekV32Config / GlmMoeDsaConfig
        "deepseek_v3": _DEEPSEEK_V3,
        "kimi_k25": {**_DEEPSEEK_V3, "tie_word_embeddings": True},  # its text_config is DeepseekV3Config; the
        # tie default is the wrapper's (Kimi_K25Config), read from the top level by args
        "deepseek_v32": {
            **_DEEPSEEK_V3, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64,
        },
        "glm_moe_dsa": {
            "rms_norm_eps": 1e-5, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1,
            "topk_group": 1, "first_k_dense_replace": 3, "n_shared_experts": 1, "index_topk": 2048,
            "index_head_dim": 128, "index_n_heads": 32,
        },
    }  # fmt: skip

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> DeepseekV3Args:
        """DeepSeek-style routing, the MLA dimensions, RoPE on the rope slice only (interleaved: always for the
        indexer families, by ``rope_interleave`` for DeepSeek-V3 and Kimi), the indexer, Kimi's tied head."""
        moe_layers, routing = noaux_tc_args(c, base)
        mla = mla_args(c, base)
        dsa = c.model_type in INDEXER_ROPE_INTERLEAVED
        interleaved = dsa or bool(c.get("rope_interleave", True))
        rope = rope_args(c, mla.qk_rope_head_dim, partial=False, interleaved=interleaved)
        fields = {**base, "moe_layers": moe_layers, "head_dim": mla_head_dim(mla)}
        if c.model_type == "kimi_k25":
            # transformers ties the head on the wrapper's config, not on text_config
            tie = base["raw"].get("tie_word_embeddings", self.defaults["kimi_k25"]["tie_word_embeddings"])
            fields["tie_word_embeddings"] = bool(tie)
        indexer = _indexer_args(c, mla, base["num_hidden_layers"]) if dsa else None
        return DeepseekV3Args(**fields, mla=mla, indexer=indexer, routing=routing, rope=rope)

    def layer(self, ctx: LayerContext, layer: int) -> DecoderLayer:
        args = ctx.args
        indexer = None
        if args.indexer is not None and args.indexer.full[layer] and _has_indexer(args, ctx, layer):
            rope = ctx.rope  # the same frequencies and cos/sin; only the pairing may differ
            if INDEXER_ROPE_INTERLEAVED[args.model_type] != args.rope.interleaved:
                rope = Rope(replace(args.rope, interleaved=INDEXER_ROPE_INTERLEAVED[args.model_type]))
            indexer = DSAIndexer(args, ctx.ckpt, layer, rope)
        attn = MLAAttention(args, ctx.ckpt, layer, ctx.rope, indexer)
        ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
        return ctx.decoder_layer(layer, attn, ffn)


def _has_indexer(args: DeepseekV3Args, ctx: LayerContext, layer: int) -> bool:
    """Whether the container holds the DSA indexer. GLM-5 containers of colibri's converter
    (``c/tools/convert_fp8_to_int4.py`` without ``--indexer``) have none: c/colibri.c (``model_init``) then
    turns DSA off for the whole model when any full indexer layer lacks ``...indexer.wq_b.weight`` and attends
    densely over every key (exact while the context is <= ``index_topk``); colitools does the same, saying so
    once (at the first full layer) as a note on the ``colitools`` logger, which the CLI prints."""
    assert args.indexer is not None
    if args.model_type != "glm_moe_dsa":
        return True
    full = [i for i, f in enumerate(args.indexer.full) if f]
    missing = [i for i in full if not ctx.ckpt.has(f"{module_path(i, 'self_attn.indexer')}.wq_b.weight")]
    if not missing:
        return True
    if layer == full[0]:
        log.info(
            "%s: no DSA indexer (%s.wq_b.weight is absent): dense attention over every key, as c/colibri.c runs "
            "such a container (exact while the context is <= index_topk %d)",
            ctx.ckpt.dir, module_path(missing[0], "self_attn.indexer"), args.indexer.topk,
        )
    return False


def _indexer_args(c: ConfigKeys, mla: MLAArgs, n_layers: int) -> IndexerArgs:
    """The DSA indexer: ``index_topk`` / ``index_head_dim`` / ``index_n_heads``, own or shared per layer (DeepSeek-V3.2
    runs its own indexer in every layer), ``q_lora_rank`` required (the indexer reads the query LoRA)."""
    if mla.q_lora_rank is None:
        raise RuntimeModelError(f"{c.where}: {c.model_type} needs q_lora_rank")
    ix = IndexerArgs(
        topk=int(c.need("index_topk")),
        head_dim=int(c.need("index_head_dim")),
        n_heads=int(c.need("index_n_heads")),
        full=indexer_types(c, n_layers) if c.model_type == "glm_moe_dsa" else [True] * n_layers,
    )
    if ix.head_dim < mla.qk_rope_head_dim:
        raise RuntimeModelError(
            f"{c.where}: index_head_dim {ix.head_dim} < qk_rope_head_dim {mla.qk_rope_head_dim}"
        )
    return ix


def indexer_types(c: ConfigKeys, n_layers: int) -> list[bool]:
    """Per layer, whether it has its own indexer (``full``) or reuses the previous one's selection
    (``shared``): ``indexer_types``, else ``index_topk_pattern``, else ``index_topk_freq`` from
    ``index_skip_topk_offset``."""
    types = c.get("indexer_types")
    if types is None:
        pattern = c.get("index_topk_pattern")
        if pattern is not None:
            types = (
                [{"F": "full", "S": "shared"}.get(ch, ch) for ch in pattern]
                if isinstance(pattern, str)
                else pattern
            )
        else:
            freq = max(int(c.get("index_topk_freq", 1)), 1)
            offset = int(c.get("index_skip_topk_offset", 2))
            types = ["full" if (max(i - offset + 1, 0) % freq) == 0 else "shared" for i in range(n_layers)]
    if len(types) != n_layers or any(t not in ("full", "shared") for t in types) or types[0] != "full":
        raise RuntimeModelError(f"{c.where}: bad indexer_types {types!r}")
    return [t == "full" for t in types]


FAMILY = DeepseekV3()
