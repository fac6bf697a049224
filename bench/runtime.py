"""Reference-runtime benchmarks, each against a named peer measured in the same run.

1. **int4-g64 matvec vs float32 BLAS matvec** (``np.dot(W, x)``, OpenBLAS sgemv) of the same ``[O, I]``:
   * ``hot``: one matrix, the same call repeated (the weight stays in cache; 260 MB L3 on this machine);
   * ``stream``: a ring of distinct matrices larger than the last-level cache, each used once per pass —
     what an MoE decode step does with its experts.
   Best of ``--repeat``; ratio = BLAS time / int4 time; measured with 2 threads each and with 1 thread each
   (OpenBLAS and the runtime's pool), each in its own subprocess. Each timed loop starts after ``IDLE_S``
   (0.5 s) of sleep: OpenBLAS's idle threads keep polling for 0.1-0.2 s after a call, and a loop timed while
   the other engine's threads still poll shares the 2 cores with them. On a shared machine use ``--repeat 30``.
2. **Decode tok/s** of a generated model with half the depth of OLMoE-1B-7B (8 layers, hidden 2048, 64
   experts, top-8, expert intermediate 1024, vocab 50304) stored as a colitools container with random codes:
   int4-g64 experts, int8-row attention / embeddings / head, F32 norms and routers. The runtime runs it in a
   subprocess; transformers runs the *same weights* (dequantized, BF16, CPU, sdpa) in a subprocess of the
   ``oracles`` venv when one is found (``--hf-python``, default ``.oracle-venv/bin/python`` in the checkout). Both do a
   warm-up generation, then greedy-decode ``--tokens`` after a 16-token prompt; we report decode tok/s (prefill
   excluded), peak RSS of each process and the ratio.

3. **Families**: one oracle fixture per runnable family of the current generation (the first fixture in
   ``oracles/index.json`` whose ``model_type`` is in ``oracles/fixture_specs.py`` ``CURRENT_GENERATION`` and
   in ``RUNNABLE_MODEL_TYPES``, so a family made runnable later appears without editing this file). The same
   float32 weights (the fixture folder itself) run through ``colitools run --json`` and through transformers
   float32 CPU (eager attention, ``architectures[0]`` of its config, the oracle venv), each in its own
   subprocess without warm-up and with ``--family-threads`` threads each (default 1: on these tiny matrices
   torch's 2-thread pool mostly spins, 4 tok/s instead of ~90 on a busy 2-core box): decode tok/s (prefill
   excluded) and peak RSS for ``--tokens`` greedy tokens after the fixture's 8-token prompt, and whether both
   generated the same tokens (and the f32 reference's). The fixtures are tiny (hidden 64, 2 layers): the
   numbers show per-token overheads, not large-model throughput.

Run: ``.venv/bin/python bench/runtime.py`` (``--skip-decode`` / ``--skip-matvec`` / ``--skip-families`` for
fewer parts). The decode model is written once into ``--workdir`` (about 2.2 GB) and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHAPES = [(2048, 1408), (1408, 2048), (4096, 14336)]
MODEL = dict(
    model_type="olmoe", vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=8,
    num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, rms_norm_eps=1e-5,
    max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    norm_topk_prob=False, tie_word_embeddings=False, eos_token_id=None, pad_token_id=None, bos_token_id=None,
    clip_qkv=None, attention_bias=False,
)  # fmt: skip
WEIGHT_STD = 0.02
# Before each timed loop of part 1: long enough for the previous loop's idle threads to stop polling and sleep
# (OpenBLAS's keep polling for 0.1-0.2 s after a call, measured: a 2-thread int4 matvec timed in that window took
# 1.5-2.5x as long; the runtime's pool polls for 0.1 ms), so neither engine is timed while the other's threads
# still take a core.
IDLE_S = 0.5


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------------------------- matvec
def best(fn, repeat: int, number: int = 1, idle: float = 0.0) -> float:
    time.sleep(idle)
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return min(times)


def bench_shape(O: int, I: int, rng: np.random.Generator, repeat: int, stream_mb: int) -> dict:
    from colitools.runtime.kernels import QTensor

    ring = max(2, -(-stream_mb * 2**20 // (O * I * 4)))
    ws = [WEIGHT_STD * rng.standard_normal((O, I), dtype=np.float32) for _ in range(ring)]
    scales = [
        (WEIGHT_STD / 4.6 * (1 + 0.1 * rng.random((O, I // 64)))).astype(np.float32) for _ in range(ring)
    ]
    qs = [QTensor("int4", rng.integers(0, 256, (O, I // 2), dtype=np.uint8), s, O, I, 64) for s in scales]
    x = rng.standard_normal(I, dtype=np.float32)
    x2 = x.reshape(1, I)
    hot_blas = best(lambda: np.dot(ws[0], x), repeat, 10, idle=IDLE_S)
    hot_q = best(lambda: qs[0].matmul(x2), repeat, 10, idle=IDLE_S)
    stream_blas = best(lambda: [np.dot(w, x) for w in ws], repeat, idle=IDLE_S) / ring
    stream_q = best(lambda: [q.matmul(x2) for q in qs], repeat, idle=IDLE_S) / ring
    return dict(shape=[O, I], ring=ring, hot_blas_us=hot_blas * 1e6, hot_int4_us=hot_q * 1e6,
                hot_ratio=hot_blas / hot_q, stream_blas_us=stream_blas * 1e6, stream_int4_us=stream_q * 1e6,
                stream_ratio=stream_blas / stream_q)  # fmt: skip


def bench_matvec(repeat: int, stream_mb: int) -> list[dict]:
    rng = np.random.default_rng(0)
    return [bench_shape(O, I, rng, repeat, stream_mb) for O, I in SHAPES]


# ---------------------------------------------------------------------------------------- the bench model
def build_model(out: Path) -> Path:
    """Write the container (random codes, fixed seed) unless ``out`` already holds it."""
    from colitools.formats.resolver import SHAPES_KEY, encode_shapes
    from colitools.formats.safetensors_io import SafetensorsWriter

    stamp = out / "BENCH_OK"
    if stamp.exists() and json.loads(stamp.read_text()) == MODEL:
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    H, I, E, V, L = (MODEL[k] for k in ("hidden_size", "intermediate_size", "num_experts", "vocab_size",
                                        "num_hidden_layers"))  # fmt: skip

    def int8_row(O, In):  # uniform int8 codes have std ~73.9
        return rng.integers(0, 256, (O, In), dtype=np.uint8), np.full(O, WEIGHT_STD / 73.9, np.float32)

    def int4_g64(O, In):  # uniform int4 values have std ~4.6
        s = (WEIGHT_STD / 4.6 * (1 + 0.1 * rng.random((O, In // 64)))).astype(np.float32)
        return rng.integers(0, 256, (O, In // 2), dtype=np.uint8), s

    def write(path: Path, tensors: list[tuple[str, np.ndarray]], shapes: dict) -> None:
        entries = [(n, {np.float32: "F32", np.uint8: "U8"}[a.dtype.type], a.shape) for n, a in tensors]
        with SafetensorsWriter(path, entries, {SHAPES_KEY: encode_shapes(shapes)}) as w:
            for n, a in tensors:
                w.write(n, a)

    weight_map = {}
    glob_t, glob_s = [], {}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        c, s = int8_row(V, H)
        glob_t += [(name, c), (name + ".qs", s)]
        glob_s[name] = (V, H)
    glob_t.append(("model.norm.weight", np.ones(H, np.float32)))
    write(out / "model-globals.safetensors", glob_t, glob_s)
    weight_map.update({n: "model-globals.safetensors" for n, _ in glob_t})
    for layer in range(L):
        p = f"model.layers.{layer}"
        t, shapes = [], {}
        for n in ("input_layernorm", "post_attention_layernorm"):
            t.append((f"{p}.{n}.weight", np.ones(H, np.float32)))
        for n in ("q_norm", "k_norm"):
            t.append((f"{p}.self_attn.{n}.weight", np.ones(H, np.float32)))
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            c, s = int8_row(H, H)
            t += [(f"{p}.self_attn.{n}.weight", c), (f"{p}.self_attn.{n}.weight.qs", s)]
            shapes[f"{p}.self_attn.{n}.weight"] = (H, H)
        t.append((f"{p}.mlp.gate.weight", (WEIGHT_STD * rng.standard_normal((E, H))).astype(np.float32)))
        for e in range(E):  # pairs layout: gate, up, down codes back to back, then their scales
            names = [f"{p}.mlp.experts.{e}.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
            enc = [int4_g64(I, H), int4_g64(I, H), int4_g64(H, I)]
            t += [(n, c) for n, (c, _) in zip(names, enc, strict=True)]
            t += [(n + ".qs", s) for n, (_, s) in zip(names, enc, strict=True)]
            shapes.update({names[0]: (I, H), names[1]: (I, H), names[2]: (H, I)})
        fname = f"model-layer{layer:02d}.safetensors"
        write(out / fname, t, shapes)
        weight_map.update({n: fname for n, _ in t})
        print(f"  wrote {fname}", file=sys.stderr)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps({**MODEL, "architectures": ["OlmoeForCausalLM"]}, indent=1))
    stamp.write_text(json.dumps(MODEL))
    return out


def prompt_ids() -> list[int]:
    return [int(t) for t in np.random.default_rng(7).integers(0, MODEL["vocab_size"], 16)]


# ------------------------------------------------------------------------------------------ the two runners
def run_ours(model_dir: Path, tokens: int) -> dict:
    from colitools.runtime import generate, load_model

    t0 = time.perf_counter()
    with load_model(model_dir, record_usage=False) as model:
        load_s = time.perf_counter() - t0
        generate(model, prompt_ids()[::-1], 8)  # warm-up: compile, first expert reads
        res = generate(model, prompt_ids(), tokens)
        stats = model.stats()
    return dict(engine="colitools runtime (int4-g64 codes, f32 math)", tok_per_s=res.decode_tok_per_s,
                prefill_s=res.prefill_seconds, load_s=load_s, peak_rss_mb=peak_rss_mb(),
                hit_rate=stats["expert_cache_hit_rate"], cap=stats["cap"], generated=res.generated_ids)  # fmt: skip


HF_SCRIPT = r"""
import json, resource, sys, time
from pathlib import Path
import numpy as np, torch
from transformers import OlmoeConfig, OlmoeForCausalLM
from colitools.formats.registry import by_name
from colitools.formats.container import resolve_container
from colitools.formats.safetensors_io import SafetensorsFile

