"""Compatibility check against colibri's own engines (issue 27; not part of CI: colibri's source is not there).

Given one or more colibri source trees (obtained by whoever runs this, bench/README.md lists which; each is copied
to the work folder, never into the repository), builds each CPU engine from the first tree holding its source
(``make olmoe colibri inkling kimi_k3 qwen36 glm53 qwen38 deepseek_v41``, ``make -f Makefile.deepseek-v4
deepseek-v4``),
converts oracle fixtures with each target and recipe, runs ``colitools run`` (greedy and teacher-forced, the
reference) and each engine on the same container with its exact kernels (:func:`engine_env`), and prints one row
per engine x target x recipe: built, loaded, ran, teacher-forced k/N, greedy k/N, and for every divergence
colitools' own top-2 margin there (a margin below 0.02 explains one). Engines without a teacher-forced oracle mode
(olmoe.c, qwen36.c, qwen38.c, deepseek_v41.c) are teacher-forced prefix by prefix: one oracle run per position with
the prompt ``full_ids[:p]`` and one token to generate, whose argmax is the engine's at position ``p - 1`` (a
prefill, like colitools' teacher-forced pass: DeepSeek V4.1's decode steps read the index keys published last, so
its greedy tokens and its teacher-forced argmax differ by design, and each is compared with colitools' own).

Variants (made in the work folder, from the committed fixtures):
* ``glm_moe_dsa`` with ``rms_norm_eps`` 1e-6: c/colibri.c applies ``rms_norm_eps`` to ``q_a_layernorm`` /
  ``kv_a_layernorm``, where transformers (and colitools) use 1e-6 (docs/FORMATS.md §4 Targets);
* ``deepseek_v4`` 128 wide (hidden, q_lora_rank, the grouped output and the experts at 128): c/deepseek_v4.c's
  FP8 / FP4 matvecs take multiples of 128; ``head_dim`` 64 (``--v4-head-dim 32``: o_groups 1) at the fixture's
  seed (``--v4-seed``). Built with transformers in the oracle venv (``--oracle-python``, as
  oracles/README.md makes fixtures), no margin search: colitools run is the reference;
* for qwen38.c, the ``--target qwen38`` main container plus its sidecar's experts decoded to F32 (:func:`engine_container`).

Usage: ``.venv/bin/python bench/colibri_compat.py COLIBRI_SRC [COLIBRI_SRC ...] [--work DIR] [--oracle-python PY]
[--only ENGINE ...] [--budget] [--v4-head-dim 64|32] [--v4-seed S]`` (``--budget``: only the rows of a size budget,
``BUDGET_BPW``; the last two: which 128-wide deepseek_v4 draw, :func:`v4_wide_name`)
(exit 1 when an engine did not build, load or run a row; divergences are printed with their margins).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ORACLES = REPO / "oracles"
# engine -> (its source under c/, the make arguments, the binary)
ENGINES = {
    "olmoe": ("olmoe.c", ["olmoe"], "olmoe"),
    "colibri": ("colibri.c", ["colibri"], "colibri"),
    "inkling": ("inkling.c", ["inkling"], "inkling"),
    "deepseek_v4": ("deepseek_v4.c", ["-f", "Makefile.deepseek-v4", "deepseek-v4"], "deepseek_v4"),
    "qwen36": ("qwen36.c", ["qwen36"], "qwen36"),
    # no Makefile rule in the trees gathered (bench/README.md): make's implicit rule with the Makefile's flags
    "glm53": ("glm53.c", ["glm53", "LDLIBS=-lm"], "glm53"),
    "qwen38": ("qwen38.c", ["qwen38", "LDLIBS=-lm"], "qwen38"),
    "kimi_k3": ("kimi_k3.c", ["kimi_k3"], "kimi_k3"),
    "deepseek_v41": ("deepseek_v41.c", ["deepseek_v41", "LDLIBS=-lm"], "deepseek_v41"),
}
# no teacher-forced oracle mode: one single-token run per prefix
TF_BY_PREFIX = ("olmoe", "qwen36", "qwen38", "deepseek_v41")
MARGIN_EXPLAINS = 0.02  # a divergence where colitools' top-2 margin is below this is a rounding tie
CAP = "8"
V4_WIDE = "deepseek_v4_128"
V4_WIDE_HEAD_DIM = 64  # the 128-wide variant's default head_dim (--v4-head-dim)
BASE_FIXTURE = {"glm_eps6": "glm_moe_dsa", "glm_eps6_fp8": "glm_moe_dsa", V4_WIDE: "deepseek_v4"}
COLIBRI_FORMATS = ("int8-row", "int4-row", "int2-row", "int4-g32", "int4-g64", "int3-g64")


@dataclass(frozen=True)
class Case:
    """One row: an engine, a fixture (or variant), the convert options (``--target`` included)."""

    engine: str
    fixture: str
    options: tuple[tuple[str, str], ...]
    act_quant: str | None = None  # colitools run --act-quant for the reference
    label: str = ""

    @property
    def name(self) -> str:
        opts = "-".join(v for _, v in self.options) or "default"
        return f"{self.engine}-{self.fixture}-{opts}{'-' + self.act_quant if self.act_quant else ''}"


def v4_wide_name(head_dim: int = V4_WIDE_HEAD_DIM, seed: int | None = None) -> str:
    """The 128-wide deepseek_v4 variant's name for ``head_dim`` and random draw ``seed`` (None: the fixture's
    own seed); the defaults give ``deepseek_v4_128``."""
    hd = f"_hd{head_dim}" if head_dim != V4_WIDE_HEAD_DIM else ""
    return V4_WIDE + hd + (f"_seed{seed}" if seed is not None else "")


def v4_wide_params(name: str) -> tuple[int, int | None] | None:
    """``(head_dim, seed)`` of a :func:`v4_wide_name`, None for another fixture name."""
    m = re.fullmatch(re.escape(V4_WIDE) + r"(?:_hd(\d+))?(?:_seed(\d+))?", name)
    if m is None:
        return None
    return int(m[1] or V4_WIDE_HEAD_DIM), (int(m[2]) if m[2] else None)


def base_fixture(name: str) -> str:
    """The committed fixture whose prompt and reference length a fixture or variant uses."""
    return "deepseek_v4" if v4_wide_params(name) else BASE_FIXTURE.get(name, name)


def cases(v4_fixture: str = V4_WIDE) -> list[Case]:
    """Every row of the table: each engine on its target, every format it reads (``v4_fixture``: which
    128-wide deepseek_v4 draw, :func:`v4_wide_name`)."""
    out = [
        Case("olmoe", "olmoe_target", (("target", "olmoe"),)),
        Case("olmoe", "olmoe_target", (("target", "olmoe"), ("dense", "bf16"), ("embed", "bf16"))),
    ]
    generic = (("target", "generic"),)
    for fmt in COLIBRI_FORMATS:
        out.append(Case("colibri", "glm_eps6", (*generic, ("experts", fmt), ("dense", fmt), ("embed", fmt))))
    out.append(
        Case("colibri", "glm_eps6", (*generic, ("experts", "f32"), ("dense", "f32"), ("embed", "f32")))
    )
    out.append(
        Case("colibri", "glm_eps6", (*generic, ("experts", "bf16"), ("dense", "bf16"), ("embed", "bf16")))
    )
    out.append(Case("colibri", "glm_eps6_fp8", (*generic, ("dense", "fp8"), ("embed", "int8-row"))))
    for xb in ("int4-row", "int8-row", "f32", "bf16"):
        out.append(Case("inkling", "inkling", (("target", "inkling"), ("experts", xb))))
    out.append(Case("deepseek_v4", v4_fixture, (("target", "deepseek_v4"),), act_quant="official"))
    out.append(Case("deepseek_v4", v4_fixture, (("target", "deepseek_v4"),)))
    out.append(Case("glm53", "glm5_next_target", (("target", "glm53"),)))
    out.append(Case("glm53", "glm5_next_target", (("target", "glm53"), ("dense", "int4-g64"))))
    out.append(Case("kimi_k3", "kimi_k3", (("target", "kimi_k3"),)))
    out.append(Case("kimi_k3", "kimi_k3", (("target", "kimi_k3"), ("dense", "int4-g64"))))
    label = "experts dequantized into the main container"
    for fixture in ("qwen38", "qwen38_fp8"):  # bf16 experts, and FP8 experts as published
        out.append(Case("qwen38", fixture, (("target", "qwen38"),), label=label))
    for xb in ("int8-row", "int4-row", "int4-g32"):  # convert_qwen36.py's --ebits 8 / 4 / 4 --gs 32
        out.append(Case("qwen36", "qwen3_5_moe", (("target", "qwen36"), ("experts", xb))))
    # the release's FP8 / FP4 / engram bytes kept (native, the target's only recipe)
    out.append(Case("deepseek_v41", "deepseek_v41", (("target", "deepseek_v41"),)))
    return out + mse_cases()


def mse_cases() -> list[Case]:
    """``--quantizer mse`` (FORMATS §9): signed scales for c/colibri.c (the generic target), positive ones for the
    family engines (their own kernels)."""
    mse = (("quantizer", "mse"),)
    out = [
        Case("colibri", "glm_eps6", (("target", "generic"), ("experts", fmt), ("dense", fmt), ("embed", fmt), *mse))
        for fmt in COLIBRI_FORMATS
    ]
    out.append(Case("olmoe", "olmoe_target", (("target", "olmoe"), *mse)))
    for xb in ("int4-row", "int8-row"):
        out.append(Case("inkling", "inkling", (("target", "inkling"), ("experts", xb), *mse)))
    out.append(Case("qwen36", "qwen3_5_moe", (("target", "qwen36"), ("experts", "int4-g32"), *mse)))
    return out


# a size budget (FORMATS §12) per engine whose target offers a choice, in bits per weight: about the middle of
# the fixture's achievable range (glm_moe_dsa 2.7-8.6, inkling 10.6-32, olmoe_target 11.0-16.1)
BUDGET_BPW = {"colibri": ("glm_eps6", "generic", "4.5"), "inkling": ("inkling", "inkling", "16"),
              "olmoe": ("olmoe_target", "olmoe", "13.5")}  # fmt: skip


def budget_cases() -> list[Case]:
    """``--budget``: each engine on a budgeted conversion (formats chosen per tensor, or per its engine's expert
    grain, ``Target.expert_granularity``)."""
    return [Case(engine, fixture, (("target", target), ("target-bpw", bpw)), label="size budget")
            for engine, (fixture, target, bpw) in BUDGET_BPW.items()]  # fmt: skip


# ------------------------------------------------------------------------------------------------ engines
def build_engines(srcs: list[Path], work: Path, engines: list[str]) -> tuple[dict[str, Path], dict[str, str]]:
    """Build each of ``engines`` (nice, one job) from the first tree in ``srcs`` holding its source, each tree copied
    once into ``work``: per engine its ``c/`` folder and "yes", "no source in the given trees" or the build's
    last error line."""
    cdirs: dict[str, Path] = {}
    built: dict[str, str] = {}
    for engine in engines:
        source, argv, binary = ENGINES[engine]
        index = next((i for i, src in enumerate(srcs) if (src / "c" / source).is_file()), None)
        if index is None:
            built[engine] = "no source in the given trees"
            continue
        tree = work / f"colibri-src-{index}"
        if not tree.exists():
            shutil.copytree(srcs[index], tree, symlinks=True)
        cdir = cdirs[engine] = tree / "c"
        r = subprocess.run(
            ["nice", "-n", "10", "make", "-j1", *argv], cwd=cdir, capture_output=True, text=True
        )
        ok = r.returncode == 0 and (cdir / binary).exists()
        built[engine] = "yes" if ok else (r.stderr.strip().splitlines() or ["make failed"])[-1][:80]
    return cdirs, built


def engine_runs(case: Case, cdir: Path, model: Path, ref: Path, n_tf: int, n_greedy: int) -> list[list[str]]:
    """The engine's command line(s) for ``case``: one greedy and one teacher-forced run, or one doing both."""
    exe = str(cdir / ENGINES[case.engine][2])
    if case.engine == "olmoe":
        return [[exe, CAP, "8", str(ref)]]
    if case.engine in ("qwen36", "qwen38"):  # 8: the bits slot (checked, unused: weights are read as stored)
        return [[exe, CAP, "8", str(ref)]]
    if case.engine == "deepseek_v41":  # greedy from prompt_ids, checked against output_ids
        return [[exe, CAP, str(ref)]]
    ref_ids = json.loads(ref.read_text())
    ids = ",".join(str(t) for t in ref_ids["full_ids"])
    prompt = ",".join(str(t) for t in ref_ids["prompt_ids"])
    if case.engine == "glm53":  # oracle mode in ids: teacher-forced over full_ids, greedy from the prompt
        return [[exe, CAP, "--model", str(model), "--ids", ids],
                [exe, CAP, "--model", str(model), "--ids", prompt, "--greedy", str(n_greedy)]]  # fmt: skip
    if case.engine == "kimi_k3":  # ids too: K3_LOGITS dumps every prefill position's logits (run 0)
        return [[exe, str(model), "--ids", ids, "--ngen", "1"],
                [exe, str(model), "--ids", prompt, "--ngen", str(n_greedy)]]  # fmt: skip
    if case.engine == "colibri":
        return [[exe, CAP, "16", "16"], [exe, CAP, "16", "16"]]  # 16: float tensors stay float
    if case.engine == "inkling":
        return [[exe, CAP, "0", str(ref)]]  # 0: float stacks stay float, quantized ones are read as stored
    return [
        [exe, str(model), "--oracle", str(ref), "--teacher-forcing", str(n_tf), "--greedy", str(n_greedy)]
    ]


