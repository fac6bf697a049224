#!/usr/bin/env python
"""Do the oracles catch bugs? Run each fixture's f32 reference model with a deliberate runtime bug and report
whether the greedy / teacher-forced tokens or the logits (tolerance 1e-4) change. Needs the oracle venv:

    .oracle-venv/bin/python oracles/mutation_check.py [--only olmoe ...]

A mutation that changes no token but the logits is still caught by `verify oracle`'s logits comparison.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
import transformers
import zstandard
from fixture_specs import FIXTURES, Fixture
from make_oracles import ORACLES_DIR, load_reference_model, run_reference
from oracle_recipes import apply_recipe, fp8_block_dequant
from safetensors.torch import load_file

Mutation = Callable[[torch.nn.Module], bool]  # mutates in place; False = not applicable
_TMP = tempfile.TemporaryDirectory(prefix="mutation-")  # scratch checkpoints, removed at exit


def _attn_modules(model):
    return [layer.self_attn for layer in model.model.layers]


def no_rope(model) -> bool:
    model.model.rotary_emb.inv_freq.zero_()
    return True


def yarn_as_default(model) -> bool:
    cfg = model.config
    if cfg.rope_parameters.get("rope_type") != "yarn":
        return False
    dim = getattr(cfg, "qk_rope_head_dim", None) or cfg.head_dim  # MLA: the rope slice; gpt-oss: head_dim
    base = cfg.rope_parameters["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    model.model.rotary_emb.inv_freq.copy_(inv)
    model.model.rotary_emb.attention_scaling = 1.0  # default RoPE has none (DeepSeek's is 1.0 anyway)
    return True


def yarn_truncate_flipped(model) -> bool:
    """YaRN: the correction range floored/ceiled when the config says ``truncate: false`` (or the reverse)."""
    cfg = model.config
    if cfg.rope_parameters.get("rope_type") != "yarn" or "truncate" not in cfg.rope_parameters:
        return False
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg.rope_parameters["truncate"] = not cfg.rope_parameters["truncate"]
    inv, _ = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    model.model.rotary_emb.inv_freq.copy_(inv)
    return True


def yarn_attention_factor_dropped(model) -> bool:
    """YaRN: cos/sin not multiplied by the attention factor (0.1 ln factor + 1 for gpt-oss)."""
    rot = model.model.rotary_emb
    if model.config.rope_parameters.get("rope_type") != "yarn" or rot.attention_scaling == 1.0:
        return False
    rot.attention_scaling = 1.0
    return True


def no_mscale(model) -> bool:
    cfg = model.config
    if cfg.rope_parameters.get("rope_type") != "yarn" or not hasattr(cfg, "qk_nope_head_dim"):
        return False
    for a in _attn_modules(model):
        a.scaling = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    return True


def scale_from_config_head_dim(model) -> bool:
    """MLA: using config.json's head_dim (= qk_rope_head_dim in transformers 5.x) for the softmax scale."""
    cfg = model.config
    if not hasattr(cfg, "qk_rope_head_dim"):
        return False
    for a in _attn_modules(model):
        a.scaling = cfg.head_dim**-0.5
    return True


def no_softmax_scale(model) -> bool:
    for a in _attn_modules(model):
        a.scaling = 1.0
    return True


def flip_rope_layout(model) -> bool:
    """Interleaved <-> half layout: DeepSeek via its config flag, Llama-style models by patching the module."""
    cfg = model.config
    if cfg.model_type == "deepseek_v3":
        cfg.rope_interleave = not cfg.rope_interleave
        return True
    mod = sys.modules[type(model).__module__]
    if cfg.model_type == "glm_moe_dsa" or not hasattr(mod, "apply_rotary_pos_emb"):
        return False
    interleave = transformers.models.deepseek_v3.modeling_deepseek_v3.apply_rotary_pos_emb_interleave

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):
        rot = cos.shape[-1]
        qr, kr = interleave(q[..., :rot], k[..., :rot], cos, sin, unsqueeze_dim=unsqueeze_dim)
        return torch.cat([qr, q[..., rot:]], -1), torch.cat([kr, k[..., rot:]], -1)

    mod.apply_rotary_pos_emb = interleaved  # the attention forward looks it up as a module global
    return True


