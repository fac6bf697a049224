"""``ModelArgs``: the model geometry and options the runtime needs, parsed from ``config.json``.

transformers 5.x configs and hub checkpoints spell the same things differently: ``rope_parameters`` vs
top-level ``rope_theta`` + ``rope_scaling {type|rope_type}``, ``head_dim`` missing or null. The keys every family shares are parsed here, once, through the config facts
(``formats/model_config.py``: validation, text model, expert count and width); what only one family has (its
defaults, layer schedule, routing, MLA, sliding windows, RoPE layout) is parsed by ``family_args`` in the
family's own file, found through ``FAMILY_MODULES``. Defaults for keys a config omits are the transformers 5.24
class defaults of the family (``DEFAULTS`` in each family file).
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from colitools.errors import RuntimeModelError
from colitools.formats import model_config

# The families the runtime executes: model_type -> its module in colitools.runtime. A family module defines
# ``DEFAULTS`` (model_type -> defaults for omitted keys), ``family_args(c, base)`` (its ModelArgs fields
# beyond the common ones) and ``build_layer(ctx, layer)`` (its decoder layer).
FAMILY_MODULES: dict[str, str] = {
    "olmoe": "olmoe",
    "qwen2_moe": "qwen_moe",
    "qwen3_moe": "qwen_moe",
    "mixtral": "mixtral",
    "deepseek_v3": "deepseek_v3",
    "glm4_moe": "glm4_moe",
    "glm_moe_dsa": "deepseek_v3",
    "kimi_k25": "deepseek_v3",
    "deepseek_v32": "deepseek_v3",
    "qwen3_next": "qwen3_next",
    "qwen3_5_moe": "qwen3_next",
    "qwen3_5_moe_text": "qwen3_next",
    "gpt_oss": "gpt_oss",
    "deepseek_v4": "deepseek_v4",
    "kimi_linear": "kimi_linear",
    "glm5_next": "glm5_next",
    "glm5_next_text": "glm5_next",
    "inkling_mm_model": "inkling",
    "inkling_text": "inkling",
    "inkling2": "inkling2",
    "inkling2_text": "inkling2",
}


def family_module(model_type: str | None, where: str = "config.json") -> ModuleType:
    """The runtime module of a family (``FAMILY_MODULES``); RuntimeModelError for an unsupported type."""
    if model_type not in FAMILY_MODULES:
        raise RuntimeModelError(
            f"{where}: model_type {model_type!r} is not supported (supported: {', '.join(FAMILY_MODULES)})"
        )
    return importlib.import_module(f"colitools.runtime.{FAMILY_MODULES[model_type]}")


@dataclass(frozen=True)
class RopeArgs:
    """Rotary embedding parameters (``rope_parameters`` after standardisation)."""

    rope_type: str = "default"  # "default" | "yarn" | "linear"
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


@dataclass
class ModelArgs:
    """The model geometry and options the runtime needs, in one normalised form."""

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
    norm_topk_prob: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    # attention options
    clip_qkv: float | None = None
    use_qk_norm: bool = False
    sliding_windows: list[int | None] = field(default_factory=list)  # per layer, None = full attention
    attention_sinks: bool = False  # gpt-oss: a learned per-head logit ``self_attn.sinks`` in every softmax
    # layer schedule
    moe_layers: list[bool] = field(default_factory=list)  # per layer: routed experts or a dense MLP
    # routing
    router: str = "softmax"  # "softmax" | "noaux_tc" | "topk_softmax" (gpt-oss: softmax over the top-k logits)
    # | "sqrtsoftplus" (DeepSeek-V4: hash or biased top-k, routed by deepseek_v4.V4MoE)
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    shared_expert_intermediate_size: int = 0  # 0 = no shared expert
    shared_expert_gated: bool = False  # Qwen2: sigmoid(x . shared_expert_gate) * shared(x)
    # routed experts: down(silu(gate) * up), or gpt-oss's clamped SwiGLU with biases when swiglu_limit is set
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    # MLA (DeepSeek-V3 / GLM-5)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mla_latent_norm_eps: float = 1e-6  # q_a_layernorm / kv_a_layernorm (GLM-5.3: rms_norm_eps)
    # DSA indexer (GLM-5)
    index_topk: int = 0
    index_head_dim: int = 0
    index_n_heads: int = 0
    indexer_full: list[bool] = field(default_factory=list)  # per layer: own indexer (True) or shared (False)
    index_kpool: int = 0  # GLM-5.3: the indexer scores pools of this many keys (0: per key, DSAIndexer)
    index_kpool_tail: bool = False  # index_kpool_always_select_tail: the incomplete pool is always attended
    # hyper-connections (GLM-5.3; hyper.py): hc_mult residual streams, 0 = one plain residual
    hc_mult: int = 0
    hc_eps: float = 1e-6
    hc_sinkhorn_iters: int = 20
    # hybrid linear attention (Qwen3-Next / Qwen3.5-MoE)
    layer_types: list[str] = field(default_factory=list)  # per layer "linear_attention" | "full_attention"
    linear_attention: LinearAttentionArgs | None = None
    kda: KDAArgs | None = None  # Kimi Delta Attention (layer_types "linear_attention" of Kimi-Linear, GLM-5.3)
    attn_output_gate: bool = False  # q_proj is [query | gate] per head; output * sigmoid(gate) before o_proj
    zero_centred_norms: bool = False  # every RMSNorm but the gated one scales by (1 + weight)
    eos_token_ids: list[int] = field(default_factory=list)
    inkling: Any = None  # inkling.InklingArgs / inkling2.Inkling2Args
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelArgs:
        path = Path(model_dir) / "config.json"
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            raise RuntimeModelError(f"{model_dir}: no config.json") from None
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            raise RuntimeModelError(f"{path}: cannot read the model config ({exc})") from None
        if not isinstance(config, dict):
            raise RuntimeModelError(f"{path}: the model config is not a JSON object")
        return cls.from_config(config, where=str(path))

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "config.json") -> ModelArgs:
        """Validate ``config`` (the config facts), parse the keys every family shares, then the family's own
        (``family_args`` of its module)."""
        facts = model_config.read_facts(config, where)
        mt = config.get("model_type")
        family = family_module(mt, where)
        text = model_config.canonical_keys(model_config.text_config(config), mt)
        c = ConfigKeys(mt, {**family.DEFAULTS[mt], **{k: v for k, v in text.items() if v is not None}}, where)

        hidden = int(c.need("hidden_size"))
        heads = int(c.need("num_attention_heads"))
        n_layers = int(c.need("num_hidden_layers"))
        kv_heads = int(c.get("num_key_value_heads") or heads)
        act = c.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise RuntimeModelError(f"{where}: hidden_act {act!r} is not supported (silu)")
        n_experts = facts.routed_experts or 0
        if n_experts <= 0:
            raise RuntimeModelError(
                f"{where}: no expert count (num_experts / num_local_experts / n_routed_experts)"
            )
        inter = int(c.get("intermediate_size", 0))
        base: dict[str, Any] = dict(
            model_type=mt,
            vocab_size=int(c.need("vocab_size")),
            hidden_size=hidden,
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(c.get("head_dim") or hidden // heads),
            intermediate_size=inter,
            moe_intermediate_size=int(facts.expert_width or 0),
            num_experts=n_experts,
            num_experts_per_tok=int(c.need("num_experts_per_tok")),
            rms_norm_eps=float(c.need("rms_norm_eps")),
            norm_topk_prob=bool(c.get("norm_topk_prob", False)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
            clip_qkv=float(c["clip_qkv"]) if c.get("clip_qkv") is not None else None,
            use_qk_norm=bool(c.get("use_qk_norm", False)),
            sliding_windows=[None] * n_layers,
            eos_token_ids=_int_list(c.get("eos_token_id")),
            raw=dict(config),
        )
        fields = {**base, **family.family_args(c, base)}
        if "rope" not in fields:  # the families' default: half-layout RoPE over head_dim x partial factor
            fields["rope"] = rope_args(c, base["head_dim"])
        args = cls(**fields)
        if len(args.moe_layers) != n_layers:
            raise RuntimeModelError(
                f"{where}: mlp_layer_types has {len(args.moe_layers)} entries for {n_layers} layers"
            )
        if heads % kv_heads:
            raise RuntimeModelError(f"{where}: {heads} attention heads do not split into {kv_heads} kv heads")
        return args


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
    if rope_type not in ("default", "yarn", "linear"):
        raise RuntimeModelError(f"{where}: rope type {rope_type!r} is not supported (default, yarn, linear)")
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
    )


def mla_args(c: ConfigKeys, base: dict[str, Any], rope_dim: int | None = None) -> dict[str, Any]:
    """Multi-head latent attention's dimensions (DeepSeek-V3 and the families built on it): ``q_lora_rank``
    (None: no query LoRA), ``kv_lora_rank``, the nope / rope / value head dims (``rope_dim`` when the family
    fixes it, else ``qk_rope_head_dim``) and ``head_dim`` = nope + rope. MLA has a key / value head per query
    head: another ``num_key_value_heads`` is refused in one line."""
    if base["num_key_value_heads"] != base["num_attention_heads"]:
        raise RuntimeModelError(f"{c.where}: MLA needs num_key_value_heads == num_attention_heads")
    nope = int(c.need("qk_nope_head_dim"))
    rope = int(c.need("qk_rope_head_dim")) if rope_dim is None else rope_dim
    return dict(
        q_lora_rank=int(c["q_lora_rank"]) if c.get("q_lora_rank") else None,
        kv_lora_rank=int(c.need("kv_lora_rank")),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=int(c.need("v_head_dim")),
        head_dim=nope + rope,
    )


def noaux_tc_args(c: ConfigKeys, base: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3-style routing (DeepSeek-V3, GLM-4.5, GLM-5): dense ``first_k_dense_replace`` layers (or
    ``mlp_layer_types``), group-limited sigmoid routing (``noaux_tc``), ``n_shared_experts`` shared experts."""
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
    return dict(
        moe_layers=moe_layers,
        router="noaux_tc",
        routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
        n_group=n_group,
        topk_group=int(c.get("topk_group") or 1),
        shared_expert_intermediate_size=base["moe_intermediate_size"] * int(c.get("n_shared_experts") or 0),
    )


def mla_softmax_scale(args: ModelArgs) -> float:
    """DeepSeek's attention scale: ``(nope+rope)^-0.5``, times ``mscale^2`` for a scaled RoPE with
    ``mscale_all_dim`` (transformers ``yarn_apply_mscale``)."""
    scale = (args.qk_nope_head_dim + args.qk_rope_head_dim) ** -0.5
    r = args.rope
    if r.rope_type != "default" and r.mscale_all_dim:
        factor = r.factor or 1.0
        m = 0.1 * float(r.mscale_all_dim) * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale = scale * m * m
    return scale
