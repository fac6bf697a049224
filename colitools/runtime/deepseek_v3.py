"""DeepSeek-V3 (``deepseek_v3``) and GLM-5 (``glm_moe_dsa``).

MLA attention (``q_a -> RMSNorm -> q_b`` or a plain ``q_proj``; a shared latent ``kv_a`` with one roped key
slice for all heads; interleaved RoPE by default; YaRN with ``mscale^2`` on the softmax scale), group-limited
sigmoid routing (``noaux_tc``) with a shared expert, the first ``first_k_dense_replace`` layers dense.
GLM-5 adds the DSA lightning indexer; ``"shared"`` indexer layers reuse the previous full layer's selection.
"""

from __future__ import annotations

from colitools.runtime.attention import DSAIndexer, MLAAttention
from colitools.runtime.model import DecoderLayer, LayerContext


def build_layer(ctx: LayerContext, layer: int) -> DecoderLayer:
    args = ctx.args
    indexer = None
    if args.model_type == "glm_moe_dsa" and args.indexer_full[layer]:
        indexer = DSAIndexer(args, ctx.ckpt, layer, ctx.rope)
    attn = MLAAttention(args, ctx.ckpt, layer, ctx.rope, indexer)
    ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
    return ctx.decoder_layer(layer, attn, ffn)
