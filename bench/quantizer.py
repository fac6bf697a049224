"""``--quantizer mse`` against ``rtn`` (docs/FORMATS.md §11), measured in one run on the same weights.

``.venv/bin/python bench/quantizer.py [--runs 3] [--layers 4] [--workdir DIR] [--shm DIR] [--base-python PY]
[--recording]``

1. **Relative RMSE** ``||W' - W|| / ||W||`` of every format with scales to choose (int4-g32 / g64 / g128, int4-row,
   int3-g64, int2-row, int8-row; mxfp4 for reference, which ``mse`` leaves as it is) on synthetic Gaussian,
   Laplace and Student-t(4) weights ``[1024, 4096]``: rtn, mse with signed scales, mse with positive scales only,
   and the ratios to rtn (the spec's goal: int4-g64 signed <= 0.86).
2. **Whole-process conversions** (``python -m colitools convert``, output on the tmpfs ``--shm``): bench/convert.py's
   BF16 checkpoint with every 2-D weight to int4-g64 and its FP8 checkpoint with the default recipe, rtn and mse
   interleaved ``--runs`` times; best and median wall, CPU seconds, the mse / rtn ratio (goal: at most 2x).
3. With ``--base-python`` (the python of a checkout before convert recorded error figures, e.g. a worktree of an
   older commit with its own venv): the same rtn conversion by that checkout, interleaved, so the cost of
   recording each tensor's error in colitools.json is a measured difference (goal: a few percent).
4. ``--recording`` (alone): the cost of recording the error figures: three conversions (the rtn BF16 ->
   int4-g64 one as in 2, the lightest there is; the FP8 checkpoint's default recipe; the BF16 one with
   ``--quantizer mse``), each as it is and with the figures stubbed out in the process (``STUB``), for this
   checkout and ``--base-python``'s, interleaved ``--runs`` times: CPU seconds and recorded / stubbed (goal: a
   few percent), and the walls. ``--from-drive``: as a user converts, each source read from the drive (its pages
   evicted before each run) and the output written to ``--workdir`` (the drive) instead of the tmpfs;
   ``--layers N`` for a larger checkpoint (folders ``q-bf16-NL`` / ``q-fp8-NL``). ``--split``: the same three
   conversions on one kernel thread, the thread CPU seconds of each tensor's encode and figures summed in the
   process (``SPLIT``), as converted, with every tensor's figures taken in a second pass (``job_error``), and
   without figures: the recording's share of the whole conversion's CPU, without the noise of two processes'
   totals; then the encoders that measure what they write against the same encoders alone, in this process
   (``measuring_encoders``: ns a weight, one kernel thread, BF16 and FP8 sources).
5. **The search kernel alone** (``kernels.mse_groups`` on one thread, this thread's CPU time, best of 7): ns per
   weight on ``[2048, 2048]`` Gaussian weights as int4-g64 groups and as int4-row rows.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert import generate, run_process  # noqa: E402  (bench/convert.py's checkpoints and process timing)
from quality import evict  # noqa: E402  (bench/quality.py: a file's pages dropped from the page cache)

from colitools.formats import kernels  # noqa: E402, F401  (loaded, it hands Format.encode(fast=True) its kernels)
from colitools.formats.registry import by_name  # noqa: E402

FORMATS = [("int4-g32", "int4-grouped", 32), ("int4-g64", "int4-grouped", 64), ("int4-g128", "int4-grouped", 128),
           ("int4-row", "int4-row", None), ("int3-g64", "int3-g64", None), ("int2-row", "int2-row", None),
           ("int8-row", "int8-row", None), ("mxfp4", "mxfp4", None)]  # fmt: skip
MODES = ("rtn", "mse", "mse-positive")


def synthetic(dist: str, shape=(1024, 4096), seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    draw = {"gauss": rng.standard_normal, "laplace": rng.laplace, "t4": lambda size: rng.standard_t(4, size)}
    return draw[dist](size=shape).astype(np.float32)


def rel_rmse(w: np.ndarray, fmt: str, gs: int | None, mode: str) -> float:
    cls = by_name(fmt)
    codes, scales = cls.encode(w, gs, fast=True, quantizer=mode)
    d = cls.decode(codes, scales, *w.shape, gs).astype(np.float64) - w
    return math.sqrt(float(np.sum(d * d)) / float(np.sum(w.astype(np.float64) ** 2)))


def rmse_table() -> list[str]:
    lines = ["| weights | format | rtn | mse (signed) | mse (positive) | signed / rtn | positive / rtn |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for dist in ("gauss", "laplace", "t4"):
        w = synthetic(dist)
        for label, fmt, gs in FORMATS:
            r = {m: rel_rmse(w, fmt, gs, m) for m in MODES}
            lines.append(f"| {dist} | {label} | {r['rtn']:.4f} | {r['mse']:.4f} | {r['mse-positive']:.4f} | "
                         f"{r['mse'] / r['rtn']:.3f} | {r['mse-positive'] / r['rtn']:.3f} |")  # fmt: skip
    return lines


def search_speed() -> list[str]:
    import time

    from colitools.formats.kernels import mse, set_threads

    w = synthetic("gauss", (2048, 2048))
    lines = ["| groups | signed | ns / weight (one thread) |", "|---|---|---|"]
    set_threads(1)
    try:
        for label, groups in (("int4-g64", w.reshape(-1, 64)), ("int4-row", w)):
            for signed in (True, False):
                mse.mse_groups(groups, -8, 7, signed)
                best = math.inf
                for _ in range(7):
                    t0 = time.thread_time()
                    mse.mse_groups(groups, -8, 7, signed)
                    best = min(best, time.thread_time() - t0)
                lines.append(f"| {label} | {signed} | {best / w.size * 1e9:.2f} |")
    finally:
        set_threads(None)
    return lines


def convert_cmd(python: str, src: Path, out: Path, *extra: str) -> list[str]:
    return [python, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0", "--json", *extra]


def timed(cmd: list[str], out: Path) -> dict:
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    res = run_process(cmd)
    shutil.rmtree(out, ignore_errors=True)
    return res


INT4 = ("--experts", "int4-g64", "--dense", "int4-g64", "--embed", "int4-g64")  # every 2-D weight to int4-g64


def checkpoints(work: Path, layers: int) -> tuple[Path, Path]:
    """bench/convert.py's BF16 and FP8 checkpoints of ``layers`` MoE layers in ``work`` (generated once; folders
    ``q-bf16`` / ``q-fp8``, ``-NL`` appended for another layer count than 4)."""
    suffix = "" if layers == 4 else f"-{layers}L"
    bf16, fp8 = work / f"q-bf16{suffix}", work / f"q-fp8{suffix}"
    for folder, dtype in ((bf16, "BF16"), (fp8, "FP8")):
        if not (folder / "model.safetensors.index.json").exists():
            generate(folder, layers, 16, dtype)
    return bf16, fp8


def recording_cases(work: Path, layers: int) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """The three conversions whose recording is measured: source folder and recipe options."""
    bf16, fp8 = checkpoints(work, layers)
    return {"BF16 -> int4-g64, rtn": (bf16, INT4), "FP8, default recipe, rtn": (fp8, ()),
            "BF16 -> int4-g64, mse": (bf16, (*INT4, "--quantizer", "mse"))}  # fmt: skip


def conversions(work: Path, shm: Path, layers: int, runs: int, base_python: str | None) -> list[str]:
    bf16, fp8 = checkpoints(work, layers)
    cases = {"BF16 -> int4-g64": (bf16, INT4), "FP8 default recipe": (fp8, ())}
    lines = ["| checkpoint | run | best wall s | median wall s | CPU s | mse / rtn (best) |", "|---|---|---|---|---|---|"]
    for label, (src, recipe) in cases.items():
        variants = {"rtn": [sys.executable], "mse": [sys.executable, "--quantizer", "mse"]}
        if base_python:
            variants["rtn, base checkout"] = [base_python]
        walls: dict[str, list[dict]] = {k: [] for k in variants}
        timed(convert_cmd(sys.executable, src, shm / "q-warm", *recipe, "--quantizer", "mse"), shm / "q-warm")
        for _ in range(runs):  # interleaved: a shared machine's load falls on every variant alike
            for name, (python, *extra) in variants.items():
                walls[name].append(timed(convert_cmd(python, src, shm / "q-out", *recipe, *extra), shm / "q-out"))
        best_rtn = min(r["wall"] for r in walls["rtn"])
        for name, res in walls.items():
            w = sorted(r["wall"] for r in res)
            lines.append(f"| {label} | {name} | {w[0]:.2f} | {statistics.median(w):.2f} | "
                         f"{min(r['cpu'] for r in res):.2f} | {w[0] / best_rtn:.2f} |")  # fmt: skip
    return lines


# ``python -c STUB convert ...``: the same conversion with the error figures not taken (job_error, and the
# encoders' own measurement where a checkout has it, stubbed out): the recording's cost is the difference
STUB = """
import sys
import colitools.converters.unit_writer as u
u.job_error = lambda *a, **k: None
if hasattr(u, "encode_measured"):
    u.encode_measured = lambda job, values, scale, block: (*u.encode_job(job, values, scale, block, False), None)
