#!/usr/bin/env python
"""The ``deepseek_v41`` oracle fixture: a tiny DeepSeek V4.1 Flash in the published layout (``make_dsv41_tiny.py``:
FP8 e4m3 dense projections with one UE8M0 byte per 32x32 tile, FP4 routed experts, FP8 engram tables with row-group
scales, BF16 / F32 the rest, DSpark ``mtp.`` stage and vision tower, colibri's engram sidecar ``dsv41_engram.json``)
and its references, computed by ``dsv41_reference.py`` (torch, written from the architecture: transformers 5.24
has no DeepSeek V4.1 model). Oracle venv:

    .oracle-venv/bin/python oracles/make_deepseek_v41.py               # fixture + references + index.json entry
    .oracle-venv/bin/python oracles/make_deepseek_v41.py --mutations   # does the fixture catch each bug?

Made like the other fixtures (oracles/README.md "How a fixture is made"): weights N(0, 0.2 sqrt(64 / fan-in)),
norms 1 + 0.1 N, router weights 2.5x (0.5 at 64 inputs: sqrtsoftplus scores spread so that a seed can meet
the router margin rule), routing bias 0.05 N, sinks 0.5 N, hyper-connection ``fn`` at the fan-in rule, ``base`` 0.5 N,
``scale`` 0.5 + 0.1 N, engram ``q_weight`` / ``k_weight`` 1 + 0.1 N; each value then stored as the release stores
it (FP8 / FP4 with power-of-two UE8M0 scales, BF16, F32) and the reference computed on the stored values decoded
here (the e4m3 / E2M1 tables, ``2^(e - 127)``). A seed is kept only if every recipe passes the margin checks
(tokens, routers, indexer and candidate-block selections) and no indexer selection depends on tie-breaking. The
reference computes in float64 (logits stored float32); greedy decoding is prefill + one token per call, teacher
forcing one prefill of the whole sequence (the two differ for V4.1: dsv41_reference.py).
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import time
from pathlib import Path

import make_dsv41_tiny as tiny
import ml_dtypes
import numpy as np
import torch
import zstandard
from dsv41_reference import MUTATIONS, V41Reference
from fixture_io import dump_json, sha256_file, zstd_npy
from fixture_specs import MIN_INDEXER_MARGIN, MIN_ROUTER_MARGIN, MIN_TOKEN_MARGIN, NEW_TOKENS, PROMPT_LEN
from oracle_recipes import RECIPE_OPTIONS, RECIPES, REFERENCE_OF, apply_recipe, target_recipes

from colitools.formats.safetensors_io import write_safetensors
from colitools.formats.targets import V41_ENGRAM_FILE as ENGRAM_SIDECAR

NAME = MODEL_TYPE = "deepseek_v41"
ORACLES_DIR = Path(__file__).resolve().parent
SEED = 29125  # the committed seed (the search from 29001 rejected the ones before it on the margin rules)
INIT_STD = 0.2
COMPUTED = ("f32", "default", "int3", "mxfp4", "native", *target_recipes(MODEL_TYPE))
DESCRIPTION = (
    "DeepSeek V4.1 Flash as published (no transformers model; reference oracles/dsv41_reference.py, torch; "
    "structure from colibri's c/deepseek_v41.c and c/tools/dsv41_ref.py): released names without model. "
    "(embed, head, layers.{L}.attn.wq_a, ffn.experts.{E}.w1, ...), config model_type deepseek_v41 with "
    "text_config; dense projections FP8 e4m3 + UE8M0 32x32 tiles (.scale F8_E8M0), routed experts FP4 (I8 pairs "
    "+ UE8M0 per 32), engram tables FP8 + row-group UE8M0, BF16 / F32 the rest, a DSpark mtp.0 stage and a vision "
    "tower (converted, not run), colibri's engram sidecar dsv41_engram.json; 5 layers: compress ratios "
    "[0, 2, 2, 1, 1] (window-only rope_theta, compressing layers compress_rope_theta with YaRN), KV sources "
    "1 and 3 (layer 2 reads layer 1's entries and selection), index sources 1, 3, 4 (two-level top-k: layer 3 "
    "picks 3 candidate blocks of 2, layer 4 scores those), index_topk 4; engram on layers 1 and 4 (3-grams, 2 "
    "heads); hc_mult 3 with the previous sublayer's pre; sliding window 8, sinks, grouped low-rank output; "
    "sqrtsoftplus + bias top-2 of 4, shared expert, SwiGLU clamp 2"
)


def config_text() -> dict:
    """colibri's short names (make_dsv41_tiny.config adds the released long ones)."""
    return dict(
        vocab_size=128, dim=64, moe_inter_dim=64, n_layers=5, n_heads=2, head_dim=64, rope_head_dim=16,
        q_lora_rank=32, o_lora_rank=32, o_groups=2, norm_eps=1e-6, n_routed_experts=4, n_shared_experts=1,
        n_activated_experts=2, score_func="sqrtsoftplus", gate_temp=1.0, norm_topk_prob=True, route_scale=1.5,
        swiglu_limit=2.0, window_size=8, compress_ratios=[0, 2, 2, 1, 1], kv_source_layers=[1, 3],
        index_source_layers=[1, 3, 4], compress_rope_theta=40000.0, original_seq_len=32, rope_theta=10000.0,
        rope_factor=16.0, beta_fast=32, beta_slow=1, index_n_heads=8, index_head_dim=32, index_topk=4,
        candidate_source_layer=3, candidate_topk_blocks=3, candidate_block_size=2, hc_mult=3,
        hc_sinkhorn_iters=20, hc_eps=1e-6, engram_layer_ids=[1, 4], engram_max_ngram_size=3, engram_n_heads=2,
        engram_head_dim=32, engram_vocab_size=37, engram_pad_id=2, engram_compressed_vocab_size=48,
        n_mtp_layers=1, dspark_block_size=3, dspark_noise_token_id=7, dspark_target_layer_ids=[3, 4],
        dspark_markov_rank=32, dspark_n_routed_experts=2, dspark_n_activated_experts=1, vision_n_layers=1,
        vision_dim=32, vision_n_heads=2, vision_inter_dim=32, vision_patch_size=2, vision_downsample_ratio=2,
        image_token_id=127,
    )  # fmt: skip


