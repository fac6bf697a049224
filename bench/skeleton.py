"""Full-size sparse skeletons of published checkpoints: every tensor at its published shard, dtype and shape,
its data a hole that reads as zeros (issue 25, "the skeleton method").

    .venv/bin/python bench/skeleton.py bench/published/gpt-oss-20b /tmp/skel/gpt-oss-20b
    .venv/bin/python bench/skeleton.py bench/published/* --out /tmp/skel --plan     # + convert --dry-run each

A release folder holds the published ``config.json`` and ``model.safetensors.index.json`` (or ``.json.gz``) and a
``SOURCE`` line saying where they came from. The index gives names -> shards, not dtypes or shapes; they are
derived here from the config through the project's own owners of those facts: the float dtype from
``torch_dtype`` / ``dtype``, every linear ``[O, I]`` from ``container.config_shapes`` (the families' geometry,
``formats/families.py``), expert stacks by the family's orientation (``families.stack_orientation``), and every
companion of a natively quantized weight (``_scale_inv``, ``_blocks`` / ``_scales``, ``weight_packed`` /
``weight_scale`` / ``weight_shape``, ...) from the source-encoding registry (``formats/source_encodings/``:
each ``Part``'s dtype and shape function of ``(O, I, group)``). The few 1-D / small parameters no geometry owns (norms,
biases, sinks, conv taps, ``A_log``) are the table ``SMALL`` below. A name nothing derives stops the script,
naming it. The sum of the tensor bytes is checked against the index's ``metadata.total_size``.

Each shard is written with the project's writer (``SafetensorsWriter.header_bytes``: the same header a
conversion's writer would put there), then extended to its full size with ``truncate``: a sparse file, no data
written. ``--plan`` runs ``colitools convert --dry-run --json`` on each skeleton under ``/usr/bin/time -v`` and
prints the roles -> formats, the planning wall time and the peak RSS.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from colitools.formats import families, model_config, names, source_encodings, towers
from colitools.formats.container import config_shapes
from colitools.formats.filenames import CONFIG_FILE, INDEX_FILE
from colitools.formats.safetensors_io import SafetensorsWriter

DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
F32_SMALL = ("e_score_correction_bias",)  # stored F32 whatever the checkpoint's float dtype (DeepSeek-V3)
Entry = tuple[str, tuple[int, ...]]
# a release's published tensor listing, where a mirror has one (``published_shapes``)
SHAPES_FILE = "shapes.json"


# ------------------------------------------------------------------------------------------- the release
def load_release(folder: Path) -> tuple[dict[str, Any], dict[str, str], int | None]:
    """``(config, weight_map, metadata.total_size or None)`` of a published release folder."""
    config = json.loads((folder / CONFIG_FILE).read_text())
    plain, packed = folder / INDEX_FILE, folder / (INDEX_FILE + ".gz")
    index = json.loads(gzip.open(packed).read() if packed.exists() else plain.read_text())
    return config, index["weight_map"], (index.get("metadata") or {}).get("total_size")


def float_dtype(config: dict[str, Any]) -> str:
    """The checkpoint's float dtype (``torch_dtype`` / ``dtype`` of the config or its text model; BF16 when
    neither says, as gpt-oss's config)."""
    for c in (config, model_config.text_config(config)):
        for key in ("torch_dtype", "dtype"):
            if c.get(key) in DTYPES:
                return DTYPES[c[key]]
    return "BF16"


# ------------------------------------------------------------------------ natively quantized companions
def declared_encodings(config: dict[str, Any]) -> list[tuple[type[source_encodings.SourceEncoding], Any]]:
    """The encodings ``quantization_config`` declares (each with its scheme), as the converter reads it."""
    qs = source_encodings.read_quant_config(config)
    if qs.method is None:
        return []
    qc = model_config.quantization_config(config) or {}
    algo = qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo")
    return [
        (e, qs.of(e))
        for e in source_encodings.ENCODINGS.values()
        if any(m == qs.method and a in (None, algo) for m, a in e.declared_by)
    ]


