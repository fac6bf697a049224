#!/usr/bin/env python
"""Regenerate the tiny oracle fixtures and their references (needs torch + transformers; CI never runs this).

    .oracle-venv/bin/python oracles/make_oracles.py            # every fixture
    .oracle-venv/bin/python oracles/make_oracles.py --only olmoe deepseek_v3_fp8

For each fixture this builds a tiny random model with transformers (oracles/README.md "How a fixture is made":
initializer_range 0.2, perturbed norms, correction bias 0.05*N(0,1)), stores it as a normal Hugging Face
folder in the fixture's storage variant (float32, BF16, FP8 block-scaled, MXFP4 / INT4 pack-quantized / NVFP4 /
MXFP8 experts, sharded, fused experts), and, for each
conversion recipe, computes the weights a converted container will hold (encode + decode with
``colitools.formats.registry``, docs/FORMATS.md §5 rules and fallbacks), loads them into transformers in float32 and
records greedy / teacher-forced tokens, margins and logits. Seeds are searched until every greedy step and every
teacher-forced position has a top-1/top-2 logit margin >= 2e-3 and every router decision a margin >= 5e-4,
for every recipe. See oracles/README.md for the layout and the reference JSON schema.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
import transformers
from fixture_io import (
    INT4_GROUP,
    build_tokenizer,
    check_written,
    dump_json,
    fixture_config,
    int4_scheme,
    to_np_f32,
    write_fixture,
    zstd_npy,
)
from fixture_specs import (
    BIAS_NOISE,
    CORRECTION_BIAS_NOISE,
    FINE_GRAINED_FP8,
    FIXTURES,
    MAX_SEED_TRIES,
    MIN_INDEXER_MARGIN,
    MIN_ROUTER_MARGIN,
    MIN_TOKEN_MARGIN,
    NEW_TOKENS,
    NORM_NOISE,
    PROMPT_LEN,
    Fixture,
)
from oracle_recipes import (
    BASE_RECIPES,
    COMPUTED_RECIPES,
    FP8_BLOCK,
    FUSED_RE,
    MXFP4_BLOCKS,
    MXFP4_SCALES,
    NV_SCALE,
    NV_SCALE_2,
    NVFP4_BLOCK,
    RECIPE_OPTIONS,
    RECIPES,
    REFERENCE_OF,
    apply_recipe,
    fp8_block_dequant,
    fp8_block_quantize,
    is_fp8_target,
    mxfp4_dequant,
    mxfp4_quantize,
    mxfp8_quantize,
    nvfp4_quantize,
    target_recipes,
)
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from colitools.formats import reference as fref

ORACLES_DIR = Path(__file__).resolve().parent
SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------------- utilities
def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def text_of(config: dict) -> dict:
    """The text model's config (multimodal families nest it under ``text_config``)."""
    return config.get("text_config") or config


# ------------------------------------------------------------------------------------------ model building
def build_model(fx: Fixture, seed: int, vocab_size: int | None) -> torch.nn.Module:
    """Random model per the oracle rules: init std 0.2, norms += 0.1 N(0,1), biases (linear and gpt-oss expert
    stack biases) 0.2 N(0,1), e_score_correction_bias 0.05 N(0,1)."""
    cfg_kwargs = dict(fx.config)
    if vocab_size is not None:
        cfg_kwargs["vocab_size"] = vocab_size
    cfg = AutoConfig.for_model(fx.model_type, **cfg_kwargs)
    torch.manual_seed(seed)
    if fx.model_class:
        model = getattr(transformers, fx.model_class)._from_config(
            cfg, dtype=torch.float32, attn_implementation="eager"
        )
    else:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            cls = type(module).__name__
            # GLM-5.3's hyper-connection input norm has no weight
            has_weight = getattr(module, "weight", None) is not None
            if ("RMSNorm" in cls or isinstance(module, torch.nn.LayerNorm)) and has_weight:
                module.weight.add_(NORM_NOISE * torch.randn(module.weight.shape, generator=gen))
                if getattr(module, "bias", None) is not None:
                    module.bias.copy_(NORM_NOISE * torch.randn(module.bias.shape, generator=gen))
            elif isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.copy_(BIAS_NOISE * torch.randn(module.bias.shape, generator=gen))
            if hasattr(module, "e_score_correction_bias"):
                b = module.e_score_correction_bias
                b.copy_(CORRECTION_BIAS_NOISE * torch.randn(b.shape, generator=gen))
            for stack_bias in ("gate_up_proj_bias", "down_proj_bias"):  # gpt-oss expert stacks (zero-initialised)
                b = getattr(module, stack_bias, None)
                if isinstance(b, torch.nn.Parameter):
                    b.copy_(BIAS_NOISE * torch.randn(b.shape, generator=gen))
        perturb_family(model, gen)
        if fx.latent_scale is not None:
            rank = model.config.kv_lora_rank
            for module in model.modules():
                if hasattr(module, "kv_a_proj_with_mqa"):
                    module.kv_a_proj_with_mqa.weight[:rank].mul_(fx.latent_scale)
                    if getattr(module, "q_a_proj", None) is not None:
                        module.q_a_proj.weight.mul_(fx.latent_scale)
        for pattern, (how, std) in fx.param_noise.items():
            hits = [p for n, p in model.named_parameters() if re.search(pattern, n)]
            assert hits, f"{fx.name}: param_noise {pattern!r} matches no parameter"
            for p in hits:
                noise = std * torch.randn(p.shape, generator=gen)
                p.copy_(noise) if how == "set" else p.add_(noise)
    model.eval()
    return model


SINK_NOISE = 0.5  # attention sinks (zero-initialised): per-head logits that matter
POSITION_BIAS_NOISE = 0.5  # compressor / indexer position biases (`ape`, zero-initialised)
HC_NOISE = 0.1  # hyper-connection bases (zeros) and scales (ones); Inkling global_scale, L2-clip scales (ones)
CONV_NOISE = 0.2  # Inkling-2 dynamic short convolutions' static taps (zeros)
ATTN_RES_NOISE = 0.5  # Inkling-2 block attention-residual queries (zeros: uniform mixing)