from colitools.cli import main
sys.argv[0] = "colitools"
main()
"""


# ``python -c SPLIT OUT.json convert ...`` (one kernel thread): the thread CPU seconds spent encoding each tensor and
# taking its figures, as the conversion does it (``fused``: the encoders' own measurement where they have one), as a
# second pass after the encode (``second-pass``: ``job_error`` for every job), or not at all (``none``)
SPLIT = """
import atexit, json, os, sys, time
import colitools.converters.unit_writer as u
out, mode = sys.argv.pop(1), sys.argv.pop(1)
spent = [0.0]
fused = u.encode_measured
def timed(job, values, scale, block):
    t = time.thread_time()
    if mode == "fused":
        r = fused(job, values, scale, block)
    else:
        c, s = u.encode_job(job, values, scale, block, False)
        r = (c, s, u.job_error(job, values, scale, block, c, s) if mode == "second-pass" else None)
    spent[0] += time.thread_time() - t
    return r
u.encode_measured = timed
if mode == "none":
    u.job_error = lambda *a, **k: None
atexit.register(lambda: open(out, "w").write(json.dumps({"cpu": spent[0]})))
from colitools.cli import main
sys.argv[0] = "colitools"
main()
"""


def recording_split(work: Path, shm: Path, layers: int, runs: int) -> list[str]:
    """Per conversion of ``recording_cost``, one kernel thread: the thread CPU seconds of encoding plus the
    figures, taken as the conversion takes them, as a second pass, and not taken; the recording's cost is the
    difference, against the whole process's CPU without it. Medians of ``runs`` interleaved runs."""
    import json
    import os

    cases = recording_cases(work, layers)
    modes = ("fused", "second-pass", "none")
    res: dict[tuple[str, str], list[tuple[float, float]]] = {(c, m): [] for c in cases for m in modes}
    spent = shm / "q-split.json"
    os.environ["COLITOOLS_THREADS"] = "1"
    for run in range(runs + 1):  # the first round warms the caches and is not counted
        for case, (src, recipe) in cases.items():
            for mode in modes:
                cmd = convert_cmd(sys.executable, src, shm / "q-out", *recipe)
                whole = timed([sys.executable, "-c", SPLIT, str(spent), mode, *cmd[3:]], shm / "q-out")
                if run:
                    res[(case, mode)].append((json.loads(spent.read_text())["cpu"], whole["cpu"]))
    lines = ["| conversion | encode + figures, as converted | figures as a second pass | encode only | "
             "recording / whole conversion (as converted; second pass) |", "|---|---|---|---|---|"]
    for case in cases:
        med = {m: statistics.median(c for c, _ in res[(case, m)]) for m in modes}
        whole = statistics.median(w for _, w in res[(case, "none")])
        lines.append(f"| {case} | {med['fused']:.3f} | {med['second-pass']:.3f} | {med['none']:.3f} | "
                     f"{(med['fused'] - med['none']) / whole:.1%}; {(med['second-pass'] - med['none']) / whole:.1%} "
                     f"(of {whole:.2f} CPU s) |")
    return lines