def full_config() -> dict:
    config = tiny.config(config_text(), max_positions=64)
    text = config["text_config"]
    text["candidate_source_layer_id"] = text[
        "candidate_source_layer"
    ]  # the released spelling, beside colibri's
    return config


def reference_config(text: dict) -> dict:
    """The text keys under the names dsv41_reference.py reads (the released long names, else colibri's short)."""
    long = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
            "norm_eps": "rms_norm_eps", "route_scale": "routed_scaling_factor", "window_size": "sliding_window",
            "n_activated_experts": "num_experts_per_tok", "kv_source_layers": "kv_source_layer_ids",
            "index_source_layers": "index_source_layer_ids", "candidate_source_layer": "candidate_source_layer_id",
            "engram_pad_id": "engram_pad_token_id"}  # fmt: skip
    out = dict(text)
    for short, key in long.items():
        out.setdefault(key, text[short])
    return out


def draw(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float, kind: str) -> np.ndarray:
    n = rng.standard_normal(shape)
    if kind == "norm" or name.endswith(("engram.q_weight", "engram.k_weight")):
        return 1 + 0.1 * n
    if name.endswith("ffn.gate.bias"):
        return 0.05 * n
    if name.endswith("attn_sink"):
        return 0.5 * n
    if name.endswith("_base"):
        return 0.5 * n
    if name.endswith("_scale") and "hc_" in name:
        return 0.5 + 0.1 * n
    if name.endswith("ffn.gate.weight"):  # routing scores spread wide enough for the router margin rule
        return 2.5 * INIT_STD * (64 / shape[-1]) ** 0.5 * n
    return INIT_STD * (64 / shape[-1]) ** 0.5 * n  # 0.2 at 64 inputs (the fixtures' rule), fan-in scaled


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def decode(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float32 value of every weight, decoded here (no colitools code): e4m3 x 2^(e-127) per 32x32 tile or row
    group of 32, E2M1 pairs (low nibble = even input) x 2^(e-127) per 32 inputs, BF16 widened."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(".scale"):
            continue
        scale = tensors.get(name.removesuffix(".weight") + ".scale")
        if scale is None:
            out[name] = t.astype(np.float32)
            continue
        s = np.exp2(scale.view(np.uint8).astype(np.float64) - 127)
        if t.dtype == np.int8:
            b = t.view(np.uint8)
            nib = np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)
            out[name] = (E2M1[nib] * np.repeat(s, 32, axis=1)).astype(np.float32)
            continue
        rows = 1 if s.shape[0] == t.shape[0] else 32
        full = np.repeat(np.repeat(s, rows, axis=0), 32, axis=1)[: t.shape[0], : t.shape[1]]
        out[name] = (t.astype(np.float64) * full).astype(np.float32)
    return out


