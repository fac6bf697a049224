"""The towers' geometry: the shape of every tensor of a multimodal checkpoint's vision tower and projector
(docs/FORMATS.md §6 rule 1), from the config's ``vision_config`` and ``text_config``, per family.

The converter never needs these shapes (a tower is kept or dropped as it is stored); a reader that has only a
published ``config.json`` and a weight map (``bench/skeleton.py``'s full-size skeletons) does. The modules are
transformers 5.24's (``modeling_qwen3_vl_moe.Qwen3VLMoeVision*``, ``modeling_llama4.Llama4Vision*`` /
``Llama4MultiModalProjector``), each a row of a table: a pattern of the tensor's name after its tower root and the
shape it has, from the vision config ``v`` and the text config ``t``. A name no row matches has no derivable
shape (None).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from colitools.formats import model_config

Cfg = Mapping[str, Any]
Rows = tuple[tuple[str, Callable[[Cfg, Cfg], tuple[int, ...]]], ...]


def _merged(v: Cfg) -> int:
    """Qwen3-VL's patch merger width: ``spatial_merge_size**2`` patches side by side."""
    return v["hidden_size"] * v["spatial_merge_size"] ** 2


# Qwen3-VL-MoE (``model.visual.`` / ``visual.``): ViT blocks (LayerNorm, fused qkv, gelu MLP, all with biases), a
# Conv3d patch embedding, learned positions, the final merger (norm before the pixel shuffle) and the deepstack
# mergers (``use_postshuffle_norm``: norm after it)
QWEN3_VL: Rows = (
    (r"blocks\.\d+\.norm[12]\.(weight|bias)", lambda v, t: (v["hidden_size"],)),
    (r"blocks\.\d+\.attn\.qkv\.weight", lambda v, t: (3 * v["hidden_size"], v["hidden_size"])),
    (r"blocks\.\d+\.attn\.qkv\.bias", lambda v, t: (3 * v["hidden_size"],)),
    (r"blocks\.\d+\.attn\.proj\.weight", lambda v, t: (v["hidden_size"], v["hidden_size"])),
    (r"blocks\.\d+\.(attn\.proj|mlp\.linear_fc2)\.bias", lambda v, t: (v["hidden_size"],)),
    (r"blocks\.\d+\.mlp\.linear_fc1\.weight", lambda v, t: (v["intermediate_size"], v["hidden_size"])),
    (r"blocks\.\d+\.mlp\.linear_fc1\.bias", lambda v, t: (v["intermediate_size"],)),
    (r"blocks\.\d+\.mlp\.linear_fc2\.weight", lambda v, t: (v["hidden_size"], v["intermediate_size"])),
    (
        r"patch_embed\.proj\.weight",
        lambda v, t: (
            v["hidden_size"],
            v.get("in_channels", 3),
            v["temporal_patch_size"],
            v["patch_size"],
            v["patch_size"],
        ),
    ),
    (r"patch_embed\.proj\.bias", lambda v, t: (v["hidden_size"],)),
    (r"pos_embed\.weight", lambda v, t: (v["num_position_embeddings"], v["hidden_size"])),
    (r"merger\.norm\.(weight|bias)", lambda v, t: (v["hidden_size"],)),
    (r"deepstack_merger_list\.\d+\.norm\.(weight|bias)", lambda v, t: (_merged(v),)),
    (r"(deepstack_merger_list\.\d+\.|merger\.)linear_fc1\.weight", lambda v, t: (_merged(v), _merged(v))),
    (r"(deepstack_merger_list\.\d+\.|merger\.)linear_fc1\.bias", lambda v, t: (_merged(v),)),
    (
        r"(deepstack_merger_list\.\d+\.|merger\.)linear_fc2\.weight",
        lambda v, t: (v["out_hidden_size"], _merged(v)),
    ),
    (r"(deepstack_merger_list\.\d+\.|merger\.)linear_fc2\.bias", lambda v, t: (v["out_hidden_size"],)),
)

# Llama-4 (``vision_model.``, ``multi_modal_projector.``): an unfold + linear patch embedding (no bias), class
# embedding and positions over ``(image_size / patch_size)^2 + 1`` patches, pre / post LayerNorms, encoder layers
# (q/k/v/o with biases, fc1 / fc2 with biases, two LayerNorms), the pixel-shuffle adapter (two linears, no
# biases) and the projector into the text model's hidden size
LLAMA4: Rows = (
    (
        r"vision_model\.patch_embedding\.linear\.weight",
        lambda v, t: (v["hidden_size"], v.get("num_channels", 3) * v["patch_size"] ** 2),
    ),
    (r"vision_model\.class_embedding", lambda v, t: (v["hidden_size"],)),
    (
        r"vision_model\.positional_embedding_vlm",
        lambda v, t: ((v["image_size"] // v["patch_size"]) ** 2 + 1, v["hidden_size"]),
    ),
    (r"vision_model\.layernorm_(pre|post)\.(weight|bias)", lambda v, t: (v["hidden_size"],)),
    (
        r"vision_model\.model\.layers\.\d+\.(input|post_attention)_layernorm\.(weight|bias)",
        lambda v, t: (v["hidden_size"],),
    ),
    (
        r"vision_model\.model\.layers\.\d+\.self_attn\.[qkvo]_proj\.weight",
        lambda v, t: (v["hidden_size"], v["hidden_size"]),
    ),
    (
        r"vision_model\.model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.fc2)\.bias",
        lambda v, t: (v["hidden_size"],),
    ),
    (
        r"vision_model\.model\.layers\.\d+\.mlp\.fc1\.weight",
        lambda v, t: (v["intermediate_size"], v["hidden_size"]),
    ),
    (r"vision_model\.model\.layers\.\d+\.mlp\.fc1\.bias", lambda v, t: (v["intermediate_size"],)),
    (
        r"vision_model\.model\.layers\.\d+\.mlp\.fc2\.weight",
        lambda v, t: (v["hidden_size"], v["intermediate_size"]),
    ),
    (
        r"vision_model\.vision_adapter\.mlp\.fc1\.weight",
        lambda v, t: (v["projector_input_dim"], v["intermediate_size"]),
    ),
    (
        r"vision_model\.vision_adapter\.mlp\.fc2\.weight",
        lambda v, t: (v["projector_output_dim"], v["projector_output_dim"]),
    ),
    (r"multi_modal_projector\.linear_1\.weight", lambda v, t: (t["hidden_size"], v["vision_output_dim"])),
    (r"multi_modal_projector\.linear_1\.bias", lambda v, t: (t["hidden_size"],)),
)

# model type -> (tower roots stripped before matching, rows)
FAMILIES: dict[str, tuple[tuple[str, ...], Rows]] = {
    "qwen3_vl_moe": (("model.visual.", "visual."), QWEN3_VL),
    "llama4": (("model.", ""), LLAMA4),
}


def tower_shapes(config: Cfg, names: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """The shape of each of ``names`` that is a tensor of the family's towers, derived from the config (module
    docstring); names the table does not know are left out."""
    family = FAMILIES.get(config.get("model_type"))
    vision = config.get("vision_config")
    if family is None or not isinstance(vision, Mapping):
        return {}
    roots, rows = family
    compiled = [(re.compile(pattern), shape) for pattern, shape in rows]
    text = model_config.text_config(config)
    out = {}
    for name in names:
        for root in roots:
            if not name.startswith(root):
                continue
            rest = name[len(root) :]
            found = next((shape for pattern, shape in compiled if pattern.fullmatch(rest)), None)
            if found is not None:
                out[name] = tuple(int(d) for d in found(vision, text))
                break
    return out