model_dir, tokens, prompt = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
torch.set_num_threads(2)
t0 = time.perf_counter()
cfg = json.loads((model_dir / "config.json").read_text())
config = OlmoeConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
torch.set_default_dtype(torch.bfloat16)
with torch.device("meta"):
    model = OlmoeForCausalLM(config)
model = model.to_empty(device="cpu").eval()
torch.set_default_dtype(torch.float32)
rot = model.model.rotary_emb
inv, rot.attention_scaling = rot.compute_default_rope_parameters(config)
rot.inv_freq = inv; rot.original_inv_freq = inv.clone()
I = cfg["intermediate_size"]
files = [SafetensorsFile(p) for p in sorted(model_dir.glob("*.safetensors"))]
resolved = resolve_container(files)
byfile = {str(f.path): f for f in files}
for name, r in resolved.items():
    if r.kind == "scale":
        continue
    f = byfile[r.file]
    if r.kind == "quantized":
        O, In = r.logical_shape
        w = by_name(r.format.name).decode(f.read(name), f.read(r.scale), O, In, r.format.group_size)
    else:
        w = f.read(name)
    t = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).to(torch.bfloat16)
    parts = name.split(".")
    if ".experts." in name:
        L, e, proj = int(parts[2]), int(parts[5]), parts[6]
        ex = model.model.layers[L].mlp.experts
        with torch.no_grad():
            if proj == "down_proj":
                ex.down_proj[e].copy_(t)
            else:
                ex.gate_up_proj[e, (0 if proj == "gate_proj" else I):(I if proj == "gate_proj" else 2 * I)].copy_(t)
    else:
        with torch.no_grad():
            model.get_parameter(name).copy_(t)
