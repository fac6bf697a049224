"""A tiny Llama-4 FP8 checkpoint as Meta's Llama-4-Maverick-17B-128E-Instruct-FP8 ships it (issue 25), a conversion
source with its producer's own dequantization beside it.

The release is compressed-tensors ``float-quantized`` (llm-compressor): FP8 e4m3 weights with one scale per output
channel, activations quantized dynamically per token (so no ``input_scale``), the routed experts stored per expert
(``feed_forward.experts.{E}.{gate,up,down}_proj.weight`` ``[O, I]`` F8_E4M3 + ``.weight_scale`` BF16 ``[O, 1]``: the
fused BF16 stacks are unfused by llm-compressor before quantizing), attention, routers, the vision tower, the
projector and the head left BF16.

The model is the ``llama4`` oracle fixture's (its weights rounded to BF16), its stacks split per expert (gate = the
first I columns of ``gate_up_proj [E, H, 2I]``, transposed). Every ``feed_forward`` linear but the router is
quantized by compressed-tensors' own compressor (``FloatQuantizationCompressor.compress``, the scale
``amax(|row|) / 448`` rounded to BF16), and ``reference/dequant.safetensors`` holds compressed-tensors' own
dequantization of each (``quantization.lifecycle.forward.dequantize`` with the scale widened to float32: the exact
product; the compressor's own ``decompress``, which multiplies in the scale's BF16, is checked to be its rounding).

    .oracle-venv/bin/python oracles/make_llama4_fp8.py tests/converters/data/llama4_fp8
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import compressed_tensors
import torch
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import dequantize
from safetensors.torch import load_file, save_file

SOURCE = Path(__file__).resolve().parent / "llama4"
E4M3_MAX = 448.0
WEIGHTS = dict(num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False, observer="minmax")
ACTIVATIONS = dict(num_bits=8, type="float", strategy="token", symmetric=True, dynamic=True, observer=None)
IGNORE = [
    "re:.*self_attn.*",
    "re:.*router",
    "re:vision_model.*",
    "re:multi_modal_projector.*",
    "language_model.lm_head",
]


def unfused(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fused stacks split per expert, as the release stores them."""
    out = {}
    for name, w in tensors.items():
        if name.endswith("feed_forward.experts.gate_up_proj"):
            base, I = name.removesuffix(".gate_up_proj"), w.shape[2] // 2
            for e in range(w.shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = w[e][:, :I].T.contiguous()
                out[f"{base}.{e}.up_proj.weight"] = w[e][:, I:].T.contiguous()
        elif name.endswith("feed_forward.experts.down_proj"):
            base = name.removesuffix(".down_proj")
            for e in range(w.shape[0]):
                out[f"{base}.{e}.down_proj.weight"] = w[e].T.contiguous()
        else:
            out[name] = w
    return out


def main(out: Path) -> None:
    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(**WEIGHTS),
        input_activations=QuantizationArgs(**ACTIVATIONS),
    )
    stored, reference = {}, {}
    for name, w in sorted(unfused(load_file(str(SOURCE / "model.safetensors"))).items()):
        w = w.to(torch.bfloat16)
        quantized = (
            ".feed_forward." in name and name.endswith(".weight") and ".router." not in name and w.ndim == 2
        )
        if not quantized:
            stored[name] = w
            continue
        scale = (w.float().abs().amax(dim=1, keepdim=True) / E4M3_MAX).to(torch.bfloat16)
        comp = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
        q = comp["weight"]
        assert q.dtype == torch.float8_e4m3fn and comp["weight_scale"].shape == (w.shape[0], 1), name
        base = name.removesuffix(".weight")
        stored[name], stored[base + ".weight_scale"] = q, comp["weight_scale"]
        exact = dequantize(q, comp["weight_scale"].float(), args=scheme.weights, dtype=torch.float32)
        own = FloatQuantizationCompressor.decompress(dict(comp), scheme)["weight"]
        assert torch.equal(own, exact.to(own.dtype)), (
            f"{name}: the compressor's decompress is not the rounding"
        )
        assert (exact - w.float()).abs().max() <= 0.1 * w.float().abs().max(), name
        reference[name] = exact
    config = json.loads((SOURCE / "config.json").read_text())
    for c in (config, config["text_config"], config["vision_config"]):
        c["dtype"] = "bfloat16"
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": WEIGHTS, "input_activations": ACTIVATIONS}},
        "ignore": IGNORE, "version": compressed_tensors.__version__,
    }  # fmt: skip
    if out.exists():
        shutil.rmtree(out)
    (out / "reference").mkdir(parents=True)
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(reference, str(out / "reference" / "dequant.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(
        f"{out}: {len(stored)} tensors, {len(reference)} FP8 weights (compressed-tensors {compressed_tensors.__version__})"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
