"""Config facts: what ``config.json`` says about a model, read and validated in one place.

Converters, the runtime, the mirror and the container checks all read the model's geometry through this module,
so every command agrees on one precedence and refuses the same malformed configs with the same line::

    config.json: num_hidden_layers is 'two' (expected an integer >= 1)

Precedence (documented in docs/INTERNALS.md, "Config facts"):

* **Text model.** Multimodal configs keep the language model's keys under ``text_config``; it is used when the
  top level has no ``hidden_size`` (``text_config``). ``model_type`` is the top level's (the checkpoint's type,
  e.g. ``kimi_k25``), else the text model's.
* **Routed expert count** (``routed_expert_count``, the one reader): ``n_routed_experts``, then
  ``num_local_experts``, then ``num_experts``; null counts as absent. Two of them with different values are
  refused (the config is ambiguous). ``0`` means no routed experts (a dense model).
* **Expert width** (``expert_width``): ``moe_intermediate_size``, else ``intermediate_size`` (OLMoE and Mixtral
  configs only have the latter).
* **Layers**: ``num_hidden_layers`` is the base decoder; MTP layers (``num_nextn_predict_layers``, else
  ``mtp_num_hidden_layers``) come after it (layer indices ``>= num_hidden_layers``).
* **Quantization**: ``quantization_config`` at the top level, else the text model's; the FP8 block is its
  ``weight_block_size`` (two positive ints).

``validate_config`` checks the type and range of every key colitools reads (integers are JSON integers, never
booleans or floats; floats are finite; booleans are ``true``/``false``), plus ``num_experts_per_tok`` against the
expert count. Every error is a ``ConfigError`` naming ``where``, the key and the value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from colitools.formats.errors import ConfigError

__all__ = [
    "EXPERT_COUNT_KEYS",
    "MTP_LAYER_KEYS",
    "NATIVE_GEOMETRY",
    "OUTPUT_GATED_ATTENTION",
    "RUNNABLE_MODEL_TYPES",
    "KEY_ALIASES",
    "ConfigFacts",
    "canonical_keys",
    "layer_linear_shapes",
    "expert_width",
    "experts_per_token",
    "fp8_block_size",
    "hidden_size",
    "linear_shapes",
    "model_type",
    "mtp_layer_count",
    "num_hidden_layers",
    "quantization_config",
    "read_facts",
    "routed_expert_count",
    "text_config",
    "validate_config",
    "vocab_size",
]

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")  # in precedence order
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")  # in precedence order

# The model types ``colitools run`` executes: the keys of the runtime's family registry
# (``colitools.runtime.config.FAMILY_MODULES``; a test keeps the two equal). Here so that ``convert`` can warn
# about a checkpoint the runtime will not run without importing the runtime.
RUNNABLE_MODEL_TYPES = (
    "olmoe", "qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "glm4_moe", "glm_moe_dsa",
    "kimi_k25", "deepseek_v32", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text", "gpt_oss",
    "deepseek_v4", "kimi_linear", "glm5_next", "glm5_next_text",
    "inkling_mm_model", "inkling_text", "inkling2", "inkling2_text",
)  # fmt: skip

# Config spellings of one family for keys every other family spells the common way (transformers'
# ``attribute_map``, e.g. ``KimiLinearConfig``): model_type -> {its spelling: the common key}.
KEY_ALIASES: dict[str, dict[str, str]] = {
    "kimi_linear": {
        "num_experts_per_token": "num_experts_per_tok", "moe_renormalize": "norm_topk_prob",
        "num_expert_group": "n_group", "num_shared_experts": "n_shared_experts",
        "model_max_length": "max_position_embeddings",
    },
}  # fmt: skip
NESTED_KEY_ALIASES: dict[str, dict[str, dict[str, str]]] = {
    "kimi_linear": {
        "linear_attn_config": {
            "head_dim": "linear_head_dim", "num_heads": "linear_num_heads",
            "short_conv_kernel_size": "linear_conv_kernel_dim",
        },
    },
}  # fmt: skip

# Runnable families whose weights keep their native names and shapes (Inkling: ``attn.wq_du``, a router with
# extra rows for the shared experts, per-expert shared stacks): ``linear_shapes`` claims nothing for them.
NATIVE_GEOMETRY = frozenset({"inkling_mm_model", "inkling_text", "inkling2", "inkling2_text"})

# Families whose full-attention ``q_proj`` holds ``[query | gate]`` per head (twice as wide; the attention output
# is multiplied by ``sigmoid(gate)``): Qwen3-Next, Qwen3.5/3.6-MoE.
OUTPUT_GATED_ATTENTION = frozenset({"qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"})

_MAX_INT = 2**31 - 1  # no dimension or count of a real model comes near; bigger is a corrupt config
_MAX_LAYERS = 1 << 16
_MAX_EXPERTS = 1 << 20

# key -> (kind, minimum, maximum); kinds: int, float (finite, ints accepted), bool, str, ints, strs, map, eos
_TEXT_KEYS: dict[str, tuple[str, float | None, float | None]] = {
    "hidden_size": ("int", 1, _MAX_INT),
    "vocab_size": ("int", 1, _MAX_INT),
    "num_hidden_layers": ("int", 1, _MAX_LAYERS),
    "num_attention_heads": ("int", 1, _MAX_INT),
    "num_key_value_heads": ("int", 1, _MAX_INT),
    "head_dim": ("int", 0, _MAX_INT),  # 0: GLM-5.3-Flash (glm5_next, MLA without RoPE)
    "intermediate_size": ("int", 0, _MAX_INT),
    "moe_intermediate_size": ("int", 1, _MAX_INT),
    "routed_expert_hidden_size": ("int", 1, _MAX_INT),  # Kimi K3 LatentMoE: the routed experts' width
    "shared_expert_intermediate_size": ("int", 0, _MAX_INT),
    "n_routed_experts": ("int", 0, _MAX_EXPERTS),
    "num_local_experts": ("int", 0, _MAX_EXPERTS),
    "num_experts": ("int", 0, _MAX_EXPERTS),
    "num_experts_per_tok": ("int", 1, _MAX_EXPERTS),
    "n_shared_experts": ("int", 0, _MAX_EXPERTS),
    "n_group": ("int", 1, _MAX_EXPERTS),
    "topk_group": ("int", 1, _MAX_EXPERTS),
    "first_k_dense_replace": ("int", 0, _MAX_LAYERS),
    "decoder_sparse_step": ("int", 1, _MAX_LAYERS),
    "num_nextn_predict_layers": ("int", 0, _MAX_LAYERS),
    "mtp_num_hidden_layers": ("int", 0, _MAX_LAYERS),
    "max_position_embeddings": ("int", 1, 2**62),
    "original_max_position_embeddings": ("int", 1, 2**62),
    "max_window_layers": ("int", 0, _MAX_INT),
    "sliding_window": ("int", 0, 2**62),
    "q_lora_rank": ("int", 0, _MAX_INT),
    "kv_lora_rank": ("int", 1, _MAX_INT),
    "qk_nope_head_dim": ("int", 0, _MAX_INT),
    "qk_rope_head_dim": ("int", 0, _MAX_INT),
    "v_head_dim": ("int", 1, _MAX_INT),
    "index_topk": ("int", 1, 2**62),
    "index_head_dim": ("int", 1, _MAX_INT),
    "index_n_heads": ("int", 1, _MAX_INT),
    "index_topk_freq": ("int", 0, _MAX_LAYERS),
    "index_skip_topk_offset": ("int", 0, _MAX_LAYERS),
    "linear_conv_kernel_dim": ("int", 1, _MAX_INT),  # Gated DeltaNet (Qwen3-Next, Qwen3.5-MoE)
    "linear_key_head_dim": ("int", 1, _MAX_INT),
    "linear_value_head_dim": ("int", 1, _MAX_INT),
    "linear_num_key_heads": ("int", 1, _MAX_INT),
    "linear_num_value_heads": ("int", 1, _MAX_INT),
    "full_attention_interval": ("int", 1, _MAX_LAYERS),
    "rms_norm_eps": ("float", 0, None),
    "rope_theta": ("float", 0, None),
    "partial_rotary_factor": ("float", 0, 1),
    "routed_scaling_factor": ("float", None, None),
    "clip_qkv": ("float", 0, None),
    "swiglu_limit": ("float", 0, None),
    "swiglu_alpha": ("float", None, None),
    "norm_topk_prob": ("bool", None, None),
    "tie_word_embeddings": ("bool", None, None),
    "use_qk_norm": ("bool", None, None),
    "use_sliding_window": ("bool", None, None),
    "rope_interleave": ("bool", None, None),
    "model_type": ("str", None, None),
    "hidden_act": ("str", None, None),
    "eos_token_id": ("eos", None, None),
    "mlp_only_layers": ("ints", 0, _MAX_LAYERS),
    "mlp_layer_types": ("strs", None, None),
    "layer_types": ("strs", None, None),
    "indexer_types": ("strs", None, None),
    "rope_parameters": ("map", None, None),
    "rope_scaling": ("map", None, None),
}  # fmt: skip

_ROPE_KEYS: dict[str, tuple[str, float | None, float | None]] = {
    "rope_type": ("str", None, None),
    "type": ("str", None, None),
    "rope_theta": ("float", 0, None),
    "partial_rotary_factor": ("float", 0, 1),
    "factor": ("float", 0, None),
    "original_max_position_embeddings": ("int", 1, 2**62),
    "beta_fast": ("float", None, None),
    "beta_slow": ("float", None, None),
    "mscale": ("float", None, None),
    "mscale_all_dim": ("float", None, None),
    "attention_factor": ("float", None, None),
    "truncate": ("bool", None, None),
}


# ------------------------------------------------------------------------------------------------ access
def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's keys: ``config["text_config"]`` when the top level has no ``hidden_size``."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" not in config:
        return text
    return config


def canonical_keys(text: Mapping[str, Any], model_type: str | None) -> dict[str, Any]:
    """The text model's keys with the family's own spellings (:data:`KEY_ALIASES`) read as the common ones (a
    key already spelled the common way wins). Kimi-Linear hub configs nest the KDA geometry in
    ``linear_attn_config`` (``head_dim``, ``num_heads``, ``short_conv_kernel_size``, 1-based ``kda_layers`` /
    ``full_attn_layers``): read as ``linear_head_dim``, ``linear_num_heads``, ``linear_conv_kernel_dim`` and
    ``layer_types`` (:data:`NESTED_KEY_ALIASES`; as ``KimiLinearConfig``: the nested geometry wins over
    top-level keys, an explicit ``layer_types`` over the nested layer lists)."""
    out = dict(text)
    for alias, key in KEY_ALIASES.get(model_type or "", {}).items():
        if alias in text and key not in text:
            out[key] = text[alias]
    for section, aliases in NESTED_KEY_ALIASES.get(model_type or "", {}).items():
        nested = text.get(section)
        if not isinstance(nested, Mapping):
            continue
        for alias, key in aliases.items():
            if alias in nested:  # transformers: the nested value wins over the top-level key
                out[key] = nested[alias]
        full, kda = nested.get("full_attn_layers"), nested.get("kda_layers")
        n = text.get("num_hidden_layers")
        if out.get("layer_types") is None and isinstance(full, list) and isinstance(kda, list) and _is_int(n):
            types: list[Any] = [None] * n
            for numbers, kind in ((full, "full_attention"), (kda, "linear_attention")):
                for i in numbers:
                    if not (_is_int(i) and 1 <= i <= n):
                        raise ConfigError(f"{section}: layer {i!r} is not one of 1..{n}")
                    types[i - 1] = kind
            out["layer_types"] = types
    return out


def model_type(config: Mapping[str, Any]) -> str | None:
    """The top level's ``model_type`` (the checkpoint's type), else the text model's; None when neither."""
    for scope in (config, text_config(config)):
        value = scope.get("model_type")
        if isinstance(value, str):
            return value
    return None


