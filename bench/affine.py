"""colibri's MLX-affine int4 (issue 45, docs/FORMATS.md §2 and §11) against colitools' symmetric int4, measured on the
same weights in one run.

``.venv/bin/python bench/affine.py [--fixtures qwen3_5_moe olmoe qwen3_moe] [--tokens 256] [--seed 0] [--json F]``

1. **Relative RMSE** ``||W' - W|| / ||W||`` on bench/quantizer.py's synthetic weights (Gaussian, Laplace,
   Student-t(4), ``[1024, 4096]``, the quality table's): affine4-g64 and affine8-g64 (plain min-max ``rtn`` and the
   asymmetric search ``mse``) beside int4-g64 / int8-row (``rtn``, ``mse``), each with its bits per weight
   (affine: BF16 scale and bias per group; int4-g64: one F32 scale per group, so both are 4.5 bpw at g64), and the
   mixed slab of colibri's ``convert_qwen36.py --down-bits 8`` (int4-g64 gate/up, int8 down): its bpw on a
   Qwen3.6-35B expert (gate/up ``[512, 2048]``, down ``[2048, 512]``).
2. **Fit speed**, the same weights (Gaussian), best of ``--runs``: the numpy reference of the affine fit
   (``affine.fit_groups``) against its kernel (``kernels/affine.py``, all threads), with the symmetric int4-g64
   ``mse`` encoder on the kernels as the baseline, in million weights per second.
3. **KL divergence** on oracle families: the routed experts of the source replaced by their decoded values in each
   format (everything else float32, converted with the all-f32 recipe and run teacher-forced by ``colitools run``'s
   runtime over ``--tokens`` seeded random tokens), against the unmodified source the same way
   (``verify.kld.kld_stats``). Decoded values are exactly what a decode-then-multiply runtime computes with.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantizer import synthetic  # noqa: E402  (the quality table's weights)

from colitools.converters.options import ConvertOptions  # noqa: E402
from colitools.converters.runner import convert  # noqa: E402
from colitools.formats import affine  # noqa: E402
from colitools.formats.registry import _BY_NAME  # noqa: E402
from colitools.runtime.config import ModelArgs  # noqa: E402
from colitools.verify.kld import F32_RECIPE, kld_stats, teacher_forced_logits  # noqa: E402

ORACLES = Path(__file__).resolve().parents[1] / "oracles"
EXPERT = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def roundtrip(w: np.ndarray, variant: str, proj: str = "gate") -> np.ndarray:
    """``w`` through one format: ``affine{4,8}-g64-{rtn,mse}``, ``int4-g64-{q}``, ``int8-row-{q}``, or the mixed
    slab ``mixed-{q}`` (int4-g64 gate/up, int8-row down)."""
    name, q = variant.rsplit("-", 1)
    if name == "mixed":
        name = "int8-row" if proj == "down" else "int4-g64"
    w = np.ascontiguousarray(w, np.float32)
    O, I = w.shape
    if name.startswith("affine"):
        bits = int(name[6])
        return affine.decode(*affine.encode(w, bits, 64, q), O, I, bits, 64)
    if name == "int4-g64" and I <= 64:  # one group per row: the converter writes int4-row (the same values)
        name = "int4-row"
    fmt, gs = (_BY_NAME["int4-grouped"], 64) if name == "int4-g64" else (_BY_NAME[name], None)
    codes, scales = fmt.encode(w, gs, quantizer=q, fast=False)
    return fmt.decode(codes, scales, O, I, gs)


def bpw(variant: str) -> float:
    name = variant.rsplit("-", 1)[0]
    if name.startswith("affine"):
        return int(name[6]) + 2 * 16 / 64
    if name == "int4-g64":
        return 4 + 32 / 64
    if name == "int8-row":
        return _BY_NAME["int8-row"].bits_per_weight(512)
    # the mixed slab on a Qwen3.6-35B expert: gate/up [512, 2048] int4-g64, down [2048, 512] int8-row
    g, d = 2 * 512 * 2048, 2048 * 512
    return (g * 4.5 + d * 8 + 2048 * 32) / (g + d)


RMSE_VARIANTS = ("int4-g64-rtn", "int4-g64-mse", "affine4-g64-rtn", "affine4-g64-mse",
                 "int8-row-rtn", "int8-row-mse", "affine8-g64-rtn", "affine8-g64-mse")  # fmt: skip
KLD_VARIANTS = ("int4-g64-rtn", "int4-g64-mse", "affine4-g64-rtn", "affine4-g64-mse", "mixed-rtn", "mixed-mse",
                "affine8-g64-rtn")  # fmt: skip


def rmse_table() -> list[dict]:
    rows = []
    for dist in ("gauss", "laplace", "t4"):
        w = synthetic(dist)
        for v in RMSE_VARIANTS:
            d = roundtrip(w, v)
            rmse = float(np.sqrt(((d.astype(np.float64) - w) ** 2).sum() / (w.astype(np.float64) ** 2).sum()))
            rows.append({"weights": dist, "variant": v, "bpw": round(bpw(v), 3), "rel_rmse": round(rmse, 5)})
    return rows


def speed_rows(runs: int) -> list[dict]:
    from colitools.formats import kernels  # noqa: F401  (loaded: Format.encode(fast=True) takes the kernels)
    from colitools.formats.kernels import affine as kernel

    w = synthetic("gauss")
    groups = w.reshape(-1, 64)

    def best(fn) -> float:
        fn()  # a first call compiles or loads the kernels
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return w.size / min(times) / 1e6

    rows = [{"fit": "int4-g64 mse (kernels, baseline)",
             "mw_per_s": best(lambda: _BY_NAME["int4-grouped"].encode(w, 64, quantizer="mse"))}]  # fmt: skip
    for bits in (4, 8):
        for q in ("rtn", "mse"):
            for where, fit in (("numpy", affine.fit_groups), ("kernel", kernel.fit_groups)):
                rate = best(lambda fit=fit, bits=bits, q=q: fit(groups, bits, q))
                rows.append({"fit": f"affine{bits}-g64 {q} {where}", "mw_per_s": rate})
    return rows


def fake_quant_source(src: Path, dst: Path, variant: str | None) -> None:
    """A copy of oracle ``src`` whose routed experts are replaced by their decoded values in ``variant``."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("reference"))
    if variant is None:
        return
    for f in sorted(dst.glob("*.safetensors")):
        tensors = load_file(f)
        for k, w in tensors.items():
            m = EXPERT.search(k)
            if m and w.ndim == 2:
                tensors[k] = roundtrip(w.astype(np.float32), variant, m.group(1))
        save_file(tensors, f)


