"""DeepSeek-V3 (``deepseek_v3``) and GLM-5 (``glm_moe_dsa``).

MLA attention (``q_a -> RMSNorm -> q_b`` or a plain ``q_proj``; a shared latent ``kv_a`` with one roped key
slice for all heads; interleaved RoPE by default; YaRN with ``mscale^2`` on the softmax scale), group-limited
sigmoid routing (``noaux_tc``) with a shared expert, the first ``first_k_dense_replace`` layers dense.
GLM-5 adds the DSA lightning indexer; ``"shared"`` indexer layers reuse the previous full layer's selection.
"""

from __future__ import annotations

from typing import Any

from colitools.errors import RuntimeModelError
from colitools.runtime.attention import DSAIndexer, MLAAttention
from colitools.runtime.config import ConfigKeys, noaux_tc_args, rope_args
from colitools.runtime.model import DecoderLayer, LayerContext

DEFAULTS = {  # transformers 5.24 DeepseekV3Config / GlmMoeDsaConfig
    "deepseek_v3": {
        "rms_norm_eps": 1e-6, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 8,
        "topk_group": 4, "first_k_dense_replace": 3, "n_shared_experts": 1,
    },
    "glm_moe_dsa": {
        "rms_norm_eps": 1e-5, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 3, "n_shared_experts": 1, "index_topk": 2048,
        "index_head_dim": 128, "index_n_heads": 32,
    },
}  # fmt: skip


def family_args(c: ConfigKeys, base: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-style routing, the MLA dimensions, RoPE on the rope slice only (interleaved: always for GLM-5,
    by ``rope_interleave`` for DeepSeek-V3), and GLM-5's indexer."""
    out = noaux_tc_args(c, base)
    nope, rope_dim = int(c.need("qk_nope_head_dim")), int(c.need("qk_rope_head_dim"))
    interleaved = c.model_type == "glm_moe_dsa" or bool(c.get("rope_interleave", True))
    out.update(
        q_lora_rank=int(c["q_lora_rank"]) if c.get("q_lora_rank") else None,
        kv_lora_rank=int(c.need("kv_lora_rank")),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope_dim,
        v_head_dim=int(c.need("v_head_dim")),
        head_dim=nope + rope_dim,
        rope=rope_args(c, rope_dim, partial=False, interleaved=interleaved),
    )
    if base["num_key_value_heads"] != base["num_attention_heads"]:
        raise RuntimeModelError(f"{c.where}: MLA needs num_key_value_heads == num_attention_heads")
    if c.model_type == "glm_moe_dsa":
        if out["q_lora_rank"] is None:
            raise RuntimeModelError(f"{c.where}: glm_moe_dsa needs q_lora_rank")
        out.update(
            index_topk=int(c.need("index_topk")),
            index_head_dim=int(c.need("index_head_dim")),
            index_n_heads=int(c.need("index_n_heads")),
            indexer_full=_indexer_types(c, base["num_hidden_layers"]),
        )
    return out


def _indexer_types(c: ConfigKeys, n_layers: int) -> list[bool]:
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


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    args = ctx.args
    indexer = None
    if args.model_type == "glm_moe_dsa" and args.indexer_full[layer]:
        indexer = DSAIndexer(args, ctx.ckpt, layer, ctx.rope)
    attn = MLAAttention(args, ctx.ckpt, layer, ctx.rope, indexer)
    ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
    return ctx.decoder_layer(layer, attn, ffn)