def build(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """(stored tensors as written, decoded float32 source values, the engram sidecar)."""
    c = config_text()
    stored = tiny.tensors(c, seed, draw)
    return stored, decode(stored), tiny.engram_sidecar(c, seed)


def top2(logits: torch.Tensor) -> tuple[int, float]:
    v, i = logits.topk(2)
    return int(i[0]), float(v[0] - v[1])


def run(weights: dict[str, np.ndarray], sidecar: dict, prompt: list[int], mutations=()) -> dict:
    text = reference_config(full_config()["text_config"])
    w = {k: torch.from_numpy(v.astype(np.float64)) for k, v in weights.items()}
    ref = V41Reference(text, w, sidecar, mutations)
    ids, margins = list(prompt), []
    logits = ref.forward(ids)[-1]
    for i in range(NEW_TOKENS):  # greedy: the prompt in one prefill, then one token per call (the cache)
        tok, m = top2(logits)
        ids.append(tok)
        margins.append(m)
        last_step = logits  # its argmax is the token just appended
        if i + 1 < NEW_TOKENS:
            logits = ref.forward([tok])[-1]
    full = ids
    tf_ref = V41Reference(text, w, sidecar, mutations)
    tf_logits = tf_ref.forward(full)
    tf = [top2(tf_logits[i]) for i in range(len(full))]
    return {"generated_ids": full[len(prompt) :], "greedy_margins": margins, "tf": tf,
            "min_router_margin": min(ref.router_margins + tf_ref.router_margins),
            "min_indexer_margin": min(ref.indexer_margins + tf_ref.indexer_margins),
            "ambiguous": ref.ambiguous + tf_ref.ambiguous,
            "last_step": last_step.numpy().astype(np.float32), "last": tf_logits[-1].numpy().astype(np.float32)}  # fmt: skip


def why_not(res: dict) -> str | None:
    if min(res["greedy_margins"]) < MIN_TOKEN_MARGIN:
        return f"greedy margin {min(res['greedy_margins']):.2e}"
    if min(m for _, m in res["tf"]) < MIN_TOKEN_MARGIN:
        return f"teacher-forced margin {min(m for _, m in res['tf']):.2e}"
    if res["min_router_margin"] < MIN_ROUTER_MARGIN:
        return f"router margin {res['min_router_margin']:.2e}"
    if res["min_indexer_margin"] < MIN_INDEXER_MARGIN:
        return f"indexer margin {res['min_indexer_margin']:.2e}"
    if res["ambiguous"]:
        return f"{res['ambiguous']} selections tie among masked entries"
    return None


def recipes(source: dict[str, np.ndarray], stored: dict[str, np.ndarray]):
    """(recipe, apply_recipe's (weights, formats, fallbacks)) for every computed recipe. What a format holds exactly
    (``native``): the FP4 experts (mxfp4's bytes), the FP8 32x32 tiles (fp8-e4m3-e8m0-t32) and the engram row
    groups (-r32); the plain ``native`` recipe keeps the experts only (``--experts native``), ``--target
    deepseek_v41`` all three."""
    native = {}
    for name, t in stored.items():
        scale = stored.get(name.removesuffix(".weight") + ".scale")
        if scale is not None:
            native[name] = "mxfp4" if t.dtype == np.int8 else ("fp8-e8m0-r32" if scale.shape[0] == t.shape[0]
                                                                else "fp8-e8m0-t32")  # fmt: skip
    bf16 = frozenset(n for n, t in stored.items() if t.dtype == ml_dtypes.bfloat16)
    n_layers = config_text()["n_layers"]
    for recipe in COMPUTED:
        yield recipe, apply_recipe(source, recipe, n_layers, "rows", native, bf16_stored=bf16)


def write(seed, stored, sidecar, prompt, results) -> dict:
    out = ORACLES_DIR / NAME
    if out.exists():
        shutil.rmtree(out)
    (out / "reference").mkdir(parents=True)
    config = full_config()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / ENGRAM_SIDECAR).write_text(json.dumps(sidecar) + "\n")
    write_safetensors(
        out / "model.safetensors", {n: stored[n] for n in sorted(stored)}, metadata={"format": "pt"}
    )
    files = {p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file()}
    versions = {"transformers": "none (no DeepSeek V4.1 model): oracles/dsv41_reference.py",
                "torch": torch.__version__, "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__}  # fmt: skip
    V = config["text_config"]["vocab_size"]
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
            "min_router_margin": round(res["min_router_margin"], 7),
            "min_indexer_margin": round(res["min_indexer_margin"], 7),
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
                           "min_router_margin": round(res["min_router_margin"], 6),
                           "min_indexer_margin": round(res["min_indexer_margin"], 6)}  # fmt: skip
    all_recipes = ("f32", "default", "int3", "mxfp4", "planar", "native", *target_recipes(MODEL_TYPE))
    return {
        "name": NAME, "model_type": MODEL_TYPE, "description": DESCRIPTION, "storage": "fp8-ue8m0",
        "experts_on_disk": "per-expert", "files": sorted(files), "tokenizer": False, "seed": seed,
        "recipes": {r: {"reference": f"{NAME}/reference/{REFERENCE_OF[r]}.json", "options": RECIPE_OPTIONS[r],
                        "layout": RECIPES[r]["layout"]} for r in all_recipes},
        "size_bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()), "margins": summary,
    }  # fmt: skip