def _int_of(scope: Mapping[str, Any], key: str, where: str, prefix: str = "") -> int | None:
    value = scope.get(key)
    if value is None:
        return None
    kind, lo, hi = _TEXT_KEYS[key]
    _check(f"{prefix}{key}", value, kind, lo, hi, where)
    return value


def hidden_size(config: Mapping[str, Any], where: str = "config.json") -> int | None:
    """``hidden_size`` of the text model."""
    text, prefix = _text(config)
    return _int_of(text, "hidden_size", where, prefix)


def vocab_size(config: Mapping[str, Any], where: str = "config.json") -> int | None:
    """``vocab_size`` of the text model."""
    text, prefix = _text(config)
    return _int_of(text, "vocab_size", where, prefix)


def num_hidden_layers(config: Mapping[str, Any], where: str = "config.json") -> int | None:
    """Layers of the base decoder (``num_hidden_layers``); MTP layers are not included."""
    text, prefix = _text(config)
    return _int_of(text, "num_hidden_layers", where, prefix)


def mtp_layer_count(config: Mapping[str, Any], where: str = "config.json") -> int:
    """Multi-token-prediction layers after the base decoder (``num_nextn_predict_layers``, else
    ``mtp_num_hidden_layers``); 0 when the config names none."""
    text, prefix = _text(config)
    for key in MTP_LAYER_KEYS:
        n = _int_of(text, key, where, prefix)
        if n is not None:
            return n
    return 0