def full_rotary(model) -> bool:
    """GLM-4.5: rotating the whole head instead of the partial_rotary_factor fraction."""
    cfg = model.config
    if cfg.model_type != "glm4_moe":
        return False
    dim = cfg.head_dim
    base = cfg.rope_parameters["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    model.model.rotary_emb.inv_freq = inv
    return True


def flip_norm_topk_prob(model) -> bool:
    hit = False
    for m in model.modules():
        if hasattr(m, "norm_topk_prob") and type(m).__name__.endswith(("TopKRouter", "TopkRouter")):
            m.norm_topk_prob = not m.norm_topk_prob
            hit = True
    return hit


def ignore_correction_bias(model) -> bool:
    hit = False
    for m in model.modules():
        if hasattr(m, "e_score_correction_bias"):
            m.e_score_correction_bias.zero_()
            hit = True
    return hit


def lora_norm_eps_from_config(model) -> bool:
    """MLA: q_a_layernorm / kv_a_layernorm with rms_norm_eps instead of the fixed 1e-6."""
    cfg = model.config
    if not hasattr(cfg, "kv_lora_rank") or cfg.rms_norm_eps == 1e-6:
        return False
    for a in _attn_modules(model):
        for n in ("q_a_layernorm", "kv_a_layernorm"):
            if getattr(a, n, None) is not None:
                getattr(a, n).variance_epsilon = cfg.rms_norm_eps
    return True


def rms_eps_times_10(model) -> bool:
    for m in model.modules():
        if "RMSNorm" in type(m).__name__:
            m.variance_epsilon *= 10
    return True


def no_shared_expert(model) -> bool:
    hit = False
    for layer in model.model.layers:
        for n in ("shared_experts", "shared_expert"):
            sub = getattr(layer.mlp, n, None)
            if sub is not None:
                sub.down_proj.weight.zero_()
                hit = True
    return hit


def no_qkv_bias(model) -> bool:
    hit = False
    for a in _attn_modules(model):
        for n in ("q_proj", "k_proj", "v_proj"):
            lin = getattr(a, n, None)
            if lin is not None and lin.bias is not None:
                lin.bias.zero_()
                hit = True
    return hit


def no_indexer(model) -> bool:
    """DSA: attending to every key (ignoring the indexer's top-k)."""
    hit = False
    for a in _attn_modules(model):
        if getattr(a, "indexer", None) is not None:
            a.indexer.index_topk = 10**9
            hit = True
    return hit


def indexer_k_norm_bias_ignored(model) -> bool:
    """DSA: the indexer's k_norm is a LayerNorm with a bias (not an RMSNorm)."""
    hit = False
    for a in _attn_modules(model):
        if getattr(a, "indexer", None) is not None:
            a.indexer.k_norm.bias.zero_()
            hit = True
    return hit


def _gpt_oss_mlps(model):
    return [layer.mlp for layer in model.model.layers] if model.config.model_type == "gpt_oss" else []


def no_sinks(model) -> bool:
    """gpt-oss: softmax without the sink logit in the denominator."""
    hit = False
    for a in _attn_modules(model):
        if getattr(a, "sinks", None) is not None:
            a.sinks.fill_(-float("inf"))
            hit = True
    return hit


def sliding_mask_off(model) -> bool:
    """Full attention on the sliding layers too (layer_types drives both the masks and the cache layers)."""
    cfg = model.config
    types = getattr(cfg, "layer_types", None) or []
    if "sliding_attention" not in types:
        return False
    cfg.layer_types = ["full_attention"] * len(types)
    for a in _attn_modules(model):
        a.sliding_window = None
    return True


def swiglu_clamp_removed(model) -> bool:
    for mlp in _gpt_oss_mlps(model):
        mlp.experts.limit = float("inf")
    return bool(_gpt_oss_mlps(model))


def swiglu_without_up_plus_one(model) -> bool:
    """gpt-oss: ``up * glu`` instead of ``(up + 1) * glu`` (clamps kept)."""
    for mlp in _gpt_oss_mlps(model):
        ex = mlp.experts

        def gate_fn(gate_up, ex=ex):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate = gate.clamp(min=None, max=ex.limit)
            up = up.clamp(min=-ex.limit, max=ex.limit)
            return up * (gate * torch.sigmoid(gate * ex.alpha))

        ex._apply_gate = gate_fn
    return bool(_gpt_oss_mlps(model))


def router_bias_dropped(model) -> bool:
    for mlp in _gpt_oss_mlps(model):
        mlp.router.bias.zero_()
    return bool(_gpt_oss_mlps(model))


def softmax_before_topk(model) -> bool:
    """gpt-oss: weights = the top-k of the softmax over all experts (no renormalisation), instead of the
    softmax over the top-k logits (renormalising would make the two equal)."""
    for mlp in _gpt_oss_mlps(model):
        r = mlp.router

        def forward(hidden_states, r=r):
            logits = torch.nn.functional.linear(hidden_states, r.weight, r.bias)
            probs = torch.softmax(logits, dim=-1)
            top, idx = torch.topk(probs, r.top_k, dim=-1)
            return logits, top, idx

        r.forward = forward
    return bool(_gpt_oss_mlps(model))


def expert_biases_dropped(model) -> bool:
    for mlp in _gpt_oss_mlps(model):
        mlp.experts.gate_up_proj_bias.zero_()
        mlp.experts.down_proj_bias.zero_()
    return bool(_gpt_oss_mlps(model))


MUTATIONS: dict[str, Mutation] = {
    "no RoPE": no_rope,
    "RoPE layout flipped": flip_rope_layout,
    "YaRN read as default RoPE": yarn_as_default,
    "YaRN mscale^2 missing": no_mscale,
    "full instead of partial rotary": full_rotary,
    "softmax scale from config head_dim": scale_from_config_head_dim,
    "no softmax scale": no_softmax_scale,
    "norm_topk_prob flipped": flip_norm_topk_prob,
    "correction bias ignored": ignore_correction_bias,
    "q_a/kv_a norm eps = rms_norm_eps": lora_norm_eps_from_config,
    "RMSNorm eps x10": rms_eps_times_10,
    "shared expert dropped": no_shared_expert,
    "q/k/v bias dropped": no_qkv_bias,
    "DSA indexer ignored": no_indexer,
    "DSA indexer k_norm bias ignored": indexer_k_norm_bias_ignored,
    "YaRN truncate flipped": yarn_truncate_flipped,
    "YaRN attention factor dropped": yarn_attention_factor_dropped,
    "attention sinks dropped": no_sinks,
    "sliding mask off (full attention)": sliding_mask_off,
    "SwiGLU clamp removed": swiglu_clamp_removed,
    "SwiGLU (up + 1) dropped": swiglu_without_up_plus_one,
    "router bias dropped": router_bias_dropped,
    "softmax before top-k": softmax_before_topk,
    "expert biases dropped": expert_biases_dropped,
}


def load_f32(fx: Fixture) -> torch.nn.Module:
    """The f32 reference model: the fixture's files read back (FP8 dequantized with the ceil grid) and loaded
    through the same path make_oracles.py used."""
    d = ORACLES_DIR / fx.name
    raw: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        raw.update(load_file(str(f)))
    disk = {}
    for k, v in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            q = v.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
            disk[k] = fp8_block_dequant(q, raw[k + "_scale_inv"].numpy())
        else:
            disk[k] = v.to(torch.float32).numpy()
    cfg = json.loads((d / "config.json").read_text())
    weights, _, _ = apply_recipe(disk, "f32", cfg["num_hidden_layers"])
    return load_reference_model(cfg, weights, Path(_TMP.name), fx.fused)


def main() -> int:
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    fixtures = [f for f in FIXTURES if not args.only or f.name in args.only]
    rows = []
    for fx in fixtures:
        ref = json.loads((ORACLES_DIR / fx.name / "reference" / "f32.json").read_text())
        raw = zstandard.ZstdDecompressor().decompress(
            (ORACLES_DIR / fx.name / "reference" / "f32.logits.zst").read_bytes()
        )
        ref_logits = np.load(io.BytesIO(raw))
        base = run_reference(load_f32(fx), ref["prompt_ids"])
        assert base["generated_ids"] == ref["generated_ids"], f"{fx.name}: f32 reference does not reproduce"
        for label, mutate in MUTATIONS.items():
            model = load_f32(fx)
            saved = {}
            mod = sys.modules[type(model).__module__]
            if hasattr(mod, "apply_rotary_pos_emb"):
                saved["rope"] = mod.apply_rotary_pos_emb
            try:
                with torch.no_grad():
                    applies = mutate(model)
                if not applies:
                    continue
                res = run_reference(model, ref["prompt_ids"])
            finally:
                if "rope" in saved:
                    mod.apply_rotary_pos_emb = saved["rope"]
            greedy = sum(a != b for a, b in zip(res["generated_ids"], ref["generated_ids"], strict=True))
            tf = sum(a != b for a, b in zip(res["tf_argmax"], ref["teacher_forced"]["argmax"], strict=True))
            dlog = float(np.abs(res["last_logits"] - ref_logits[1]).max())
            rows.append((fx.name, label, greedy, tf, dlog))
            verdict = "tokens" if greedy or tf else ("logits" if dlog > 1e-4 else "MISSED")
            print(f"{fx.name:20s} {label:36s} greedy {greedy:2d}/32  tf {tf:2d}/{len(res['tf_argmax'])}  "
                  f"max|dlogit| {dlog:9.2e}  caught by {verdict}", flush=True)  # fmt: skip
    # glm_moe_dsa's index_topk covers the whole sequence by design: ignoring the indexer is a no-op there.
    expected = {("glm_moe_dsa", "DSA indexer ignored"), ("glm_moe_dsa", "DSA indexer k_norm bias ignored")}
    missed = [r for r in rows if not r[2] and not r[3] and r[4] <= 1e-4 and r[:2] not in expected]
    print(f"{len(rows)} mutations, {len(missed)} missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