def engine_env(model: Path, ref: Path) -> dict[str, str]:
    """Exact kernels: float activations (``IDOT=0``, kimi_k3.c's ``K3_IDOT=0``), float dense matrices (qwen36.c's
    ``COLI_DENSE_I8=0``, glm53.c's ``GLM53_BITS=32``, kimi_k3.c's ``K3_BITS`` / ``K3_MLA_BITS`` / ``K3_HEAD_BITS``
    32: they quantize float dense tensors at load otherwise; stored codes are read as stored); no usage file
    written into the container (``USAGE_SAVE=0``). deepseek_v41.c needs none: its matvecs take float activations
    and read the stored FP8 / FP4 bytes; ``V41_INDEX_OWNER`` stays unset (the release's published-keys rule)."""
    exact = {"IDOT": "0", "COLI_DENSE_I8": "0", "GLM53_BITS": "32", "K3_IDOT": "0", "K3_BITS": "32",
             "K3_MLA_BITS": "32", "K3_HEAD_BITS": "32", "USAGE_SAVE": "0"}  # fmt: skip
    return {**os.environ, **exact, "SNAP": str(model), "REF": str(ref), "COLI_NO_OMP_TUNE": "1"}


def k3_ids(run: int, stdout: str, logits: Path, positions: int) -> str:
    """kimi_k3.c's output as glm53.c's id lines: run 0's ``K3_LOGITS`` dump (f32 ``[positions, vocab]``, one row
    per prefill position) as ``teacher_forcing`` argmaxes, run 1's printed ids (before its ``TUNE`` line) as
    ``greedy``."""
    if run == 0:
        rows = np.fromfile(logits, dtype=np.float32) if logits.exists() else np.zeros(0, np.float32)
        if positions == 0 or rows.size % positions:
            return ""
        return "teacher_forcing " + " ".join(str(int(t)) for t in rows.reshape(positions, -1).argmax(-1))
    return "greedy " + " ".join(re.findall(r"-?\d+", stdout.split("TUNE")[0]))