load_s = time.perf_counter() - t0

@torch.no_grad()
def greedy(ids, n):
    t0 = time.perf_counter()
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    t1 = time.perf_counter()
    cache, toks = out.cache, []
    for _ in range(n):
        tok = int(out.logits[0, -1].float().argmax())
        toks.append(tok)
        if len(toks) == n:
            break
        out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
        cache = out.cache
    return toks, t1 - t0, time.perf_counter() - t1

greedy(prompt[::-1], 8)
toks, prefill, decode = greedy(prompt, tokens)
print(json.dumps(dict(engine=f"transformers {__import__('transformers').__version__} bf16 CPU (torch {torch.__version__}, sdpa)",
    tok_per_s=(len(toks) - 1) / decode, prefill_s=prefill, load_s=load_s,
    peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, generated=toks)))
"""


# ------------------------------------------------------------------------------------- the families part
ORACLES = Path(__file__).resolve().parents[1] / "oracles"

HF_FAMILY_SCRIPT = r"""
import json, resource, sys, time
from pathlib import Path
import torch, transformers

model_dir, tokens, prompt = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
torch.set_num_threads(int(sys.argv[4]))
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
cfg = json.loads((model_dir / "config.json").read_text())
t0 = time.perf_counter()
model = getattr(transformers, cfg["architectures"][0]).from_pretrained(
    model_dir, dtype=torch.float32, attn_implementation="eager").eval()
