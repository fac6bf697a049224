"""Benchmark of ``colitools convert`` against gguf-py, measured side by side in the same run.

1. BF16 -> int4-g64, whole process (``python -m colitools convert``, every 2-D weight to int4-g64), on a
   generated ~1 GB MoE checkpoint; gguf-py (``gguf.quants.quantize(..., Q4_0)``, numpy) quantizes the same
   tensors in this process (reading them included, writing not: the peer gets the benefit of the doubt).
   Runs are interleaved (ours, gguf, ours, gguf, ...) so that load from other processes hits both sides;
   best and median of each are printed, with CPU seconds (a loaded machine shows in CPU / wall).
   Target: ratio >= 3x.
2. FP8 (block-scaled, DeepSeek-V3 convention) -> int4-g64, whole process and in-process: GB/s of FP8 input
   (the F8_E4M3 weight bytes; the checkpoint's BF16 embeddings and norms are converted too, but not counted).
3. Peak RSS of the converter process for a ~1 GB and a ~4 GB checkpoint with the same tensor shapes: it should
   not grow with the model. Measured as the child's ``VmHWM`` (``/proc/PID/status``), polled until it exits:
   ``ru_maxrss`` of a child started by a large parent is not usable here, because Linux carries the parent's
   high-water mark over ``fork``/``exec`` into it (the benchmark process itself holds ~0.4 GB after gguf).

Checkpoints are generated under ``.bench-tmp/`` in the checkout (or ``--workdir``) and deleted at the end.
Usage: ``.venv/bin/python bench/convert.py [--workdir DIR] [--runs N] [--skip-4gb]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from colitools.formats.safetensors_io import SafetensorsFile, SafetensorsWriter

GB = 1_000_000_000
HIDDEN, INTER, VOCAB, ATTN = 2048, 1024, 8192, 4


def generate(folder: Path, layers: int, experts: int, dtype: str, seed: int = 0) -> int:
    """A DeepSeek-style MoE checkpoint, one shard per layer (plus one for globals); returns tensor bytes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0

    def shard(fname: str, shapes: dict[str, tuple[int, ...]]) -> None:
        nonlocal total
        arrays: dict[str, np.ndarray] = {}
        for name, shape in shapes.items():
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            if dtype == "FP8" and len(shape) == 2 and ".layers." in name and not name.endswith("gate.weight"):
                s = np.abs(w).reshape(-1).max() / np.float32(448)
                arrays[name] = (w / s).astype(ml_dtypes.float8_e4m3fn)
                grid = (-(-shape[0] // 128), -(-shape[1] // 128))
                arrays[name + "_scale_inv"] = np.full(grid, s, np.float32)
            else:
                arrays[name] = w.astype(ml_dtypes.bfloat16)
        entries = [(n, _st(a.dtype), a.shape) for n, a in arrays.items()]
        with SafetensorsWriter(folder / fname, entries) as wr:
            for n, a in arrays.items():
                wr.write(n, a)
        for n, a in arrays.items():
            weight_map[n] = fname
            total += a.nbytes

    n_shards = layers + 1
    name = lambda k: f"model-{k:05d}-of-{n_shards:05d}.safetensors"  # noqa: E731
    shard(name(1), {"model.embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN),
                    "model.norm.weight": (HIDDEN,)})  # fmt: skip
    for L in range(layers):
        p = f"model.layers.{L}"
        shapes: dict[str, tuple[int, ...]] = {
            f"{p}.input_layernorm.weight": (HIDDEN,),
            f"{p}.mlp.gate.weight": (experts, HIDDEN),
        }
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj")[:ATTN]:
            shapes[f"{p}.self_attn.{proj}.weight"] = (HIDDEN, HIDDEN)
        for e in range(experts):
            shapes[f"{p}.mlp.experts.{e}.gate_proj.weight"] = (INTER, HIDDEN)
            shapes[f"{p}.mlp.experts.{e}.up_proj.weight"] = (INTER, HIDDEN)
            shapes[f"{p}.mlp.experts.{e}.down_proj.weight"] = (HIDDEN, INTER)
        shard(name(L + 2), shapes)
    config = {"model_type": "deepseek_v3", "hidden_size": HIDDEN, "vocab_size": VOCAB, "num_hidden_layers": layers,
              "moe_intermediate_size": INTER, "n_routed_experts": experts}  # fmt: skip
    if dtype == "FP8":
        config["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "weight_block_size": [128, 128],
        }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    os.sync()  # the generator's dirty pages must not be flushed during the timed conversion
    return total


def _st(dtype: np.dtype) -> str:
    from colitools.formats.dtypes import safetensors_name

    return safetensors_name(dtype)


def run_convert(src: Path, out: Path, *extra: str) -> dict:
    """Whole-process conversion; returns the JSON summary plus wall and CPU seconds and the peak RSS."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0", "--json",
           "--experts", "int4-g64", "--dense", "int4-g64", "--embed", "int4-g64", *extra]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    hwm_kb = 0
    while True:  # the pipes stay small (one JSON summary), so polling cannot deadlock on them
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        hwm_kb = max(hwm_kb, _vm_hwm_kb(proc.pid))
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"convert failed ({proc.returncode}): {stderr.decode()}")
    summary = json.loads(stdout)
    summary["wall_process"] = wall
    summary["cpu_process"] = rusage.ru_utime + rusage.ru_stime  # all threads of exactly this child
    summary["peak_rss_mb"] = hwm_kb / 1024
    return summary


def _vm_hwm_kb(pid: int) -> int:
    """Peak resident set of process ``pid`` since its exec (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _gguf_once(src: Path) -> tuple[float, float, int]:
    """gguf-py Q4_0 of every 2-D weight of ``src`` (read + quantize): wall and CPU seconds, source bytes."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    index = json.loads((src / "model.safetensors.index.json").read_text())
    t0, c0 = time.perf_counter(), time.process_time()
    nbytes = 0
    for shard in sorted(set(index["weight_map"].values())):
        with SafetensorsFile(src / shard) as f:
            for name, info in f.tensors.items():
                nbytes += info.nbytes
                w = f.read(name).astype(np.float32)
                if w.ndim == 2:
                    quantize(w, GGMLQuantizationType.Q4_0)
    return time.perf_counter() - t0, time.process_time() - c0, nbytes


def fp8_bytes(src: Path) -> int:
    """Bytes of the F8_E4M3 tensors of a checkpoint (what "GB/s of FP8 input" counts)."""
    index = json.loads((src / "model.safetensors.index.json").read_text())
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        with SafetensorsFile(src / shard) as f:
            total += sum(i.nbytes for i in f.tensors.values() if i.dtype == "F8_E4M3")
    return total


def _stats(values: list[float]) -> tuple[float, float]:
    return min(values), statistics.median(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path(__file__).resolve().parents[1] / ".bench-tmp")
    ap.add_argument("--runs", type=int, default=5, help="interleaved runs of each side (best and median)")
    ap.add_argument("--skip-4gb", action="store_true")
    args = ap.parse_args()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    try:
        # numba compiles its kernels once per install (on-disk cache): fill the cache before timing anything.
        for dtype in ("BF16", "FP8"):
            generate(work / "warm", layers=1, experts=1, dtype=dtype)
            run_convert(work / "warm", work / "out")
            shutil.rmtree(work / "warm")
        # ~1.2 GB: 4 layers x 20 experts x 12.6 MB + attention + embeddings
        size = generate(work / "bf16-1g", layers=4, experts=20, dtype="BF16")
        print(f"generated BF16 checkpoint: {size / GB:.2f} GB")
        # interleaved (ours, gguf, ours, gguf, ...), so that a burst of load from other processes on the
        # machine does not favour either side
        ours, peer = [], []
        for _ in range(args.runs):
            ours.append(run_convert(work / "bf16-1g", work / "out"))
            peer.append(_gguf_once(work / "bf16-1g"))
        w_best, w_med = _stats([r["wall_process"] for r in ours])
        c_best, c_med = _stats([r["cpu_process"] for r in ours])
        in_best, in_med = _stats([r["wall_seconds"] for r in ours])
        g_best, g_med = _stats([p[0] for p in peer])
        gc_best, gc_med = _stats([p[1] for p in peer])
        n = peer[0][2]
        print(f"colitools convert BF16 -> int4-g64 (whole process): best {w_best:.2f} s = {size / GB / w_best:.3f} "
              f"GB/s, median {w_med:.2f} s = {size / GB / w_med:.3f} GB/s; CPU {c_best:.2f} / {c_med:.2f} s; "
              f"in-process {size / GB / in_best:.3f} / {size / GB / in_med:.3f} GB/s")  # fmt: skip
        print(f"gguf-py Q4_0 (numpy, read + quantize, same tensors): best {g_best:.2f} s = {n / GB / g_best:.3f} "
              f"GB/s, median {g_med:.2f} s; CPU {gc_best:.2f} / {gc_med:.2f} s")  # fmt: skip
        print(f"ratio colitools / gguf-py: best {g_best / w_best:.2f}x, median {g_med / w_med:.2f}x, "
              f"CPU seconds {gc_med / c_med:.2f}x (target >= 3x; {args.runs} interleaved runs each)")  # fmt: skip
        two = [run_convert(work / "bf16-1g", work / "out", "--workers", "2") for _ in range(3)]
        t_best, t_med = _stats([r["wall_process"] for r in two])
        print(
            f"  with --workers 2: best {t_best:.2f} s = {size / GB / t_best:.3f} GB/s, median {t_med:.2f} s"
        )
        rss_1g = max(r["peak_rss_mb"] for r in ours)
        shutil.rmtree(work / "out", ignore_errors=True)

        fp8 = generate(work / "fp8-1g", layers=4, experts=20, dtype="FP8", seed=1)
        shutil.rmtree(work / "bf16-1g")
        f8 = fp8_bytes(work / "fp8-1g")
        res = [run_convert(work / "fp8-1g", work / "out") for _ in range(args.runs)]
        w_best, w_med = _stats([r["wall_process"] for r in res])
        in_best, in_med = _stats([r["wall_seconds"] for r in res])
        c_best, c_med = _stats([r["cpu_process"] for r in res])
        print(f"colitools convert FP8 -> int4-g64: {f8 / GB:.2f} GB of FP8 weights ({fp8 / GB:.2f} GB source); "
              f"whole process best {w_best:.2f} s = {f8 / GB / w_best:.3f} GB/s of FP8 input, median "
              f"{w_med:.2f} s = {f8 / GB / w_med:.3f} GB/s; in-process {f8 / GB / in_best:.3f} / "
              f"{f8 / GB / in_med:.3f} GB/s; CPU {c_best:.2f} / {c_med:.2f} s")  # fmt: skip
        shutil.rmtree(work / "fp8-1g")
        shutil.rmtree(work / "out", ignore_errors=True)

        if not args.skip_4gb:
            big = generate(work / "bf16-4g", layers=16, experts=20, dtype="BF16", seed=2)
            res4 = run_convert(work / "bf16-4g", work / "out")
            print(f"peak RSS: {rss_1g:.0f} MB for {size / GB:.2f} GB, "
                  f"{res4['peak_rss_mb']:.0f} MB for {big / GB:.2f} GB "
                  f"({res4['wall_process']:.1f} s, {big / GB / res4['wall_process']:.3f} GB/s)")  # fmt: skip
        else:
            print(f"peak RSS: {rss_1g:.0f} MB for {size / GB:.2f} GB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