def routed_expert_count(config: Mapping[str, Any], where: str = "config.json") -> int | None:
    """The number of routed experts per MoE layer: ``n_routed_experts``, then ``num_local_experts``, then
    ``num_experts`` (null = absent); None when the config names none, 0 for "no routed experts".

    This is the one reader of the expert count: converters, runtime, mirror and container checks call it."""
    text, prefix = _text(config)
    found: dict[str, int] = {}
    for key in EXPERT_COUNT_KEYS:
        n = _int_of(text, key, where, prefix)
        if n is not None:
            found[key] = n
    if len(set(found.values())) > 1:
        shown = ", ".join(f"{prefix}{k} = {v}" for k, v in found.items())
        raise ConfigError(f"{where}: conflicting expert counts ({shown})")
    return next(iter(found.values()), None)


def experts_per_token(config: Mapping[str, Any], where: str = "config.json") -> int | None:
    """``num_experts_per_tok`` of the text model (validated against the expert count by ``validate_config``)."""
    text, prefix = _text(config)
    return _int_of(text, "num_experts_per_tok", where, prefix)


def expert_width(config: Mapping[str, Any], where: str = "config.json") -> int | None:
    """The routed experts' intermediate size: ``moe_intermediate_size``, else ``intermediate_size``."""
    text, prefix = _text(config)
    width = _int_of(text, "moe_intermediate_size", where, prefix)
    return width if width is not None else _int_of(text, "intermediate_size", where, prefix)