def id_lines(out: str, ref: Path) -> str:
    """glm53.c prints ``teacher_forcing ids`` and ``greedy ids``: the ``k/N`` lines the others print, and a
    ``mismatch pos=P`` line per teacher-forced difference (the engine's ids against the reference's)."""
    want = json.loads(ref.read_text())
    lines = []
    tf = re.search(r"^teacher_forcing((?: -?\d+)*)$", out, re.M)
    if tf and len(tf[1].split()) == len(want["full_ids"]):
        got, pred = [int(t) for t in tf[1].split()], want["tf_pred"]
        lines += [
            f"[ORACLE] mismatch pos={i}" for i, (a, b) in enumerate(zip(got, pred, strict=True)) if a != b
        ]
        lines.append(
            f"teacher-forced argmax: {sum(a == b for a, b in zip(got, pred, strict=True))}/{len(pred)}"
        )
    greedy = re.search(r"^greedy((?: -?\d+)*)$", out, re.M)
    if greedy:
        got, gen = [int(t) for t in greedy[1].split()], want["full_ids"][len(want["prompt_ids"]) :]
        lines.append(f"C engine : {' '.join(map(str, got))}")
        lines.append(f"Matching tokens: {sum(a == b for a, b in zip(got, gen, strict=False))}/{len(gen)}")
    return "\n".join(lines)


