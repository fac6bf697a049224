"""The family protocol: what the runtime asks of a model family, and the pieces a family builds its layers from.

```
x = embed[ids]
for each layer: x = x + Attn(RMSNorm_in(x)); x = x + FFN(RMSNorm_post(x))
logits = RMSNorm_final(x) @ lm_head.T
```
Each family is one module ``colitools/runtime/<name>.py`` (``name``: its family in ``formats/families.py``,
which also owns its model types and geometry) holding ``FAMILY``, an instance of a :class:`RuntimeFamily` subclass:

* ``defaults``: model_type -> the transformers defaults of keys a config omits;
* ``args(c, base)``: the family's own arguments dataclass (a ``config.ModelArgs`` subclass) from its config keys;
* ``layer(ctx, layer)``: its decoder layer (default: GQA attention, then routed experts or a dense MLP);
* ``io(args, ckpt)``: the one hook for a family whose skeleton differs — the model's two ends (:class:`ModelIO`:
  the embedding into the first layer's input, what the first layer carries, the last layer's output to logits;
  default: ``embed_tokens`` / ``norm`` / ``lm_head``). Hyper-connection streams (GLM-5.3, DeepSeek-V4), Inkling's
  ``embed_norm`` and ``unembed``, Inkling-2's block states are such ends.

A layer (:class:`Layer`) is called ``(x, positions, cos, sin, carry) -> (x, carry)``, ``carry`` being what it hands
the next layer (the DSA selection of MLA, block states, DeepSeek-V4's token ids); it owns its part of the cache
(``reset``) and counts its resident bytes (``nbytes``). ``LayerContext`` hands out the shared pieces.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.names import layer_path, module_path
from colitools.runtime.attention import GQAAttention, TokenMixer
from colitools.runtime.config import ConfigKeys, GQAArgs, ModelArgs, attention_args, rope_args, routing_args
from colitools.runtime.experts import Expert, ExpertStore, expert_sources
from colitools.runtime.moe import LayerRoutes, RouteRecord, SparseMoE
from colitools.runtime.ops import MLP, Embedding, Linear, norm_weight, rms_norm
from colitools.runtime.rope import Rope
from colitools.runtime.weights import Checkpoint, Stored


class Layer(Protocol):
    """What ``Model`` calls on each layer."""

    nbytes: int

    def __call__(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                 carry: Any) -> tuple[np.ndarray, Any]: ...  # fmt: skip

    def reset(self) -> None: ...


class DecoderLayer:
    """``x + Attn(norm_in(x))`` then ``x + FFN(norm_post(x))``."""

    def __init__(self, attn: TokenMixer, ffn, norm_in: np.ndarray, norm_post: np.ndarray, eps: float):
        self.attn, self.ffn, self.norm_in, self.norm_post, self.eps = attn, ffn, norm_in, norm_post, eps

    @property
    def nbytes(self) -> int:
        return self.norm_in.nbytes + self.norm_post.nbytes + self.attn.nbytes + self.ffn.nbytes

    def reset(self) -> None:
        self.attn.reset()

    def __call__(self, x, positions, cos, sin, carry):
        a, carry = self.attn.mix(rms_norm(x, self.norm_in, self.eps), positions, cos, sin, carry)
        x = x + a
        return x + self.ffn(rms_norm(x, self.norm_post, self.eps)), carry


class LayerContext:
    """What a family's ``layer`` needs: args, checkpoint, RoPE, and factories for the shared blocks."""

    def __init__(self, args: ModelArgs, ckpt: Checkpoint, rope: Rope, routes: RouteRecord | None):
        self.args, self.ckpt, self.rope, self.routes = args, ckpt, rope, routes
        self.stores: dict[int, ExpertStore] = {}
        self.shared: dict[str, Any] = {}  # state a family's layers share (DeepSeek-V4.1's published caches)

    def decoder_layer(self, layer: int, attn: TokenMixer, ffn) -> DecoderLayer:
        p, H, zc = layer_path(layer), self.args.hidden_size, self.args.zero_centred_norms
        return DecoderLayer(
            attn,
            ffn,
            norm_weight(self.ckpt, f"{p}.input_layernorm.weight", H, zc),
            norm_weight(self.ckpt, f"{p}.post_attention_layernorm.weight", H, zc),
            self.args.rms_norm_eps,
        )

    def dense_mlp(self, layer: int) -> MLP:
        return MLP(self.ckpt, module_path(layer, "mlp"), self.args.hidden_size, self.args.intermediate_size)

    def sparse_moe(self, layer: int, biases: list[tuple[Stored, Stored, Stored]] | None = None,
                   make: type[Expert] | None = None) -> SparseMoE:  # fmt: skip
        """The layer's MoE block; ``biases`` / ``make``: per-expert biases and the family's expert class."""
        store = self.expert_store(layer, biases, make or Expert)
        return SparseMoE(self.args, self.ckpt, layer, store, self.layer_usage(layer))

    def expert_store(self, layer: int, biases=None, make=Expert) -> ExpertStore:
        """The routed experts of ``layer`` (registered for the placement and the statistics)."""
        store = ExpertStore(self.ckpt, layer, expert_sources(self.args, self.ckpt, layer), self.args.num_experts,
                            biases, make)  # fmt: skip
        self.stores[layer] = store
        return store

    def layer_usage(self, layer: int) -> LayerRoutes | None:
        """Where ``layer``'s MoE block reports its routing (usage counts, route trace); None when not recording."""
        return None if self.routes is None else self.routes.layer(layer)