def companions(weight_map: dict[str, str], config: dict[str, Any]) -> dict[str, tuple[type, str, str, Any]]:
    """Every source tensor that is a part of a natively quantized weight: name -> (encoding, role, logical
    weight name, scheme). A data part is a name with its suffix whose first required companion is in the index
    (an index has no dtypes)."""
    out = {}
    for enc, scheme in declared_encodings(config):
        data, rest = enc.parts[0], [p for p in enc.parts[1:]]
        first = next(p for p in rest if p.required)
        for n in weight_map:
            stem = n[: -len(data.suffix)] if data.suffix else n
            if not n.endswith(data.suffix) or stem + first.suffix not in weight_map:
                continue  # a data tensor is known by its first required companion (the index has no dtypes)
            logical = stem + ".weight" if data.suffix.startswith(".weight") else stem
            out[n] = (enc, "data", logical, scheme)
            for p in rest:
                if stem + p.suffix in weight_map:
                    out[stem + p.suffix] = (enc, p.role, logical, scheme)
            if hasattr(enc, "INPUT_SCALE"):  # NVFP4's activation scale, dropped by the converter
                drop = (stem[: -len(".weight")] if stem.endswith(".weight") else stem) + enc.INPUT_SCALE
                if drop in weight_map:
                    out[drop] = (enc, "input_scale", logical, scheme)
    return out


def part_entry(enc, role: str, logical: tuple[int, ...], scheme) -> Entry:
    """dtype and shape of part ``role`` of a weight of logical shape ``[..., O, I]`` in encoding ``enc``."""
    if role == "input_scale":
        return "F32", ()
    part = enc.part(role)
    lead, (O, I) = tuple(logical[:-2]), logical[-2:]
    group = getattr(scheme, "group_size", None) or enc.group or 32
    block = getattr(scheme, "block", None) or source_encodings.DEFAULT_FP8_BLOCK
    # the group the part's shape function takes: FP8 blocks (br, bc), a square tile side b, or inputs per scale
    grid = block if isinstance(part.group_name, tuple) else block[0] if part.group_name == "b" else group
    dtype = "F32" if enc is source_encodings.Fp8Block and role == "scale" else part.dtypes[0]
    return dtype, part.expect(O, I, grid, lead)  # the registry's shape function of (O, I, group)


# --------------------------------------------------------------------------------------------- float tensors
def stack_shape(name: str, facts, native: str | None) -> tuple[int, ...] | None:
    """An expert stack's (or stack bias's) logical shape, in its family's orientation (``native``: the
    encoding of a natively quantized stack, whose orientation is the family's for that encoding)."""
    p = names.parse_name(name)
    if p.role not in (names.TensorRole.EXPERT_STACK, names.TensorRole.STACK_BIAS):
        return None
    E, I, H = facts.routed_experts, facts.expert_width, facts.expert_hidden or facts.hidden_size
    out = {"gate_up": 2 * I, "gate": I, "up": I, "down": H}[p.projection]
    if p.role is names.TensorRole.STACK_BIAS:
        return (E, out)
    orientation = families.stack_orientation(facts.model_type, native, p.leaf)
    inp = H if p.projection != "down" else I
    if orientation is not None and orientation.transposed:
        return (E, inp, out)
    return (E, out, inp)


