"""``ModelArgs``: the model geometry and options the runtime needs, parsed from ``config.json``.

transformers 5.x configs and hub checkpoints spell the same things differently: ``rope_parameters`` vs
top-level ``rope_theta`` + ``rope_scaling {type|rope_type}``, ``head_dim`` missing or null. The keys every family
shares are parsed here, once, through the config facts (``formats/model_config.py``: validation, text model, expert
count and width) into the fields of ``ModelArgs``; the family then parses its own arguments dataclass (a
``ModelArgs`` subclass: its layer schedule, routing, MLA, sliding windows, RoPE layout, ...) in its own file
(``RuntimeFamily.args``, ``family.py``), from its defaults for keys a config omits (``RuntimeFamily.defaults``: the transformers
5.24 class defaults). The option groups of the shared blocks (``RoutingArgs``, ``AttentionArgs``, ``MLAArgs``,
``IndexerArgs``, ``LinearAttentionArgs``, ``KDAArgs``, ``HyperArgs``) and the parsing helpers the families share
(``rope_args``, ``routing_args``, ``mla_args``, ``noaux_tc_args``) live here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colitools.formats import model_config
from colitools.formats.errors import RuntimeModelError
from colitools.formats.filenames import CONFIG_FILE
from colitools.formats.jsonfile import load_json_object
from colitools.runtime.family_registry import family_for


@dataclass(frozen=True)
class RopeArgs:
    """Rotary embedding parameters (``rope_parameters`` after standardisation)."""

    rope_type: str = "default"  # "default" | "yarn" | "linear" | "llama3"
    theta: float = 10000.0
    dim: int = 0  # rotary dims per head (already multiplied by partial_rotary_factor)
    interleaved: bool = False  # rotate pairs (2i, 2i+1) instead of (i, i + d/2)
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    low_freq_factor: float = 1.0  # llama3 (Llama-3.1+, Llama-4 Scout): the wavelength band whose frequencies
    high_freq_factor: float = 4.0  # are interpolated between unscaled and divided by ``factor``


@dataclass(frozen=True)
class LinearAttentionArgs:
    """Gated DeltaNet geometry (Qwen3-Next, Qwen3.5-MoE ``linear_attention`` layers)."""

    conv_kernel: int  # linear_conv_kernel_dim
    num_key_heads: int  # linear_num_key_heads
    num_value_heads: int  # linear_num_value_heads (a multiple of the key heads)
    key_head_dim: int  # linear_key_head_dim
    value_head_dim: int  # linear_value_head_dim
    fused_projections: bool  # Qwen3-Next: in_proj_qkvz / in_proj_ba (head-grouped); Qwen3.5: in_proj_qkv/z/a/b


@dataclass(frozen=True)
class KDAArgs:
    """Kimi Delta Attention geometry (Kimi-Linear, GLM-5.3-Flash ``linear_attention`` layers; ``kda.py``)."""

    conv_kernel: int  # linear_conv_kernel_dim
    num_heads: int  # linear_num_heads
    head_dim: int  # linear_head_dim (keys and values)
    lower_bound: float | None  # GLM-5.3 linear_lower_bound: g = bound * sigmoid(exp(A_log) g); None = Kimi's
    a_log_4d: bool  # A_log stored [1, 1, heads, 1] (Kimi-Linear) instead of [heads]


class ConfigKeys(dict):
    """The text model's config keys with the family's defaults under them (null values dropped), plus the
    ``model_type`` and the file they came from (``where``) for error messages."""

    def __init__(self, model_type: str, values: dict[str, Any], where: str):
        super().__init__(values)
        self.model_type, self.where = model_type, where

    def need(self, key: str) -> Any:
        """The value of a key the family cannot do without."""
        if key not in self:
            raise RuntimeModelError(f"{self.where}: {self.model_type} config has no {key!r}")
        return self[key]


@dataclass(frozen=True)
class RoutingArgs:
    """How ``moe.SparseMoE`` routes and what it adds: ``router`` ``"softmax"`` (``moe.softmax_topk``, renormalised
    with ``norm_topk_prob``), ``"noaux_tc"`` (DeepSeek's group-limited sigmoid) or ``"topk_softmax"`` (gpt-oss);
    a shared expert of ``shared_expert_intermediate_size`` (0: none), sigmoid-gated with ``shared_expert_gated``."""

    router: str = "softmax"
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    shared_expert_intermediate_size: int = 0
    shared_expert_gated: bool = False  # Qwen2 / Qwen3-Next: sigmoid(x . shared_expert_gate) * shared(x)


@dataclass(frozen=True)
class AttentionArgs:
    """The options of ``attention.GQAAttention``: ``qk_norm`` ``None`` | ``"full"`` (OLMoE) | ``"head"``, a
    sliding window per layer (None: full attention), gpt-oss's sinks, OLMoE's ``clip_qkv``, the output gate of
    Qwen3-Next / Qwen3.5 (``q_proj`` is ``[query | gate]`` per head)."""

    sliding_windows: list[int | None]
    qk_norm: str | None = None
    sinks: bool = False
    clip_qkv: float | None = None
    output_gate: bool = False


@dataclass(frozen=True)
class MLAArgs:
    """Multi-head latent attention's dimensions (``attention.MLAAttention``; ``mla_args``)."""

    q_lora_rank: int | None  # None: a plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    latent_norm_eps: float = 1e-6  # q_a_layernorm / kv_a_layernorm (GLM-5.3: rms_norm_eps)


@dataclass(frozen=True)
class IndexerArgs:
    """A DSA lightning indexer (DeepSeek-V3.2, GLM-5, GLM-5.3's k-pool one, DeepSeek-V4's CSA one)."""

    topk: int
    head_dim: int
    n_heads: int
    full: list[bool] = field(default_factory=list)  # per layer: own indexer (True) or the previous one's (False)
    kpool: int = 0  # GLM-5.3: the indexer scores pools of this many keys (0: per key)
    kpool_tail: bool = False  # index_kpool_always_select_tail: the incomplete pool is always attended


@dataclass(frozen=True)
class HyperArgs:
    """Hyper-connections (``hyper.py``): ``mult`` residual streams."""

    mult: int
    eps: float
    sinkhorn_iters: int


@dataclass(kw_only=True)
class ModelArgs:
    """What every family has, in one normalised form; a family's own arguments are a subclass (``RuntimeFamily.args``)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    rms_norm_eps: float
    rope: RopeArgs
    moe_layers: list[bool]  # per layer: routed experts or a dense MLP
    routing: RoutingArgs = field(default_factory=RoutingArgs)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    zero_centred_norms: bool = False  # every RMSNorm but a gated one scales by (1 + weight)
    eos_token_ids: list[int] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelArgs:
        path = Path(model_dir) / CONFIG_FILE
        if not path.is_file():
            raise RuntimeModelError(f"{model_dir}: no config.json")
        return cls.from_config(load_json_object(path), where=str(path))  # the model folder's one JSON reader

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "config.json") -> ModelArgs:
        """Validate ``config`` (the config facts), parse the keys every family shares, then the family's own
        arguments (``RuntimeFamily.args``): an instance of the family's ``ModelArgs`` subclass."""
        facts = model_config.read_facts(config, where)
        mt = config.get("model_type")
        family = family_for(mt, where)
        text = model_config.canonical_keys(model_config.text_config(config), mt)
        c = ConfigKeys(mt, {**family.defaults[mt], **{k: v for k, v in text.items() if v is not None}}, where)
        base = _common_args(c, facts, config)
        args = family.args(c, base)
        n_layers, heads, kv_heads = args.num_hidden_layers, args.num_attention_heads, args.num_key_value_heads
        if len(args.moe_layers) != n_layers:
            raise RuntimeModelError(
                f"{where}: mlp_layer_types has {len(args.moe_layers)} entries for {n_layers} layers"
            )
        if heads % kv_heads:
            raise RuntimeModelError(f"{where}: {heads} attention heads do not split into {kv_heads} kv heads")
        return args


@dataclass(kw_only=True)
class GQAArgs(ModelArgs):
    """The arguments of a family built on ``attention.GQAAttention`` (OLMoE, Qwen2/3-MoE, Mixtral, GLM-4.5, ...)."""

    attention: AttentionArgs


def _common_args(c: ConfigKeys, facts: model_config.ConfigFacts, config: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelArgs`` fields every family reads alike (``rope`` is the family's: ``rope_args``)."""
    where = c.where
    hidden = int(c.need("hidden_size"))
    heads = int(c.need("num_attention_heads"))
    n_layers = int(c.need("num_hidden_layers"))
    kv_heads = int(c.get("num_key_value_heads") or heads)
    act = c.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise RuntimeModelError(f"{where}: hidden_act {act!r} is not supported (silu)")
    n_experts = facts.routed_experts or 0
    if n_experts <= 0:
        raise RuntimeModelError(f"{where}: no expert count (num_experts / num_local_experts / n_routed_experts)")
    return dict(
        model_type=c.model_type,
        vocab_size=int(c.need("vocab_size")),
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(c.get("head_dim") or hidden // heads),
        intermediate_size=int(c.get("intermediate_size", 0)),
        moe_intermediate_size=int(facts.expert_width or 0),
        num_experts=n_experts,
        num_experts_per_tok=int(c.need("num_experts_per_tok")),
        rms_norm_eps=float(c.need("rms_norm_eps")),
        moe_layers=[True] * n_layers,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
        eos_token_ids=_int_list(c.get("eos_token_id")),
        raw=dict(config),
    )


def _int_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def rope_args(c: ConfigKeys, dim: int, *, partial: bool = True, interleaved: bool = False) -> RopeArgs:
    """Standardise ``rope_parameters`` / ``rope_scaling`` + ``rope_theta`` + ``partial_rotary_factor`` for
    RoPE over ``dim`` dims per head (times ``partial_rotary_factor`` unless ``partial`` is false)."""
    where = c.where
    params = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    theta = float(params.get("rope_theta") or c.get("rope_theta") or 10000.0)
    factor_of_dims = params.get("partial_rotary_factor", c.get("partial_rotary_factor")) if partial else 1.0
    dim = int(dim * float(factor_of_dims if factor_of_dims is not None else 1.0))
    if dim % 2:
        raise RuntimeModelError(f"{where}: odd rotary dimension {dim}")
    if rope_type not in ("default", "yarn", "linear", "llama3"):
        raise RuntimeModelError(
            f"{where}: rope type {rope_type!r} is not supported (default, yarn, linear, llama3)"
        )
    factor = params.get("factor")
    orig = params.get("original_max_position_embeddings", c.get("original_max_position_embeddings"))
    if rope_type == "yarn":
        orig = int(orig or c.get("max_position_embeddings", 4096))
        if factor is None:
            factor = float(c.get("max_position_embeddings", 4096)) / orig
    return RopeArgs(
        rope_type=rope_type,
        theta=theta,
        dim=dim,
        interleaved=interleaved,
        factor=float(factor) if factor is not None else None,
        original_max_position_embeddings=int(orig) if orig is not None else None,
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
    )


def routing_args(c: ConfigKeys, **options: Any) -> RoutingArgs:
    """``RoutingArgs`` renormalising by the config's ``norm_topk_prob`` (default false) unless ``options`` say."""
    return RoutingArgs(**{"norm_topk_prob": bool(c.get("norm_topk_prob", False)), **options})


def attention_args(c: ConfigKeys, n_layers: int, **options: Any) -> AttentionArgs:
    """``AttentionArgs`` with no sliding window (unless ``options`` give ``sliding_windows``) and the config's
    ``clip_qkv``."""
    clip = float(c["clip_qkv"]) if c.get("clip_qkv") is not None else None
    return AttentionArgs(**{"sliding_windows": [None] * n_layers, "clip_qkv": clip, **options})


def mla_args(c: ConfigKeys, base: dict[str, Any], rope_dim: int | None = None) -> MLAArgs:
    """Multi-head latent attention's dimensions (DeepSeek-V3 and the families built on it): ``q_lora_rank``
    (None: no query LoRA), ``kv_lora_rank``, the nope / rope / value head dims (``rope_dim`` when the family
    fixes it, else ``qk_rope_head_dim``); the family's ``head_dim`` is nope + rope (``mla_head_dim``). MLA has a
    key / value head per query head: another ``num_key_value_heads`` is refused in one line."""
    if base["num_key_value_heads"] != base["num_attention_heads"]:
        raise RuntimeModelError(f"{c.where}: MLA needs num_key_value_heads == num_attention_heads")
    nope = int(c.need("qk_nope_head_dim"))
    rope = int(c.need("qk_rope_head_dim")) if rope_dim is None else rope_dim
    return MLAArgs(
        q_lora_rank=int(c["q_lora_rank"]) if c.get("q_lora_rank") else None,
        kv_lora_rank=int(c.need("kv_lora_rank")),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=int(c.need("v_head_dim")),
    )


def mla_head_dim(mla: MLAArgs) -> int:
    """The query / key head width of MLA: nope + rope."""
    return mla.qk_nope_head_dim + mla.qk_rope_head_dim


def noaux_tc_args(c: ConfigKeys, base: dict[str, Any]) -> tuple[list[bool], RoutingArgs]:
    """DeepSeek-V3-style routing (DeepSeek-V3, GLM-4.5, GLM-5): the MoE layers (dense ``first_k_dense_replace``
    layers, or ``mlp_layer_types``) and group-limited sigmoid routing (``noaux_tc``) with ``n_shared_experts``
    shared experts."""
    types = c.get("mlp_layer_types")
    if types:
        moe_layers = [t == "sparse" for t in types]
    else:
        k = int(c.get("first_k_dense_replace", 0))
        moe_layers = [i >= k for i in range(base["num_hidden_layers"])]
    n_group = int(c.get("n_group") or 1)
    if base["num_experts"] % n_group:
        raise RuntimeModelError(
            f"{c.where}: {base['num_experts']} experts do not split into n_group = {n_group}"
        )
    return moe_layers, routing_args(
        c,
        router="noaux_tc",
        routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
        n_group=n_group,
        topk_group=int(c.get("topk_group") or 1),
        shared_expert_intermediate_size=base["moe_intermediate_size"] * int(c.get("n_shared_experts") or 0),
    )


def mla_softmax_scale(mla: MLAArgs, rope: RopeArgs) -> float:
    """DeepSeek's attention scale: ``(nope+rope)^-0.5``, times ``mscale^2`` for a scaled RoPE with
    ``mscale_all_dim`` (transformers ``yarn_apply_mscale``)."""
    scale = mla_head_dim(mla) ** -0.5
    if rope.rope_type != "default" and rope.mscale_all_dim:
        factor = rope.factor or 1.0
        m = 0.1 * float(rope.mscale_all_dim) * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale = scale * m * m
    return scale