def expert_hidden(config: Mapping[str, Any], where: str = "config.json") -> int | None:
    """The routed experts' input (and output) width: ``routed_expert_hidden_size`` (Kimi K3's LatentMoE, whose
    experts run in a latent the shared ``routed_expert_down_proj`` / ``routed_expert_up_proj`` map to and from),
    else ``hidden_size``."""
    text, prefix = _text(config)
    latent = _int_of(text, "routed_expert_hidden_size", where, prefix)
    return latent if latent is not None else _int_of(text, "hidden_size", where, prefix)


def quantization_config(config: Mapping[str, Any], where: str = "config.json") -> Mapping[str, Any] | None:
    """``quantization_config`` of the top level, else of the text model; None when absent, null or empty."""
    for scope, prefix in ((config, ""), _text(config)):
        qc = scope.get("quantization_config")
        if not qc:  # absent, null, {} (and, as before, any other empty value)
            continue
        if not isinstance(qc, Mapping):
            raise ConfigError(
                f"{where}: {prefix}quantization_config is a {type(qc).__name__}, expected an object"
            )
        return qc
    return None


def fp8_block_size(config: Mapping[str, Any], where: str = "config.json") -> tuple[int, int] | None:
    """``quantization_config.weight_block_size`` as ``(rows, cols)``; None when the config declares none."""
    qc = quantization_config(config, where)
    if qc is None or qc.get("weight_block_size") is None:
        return None
    block = qc["weight_block_size"]
    if (
        not isinstance(block, list | tuple)
        or len(block) != 2
        or not all(_is_int(b) and 0 < b <= _MAX_INT for b in block)
    ):
        raise ConfigError(
            f"{where}: quantization_config.weight_block_size {block!r} is not two positive ints"
        )
    return (int(block[0]), int(block[1]))


