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
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

# ----------------------------------------------------------------------------------------------- tables
# Text-model roots (FORMATS-SPEC §6), matched as a name prefix, longest first.
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
PROJECTION_ORDER = ("gate", "up", "down")  # an expert's tensors in the pairs layout (FORMATS-SPEC §4)
CANONICAL_PROJECTION = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}  # the spelling we write
# Projections some exports store without a ``.weight`` suffix (``...experts.{E}.w1``).
SUFFIXLESS_PROJECTIONS = frozenset({"w1", "w2", "w3"})  # Mixtral

# Fused expert stacks ``{...}.experts.{leaf}[.weight]`` [E, rows, cols] -> the projections they hold.
EXPERT_STACKS: dict[str, str] = {
    "gate_up_proj": "gate_up",  # transformers fused experts (Qwen3-MoE): [E, 2I, H], gate rows first
    "down_proj": "down",  # transformers fused experts: [E, H, I]
}

# MoE blocks that hold ``experts.{E}`` directly inside a layer.
MOE_BLOCKS = frozenset({
    "mlp",  # Qwen2/3-MoE, OLMoE, DeepSeek-V3, GLM-4 MoE
    "block_sparse_moe",  # Mixtral, Kimi-Linear
})  # fmt: skip
SHARED_EXPERT_MODULES = frozenset({
    "shared_experts",  # DeepSeek-V3, GLM-4 MoE
    "shared_expert",  # Qwen2-MoE
})  # fmt: skip
# Module spellings -> the runtime's canonical spelling (mlx-lm's ``sanitize``).
MODULE_ALIASES: dict[str, str] = {
    "block_sparse_moe": "mlp",  # Mixtral (its router block_sparse_moe.gate too)
    "shared_expert": "shared_experts",  # Qwen2-MoE
}

# Routers and routing parameters, matched as the last components of a name.
ROUTERS: dict[str, str] = {
    "mlp.gate.weight": "Qwen2/3-MoE, OLMoE, DeepSeek-V3, GLM-4 MoE",
    "block_sparse_moe.gate.weight": "Mixtral",
    "shared_expert_gate.weight": "Qwen2-MoE (the sigmoid gate of its shared expert)",
    "e_score_correction_bias": "DeepSeek-V3, GLM-4 MoE (noaux_tc routing bias)",
}
EMBEDDINGS = frozenset({"embed_tokens"})  # transformers (every family today)
HEADS = frozenset({"lm_head"})  # transformers (every family today)
NORM_ENDINGS = ("norm",)  # input_layernorm, post_attention_layernorm, q_norm, kv_a_layernorm, model.norm

# Trailing suffixes of a tensor name (what follows its leaf), longest first when matched.
SUFFIXES = (
    "weight.qs",  # colitools codes' F32 scales (FORMATS-SPEC §2)
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
    projection: str | None  # gate | up | down | gate_up (an expert stack) | None
    role: TensorRole
    suffix: str

    @property
    def expert_tensor(self) -> str:
        """What follows ``experts.{E}.`` in a per-expert name (``gate_proj.weight``, ``w1.weight.qs``)."""
        return f"{self.leaf}.{self.suffix}" if self.suffix or self.name.endswith(".") else self.leaf


_ROOTS_LONGEST_FIRST = sorted(TEXT_ROOTS, key=len, reverse=True)
_ROUTER_PARTS = tuple(tuple(s.split(".")) for s in ROUTERS)
_SUFFIX_PARTS = sorted((tuple(s.split(".")) for s in SUFFIXES), key=len, reverse=True)


def _root(name: str) -> str:
    for root in _ROOTS_LONGEST_FIRST:
        if name.startswith(root) and len(name) > len(root):
            return root
    return ""


@lru_cache(maxsize=1 << 18)
def parse_name(name: str) -> TensorName:
    """Parse ``name`` once (cached). Never fails: a name the tables do not know is role ``other``."""
    parts = name.split(".")
    n = len(parts)
    root = _root(name)
    start = root.count(".")
    layer_prefix, layer = None, None
    for i in range(n - 3, -1, -1):  # the last ``layers.{L}.``
        if parts[i] == LAYERS and parts[i + 1].isdecimal():
            layer_prefix, layer = ".".join(parts[: i + 1]), int(parts[i + 1])
            start = max(start, i + 2)
            break
    expert = expert_base = None
    for j in range(n - 3, -1, -1):  # the last ``experts.{E}.<something>``
        if parts[j] == EXPERTS and parts[j + 1].isdecimal() and (n > j + 3 or parts[j + 2]):
            expert, expert_base = int(parts[j + 1]), ".".join(parts[: j + 1])
            leaf, suffix, leaf_at = parts[j + 2], ".".join(parts[j + 3 :]), j + 2
            module = ".".join(parts[min(start, j) : j + 1])
            projection = PROJECTIONS.get(leaf)
            break
    else:
        k = next((len(s) for s in _SUFFIX_PARTS if n > len(s) and tuple(parts[n - len(s) :]) == s), 0)
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
    role = _role(parts, leaf, module, expert, expert_base)
    return TensorName(
        name, root, layer_prefix, layer, module, expert, expert_base, leaf, projection, role, suffix
    )


def _role(
    parts: list[str], leaf: str, module: str, expert: int | None, expert_base: str | None
) -> TensorRole:
    if any(len(parts) >= len(r) and tuple(parts[-len(r) :]) == r for r in _ROUTER_PARTS):
        return TensorRole.ROUTER
    if leaf in EMBEDDINGS:
        return TensorRole.EMBED
    if leaf in HEADS:
        return TensorRole.HEAD
    if expert is not None:
        return TensorRole.EXPERT
    if expert_base is not None:
        return TensorRole.EXPERT_STACK
    if module.rpartition(".")[2] in SHARED_EXPERT_MODULES:
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
    """``{expert_base}.{expert}.{gate|up|down}_proj[.{suffix}]``: the per-expert name we write (FORMATS-SPEC §4),
    also what an expert stack is split into."""
    name = f"{expert_base}.{expert}.{CANONICAL_PROJECTION[projection]}"
    return f"{name}.{suffix}" if suffix else name


def stack_name(expert_base: str, projection: str) -> str:
    """The transformers spelling of an expert stack: ``{expert_base}.gate_up_proj`` / ``.down_proj``."""
    return f"{expert_base}.{next(k for k, v in EXPERT_STACKS.items() if v == projection)}"


@lru_cache(maxsize=1 << 18)
def canonical_name(name: str) -> str:
    """The runtime's spelling of a checkpoint name (mlx-lm's ``sanitize``): :data:`MODULE_ALIASES` applied to
    inner components, a per-expert projection spelled ``gate_proj``/``up_proj``/``down_proj``; suffixes kept."""
    parts = name.split(".")
    for i in range(1, len(parts) - 1):
        parts[i] = MODULE_ALIASES.get(parts[i], parts[i])
    parsed = parse_name(name)
    if parsed.expert is not None and parsed.projection is not None and parsed.expert_base != EXPERTS:
        at = parsed.expert_base.count(".") + 2
        if at + 1 < len(parts):  # the projection is followed by a suffix
            parts[at] = CANONICAL_PROJECTION[parsed.projection]
    return ".".join(parts)


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders ``layers.2`` before ``layers.10`` (numbers compared as numbers)."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))
