"""Planning time at real scale: a DeepSeek-R1-shaped skeleton (163 shards, 91,991 tensors), planned and re-planned.

``.venv/bin/python bench/plan.py [--workdir DIR] [--runs 3] [--profile N]``

1. Generates (once, under ``--workdir``, default ``/tmp/colitools-bench-plan``) a header-only checkpoint with
   DeepSeek-R1's published geometry: 61 decoder layers (3 dense, 58 MoE of 256 routed experts + 1 shared), the
   MTP layer 61, FP8 weights with 128x128 ``weight_scale_inv`` grids, BF16 embeddings / head / norms, packed
   into 163 shards of ~4.3 GB in tensor order (the real release's shard count). Each shard is its real
   safetensors header followed by a hole (``truncate`` to the full size: a sparse file, ~4 MB on disk in all).
2. Times, in this process, each best of ``--runs``:
   * ``plan``: what a fresh ``colitools convert`` does before its first unit: config, weight map, every
     shard header read and validated, inventory, plan (``runner.plan_for`` on an empty output) and the
     summary figures (``runner._summary``);
   * ``resume``: the same on an output whose ledger recorded the plan (``runner.plan_for`` finds it: the
     recorded plan is reused once the sources match it, ``Ledger.examine`` and the summary as a rerun makes
     them).
3. ``--profile N``: cProfile of the fresh plan, the N most expensive functions (cumulative), before the timings.

Target (issue 26, DESIGN performance targets): ``plan`` <= 5 s and ``resume`` well under it. The machine is
shared: the report prints the load average next to every figure.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import struct
import sys
import time
from pathlib import Path

HIDDEN, INTER, MOE_I, EXPERTS, VOCAB = 7168, 18432, 2048, 256, 129280
LAYERS, DENSE, SHARDS = 61, 3, 163
Q_LORA, KV_LORA, HEADS, NOPE, ROPE, V_HEAD = 1536, 512, 128, 128, 64, 128
BYTES = {"F8_E4M3": 1, "BF16": 2, "F32": 4}

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": HIDDEN,
    "intermediate_size": INTER, "moe_intermediate_size": MOE_I, "n_routed_experts": EXPERTS,
    "n_shared_experts": 1, "num_hidden_layers": LAYERS, "first_k_dense_replace": DENSE, "moe_layer_freq": 1,
    "num_nextn_predict_layers": 1, "vocab_size": VOCAB, "q_lora_rank": Q_LORA, "kv_lora_rank": KV_LORA,
    "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "qk_nope_head_dim": NOPE,
    "qk_rope_head_dim": ROPE, "v_head_dim": V_HEAD, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "max_position_embeddings": 163840, "tie_word_embeddings": False,
    "hidden_act": "silu", "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- skeleton
def _fp8(name: str, shape: tuple[int, int]) -> list[tuple[str, str, tuple[int, ...]]]:
    grid = (-(-shape[0] // 128), -(-shape[1] // 128))
    return [(name, "F8_E4M3", shape), (name + "_scale_inv", "F32", grid)]


def _mlp(p: str, inter: int) -> list:
    return (_fp8(f"{p}.gate_proj.weight", (inter, HIDDEN)) + _fp8(f"{p}.up_proj.weight", (inter, HIDDEN))
            + _fp8(f"{p}.down_proj.weight", (HIDDEN, inter)))  # fmt: skip


def _layer(i: int) -> list:
    p = f"model.layers.{i}"
    out = [(f"{p}.input_layernorm.weight", "BF16", (HIDDEN,)),
           (f"{p}.post_attention_layernorm.weight", "BF16", (HIDDEN,)),
           (f"{p}.self_attn.q_a_layernorm.weight", "BF16", (Q_LORA,)),
           (f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (KV_LORA,))]  # fmt: skip
    out += _fp8(f"{p}.self_attn.q_a_proj.weight", (Q_LORA, HIDDEN))
    out += _fp8(f"{p}.self_attn.q_b_proj.weight", (HEADS * (NOPE + ROPE), Q_LORA))
    out += _fp8(f"{p}.self_attn.kv_a_proj_with_mqa.weight", (KV_LORA + ROPE, HIDDEN))
    out += _fp8(f"{p}.self_attn.kv_b_proj.weight", (HEADS * (NOPE + V_HEAD), KV_LORA))
    out += _fp8(f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * V_HEAD))
    if i < DENSE:
        return out + _mlp(f"{p}.mlp", INTER)
    out += [(f"{p}.mlp.gate.weight", "BF16", (EXPERTS, HIDDEN)),
            (f"{p}.mlp.gate.e_score_correction_bias", "F32", (EXPERTS,))]  # fmt: skip
    out += _mlp(f"{p}.mlp.shared_experts", MOE_I)
    for e in range(EXPERTS):
        out += _mlp(f"{p}.mlp.experts.{e}", MOE_I)
    if i == LAYERS:  # the MTP module
        out += [(f"{p}.embed_tokens.weight", "BF16", (VOCAB, HIDDEN)), (f"{p}.enorm.weight", "BF16", (HIDDEN,)),
                (f"{p}.hnorm.weight", "BF16", (HIDDEN,)), (f"{p}.eh_proj.weight", "BF16", (HIDDEN, 2 * HIDDEN)),
                (f"{p}.shared_head.norm.weight", "BF16", (HIDDEN,)),
                (f"{p}.shared_head.head.weight", "BF16", (VOCAB, HIDDEN))]  # fmt: skip
    return out


def skeleton_tensors() -> list[tuple[str, str, tuple[int, ...]]]:
    """Every tensor of the skeleton (name, dtype, shape), in shard order: 91,991 of them."""
    out = [("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN))]
    for i in range(LAYERS + 1):
        out += _layer(i)
    return out + [("model.norm.weight", "BF16", (HIDDEN,)), ("lm_head.weight", "BF16", (VOCAB, HIDDEN))]


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = BYTES[dtype]
    for d in shape:
        n *= d
    return n


def write_shard(path: Path, tensors: list) -> None:
    """A safetensors header for ``tensors`` followed by a hole of their data size (a sparse file)."""
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        n = _nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def make_skeleton(folder: Path) -> Path:
    """The skeleton checkpoint in ``folder`` (reused when its index is there)."""
    if (folder / "model.safetensors.index.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tensors = skeleton_tensors()
    total = sum(_nbytes(d, s) for _, d, s in tensors)
    per_shard, shards, current, size = total / SHARDS, [], [], 0
    for t in tensors:
        current.append(t)
        size += _nbytes(t[1], t[2])
        if size >= per_shard * (len(shards) + 1) and len(shards) < SHARDS - 1:
            shards.append(current)
            current = []
    shards.append(current)
    weight_map = {}
    for k, group in enumerate(shards, 1):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        write_shard(folder / name, group)
        weight_map.update(dict.fromkeys((n for n, _, _ in group), name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return folder


# ---------------------------------------------------------------------------------------------- timings
def plan_once(src_dir: Path, out: Path):
    """What a conversion does before its first unit: the plan (recorded or fresh), the ledger's checks and the
    summary figures (``runner.plan_and_summary``)."""
    from colitools.converters import runner
    from colitools.converters.options import ConvertOptions
    from colitools.converters.sources import LocalFolderSource

    return runner.plan_and_summary(LocalFolderSource(src_dir), out, ConvertOptions(progress=False))


def record_plan(src_dir: Path, out: Path) -> None:
    """An output folder as a conversion leaves it once it started: the ledger and the plan it records."""
    from colitools.converters import plan_record, runner
    from colitools.converters.ledger import Ledger
    from colitools.converters.sources import LocalFolderSource

    shutil.rmtree(out, ignore_errors=True)
    planned, _, _ = plan_once(src_dir, out)
    Ledger.open(out, planned.plan, LocalFolderSource(src_dir).describe(), planned.identities)
    t = time.perf_counter()
    with runner._gc_paused():  # as the runner records it
        plan_record.record(out, planned.plan, planned.key)
    print(
        f"record    {time.perf_counter() - t:6.2f} s ({(out / plan_record.PLAN_FILE).stat().st_size / 1e6:.1f} MB)"
    )


def best_of(runs: int, fn) -> tuple[float, float, list[float]]:
    """Best wall seconds, the CPU seconds of that run (this process: the figure a loaded machine does not
    inflate), and every run's wall seconds."""
    times = []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        fn()
        times.append((time.perf_counter() - t, time.process_time() - c))
    wall, cpu = min(times)
    return wall, cpu, [w for w, _ in times]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/colitools-bench-plan"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--profile", type=int, default=0, help="print the N most expensive functions of a fresh plan"
    )
    args = ap.parse_args(argv)
    src = make_skeleton(args.workdir / "deepseek-r1-skeleton")
    fresh, recorded = args.workdir / "out-fresh", args.workdir / "out-recorded"
    shutil.rmtree(fresh, ignore_errors=True)
    n = len(json.loads((src / "model.safetensors.index.json").read_text())["weight_map"])
    shards = len(list(src.glob("*.safetensors")))
    print(f"skeleton: {src} ({shards} shards, {n} tensors); load {os.getloadavg()[0]:.2f}")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(plan_once, src, fresh)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(args.profile)
    plan_s, plan_cpu, plan_all = best_of(args.runs, lambda: plan_once(src, fresh))
    print(f"plan      {plan_s:6.2f} s ({plan_cpu:.2f} CPU-s) best of {args.runs} "
          f"({', '.join(f'{t:.2f}' for t in plan_all)}); load {os.getloadavg()[0]:.2f}")  # fmt: skip
    record_plan(src, recorded)
    resume_s, resume_cpu, resume_all = best_of(args.runs, lambda: plan_once(src, recorded))
    print(f"resume    {resume_s:6.2f} s ({resume_cpu:.2f} CPU-s) best of {args.runs} "
          f"({', '.join(f'{t:.2f}' for t in resume_all)}); load {os.getloadavg()[0]:.2f}")  # fmt: skip
    ok = plan_s <= 5.0 and resume_s < plan_s
    print(f"target plan <= 5 s, resume < plan: {'PASS' if ok else 'MISS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
