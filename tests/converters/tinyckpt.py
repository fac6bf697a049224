"""Generated tiny MoE checkpoints for the converter tests (BF16/F32/FP8 block-scaled, per-expert, fused or
Mixtral names, single file or sharded, optional MTP layer). Returns the source arrays so tests can compute
expected outputs independently of the converter."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from colitools.formats.safetensors_io import write_safetensors

F32 = np.float32
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


@dataclass
class Tiny:
    """Geometry and naming of a generated checkpoint."""

    layers: int = 2
    experts: int = 4
    hidden: int = 64
    inter: int = 32  # expert intermediate size
    vocab: int = 96
    mtp: int = 0  # extra MTP layers (index >= layers)
    dtype: str = "BF16"  # BF16 | F32 | F16 | FP8
    fused: bool = False
    mixtral: bool = False
    shards: int = 1  # 1 = model.safetensors without an index
    seed: int = 0
    block: tuple[int, int] = (128, 128)
    extra: dict = field(default_factory=dict)  # extra tensors name -> array

    def names_2d(self) -> dict[str, tuple[int, int]]:
        H, I, V, E = self.hidden, self.inter, self.vocab, self.experts
        out: dict[str, tuple[int, int]] = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H)}
        for L in range(self.layers + self.mtp):
            p = f"model.layers.{L}"
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[f"{p}.self_attn.{proj}.weight"] = (H, H)
            if self.mixtral:
                out[f"{p}.block_sparse_moe.gate.weight"] = (E, H)
                for e in range(E):
                    q = f"{p}.block_sparse_moe.experts.{e}"
                    out[f"{q}.w1.weight"], out[f"{q}.w3.weight"], out[f"{q}.w2.weight"] = (
                        (I, H),
                        (I, H),
                        (H, I),
                    )
                continue
            out[f"{p}.mlp.gate.weight"] = (E, H)
            out[f"{p}.mlp.shared_experts.gate_proj.weight"] = (I, H)
            out[f"{p}.mlp.shared_experts.up_proj.weight"] = (I, H)
            out[f"{p}.mlp.shared_experts.down_proj.weight"] = (H, I)
            if not self.fused:
                for e in range(E):
                    q = f"{p}.mlp.experts.{e}"
                    out[f"{q}.gate_proj.weight"], out[f"{q}.up_proj.weight"] = (I, H), (I, H)
                    out[f"{q}.down_proj.weight"] = (H, I)
        return out

    def config(self) -> dict:
        cfg = {
            "model_type": "mixtral" if self.mixtral else "deepseek_v3",
            "hidden_size": self.hidden,
            "vocab_size": self.vocab,
            "num_hidden_layers": self.layers,
            "num_nextn_predict_layers": self.mtp,
        }
        if self.mixtral:
            cfg.update(num_local_experts=self.experts, intermediate_size=self.inter)
        else:
            cfg.update(n_routed_experts=self.experts, moe_intermediate_size=self.inter)
        if self.dtype == "FP8":
            cfg["quantization_config"] = {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "activation_scheme": "dynamic",
                "weight_block_size": list(self.block),
            }
        return cfg


def _fp8(rng, shape, block):
    """FP8 e4m3 values and a positive scale grid (ceil grid, partial edge blocks)."""
    q = (rng.standard_normal(shape) * 40).clip(-448, 448).astype(E4M3)
    grid = (-(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
    s = (rng.random(shape[:-2] + grid) * 0.01 + 0.001).astype(F32)
    return q, s


def make_checkpoint(folder: Path, spec: Tiny) -> dict[str, np.ndarray]:
    """Write the checkpoint into ``folder``; return every source tensor (exact dtype) by name."""
    rng = np.random.default_rng(spec.seed)
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    H, I, E = spec.hidden, spec.inter, spec.experts
    float_dtype = {"BF16": BF16, "F32": F32, "F16": np.float16, "FP8": BF16}[spec.dtype]
    for name, shape in spec.names_2d().items():
        fp8 = spec.dtype == "FP8" and ".layers." in name and not name.endswith("gate.weight")
        if fp8:
            q, s = _fp8(rng, shape, spec.block)
            tensors[name], tensors[name + "_scale_inv"] = q, s
        else:
            tensors[name] = (rng.standard_normal(shape) * 0.05).astype(float_dtype)
    for L in range(spec.layers + spec.mtp):
        p = f"model.layers.{L}"
        tensors[f"{p}.input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(float_dtype)
        tensors[f"{p}.post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(
            float_dtype
        )
        if not spec.mixtral:
            tensors[f"{p}.mlp.gate.e_score_correction_bias"] = rng.standard_normal(E).astype(F32)
        if spec.fused:
            for kind, shape in (("gate_up_proj", (E, 2 * I, H)), ("down_proj", (E, H, I))):
                if spec.dtype == "FP8":
                    q, s = _fp8(rng, shape, spec.block)
                    tensors[f"{p}.mlp.experts.{kind}"], tensors[f"{p}.mlp.experts.{kind}_scale_inv"] = q, s
                else:
                    tensors[f"{p}.mlp.experts.{kind}"] = (rng.standard_normal(shape) * 0.05).astype(
                        float_dtype
                    )
    tensors["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(float_dtype)
    tensors.update(spec.extra)
    write_tensors(folder, tensors, spec.shards)
    (folder / "config.json").write_text(json.dumps(spec.config(), indent=2))
    (folder / "generation_config.json").write_text('{"do_sample": false}\n')
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}\n')
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 128}\n')
    (folder / "README.md").write_text("not copied\n")
    return tensors


def write_tensors(folder: Path, tensors: dict[str, np.ndarray], shards: int) -> dict[str, str]:
    """Write ``tensors`` as one ``model.safetensors`` or ``shards`` files + index (cut by name order, so a
    layer's experts end up split over two shards); returns the weight map."""
    from colitools.converters.inventory import natural_key

    names = sorted(tensors, key=natural_key)
    if shards == 1:
        write_safetensors(folder / "model.safetensors", {n: tensors[n] for n in names})
        return dict.fromkeys(names, "model.safetensors")
    per = -(-len(names) // shards)
    weight_map = {}
    for k in range(shards):
        chunk = names[k * per : (k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(folder / fname, {n: tensors[n] for n in chunk})
        weight_map.update(dict.fromkeys(chunk, fname))
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return weight_map