def run_engine(case: Case, cdir: Path, model: Path, ref: Path, n_tf: int, n_greedy: int) -> dict[str, object]:
    """Run the engine on ``model``; ``{"ran": yes / the error, "tf": (k, N) or None, "greedy": (k, N) or
    None, "out": its output}`` parsed from its ``k/N`` lines."""
    result: dict[str, object] = {"ran": "yes", "tf": None, "greedy": None, "out": ""}
    for i, argv in enumerate(engine_runs(case, cdir, model, ref, n_tf, n_greedy)):
        env = engine_env(model, ref)
        if case.engine == "colibri" and i == 1:
            env["TF"] = "1"
        logits = ref.with_suffix(".k3logits")
        if case.engine == "kimi_k3" and i == 0:
            logits.unlink(missing_ok=True)
            env["K3_LOGITS"] = str(logits)
        try:
            r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, errors="replace")
        except subprocess.TimeoutExpired:
            result["ran"] = "timeout"
            return result
        out = r.stdout + r.stderr
        if case.engine == "glm53":
            out += "\n" + id_lines(r.stdout, ref)
        if case.engine == "kimi_k3":
            positions = len(json.loads(ref.read_text())["full_ids"])
            out += "\n" + id_lines(k3_ids(i, r.stdout, logits, positions), ref)
        if case.engine == "deepseek_v41":  # its greedy ids are its stdout: the line divergences() reads
            out += "\nC engine : " + " ".join(re.findall(r"-?\d+", r.stdout))
        result["out"] = str(result["out"]) + out
        tf = re.search(r"(?:PREFILL \(teacher-forcing\) C vs oracle|teacher-forced argmax): (\d+)/(\d+)", out)
        greedy = re.search(r"(?:Matching tokens|GREEDY C vs oracle): (\d+)/(\d+)", out)
        result["tf"] = (int(tf[1]), int(tf[2])) if tf else result["tf"]
        result["greedy"] = (int(greedy[1]), int(greedy[2])) if greedy else result["greedy"]
        if not tf and not greedy:
            last = [line for line in out.strip().splitlines() if line.strip()] or [f"exit {r.returncode}"]
            result["ran"] = f"no (exit {r.returncode}: {last[-1][:70]})"
    return result