def kld_rows(fixture: str, tokens: int, seed: int, work: Path) -> list[dict]:
    src = ORACLES / fixture
    vocab = ModelArgs.from_dir(src).vocab_size
    ids = [int(t) for t in np.random.default_rng(seed).integers(0, vocab, tokens)]
    logits = {}
    for v in (None, *KLD_VARIANTS):
        tag = v or "f32"
        fq, out = work / f"{fixture}-{tag}-src", work / f"{fixture}-{tag}-out"
        fake_quant_source(src, fq, v)
        convert(str(fq), out, ConvertOptions(**F32_RECIPE, progress=False, min_free_gb=0.0))
        logits[tag] = teacher_forced_logits(out, ids)
        shutil.rmtree(fq), shutil.rmtree(out)
    rows = []
    for v in KLD_VARIANTS:
        r = kld_stats(logits["f32"], logits[v], ids).to_json()
        rows.append({"fixture": fixture, "variant": v, "bpw": round(bpw(v), 3), **r})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", nargs="+", default=["qwen3_5_moe", "olmoe", "qwen3_moe"])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each fit (the best is kept)")
    ap.add_argument("--json", help="write every row to this file")
    a = ap.parse_args()
    rows = rmse_table()
    print(f"{'weights':<8} {'variant':<16} {'bpw':>6} {'rel RMSE':>9}")
    for r in rows:
        print(f"{r['weights']:<8} {r['variant']:<16} {r['bpw']:>6.3f} {r['rel_rmse']:>9.5f}")
    speed = speed_rows(a.runs)
    print(f"\n{'fit':<34} {'M weights/s':>12}")
    for r in speed:
        print(f"{r['fit']:<34} {r['mw_per_s']:>12.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        krows = [row for fx in a.fixtures for row in kld_rows(fx, a.tokens, a.seed, Path(tmp))]
    print(f"\n{'fixture':<12} {'variant':<16} {'bpw':>6} {'mean KLD':>9} {'p99 KLD':>8} {'top-1':>6}")
    for r in krows:
        print(
            f"{r['fixture']:<12} {r['variant']:<16} {r['bpw']:>6.3f} {r['mean_kld']:>9.5f} "
            f"{r['p99_kld']:>8.5f} {r['top1_agreement']:>6.3f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"rmse": rows, "speed": speed, "kld": krows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