def small_shape(name: str, text: dict[str, Any], facts, linear: dict[str, tuple]) -> tuple[int, ...] | None:
    """The 1-D / small parameters no geometry owns (``SMALL``): norms, biases, sinks, router corrections, the
    linear attention's conv taps, ``A_log`` and ``dt_bias``."""
    leaf = name.rsplit(".", 2)[-2] if name.endswith((".weight", ".bias")) else name.rsplit(".", 1)[-1]
    heads = text.get("num_attention_heads")
    head_dim = text.get("head_dim") or (facts.hidden_size // heads if heads else None)
    v_heads = text.get("linear_num_value_heads")
    if name.endswith(".bias") and name[: -len("bias")] + "weight" in linear:
        return (linear[name[: -len("bias")] + "weight"][0],)
    norms = {"q_norm": head_dim, "k_norm": head_dim, "q_a_layernorm": text.get("q_lora_rank"),
             "kv_a_layernorm": text.get("kv_lora_rank")}  # fmt: skip
    if leaf in norms:
        return (norms[leaf],)
    if leaf == "norm" and ".linear_attn." in name:
        return (text["linear_value_head_dim"],)
    if leaf.endswith("norm") or leaf.endswith("layernorm"):
        return (facts.hidden_size,)
    if leaf == "sinks":
        return (heads,)
    if leaf == "e_score_correction_bias":  # stored F32 (F32_SMALL)
        return (facts.routed_experts,)
    if leaf in ("A_log", "dt_bias"):
        return (v_heads,)
    if leaf == "conv1d" and ".linear_attn." in name:
        k = text["linear_num_key_heads"] * text["linear_key_head_dim"]
        return (2 * k + v_heads * text["linear_value_head_dim"], 1, text["linear_conv_kernel_dim"])
    return None


def tensor_entries(config: dict[str, Any], weight_map: dict[str, str]) -> dict[str, Entry]:
    """Every tensor of the index with its dtype and shape, derived from the config (module docstring)."""
    facts = model_config.read_facts(config)
    text, fdtype = model_config.text_config(config), float_dtype(config)
    parts = companions(weight_map, config)
    logical_names = sorted({logical for _, _, logical, _ in parts.values()} | (set(weight_map) - set(parts)))
    linear = {n: s for n, s in config_shapes(config, logical_names).items() if None not in s}
    # a multimodal release's vision tower and projector
    linear.update(towers.tower_shapes(config, logical_names))
    out: dict[str, Entry] = {}
    for name in weight_map:
        if name in parts:
            enc, role, logical, scheme = parts[name]
            # an FP8 block-scaled stack is laid out as the family's float stacks (the converter carries its scale)
            shape = stack_shape(logical, facts, enc.kind if enc.paired else None) or linear.get(logical)
            if shape is None:
                raise SystemExit(f"skeleton: no shape for {logical} (the {enc.label} weight of {name})")
            out[name] = part_entry(enc, role, shape, scheme)
            continue
        shape = stack_shape(name, facts, None) or linear.get(name) or small_shape(name, text, facts, linear)
        if shape is None or None in shape:
            raise SystemExit(f"skeleton: no dtype and shape derivable for tensor {name}")
        out[name] = ("F32" if name.endswith(F32_SMALL) else fdtype, shape)
    return out


# ----------------------------------------------------------------------------------------------- writing
def write_skeleton(
    out: Path, config: dict[str, Any], weight_map: dict[str, str], entries: dict[str, Entry]
) -> int:
    """The skeleton folder: ``config.json``, the index, and every shard as header + hole. Returns the bytes of
    tensor data (what ``metadata.total_size`` counts)."""
    out.mkdir(parents=True, exist_ok=True)
    by_shard: dict[str, list[tuple[str, str, tuple[int, ...]]]] = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(shard, []).append((name, *entries[name]))
    total = 0
    for shard, planned in sorted(by_shard.items()):
        header = SafetensorsWriter.header_bytes(planned)
        size = SafetensorsWriter.file_size(planned)
        with open(out / shard, "wb") as f:
            f.write(header)
            f.truncate(size)  # a hole: reads as zeros, no block written
        total += size - len(header)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


def published_shapes(folder: Path) -> dict[str, Entry] | None:
    """The release's published tensor listing (``shapes.json(.gz)``: name -> ``[dtype, shape]``, transcribed from
    the shards' headers where a mirror has them), None when the folder has none."""
    plain, packed = folder / SHAPES_FILE, folder / (SHAPES_FILE + ".gz")
    if not (plain.exists() or packed.exists()):
        return None
    listing = json.loads(gzip.open(packed).read() if packed.exists() else plain.read_text())
    return {n: (dtype, tuple(shape)) for n, (dtype, shape) in listing.items()}


def build(release: Path, out: Path) -> dict[str, Any]:
    """Build the skeleton of ``release`` in ``out``; its tensor count, bytes, the published total's check and,
    where the release has a tensor listing, every derived dtype and shape checked against it."""
    started = time.monotonic()
    config, weight_map, published = load_release(release)
    entries = tensor_entries(config, weight_map)
    listing = published_shapes(release)
    wrong = None if listing is None else sorted(n for n in listing if entries.get(n) != listing[n])
    total = write_skeleton(out, config, weight_map, entries)
    return {"release": release.name, "tensors": len(entries), "shards": len(set(weight_map.values())),
            "bytes": total, "published_total_size": published,
            "difference": None if published is None else total - published,
            "shapes_checked": None if listing is None else len(listing), "shapes_wrong": wrong,
            "build_seconds": round(time.monotonic() - started, 2)}  # fmt: skip


# ------------------------------------------------------------------------------------- planning a skeleton
def timed(args: list[str]) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run ``args`` under ``/usr/bin/time -v``: the process, its wall seconds and its peak RSS in kB."""
    proc = subprocess.run(["/usr/bin/time", "-v", *args], capture_output=True, text=True)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", proc.stderr)
    seconds = sum(float(x) * 60**k for k, x in enumerate(reversed(wall.group(1).split(":")))) if wall else 0.0
    return proc, seconds, int(rss.group(1)) if rss else 0


def colitools(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "colitools"), *args]


def plan(skeleton: Path, work: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """``convert --dry-run --json`` of a skeleton: roles -> formats, the experts choice, warnings, wall time and
    peak RSS of the whole process (its start-up included)."""
    proc, seconds, rss = timed(colitools("convert", str(skeleton), str(work), "--dry-run", "--json",
                                         "--min-free-gb", "0", *extra))  # fmt: skip
    if proc.returncode != 0:
        error = [x for x in proc.stderr.splitlines() if x.startswith("colitools:")]
        return {
            "ok": False,
            "error": error[-1] if error else proc.stderr[-300:],
            "seconds": seconds,
            "rss_kb": rss,
        }
    summary = json.loads(proc.stdout)
    return {"ok": True, "seconds": seconds, "rss_kb": rss, "units": summary["units_total"],
            "bytes_in": summary["bytes_in"], "bytes_out": summary["bytes_out"],
            "experts": summary.get("experts_choice", {}), "formats_per_role": summary["formats_per_role"],
            "warnings": summary["warnings"]}  # fmt: skip


def convert(skeleton: Path, work: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """A real conversion of the skeleton into ``work`` (its zeros encoded and written): wall time, peak RSS."""
    proc, seconds, rss = timed(
        colitools("convert", str(skeleton), str(work), "--json", "--min-free-gb", "0", *extra)
    )
    if proc.returncode != 0:
        return {
            "ok": False,
            "error": proc.stderr.strip().splitlines()[-1:],
            "seconds": seconds,
            "rss_kb": rss,
        }
    summary = json.loads(proc.stdout)
    return {"ok": True, "seconds": seconds, "rss_kb": rss, "bytes_in": summary["bytes_in"],
            "bytes_out": summary["bytes_out"], "units": summary["units_converted"]}  # fmt: skip


def inspect_summary(skeleton: Path) -> dict[str, Any]:
    """``inspect --summary --json`` of the skeleton (the source as a user sees it before converting)."""
    proc = subprocess.run(
        colitools("inspect", "--summary", "--json", str(skeleton)), capture_output=True, text=True
    )
    if proc.returncode != 0:
        return {"ok": False, "error": proc.stderr.strip()}
    data = json.loads(proc.stdout)
    return {
        "ok": True,
        "source_encodings": data.get("source_encodings"),
        "formats_per_role": data["formats_per_role"],
    }


def role_lines(formats_per_role: dict[str, dict[str, int]]) -> list[str]:
    return [
        f"    {role}: " + ", ".join(f"{n} x {f}" for f, n in fmts.items())
        for role, fmts in formats_per_role.items()
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("releases", nargs="+", type=Path, help="bench/published/<release> folders")
    ap.add_argument("--out", type=Path, default=Path("/tmp/colitools-skeletons"), help="where skeletons go")
    ap.add_argument("--plan", action="store_true", help="convert --dry-run --json each skeleton, timed")
    ap.add_argument("--inspect", action="store_true", help="inspect --summary --json each skeleton")
    ap.add_argument(
        "--convert", action="store_true", help="convert each skeleton for real (writes its output)"
    )
    ap.add_argument("--json", action="store_true", help="one JSON object per release instead of text")
    args = ap.parse_args(argv)
    for release in args.releases:
        skel = args.out / release.name
        report = build(release, skel)
        if args.inspect:
            report["inspect"] = inspect_summary(skel)
        if args.plan:
            report["plan"] = plan(skel, args.out / f"{release.name}.dry")
        if args.convert:
            report["convert"] = convert(skel, args.out / f"{release.name}.converted")
        print(json.dumps(report) if args.json else "\n".join(_text(report)), flush=True)
    return 0


def _text(r: dict[str, Any]) -> list[str]:
    diff = (
        ""
        if r["difference"] is None
        else f" (published total_size {r['published_total_size']}: {r['difference']:+d})"
    )
    if r["shapes_checked"] is not None:
        diff += f"; {r['shapes_checked']} published shapes, {len(r['shapes_wrong'])} differ {r['shapes_wrong'][:3]}"
    lines = [f"{r['release']}: {r['tensors']} tensors in {r['shards']} shards, {r['bytes']} bytes{diff}"]
    p = r.get("plan")
    if p is not None and p["ok"]:
        lines.append(f"  plan: {p['units']} units, in {p['bytes_in']} out {p['bytes_out']} bytes, "
                     f"{p['seconds']:.2f} s wall, peak RSS {p['rss_kb'] / 1024:.0f} MB; {p['experts'].get('line') or ''}")  # fmt: skip
        lines += role_lines(p["formats_per_role"]) + [f"    warning: {w}" for w in p["warnings"]]
    elif p is not None:
        lines.append(f"  plan refused ({p['seconds']:.2f} s): {p['error']}")
    for key in ("inspect", "convert"):
        if key in r:
            lines.append(f"  {key}: {json.dumps(r[key])}")
    return lines


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    sys.exit(main())