def tf_by_prefix(case: Case, cdir: Path, model: Path, ref: dict, work: Path) -> tuple[tuple[int, int], str]:
    """Teacher-forced argmax of an engine without a teacher-forced mode: for every position ``p - 1`` one oracle
    run on the prompt ``full_ids[:p]`` generating one token (the engine's argmax after prefilling the prefix).
    ``(k, N)`` and the ``[ORACLE] ... mismatch pos=P`` lines :func:`divergences` reads."""
    full, want = ref["full_ids"], ref["tf_pred"]
    folder = work / "refs" / f"{case.name}.prefix"
    folder.mkdir(parents=True, exist_ok=True)
    k, notes = 0, []
    for p in range(1, len(full) + 1):
        path = folder / f"{p}.json"
        path.write_text(json.dumps({"prompt_ids": full[:p], "full_ids": full[:p] + [want[p - 1]],
                                    "output_ids": [want[p - 1]]}))  # fmt: skip
        argv = engine_runs(case, cdir, model, path, 0, 1)[0]
        r = subprocess.run(argv, env=engine_env(model, path), capture_output=True, text=True, timeout=900,
                           errors="replace")  # fmt: skip
        if re.search(r"Matching tokens: 1/1", r.stdout + r.stderr):
            k += 1
        else:
            notes.append(f"[ORACLE] prefix mismatch pos={p - 1}")
    return (k, len(full)), "\n".join(notes)


# ------------------------------------------------------------------------------------------------ fixtures
def prepare_fixture(name: str, work: Path, oracle_python: str | None) -> Path:
    """The source folder of fixture or variant ``name`` (made once in ``work``)."""
    if (ORACLES / name).is_dir():
        return ORACLES / name
    out = work / "fixtures" / name
    if out.exists():
        return out
    if name in ("glm_eps6", "glm_eps6_fp8"):
        shutil.copytree(ORACLES / "glm_moe_dsa", out, ignore=shutil.ignore_patterns("reference"))
        config = json.loads((out / "config.json").read_text())
        config["rms_norm_eps"] = 1e-6  # what c/colibri.c uses for q_a / kv_a layernorms too
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if name == "glm_eps6_fp8":
            fp8_source(out)
        return out
    wide = v4_wide_params(name)
    if wide is not None:
        if oracle_python is None:
            raise SystemExit(f"{name} needs --oracle-python (torch + transformers, oracles/README.md)")
        argv = [oracle_python, __file__, "--make-v4-wide", str(out), "--v4-head-dim", str(wide[0])]
        subprocess.run(argv + (["--v4-seed", str(wide[1])] if wide[1] is not None else []), check=True)
        return out
    raise SystemExit(f"unknown fixture {name}")