def perturb_family(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Parameters transformers initialises to constants (zeros / ones) that a runtime could get wrong unseen:
    DeepSeek-V4's attention sinks, compressor position biases, hyper-connection bases and scales get noise, and
    its hash routers' ``tid2eid`` (zeros: "real values come from the checkpoint") a random table of ``top_k``
    distinct experts per token id; Inkling's ``global_scale`` and Inkling-2's L2-clip ``scale`` (ones)
    ``1 + 0.1 N(0,1)``; Inkling-2's dynamic-convolution ``static_weight`` ``0.2 N(0,1)`` and attention-residual
    queries ``0.5 N(0,1)`` (zeros)."""
    for module in model.modules():
        cls = type(module).__name__
        if cls == "DeepseekV4HashRouter":
            V, k = module.tid2eid.shape
            rows = [torch.randperm(module.num_experts, generator=gen)[:k] for _ in range(V)]
            module.tid2eid.copy_(torch.stack(rows).to(module.tid2eid.dtype))
        elif cls == "DeepseekV4Attention":
            module.sinks.copy_(SINK_NOISE * torch.randn(module.sinks.shape, generator=gen))
        elif cls in ("DeepseekV4HCACompressor", "DeepseekV4CSACompressor", "DeepseekV4Indexer"):
            b = module.position_bias
            b.copy_(POSITION_BIAS_NOISE * torch.randn(b.shape, generator=gen))
        elif cls == "DeepseekV4HyperConnection":
            module.base.copy_(HC_NOISE * torch.randn(module.base.shape, generator=gen))
            module.scale.copy_(1 + HC_NOISE * torch.randn(module.scale.shape, generator=gen))
        elif cls == "Inkling2DynamicShortConvolution":
            w = module.static_weight
            w.copy_(CONV_NOISE * torch.randn(w.shape, generator=gen))
        elif cls == "Inkling2BlockAttentionResidual":
            module.query.copy_(ATTN_RES_NOISE * torch.randn(module.query.shape, generator=gen))
        elif cls in ("Inkling2ScaledL2Clip", "Inkling2LogScaledL2Clip"):
            module.scale.copy_(1 + HC_NOISE * torch.randn(module.scale.shape, generator=gen))
        elif cls.startswith("Inkling") and isinstance(getattr(module, "global_scale", None), torch.nn.Parameter):
            module.global_scale.copy_(1 + HC_NOISE * torch.randn(module.global_scale.shape, generator=gen))
        elif cls == "DeepseekV4HyperHead":
            module.hc_base.copy_(HC_NOISE * torch.randn(module.hc_base.shape, generator=gen))
            module.hc_scale.copy_(1 + HC_NOISE * torch.randn(module.hc_scale.shape, generator=gen))


def published_layout(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Expert stacks saved by rows (transformers 5.24's Qwen3-VL-MoE: ``gate_up_proj [E, 2I, H]``, ``down_proj
    [E, H, I]``) in the published layout ``[E, H, 2I]`` / ``[E, I, H]``; every other tensor as it is."""
    return {n: np.ascontiguousarray(w.transpose(0, 2, 1)) if FUSED_RE.match(n) else w for n, w in tensors.items()}


def disk_tensors(
    model: torch.nn.Module, fused: bool, tmp: Path
) -> tuple[dict[str, np.ndarray], dict, dict | None]:
    """The tensors transformers writes for this model (per-expert or fused naming), as float32 numpy, plus the
    config.json and generation_config.json it writes."""
    out = tmp / "saved"
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, save_original_format=not fused)
    files = sorted(out.glob("*.safetensors"))
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            tensors[k] = to_np_f32(v) if v.is_floating_point() else v.numpy().copy()  # I64 tid2eid as is
    config = json.loads((out / "config.json").read_text())
    gen_path = out / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else None
    return tensors, config, gen


# Natively quantized per-expert storage variants (int4 / nvfp4 / mxfp8): the routed experts' 2-D weights.
PER_EXPERT_RE = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")


def int4_pack_quantized(w: np.ndarray, g: int = INT4_GROUP) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """compressed-tensors itself (``PackedQuantizationCompressor.compress``, its own ``calculate_qparams``
    observer math, W4A16 symmetric group ``g``, BF16 scales as Kimi-K2-Thinking ships them) compresses ``w``;
    the source values are compressed-tensors' own ``decompress`` of those bytes with the BF16 scales widened
    exactly to float32 (its float32 computation: ``q * s`` exactly; docs/FORMATS.md §8). Its BF16 computation
    (the scale dtype as stored) must give the BF16 rounding of exactly those values, and colitools' numpy
    decoder the same values."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = int4_scheme(g)
    args = scheme.weights
    O, I = w.shape
    t = torch.from_numpy(w.copy())
    groups = t.reshape(O, I // g, g)
    scale, zp = calculate_qparams(groups.amin(dim=2), groups.amax(dim=2), args)
    sd = {"weight": t, "weight_scale": scale.to(torch.bfloat16), "weight_zero_point": zp}
    comp = {k: v.contiguous() for k, v in PackedQuantizationCompressor.compress(dict(sd), scheme).items()}
    assert set(comp) == {"weight_packed", "weight_scale", "weight_shape"}, sorted(comp)
    wide = dict(comp, weight_scale=comp["weight_scale"].to(torch.float32))
    src = PackedQuantizationCompressor.decompress(wide, scheme)["weight"].to(torch.float32).numpy()
    bf = PackedQuantizationCompressor.decompress(dict(comp), scheme)["weight"]
    assert torch.equal(bf, torch.from_numpy(src).to(bf.dtype)), "compressed-tensors' BF16 decompress differs"
    mine = fref.decode_pack_quantized(comp["weight_packed"].numpy(), to_np_f32(comp["weight_scale"]), I, g)
    assert np.array_equal(mine, src), "colitools' INT4 decode differs from compressed-tensors' decompress"
    return comp, np.ascontiguousarray(src, dtype=np.float32)


def nvfp4_producer_decode(
    packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray, O: int, I: int
) -> np.ndarray:
    """compressed-tensors' NVFP4 decoder (``unpack_fp4_from_uint8`` + ``_dequantize`` with ``global_scale =
    1 / scale_2``, float32): the independent check of the numpy packing."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward_helpers import _dequantize

    x = unpack_fp4_from_uint8(torch.from_numpy(packed.copy()), O, I, dtype=torch.float32)
    s = torch.from_numpy(scale.view(np.uint8).copy()).view(torch.float8_e4m3fn).to(torch.float32)
    s = s.repeat_interleave(NVFP4_BLOCK, dim=1)
    g = 1.0 / torch.tensor(float(scale_2), dtype=torch.float32)
    return _dequantize(x, s, global_scale=g, dtype=torch.float32).numpy()


