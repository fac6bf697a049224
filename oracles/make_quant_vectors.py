"""Producer test vectors for the natively quantized source decoders (docs/FORMATS.md §5).

Run in the oracle venv (torch, transformers 5.24.0, compressed-tensors), never in CI:

    .oracle-venv/bin/python oracles/make_quant_vectors.py

For each source encoding it writes ``oracles/quant_vectors/<kind>.safetensors``: the source bytes exactly as the
checkpoint stores them plus ``expect`` = the PRODUCER's own decoded float32 values (and, where the producer
computes in a narrower dtype, that dtype). colitools is never imported here: every value comes from the
producer. ``tests/formats/test_source_decoders_producers.py`` decodes the committed bytes with colitools and
compares bit for bit.

* MXFP4: ``transformers.integrations.mxfp4._convert_moe_packed_tensors(blocks, scales, dtype=float32)`` (the
  gpt-oss dequantization; it returns the stack transposed, ``[E, I, O]``, as transformers' float stacks are).
* INT4 pack-quantized: ``compressed_tensors`` ``PackedQuantizationCompressor.compress`` of random float weights
  (W4A16 group scheme, symmetric and asymmetric, scales computed by compressed-tensors' own observer math),
  then ``.decompress``; float32 scales (computation in float32) and bfloat16 scales (Kimi's, computation in
  bfloat16).
* MXFP8: ``transformers.integrations.finegrained_fp8.Fp8Dequantize._dequantize_one`` with E8M0 uint8 scales.
* NVFP4: compressed-tensors' ``unpack_fp4_from_uint8`` (float32) and its ``_dequantize`` with
  ``global_scale = 1 / scale_2`` (compressed-tensors divides by a global scale where modelopt multiplies by
  ``scale_2``; ``scale_2`` is a power of two here so that both orders are the same exact product).
* MXFP4 pack-quantized (Kimi K3's experts): ``compressed_tensors`` ``MXFP4PackedCompressor.compress`` of random
  float weights (its ``MXFP4`` preset scheme, scales by its own ``calculate_qparams``), then every E8M0 byte
  written into the scales, and ``.decompress`` (bfloat16, its compute dtype) of the result. Its own generator, so
  the vectors above stay byte-identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent / "quant_vectors"
G = torch.Generator().manual_seed(11)


def rint(lo: int, hi: int, shape, dtype=torch.uint8) -> torch.Tensor:
    return torch.randint(lo, hi + 1, shape, generator=G, dtype=torch.int64).to(dtype)


def mxfp4() -> dict[str, torch.Tensor]:
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors

    E, O, B = 2, 48, 3
    blocks = rint(0, 255, (E, O, B, 16))
    scales = rint(100, 150, (E, O, B))
    # edge values: every E8M0 byte 0..255 appears (0 = 2^-127 subnormal, 254 = 2^127, 255 = NaN/inf), zero
    # blocks, negative-zero codes (0x88), the max codes (0x77, 0xFF = -6 -6)
    scales.view(-1)[:256] = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    blocks[0, 0, 0] = 0
    blocks[0, 0, 1] = 0x88
    blocks[0, 1, 0] = 0x77
    blocks[0, 1, 1] = 0xFF
    blocks[1, 0, 0] = torch.arange(16, dtype=torch.uint8) * 17  # nibble k, k
    expect = _convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    return {"blocks": blocks, "scales": scales, "expect": expect.contiguous()}


def _int4(symmetric: bool, scale_dtype: torch.dtype, O=16, I=96, g=32) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=g)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    w = torch.randn((O, I), generator=G) * 0.02
    w[0, :g] = 0  # an all-zero group
    groups = w.reshape(O, I // g, g)
    mn, mx = groups.amin(dim=2), groups.amax(dim=2)
    scale, zp = calculate_qparams(mn, mx, args)
    sd = {"weight": w, "weight_scale": scale.to(scale_dtype), "weight_zero_point": zp}
    comp = PackedQuantizationCompressor.compress(dict(sd), scheme)
    dec = PackedQuantizationCompressor.decompress(dict(comp), scheme)
    out = {
        "weight_packed": comp["weight_packed"],
        "weight_scale": comp["weight_scale"],
        "weight_shape": comp["weight_shape"].to(torch.int64),
        "expect": dec["weight"].contiguous(),
    }
    if not symmetric:
        out["weight_zero_point"] = comp["weight_zero_point"]
    return out


def mxfp8() -> dict[str, torch.Tensor]:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    O, I = 8, 96
    q = rint(0, 255, (O, I))
    q[0, :8] = torch.tensor([0x00, 0x80, 0x7E, 0xFE, 0x7F, 0xFF, 0x01, 0x81], dtype=torch.uint8)
    s = rint(110, 140, (O, I // 32))
    s[1] = torch.tensor([0, 254, 255], dtype=torch.uint8)
    s[2] = torch.tensor([1, 127, 200], dtype=torch.uint8)
    op = Fp8Dequantize.__new__(Fp8Dequantize)
    expect = op._dequantize_one(q.view(torch.float8_e4m3fn), s, output_dtype=torch.float32)
    return {"weight": q, "weight_scale": s, "expect": expect.contiguous()}


def nvfp4() -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward_helpers import _dequantize

    O, I = 8, 64
    packed = rint(0, 255, (O, I // 2))
    packed[0, :8] = torch.tensor([0x00, 0x88, 0x77, 0xFF, 0x10, 0x01, 0x80, 0x08], dtype=torch.uint8)
    sb = rint(0x08, 0x7E, (O, I // 16))  # finite positive e4m3 (subnormals 0x01..0x07 in row 1)
    sb[1] = torch.tensor([0x01, 0x07, 0x7E, 0x00], dtype=torch.uint8)
    scale_2 = torch.tensor(2.0**-9, dtype=torch.float32)
    x = unpack_fp4_from_uint8(packed, O, I, dtype=torch.float32)
    s = sb.view(torch.float8_e4m3fn).to(torch.float32).repeat_interleave(16, dim=1)
    expect = _dequantize(x, s, global_scale=1.0 / scale_2, dtype=torch.float32)
    return {"weight": packed, "weight_scale": sb, "weight_scale_2": scale_2, "codes_f32": x, "expect": expect}


def mxfp4_pack() -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4
    from compressed_tensors.quantization.utils import calculate_qparams

    g = torch.Generator().manual_seed(28)
    scheme = QuantizationScheme(targets=["Linear"], **MXFP4)
    O, I = 48, 192
    w = torch.randn((O, I), generator=g) * 0.05
    w[0, :32] = 0  # an all-zero block
    groups = w.reshape(O, I // 32, 32)
    scale, zp = calculate_qparams(groups.amin(dim=2), groups.amax(dim=2), scheme.weights)
    comp = MXFP4PackedCompressor.compress(
        {"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme
    )
    computed = comp["weight_scale"].clone()
    s = comp["weight_scale"]
    s.view(-1)[:256] = torch.arange(256, dtype=torch.int64).to(torch.uint8)  # every E8M0 byte (0xFF: NaN)
    comp["weight_packed"][1, :16] = torch.arange(16, dtype=torch.uint8) * 17  # nibble k, k
    dec = MXFP4PackedCompressor.decompress(dict(comp), scheme)
    return {"weight_packed": comp["weight_packed"], "weight_scale": s, "computed_scale": computed,
            "expect": dec["weight"].contiguous()}  # fmt: skip


def int4_checkpoint(folder: Path) -> None:
    """A tiny deepseek_v3-like checkpoint whose routed experts are compressed by compressed-tensors itself
    (``PackedQuantizationCompressor``, W4A16 symmetric group 32, bfloat16 scales as Kimi-K2-Thinking ships
    them), with its ``quantization_config`` from compressed-tensors' own ``QuantizationConfig``; ``expect``:
    the producer's decompressed expert weights (bfloat16, its compute dtype) next to it."""
    import json

    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    H, INTER, E, V, g = 64, 32, 2, 96, 32
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=g)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    bf = torch.bfloat16
    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": (torch.randn((V, H), generator=G) * 0.05).to(bf),
        "lm_head.weight": (torch.randn((V, H), generator=G) * 0.05).to(bf),
        "model.norm.weight": torch.ones(H, dtype=bf),
    }
    p = "model.layers.0"
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        t[f"{p}.self_attn.{proj}.weight"] = (torch.randn((H, H), generator=G) * 0.05).to(bf)
    t[f"{p}.mlp.gate.weight"] = (torch.randn((E, H), generator=G) * 0.05).to(bf)
    t[f"{p}.input_layernorm.weight"] = torch.ones(H, dtype=bf)
    t[f"{p}.post_attention_layernorm.weight"] = torch.ones(H, dtype=bf)
    expect: dict[str, torch.Tensor] = {}
    for e in range(E):
        for proj, (O, I) in (("gate_proj", (INTER, H)), ("up_proj", (INTER, H)), ("down_proj", (H, INTER))):
            base = f"{p}.mlp.experts.{e}.{proj}"
            w = (torch.randn((O, I), generator=G) * 0.05).to(bf)
            groups = w.float().reshape(O, I // g, g)
            scale, zp = calculate_qparams(groups.amin(dim=2), groups.amax(dim=2), args)
            sd = {"weight": w, "weight_scale": scale.to(bf), "weight_zero_point": zp}
            comp = PackedQuantizationCompressor.compress(dict(sd), scheme)
            for k in ("weight_packed", "weight_scale", "weight_shape"):
                t[f"{base}.{k}"] = comp[k].contiguous()
            expect[f"{base}.weight"] = PackedQuantizationCompressor.decompress(dict(comp), scheme)["weight"]
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized").model_dump(
        exclude_none=True
    )
    qc["quant_method"] = "compressed-tensors"
    cfg = {"model_type": "deepseek_v3", "hidden_size": H, "vocab_size": V, "num_hidden_layers": 1,
           "n_routed_experts": E, "moe_intermediate_size": INTER, "num_experts_per_tok": 1,
           "quantization_config": qc}  # fmt: skip
    folder.mkdir(exist_ok=True)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    save_file({k: v.contiguous() for k, v in expect.items()}, str(folder / "expect.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, default=str) + "\n")
    print(f"{folder.name}: {sum(v.numel() for v in expect.values())} producer-decoded expert values")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    import compressed_tensors
    import transformers

    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "compressed_tensors": compressed_tensors.__version__}  # fmt: skip
    vectors = {
        "mxfp4": mxfp4(),
        "int4_sym_f32": _int4(True, torch.float32),
        "int4_sym_bf16": _int4(True, torch.bfloat16),
        "int4_asym_f32": _int4(False, torch.float32),
        "mxfp8": mxfp8(),
        "nvfp4": nvfp4(),
        "mxfp4_pack": mxfp4_pack(),
    }
    for name, tensors in vectors.items():
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        save_file(tensors, str(OUT / f"{name}.safetensors"), metadata=meta)
        e = tensors["expect"]
        print(f"{name}: {e.numel()} values ({e.dtype}), nan {int(torch.isnan(e.float()).sum())}")
    int4_checkpoint(OUT / "int4_pack_quantized")  # inside quant_vectors/: not a model-type fixture folder


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
