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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from colitools.formats import families, names
from colitools.formats.errors import ConfigError, FormatError

__all__ = [
    "EXPERT_COUNT_KEYS",
    "MTP_LAYER_KEYS",
    "ConfigFacts",
    "canonical_keys",
    "check_complete",
    "check_decoder_layers",
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
    "linear_lower_bound": ("float", None, None),  # GLM-5.3; Kimi K3's linear_attn_config.gate_lower_bound
    "attn_res_block_size": ("int", 1, _MAX_LAYERS),  # Kimi K3 attention residuals: layers per block
    "activation_situ_beta": ("float", 0, None),  # Kimi K3 SiTU-GLU: b1 tanh(g / b1) sigmoid(g) * b2 tanh(u / b2)
    "activation_situ_linear_beta": ("float", 0, None),
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
    """The text model's keys with the family's own spellings (``families.Family.key_aliases``) read as the common
    ones (a key already spelled the common way wins). Kimi-Linear hub configs nest the KDA geometry in
    ``linear_attn_config`` (``head_dim``, ``num_heads``, ``short_conv_kernel_size``, 1-based ``kda_layers`` /
    ``full_attn_layers``): read as ``linear_head_dim``, ``linear_num_heads``, ``linear_conv_kernel_dim`` and
    ``layer_types`` (``Family.nested_key_aliases``; as ``KimiLinearConfig``: the nested geometry wins over
    top-level keys, an explicit ``layer_types`` over the nested layer lists). A family's own spellings of a layer
    type (``Family.layer_type_aliases``: Qwen3.8's ``qwen_sparse_attention``) are read as the type it names."""
    out = dict(text)
    family = families.family_of(model_type)
    if family is None:
        return out
    types = text.get("layer_types")
    if family.layer_type_aliases and isinstance(types, list):
        out["layer_types"] = [family.layer_type_aliases.get(t, t) if isinstance(t, str) else t for t in types]
    for alias, key in family.key_aliases.items():
        if alias in text and key not in text:
            out[key] = text[alias]
    for section, aliases in family.nested_key_aliases.items():
        nested = text.get(section)
        if isinstance(nested, Mapping):
            for alias, key in aliases.items():
                if alias in nested:  # transformers: the nested value wins over the top-level key
                    out[key] = nested[alias]
            if out.get("layer_types") is None:
                _nested_layer_types(
                    out, nested, text.get("num_hidden_layers"), section, family.unlisted_layer_type
                )
    return out


def _nested_layer_types(
    out: dict[str, Any], nested: Mapping[str, Any], n: Any, section: str, unlisted: str | None = None
) -> None:
    """``layer_types`` from the 1-based ``full_attn_layers`` / ``kda_layers`` of a nested section (Kimi-Linear);
    ``unlisted``: the type of the layers neither list names, when the family allows a list to be left out (Kimi
    K3: ``kda_layers`` alone)."""
    full, kda = nested.get("full_attn_layers"), nested.get("kda_layers")
    if unlisted is not None and full is None:
        full = []
    if not (isinstance(full, list) and isinstance(kda, list) and _is_int(n)):
        return
    types: list[Any] = [unlisted] * n
    for numbers, kind in ((full, "full_attention"), (kda, "linear_attention")):
        for i in numbers:
            if not (_is_int(i) and 1 <= i <= n):
                raise ConfigError(f"{section}: layer {i!r} is not one of 1..{n}")
            types[i - 1] = kind
    out["layer_types"] = types


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


def check_decoder_layers(
    config: Mapping[str, Any], tensor_names: Iterable[str], where: str = "config.json"
) -> None:
    """ConfigError when a tensor sits in a decoder layer past the base decoder and its MTP layers: a
    ``num_hidden_layers`` below the layers present would make the extra layer an MTP layer of a family that
    declares none (``MTP_LAYER_KEYS``) and leave it out of ``run``. Layers of towers and other nested modules
    do not count; an MTP layer the config declares (index ``num_hidden_layers + k``) is kept."""
    n = num_hidden_layers(config, where)
    if n is None:
        return
    mtp = mtp_layer_count(config, where)
    found: tuple[int, str] | None = None
    for name in tensor_names:
        parsed = names.parse_name(name)
        if parsed.layer is None or parsed.layer_prefix != parsed.root + names.LAYERS or names.is_tower(name):
            continue
        if parsed.layer >= n + mtp and (found is None or (parsed.layer, name) < found):
            found = (parsed.layer, name)
    if found is None:
        return
    layer, name = found
    _, prefix = _text(config)
    declared = f"plus {mtp} MTP layer(s)" if mtp else "and no MTP layers (num_nextn_predict_layers)"
    raise ConfigError(
        f"{where}: {prefix}num_hidden_layers is {n} {declared}, but tensor {name} is of layer {layer}: "
        f"the config does not count every decoder layer of the checkpoint"
    )


def check_complete(
    config: Mapping[str, Any], tensor_names: Iterable[str], where: str = "config.json"
) -> None:
    """The tensors a model needs, against those it has: the one completeness rule of the converter's planning
    (``converters/inventory.py``), ``inspect``, ``verify container`` and ``run`` (``container.resolve_container``).

    * ``hidden_size`` is given when the checkpoint has decoder layers; an expert count
      (:data:`EXPERT_COUNT_KEYS`, at least 1) when it has routed experts (ConfigError);
    * every base decoder layer ``0 .. num_hidden_layers - 1`` has tensors, once any decoder layer has (towers and
      nested layers do not count; MTP layers are not required: a target may drop them);
    * every routed expert of an expert module has every projection (``names.PROJECTION_ORDER``: gate, up, down;
      a merged blob holds all three), and a base decoder layer's module has every expert ``0 .. count - 1`` (an
      MTP stage may have its own count: DeepSeek-V4.1's DSpark stages); an expert stack
      ``gate_up`` has its ``down`` stack and the other way round (FormatError naming the missing tensor).
    A name is read by ``names.parse_name`` only, so foreign spellings (Mixtral ``w1``, DeepSeek-V4's ``ffn``)
    and the targets' (merged blobs ``merged_weight``) are counted alike."""
    n = num_hidden_layers(config, where)
    seen = _Present.gather(tensor_names, n)
    if not seen.decoder and seen.routed is None:
        return  # nothing of a decoder to check (a tower, a lone file)
    count = _check_decoder_keys(config, where, seen)
    _check_layers(config, where, seen, n)
    _check_experts(seen, count)
    _check_stacks(seen)


@dataclass
class _Present:
    """What ``check_complete`` finds in a list of tensor names."""

    all_names: list[str]
    decoder: dict[int, str] = field(default_factory=dict)  # layer -> a tensor of it
    experts: dict[str, dict[int, dict[str, str]]] = field(default_factory=dict)  # module -> expert -> proj -> name
    counted: set[str] = field(default_factory=set)  # expert modules of base decoder layers (an MTP stage may differ)
    stacks: dict[str, dict[str, str]] = field(default_factory=dict)  # expert module -> stacked projection -> name
    routed: str | None = None  # a routed expert's tensor, if any

    @classmethod
    def gather(cls, tensor_names: Iterable[str], n: int | None) -> _Present:
        seen = cls(list(tensor_names))
        for name in seen.all_names:
            if not names.is_tower(name):
                seen._add(name, names.parse_name(name), n)
        return seen

    def _add(self, name: str, p, n: int | None) -> None:
        if p.layer is not None and p.layer_prefix == p.root + names.LAYERS:  # a base decoder layer
            self.decoder.setdefault(p.layer, name)
            if p.expert_base is not None and (n is None or p.layer < n):
                self.counted.add(p.expert_base)
        if p.role is names.TensorRole.EXPERT and p.projection is not None:
            weight = p.suffix in names.WEIGHT_SUFFIXES or (not p.suffix and p.leaf in names.SUFFIXLESS_PROJECTIONS)
            if weight or p.projection == names.MERGED:
                found = self.experts.setdefault(p.expert_base, {}).setdefault(p.expert, {})
                for proj in names.PROJECTION_ORDER if p.projection == names.MERGED else (p.projection,):
                    found.setdefault(proj, name)
                self.routed = self.routed or name
        elif p.role is names.TensorRole.EXPERT_STACK:
            self.stacks.setdefault(p.expert_base, {}).setdefault(p.projection, name)
            self.routed = self.routed or name


def _check_decoder_keys(config: Mapping[str, Any], where: str, seen: _Present) -> int | None:
    """``hidden_size`` and the routed expert count where the tensors need them; returns the count."""
    _, prefix = _text(config)
    if seen.decoder and hidden_size(config, where) is None:
        raise ConfigError(
            f"{where}: {prefix}hidden_size is missing, but the checkpoint has decoder layers "
            f"(e.g. tensor {seen.decoder[min(seen.decoder)]}): their shapes cannot be checked nor run"
        )
    count = routed_expert_count(config, where)
    if seen.routed is not None and not count:
        said = "names no routed expert count" if count is None else f"says {count} routed experts"
        raise ConfigError(
            f"{where}: {said} ({', '.join(prefix + k for k in EXPERT_COUNT_KEYS)}), but tensor {seen.routed} is a "
            f"routed expert"
        )
    return count


def _check_layers(config: Mapping[str, Any], where: str, seen: _Present, n: int | None) -> None:
    missing = [k for k in range(n or 0) if k not in seen.decoder]
    if seen.decoder and missing:
        _, prefix = _text(config)
        some = names.parse_name(seen.decoder[min(seen.decoder)]).layer_prefix
        raise ConfigError(
            f"{where}: {prefix}num_hidden_layers is {n}, but the checkpoint has no tensor {some}.{missing[0]}.* "
            f"({len(missing)} of the {n} decoder layers missing, the first is layer {missing[0]})"
        )


def _check_experts(seen: _Present, count: int | None) -> None:
    for base, by_expert in seen.experts.items():
        for e in range(count if base in seen.counted else 0):
            if e not in by_expert:
                raise FormatError(
                    f"{base}: {len(by_expert)} of the {count} routed experts config.json names: missing expert {e} "
                    f"(tensors {base}.{e}.*)"
                )
        for e, found in sorted(by_expert.items()):
            missing = next((proj for proj in names.PROJECTION_ORDER if proj not in found), None)
            if missing is not None:
                _missing_projection(base, e, found, missing)


def _missing_projection(base: str, e: int, found: dict[str, str], proj: str) -> None:
    have = names.parse_name(next(iter(found.values())))
    suffixless = have.leaf in names.SUFFIXLESS_PROJECTIONS
    spelled = next(leaf for leaf, pr in names.PROJECTIONS.items()
                   if pr == proj and (leaf in names.SUFFIXLESS_PROJECTIONS) == suffixless)  # fmt: skip
    missing_name = f"{base}.{e}.{spelled}" + (f".{have.suffix}" if have.suffix else "")
    raise FormatError(
        f"routed expert {e} of {base} has {', '.join(p for p in names.PROJECTION_ORDER if p in found)} "
        f"but not {proj} (every routed expert needs {', '.join(names.PROJECTION_ORDER)}): missing "
        f"tensor {missing_name}"
    )


def _check_stacks(seen: _Present) -> None:
    for base, found in seen.stacks.items():
        if "down" not in found:
            want, have = names.stack_name(base, "down"), next(iter(found.values()))
        elif not ({"gate_up"} <= found.keys() or {"gate", "up"} <= found.keys()):
            want, have = names.stack_name(base, "gate_up"), found["down"]
        else:
            continue
        if any(n.startswith(want) for n in seen.all_names):  # stored in another form (a natively quantized stack)
            continue
        raise FormatError(f"the expert stack {have} has no {want.rsplit('.', 1)[-1]} beside it: missing tensor {want}")


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
    sizes (``formats/container.py`` ``config_shapes``). The roles and their shapes are the family's
    (``formats/families.py``: ``Family.blocks``, the same block geometries the runtime's layers are built with);
    a model type the runtime does not run, or a family with native geometry (Inkling), gets ``{}``."""
    validate_config(config, where)
    mt = model_type(config)
    if families.family_of(mt) is None:  # (a converted-only family claims its geometry too: DeepSeek-V4.1)
        return {}
    text = canonical_keys(text_config(config), mt)
    return families.family_of(mt).linear_shapes(text, routed_expert_count(config, where))


def layer_linear_shapes(
    config: Any, where: str = "config.json"
) -> dict[int, dict[tuple[str, str], tuple[int, int]]]:
    """Per layer, the ``[O, I]`` that replace :func:`linear_shapes`' for that layer: the KDA layers
    (``layer_types`` ``linear_attention`` of Kimi-Linear and GLM-5.3, ``families.kda_layers``)."""
    validate_config(config, where)
    mt = model_type(config)
    if mt not in families.RUNNABLE_MODEL_TYPES:
        return {}
    text, _ = _text(config)
    return families.family_of(mt).layer_linear_shapes(text)


# --------------------------------------------------------------------------------------------- helpers
def _text(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The text model's keys, a family's own spellings read as the common keys (``Family.key_aliases``)."""
    text = text_config(config)
    prefix = "text_config." if text is not config else ""
    mt = model_type(config) if isinstance(config.get("model_type", ""), str) else None
    family = families.family_of(mt)
    aliased = family is not None and (family.key_aliases or family.nested_key_aliases or family.layer_type_aliases)
    return (canonical_keys(text, mt) if aliased else text), prefix


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