def fp8_source(folder: Path) -> None:
    """Rewrite a float fixture's attention / dense / shared-expert projections as a DeepSeek-style FP8 source
    (e4m3 codes + ``weight_scale_inv`` F32 per 128x128 block, oracles/oracle_recipes.py's FP8 rule), for
    ``--dense fp8`` (passthrough of the FP8 bytes, c/colibri.c's fmt 8)."""
    sys.path.insert(0, str(ORACLES))
    from oracle_recipes import fp8_block_quantize  # the oracles' own FP8 rule

    from colitools.formats.safetensors_io import SafetensorsFile

    path = folder / "model.safetensors"
    entries: list[tuple[str, str, tuple[int, ...], bytes]] = []
    with SafetensorsFile(path) as f:
        for name, info in f.tensors.items():
            fp8 = name.endswith("_proj.weight") and ".experts." not in name and len(info.shape) == 2
            if fp8 and "indexer" not in name and "kv_b_proj" not in name:  # c/colibri.c absorbs kv_b per row
                codes, scale_inv = fp8_block_quantize(f.read(name).astype(np.float32))
                entries.append((name, "F8_E4M3", codes.shape, codes.tobytes()))
                base = name[: -len("weight")]
                entries.append((base + "weight_scale_inv", "F32", scale_inv.shape, scale_inv.tobytes()))
            else:
                entries.append((name, info.dtype, tuple(info.shape), f.read_bytes(name)))
    write_safetensors(path, entries)
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_safetensors(path: Path, entries: list[tuple[str, str, tuple[int, ...], bytes]]) -> None:
    """A safetensors file of ``(name, dtype, shape, bytes)`` entries, in order."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(e[3] for e in entries))


def engine_container(case: Case, model: Path) -> Path:
    """The folder the engine runs: the container itself, except for qwen38. The qwen38.c of the gathered tree
    (bench/README.md) predates the ``experts-int4g64/`` sidecar ``--target qwen38`` writes and reads routed
    experts from the main container only, so its folder is the target's main container (linked) plus the
    sidecar's experts decoded by colitools to F32 per-expert tensors: the same values ``colitools run`` computes
    with; every other tensor and the config are the target's, byte for byte."""
    if case.engine != "qwen38":
        return model
    from colitools.runtime.weights import Checkpoint, decode_stored

    out = model.parent / f"{model.name}.engine"
    if (out / "experts-decoded.safetensors").exists():
        return out
    out.mkdir(exist_ok=True)
    for f in [*model.glob("*.safetensors"), model / "config.json", model / "generation_config.json"]:
        (out / f.name).unlink(missing_ok=True)
        (out / f.name).symlink_to(f)
    config = json.loads((model / "config.json").read_text())
    text = config.get("text_config", config)
    H, I = text["hidden_size"], text["moe_intermediate_size"]
    ckpt, entries = Checkpoint(model, config), []
    for layer in range(text["num_hidden_layers"]):
        for e in range(text["num_experts"]):
            for proj, (O, In) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                stored = ckpt.stored(f"model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight", O, In)
                w = decode_stored(stored, *ckpt.read_stored(stored)).astype(np.float32)
                name = f"model.language_model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight"
                entries.append((name, "F32", (O, In), w.tobytes()))
    ckpt.close()
    write_safetensors(out / "experts-decoded.safetensors", entries)
    return out


def make_v4_wide(out: Path, head_dim: int = V4_WIDE_HEAD_DIM, seed: int | None = None) -> None:
    """(oracle venv) The deepseek_v4 fixture's model at 128 wide with ``head_dim``, written as
    oracles/make_oracles.py writes a fixture (same init, noise and storage), at ``seed`` (None: the fixture's
    own); no references."""
    sys.path.insert(0, str(ORACLES))
    sys.path.insert(0, str(REPO))
    import colitools  # noqa: PLC0415  (the repository's folders as the installed namespace maps them)

    colitools.__path__.append(str(REPO))
    from dataclasses import replace

    import fixture_specs  # noqa: PLC0415
    import make_oracles as mo  # noqa: PLC0415
    from fixture_io import write_fixture  # noqa: PLC0415

    fx = next(f for f in fixture_specs.FIXTURES if f.name == "deepseek_v4")
    # c/deepseek_v4.c slices wo_a per group at o_lora_rank rows and ceil(o_lora_rank / 128) scale rows: a rank
    # below 128 makes the second group read another block's scales, so every FP8 / FP4 input and the rank are 128;
    # wo_a's group input (heads / o_groups * head_dim) too: o_groups 2 at head_dim 64, 1 at head_dim 32
    groups = fx.config["num_attention_heads"] * head_dim // 128
    if groups < 1 or fx.config["num_attention_heads"] % groups:
        raise SystemExit(f"--v4-head-dim {head_dim}: no o_groups gives wo_a a group input of 128")
    wide = dict(hidden_size=128, q_lora_rank=128, head_dim=head_dim, o_groups=groups, o_lora_rank=128,
                moe_intermediate_size=128, index_head_dim=32)  # fmt: skip
    fx = replace(fx, name=V4_WIDE, config={**fx.config, **wide}, seed=fx.seed if seed is None else seed)
    tmp = out.parent / f"{out.name}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    model = mo.build_model(fx, fx.seed, None)
    disk, saved_cfg, gen_cfg = mo.disk_tensors(model, fx.fused, tmp)
    stored, _ = mo.store(fx, disk)
    config = mo.fixture_config(fx, saved_cfg)
    write_fixture(fx, out, config, gen_cfg, stored, None, mo.text_of(config)["num_hidden_layers"])
    shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ colitools
