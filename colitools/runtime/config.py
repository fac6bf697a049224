"""``ModelArgs``: one dataclass that absorbs the config spellings of every supported family.

transformers 5.x configs and hub checkpoints spell the same things differently (ARCHITECTURES.md, "Config
spellings"): ``rope_parameters`` vs top-level ``rope_theta`` + ``rope_scaling {type|rope_type}``, expert count as
``num_experts`` / ``num_local_experts`` / ``n_routed_experts``, ``head_dim`` missing or null. Everything is
normalised here once, so the model code reads plain attributes. Defaults for keys a config omits are the
transformers 5.24 class defaults of the family.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colitools.errors import RuntimeModelError

# Family defaults for keys a hub config.json may omit (transformers 5.24 configuration classes).
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "olmoe": {"rms_norm_eps": 1e-5, "norm_topk_prob": False},
    "qwen2_moe": {"rms_norm_eps": 1e-6, "norm_topk_prob": False, "decoder_sparse_step": 1},
    "qwen3_moe": {"rms_norm_eps": 1e-6, "norm_topk_prob": False, "decoder_sparse_step": 1},
    "mixtral": {"rms_norm_eps": 1e-5, "norm_topk_prob": True, "rope_theta": 1e6},
    "deepseek_v3": {
        "rms_norm_eps": 1e-6, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 8,
        "topk_group": 4, "first_k_dense_replace": 3, "n_shared_experts": 1,
    },
    "glm4_moe": {
        "rms_norm_eps": 1e-5, "norm_topk_prob": True, "routed_scaling_factor": 1.0, "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1, "partial_rotary_factor": 0.5,
    },
    "glm_moe_dsa": {
        "rms_norm_eps": 1e-5, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 3, "n_shared_experts": 1, "index_topk": 2048,
        "index_head_dim": 128, "index_n_heads": 32,
    },
}  # fmt: skip

SUPPORTED_FAMILIES = tuple(_FAMILY_DEFAULTS)
MLA_FAMILIES = ("deepseek_v3", "glm_moe_dsa")


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
    # layer schedule
    moe_layers: list[bool] = field(default_factory=list)  # per layer: routed experts or a dense MLP
    # routing
    router: str = "softmax"  # "softmax" | "noaux_tc"
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    shared_expert_intermediate_size: int = 0  # 0 = no shared expert
    shared_expert_gated: bool = False  # Qwen2: sigmoid(x . shared_expert_gate) * shared(x)
    # MLA (DeepSeek-V3 / GLM-5)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DSA indexer (GLM-5)
    index_topk: int = 0
    index_head_dim: int = 0
    index_n_heads: int = 0
    indexer_full: list[bool] = field(default_factory=list)  # per layer: own indexer (True) or shared (False)
    eos_token_ids: list[int] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_mla(self) -> bool:
        return self.model_type in MLA_FAMILIES

    @property
    def n_moe_layers(self) -> int:
        return sum(self.moe_layers)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelArgs:
        path = Path(model_dir) / "config.json"
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            raise RuntimeModelError(f"{model_dir}: no config.json") from None
        except (OSError, ValueError) as exc:
            raise RuntimeModelError(f"{path}: cannot read the model config ({exc})") from None
        if not isinstance(config, dict):
            raise RuntimeModelError(f"{path}: the model config is not a JSON object")
        return cls.from_config(config, where=str(path))

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "config.json") -> ModelArgs:
        mt = config.get("model_type")
        if mt not in _FAMILY_DEFAULTS:
            raise RuntimeModelError(
                f"{where}: model_type {mt!r} is not supported (supported: {', '.join(SUPPORTED_FAMILIES)})"
            )
        c = {**_FAMILY_DEFAULTS[mt], **{k: v for k, v in config.items() if v is not None}}

        def need(key: str) -> Any:
            if key not in c:
                raise RuntimeModelError(f"{where}: {mt} config has no {key!r}")
            return c[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        n_layers = int(need("num_hidden_layers"))
        kv_heads = int(c.get("num_key_value_heads") or heads)
        act = c.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise RuntimeModelError(f"{where}: hidden_act {act!r} is not supported (silu)")
        n_experts = int(c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts") or 0)
        if n_experts <= 0:
            raise RuntimeModelError(
                f"{where}: no expert count (num_experts / num_local_experts / n_routed_experts)"
            )
        mla = mt in MLA_FAMILIES
        head_dim = int(c.get("head_dim") or hidden // heads)
        inter = int(c.get("intermediate_size", 0))
        moe_inter = int(c.get("moe_intermediate_size") or inter)
        if mt in ("olmoe", "mixtral"):
            moe_inter = inter  # these families size experts with intermediate_size
        args = cls(
            model_type=mt,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=inter,
            moe_intermediate_size=moe_inter,
            num_experts=n_experts,
            num_experts_per_tok=int(need("num_experts_per_tok")),
            rms_norm_eps=float(need("rms_norm_eps")),
            rope=_rope_args(c, mt, hidden, heads, where),
            norm_topk_prob=bool(c.get("norm_topk_prob", False)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
            clip_qkv=float(c["clip_qkv"]) if c.get("clip_qkv") is not None else None,
            use_qk_norm=bool(c.get("use_qk_norm", False)),
            eos_token_ids=_int_list(c.get("eos_token_id")),
            raw=dict(config),
        )
        args.sliding_windows = _sliding_windows(c, mt, n_layers)
        if mt in ("olmoe", "mixtral"):
            args.moe_layers = [True] * n_layers
            args.norm_topk_prob = args.norm_topk_prob or mt == "mixtral"  # Mixtral always renormalises
        elif mt in ("qwen2_moe", "qwen3_moe"):
            step = int(c.get("decoder_sparse_step") or 1)
            only = set(c.get("mlp_only_layers") or [])
            args.moe_layers = [(i not in only) and (i + 1) % step == 0 for i in range(n_layers)]
            if mt == "qwen2_moe":
                args.shared_expert_intermediate_size = int(c.get("shared_expert_intermediate_size", 0))
                args.shared_expert_gated = True
        else:  # DeepSeek-V3 style: dense first_k_dense_replace layers, noaux_tc routing, shared experts
            types = c.get("mlp_layer_types")
            if types:
                args.moe_layers = [t == "sparse" for t in types]
            else:
                k = int(c.get("first_k_dense_replace", 0))
                args.moe_layers = [i >= k for i in range(n_layers)]
            args.router = "noaux_tc"
            args.routed_scaling_factor = float(c.get("routed_scaling_factor", 1.0))
            args.n_group = int(c.get("n_group") or 1)
            args.topk_group = int(c.get("topk_group") or 1)
            args.shared_expert_intermediate_size = moe_inter * int(c.get("n_shared_experts") or 0)
            if n_experts % args.n_group:
                raise RuntimeModelError(
                    f"{where}: {n_experts} experts do not split into n_group = {args.n_group}"
                )
        if len(args.moe_layers) != n_layers:
            raise RuntimeModelError(
                f"{where}: mlp_layer_types has {len(args.moe_layers)} entries for {n_layers} layers"
            )
        if mla:
            args.q_lora_rank = int(c["q_lora_rank"]) if c.get("q_lora_rank") else None
            args.kv_lora_rank = int(need("kv_lora_rank"))
            args.qk_nope_head_dim = int(need("qk_nope_head_dim"))
            args.qk_rope_head_dim = int(need("qk_rope_head_dim"))
            args.v_head_dim = int(need("v_head_dim"))
            args.head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim
            if kv_heads != heads:
                raise RuntimeModelError(f"{where}: MLA needs num_key_value_heads == num_attention_heads")
        if mt == "glm_moe_dsa":
            if args.q_lora_rank is None:
                raise RuntimeModelError(f"{where}: glm_moe_dsa needs q_lora_rank")
            args.index_topk = int(need("index_topk"))
            args.index_head_dim = int(need("index_head_dim"))
            args.index_n_heads = int(need("index_n_heads"))
            args.indexer_full = _indexer_types(c, n_layers, where)
        if heads % kv_heads:
            raise RuntimeModelError(f"{where}: {heads} attention heads do not split into {kv_heads} kv heads")
        return args


def _int_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def _rope_args(c: dict[str, Any], mt: str, hidden: int, heads: int, where: str) -> RopeArgs:
    """Standardise ``rope_parameters`` / ``rope_scaling`` + ``rope_theta`` + ``partial_rotary_factor``."""
    params = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    theta = float(
        params.get("rope_theta") or c.get("rope_theta") or _FAMILY_DEFAULTS[mt].get("rope_theta", 10000.0)
    )
    partial = params.get("partial_rotary_factor", c.get("partial_rotary_factor"))
    if mt in MLA_FAMILIES:
        dim = int(
            c["qk_rope_head_dim"]
        )  # RoPE acts on the rope slice only (config.head_dim := qk_rope_head_dim)
        partial = 1.0
    else:
        dim = int(c.get("head_dim") or hidden // heads)
    dim = int(dim * float(partial if partial is not None else 1.0))
    if dim % 2:
        raise RuntimeModelError(f"{where}: odd rotary dimension {dim}")
    interleaved = mt == "glm_moe_dsa" or (mt == "deepseek_v3" and bool(c.get("rope_interleave", True)))
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


def _sliding_windows(c: dict[str, Any], mt: str, n_layers: int) -> list[int | None]:
    window = c.get("sliding_window")
    if mt == "mixtral":
        return [int(window) if window else None] * n_layers
    if mt == "qwen3_moe":
        on = bool(c.get("use_sliding_window")) and window
        return [int(window) if on else None] * n_layers
    if mt == "qwen2_moe" and c.get("use_sliding_window") and window:
        types = c.get("layer_types") or [
            "sliding_attention"
            if (i + 1) % 2 and i < int(c.get("max_window_layers", 28))
            else "full_attention"
            for i in range(n_layers)
        ]
        return [int(window) if t == "sliding_attention" else None for t in types]
    return [None] * n_layers


def _indexer_types(c: dict[str, Any], n_layers: int, where: str) -> list[bool]:
    types = c.get("indexer_types")
    if types is None:
        pattern = c.get("index_topk_pattern")
        if pattern is not None:
            types = (
                [{"F": "full", "S": "shared"}[ch] for ch in pattern] if isinstance(pattern, str) else pattern
            )
        else:
            freq = max(int(c.get("index_topk_freq", 1)), 1)
            offset = int(c.get("index_skip_topk_offset", 2))
            types = ["full" if (max(i - offset + 1, 0) % freq) == 0 else "shared" for i in range(n_layers)]
    if len(types) != n_layers or any(t not in ("full", "shared") for t in types) or types[0] != "full":
        raise RuntimeModelError(f"{where}: bad indexer_types {types!r}")
    return [t == "full" for t in types]
