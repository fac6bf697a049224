"""Issue 29 (DeepSeek V4.1 Flash half): the published layout converts with every recipe and ``--experts native``.

The source is ``oracles/make_dsv41_tiny.py`` (numpy, the names / dtypes / shapes of colibri's
``c/tools/make_dsv41_tiny.py``): FP8 e4m3 dense projections with one UE8M0 byte per 32x32 tile, FP4 routed experts
(I8 pairs + one UE8M0 byte per 32 inputs), FP8 engram tables with row-group scales, BF16 / F32 the rest, a vision
tower and DSpark ``mtp.`` stages. The expected format of every output tensor comes from ``expected_format`` below,
written from docs/FORMATS.md §5 and the V4.1 section (names and regular expressions), not from the converter; the
expected values are this file's own decode of the source bytes (the E2M1 table, ml_dtypes' e4m3, ``2^(e-127)``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from convcheck import stored_arrays, stored_tensors
from test_new_families import read_output

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError, FormatError
from colitools.formats import container
from colitools.formats.registry import writer_group_size
from colitools.formats.safetensors_io import write_safetensors
from colitools.verify.container import verify_container

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracles"))
import make_dsv41_tiny as tiny  # noqa: E402

RECIPES = {  # oracles/oracle_recipes.py's, and native
    "f32": {"experts": "f32", "dense": "f32", "embed": "f32"},
    "default": {},
    "int3": {"experts": "int3-g64"},
    "mxfp4": {"experts": "mxfp4"},
    "planar": {"layout": "planar"},
    "native": {"experts": "native"},
}
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)

# ------------------------------------------------------------------ the spec's table, written independently
TOWER = re.compile(r"^(vision|aligner)\.")
F32_RULE = re.compile(r"\.ffn\.gate\.(weight|bias)$|(\.|^)hc_|attn_sink$|engram\.[qk]_weight$")
EMBED = re.compile(r"^(embed|head)\.weight$")
ROUTED = re.compile(r"\.experts\.\d+\.")


def expected_format(name: str, dtype: str, shape: tuple[int, ...], recipe: str) -> str:
    """Format of output tensor ``name`` under ``recipe`` (docs/FORMATS.md §5, first matching row)."""
    opts = {
        "experts": "int4-g64",
        "dense": "int8-row",
        "embed": "int8-row",
        "mtp": "int8-row",
        **RECIPES[recipe],
    }
    if TOWER.match(name):
        return f"{dtype} (copied)"  # row 1, keep
    if len(shape) != 2 or F32_RULE.search(name):
        return "f32"  # row 2
    if name.startswith("mtp."):
        option = opts["mtp"]  # row 3: the DSpark stages, their FP4 experts too
    elif EMBED.match(name):
        option = opts["embed"]
    elif ROUTED.search(name):
        option = "mxfp4" if opts["experts"] == "native" else opts["experts"]  # FP4 UE8M0 = mxfp4's bytes
    else:
        option = opts["dense"]  # engram tables and wkv, attention, shared experts, compressor, indexer
    if option.startswith("int4-g"):
        gs = writer_group_size(shape[1], int(option[len("int4-g") :]))
        return "int4-row" if gs is None else f"int4-g{gs}"
    return option


# ------------------------------------------------------------------------- this file's own decoders
def e8m0(scale: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, np.asarray(scale).view(np.uint8).astype(np.int64) - 127)


def fp8_tiles(codes: np.ndarray, scale: np.ndarray, rows: int, cols: int) -> np.ndarray:
    s = np.repeat(np.repeat(e8m0(scale), rows, axis=0), cols, axis=1)
    return (codes.astype(np.float64) * s[: codes.shape[0], : codes.shape[1]]).astype(np.float32)


def fp4_pairs(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    b = np.asarray(packed).view(np.uint8)
    nib = np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)
    return (E2M1[nib] * np.repeat(e8m0(scale), 32, axis=1)).astype(np.float32)


# ------------------------------------------------------------------------------------------ conversions
@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsv41") / "src"
    return folder, tiny.write(folder)


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory):
    folder, _ = source
    root = tmp_path_factory.mktemp("dsv41-out")
    return {
        r: (root / r, convert(str(folder), root / r, ConvertOptions(progress=False, **o)))
        for r, o in RECIPES.items()
    }


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_tensor_gets_the_format_the_table_gives(source, converted, recipe):
    import colitools.converters.planner as planner_mod
    from colitools.converters.inventory import HeaderTensor, build_inventory
    from colitools.converters.recipe import Recipe

    folder, tensors = source
    out, summary = converted[recipe]
    assert summary.fallbacks == []
    assert verify_container(out).problems == []
    header = {"model.safetensors": {n: HeaderTensor(_dtype(t), t.shape) for n, t in tensors.items()}}
    config = json.loads((folder / "config.json").read_text())
    inv = build_inventory(header, dict.fromkeys(tensors, "model.safetensors"), config)
    plan = planner_mod.plan_conversion(inv, Recipe.from_options(**RECIPES[recipe]))
    jobs = [j for u in plan.units for j in u.jobs]
    got = {j.out_name: f"{j.source.dtype} (copied)" if j.target.is_source else j.target.label for j in jobs}
    want = {j.out_name: expected_format(j.out_name, j.source.dtype, j.shape, recipe) for j in jobs}
    assert got == want
    # every weight of the source is there once, under its own name (no scale converted on its own)
    assert set(got) == {n for n in tensors if not n.endswith(".scale")}
    formats, _ = read_output(out)  # (which reads any unquantized float tensor as "f32")
    stored = stored_tensors(out)
    for n, f in formats.items():
        if f != "?":
            copied = want[n].endswith("(copied)")
            assert f == ("f32" if copied else want[n]), n
            assert stored[n][0] == (want[n].split()[0] if copied else "F32"), n


def _dtype(t: np.ndarray) -> str:
    return {"float32": "F32", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e8m0fnu": "F8_E8M0",
            "int8": "I8", "uint8": "U8"}[t.dtype.name]  # fmt: skip


def test_f32_holds_the_decoded_values(source, converted):
    _, src = source
    got = stored_arrays(converted["f32"][0])
    wq = "layers.1.attn.wq_b"  # FP8, 32x32 tiles: [128, 64] -> 4 x 2 scale bytes
    assert src[wq + ".scale"].shape == (4, 2)
    assert np.array_equal(got[wq + ".weight"], fp8_tiles(src[wq + ".weight"], src[wq + ".scale"], 32, 32))
    table = "layers.2.engram.embed"  # FP8, row groups of 32
    assert src[table + ".scale"].shape == (src[table + ".weight"].shape[0], 1)
    assert np.array_equal(
        got[table + ".weight"], fp8_tiles(src[table + ".weight"], src[table + ".scale"], 1, 32)
    )
    e = "layers.3.ffn.experts.2.w2"  # FP4 pairs [64, 32] -> [64, 64]
    assert np.array_equal(got[e + ".weight"], fp4_pairs(src[e + ".weight"], src[e + ".scale"]))
    assert not (set(got) & {n for n in src if n.endswith(".scale")})


def test_native_keeps_the_fp4_experts_bytes(source, converted):
    _, src = source
    out = stored_tensors(converted["native"][0])
    for e in ("layers.0.ffn.experts.0.w1", "layers.2.ffn.experts.3.w2"):
        codes, scales = out[e + ".weight_packed"][2], out[e + ".weight_scale"][2]  # mxfp4 (§2.7)
        assert codes.tobytes() == src[e + ".weight"].tobytes()
        assert scales.tobytes() == src[e + ".scale"].tobytes()


def test_the_config_geometry_is_the_v4_attention_and_moe(source):
    """``config_shapes`` (what a reader of a container without logical shapes uses) from the text model's keys."""
    folder, tensors = source
    config = json.loads((folder / "config.json").read_text())
    shapes = container.config_shapes(config, tensors)
    c = tiny.config_text()
    H, nh, hd, q, og, ol = (
        c[k] for k in ("dim", "n_heads", "head_dim", "q_lora_rank", "o_groups", "o_lora_rank")
    )
    want = {"attn.wq_a": (q, H), "attn.wq_b": (nh * hd, q), "attn.wkv": (hd, H), "attn.wo_a": (og * ol, nh * hd // og),
            "attn.wo_b": (H, og * ol), "attn.indexer.wq_b": (c["index_n_heads"] * c["index_head_dim"], q),
            "ffn.gate": (c["n_routed_experts"], H), "ffn.shared_experts.w2": (H, c["moe_inter_dim"]),
            "ffn.experts.3.w1": (c["moe_inter_dim"], H)}  # fmt: skip
    for leaf, dims in want.items():
        assert shapes[f"layers.2.{leaf}.weight"] == dims, leaf
    assert shapes["embed.weight"] == shapes["head.weight"] == (c["vocab_size"], H)
    assert not {n for n in shapes if n.startswith(("vision.", "aligner.")) or ".engram." in n}


def test_a_wrong_expert_width_is_refused(source, tmp_path):
    folder, _ = source
    bad = tmp_path / "src"
    bad.mkdir()
    (bad / "model.safetensors").symlink_to(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["moe_intermediate_size"] = 32
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match=r"experts\.0\.w1\.weight.*\[64, 64\]"):
        convert(str(bad), tmp_path / "out", ConvertOptions(progress=False, dry_run=True))


def test_a_scale_that_fits_no_grid_is_refused_naming_both(source, tmp_path):
    _, tensors = source
    broken = dict(tensors)
    broken["layers.0.attn.wkv.scale"] = tensors["layers.0.attn.wkv.scale"][:, :1]
    bad = tmp_path / "src"
    bad.mkdir()
    write_safetensors(bad / "model.safetensors", broken)
    (bad / "config.json").write_text(json.dumps(tiny.config()))
    with pytest.raises(FormatError, match=r"layers\.0\.attn\.wkv\.scale.*layers\.0\.attn\.wkv\.weight"):
        convert(str(bad), tmp_path / "out", ConvertOptions(progress=False, dry_run=True))


def test_an_fp4_scale_that_does_not_fit_is_one_line_exit_1(source, tmp_path):
    """Through the command line: ``colitools: error:`` in one line naming both tensors, exit 1, nothing written."""
    _, tensors = source
    broken = dict(tensors)
    e = "layers.0.ffn.experts.1.w3"
    broken[e + ".scale"] = tensors[e + ".scale"][:, :1]
    (tmp_path / "src").mkdir()
    write_safetensors(tmp_path / "src" / "model.safetensors", broken)
    (tmp_path / "src" / "config.json").write_text(json.dumps(tiny.config()))
    argv = [sys.executable, "-m", "colitools", "convert", str(tmp_path / "src"), str(tmp_path / "out")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"colitools: error: tensor {e}.scale: FP4 UE8M0 scale F8_E8M0 [64, 1] does not fit "
        f"{e}.weight [64, 32] (expected U8 or F8_E8M0 [64, 2])"
    ]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.safetensors"))
