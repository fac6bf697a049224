"""Quantisation throughput of colitools' fused numba encoders, side by side with gguf-py's numpy Q4_0.

Both run on the same [4096, 14336] matrix (BF16, fixed seed) in the same process. Cases:

* BF16 -> int4-g64, BF16 -> int3-g64, BF16 -> mxfp4  (``kernels.encode_from_bf16``: upcast fused in)
* F16 -> int4-g64  (``kernels.encode_from_f16``: the same weights stored as F16, upcast fused in)
* FP8 -> int4-g64, int8-row, int3-g64, mxfp4  (``kernels.encode_from_fp8_block``: e4m3 codes + a 128x128 float32
  scale grid, dequant fused), FP8 -> fp8-e4m3-e8m0 (``kernels.encode_from_fp8_e8m0``): every format the recipe
  writes from FP8 sources
* gguf-py Q4_0  (``gguf.quants.quantize(w_f32, Q4_0)``, numpy, on the float32 upcast of the same BF16 matrix)

each warm (compile and first touch excluded), best of ``--repeat``, with 1 and 2 kernel threads (``kernels.set_threads``).

Conventions: GB/s counts INPUT bytes — BF16 and F16 cases 2 bytes per weight, FP8 1 byte per weight (the codes; the
scale grid, 1/16384 of it, is not counted), gguf Q4_0 2 bytes per weight (BF16-equivalent: the converter would
hand it the same BF16 tensor; its float32 upcast is done before timing, in its favour). ``x gguf`` is the
ratio of weights per second (gguf time / our time on the same matrix), so it does not depend on the byte
convention.

Run: ``.venv/bin/pip install -e .[bench]`` then ``.venv/bin/python bench/quant.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import ml_dtypes
import numba
import numpy as np

from colitools.formats import kernels
from colitools.formats import reference as ref

E4M3_MAX = 448.0


def make_inputs(O: int, I: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """BF16 weights (Gaussian, std 0.02) and a DeepSeek-V3-style FP8 copy: per 128x128 block
    ``scale_inv = amax / 448``, ``q = e4m3(w / scale_inv)``. Returns (bf16, f32 upcast, q uint8, scale_inv)."""
    rng = np.random.default_rng(seed)
    w32 = rng.standard_normal((O, I), dtype=np.float32) * np.float32(0.02)
    bf16 = w32.astype(ml_dtypes.bfloat16)
    w = bf16.astype(np.float32)
    gr, gc = ref.ceil_div(O, 128), ref.ceil_div(I, 128)
    padded = np.zeros((gr * 128, gc * 128), np.float32)
    padded[:O, :I] = w
    blocks = padded.reshape(gr, 128, gc, 128)
    scale_inv = (np.abs(blocks).max(axis=(1, 3)) / np.float32(E4M3_MAX)).astype(np.float32)
    scale_inv[scale_inv == 0] = 1
    q = (blocks / scale_inv[:, None, :, None]).astype(ml_dtypes.float8_e4m3fn)
    q = np.ascontiguousarray(q.reshape(gr * 128, gc * 128)[:O, :I]).view(np.uint8)
    return bf16, w, q, scale_inv


def best_of(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(best wall time, process CPU time of that run). CPU / wall shows how many cores the run really got."""
    fn()  # warm: numba compile / cache load, first touch of the allocator's pages
    runs = []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0, time.process_time() - c0))
    return min(runs)


def fp8_case(fmt: str, q: np.ndarray, scale_inv: np.ndarray) -> Callable[[], object]:
    """FP8 -> a row format, the dequant fused in (``kernels.encode_from_fp8_block``)."""
    return lambda: kernels.encode_from_fp8_block(fmt, q, scale_inv, 128, None, "bench")


def fp8_e8m0(q: np.ndarray, scale_inv: np.ndarray):
    """FP8 -> fp8-e4m3-e8m0 as the converter runs it for block scales that are not powers of two (DeepSeek's
    ``amax / 448``): the dequant fused into the block encoder (``unit_writer.encode_job``)."""
    return kernels.encode_from_fp8_e8m0(q, scale_inv, 128, "bench")