def measuring_encoders(shape=(4096, 4096), reps: int = 7) -> list[str]:
    """The encoders that measure what they write against the same encoders alone, one kernel thread, this
    thread's CPU, best of ``reps`` (interleaved): ns a weight on Gaussian weights, BF16 and block-scaled FP8."""
    import time

    import ml_dtypes

    kernels.set_threads(1)
    w = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    bf16 = w.astype(ml_dtypes.bfloat16)
    grid = (np.abs(w).reshape(shape[0] // 128, 128, shape[1] // 128, 128).max(axis=(1, 3)) / 448).astype(np.float32)
    fp8 = (w / np.repeat(np.repeat(grid, 128, 0), 128, 1)).astype(ml_dtypes.float8_e4m3fn)
    lines = ["| source -> format | encode ns/w | encode + figures ns/w | figures ns/w |", "|---|---|---|---|"]
    for fmt, gs in (("int4-grouped", 64), ("int4-row", None), ("int8-row", None)):
        for label, plain, measured, src in (
            ("BF16", kernels.encode_from_bf16, kernels.encode_from_bf16_measured, (bf16,)),
            ("FP8", kernels.encode_from_fp8_block, kernels.encode_from_fp8_measured, (fp8, grid, 128)),
        ):
            best = {plain: math.inf, measured: math.inf}
            for _ in range(reps):
                for fn in best:
                    t = time.thread_time()
                    fn(fmt, *src, gs)
                    best[fn] = min(best[fn], time.thread_time() - t)
            a, b = (best[k] / w.size * 1e9 for k in (plain, measured))
            lines.append(f"| {label} -> {fmt}{'' if gs is None else f' g{gs}'} | {a:.3f} | {b:.3f} | {b - a:.3f} |")
    kernels.set_threads(None)
    return lines


def recording_cost(
    work: Path, shm: Path, layers: int, runs: int, base_python: str | None, drive: bool = False
) -> list[str]:
    """CPU seconds of three conversions with and without recording their error figures (the rtn BF16 -> int4-g64
    conversion, the lightest there is; the FP8 checkpoint's default recipe; the BF16 one with ``--quantizer
    mse``), this checkout and ``base_python``'s, all interleaved; the median of each run's recorded / stubbed
    ratio. ``drive``: as a user converts, the source read from the drive (its pages evicted before each run) and
    the output written to the drive (``work``), and the walls compared too."""
    out = work / "q-out" if drive else shm / "q-out"
    cases = recording_cases(work, layers)
    pythons = {"this checkout": sys.executable, **({"base": base_python} if base_python else {})}
    variants = {}
    for case, (src, recipe) in cases.items():
        for label, python in pythons.items():
            cmd = convert_cmd(python, src, out, *recipe)
            variants[(case, label, "recorded")] = cmd
            variants[(case, label, "stubbed")] = [python, "-c", STUB, *cmd[3:]]
    res: dict[tuple[str, str, str], list[dict]] = {k: [] for k in variants}
    for case in cases:
        timed(variants[(case, "this checkout", "recorded")], out)  # warm-up
    for _ in range(runs):
        for key, cmd in variants.items():
            if drive:
                evict(sorted(cases[key[0]][0].glob("*.safetensors")))
            res[key].append(timed(cmd, out))
    lines = ["| conversion | checkout | recorded CPU s | stubbed CPU s | recorded / stubbed CPU (median of runs) | "
             "recorded / stubbed wall s | wall ratio (median of runs) | load |", "|---|---|---|---|---|---|---|---|"]
    for case in cases:
        for label in pythons:
            rec, stub = res[(case, label, "recorded")], res[(case, label, "stubbed")]
            ratio = {k: statistics.median(r[k] / t[k] for r, t in zip(rec, stub, strict=True)) for k in ("cpu", "wall")}
            loads = [r["load"] for r in rec + stub]
            med = {k: (statistics.median(r[k] for r in rec), statistics.median(t[k] for t in stub)) for k in ratio}
            lines.append(f"| {case} | {label} | {med['cpu'][0]:.2f} | {med['cpu'][1]:.2f} | {ratio['cpu']:.3f} | "
                         f"{med['wall'][0]:.2f} / {med['wall'][1]:.2f} | {ratio['wall']:.3f} | "
                         f"{min(loads):.1f}-{max(loads):.1f} |")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path(__file__).resolve().parents[1] / ".bench-tmp")
    ap.add_argument("--shm", type=Path, default=Path("/dev/shm"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4, help="MoE layers of the generated checkpoints")
    ap.add_argument("--base-python", help="python of a checkout without error recording (its rtn conversion)")
    ap.add_argument("--skip-convert", action="store_true", help="only the synthetic RMSE table")
    ap.add_argument("--recording", action="store_true", help="only the cost of recording the error figures")
    ap.add_argument("--split", action="store_true",
                    help="with --recording: the thread CPU of encode + figures, fused / second pass / none")
    ap.add_argument("--from-drive", action="store_true",
                    help="with --recording: source read from the drive (pages evicted per run), output written there")
    args = ap.parse_args()
    if args.recording and args.split:
        args.workdir.mkdir(parents=True, exist_ok=True)
        print("\n".join(recording_split(args.workdir, args.shm, args.layers, args.runs)))
        print()
        print("\n".join(measuring_encoders()))
        return
    if args.recording:
        args.workdir.mkdir(parents=True, exist_ok=True)
        print("\n".join(recording_cost(args.workdir, args.shm, args.layers, args.runs, args.base_python,
                                       args.from_drive)))
        return
    print("\n".join(rmse_table()))
    print()
    print("\n".join(search_speed()))
    if not args.skip_convert:
        args.workdir.mkdir(parents=True, exist_ok=True)
        print()
        print("\n".join(conversions(args.workdir, args.shm, args.layers, args.runs, args.base_python)))


if __name__ == "__main__":
    main()
