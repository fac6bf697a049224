"""A tiny Qwen3-VL-MoE FP8 checkpoint as Qwen's ``*-FP8`` releases ship it (issue 25: Qwen3-VL-30B-A3B-Thinking-FP8,
whose shard listing is in ``bench/published/Qwen3-VL-30B-A3B-Thinking-FP8``), a conversion source with its
producer's own dequantization beside it.

The model is the ``qwen3_vl_moe`` oracle fixture's (its weights rounded to BF16). As in the release: the expert
stacks in the published transposed layout, ``experts.gate_up_proj`` F8_E4M3 ``[E, H, 2I]`` +
``experts.gate_up_proj_scale_inv`` F32 ``[E, H/b, 2I/b]`` and ``experts.down_proj [E, I, H]`` +
``down_proj_scale_inv [E, I/b, H/b]`` (the block grid over each expert's stored ``[in, out]`` matrix), the
attention projections F8_E4M3 with ``weight_scale_inv`` ``[O/b, I/b]``; the router, norms, embeddings, head and
the vision tower BF16; ``quantization_config`` ``{quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
weight_block_size: [b, b]}`` with b = 32 (the release: 128; the fixture's hidden size is 64).

Every FP8 tensor is quantized by transformers' own op (``integrations/finegrained_fp8.Fp8Quantize._quantize_one``,
called directly: the quantizer refuses on-the-fly quantization without a GPU), and ``reference/dequant.safetensors``
holds transformers' own dequantization of each (``Fp8Dequantize._dequantize_one``, float32): what colitools must
decode them to.

    .oracle-venv/bin/python oracles/make_qwen3_vl_moe_fp8.py tests/converters/data/qwen3_vl_moe_fp8
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

BLOCK = 32
SOURCE = Path(__file__).resolve().parent / "qwen3_vl_moe"
FP8_LEAVES = ("experts.gate_up_proj", "experts.down_proj", "q_proj.weight", "k_proj.weight", "v_proj.weight",
              "o_proj.weight")  # fmt: skip


def main(out: Path) -> None:
    quantizer = FineGrainedFP8HfQuantizer(
        transformers.FineGrainedFP8Config(weight_block_size=[BLOCK, BLOCK], activation_scheme="dynamic")
    )
    quantize, dequantize = Fp8Quantize(quantizer), Fp8Dequantize(quantizer)
    tensors = load_file(str(SOURCE / "model.safetensors"))
    stored, reference = {}, {}
    for name, w in sorted(tensors.items()):
        w = w.to(torch.bfloat16)
        if ".language_model." not in name or not name.endswith(FP8_LEAVES):
            stored[name] = w
            continue
        q = quantize._quantize_one(name, w)
        scale_name = next(k for k in q if k != name)
        assert q[name].dtype == torch.float8_e4m3fn and q[scale_name].dtype == torch.float32, name
        want = tuple(w.shape[:-2]) + (w.shape[-2] // BLOCK, w.shape[-1] // BLOCK)
        assert tuple(q[scale_name].shape) == want, (scale_name, q[scale_name].shape)
        stored.update(q)
        reference[name] = dequantize._dequantize_one(q[name], q[scale_name], output_dtype=torch.float32)
        err = (reference[name] - w.float()).abs().max() / w.float().abs().max()
        assert err < 0.1, f"{name}: FP8 quantization is off ({err})"
    config = json.loads((SOURCE / "config.json").read_text())
    config["dtype"] = config["text_config"]["dtype"] = config["vision_config"]["dtype"] = "bfloat16"
    config["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
        "ignored_layers": ["lm_head", "model.visual", "model.language_model.layers.0.mlp.gate"],
    }  # fmt: skip
    if out.exists():
        shutil.rmtree(out)
    (out / "reference").mkdir(parents=True)
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(reference, str(out / "reference" / "dequant.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{out}: {len(stored)} tensors, {len(reference)} FP8 weights ({transformers.__version__})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