def convert_case(case: Case, source: Path, work: Path) -> Path:
    """``colitools convert`` of ``source`` with the case's options (once)."""
    out = work / "containers" / case.name.removesuffix(f"-{case.act_quant}" if case.act_quant else "")
    if not (out / "colitools.json").exists():
        argv = [sys.executable, "-m", "colitools", "convert", str(source), str(out), "--min-free-gb", "0"]
        for option, value in case.options:
            argv += [f"--{option}", value]
        subprocess.run(argv, check=True, capture_output=True, text=True)
    return out


def colitools_reference(model_dir: Path, prompt: list[int], n: int, act_quant: str | None) -> dict:
    """``colitools run``'s greedy tokens and teacher-forced argmax on the container, with colitools' top-2
    margin at every step: the oracle JSON the engines read (``prompt_ids``, ``full_ids``, ``tf_pred``) plus
    ``greedy_margins`` / ``tf_margins``."""
    from colitools.runtime import load_model

    kwargs = {"act_quant": act_quant} if act_quant else {}
    with load_model(model_dir, record_usage=False, **kwargs) as model:
        tokens, margins = [], []
        logits = model.forward(prompt)
        for _ in range(n):
            top = np.sort(logits)[-2:]
            tokens.append(int(np.argmax(logits)))
            margins.append(float(top[1] - top[0]))
            logits = model.forward([tokens[-1]])
        model.reset()
        full = model.forward(prompt + tokens, all_logits=True)
    top2 = np.sort(full, axis=-1)[:, -2:]
    return {"prompt_ids": prompt, "full_ids": prompt + tokens, "tf_pred": [int(a) for a in full.argmax(-1)],
            "greedy_margins": margins, "tf_margins": [float(m) for m in top2[:, 1] - top2[:, 0]]}  # fmt: skip


def divergences(out: str, ref: dict) -> tuple[list[int], int | None]:
    """Teacher-forced positions the engine reported as mismatches (``[ORACLE] ... mismatch pos=P``) and the
    first greedy step where its tokens (``... engine : ...`` line, or ``greedy mismatch i=I``) leave
    colitools'."""
    tf = sorted({int(p) for p in re.findall(r"mismatch pos=(\d+)", out)})
    first = [int(i) for i in re.findall(r"greedy mismatch i=(\d+)", out)]
    line = re.search(r"C engine\s*:\s*([-\d ]+)", out)
    if line and not first:
        got, want = [int(t) for t in line[1].split()], ref["full_ids"][len(ref["prompt_ids"]) :]
        first = [i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b][:1]
    return tf, (min(first) if first else None)


def divergence_note(out: str, ref: dict) -> str:
    """Each divergence with colitools' top-2 margin there (greedy: at the first diverging step)."""
    tf, first = divergences(out, ref)
    notes = [f"TF pos {p} margin {ref['tf_margins'][p]:.4f}" for p in tf if p < len(ref["tf_margins"])]
    if first is not None:
        notes.append(f"greedy leaves at step {first}, margin {ref['greedy_margins'][first]:.4f}")
    short = re.search(r"greedy length mismatch expected=(\d+) got=(\d+)", out)
    if not notes:
        return f"the engine decodes {short[2]} of {short[1]} tokens, all equal" if short else ""
    explained = all(float(n.rsplit(" ", 1)[1]) < MARGIN_EXPLAINS for n in notes)
    return "; ".join(notes) + (" (all < 0.02)" if explained else " (NOT explained by a margin < 0.02)")


@dataclass
class Row:
    case: Case
    built: str
    loaded: str = "-"
    ran: str = "-"
    tf: str = "-"
    greedy: str = "-"
    note: str = ""
    extra: dict = field(default_factory=dict)