def verify_sample(
    bf16: np.ndarray, f16: np.ndarray, q: np.ndarray, scale_inv: np.ndarray, rows: int = 256
) -> None:
    """The benchmarked kernels must be byte-identical to the numpy reference (checked on the first rows)."""
    w = bf16[:rows].astype(np.float32)
    checks = [
        (kernels.encode_from_bf16("int4-grouped", bf16[:rows], 64), ref.encode_int4_grouped(w, 64)),
        (kernels.encode_from_bf16("int3-g64", bf16[:rows], None), ref.encode_int3_g64(w)),
        (kernels.encode_from_bf16("mxfp4", bf16[:rows], None), ref.encode_mxfp4(w)),
        (
            kernels.encode_from_f16("int4-grouped", f16[:rows], 64),
            ref.encode_int4_grouped(f16[:rows].astype(np.float32), 64),
        ),
        (
            kernels.encode_from_fp8_block(
                "int4-grouped", q[:rows], scale_inv[: ref.ceil_div(rows, 128)], 128, 64
            ),
            ref.encode_int4_grouped(
                ref.dequant_fp8_block(q[:rows], scale_inv[: ref.ceil_div(rows, 128)]), 64
            ),
        ),
    ]
    for (c1, s1), (c2, s2) in checks:
        if c1.tobytes() != c2.tobytes() or s1.tobytes() != s2.tobytes():
            sys.exit("bench: fast kernel output differs from the numpy reference")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=14336)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per case (best is reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", choices=("default", "jit"), default="default",
                    help="default: what conversions run (compiled ahead of time when built); jit: numba's JIT")
    args = ap.parse_args(argv)

    import gguf  # bench-only dependency: pip install -e .[bench]

    O, I = args.rows, args.cols
    bf16, w32, q, scale_inv = make_inputs(O, I, args.seed)
    f16 = bf16.astype(np.float32).astype(np.float16)  # the same weights as F16 (round to nearest)
    verify_sample(bf16, f16, q, scale_inv)
    n = O * I

    t_gguf, c_gguf = best_of(lambda: gguf.quants.quantize(w32, gguf.GGMLQuantizationType.Q4_0), args.repeat)

    cases: list[tuple[str, Callable[[], object], int]] = [
        ("BF16 -> int4-g64", lambda: kernels.encode_from_bf16("int4-grouped", bf16, 64, "bench"), 2 * n),
        ("BF16 -> int3-g64", lambda: kernels.encode_from_bf16("int3-g64", bf16, None, "bench"), 2 * n),
        ("BF16 -> mxfp4", lambda: kernels.encode_from_bf16("mxfp4", bf16, None, "bench"), 2 * n),
        ("F16 -> int4-g64", lambda: kernels.encode_from_f16("int4-grouped", f16, 64, "bench"), 2 * n),
        (
            "FP8 -> int4-g64",
            lambda: kernels.encode_from_fp8_block("int4-grouped", q, scale_inv, 128, 64, "bench"),
            n,
        ),
        *((f"FP8 -> {fmt}", fp8_case(fmt, q, scale_inv), n) for fmt in ("int8-row", "int3-g64", "mxfp4")),
        ("FP8 -> fp8-e4m3-e8m0", lambda: fp8_e8m0(q, scale_inv), n),
    ]
    from colitools.formats.kernels import aot

    if args.kernels == "jit":
        aot.CODECS._kernels = aot.CODECS.jit_kernels()
    kind = "compiled ahead of time" if aot.CODECS.kernels().ahead else "numba JIT"
    max_threads = numba.config.NUMBA_NUM_THREADS
    thread_counts = [t for t in (1, 2) if t <= max_threads]

    print(
        f"matrix [{O}, {I}] = {n / 1e6:.1f} M weights, seed {args.seed}, best of {args.repeat}, "
        f"numba {numba.__version__} (kernels: {kind}), gguf-py Q4_0 (numpy) as the peer"
    )
    print(
        "GB/s = input bytes per second (BF16, F16: 2 B/weight, FP8: 1 B/weight, gguf Q4_0: 2 B/weight BF16-equivalent);"
    )
    print("x gguf = weights per second relative to gguf-py Q4_0 on the same matrix in this run;")
    print(
        "cpu% = process CPU time / wall time of the reported run (200 = both cores busy with this process);"
    )
    print(
        "GB/cpu-s = input bytes per CPU-second of this process (all threads): the per-core rate, which other"
    )
    print("load on the machine does not change")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    header = f"{'case':<22} {'threads':>7} {'ms':>9} {'cpu%':>5} {'GB/s':>7} {'GB/cpu-s':>8} {'Mw/s':>8} {'x gguf':>8}"
    print(header)
    print("-" * len(header))
    print(
        f"{'gguf-py Q4_0 (numpy)':<22} {1:>7} {t_gguf * 1e3:>9.1f} {100 * c_gguf / t_gguf:>5.0f} "
        f"{2 * n / t_gguf / 1e9:>7.3f} {2 * n / c_gguf / 1e9:>8.3f} {n / t_gguf / 1e6:>8.1f} {1.0:>8.2f}"
    )
    results: dict[tuple[str, int], tuple[float, float]] = {}
    for label, fn, nbytes in cases:
        for threads in thread_counts:
            kernels.set_threads(threads)
            t, c = best_of(fn, args.repeat)
            results[(label, threads)] = (nbytes / t / 1e9, t_gguf / t)
            print(
                f"{label:<22} {threads:>7} {t * 1e3:>9.1f} {100 * c / t:>5.0f} {nbytes / t / 1e9:>7.3f} "
                f"{nbytes / c / 1e9:>8.3f} {n / t / 1e6:>8.1f} {t_gguf / t:>8.2f}"
            )
    kernels.set_threads(None)

    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    top = max(thread_counts)
    ratio = results[("BF16 -> int4-g64", top)][1]
    ok = ratio >= 3.0
    print(
        f"target: BF16 -> int4-g64 >= 3x gguf-py Q4_0 at {top} threads: {ratio:.1f}x  {'PASS' if ok else 'MISS'}"
    )
    for label, _, _ in cases:
        if label.startswith("FP8"):
            rate = results[(label, top)][0]
            ok &= rate >= 3.0
            print(f"target: {label} >= 3 GB/s of FP8 input at {top} threads: {rate:.2f} GB/s  "
                  f"{'PASS' if rate >= 3.0 else 'MISS'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
