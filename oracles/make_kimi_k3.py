#!/usr/bin/env python
"""The ``kimi_k3`` oracle fixture: a tiny Kimi K3 in the layout K3 ships (routed experts compressed-tensors
``mxfp4-pack-quantized``, every other tensor BF16, all under ``language_model.``) and its references, computed by
``k3_reference.py`` (torch, written from the architecture: transformers 5.24 has no Kimi K3 model). Oracle venv:

    .oracle-venv/bin/python oracles/make_kimi_k3.py               # fixture + references + index.json entry
    .oracle-venv/bin/python oracles/make_kimi_k3.py --mutations   # does the fixture catch each runtime bug?

Made like the transformers fixtures (oracles/README.md "How a fixture is made"): weights N(0, 0.2 sqrt(64 / fan-in))
(0.2 at the other fixtures' 64 inputs; hidden is 128 here, for a latent of 64 the planar recipe can take; norms
1 + 0.1 N, correction bias 0.05 N, KDA ``A_log`` 0.5 N in its heads' slots and zero padding, ``dt_bias`` 0.2 N,
attention-residual projections 0.5 N), each routed expert compressed by compressed-tensors 0.20.1 itself
(``MXFP4PackedCompressor``, its ``MXFP4`` preset and observer) and its source value that producer's own
decompress; a seed is kept only if every recipe passes the margin checks. The reference computes in float64 on the
float32 source values (logits stored float32); greedy decoding recomputes the whole sequence per step (it has no
cache), so its tokens equal the teacher-forced argmax by construction.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
import zstandard
from fixture_io import dump_json, sha256_file, zstd_npy
from fixture_specs import MIN_ROUTER_MARGIN, MIN_TOKEN_MARGIN, NEW_TOKENS, PROMPT_LEN
from k3_reference import MUTATIONS, ROOT, K3Reference
from oracle_recipes import RECIPE_OPTIONS, RECIPES, REFERENCE_OF, apply_recipe, target_recipes
from safetensors.torch import load_file, save_file

NAME, MODEL_TYPE = "kimi_k3", "kimi_k3"
ORACLES_DIR = Path(__file__).resolve().parent
SEED = 28001
INIT_STD = 0.2
H, V, LAYERS = 128, 200, 3
KDA_HEADS, KDA_HD, CONV_K = 2, 32, 4
HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V_HEAD = 2, 32, 32, 16, 8, 16
E, TOPK, MOE_I, LATENT, DENSE_I = 8, 2, 64, 64, 96
COMPUTED = ("f32", "default", "int3", "mxfp4", "native", *target_recipes(MODEL_TYPE))
DESCRIPTION = (
    "Kimi K3 as it ships (no transformers model; reference oracles/k3_reference.py, torch): config "
    "model_type kimi_k3 with text_config, every tensor under language_model.; routed experts "
    "block_sparse_moe.experts.{E}.w1/w2/w3.weight_packed U8 [O, I/2] + weight_scale U8 E8M0 [O, I/32] "
    "(compressed-tensors mxfp4-pack-quantized, made by compressed-tensors 0.20.1), the rest BF16; 3 layers: "
    "KDA + dense SiTU-GLU MLP, KDA + LatentMoE, gated NoPE MLA + LatentMoE (kda_layers [1, 2]); attention "
    "residuals in blocks of 2 (layer 1 inside the block layer 0 opened); LatentMoE hidden 128 -> latent 64, "
    "sigmoid + correction-bias top-2 of 8, routed_expert_norm, shared expert at full width; SiTU-GLU betas 4 / 25"
)


def text_config() -> dict:
    return {
        "model_type": "kimi_linear", "hidden_size": H, "num_hidden_layers": LAYERS, "vocab_size": V,
        "first_k_dense_replace": 1, "intermediate_size": DENSE_I, "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS, "q_lora_rank": Q_LORA, "kv_lora_rank": KV_LORA, "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE, "v_head_dim": V_HEAD, "num_experts": E, "num_experts_per_token": TOPK,
        "moe_intermediate_size": MOE_I, "routed_expert_hidden_size": LATENT, "num_shared_experts": 1,
        "attn_res_block_size": 2, "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
        "linear_attn_config": {"num_heads": KDA_HEADS, "head_dim": KDA_HD, "short_conv_kernel_size": CONV_K,
                               "gate_lower_bound": -5.0, "kda_layers": [1, 2], "full_attn_layers": [3]},
    }  # fmt: skip


def quantization_config() -> dict:
    """compressed-tensors' own QuantizationConfig for its MXFP4 preset on the routed experts (as K3 ships)."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4

    scheme = QuantizationScheme(targets=["re:.*block_sparse_moe\\.experts\\.\\d+\\.w[123]$"], **MXFP4)
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format="mxfp4-pack-quantized",
                            quantization_status="compressed").model_dump(exclude_none=True)  # fmt: skip
    qc["quant_method"] = "compressed-tensors"
    return json.loads(json.dumps(qc, default=str))


