"""Writing a fixture folder: config spellings, shards + index, tokenizer, and the read-back check."""

from __future__ import annotations

import enum
import hashlib
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
import transformers
import zstandard
from fixture_specs import FINE_GRAINED_FP8, TOKENIZER_CORPUS, Fixture
from oracle_recipes import FP8_BLOCK, MXFP4_BLOCKS, MXFP4_SCALES, fp8_block_dequant, layer_of, mxfp4_dequant
from safetensors.torch import load_file, save_file

from colitools.formats import reference as fref


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def to_np_f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy().copy()


# --------------------------------------------------------------------------------------------- tokenizer
def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TOKENIZER_CORPUS] * 4, trainer)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


# --------------------------------------------------------------------------------------------- writing
def legacy_config(config: dict) -> dict:
    """Hub-style spellings (as DeepSeek-V3's own config.json): top-level rope_theta and rope_scaling."""
    cfg = {k: v for k, v in config.items() if k not in ("head_dim", "qk_head_dim")}  # derived by transformers
    cfg.update({"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1})  # as on the hub
    rp = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.pop("rope_type")
    if rtype != "default":
        cfg["rope_scaling"] = {"type": rtype, **rp}
    return cfg


INT4_GROUP = 32  # Kimi-K2-Thinking's experts: W4A16 symmetric group 32, BF16 scales


def int4_scheme(g: int = INT4_GROUP):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=g)
    return QuantizationScheme(targets=["Linear"], weights=args)


def int4_quantization_config(g: int = INT4_GROUP) -> dict[str, Any]:
    """compressed-tensors' own ``QuantizationConfig`` for the scheme, as Kimi-K2-Thinking's config.json has it
    (``ignore``: everything but the routed experts)."""
    from compressed_tensors.quantization import QuantizationConfig

    qc = QuantizationConfig(
        config_groups={"group_0": int4_scheme(g)}, format="pack-quantized", quantization_status="compressed",
        ignore=["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    ).model_dump(exclude_none=True)  # fmt: skip
    qc["quant_method"] = "compressed-tensors"
    return json.loads(json.dumps(qc, default=str))


def fixture_config(fx: Fixture, saved_config: dict) -> dict:
    cfg = dict(saved_config)
    cfg["dtype"] = "float32" if fx.storage == "f32" else "bfloat16"
    if fx.legacy_config:
        cfg = legacy_config(cfg)
    if fx.storage == "fp8":
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        }
    if fx.storage == "fp8-experts":  # as colibri's c/tools/make_qwen38_tiny.py --fp8-experts writes it (no fmt)
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic",
            "quant_method": "fp8",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        }
    if fx.storage == "mxfp4":  # as openai/gpt-oss-20b's config.json
        cfg["quantization_config"] = {
            "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
            ],
            "quant_method": "mxfp4",
        }  # fmt: skip
    if fx.storage == "int4":
        cfg["quantization_config"] = int4_quantization_config()
    if fx.storage == "mxfp8-stacks":  # transformers' FineGrainedFP8Config as it writes itself (Inkling-2)
        qc = transformers.FineGrainedFP8Config(**FINE_GRAINED_FP8)
        cfg["quantization_config"] = {k: str(v.value) if isinstance(v, enum.Enum) else v
                                      for k, v in sorted(qc.to_dict().items())}  # fmt: skip
    if fx.storage in ("nvfp4", "mxfp8"):  # modelopt's spelling (its hf_quant_config "quantization", flat)
        algo, group = {"nvfp4": ("NVFP4", 16), "mxfp8": ("MXFP8", 32)}[fx.storage]
        cfg["quantization_config"] = {
            "exclude_modules": ["lm_head", "model.embed_tokens", "model.layers.*.self_attn*", "model.layers.*.mlp.gate",
                                "model.layers.*.mlp.down_proj", "model.layers.*.mlp.gate_proj", "model.layers.*.mlp.up_proj"],
            "group_size": group,
            "kv_cache_quant_algo": None,
            "quant_algo": algo,
            "quant_method": "modelopt",
        }  # fmt: skip
    return dict(sorted(cfg.items()))


def shard_plan(fx: Fixture, names: list[str], n_layers: int) -> dict[str, str]:
    """Tensor -> file. Two shards: everything up to the middle of the last layer's experts in the first file,
    the rest in the second; the cut falls inside one expert (its gate/up in file 1, its down in file 2)."""
    if fx.shards == 1:
        return dict.fromkeys(names, "model.safetensors")
    files = [f"model-0000{i + 1}-of-0000{fx.shards}.safetensors" for i in range(fx.shards)]
    last = n_layers - 1
    experts = sorted({int(m.group(1)) for n in names if layer_of(n) == last
                      for m in [re.search(r"\.experts\.(\d+)\.", n)] if m})  # fmt: skip
    assert len(experts) >= 4, "sharded fixture needs a MoE last layer"
    cut = experts[len(experts) // 2]
    plan = {}
    for n in names:
        layer = layer_of(n)
        m = re.search(r"\.experts\.(\d+)\.(\w+)\.", n)
        if layer is None:
            second = not n.startswith("model.embed_tokens")  # embeddings first, norm + lm_head last
        elif layer < last:
            second = False
        elif m:
            e, proj = int(m.group(1)), m.group(2)
            second = e > cut or (e == cut and proj == "down_proj")
        else:
            second = ".mlp." in n and "experts" not in n  # router + shared expert after the cut
        plan[n] = files[1 if second else 0]
    return plan


def write_fixture(
    fx: Fixture,
    out_dir: Path,
    config: dict,
    gen_config: dict | None,
    stored: dict[str, torch.Tensor],
    tokenizer,
    n_layers: int,
) -> dict[str, str]:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if gen_config is not None:
        (out_dir / "generation_config.json").write_text(json.dumps(gen_config, indent=2) + "\n")
    names = sorted(stored)
    plan = shard_plan(fx, names, n_layers)
    for fname in sorted(set(plan.values())):
        part = {n: stored[n].contiguous() for n in names if plan[n] == fname}
        save_file(part, str(out_dir / fname), metadata={"format": "pt"})
        (out_dir / fname).chmod(0o644)
    if fx.shards > 1:
        total = sum(t.numel() * t.element_size() for t in stored.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(plan.items()))}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(out_dir / "tokenizer.json"))
        (out_dir / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
            "model_max_length": config.get("max_position_embeddings", 512)}, indent=2) + "\n")  # fmt: skip
    return {p.name: sha256_file(p) for p in sorted(out_dir.iterdir()) if p.is_file()}