class ModelIO:
    """The model's two ends: ``tokens(ids)`` the first layer's input, ``carry(ids, x)`` what the first layer is
    handed, ``logits(x, carry, all_logits)`` of the last position (every position with ``all_logits``). This one:
    ``model.embed_tokens``, ``model.norm`` and ``lm_head`` (``head_name``), or the tied embedding."""

    head_name = "lm_head"  # the output head's weight prefix

    def __init__(self, args: ModelArgs, ckpt: Checkpoint):
        H, V = args.hidden_size, args.vocab_size
        self.embed = Embedding(ckpt, "model.embed_tokens.weight", V, H)
        self.norm = norm_weight(ckpt, "model.norm.weight", H, args.zero_centred_norms)
        self.eps = args.rms_norm_eps
        if ckpt.has(f"{self.head_name}.weight"):
            self.lm_head = Linear.load(ckpt, self.head_name, V, H)
        elif args.tie_word_embeddings:
            self.lm_head = Linear(self.embed.q)
        else:
            raise RuntimeModelError(
                f"{ckpt.dir}: missing tensor {self.head_name}.weight (and tie_word_embeddings is false)"
            )

    @property
    def nbytes(self) -> int:
        """The embedding and the head (once when tied), for the placement."""
        return self.embed.nbytes + (self.lm_head.nbytes if self.lm_head.weight is not self.embed.q else 0)

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        return self.embed(ids)

    def carry(self, ids: np.ndarray, x: np.ndarray) -> Any:
        return None

    def logits(self, x: np.ndarray, carry: Any, all_logits: bool) -> np.ndarray:
        return self.lm_head(rms_norm(x if all_logits else x[-1:], self.norm, self.eps))


class RuntimeFamily:
    """The runtime's interface to a model family; a family module holds ``FAMILY = <its subclass>()``. The
    defaults are the transformers MoE decoder: every layer MoE with softmax routing, GQA attention without
    options, RoPE over ``head_dim x partial_rotary_factor``, ``embed_tokens`` / ``norm`` / ``lm_head``."""

    defaults: ClassVar[dict[str, dict[str, Any]]] = {}  # model_type -> defaults of keys a config omits

    def args(self, c: ConfigKeys, base: dict[str, Any]) -> ModelArgs:
        """The family's arguments: ``base`` (the common fields) plus what the family reads from ``c``."""
        return GQAArgs(**base, attention=attention_args(c, base["num_hidden_layers"]), routing=routing_args(c),
                       rope=rope_args(c, base["head_dim"]))  # fmt: skip

    def layer(self, ctx: LayerContext, layer: int) -> Layer:
        """Decoder layer ``layer``: GQA attention, then routed experts or a dense MLP (``moe_layers``)."""
        args = ctx.args
        attn = GQAAttention(args, ctx.ckpt, layer, rope=ctx.rope)
        ffn = ctx.sparse_moe(layer) if args.moe_layers[layer] else ctx.dense_mlp(layer)
        return ctx.decoder_layer(layer, attn, ffn)

    def io(self, args: ModelArgs, ckpt: Checkpoint) -> ModelIO:
        """The model's ends (the one hook for a different skeleton)."""
        return ModelIO(args, ckpt)

    act_quant_modes: ClassVar[tuple[str, ...]] = ()  # ``run --act-quant`` modes (deepseek_v4: official)

    def set_act_quant(self, args: ModelArgs, mode: str | None) -> None:
        """Round activations as ``mode`` (one of ``act_quant_modes``, or None) says; a family with modes
        overrides this."""