def shapes() -> dict[str, tuple[int, ...]]:
    C = KDA_HEADS * KDA_HD
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H),
           "model.output_attn_res_norm.weight": (H,), "model.output_attn_res_proj.weight": (H,)}  # fmt: skip
    for i in range(LAYERS):
        L = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
                  "self_attention_res_proj", "mlp_res_norm", "mlp_res_proj"):  # fmt: skip
            out[L + n + ".weight"] = (H,)
        a = L + "self_attn."
        if i < 2:  # KDA
            out.update({a + f"{p}.weight": (C, H) for p in ("q_proj", "k_proj", "v_proj", "g_proj")})
            out.update({a + f"{p}_conv1d.weight": (C, 1, CONV_K) for p in ("q", "k", "v")})
            out.update({a + "o_proj.weight": (H, C), a + "f_a_proj.weight": (KDA_HD, H),
                        a + "f_b_proj.weight": (C, KDA_HD), a + "b_proj.weight": (KDA_HEADS, H),
                        a + "dt_bias": (C,), a + "o_norm.weight": (KDA_HD,), a + "A_log": (KDA_HD,)})  # fmt: skip
        else:  # gated MLA
            out.update({
                a + "q_a_proj.weight": (Q_LORA, H), a + "q_b_proj.weight": (HEADS * (NOPE + ROPE), Q_LORA),
                a + "kv_a_proj_with_mqa.weight": (KV_LORA + ROPE, H),
                a + "kv_b_proj.weight": (HEADS * (NOPE + V_HEAD), KV_LORA), a + "o_proj.weight": (H, HEADS * V_HEAD),
                a + "g_proj.weight": (HEADS * V_HEAD, H), a + "q_a_layernorm.weight": (Q_LORA,),
                a + "kv_a_layernorm.weight": (KV_LORA,),
            })  # fmt: skip
        if i == 0:
            m = L + "mlp."
            out.update({m + "gate_proj.weight": (DENSE_I, H), m + "up_proj.weight": (DENSE_I, H),
                        m + "down_proj.weight": (H, DENSE_I)})  # fmt: skip
            continue
        b = L + "block_sparse_moe."
        out.update({
            b + "gate.weight": (E, H), b + "gate.e_score_correction_bias": (E,),
            b + "routed_expert_norm.weight": (LATENT,), b + "routed_expert_down_proj.weight": (LATENT, H),
            b + "routed_expert_up_proj.weight": (H, LATENT), b + "shared_experts.gate_proj.weight": (MOE_I, H),
            b + "shared_experts.up_proj.weight": (MOE_I, H), b + "shared_experts.down_proj.weight": (H, MOE_I),
        })  # fmt: skip
        for e in range(E):
            x = f"{b}experts.{e}."
            out.update({x + "w1.weight": (MOE_I, LATENT), x + "w2.weight": (LATENT, MOE_I),
                        x + "w3.weight": (MOE_I, LATENT)})  # fmt: skip
    return {ROOT + n: s for n, s in out.items()}