def run_case(case: Case, cdir: Path | None, built: str, work: Path, oracle_python: str | None) -> Row:
    """Convert, reference, run the engine: one table row."""
    row = Row(case, built)
    if built != "yes" or cdir is None:
        return row
    source = prepare_fixture(case.fixture, work, oracle_python)
    model = convert_case(case, source, work)
    oracle = json.loads((ORACLES / base_fixture(case.fixture) / "reference" / "f32.json").read_text())
    prompt, n = [int(t) for t in oracle["prompt_ids"]], len(oracle["generated_ids"])
    ref = colitools_reference(model, prompt, n, case.act_quant)
    ref_path = work / "refs" / f"{case.name}.json"
    ref_path.parent.mkdir(parents=True, exist_ok=True)
    ref_path.write_text(json.dumps({**{k: ref[k] for k in ("prompt_ids", "full_ids", "tf_pred")},
                                    "output_ids": ref["full_ids"][len(prompt) :]}))  # fmt: skip
    engine_model = engine_container(case, model)
    result = run_engine(case, cdir, engine_model, ref_path, len(ref["tf_pred"]), n)
    if case.engine in TF_BY_PREFIX and result["ran"] == "yes":
        result["tf"], notes = tf_by_prefix(case, cdir, engine_model, ref, work)
        result["out"] = f"{result['out']}\n{notes}"
    row.ran = str(result["ran"])
    row.loaded = "yes" if result["tf"] or result["greedy"] else "no"
    row.tf = "{}/{}".format(*result["tf"]) if result["tf"] else "-"
    row.greedy = "{}/{}".format(*result["greedy"]) if result["greedy"] else "-"
    row.note = divergence_note(str(result["out"]), ref)
    return row


def print_table(rows: list[Row]) -> None:
    print(
        "| engine | fixture | target / recipe | act-quant | built | loaded | ran | TF k/N | greedy k/N | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        opts = " ".join(f"--{k} {v}" for k, v in r.case.options)
        opts += f" ({r.case.label})" if r.case.label else ""
        print(f"| {r.case.engine} | {r.case.fixture} | {opts} | {r.case.act_quant or '-'} | {r.built} | "
              f"{r.loaded} | {r.ran} | {r.tf} | {r.greedy} | {r.note} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("colibri_src", nargs="*", type=Path,
                    help="colibri source trees (each with c/); an engine is built from the first holding it")  # fmt: skip
    ap.add_argument("--work", type=Path, default=REPO / ".bench-tmp" / "colibri-compat")
    ap.add_argument("--oracle-python", help="python with torch + transformers (the 128-wide deepseek_v4)")
    ap.add_argument("--only", nargs="*", choices=sorted(ENGINES), help="engines to check (default all)")
    ap.add_argument("--quantizer", choices=("rtn", "mse"),
                    help="only the rows of this quantizer (default: every row)")  # fmt: skip
    ap.add_argument("--v4-head-dim", type=int, default=V4_WIDE_HEAD_DIM,
                    help=f"head_dim of the 128-wide deepseek_v4 variant (default {V4_WIDE_HEAD_DIM})")  # fmt: skip
    ap.add_argument("--v4-seed", type=int,
                    help="random draw (torch seed) of the 128-wide deepseek_v4 variant (default: the fixture's)")  # fmt: skip
    ap.add_argument("--budget", action="store_true", help="only the size-budget rows (BUDGET_BPW)")
    ap.add_argument("--make-v4-wide", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.make_v4_wide:
        make_v4_wide(args.make_v4_wide, args.v4_head_dim, args.v4_seed)
        return 0
    if not args.colibri_src or not all((src / "c").is_dir() for src in args.colibri_src):
        ap.error("give colibri source trees (folders with c/)")
    args.work.mkdir(parents=True, exist_ok=True)
    engines = args.only or list(ENGINES)
    cdirs, built = build_engines([src.resolve() for src in args.colibri_src], args.work, engines)
    v4_fixture = v4_wide_name(args.v4_head_dim, args.v4_seed)
    chosen = [c for c in cases(v4_fixture) if c.engine in engines and (
        args.quantizer is None or dict(c.options).get("quantizer", "rtn") == args.quantizer)]  # fmt: skip
    if args.budget:
        chosen = [c for c in budget_cases() if c.engine in engines]
    rows = [run_case(c, cdirs.get(c.engine), built[c.engine], args.work, args.oracle_python) for c in chosen]
    print_table(rows)
    return 0 if all(r.ran == "yes" for r in rows) else 1  # divergences are the table's to explain


if __name__ == "__main__":
    sys.exit(main())
