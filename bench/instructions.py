"""Instructions executed per input byte by each encoder, counted by valgrind (deterministic, unlike clocks).

A 2-vCPU machine shared with other guests moves wall-clock and even CPU-second figures by 2x from one run to the
next (bench/README); the number of instructions a kernel executes on fixed bytes does not move. This runs each
case of ``quant.py`` (the same inputs, ``quant.make_inputs``) in a child process under ``valgrind
--tool=callgrind`` with collection switched on inside the encode driver only (``--toggle-collect``), two
calls on one kernel thread, and prints the instructions per input byte.
Instructions are not time (a division or a cache miss is one instruction), so read them beside ``quant.py``:
they show whether a change removed work, not how long the rest takes.

Needs valgrind (``apt install valgrind``; not a Python package) and the compiled-ahead kernels
(``colitools kernels --build``: valgrind names their functions; numba's JIT code has no symbols).

    .venv/bin/python bench/instructions.py                     # every case, [256, 7168]
    .venv/bin/python bench/instructions.py --cases fp8-int4 fp8-mxfp4 --rows 128
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# case -> (source, output format, group size, the driver valgrind counts in)
CASES = {
    "bf16-int4": ("bf16", "int4-grouped", 64, "encode_rows_bf16"),
    "f16-int4": ("f16", "int4-grouped", 64, "encode_rows_f16"),
    "fp8-int4": ("fp8", "int4-grouped", 64, "encode_rows_fp8"),
    "fp8-int8": ("fp8", "int8-row", None, "encode_rows_fp8"),
    "fp8-int3": ("fp8", "int3-g64", None, "encode_rows_fp8"),
    "fp8-mxfp4": ("fp8", "mxfp4", None, "encode_rows_fp8"),
    "fp8-e8m0": ("fp8", "fp8-e4m3-e8m0", None, "fp8_e8m0_from_fp8"),
}
CALLS = 2  # calls per case, all counted (compiled-ahead kernels: no compile in the first)


def child(case: str, rows: int, cols: int) -> None:
    """The measured process: CALLS calls; valgrind counts inside the driver only."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from quant import make_inputs

    from colitools.formats import kernels

    kernels.set_threads(1)
    src, fmt, gs, _ = CASES[case]
    bf16, w, q, scale_inv = make_inputs(rows, cols, 0)
    if src == "bf16":
        call = lambda: kernels.encode_from_bf16(fmt, bf16, gs)  # noqa: E731
    elif src == "f16":
        half = w.astype("float16")
        call = lambda: kernels.encode_from_f16(fmt, half, gs)  # noqa: E731
    elif fmt == "fp8-e4m3-e8m0":
        call = lambda: kernels.encode_from_fp8_e8m0(q, scale_inv, 128, "bench")  # noqa: E731
    else:
        call = lambda: kernels.encode_from_fp8_block(fmt, q, scale_inv, 128, gs, "bench")  # noqa: E731
    for _ in range(CALLS):
        call()


def count(case: str, rows: int, cols: int) -> int:
    """Instructions valgrind counted inside the case's driver over CALLS calls."""
    with tempfile.TemporaryDirectory(prefix="colitools-callgrind-") as tmp:
        cmd = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
            f"--toggle-collect=*{CASES[case][3]}*",
            sys.executable, os.path.abspath(__file__), "--child", case, "--rows", str(rows), "--cols", str(cols),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or not found:
            tail = " ".join(done.stderr.strip().splitlines()[-3:])
            raise SystemExit(f"instructions.py: valgrind failed on {case} (exit {done.returncode}): {tail}")
        return int(found.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cols", type=int, default=7168)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.rows, args.cols)
        return 0
    if shutil.which("valgrind") is None:
        print("instructions.py: valgrind is not installed (apt install valgrind)", file=sys.stderr)
        return 2
    from colitools.formats.kernels import aot

    if not aot.CODECS.status()["loaded"]:
        print(
            "instructions.py: the compiled-ahead kernels are not built (colitools kernels --build)",
            file=sys.stderr,
        )
        return 2
    print(f"[{args.rows}, {args.cols}], {CALLS} calls per case, 1 kernel thread")
    print(f"{'case':12s} {'instructions':>14s} {'per input byte':>15s}")
    for case in args.cases:
        n = count(case, args.rows, args.cols)
        per_weight = 1 if CASES[case][0] == "fp8" else 2  # input bytes per weight, as quant.py counts them
        print(f"{case:12s} {n:14,d} {n / (CALLS * args.rows * args.cols * per_weight):15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