def mxfp8_producer_decode(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """transformers' MXFP8 decoder (``integrations/finegrained_fp8.Fp8Dequantize._dequantize_one``, E8M0 U8
    scales): the independent check of the numpy packing."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    op = Fp8Dequantize.__new__(Fp8Dequantize)
    t = torch.from_numpy(q.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    return op._dequantize_one(t, torch.from_numpy(scale.copy()), output_dtype=torch.float32).numpy()


def fine_grained_fp8_stack(name: str, w: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """transformers' own FP8 quantizer op (``integrations/finegrained_fp8.Fp8Quantize._quantize_one``, what its
    ``FineGrainedFP8Config(weight_block_size=[1, 32], scale_fmt="ue8m0")`` quantization runs, here called on CPU:
    the quantizer itself refuses on-the-fly quantization without a GPU) quantizes an expert stack ``[E, A, B]``:
    per row and 32 inputs ``inv = 2^ceil(log2(amax / 448))``, ``q = e4m3(clamp(w / inv))``. Its F8_E8M0 scales are
    stored as their bytes (U8), as Inkling-2 ships them (transformers' ``_process_model_after_weight_loading``:
    "MXFP8 checkpoints (e.g. Inkling2) save their ue8m0 scales as bytes"). Returns (codes, scale bytes, the source
    values: transformers' ``Fp8Dequantize._dequantize_one`` of those bytes, checked equal to colitools' decoder)."""
    from transformers.integrations.finegrained_fp8 import Fp8Quantize
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    quantizer = FineGrainedFP8HfQuantizer(transformers.FineGrainedFP8Config(**FINE_GRAINED_FP8))
    out = Fp8Quantize(quantizer)._quantize_one(name, torch.from_numpy(w.copy()))
    q, inv = out[name], out[name + "_scale_inv"]
    assert q.dtype == torch.float8_e4m3fn and inv.dtype == torch.float8_e8m0fnu, (q.dtype, inv.dtype)
    scale = inv.view(torch.uint8).contiguous()
    E, A, B = w.shape
    assert tuple(scale.shape) == (E, A, B // 32), tuple(scale.shape)
    codes = q.view(torch.uint8).numpy()
    src = mxfp8_producer_decode(codes, scale.numpy())
    mine = fref.decode_mxfp8(codes.reshape(E * A, B), scale.numpy().reshape(E * A, -1), B).reshape(E, A, B)
    assert np.array_equal(src, mine), f"{name}: colitools' MXFP8 decode differs from transformers'"
    return q, scale, np.ascontiguousarray(src, dtype=np.float32)


def fp8_expert(name: str, w: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """A routed expert of Qwen3.8 as published (colibri's ``c/tools/make_qwen38_tiny.py --fp8-experts``): e4m3
    codes per 128x128 block with a BF16 ``weight_scale_inv`` (``oracle_recipes.fp8_block_quantize``). Returns
    (codes, scales, the source values: torch's own e4m3 and BF16 widening, ``f32(q) * f32(s)`` per block, checked
    equal to this package's ceil-grid dequant and to colitools' decoder)."""
    q, s = fp8_block_quantize(w, ml_dtypes.bfloat16)
    codes = torch.from_numpy(q.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    scale = torch.from_numpy(s.view(np.uint16).copy()).view(torch.bfloat16)
    M, N = w.shape
    wide = scale.to(torch.float32).repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:M, :N]
    src = (codes.to(torch.float32) * wide).numpy()
    assert np.array_equal(src, fp8_block_dequant(q, s)), f"{name}: FP8 dequant disagrees with torch's"
    ref = fref.dequant_fp8_block(q.view(np.uint8), s, (FP8_BLOCK, FP8_BLOCK))
    assert np.array_equal(src, ref), f"FP8 dequant disagrees with colitools.formats.reference: {name}"
    assert np.abs(src - w).max() <= 0.07 * np.abs(w).max(), f"{name}: FP8 packing is off"
    return codes, scale, np.ascontiguousarray(src, dtype=np.float32)


def store(fx: Fixture, disk: dict[str, np.ndarray]) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """Apply the storage variant. Returns (tensors to write, in their stored dtype; the exact float32 values
    they hold, by the weight names)."""
    stored: dict[str, torch.Tensor] = {}
    source: dict[str, np.ndarray] = {}
    for name, w in disk.items():
        if not np.issubdtype(w.dtype, np.floating):  # rule 0 tensors (DeepSeek-V4's I64 tid2eid): as is
            stored[name] = torch.from_numpy(w.copy())
            source[name] = w
            continue
        if fx.storage in ("int4", "nvfp4", "mxfp8") and PER_EXPERT_RE.search(name):
            O, I = w.shape
            if fx.storage == "int4":  # compressed-tensors pack-quantized: weight_packed / _scale / _shape
                comp, src = int4_pack_quantized(w)
                base = name.removesuffix(".weight")
                for k, v in comp.items():
                    stored[f"{base}.{k}"] = v
            elif fx.storage == "nvfp4":  # modelopt: <n> U8 + <n>_scale F8_E4M3 + <n>_scale_2 F32
                packed, s, s2 = nvfp4_quantize(w)
                stored[name] = torch.from_numpy(packed)
                stored[name + NV_SCALE] = torch.from_numpy(s.view(np.uint8).copy()).view(torch.float8_e4m3fn)
                stored[name + NV_SCALE_2] = torch.from_numpy(s2.copy())
                src = nvfp4_producer_decode(packed, s, s2, O, I)
                assert np.array_equal(src, fref.decode_nvfp4(packed, s.view(np.uint8), s2, I)), name
            else:  # MXFP8: <n> F8_E4M3 + <n>_scale U8 (E8M0)
                q, s = mxfp8_quantize(w)
                stored[name] = torch.from_numpy(q.view(np.uint8).copy()).view(torch.float8_e4m3fn)
                stored[name + NV_SCALE] = torch.from_numpy(s)
                src = mxfp8_producer_decode(q, s)
                assert np.array_equal(src, fref.decode_mxfp8(q.view(np.uint8), s, I)), name
            assert np.isfinite(src).all() and src.dtype == np.float32, name
            assert np.abs(src - w).max() <= 0.5 * np.abs(w).max(), f"{name}: {fx.storage} packing is off"
            source[name] = np.ascontiguousarray(src)
            continue
        if fx.storage == "fp8-experts" and PER_EXPERT_RE.search(name):  # Qwen3.8: <n> F8_E4M3 + <n>_scale_inv BF16
            stored[name], stored[name + "_scale_inv"], source[name] = fp8_expert(name, w)
            continue
        if fx.storage == "mxfp8-stacks" and FUSED_RE.match(name):  # Inkling-2: <n> F8_E4M3 + <n>_scale U8
            stored[name], stored[name + NV_SCALE], source[name] = fine_grained_fp8_stack(name, w)
            assert np.abs(source[name] - w).max() <= 0.1 * np.abs(w).max(), f"{name}: MXFP8 packing is off"
            continue
        if fx.storage == "mxfp4" and FUSED_RE.match(name):  # gpt-oss MXFP4: the codes are by rows [E, O, I]
            rows = w.transpose(0, 2, 1) if fx.expert_orientation == "transposed-interleaved" else w
            blocks, scales = mxfp4_quantize(np.ascontiguousarray(rows))
            stored[name + MXFP4_BLOCKS] = torch.from_numpy(blocks)
            stored[name + MXFP4_SCALES] = torch.from_numpy(scales)
            deq = mxfp4_dequant(blocks, scales)
            source[name] = np.ascontiguousarray(
                deq.transpose(0, 2, 1) if fx.expert_orientation == "transposed-interleaved" else deq
            )
            continue
        if fx.storage == "f32":
            stored[name] = torch.from_numpy(w.copy())
            source[name] = w
        elif fx.storage in ("bf16", "mxfp4", "int4", "nvfp4", "mxfp8", "mxfp8-stacks", "fp8-experts") or (
            fx.storage == "fp8" and not is_fp8_target(name, w.shape)
        ):
            if fx.storage in ("fp8", "int4") and name.endswith("e_score_correction_bias"):
                stored[name] = torch.from_numpy(w.copy())  # F32 in DeepSeek-V3's checkpoints
                source[name] = w
                continue
            t = torch.from_numpy(w.copy()).to(torch.bfloat16)
            stored[name] = t
            source[name] = to_np_f32(t)
            # ml_dtypes agrees with torch on round-to-nearest-even
            assert np.array_equal(w.astype(ml_dtypes.bfloat16).astype(np.float32), source[name])
        elif fx.storage == "fp8":
            q, s = fp8_block_quantize(w)
            stored[name] = torch.from_numpy(q.view(np.uint8).copy()).view(torch.float8_e4m3fn)
            stored[name + "_scale_inv"] = torch.from_numpy(s.copy())
            deq = fp8_block_dequant(q, s)
            ref = fref.dequant_fp8_block(q.view(np.uint8), s, (FP8_BLOCK, FP8_BLOCK))
            assert np.array_equal(deq, ref), f"FP8 dequant disagrees with colitools.formats.reference: {name}"
            source[name] = deq
        else:
            raise ValueError(fx.storage)
    return stored, source


def check_transformers_reads_mxfp4(fx: Fixture, out_dir: Path, source: dict[str, np.ndarray]) -> None:
    """The independent check of an MXFP4 fixture: transformers' own loader (``Mxfp4Config(dequantize=True)``,
    which CPU loading uses anyway: integrations/mxfp4.py ``Mxfp4Dequantize``) reads the written folder into
    exactly the float32 values the references are computed on (and that ``native`` must keep)."""
    loader = getattr(transformers, fx.model_class) if fx.model_class else AutoModelForCausalLM
    model, info = loader.from_pretrained(
        out_dir, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32,
        output_loading_info=True,
    )  # fmt: skip
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{fx.name}: transformers' MXFP4 loading reported {bad}"
    state = model.state_dict()
    for name, want in source.items():
        got = state[name].detach().to(torch.float32).numpy()
        assert got.shape == want.shape and np.array_equal(got, want), (
            f"{fx.name}: transformers reads {name} differently from the fixture's own MXFP4 decode"
        )
    del model


def check_transformers_reads_fp8(fx: Fixture, out_dir: Path, config: dict, source: dict[str, np.ndarray],
                                 tmp: Path) -> None:  # fmt: skip
    """The independent check of an FP8-declared MXFP8 fixture: transformers' own loader (``from_pretrained`` of the
    written folder with its ``quantization_config``) reads the stacks into its FP8 expert modules (``FP8Experts``:
    codes ``gate_up_proj`` + F8_E8M0 ``gate_up_proj_scale_inv``, the family's conversion de-interleaving both), and
    their dequantization by transformers' ``Fp8Dequantize`` equals, parameter for parameter, the model loaded from
    the float32 source values the references are computed on.

    It loads as on a GPU (the quantizer's environment check skipped): on CPU transformers 5.24 dequantizes while
    loading, and there Inkling-2's stacks are read wrong (its inkling2 converters keep MXFP8 experts quantized:
    ``w13_weight`` gets no dequantize op, ``w13_weight_scale`` is left over as an unexpected key, and
    ``gate_up_proj`` holds the bare e4m3 codes without their scales)."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    loader = getattr(transformers, fx.model_class) if fx.model_class else AutoModelForCausalLM
    check = FineGrainedFP8HfQuantizer.validate_environment
    FineGrainedFP8HfQuantizer.validate_environment = lambda self, *args, **kwargs: None
    try:
        model, info = loader.from_pretrained(out_dir, dtype=torch.float32, output_loading_info=True)
    finally:
        FineGrainedFP8HfQuantizer.validate_environment = check
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{fx.name}: transformers' FP8 loading reported {bad}"
    got = model.state_dict()
    scales = {n for n in got if n.endswith("_scale_inv")}
    assert scales and all(got[n].dtype == torch.float8_e8m0fnu for n in scales), sorted(scales)
    dequant = Fp8Dequantize.__new__(Fp8Dequantize)
    for n in scales:
        q = got.pop(n.removesuffix("_scale_inv"))
        assert q.dtype == torch.float8_e4m3fn, (n, q.dtype)
        got[n.removesuffix("_scale_inv")] = dequant._dequantize_one(q, got.pop(n), output_dtype=torch.float32)
    want = load_reference_model(config, source, tmp, fx.fused, fx.model_class).state_dict()
    assert set(got) == set(want), sorted(set(got) ^ set(want))[:5]
    for name, t in want.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], t), (
            f"{fx.name}: transformers reads {name} differently from the fixture's own MXFP8 decode"
        )
    del model


