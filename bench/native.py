"""Benchmark of ``native`` passthrough of natively quantized experts (docs/FORMATS.md §5): MXFP4 (gpt-oss blocks ->
mxfp4, nibbles and E8M0 bytes copied) and INT4 pack-quantized (-> int4-grouped gs 32, the int32 bytes are the
pairs bytes, BF16 scales widened to F32). It should run at disk speed: the number printed next to the converter
is a plain file copy (``shutil.copyfile``) of the same source bytes, measured in the same run, interleaved, and
the same copy with the sha256 of those bytes on two more threads, one half each (``copy + sha256``): the floor of
any passthrough that records the digest of every byte it writes, as the manifest does (docs/FORMATS.md §10); with the
bench extra's ``blake3`` installed, also the same with a BLAKE3 digest (what that spec choice costs).

GB/s are source bytes per second of the whole process (``python -m colitools convert --experts native``,
startup, planning, hashing, fsync and manifest included) and of the copy (with an fsync, as the converter does).
``GB/cpu-s`` divides by the converter process's CPU time (user + sys, ``os.wait4``): other load on a shared
machine barely moves it. ``start-up`` is the best whole-process time of the same conversion of a one-layer
checkpoint (imports, planning, manifest: the fixed cost a larger source amortises); ``past start-up`` is the
rate beyond it, (source bytes - one-layer bytes) / (best time - start-up): what a source of hundreds of GB
converts at, compared with the copy in the last ratio. The load average is
printed before and after. Checkpoints (~``--mb`` MB each, mostly routed experts) are generated under
``.bench-tmp/`` and deleted at the end.
Usage: ``.venv/bin/python bench/native.py [--mb 512] [--runs 3] [--workdir DIR]``
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

from colitools.formats.safetensors_io import write_safetensors

H, INTER, V = 2048, 1024, 1024


def _base(rng, layers: int, E: int) -> tuple[dict, dict]:
    t = {"model.embed_tokens.weight": np.zeros((V, H), ml_dtypes.bfloat16),
         "lm_head.weight": np.zeros((V, H), ml_dtypes.bfloat16), "model.norm.weight": np.ones(H, ml_dtypes.bfloat16)}  # fmt: skip
    for L in range(layers):
        t[f"model.layers.{L}.mlp.gate.weight"] = np.zeros((E, H), ml_dtypes.bfloat16)
        t[f"model.layers.{L}.input_layernorm.weight"] = np.ones(H, ml_dtypes.bfloat16)
    cfg = {"hidden_size": H, "vocab_size": V, "num_hidden_layers": layers, "num_experts": E,
           "moe_intermediate_size": INTER, "num_experts_per_tok": 2}  # fmt: skip
    return t, cfg


def make_mxfp4(folder: Path, mb: int) -> None:
    rng = np.random.default_rng(0)
    per_layer = 3 * INTER * H // 2 * 17 // 16  # bytes of one expert (codes + scales), times E below
    E = 16
    layers = max(1, mb * 2**20 // (per_layer * E))
    t, cfg = _base(rng, layers, E)
    for L in range(layers):
        for kind, (O, I) in (("gate_up_proj", (2 * INTER, H)), ("down_proj", (H, INTER))):
            base = f"model.layers.{L}.mlp.experts.{kind}"
            t[base + "_blocks"] = rng.integers(0, 256, (E, O, I // 32, 16), dtype=np.uint8)
            t[base + "_scales"] = rng.integers(118, 128, (E, O, I // 32), dtype=np.uint8)
    _save(folder, t, {**cfg, "model_type": "qwen3_moe", "quantization_config": {"quant_method": "mxfp4"}})


def make_int4(folder: Path, mb: int) -> None:
    rng = np.random.default_rng(1)
    E, g = 16, 32
    per_expert = 3 * INTER * H // 2 * 18 // 16
    layers = max(1, mb * 2**20 // (per_expert * E))
    t, cfg = _base(rng, layers, E)
    for L in range(layers):
        for e in range(E):
            for proj, (O, I) in (
                ("gate_proj", (INTER, H)),
                ("up_proj", (INTER, H)),
                ("down_proj", (H, INTER)),
            ):
                base = f"model.layers.{L}.mlp.experts.{e}.{proj}"
                t[base + ".weight_packed"] = rng.integers(
                    -(2**31), 2**31, (O, I // 8), dtype=np.int64
                ).astype(np.int32)
                t[base + ".weight_scale"] = (rng.random((O, I // g)) * 0.01 + 1e-4).astype(ml_dtypes.bfloat16)
                t[base + ".weight_shape"] = np.array([O, I], np.int64)
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": g}
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}  # fmt: skip
    _save(folder, t, {**cfg, "model_type": "deepseek_v3", "n_routed_experts": E, "quantization_config": qc})


def _save(folder: Path, tensors: dict, cfg: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "num_experts"
                                                   or "n_routed_experts" not in cfg}))  # fmt: skip


def convert_once(src: Path, out: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one whole-process conversion."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--experts", "native"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"convert failed ({proc.returncode}): {err.strip()}")
    return wall, usage.ru_utime + usage.ru_stime


def copy_once(src: Path, dst: Path) -> float:
    dst.unlink(missing_ok=True)
    t0 = time.perf_counter()
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def copy_hash_once(src: Path, dst: Path, algorithm: str = "sha256") -> float:
    """The floor of any passthrough that records a digest of what it writes (the manifest's sha256, docs/FORMATS.md
    §10): the same file copy, with the digest of the same bytes on other threads, its two halves hashed at once
    (as a conversion hashes two output files at once; 8 MB reads into one buffer per thread; hashlib and blake3
    release the GIL). Wall seconds until all are done and the copy is fsynced. ``algorithm="blake3"`` (the
    bench extra's ``blake3`` package): what the floor would be with that digest instead."""
    import hashlib
    import threading

    size = src.stat().st_size

    def digest(start: int, stop: int) -> None:
        if algorithm == "blake3":
            import blake3

            h = blake3.blake3(max_threads=1)
        else:
            h = hashlib.new(algorithm)
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        with open(src, "rb", buffering=0) as fh:
            off = start
            while off < stop and (n := os.preadv(fh.fileno(), [view[: min(len(buf), stop - off)]], off)):
                h.update(view[:n])
                off += n

    t0 = time.perf_counter()
    hashers = [threading.Thread(target=digest, args=(a, b)) for a, b in ((0, size // 2), (size // 2, size))]
    for h in hashers:
        h.start()
    copy_once(src, dst)
    for h in hashers:
        h.join()
    return time.perf_counter() - t0


def _have_blake3() -> bool:
    try:
        import blake3  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path(__file__).resolve().parents[1] / ".bench-tmp")
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = args.workdir / "native"
    shutil.rmtree(work, ignore_errors=True)
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    try:
        for kind, make in (("mxfp4", make_mxfp4), ("int4 pack-quantized", make_int4)):
            src, tiny = work / kind.split()[0], work / (kind.split()[0] + "-tiny")
            make(src, args.mb)
            make(tiny, 1)  # one layer
            size = (src / "model.safetensors").stat().st_size
            tiny_size = (tiny / "model.safetensors").stat().st_size
            conv, cpu, cp, cph, cpb, fixed = [], [], [], [], [], []
            for _ in range(args.runs):  # interleaved
                wall, used = convert_once(src, work / "out")
                conv.append(wall)
                cpu.append(used)
                written = sum(f.stat().st_size for f in (work / "out").glob("*.safetensors"))
                cp.append(copy_once(src / "model.safetensors", work / "copy.safetensors"))
                cph.append(copy_hash_once(src / "model.safetensors", work / "copy.safetensors"))
                if _have_blake3():
                    cpb.append(copy_hash_once(src / "model.safetensors", work / "copy.safetensors", "blake3"))
                fixed.append(convert_once(tiny, work / "out")[0])
            gb = size / 1e9
            # past the fixed start-up: the extra bytes over the extra time (what a 100+ GB source sees)
            steady = (size - tiny_size) / 1e9 / max(min(conv) - min(fixed), 1e-9)
            print(f"{kind}: {gb:.2f} GB source; convert --experts native best {gb / min(conv):.2f} GB/s "
                  f"(median {gb / statistics.median(conv):.2f}), {gb / min(cpu):.2f} GB/cpu-s "
                  f"(cpu {min(cpu):.2f} s), start-up {min(fixed):.2f} s, past start-up {steady:.2f} GB/s; "
                  f"file copy best {gb / min(cp):.2f} GB/s (median {gb / statistics.median(cp):.2f}); "
                  f"ratio copy/convert {min(conv) / min(cp):.2f}x, past start-up "
                  f"{gb / min(cp) / max(steady, 1e-9):.2f}x; copy + sha256 (two halves at once) best "
                  f"{gb / min(cph):.2f} GB/s, past start-up convert / (copy + sha256) {steady / (gb / min(cph)):.2f}"
                  f" (per byte written: {written / size:.3f} bytes out per byte in, "
                  f"{steady * written / size / (gb / min(cph)):.2f})"
                  + (f"; copy + blake3 (the same) best {gb / min(cpb):.2f} GB/s" if cpb else ""))  # fmt: skip
            shutil.rmtree(src)
            shutil.rmtree(tiny)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