# -------------------------------------------------------------------------------------------- validation
def validate_config(config: Any, where: str = "config.json") -> None:
    """Check the type and range of every key colitools reads; ConfigError naming ``where``, key and value."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: the model config is not a JSON object")
    text = config.get("text_config")
    if text is not None and not isinstance(text, Mapping):
        raise ConfigError(f"{where}: text_config is {_show(text)} (expected an object)")
    if "model_type" in config:
        _check("model_type", config["model_type"], "str", None, None, where)
    scope, prefix = _text(config)
    for key, (kind, lo, hi) in _TEXT_KEYS.items():
        value = scope.get(key)
        if value is not None:
            _check(f"{prefix}{key}", value, kind, lo, hi, where)
    for rope_key in ("rope_parameters", "rope_scaling"):
        params = scope.get(rope_key)
        if params:
            for key, (kind, lo, hi) in _ROPE_KEYS.items():
                if params.get(key) is not None:
                    _check(f"{prefix}{rope_key}.{key}", params[key], kind, lo, hi, where)
    fp8_block_size(config, where)
    n_experts = routed_expert_count(config, where)
    per_token = experts_per_token(config, where)
    if per_token is not None and n_experts and per_token > n_experts:
        raise ConfigError(
            f"{where}: {prefix}num_experts_per_tok is {per_token}, more than the {n_experts} routed experts"
        )


@dataclass(frozen=True)
class ConfigFacts:
    """The facts of one validated ``config.json`` (None where the config does not say)."""

    model_type: str | None
    hidden_size: int | None
    vocab_size: int | None
    num_hidden_layers: int | None
    mtp_layers: int
    routed_experts: int | None
    experts_per_token: int | None
    expert_width: int | None
    fp8_block: tuple[int, int] | None
    expert_hidden: int | None = None  # the routed experts' input width (``expert_hidden``)

    @property
    def total_layers(self) -> int | None:
        """Base decoder layers plus MTP layers."""
        return None if self.num_hidden_layers is None else self.num_hidden_layers + self.mtp_layers


def read_facts(config: Any, where: str = "config.json") -> ConfigFacts:
    """Validate ``config`` (``validate_config``) and return its facts."""
    validate_config(config, where)
    return ConfigFacts(
        model_type=model_type(config),
        hidden_size=hidden_size(config, where),
        vocab_size=vocab_size(config, where),
        num_hidden_layers=num_hidden_layers(config, where),
        mtp_layers=mtp_layer_count(config, where),
        routed_experts=routed_expert_count(config, where),
        experts_per_token=experts_per_token(config, where),
        expert_width=expert_width(config, where),
        fp8_block=fp8_block_size(config, where),
        expert_hidden=expert_hidden(config, where),
    )


# -------------------------------------------------------------------------------------- linear geometry
def linear_shapes(config: Any, where: str = "config.json") -> dict[tuple[str, str], tuple[int, int]]:
    """The ``[O, I]`` of every per-layer linear weight the config determines, keyed by ``(module, leaf)`` in the
    runtime's canonical spelling (``("self_attn", "q_proj")``, ``("mlp", "gate_proj")``, ``("mlp", "gate")`` for
    the router, ``("mlp.shared_experts", "down_proj")``); what colibri's engines compute from ``config.json``
    for a container without logical shapes (issue 10). Only what the config gives: a dimension it does not
    give leaves the role out. Routed experts, embeddings and the head are ``read_facts``' expert width and
    sizes (``formats/container.py`` ``config_shapes``). Only for the model types whose geometry is known here
    (``RUNNABLE_MODEL_TYPES``); any other type gets ``{}``.

    * attention, MLA (``kv_lora_rank`` set: DeepSeek-V3, GLM-4.7/5 style): ``q_a_proj [q_lora_rank, H]``,
      ``q_b_proj [heads*(qk_nope+qk_rope), q_lora_rank]`` (or ``q_proj [heads*(qk_nope+qk_rope), H]`` without
      ``q_lora_rank``), ``kv_a_proj_with_mqa [kv_lora_rank+qk_rope, H]``,
      ``kv_b_proj [heads*(qk_nope+v_head), kv_lora_rank]``, ``o_proj [H, heads*v_head]``;
    * attention, plain (``head_dim``, else ``H / heads``): ``q_proj [heads*head_dim, H]`` (twice that for
      ``OUTPUT_GATED_ATTENTION``), ``k_proj``/``v_proj [kv_heads*head_dim, H]`` (``num_key_value_heads``, else
      ``heads``), ``o_proj [H, heads*head_dim]``;
    * Gated DeltaNet (``linear_num_key_heads`` ``nk``, ``linear_num_value_heads`` ``nv``, ``linear_key_head_dim``
      ``dk``, ``linear_value_head_dim`` ``dv`` all given): ``linear_attn.in_proj_qkvz [2*nk*dk + 2*nv*dv, H]``,
      ``in_proj_ba [2*nv, H]`` (Qwen3-Next) or ``in_proj_qkv [2*nk*dk + nv*dv, H]``, ``in_proj_z [nv*dv, H]``,
      ``in_proj_a``/``in_proj_b [nv, H]`` (Qwen3.5), ``out_proj [H, nv*dv]``;
    * KDA layers: :func:`layer_linear_shapes`;
    * dense MLP (``mlp.gate_proj``/``up_proj [intermediate_size, H]``, ``down_proj [H, intermediate_size]``);
    * shared experts, width ``shared_expert_intermediate_size``, else ``n_shared_experts *
      moe_intermediate_size``; the router ``[experts, H]`` and Qwen2-MoE's ``shared_expert_gate [1, H]``;
    * DeepSeek-V4 (``o_groups`` + ``o_lora_rank`` given): its native names instead (``_v4_linear_shapes``).
    """
    validate_config(config, where)
    if model_type(config) not in RUNNABLE_MODEL_TYPES or model_type(config) in NATIVE_GEOMETRY:
        # the geometry below is the previous generation's; the current one (output-gated q_proj, linear
        # attention, hyper-connections, ...) is not derived here yet: no claim rather than a wrong one
        return {}
    text = canonical_keys(text_config(config), model_type(config))
    hidden = text.get("hidden_size")
    if not hidden:
        return {}
    shapes: dict[tuple[str, str], tuple[int, int]] = {}
    heads = text.get("num_attention_heads")
    kv_lora = text.get("kv_lora_rank")
    if heads and text.get("o_groups") and text.get("o_lora_rank"):
        return _v4_linear_shapes(text, hidden, heads, routed_expert_count(config, where))
    if heads and kv_lora:
        nope, rope, v_head = (text.get(k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        q_lora = text.get("q_lora_rank")
        if nope is not None and rope is not None:
            q_out = heads * (nope + rope)
            if q_lora:
                shapes[("self_attn", "q_a_proj")] = (q_lora, hidden)
                shapes[("self_attn", "q_b_proj")] = (q_out, q_lora)
            else:
                shapes[("self_attn", "q_proj")] = (q_out, hidden)
            shapes[("self_attn", "kv_a_proj_with_mqa")] = (kv_lora + rope, hidden)
            if v_head:
                shapes[("self_attn", "kv_b_proj")] = (heads * (nope + v_head), kv_lora)
        if v_head:
            shapes[("self_attn", "o_proj")] = (hidden, heads * v_head)
    elif heads:
        head_dim = text.get("head_dim") or (hidden // heads if hidden % heads == 0 else None)
        if head_dim:
            kv_heads = text.get("num_key_value_heads") or heads
            gated = 2 if model_type(config) in OUTPUT_GATED_ATTENTION else 1
            shapes[("self_attn", "q_proj")] = (gated * heads * head_dim, hidden)
            shapes[("self_attn", "k_proj")] = (kv_heads * head_dim, hidden)
            shapes[("self_attn", "v_proj")] = (kv_heads * head_dim, hidden)
            shapes[("self_attn", "o_proj")] = (hidden, heads * head_dim)
    nk, nv, dk, dv = (text.get(f"linear_{k}") for k in ("num_key_heads", "num_value_heads", "key_head_dim",
                                                         "value_head_dim"))  # fmt: skip
    if nk and nv and dk and dv:
        kd, vd = nk * dk, nv * dv
        for leaf, rows in (("in_proj_qkvz", 2 * kd + 2 * vd), ("in_proj_ba", 2 * nv), ("in_proj_qkv", 2 * kd + vd),
                           ("in_proj_z", vd), ("in_proj_a", nv), ("in_proj_b", nv)):  # fmt: skip
            shapes[("linear_attn", leaf)] = (rows, hidden)
        shapes[("linear_attn", "out_proj")] = (hidden, vd)
    dense = text.get("intermediate_size")
    if dense:
        shapes[("mlp", "gate_proj")] = shapes[("mlp", "up_proj")] = (dense, hidden)
        shapes[("mlp", "down_proj")] = (hidden, dense)
    shared = text.get("shared_expert_intermediate_size")
    if not shared and text.get("n_shared_experts") and text.get("moe_intermediate_size"):
        shared = text["n_shared_experts"] * text["moe_intermediate_size"]
    if shared:
        shapes[("mlp.shared_experts", "gate_proj")] = (shared, hidden)
        shapes[("mlp.shared_experts", "up_proj")] = (shared, hidden)
        shapes[("mlp.shared_experts", "down_proj")] = (hidden, shared)
        shapes[("mlp", "shared_expert_gate")] = (1, hidden)
    experts = routed_expert_count(config, where)
    if experts:
        shapes[("mlp", "gate")] = (experts, hidden)
    return shapes


def _v4_linear_shapes(text: Mapping[str, Any], hidden: int, heads: int, experts: int | None
                      ) -> dict[tuple[str, str], tuple[int, int]]:  # fmt: skip
    """DeepSeek-V4 (native names; transformers 5.24 ``DeepseekV4Attention`` / ``Indexer`` / ``SparseMoeBlock``):
    ``attn.wq_a [q_lora_rank, H]``, ``attn.wq_b [heads*head_dim, q_lora_rank]``, ``attn.wkv [head_dim, H]`` (one
    K = V head), ``attn.wo_a [o_groups*o_lora_rank, heads*head_dim/o_groups]``, ``attn.wo_b [H, o_groups*o_lora_rank]``,
    the CSA indexer's ``wq_b [index_n_heads*index_head_dim, q_lora_rank]``, ``weights_proj [index_n_heads, H]``
    and compressor ``wkv`` / ``wgate [2*index_head_dim, H]``, ``ffn.gate [experts, H]``, ``ffn.shared_experts.w1/w3
    [n_shared*moe_intermediate, H]`` / ``w2``. The layer compressors' ``wkv`` / ``wgate`` are ``2*head_dim`` (CSA)
    or ``head_dim`` (HCA) wide by layer type: not derived."""
    D = text.get("head_dim") or 512
    q_lora, groups, rank = text.get("q_lora_rank") or 1024, text["o_groups"], text["o_lora_rank"]
    shapes: dict[tuple[str, str], tuple[int, int]] = {
        ("attn", "wq_a"): (q_lora, hidden),
        ("attn", "wq_b"): (heads * D, q_lora),
        ("attn", "wkv"): (D, hidden),
        ("attn", "wo_b"): (hidden, groups * rank),
    }
    if (heads * D) % groups == 0:
        shapes[("attn", "wo_a")] = (groups * rank, heads * D // groups)
    ih, idim = text.get("index_n_heads") or 64, text.get("index_head_dim") or 128
    shapes[("attn.indexer", "wq_b")] = (ih * idim, q_lora)
    shapes[("attn.indexer", "weights_proj")] = (ih, hidden)
    shapes[("attn.indexer.compressor", "wkv")] = shapes[("attn.indexer.compressor", "wgate")] = (2 * idim, hidden)
    shared = (text.get("n_shared_experts") or 0) * (text.get("moe_intermediate_size") or 0)
    if shared:
        shapes[("ffn.shared_experts", "w1")] = shapes[("ffn.shared_experts", "w3")] = (shared, hidden)
        shapes[("ffn.shared_experts", "w2")] = (hidden, shared)
    if experts:
        shapes[("ffn", "gate")] = (experts, hidden)
    return shapes
def layer_linear_shapes(config: Any, where: str = "config.json") -> dict[int, dict[tuple[str, str], tuple[int, int]]]:
    """Per layer, the ``[O, I]`` that replace :func:`linear_shapes`' for that layer: the KDA layers
    (``layer_types`` ``linear_attention`` of a family with ``linear_num_heads`` ``nh`` and ``linear_head_dim``
    ``d``, ``C = nh*d``; Kimi-Linear, GLM-5.3) have ``self_attn.q_proj``/``k_proj``/``v_proj [C, H]``,
    ``o_proj [H, C]``, ``f_a_proj``/``g_a_proj [d, H]``, ``f_b_proj``/``g_b_proj [C, d]``, ``b_proj [nh, H]``."""
    validate_config(config, where)
    if model_type(config) not in RUNNABLE_MODEL_TYPES:
        return {}
    text, _ = _text(config)
    hidden, nh, d = text.get("hidden_size"), text.get("linear_num_heads"), text.get("linear_head_dim")
    types = text.get("layer_types")
    if not (hidden and nh and d and isinstance(types, list)):
        return {}
    c = nh * d
    kda = {"q_proj": (c, hidden), "k_proj": (c, hidden), "v_proj": (c, hidden), "o_proj": (hidden, c),
           "f_a_proj": (d, hidden), "f_b_proj": (c, d), "g_a_proj": (d, hidden), "g_b_proj": (c, d),
           "b_proj": (nh, hidden)}  # fmt: skip
    shapes = {("self_attn", leaf): dims for leaf, dims in kda.items()}
    return {i: shapes for i, t in enumerate(types) if t == "linear_attention"}


# --------------------------------------------------------------------------------------------- helpers
def _text(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The text model's keys, a family's own spellings read as the common keys (:data:`KEY_ALIASES`)."""
    text = text_config(config)
    prefix = "text_config." if text is not config else ""
    mt = model_type(config) if isinstance(config.get("model_type", ""), str) else None
    return (canonical_keys(text, mt) if mt in KEY_ALIASES else text), prefix


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    """The value as config.json spells it (JSON), shortened."""
    if _is_int(value) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(key: str, value: Any, kind: str, lo: float | None, hi: float | None, where: str) -> None:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{where}: {key} is {_show(value)} (expected {expected})")

    def in_range(v: float) -> bool:
        return (
            (lo is None or v >= lo) and (hi is None or v <= hi) and (kind != "float" or lo is None or v > lo)
        )

    if kind in ("int", "float"):
        expected = "an integer" if kind == "int" else "a number"
        if lo is not None and hi is not None:
            expected += f" in {'(' if kind == 'float' else '['}{_num(lo)}, {_num(hi)}]"
        elif lo is not None:
            expected += f" {'>' if kind == 'float' else '>='} {_num(lo)}"
        ok_type = _is_int(value) or (kind == "float" and isinstance(value, float) and math.isfinite(value))
        if not ok_type or not in_range(value):
            raise bad(expected)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
    elif kind == "str":
        if not isinstance(value, str):
            raise bad("a string")
    elif kind == "map":
        if not isinstance(value, Mapping):
            raise bad("an object")
    elif kind == "eos":
        items = value if isinstance(value, list) else [value]
        if not all(_is_int(v) and 0 <= v <= _MAX_INT for v in items):
            raise bad("a token id or a list of token ids")
    elif kind == "ints":
        if not isinstance(value, list) or not all(_is_int(v) and in_range(v) for v in value):
            raise bad(f"a list of integers in [{_num(lo)}, {_num(hi)}]")
    elif kind == "strs":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
    else:  # pragma: no cover - a typo in the tables above
        raise AssertionError(kind)


def _num(v: float | None) -> str:
    return str(int(v)) if v is not None and float(v).is_integer() else str(v)