def native_tensors(stored: dict[str, torch.Tensor]) -> dict[str, str]:
    """The source tensors a container format holds exactly (docs/FORMATS.md §5 ``native``), name -> format:
    gpt-oss MXFP4 stacks -> mxfp4, symmetric INT4 pack-quantized group g -> int4-g{g}, FP8 128x128 blocks -> fp8
    (``fp8-e4m3-b128``). NVFP4 / MXFP8 have none."""
    out = {n.removesuffix(MXFP4_BLOCKS): "mxfp4" for n in stored if n.endswith(MXFP4_BLOCKS)}
    # FP8 with its _scale_inv on 128x128 blocks (every FP8-block fixture's): fp8-e4m3-b128, the source's bytes
    out.update({n: "fp8" for n, t in stored.items() if t.dtype == torch.float8_e4m3fn and n + "_scale_inv" in stored})
    int4 = f"int4-g{INT4_GROUP}"
    out.update({n.removesuffix("_packed"): int4 for n in stored if n.endswith(".weight_packed")})
    return out


def decoded_tensors(stored: dict[str, torch.Tensor]) -> dict[str, str]:
    """Natively quantized source tensors no container format holds exactly, name -> kind: NVFP4 (``<n>_scale_2``
    next to it), MXFP8 (F8_E4M3 with a U8 ``<n>_scale``)."""
    out = {n: "NVFP4" for n in stored if n + NV_SCALE_2 in stored}
    out.update({n: "MXFP8" for n, t in stored.items() if t.dtype == torch.float8_e4m3fn and n + NV_SCALE in stored
                and stored[n + NV_SCALE].dtype == torch.uint8})  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------ running models
def load_reference_model(
    config: dict, weights: dict[str, np.ndarray], tmp: Path, fused: bool, model_class: str | None = None,
    published_stacks: bool = False,
) -> torch.nn.Module:
    """Load float32 weights (on-disk names) into transformers through its own loader (name conversion included).
    ``published_stacks``: the expert stacks are given transposed (``published_layout``), transformers saves them
    back by rows."""
    d = tmp / "load"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    cfg["dtype"] = "float32"
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()},
        str(d / "model.safetensors"),
        metadata={"format": "pt"},
    )
    loader = getattr(transformers, model_class) if model_class else AutoModelForCausalLM
    model, info = loader.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"} or (info.get("error_msgs") or None)
    if bad:
        raise RuntimeError(f"loading the reference model reported {bad}")
    # Round trip: what transformers holds must be exactly what we gave it.
    back = tmp / "back"
    if back.exists():
        shutil.rmtree(back)
    model.save_pretrained(back, save_original_format=not fused)
    again: dict[str, np.ndarray] = {}
    for f in back.glob("*.safetensors"):
        again.update({k: to_np_f32(v) if v.is_floating_point() else v.numpy().copy()
                      for k, v in load_file(str(f)).items()})  # fmt: skip
    assert set(again) == set(weights), sorted(set(again) ^ set(weights))[:5]
    if published_stacks:
        again = published_layout(again)
    for k, v in weights.items():
        assert np.array_equal(again[k], v), f"weight {k} changed on load"
    model.eval()
    return model