def draw(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    n = lambda: torch.randn(shape, generator=g)  # noqa: E731
    if name.endswith("A_log"):  # the heads' rates first, the padding zero (c/kimi_k3.c reads the first heads)
        w = torch.zeros(shape)
        w[:KDA_HEADS] = 0.5 * torch.randn(KDA_HEADS, generator=g)
        return w
    if name.endswith(("norm.weight", "layernorm.weight")):
        return 1 + 0.1 * n()
    if name.endswith("e_score_correction_bias"):
        return 0.05 * n()
    if name.endswith("res_proj.weight"):
        return 0.5 * n()
    if name.endswith("dt_bias"):
        return 0.2 * n()
    return INIT_STD * (64 / shape[-1]) ** 0.5 * n()  # 0.2 at 64 inputs (the fixtures' rule), fan-in scaled


def mxfp4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """compressed-tensors' own MXFP4 compress of ``w`` and its decompress (bfloat16, exact) as float32."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = QuantizationScheme(targets=["Linear"], **MXFP4)
    O, I = w.shape
    groups = w.reshape(O, I // 32, 32)
    scale, zp = calculate_qparams(groups.amin(dim=2), groups.amax(dim=2), scheme.weights)
    sd = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
    comp = MXFP4PackedCompressor.compress(sd, scheme)
    dec = MXFP4PackedCompressor.decompress(dict(comp), scheme)["weight"].to(torch.float32).numpy()
    return comp["weight_packed"].contiguous(), comp["weight_scale"].contiguous(), dec


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def own_decode(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """E2M1 (low nibble = even element) x 2^(E8M0 - 127) per 32, written out here (float64, exact)."""
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    return (E2M1[codes] * np.exp2(np.repeat(scale.astype(np.float64) - 127, 32, axis=1))).astype(np.float32)


def build(seed: int) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """(stored tensors as written, source values by decoded name)."""
    g = torch.Generator().manual_seed(seed)
    stored, source = {}, {}
    for name, shape in shapes().items():
        w = draw(name, shape, g)
        if ".experts." in name:
            packed, scale, value = mxfp4_pack(w)
            assert np.array_equal(value, own_decode(packed.numpy(), scale.numpy())), name
            base = name.removesuffix(".weight")
            stored[base + ".weight_packed"], stored[base + ".weight_scale"] = packed, scale
            source[name] = value
        else:
            b = w.to(torch.bfloat16)
            stored[name], source[name] = b, b.to(torch.float32).numpy()
    return stored, source


def top2(logits: torch.Tensor) -> tuple[int, float]:
    v, i = logits.topk(2)
    return int(i[0]), float(v[0] - v[1])


def run(weights: dict[str, np.ndarray], prompt: list[int], mutations=()) -> dict:
    ref = K3Reference(
        text_config(), {k: torch.from_numpy(v.astype(np.float64)) for k, v in weights.items()}, mutations
    )  # float64: the reference's own rounding stays far below the 1e-4 logit check
    ids, margins, step_logits = list(prompt), [], None
    for _ in range(NEW_TOKENS):  # greedy: the whole sequence again each step (no cache)
        step_logits = ref.forward(ids)[-1]
        tok, m = top2(step_logits)
        ids.append(tok)
        margins.append(m)
    full = ids
    tf_logits = ref.forward(full)
    tf = [top2(tf_logits[i]) for i in range(len(full))]
    return {"generated_ids": full[len(prompt) :], "greedy_margins": margins, "tf": tf,
            "min_router_margin": min(ref.router_margins), "last_step": step_logits.numpy().astype(np.float32),
            "last": tf_logits[-1].numpy().astype(np.float32)}  # fmt: skip


def why_not(res: dict) -> str | None:
    if min(res["greedy_margins"]) < MIN_TOKEN_MARGIN:
        return f"greedy margin {min(res['greedy_margins']):.2e}"
    if min(m for _, m in res["tf"]) < MIN_TOKEN_MARGIN:
        return f"teacher-forced margin {min(m for _, m in res['tf']):.2e}"
    if res["min_router_margin"] < MIN_ROUTER_MARGIN:
        return f"router margin {res['min_router_margin']:.2e}"
    return None


def recipes(source: dict[str, np.ndarray]):
    native = {n: "mxfp4" for n in source if ".experts." in n}
    for recipe in COMPUTED:
        yield (
            recipe,
            apply_recipe(source, recipe, LAYERS, "rows", native, bf16_stored=frozenset(source) - set(native)),
        )


def write(seed, stored, prompt, results) -> dict:
    out = ORACLES_DIR / NAME
    if out.exists():
        shutil.rmtree(out)
    (out / "reference").mkdir(parents=True)
    config = {"model_type": MODEL_TYPE, "architectures": ["KimiK3ForConditionalGeneration"],
              "tie_word_embeddings": False, "text_config": text_config(),
              "quantization_config": quantization_config()}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(
        {n: stored[n] for n in sorted(stored)}, str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    (out / "model.safetensors").chmod(0o644)
    files = {p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file()}
    import compressed_tensors

    versions = {"transformers": "none (no Kimi K3 model): oracles/k3_reference.py", "torch": torch.__version__,
                "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__,
                "compressed_tensors": compressed_tensors.__version__}  # fmt: skip
    summary = {}
    for recipe, (res, formats, fallbacks) in results.items():
        full = prompt + res["generated_ids"]
        (out / "reference" / f"{recipe}.logits.zst").write_bytes(
            zstd_npy(np.stack([res["last_step"], res["last"]]))
        )
        doc = {
            "schema": 1, "fixture": NAME, "model_type": MODEL_TYPE, "recipe": recipe,
            "recipe_formats": RECIPES[recipe],
            "recipes_sharing_this_reference": sorted(k for k, v in REFERENCE_OF.items() if v == recipe),
            "seed": seed, "versions": versions, "prompt_text": None, "prompt_ids": prompt,
            "generated_ids": res["generated_ids"], "greedy_margins": [round(m, 7) for m in res["greedy_margins"]],
            "teacher_forced": {"input_ids": full, "argmax": [a for a, _ in res["tf"]],
                               "margins": [round(m, 7) for _, m in res["tf"]]},
            "min_margin": round(min(res["greedy_margins"] + [m for _, m in res["tf"]]), 7),
            "min_router_margin": round(res["min_router_margin"], 7), "min_indexer_margin": None,
            "logits": {"file": f"{recipe}.logits.zst", "encoding": "zstd-compressed .npy", "dtype": "float32",
                       "shape": [2, V], "rows": [
                           f"greedy step {NEW_TOKENS}: logits after prompt + {NEW_TOKENS - 1} generated, position "
                           f"{len(full) - 2}, whose argmax is generated_ids[-1]",
                           f"teacher-forced last position {len(full) - 1} (input prompt + {NEW_TOKENS} generated)"]},
            "tensor_formats": formats, "fallbacks": fallbacks, "fixture_files": files,
        }  # fmt: skip
        (out / "reference" / f"{recipe}.json").write_text(dump_json(doc))
        summary[recipe] = {"min_greedy_margin": round(min(res["greedy_margins"]), 6),
                           "min_tf_margin": round(min(m for _, m in res["tf"]), 6),
                           "min_router_margin": round(res["min_router_margin"], 6), "min_indexer_margin": None}  # fmt: skip
    all_recipes = ("f32", "default", "int3", "mxfp4", "planar", "native", *target_recipes(MODEL_TYPE))
    return {
        "name": NAME, "model_type": MODEL_TYPE, "description": DESCRIPTION, "storage": "mxfp4-pack",
        "experts_on_disk": "per-expert", "files": sorted(files), "tokenizer": False, "seed": seed,
        "recipes": {r: {"reference": f"{NAME}/reference/{REFERENCE_OF[r]}.json", "options": RECIPE_OPTIONS[r],
                        "layout": RECIPES[r]["layout"]} for r in all_recipes},
        "size_bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()), "margins": summary,
    }  # fmt: skip


def make() -> None:
    t0 = time.time()
    for seed in range(SEED, SEED + 200):
        stored, source = build(seed)
        prompt = [int(x) for x in np.random.default_rng(seed).integers(2, V, size=PROMPT_LEN)]
        results, why = {}, None
        for recipe, (weights, formats, fallbacks) in recipes(source):
            res = run(weights, prompt)
            why = why_not(res)
            if why:
                break
            results[recipe] = (res, formats, fallbacks)
        if why:
            print(f"  seed {seed} rejected ({recipe}: {why})", flush=True)
            continue
        entry = write(seed, stored, prompt, results)
        check_written(source)
        index_path = ORACLES_DIR / "index.json"
        index = json.loads(index_path.read_text())
        index["fixtures"][NAME] = entry
        index_path.write_text(json.dumps(index, indent=1, allow_nan=False) + "\n")
        print(f"{NAME}: seed {seed}, {entry['size_bytes'] / 1024:.0f} KiB, {time.time() - t0:.1f}s")
        for r, s in entry["margins"].items():
            print(f"    {r:16s} greedy {s['min_greedy_margin']:.4f}  tf {s['min_tf_margin']:.4f}  "
                  f"router {s['min_router_margin']:.5f}")  # fmt: skip
        return
    raise SystemExit("no seed passed the margin checks")


def check_written(source: dict[str, np.ndarray]) -> None:
    """The written folder decodes (this file's own E2M1 decode, BF16 widening) to exactly the source values."""
    raw = load_file(str(ORACLES_DIR / NAME / "model.safetensors"))
    for name, want in source.items():
        base = name.removesuffix(".weight")
        if base + ".weight_packed" in raw:
            got = own_decode(raw[base + ".weight_packed"].numpy(), raw[base + ".weight_scale"].numpy())
        else:
            got = raw[name].to(torch.float32).numpy()
        assert np.array_equal(got, want), name


def mutations() -> None:
    """Each mutation on the f32 recipe's weights: changed greedy / teacher-forced tokens, max |d logit|."""
    index = json.loads((ORACLES_DIR / "index.json").read_text())["fixtures"][NAME]
    stored = load_file(str(ORACLES_DIR / NAME / "model.safetensors"))
    source = {}
    for n in shapes():
        base = n.removesuffix(".weight")
        if base + ".weight_packed" in stored:
            source[n] = own_decode(
                stored[base + ".weight_packed"].numpy(), stored[base + ".weight_scale"].numpy()
            )
        else:
            source[n] = stored[n].to(torch.float32).numpy()
    ref = json.loads((ORACLES_DIR / NAME / "reference" / "f32.json").read_text())
    raw = zstandard.ZstdDecompressor().decompress(
        (ORACLES_DIR / NAME / "reference" / "f32.logits.zst").read_bytes()
    )
    want_logits = np.load(io.BytesIO(raw))
    prompt, tf_ids = ref["prompt_ids"], ref["teacher_forced"]["input_ids"]
    missed = 0
    print(f"{NAME} (seed {index['seed']}): mutation -> greedy tokens changed / 32, teacher-forced argmax changed, "
          "max |d logit|")  # fmt: skip
    for m, what in MUTATIONS.items():
        res = run(source, prompt, (m,))
        greedy = sum(a != b for a, b in zip(res["generated_ids"], ref["generated_ids"], strict=True))
        r2 = K3Reference(
            text_config(), {k: torch.from_numpy(v.astype(np.float64)) for k, v in source.items()}, (m,)
        )
        tf = r2.forward(tf_ids).argmax(-1).tolist()
        tf_changed = sum(a != b for a, b in zip(tf, ref["teacher_forced"]["argmax"], strict=True))
        d = float(np.abs(np.stack([res["last_step"], res["last"]]) - want_logits).max())
        caught = greedy or tf_changed or d > 1e-4
        missed += not caught
        print(f"  {m:24s} {greedy:2d}  {tf_changed:2d}  {d:.2e}  {'' if caught else 'MISSED  '}{what}")
    print(f"{len(MUTATIONS)} mutations, {missed} missed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--mutations", action="store_true", help="report the mutation table of the committed fixture"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory():
        mutations() if args.mutations else make()
    return 0


if __name__ == "__main__":
    sys.exit(main())