load_s = time.perf_counter() - t0

@torch.no_grad()
def greedy(ids, n):
    t0 = time.perf_counter()
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    t1 = time.perf_counter()
    cache, toks = out.cache, []
    for _ in range(n):
        toks.append(int(out.logits[0, -1].argmax()))
        if len(toks) == n:
            break
        out = model(input_ids=torch.tensor([[toks[-1]]]), cache=cache, use_cache=True)
        cache = out.cache
    return toks, t1 - t0, time.perf_counter() - t1

toks, prefill, decode = greedy(prompt, tokens)
engine = f"transformers {transformers.__version__} f32 CPU (torch {torch.__version__}, eager)"
print(json.dumps(dict(engine=engine,
    tok_per_s=(len(toks) - 1) / decode, prefill_s=prefill, load_s=load_s,
    peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, generated=toks)))
"""


def family_fixtures() -> list[str]:
    """One fixture per runnable current-generation family, in ``index.json`` order."""
    sys.path.insert(0, str(ORACLES))
    from fixture_specs import CURRENT_GENERATION

    from colitools.formats.families import RUNNABLE_MODEL_TYPES

    chosen: dict[str, str] = {}
    for name, fx in json.loads((ORACLES / "index.json").read_text())["fixtures"].items():
        mt = fx["model_type"]
        # CURRENT_GENERATION names families; Inkling's fixture type is its wrapper's (inkling_mm_model)
        if (mt in CURRENT_GENERATION or name in CURRENT_GENERATION) and mt in RUNNABLE_MODEL_TYPES:
            chosen.setdefault(mt, name)
    return list(chosen.values())


def run_colitools(model_dir: Path, tokens: int, prompt: list[int], threads: int) -> dict:
    """``colitools run --json`` in a subprocess (the installed console script's module)."""
    cmd = [sys.executable, "-m", "colitools", "run", str(model_dir), "--prompt-ids",
           ",".join(map(str, prompt)), "--max-new-tokens", str(tokens), "--ignore-eos", "--no-usage",
           "--json"]  # fmt: skip
    env = {**os.environ, "COLITOOLS_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "NUMBA_NUM_THREADS": str(threads)}  # fmt: skip
    r = subprocess_json(cmd, env)
    return dict(engine="colitools run (f32 checkpoint, f32 math)", tok_per_s=r["tok_per_s"],
                prefill_s=r["prefill_s"], load_s=r["load_s"], peak_rss_mb=r["peak_rss_bytes"] / 2**20,
                generated=r["generated_ids"])  # fmt: skip


def bench_families(tokens: int, hf_python: str, threads: int) -> list[dict]:
    rows = []
    for fixture in family_fixtures():
        d = ORACLES / fixture
        ref = json.loads((d / "reference" / "f32.json").read_text())
        prompt = ref["prompt_ids"]
        ours = run_colitools(d, tokens, prompt, threads)
        hf = None
        if Path(hf_python).exists():
            cmd = [hf_python, "-c", HF_FAMILY_SCRIPT, str(d), str(tokens), json.dumps(prompt), str(threads)]
            hf = subprocess_json(cmd, {**os.environ, "OMP_NUM_THREADS": str(threads)})
        rows.append(dict(fixture=fixture, model_type=ref["model_type"], ours=ours, hf=hf,
                         reference=ref["generated_ids"][:tokens]))  # fmt: skip
    return rows


def subprocess_json(cmd: list[str], env: dict | None = None) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"benchmark subprocess failed ({' '.join(cmd[:3])} ...):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--stream-mb", type=int, default=1024, help="float32 bytes of the streaming ring per shape"
    )
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/colitools-bench-runtime"))
    ap.add_argument("--hf-python", default=str(Path(__file__).resolve().parents[1] / ".oracle-venv" / "bin" / "python"))
    ap.add_argument("--skip-matvec", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-families", action="store_true")
    ap.add_argument(
        "--family-threads", type=int, default=1, help="threads of each engine in the families part"
    )
    ap.add_argument("--_ours", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_matvec", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._matvec:
        print(json.dumps(bench_matvec(args.repeat, args.stream_mb)))
        return 0
    if args._ours:
        print(json.dumps(run_ours(args._ours, args.tokens)))
        return 0
    import numba

    print(f"machine: {os.cpu_count()} CPUs, numba {numba.__version__} threads {numba.get_num_threads()}, "
          f"numpy {np.__version__}")  # fmt: skip
    if not args.skip_matvec:
        print(
            "\nint4-g64 matvec (numba, codes read in place) vs float32 BLAS matvec np.dot(W, x), same [O, I]"
        )
        for threads in (2, 1):
            # Thread counts are fixed at process start (OpenBLAS reads its env once): one subprocess each.
            env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "COLITOOLS_THREADS": str(threads)}
            cmd = [sys.executable, __file__, "--_matvec", "--repeat", str(args.repeat), "--stream-mb",
                   str(args.stream_mb)]  # fmt: skip
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if r.returncode:
                raise SystemExit(r.stderr[-3000:])
            print(f"  {threads} thread(s) each:")
            print(f"  {'shape':>14} {'hot BLAS':>10} {'hot int4':>10} {'ratio':>6}   {'stream BLAS':>11} "
                  f"{'stream int4':>11} {'ratio':>6}  ring")  # fmt: skip
            for row in json.loads(r.stdout):
                print(f"  {str(row['shape']):>14} {row['hot_blas_us']:>8.0f}us {row['hot_int4_us']:>8.0f}us "
                      f"{row['hot_ratio']:>5.2f}x   {row['stream_blas_us']:>9.0f}us {row['stream_int4_us']:>9.0f}us "
                      f"{row['stream_ratio']:>5.2f}x  {row['ring']}")  # fmt: skip
    if not args.skip_decode:
        print(f"\ndecode: OLMoE-1B-7B at half depth ({MODEL['num_hidden_layers']} layers, hidden 2048, 64 experts, "
              f"top-8), int4-g64 experts / int8-row dense, {args.tokens} tokens after a 16-token prompt")  # fmt: skip
        model_dir = build_model(args.workdir / "olmoe-half-int4")
        results = [
            subprocess_json(
                [sys.executable, __file__, "--_ours", str(model_dir), "--tokens", str(args.tokens)]
            )
        ]
        if Path(args.hf_python).exists():
            results.append(subprocess_json([args.hf_python, "-c", HF_SCRIPT, str(model_dir), str(args.tokens),
                                            json.dumps(prompt_ids())]))  # fmt: skip
        else:
            print(f"  (transformers not measured: {args.hf_python} not found; install the oracles extra)")
        for r in results:
            extra = (
                f"  expert cache hit {100 * r['hit_rate']:.1f}% (cap {r['cap']})" if "hit_rate" in r else ""
            )
            print(f"  {r['engine']:<60} {r['tok_per_s']:7.2f} tok/s  peak RSS {r['peak_rss_mb']:7.0f} MiB  "
                  f"load {r['load_s']:5.1f}s  prefill {r['prefill_s']:5.2f}s{extra}")  # fmt: skip
        if len(results) == 2:
            same = sum(a == b for a, b in zip(results[0]["generated"], results[1]["generated"], strict=True))
            print(f"  ratio: {results[0]['tok_per_s'] / results[1]['tok_per_s']:.2f}x tok/s, "
                  f"{results[0]['peak_rss_mb'] / results[1]['peak_rss_mb']:.2f}x peak RSS "
                  f"(greedy tokens equal at {same}/{args.tokens} positions; bf16 vs f32 math)")  # fmt: skip
    if not args.skip_families:
        print(f"\nfamilies: one oracle fixture per runnable current-generation family, float32 weights, "
              f"{args.tokens} greedy tokens after its 8-token prompt, {args.family_threads} thread(s) each, "
              f"no warm-up")  # fmt: skip
        if not Path(args.hf_python).exists():
            print(f"  (transformers not measured: {args.hf_python} not found; install the oracles extra)")
        rows = bench_families(args.tokens, args.hf_python, args.family_threads)
        if not rows:
            print("  (no runnable current-generation fixture)")
        engines = {r["ours"]["engine"] for r in rows} | {r["hf"]["engine"] for r in rows if r["hf"]}
        print("  engines: " + "; ".join(sorted(engines)))
        print(f"  {'fixture':<22} {'colitools tok/s':>15} {'RSS MiB':>8} {'transformers tok/s':>18} "
              f"{'RSS MiB':>8} {'tok/s ratio':>11} {'RSS ratio':>9}  tokens")  # fmt: skip
        for row in rows:
            o, h = row["ours"], row["hf"]
            n = len(row["reference"])
            same_ref = sum(a == b for a, b in zip(o["generated"], row["reference"], strict=False))
            if h is None:
                print(f"  {row['fixture']:<22} {o['tok_per_s']:>15.1f} {o['peak_rss_mb']:>8.0f}  "
                      f"(no transformers)  = reference {same_ref}/{n}")  # fmt: skip
                continue
            same = sum(a == b for a, b in zip(o["generated"], h["generated"], strict=True))
            print(f"  {row['fixture']:<22} {o['tok_per_s']:>15.1f} {o['peak_rss_mb']:>8.0f} "
                  f"{h['tok_per_s']:>18.1f} {h['peak_rss_mb']:>8.0f} "
                  f"{o['tok_per_s'] / h['tok_per_s']:>10.2f}x "
                  f"{o['peak_rss_mb'] / h['peak_rss_mb']:>8.2f}x  equal {same}/{args.tokens}, "
                  f"= f32 reference {same_ref}/{n}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