def make(first: int = SEED, tries: int = 200) -> None:
    t0 = time.time()
    V = config_text()["vocab_size"]
    for seed in range(first, first + tries):
        stored, source, sidecar = build(seed)
        prompt = [int(x) for x in np.random.default_rng(seed).integers(2, V, size=PROMPT_LEN)]
        results, why = {}, None
        for recipe, (weights, formats, fallbacks) in recipes(source, stored):
            res = run(weights, sidecar, prompt)
            why = why_not(res)
            if why:
                break
            results[recipe] = (res, formats, fallbacks)
        if why:
            print(f"  seed {seed} rejected ({recipe}: {why})", flush=True)
            continue
        entry = write(seed, stored, sidecar, prompt, results)
        check_written(source)
        index_path = ORACLES_DIR / "index.json"
        index = json.loads(index_path.read_text())
        index["fixtures"][NAME] = entry
        index_path.write_text(json.dumps(index, indent=1, allow_nan=False) + "\n")
        print(f"{NAME}: seed {seed}, {entry['size_bytes'] / 1024:.0f} KiB, {time.time() - t0:.1f}s")
        for r, s in entry["margins"].items():
            print(f"    {r:16s} greedy {s['min_greedy_margin']:.4f}  tf {s['min_tf_margin']:.4f}  "
                  f"router {s['min_router_margin']:.5f}  indexer {s['min_indexer_margin']:.5f}")  # fmt: skip
        return
    raise SystemExit("no seed passed the margin checks")


def read_fixture() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """(stored tensors, decoded source values, sidecar) of the committed fixture."""
    from colitools.formats.safetensors_io import SafetensorsFile

    with SafetensorsFile(ORACLES_DIR / NAME / "model.safetensors") as f:
        stored = {n: f.read(n) for n in f.tensors}
    sidecar = json.loads((ORACLES_DIR / NAME / ENGRAM_SIDECAR).read_text())
    return stored, decode(stored), sidecar


def check_written(source: dict[str, np.ndarray]) -> None:
    """The written folder decodes (this file's own decoders) to exactly the source values."""
    _, got, _ = read_fixture()
    assert got.keys() == source.keys()
    for name, want in source.items():
        assert np.array_equal(got[name], want), name


def mutations(names=None) -> int:
    """Each mutation on the f32 recipe's weights: changed greedy / teacher-forced tokens, max |d logit|."""
    index = json.loads((ORACLES_DIR / "index.json").read_text())["fixtures"][NAME]
    _, source, sidecar = read_fixture()
    ref = json.loads((ORACLES_DIR / NAME / "reference" / "f32.json").read_text())
    raw = zstandard.ZstdDecompressor().decompress(
        (ORACLES_DIR / NAME / "reference" / "f32.logits.zst").read_bytes()
    )
    want_logits = np.load(io.BytesIO(raw))
    base = run(source, sidecar, ref["prompt_ids"])
    assert base["generated_ids"] == ref["generated_ids"], "the f32 reference does not reproduce"
    missed = 0
    print(f"{NAME} (seed {index['seed']}): mutation -> greedy tokens changed / {NEW_TOKENS}, teacher-forced argmax "
          "changed, max |d logit|")  # fmt: skip
    text = reference_config(full_config()["text_config"])
    w = {k: torch.from_numpy(v.astype(np.float64)) for k, v in source.items()}
    tf_ids = ref["teacher_forced"]["input_ids"]
    for m, what in MUTATIONS.items():
        if names and m not in names:
            continue
        res = run(source, sidecar, ref["prompt_ids"], (m,))
        greedy = sum(a != b for a, b in zip(res["generated_ids"], ref["generated_ids"], strict=True))
        tf_logits = V41Reference(text, w, sidecar, (m,)).forward(tf_ids)  # the reference's own 40 tokens
        tf = tf_logits.argmax(-1).tolist()
        tf_changed = sum(a != b for a, b in zip(tf, ref["teacher_forced"]["argmax"], strict=True))
        got = np.stack([res["last_step"], tf_logits[-1].numpy().astype(np.float32)])
        d = float(np.abs(got - want_logits).max())
        caught = greedy or tf_changed or d > 1e-4
        missed += not caught
        print(f"  {m:22s} {greedy:2d}  {tf_changed:2d}  {d:.2e}  {'' if caught else 'MISSED  '}{what}", flush=True)
    print(f"{len(names or MUTATIONS)} mutations, {missed} missed")
    return missed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--mutations", action="store_true", help="report the mutation table of the committed fixture"
    )
    ap.add_argument("--seed", type=int, default=SEED, help="first seed to try")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.mutations:
        return 1 if mutations() else 0
    make(args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