class RouterProbe:
    """Forward hooks on the routers (and DSA indexers) recording the smallest decision margin seen."""

    def __init__(self, model: torch.nn.Module):
        self.min_router = math.inf
        self.min_indexer = math.inf
        self.router_calls = 0
        self.indexer_selections = 0
        self.handles = []
        for _, module in model.named_modules():
            cls = type(module).__name__
            if cls.endswith(("TopKRouter", "TopkRouter")) and hasattr(module, "n_shared_experts"):
                self.handles.append(module.register_forward_hook(self._sigmoid_router_hook))  # Inkling
            elif cls.endswith(("TopKRouter", "TopkRouter")) and hasattr(module, "score_fn"):
                self.handles.append(module.register_forward_hook(self._scored_router_hook))  # DeepSeek-V4
            elif cls.endswith(("TopKRouter", "TopkRouter")):
                self.handles.append(module.register_forward_hook(self._router_hook))
            elif cls.endswith("QSAIndexer"):  # Qwen3.8 (Qwen4ExpTextQSAIndexer): mean-pooled key blocks
                self.handles.append(module.register_forward_hook(self._qsa_indexer_hook))
            elif cls == "Llama4Router":
                self.handles.append(module.register_forward_hook(self._llama4_router_hook))
            elif cls.endswith("Indexer") and hasattr(module, "index_kpool"):  # GLM-5.3: pooled keys
                self.handles.append(module.register_forward_hook(self._kpool_indexer_hook, with_kwargs=True))
            elif cls == "DeepseekV4Indexer":  # its scorer's output is the index score; positions from here
                self.handles.append(module.register_forward_pre_hook(self._v4_indexer_positions))
                self.handles.append(module.scorer.register_forward_hook(self._v4_scorer_hook(module)))
            elif cls.endswith("Indexer"):
                self.handles.append(module.register_forward_hook(self._indexer_hook))

    def close(self) -> None:
        for h in self.handles:
            h.remove()

    def _router_hook(self, module, args, output) -> None:
        logits = output[0].detach().to(torch.float32).reshape(-1, output[0].shape[-1])
        k = module.top_k
        self.router_calls += 1
        if hasattr(module, "e_score_correction_bias"):
            s = logits.sigmoid()
            c = s + module.e_score_correction_bias
            E, G = c.shape[-1], module.num_group
            gscores = c.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
            if module.topk_group < G:
                gs_sorted = gscores.sort(dim=-1, descending=True)[0]
                gm = (gs_sorted[:, module.topk_group - 1] - gs_sorted[:, module.topk_group]).min().item()
                self.min_router = min(self.min_router, gm)
            gidx = gscores.topk(module.topk_group, dim=-1)[1]
            gmask = torch.zeros_like(gscores).scatter_(1, gidx, 1)
            emask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
            masked = c.masked_fill(~emask, float("-inf"))
            if module.topk_group * (E // G) > k:
                srt = masked.sort(dim=-1, descending=True)[0]
                self.min_router = min(self.min_router, (srt[:, k - 1] - srt[:, k]).min().item())
        else:
            p = torch.softmax(logits, dim=-1)
            srt = p.sort(dim=-1, descending=True)[0]
            self.min_router = min(self.min_router, (srt[:, k - 1] - srt[:, k]).min().item())

    def _scored_router_hook(self, module, args, output) -> None:
        # DeepSeek-V4: top-k of score_fn(logits) + e_score_correction_bias (no groups)
        logits = output[0].detach().to(torch.float32).reshape(-1, output[0].shape[-1])
        self.router_calls += 1
        c = module.score_fn(logits) + module.e_score_correction_bias
        srt = c.sort(dim=-1, descending=True)[0]
        k = module.top_k
        self.min_router = min(self.min_router, (srt[:, k - 1] - srt[:, k]).min().item())

    def _sigmoid_router_hook(self, module, args, output) -> None:
        # Inkling: top-k of sigmoid(routed logits) + e_score_correction_bias; output[0] holds the routed rows only
        logits = output[0].detach().to(torch.float32).reshape(-1, output[0].shape[-1])
        self.router_calls += 1
        srt = (logits.sigmoid() + module.e_score_correction_bias.float()).sort(dim=-1, descending=True)[0]
        k = module.top_k
        self.min_router = min(self.min_router, (srt[:, k - 1] - srt[:, k]).min().item())

    def _llama4_router_hook(self, module, args, output) -> None:
        # Llama-4: top-k of the raw logits (output (scores, logits)); the margin in sigmoid space, as the gate
        logits = output[1].detach().to(torch.float32).reshape(-1, output[1].shape[-1])
        self.router_calls += 1
        srt = logits.sigmoid().sort(dim=-1, descending=True)[0]
        k = module.top_k
        self.min_router = min(self.min_router, (srt[:, k - 1] - srt[:, k]).min().item())

    _v4_positions: torch.Tensor | None = None

    def _v4_indexer_positions(self, module, args) -> None:
        self._v4_positions = args[2]  # forward(hidden_states, q_residual, position_ids, cache, layer_idx)

    def _v4_scorer_hook(self, indexer):
        def hook(module, args, output) -> None:
            # DeepseekV4Indexer.forward: query t sees entries w < (t + 1) // rate and keeps the top index_topk
            scores = output.detach().to(torch.float32)  # [B, S, T]
            thresholds = ((self._v4_positions[0] + 1) // indexer.compress_rate).tolist()
            k = indexer.index_topk
            for s, n_visible in enumerate(thresholds):
                if n_visible <= k:
                    continue
                srt = scores[0, s, :n_visible].sort(descending=True)[0]
                self.indexer_selections += 1
                self.min_indexer = min(self.min_indexer, (srt[k - 1] - srt[k]).item())

        return hook

    def _indexer_hook(self, module, args, output) -> None:
        # Recompute the index scores exactly as GlmMoeDsaIndexer / DeepseekV32Indexer.forward do; only the
        # boundary matters. The RoPE is the one the indexer's module calls (looked up now, so a patched one in
        # mutation_check.py is followed): GLM-5 interleaved, DeepSeek-V3.2 half-split.
        hidden_states, q_resid, position_embeddings = args[:3]
        # With a KV cache the indexer sees all earlier keys: keep our own copy of them per layer.
        B, S, _ = hidden_states.shape
        cos, sin = position_embeddings
        mod = sys.modules[type(module).__module__]
        rope_fn = (
            mod.apply_rotary_pos_emb_interleave if type(module).__name__.startswith("GlmMoeDsa")
            else mod.apply_rotary_pos_emb
        )  # fmt: skip

        q = module.wq_b(q_resid).view(B, S, module.n_heads, module.head_dim)
        q_rot, q_pass = torch.split(
            q, [module.qk_rope_head_dim, module.head_dim - module.qk_rope_head_dim], -1
        )
        k = module.k_norm(module.wk(hidden_states)).unsqueeze(2)
        k_rot, k_pass = torch.split(
            k, [module.qk_rope_head_dim, module.head_dim - module.qk_rope_head_dim], -1
        )
        q_rot, k_rot = rope_fn(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], -1)
        k = torch.cat([k_rot, k_pass], -1).squeeze(2)
        if self._kcache is not None:
            layer_keys = self._kcache.setdefault(module.layer_idx, [])
            layer_keys.append(k)
            k = torch.cat(layer_keys, dim=1)
        scores = torch.relu(
            torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * module.softmax_scale
        )
        weights = module.weights_proj(hidden_states).float() * (module.n_heads**-0.5)
        idx = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # [B, S, T]
        T = idx.shape[-1]
        topk = module.index_topk
        for s in range(S):
            pos = T - S + s  # absolute position of this query; keys 0..pos are visible
            visible = idx[0, s, : pos + 1]
            if visible.numel() <= topk:
                continue
            srt, order = visible.sort(descending=True)
            self.indexer_selections += 1
            self.min_indexer = min(self.min_indexer, (srt[topk - 1] - srt[topk]).item())
            # Our recomputation must agree with what transformers selected (unless it is a tie, rejected anyway).
            if srt[topk - 1] - srt[topk] > 1e-5:
                assert set(output[0, s].tolist()) == set(order[:topk].tolist()), (
                    "indexer recomputation differs"
                )

    def _kpool_indexer_hook(self, module, args, kwargs, output) -> None:
        # GLM-5.3-Flash (Glm5NextTextIndexer): the wk keys are pooled in complete groups of index_kpool tokens,
        # weighted per channel by a softmax over the group's tokens of (index_kpool_compress_gate @ x + ape); each
        # query scores the complete pools whose last token it sees and keeps the top index_topk // index_kpool
        # (the incomplete tail pool is always kept). Recomputed here independently; only the pool boundary matters.
        hs, q_resid = kwargs["hidden_states"], kwargs["q_resid"]
        B, S, _ = hs.shape
        assert B == 1 and bool(kwargs["attention_mask"].all()), "no padding in the oracle prompts"
        nh, hd, pool = module.n_heads, module.head_dim, module.index_kpool
        q = module.wq_b(q_resid).view(B, S, nh, hd)[0].float()  # [S, nh, hd]
        k = module.k_norm(module.wk(hs))[0].float()  # [S, hd]
        g = torch.nn.functional.linear(hs, module.index_kpool_compress_gate)[0].float()  # [S, hd]
        if self._kcache is not None:
            keys, gates = self._kcache.setdefault(module.layer_idx, ([], []))
            keys.append(k)
            gates.append(g)
            k, g = torch.cat(keys), torch.cat(gates)
        T = k.shape[0]
        n_pools = T // pool
        if n_pools == 0:
            return
        kp = k[: n_pools * pool].view(n_pools, pool, hd)
        logits = g[: n_pools * pool].view(n_pools, pool, hd) + module.index_kpool_compress_ape.float()
        w = torch.softmax(logits, dim=1)  # per channel, over the pool's tokens
        pooled = (w * kp).sum(dim=1)  # [P, hd]
        scores = torch.relu(torch.einsum("shd,pd->shp", q, pooled) * module.softmax_scale)
        weights = module.weights_proj(hs)[0].float() * nh**-0.5  # [S, nh]
        idx = torch.einsum("sh,shp->sp", weights, scores)  # [S, P]
        select = module.index_topk // pool
        for s in range(S):
            visible = (T - S + s + 1) // pool  # complete pools whose last token this query sees
            if visible <= select:
                continue
            srt, order = idx[s, :visible].sort(descending=True)
            self.indexer_selections += 1
            self.min_indexer = min(self.min_indexer, (srt[select - 1] - srt[select]).item())
            if srt[select - 1] - srt[select] > 1e-5:
                chosen = output[0, s, : select * pool].tolist()
                assert {t // pool for t in chosen if t >= 0} == set(order[:select].tolist()), (
                    "k-pool indexer recomputation differs"
                )

    def _qsa_indexer_hook(self, module, args, output) -> None:
        # Qwen3.8 QSA (Qwen4ExpTextQSAIndexer): one key head; the keys of each complete block of compress_ratio
        # visible tokens are averaged, k_layernorm-ed and rotated at the block's first position; a query scores
        # block b as sum_h relu(q_h . k_b) / sqrt(d) and keeps the top indexer_budget / compress_ratio blocks
        # (the incomplete tail always). Recomputed here independently; only the block boundary matters.
        if getattr(module, "select_all", False):  # mutation_check.py's "QSA indexer selection off"
            return
        hs, (cos, sin) = args[0], args[1]
        B, S, _ = hs.shape
        assert B == 1, "one prompt"
        nh, d = module.index_n_heads, module.index_head_dim
        ratio, select = module.compress_ratio, module.block_topk
        # the module's own RoPE, looked up now: a patched one (mutation_check.py) is followed
        rope = sys.modules[type(module).__module__].apply_rotary_pos_emb
        qk = module.index_qk_proj(hs)[0].float()
        q = module.q_layernorm(qk[:, : nh * d].view(S, nh, d))
        q = rope(q.unsqueeze(0), cos=cos[:, -S:], sin=sin[:, -S:], unsqueeze_dim=2)[0]  # [S, nh, d]
        k = qk[:, nh * d :]  # [S, d], raw (pooled before the norm)
        if self._kcache is not None:
            layer_keys = self._kcache.setdefault(module.layer_idx, [])
            layer_keys.append(k)
            k = torch.cat(layer_keys)
        T = k.shape[0]
        for s in range(S):
            blocks = (T - S + s + 1) // ratio  # complete blocks among the causally visible tokens
            if blocks <= select:
                continue
            pooled = module.k_layernorm(k[: blocks * ratio].view(blocks, ratio, d).mean(dim=1))
            starts = torch.arange(blocks) * ratio
            kb = rope(pooled.unsqueeze(1), cos=cos[0, starts], sin=sin[0, starts]).squeeze(1)  # [blocks, d]
            scores = torch.relu(q[s] @ kb.T).sum(dim=0) / math.sqrt(d)
            srt, order = scores.sort(descending=True)
            self.indexer_selections += 1
            self.min_indexer = min(self.min_indexer, (srt[select - 1] - srt[select]).item())
            if srt[select - 1] - srt[select] > 1e-5:
                kept = output[0, 0, s].nonzero().flatten().tolist()
                assert {t // ratio for t in kept if t < blocks * ratio} == set(order[:select].tolist()), (
                    "QSA indexer recomputation differs"
                )

    _kcache: dict[int, Any] | None = None

    def reset_cache(self, cached: bool) -> None:
        self._kcache = {} if cached else None


def top2_margin(logits: torch.Tensor) -> tuple[int, float]:
    v, i = logits.to(torch.float32).topk(2)
    return int(i[0]), float(v[0] - v[1])


@torch.no_grad()
def run_reference(model: torch.nn.Module, prompt: list[int]) -> dict[str, Any]:
    probe = RouterProbe(model)
    try:
        # Greedy decoding with the model's own KV cache.
        probe.reset_cache(True)
        ids = torch.tensor([prompt])
        out = model(input_ids=ids, use_cache=True)
        cache = out.cache
        generated, margins, last_step_logits = [], [], None
        logits = out.logits[0, -1]
        for step in range(NEW_TOKENS):
            tok, m = top2_margin(logits)
            generated.append(tok)
            margins.append(m)
            last_step_logits = logits
            if step == NEW_TOKENS - 1:
                break
            out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
            cache = out.cache
            logits = out.logits[0, -1]
        # Teacher-forced scoring of prompt + generated in one forward, no cache.
        probe.reset_cache(False)
        full = prompt + generated
        tf_logits = model(input_ids=torch.tensor([full]), use_cache=False).logits[0]
        tf = [top2_margin(tf_logits[i]) for i in range(len(full))]
    finally:
        probe.close()
    tf_argmax = [a for a, _ in tf]
    tf_margins = [m for _, m in tf]
    consistent = tf_argmax[len(prompt) - 1 : len(full) - 1] == generated
    return {
        "generated_ids": generated,
        "greedy_margins": margins,
        "tf_argmax": tf_argmax,
        "tf_margins": tf_margins,
        "cache_consistent": consistent,
        "min_router_margin": probe.min_router,
        "router_calls": probe.router_calls,
        "min_indexer_margin": probe.min_indexer,
        "indexer_selections": probe.indexer_selections,
        "last_logits": tf_logits[-1].to(torch.float32).numpy().copy(),
        "last_step_logits": last_step_logits.to(torch.float32).numpy().copy(),
    }


def check(fx: Fixture, res: dict[str, Any], eos: list[int]) -> str | None:
    """Why this result is not a usable oracle, or None."""
    if not res["cache_consistent"]:
        return "greedy (KV cache) tokens differ from teacher-forced argmax"
    if min(res["greedy_margins"]) < MIN_TOKEN_MARGIN:
        return f"greedy margin {min(res['greedy_margins']):.2e}"
    if min(res["tf_margins"]) < MIN_TOKEN_MARGIN:
        return f"teacher-forced margin {min(res['tf_margins']):.2e}"
    if res["min_router_margin"] < MIN_ROUTER_MARGIN:
        return f"router margin {res['min_router_margin']:.2e}"
    if fx.indexer_check:
        if res["indexer_selections"] == 0:
            return "indexer selection never matters"
        if res["min_indexer_margin"] < MIN_INDEXER_MARGIN:
            return f"indexer margin {res['min_indexer_margin']:.2e}"
    if any(t in eos for t in res["generated_ids"]):
        return "generated an eos token"
    return None


# ------------------------------------------------------------------------------------------------ driver
def recipes_of(fx: Fixture) -> tuple[str, ...]:
    """The recipes beyond BASE_RECIPES a fixture has: its own extras, then its model_type's ``target-NAME`` (but
    those in ``margin_failed``)."""
    return fx.extra_recipes + tuple(r for r in target_recipes(fx.model_type) if r not in fx.margin_failed)


def make_fixture(
    fx: Fixture, tmp: Path, add: tuple[str, ...] = (), entry: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Make a fixture and all its references (seeds searched from ``fx.seed``), or with ``add`` compute only
    those recipes at the seed ``entry`` (its index.json entry) records: the rebuilt files must be the committed
    ones byte for byte, every other reference stays as it is, and a recipe failing the margin checks is reported
    and left out (no other seed is tried)."""
    t0 = time.time()
    tokenizer = None
    vocab = None
    if fx.tokenizer:
        tokenizer = build_tokenizer(fx.config["vocab_size"])
        vocab = tokenizer.get_vocab_size()
    n_layers = text_of(fx.config)["num_hidden_layers"]
    last_reason = None
    for attempt in range(1 if add else MAX_SEED_TRIES):
        seed = entry["seed"] if add else fx.seed + attempt
        model = build_model(fx, seed, vocab)
        disk, saved_cfg, gen_cfg = disk_tensors(model, fx.fused, tmp)
        del model
        if fx.published_stacks:
            disk = published_layout(disk)
        stored, source = store(fx, disk)
        config = fixture_config(fx, saved_cfg)
        V = text_of(config)["vocab_size"]
        eos = []
        for scope in (saved_cfg, text_of(saved_cfg)):
            e = scope.get("eos_token_id")
            eos += [] if e is None else ([e] if isinstance(e, int) else list(e))
        if tokenizer is not None:
            prompt = tokenizer.encode(fx.prompt_text).ids
            eos = [tokenizer.token_to_id("<|endoftext|>")]
        else:
            rng = np.random.default_rng(seed)
            prompt = [int(x) for x in rng.integers(2, V, size=fx.prompt_len)]
        results: dict[str, dict[str, Any]] = {}
        ok = True
        native = native_tensors(stored)
        decoded = decoded_tensors(stored)
        bf16_stored = frozenset(n for n, t in stored.items() if t.dtype == torch.bfloat16)
        for recipe in add or COMPUTED_RECIPES + recipes_of(fx):
            weights, formats, fallbacks = apply_recipe(
                source, recipe, n_layers, fx.expert_orientation, native, decoded, bf16_stored
            )
            model = load_reference_model(config, weights, tmp, fx.fused, fx.model_class, fx.published_stacks)
            if recipe == "f32" and attempt == 0:
                describe_model(fx, model)
            res = run_reference(getattr(model, fx.reference_module) if fx.reference_module else model, prompt)
            del model
            why = check(fx, res, eos)
            if why and add:  # no re-seeding: the recipe is left out
                log(f"  {fx.name}: {recipe} left out at seed {seed}: {why}")
                continue
            if why:
                last_reason = f"{recipe}: {why}"
                ok = False
                break
            res["tensor_formats"], res["fallbacks"] = formats, fallbacks
            results[recipe] = res
        if ok:
            break
        log(f"  {fx.name}: seed {seed} rejected ({last_reason})")
    else:
        raise SystemExit(
            f"{fx.name}: no seed in {MAX_SEED_TRIES} tries passed the margin checks ({last_reason})"
        )

    out_dir = ORACLES_DIR / fx.name
    if add:  # the fixture as committed: rebuilt elsewhere, and refused unless byte-identical
        file_hashes = write_fixture(fx, tmp / "rebuilt", config, gen_cfg, stored, tokenizer, n_layers)
        committed = json.loads((out_dir / "reference" / "f32.json").read_text())["fixture_files"]
        if file_hashes != committed:
            raise SystemExit(f"{fx.name}: rebuilt at seed {seed}, its files differ from the committed ones")
    else:
        file_hashes = write_fixture(fx, out_dir, config, gen_cfg, stored, tokenizer, n_layers)
    check_written(out_dir, source, fx.expert_orientation)
    if fx.storage == "mxfp4":
        check_transformers_reads_mxfp4(fx, out_dir, source)
    if fx.storage == "mxfp8-stacks":
        check_transformers_reads_fp8(fx, out_dir, config, source, tmp)
    ref_dir = out_dir / "reference"
    ref_dir.mkdir(exist_ok=bool(add))
    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "ml_dtypes": ml_dtypes.__version__,
    }
    summary = {}
    for recipe, res in results.items():
        logits_file = f"{recipe}.logits.zst"
        (ref_dir / logits_file).write_bytes(zstd_npy(np.stack([res["last_step_logits"], res["last_logits"]])))
        full = prompt + res["generated_ids"]
        doc = {
            "schema": SCHEMA_VERSION,
            "fixture": fx.name,
            "model_type": fx.model_type,
            "recipe": recipe,
            "recipe_formats": RECIPES[recipe],
            "recipes_sharing_this_reference": sorted(k for k, v in REFERENCE_OF.items() if v == recipe),
            "seed": seed,
            "versions": versions,
            "prompt_text": fx.prompt_text,
            "prompt_ids": prompt,
            "generated_ids": res["generated_ids"],
            "greedy_margins": [round(m, 7) for m in res["greedy_margins"]],
            "teacher_forced": {
                "input_ids": full,
                "argmax": res["tf_argmax"],
                "margins": [round(m, 7) for m in res["tf_margins"]],
            },
            "min_margin": round(min(res["greedy_margins"] + res["tf_margins"]), 7),
            "min_router_margin": round(res["min_router_margin"], 7),
            "min_indexer_margin": (
                round(res["min_indexer_margin"], 7) if math.isfinite(res["min_indexer_margin"]) else None
            ),  # fmt: skip
            "logits": {
                "file": logits_file,
                "encoding": "zstd-compressed .npy",
                "dtype": "float32",
                "shape": [2, V],
                "rows": [
                    f"greedy step {NEW_TOKENS} (KV cache): logits after prompt + {NEW_TOKENS - 1} generated, "
                    f"position {len(full) - 2}, whose argmax is generated_ids[-1]",
                    f"teacher-forced last position {len(full) - 1} (input prompt + {NEW_TOKENS} generated)",
                ],
            },
            "tensor_formats": res["tensor_formats"],
            "fallbacks": res["fallbacks"],
            "fixture_files": file_hashes,
        }
        (ref_dir / f"{recipe}.json").write_text(dump_json(doc))  # dump_json refuses NaN/inf
        summary[recipe] = {
            "min_greedy_margin": round(min(res["greedy_margins"]), 6),
            "min_tf_margin": round(min(res["tf_margins"]), 6),
            "min_router_margin": round(res["min_router_margin"], 6),
            "min_indexer_margin": finite_or_none(res["min_indexer_margin"]),
        }
    if add:  # the committed references' margins, then the added ones
        summary = {**entry["margins"], **summary}
    size = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    log(f"{fx.name}: seed {seed} ({attempt + 1} tries), {size / 1024:.0f} KiB, {time.time() - t0:.1f}s")
    for recipe, s in summary.items():
        log(
            f"    {recipe:8s} greedy {s['min_greedy_margin']:.4f}  tf {s['min_tf_margin']:.4f}  "
            f"router {s['min_router_margin']:.5f}  indexer {s['min_indexer_margin'] or '-'}"
        )
    return {
        "name": fx.name,
        "model_type": fx.model_type,
        "description": fx.description,
        "storage": fx.storage,
        "experts_on_disk": "fused" if fx.fused or any(FUSED_RE.match(n) for n in source) else "per-expert",
        "files": sorted(file_hashes),
        "tokenizer": fx.tokenizer,
        "seed": seed,
        "recipes": {
            r: {
                "reference": f"{fx.name}/reference/{REFERENCE_OF[r]}.json",
                "options": RECIPE_OPTIONS[r],
                "layout": RECIPES[r]["layout"],
            }
            for r in BASE_RECIPES + recipes_of(fx)
            if r in summary or REFERENCE_OF[r] in summary  # with add: a recipe left out has no reference
        },
        "size_bytes": size,
        "margins": summary,
    }


def finite_or_none(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def describe_model(fx: Fixture, model: torch.nn.Module) -> None:
    """Sanity checks that the config means what the fixture says."""
    cfg = model.config
    if fx.model_type in ("deepseek_v3", "glm_moe_dsa"):
        rope = model.model.rotary_emb
        want = (fx.config.get("rope_parameters") or {}).get("rope_type", "default")
        assert rope.rope_type == want, (rope.rope_type, want)
        attn = model.model.layers[0].self_attn
        base = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
        if want == "yarn":
            assert attn.scaling > base * 1.01, "YaRN mscale^2 not applied"
            assert abs(rope.attention_scaling - 1.0) < 1e-12
        else:
            assert attn.scaling == base
    if fx.model_type == "glm4_moe":
        assert model.model.rotary_emb.inv_freq.numel() * 2 == int(cfg.head_dim * 0.5)


def main(argv: list[str] | None = None) -> int:
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="fixture names to regenerate (default: all)")
    ap.add_argument("--add-recipes", nargs="+", metavar="RECIPE",
                    help="with --only: compute only these recipes (those the fixture has) at the recorded seed, "
                         "keeping its files and other references byte-identical; one failing the margin checks "
                         "is reported and left out")  # fmt: skip
    args = ap.parse_args(argv)
    if args.add_recipes and not args.only:
        raise SystemExit("--add-recipes needs --only FIXTURE ...")
    torch.set_num_threads(1)
    wanted = FIXTURES if not args.only else [f for f in FIXTURES if f.name in args.only]
    unknown = set(args.only or []) - {f.name for f in FIXTURES}
    if unknown:
        raise SystemExit(f"unknown fixture(s): {', '.join(sorted(unknown))}")
    index_path = ORACLES_DIR / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"fixtures": {}}
    with tempfile.TemporaryDirectory(prefix="oracles-") as tmp:
        for fx in wanted:
            if args.add_recipes:
                add = tuple(r for r in args.add_recipes if r in recipes_of(fx))
                if add:
                    entry = index["fixtures"][fx.name]
                    index["fixtures"][fx.name] = make_fixture(fx, Path(tmp) / fx.name, add, entry)
                continue
            index["fixtures"][fx.name] = make_fixture(fx, Path(tmp) / fx.name)
    order = [f.name for f in FIXTURES]
    order += [k for k in index["fixtures"] if k not in order]  # made by their own scripts (make_kimi_k3.py)
    index = {
        "schema": SCHEMA_VERSION,
        "generator": "oracles/make_oracles.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "min_token_margin": MIN_TOKEN_MARGIN,
        "min_router_margin": MIN_ROUTER_MARGIN,
        "fixtures": {k: index["fixtures"][k] for k in order if k in index["fixtures"]},
    }
    index_path.write_text(json.dumps(index, indent=1, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
