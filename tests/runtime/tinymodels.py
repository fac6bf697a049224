"""Test helper: tiny random float checkpoints for options the oracle fixtures do not cover (tied embeddings,
clip_qkv, sliding windows, FP8 storage with a non-128 block, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from colitools.formats.safetensors_io import write_safetensors

H, V, L, NH, NKV, D, E, I = 32, 50, 2, 4, 2, 8, 4, 16


def write_gqa_model(out: Path, model_type: str = "olmoe", *, seed: int = 0, tie: bool = False,
                    dtype: str = "F32", fp8_block: tuple[int, int] | None = None, n_layers: int = L,
                    **config) -> Path:  # fmt: skip
    """An OLMoE- or Mixtral-style model (every layer MoE, ``n_layers`` of them) with random weights (std 0.3)."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (0.3 * rng.standard_normal(shape)).astype(np.float32)

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(V, H), "model.norm.weight": 1 + w(H)}
    if not tie:
        t["lm_head.weight"] = w(V, H)
    for layer in range(n_layers):
        p = f"model.layers.{layer}"
        t[f"{p}.input_layernorm.weight"] = 1 + w(H)
        t[f"{p}.post_attention_layernorm.weight"] = 1 + w(H)
        for name, o in (("q_proj", NH * D), ("k_proj", NKV * D), ("v_proj", NKV * D)):
            t[f"{p}.self_attn.{name}.weight"] = w(o, H)
        t[f"{p}.self_attn.o_proj.weight"] = w(H, NH * D)
        if model_type == "olmoe":
            t[f"{p}.self_attn.q_norm.weight"] = 1 + w(NH * D)
            t[f"{p}.self_attn.k_norm.weight"] = 1 + w(NKV * D)
        t[f"{p}.mlp.gate.weight"] = w(E, H)
        for e in range(E):
            for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                t[f"{p}.mlp.experts.{e}.{name}.weight"] = w(*shape)
    cfg = {"model_type": model_type, "vocab_size": V, "hidden_size": H, "num_hidden_layers": n_layers,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "intermediate_size": I, "num_experts": E,
           "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": tie,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **config}  # fmt: skip
    if fp8_block is not None:
        cfg["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "weight_block_size": list(fp8_block),
        }
        for name in [n for n, a in t.items() if a.ndim == 2 and "embed" not in n and "lm_head" not in n
                     and not n.endswith("mlp.gate.weight")]:  # fmt: skip
            a = t[name]
            br, bc = fp8_block
            gr, gc = -(-a.shape[0] // br), -(-a.shape[1] // bc)
            s = np.full((gr, gc), 0.01, dtype=np.float32) * (
                1 + np.arange(gr * gc, dtype=np.float32).reshape(gr, gc)
            )
            full = np.repeat(np.repeat(s, br, 0), bc, 1)[: a.shape[0], : a.shape[1]]
            t[name] = (a / full).astype(ml_dtypes.float8_e4m3fn)
            t[name + "_scale_inv"] = s
    elif dtype == "BF16":
        t = {k: a.astype(ml_dtypes.bfloat16) for k, a in t.items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    write_safetensors(out / "model.safetensors", t)
    return out