def check_written(out_dir: Path, source: dict[str, np.ndarray], orientation: str = "rows") -> None:
    """Read the fixture back from disk and dequantize it: it must hold exactly the values the references used.
    MXFP4 stacks (``_blocks`` + ``_scales``) are by rows; the source's float stacks are in ``orientation``."""
    raw: dict[str, torch.Tensor] = {}
    for f in sorted(out_dir.glob("*.safetensors")):
        raw.update(load_file(str(f)))
    index = out_dir / "model.safetensors.index.json"
    if index.exists():
        wm = json.loads(index.read_text())["weight_map"]
        assert set(wm) == set(raw), "index weight_map does not cover the shards exactly"
    companions = {n for n in raw if n.endswith("_scale_inv")}
    companions |= {
        n for n in raw if n.endswith(MXFP4_SCALES) and n.removesuffix(MXFP4_SCALES) + MXFP4_BLOCKS in raw
    }
    companions |= {
        n for n in raw for sfx in ("_scale", "_scale_2") if n.endswith(sfx) and n.removesuffix(sfx) in raw
    }
    companions |= {n for n in raw if n.endswith((".weight_scale", ".weight_shape"))
                   and n.rpartition(".")[0] + ".weight_packed" in raw}  # fmt: skip
    names = {n.removesuffix(MXFP4_BLOCKS) for n in set(raw) - companions}
    names = {n.removesuffix("_packed") if n.endswith(".weight_packed") else n for n in names}
    assert names == set(source), sorted(names ^ set(source))[:5]
    for n in names:
        t = raw.get(n)
        if t is None and n + "_packed" in raw:  # compressed-tensors pack-quantized (symmetric)
            p, sc = raw[n + "_packed"], raw[n + "_scale"]
            shape = [int(x) for x in raw[n + "_shape"]]
            assert shape == [p.shape[0], 8 * p.shape[1]], (n, shape)
            got = fref.decode_pack_quantized(p.numpy(), to_np_f32(sc), shape[1], -(-shape[1] // sc.shape[1]))
        elif t is not None and n + "_scale_2" in raw:  # NVFP4
            got = fref.decode_nvfp4(t.numpy(), raw[n + "_scale"].view(torch.uint8).numpy(),
                                    raw[n + "_scale_2"].numpy(), 2 * t.shape[1])  # fmt: skip
        elif t is not None and t.dtype == torch.float8_e4m3fn and n + "_scale" in raw:  # MXFP8 (stacks too)
            q, I = t.view(torch.uint8).numpy(), t.shape[-1]
            scale = raw[n + "_scale"].view(torch.uint8).numpy()
            got = fref.decode_mxfp8(q.reshape(-1, I), scale.reshape(q.size // I, -1), I).reshape(q.shape)
        elif t is None:  # MXFP4 blocks [E, O, I/32, 16] + scales [E, O, I/32]
            got = mxfp4_dequant(raw[n + MXFP4_BLOCKS].numpy(), raw[n + MXFP4_SCALES].numpy())
            if orientation == "transposed-interleaved":
                got = np.ascontiguousarray(got.transpose(0, 2, 1))
        elif t.dtype == torch.float8_e4m3fn:
            q = t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
            got = fp8_block_dequant(q, to_np_f32(raw[n + "_scale_inv"]))  # F32 or BF16 scales
        else:  # non-float tensors (tid2eid, Qwen3.8's I64 hash multipliers ~2^62) compared as they are
            got = to_np_f32(t) if t.is_floating_point() else t.numpy()
        assert np.array_equal(got, source[n]), (
            f"{out_dir.name}: {n} on disk differs from the reference weights"
        )


def dump_json(doc: dict[str, Any]) -> str:
    """JSON with one top-level key per line and one nested key per line below that; arrays stay on one line."""

    def value(v: Any, depth: int) -> str:
        if isinstance(v, dict) and v and depth < 2:
            pad = " " * (depth + 1)
            body = ",\n".join(f"{pad}{json.dumps(k)}: {value(x, depth + 1)}" for k, x in v.items())
            return "{\n" + body + "\n" + " " * depth + "}"
        return json.dumps(v, allow_nan=False)

    return value(doc, 0) + "\n"


def zstd_npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr, dtype="<f4"), allow_pickle=False)
    return zstandard.ZstdCompressor(level=19).compress(buf.getvalue())
