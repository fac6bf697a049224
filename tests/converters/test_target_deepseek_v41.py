"""``--target deepseek_v41``: the container colibri's ``c/deepseek_v41.c`` reads, checked against the loader's own
rules, restated here from its source (JustVugg/colibri a4306c8; CI has no colibri: bench/colibri_compat.py runs the
engine itself on the oracle fixture's container, docs/FORMATS.md §4) rather than from the converter:

* ``cfg_load``: ``config.json``'s ``text_config`` (or a flat config) with ``compress_ratios`` for every layer;
* ``model_load`` per layer and ``spec_load`` per DSpark stage: ``w8_load`` (``<b>.weight`` of ``O*I`` bytes and
  ``<b>.scale`` of ``ceil(O/32)*ceil(I/32)`` bytes, e4m3 codes with one UE8M0 byte per 32x32 tile, read raw),
  ``wb_load`` (``O*I*2`` raw bytes read as BF16), ``wf_load`` (``st_read_f32``: F32 / BF16 / F16 of ``n`` values);
* ``expert_read``: ``{layers|mtp}.{L}.ffn.experts.{E}.w{1,3,2}.weight`` of ``inter*dim/2`` (``dim*inter/2``) bytes
  and ``.scale`` of ``inter*(dim/32)`` (``dim*(inter/32)``) bytes, raw (FP4 e2m1 pairs + UE8M0 per 32 inputs);
* ``engram_load_sidecar`` / ``engram_table_open`` / ``engram_row``: ``dsv41_engram.json`` beside ``config.json``
  (absent: engram silently off), ``layers.{L}.engram.embed.weight`` ``rows*head_dim`` bytes and ``.scale``
  ``rows*head_dim/32`` bytes (one UE8M0 byte per 32 inputs of a row).

The source is ``oracles/make_dsv41_tiny.py`` (the published layout); its ``dsv41_engram.json`` is built here the
way colibri's ``c/tools/make_dsv41_tiny.py`` ``engram_layout`` builds it (primes, offsets, numpy PCG64
multipliers as decimal strings, a token map).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import TargetRefused
from colitools.formats.safetensors_io import SafetensorsFile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "oracles"))
import make_dsv41_tiny as tiny  # noqa: E402

FLOAT = ("F32", "BF16", "F16")  # st_read_f32 widens these
ENGRAM_FILE = "dsv41_engram.json"


def engram_sidecar(c: dict) -> dict:
    """``dsv41_engram.json`` by colibri's ``engram_layout`` rules: per table the first unused primes above
    ``engram_vocab_size - 1`` (one per n-gram order and head), offsets their running sum, multipliers
    ``2 * default_rng(10007 * layer).integers(0, int64max // compressed // 2) + 1`` as decimal strings."""
    seen, primes, offsets = set(), [], []
    for _ in c["engram_layer_ids"]:
        rows = []
        for _ in range(c["engram_max_ngram_size"] - 1):
            row, k = [], c["engram_vocab_size"] - 1
            for _ in range(c["engram_n_heads"]):
                k += 1
                while k in seen or any(k % d == 0 for d in range(2, int(k**0.5) + 1)):
                    k += 1
                seen.add(k)
                row.append(k)
            rows.append(row)
        flat = [p for row in rows for p in row]
        primes.append(rows)
        offsets.append([int(x) for x in np.cumsum([0, *flat[:-1]])])
    compressed = 64
    mult = []
    for layer in c["engram_layer_ids"]:
        high = max(1, (np.iinfo(np.int64).max // compressed) // 2)
        values = np.random.default_rng(10007 * layer).integers(0, high, c["engram_max_ngram_size"], dtype=np.int64)
        mult.append([str(int(v) * 2 + 1) for v in values])
    return {
        "max_ngram_size": c["engram_max_ngram_size"], "n_heads": c["engram_n_heads"],
        "head_dim": c["engram_head_dim"], "pad_id": c["engram_pad_id"] % compressed,
        "layer_ids": c["engram_layer_ids"], "num_embeddings": tiny.engram_rows(c), "primes": primes,
        "offsets": offsets, "multipliers": mult, "token_map": [i % compressed for i in range(c["vocab_size"])],
    }  # fmt: skip


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("v41") / "src"
    tensors = tiny.write(src)
    (src / ENGRAM_FILE).write_text(json.dumps(engram_sidecar(tiny.config_text())))
    return src, tensors


@pytest.fixture(scope="module")
def out(source, tmp_path_factory):
    o = tmp_path_factory.mktemp("v41") / "out"
    convert(str(source[0]), o, ConvertOptions(target="deepseek_v41"))
    return o


def stored(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, raw bytes) of every tensor of the container."""
    res = {}
    for f in sorted(folder.glob("*.safetensors")):
        st = SafetensorsFile(f)
        for name, info in st.tensors.items():
            res[name] = (info.dtype, tuple(info.shape), st.read_bytes(name))
        st.close()
    return res


def text_config(out: Path) -> dict:
    cfg = json.loads((out / "config.json").read_text())
    return cfg.get("text_config", cfg)


# -------------------------------------------------------------------- what model_load / spec_load look up
def loader_plan(c: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor c/deepseek_v41.c reads, by its loader call: ``("w8", (O, I))``, ``("wb", (O, I))``,
    ``("wf", (n,))``, ``("fp4", (O, I))``, ``("engram", (rows, head_dim))``, from the config as ``cfg_load`` reads
    it (short names)."""
    dim, hd, nh, hc, og = c["dim"], c["head_dim"], c["n_heads"], c["hc_mult"], c["o_groups"]
    ql, ol, inter, mix = c["q_lora_rank"], c["o_lora_rank"], c["moe_inter_dim"], (2 + c["hc_mult"]) * c["hc_mult"]
    plan: dict[str, tuple[str, tuple[int, ...]]] = {
        "embed.weight": ("wb", (c["vocab_size"], dim)), "head.weight": ("wb", (c["vocab_size"], dim)),
        "norm.weight": ("wf", (dim,)),
    }  # fmt: skip

    def block(p: str, experts: int) -> None:  # what model_load and spec_load share
        plan.update({
            p + "attn.wq_a.weight": ("w8", (ql, dim)), p + "attn.wq_b.weight": ("w8", (nh * hd, ql)),
            p + "attn.wkv.weight": ("w8", (hd, dim)), p + "attn.wo_a.weight": ("w8", (og * ol, nh * hd // og)),
            p + "attn.wo_b.weight": ("w8", (dim, og * ol)), p + "attn.q_norm.weight": ("wf", (ql,)),
            p + "attn.kv_norm.weight": ("wf", (hd,)), p + "attn.attn_sink": ("wf", (nh,)),
            p + "attn_norm.weight": ("wf", (dim,)), p + "ffn_norm.weight": ("wf", (dim,)),
            p + "hc_attn_fn": ("wf", (mix * hc * dim,)), p + "hc_ffn_fn": ("wf", (mix * hc * dim,)),
            p + "hc_attn_base": ("wf", (mix,)), p + "hc_ffn_base": ("wf", (mix,)),
            p + "hc_attn_scale": ("wf", (3,)), p + "hc_ffn_scale": ("wf", (3,)),
            p + "ffn.gate.weight": ("wb", (experts, dim)), p + "ffn.gate.bias": ("wf", (experts,)),
            p + "ffn.shared_experts.w1.weight": ("w8", (inter, dim)),
            p + "ffn.shared_experts.w3.weight": ("w8", (inter, dim)),
            p + "ffn.shared_experts.w2.weight": ("w8", (dim, inter)),
        })  # fmt: skip
        for e in range(experts):
            for w, shape in (("w1", (inter, dim)), ("w3", (inter, dim)), ("w2", (dim, inter))):
                plan[f"{p}ffn.experts.{e}.{w}.weight"] = ("fp4", shape)

    for L in range(c["n_layers"]):
        p = f"layers.{L}."
        block(p, c["n_routed_experts"])
        if L in c["kv_source_layers"]:
            plan[p + "attn.compressor.wkv.weight"] = ("wb", (hd, dim))
            plan[p + "attn.compressor.norm.weight"] = ("wf", (hd,))
            if c["compress_ratios"][L] > 1:
                plan[p + "attn.compressor.wgate.weight"] = ("wb", (hd, dim))
            plan[p + "attn.indexer.wk.weight"] = ("wb", (c["index_head_dim"], hd))
            plan[p + "attn.indexer.k_norm.weight"] = ("wf", (c["index_head_dim"],))
        if L in c["index_source_layers"]:
            plan[p + "attn.indexer.wq_b.weight"] = ("w8", (c["index_n_heads"] * c["index_head_dim"], ql))
            plan[p + "attn.indexer.weights_proj.weight"] = ("wb", (c["index_n_heads"], dim))
        if L in c["engram_layer_ids"]:
            rows = tiny.engram_rows(c)[c["engram_layer_ids"].index(L)]
            cols = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"]
            plan[p + "engram.embed.weight"] = ("engram", (rows, c["engram_head_dim"]))
            plan[p + "engram.wkv.weight"] = ("w8", (dim * (hc + 1), cols * c["engram_head_dim"]))
            plan[p + "engram.q_weight"] = ("wf", (hc * dim,))
            plan[p + "engram.k_weight"] = ("wf", (hc * dim,))
    last, rank = c["n_mtp_layers"] - 1, c["dspark_markov_rank"]
    for s in range(c["n_mtp_layers"]):
        block(f"mtp.{s}.", c["dspark_n_routed_experts"])
    plan.update({
        "mtp.0.main_proj.weight": ("w8", (dim, dim * len(c["dspark_target_layer_ids"]))),
        "mtp.0.main_norm.weight": ("wf", (dim,)), f"mtp.{last}.norm.weight": ("wf", (dim,)),
        f"mtp.{last}.markov_head.embed.weight": ("wb", (c["vocab_size"], rank)),
        f"mtp.{last}.markov_head.head.weight": ("wb", (c["vocab_size"], rank)),
        f"mtp.{last}.confidence_head.proj.weight": ("wb", (1, dim + rank)),
    })  # fmt: skip
    return plan


def _check_read(kind: str, shape: tuple[int, ...], name: str, t: dict) -> None:
    """One loader call against the stored tensors (``t``: name -> (dtype, shape, bytes))."""
    assert name in t, f"{name}: missing (the engine exits)"
    dtype, _, raw = t[name]
    ceil32 = lambda n: -(-n // 32)  # noqa: E731
    if kind == "wf":
        assert dtype in FLOAT and len(raw) == shape[0] * np.dtype(ml_dtypes.bfloat16 if dtype != "F32" else "f4").itemsize
    elif kind == "wb":  # raw bytes read as BF16: the dtype must be BF16, the count exact
        assert dtype == "BF16" and len(raw) == shape[0] * shape[1] * 2, name
    elif kind in ("w8", "engram"):
        O, I = shape
        scale = t[name[: -len(".weight")] + ".scale"]
        want_scale = ceil32(O) * ceil32(I) if kind == "w8" else O * ceil32(I)
        assert dtype == "F8_E4M3" and len(raw) == O * I and len(scale[2]) == want_scale, name
    else:  # fp4: expert_read, raw
        O, I = shape
        scale = t[name[: -len(".weight")] + ".scale"]
        assert len(raw) == O * I // 2 and len(scale[2]) == O * (I // 32), name


def test_every_tensor_the_loader_reads_is_there_in_its_form(out):
    c, t = text_config(out), stored(out)
    plan = loader_plan(c)
    for name, (kind, shape) in plan.items():
        _check_read(kind, shape, name, t)
    quantized = {n for n, (dtype, _, _) in t.items() if dtype in ("F8_E4M3", "I8")}
    assert quantized and quantized <= set(plan)  # and every FP8 / FP4 tensor written is one the loader reads


def test_fp8_and_fp4_bytes_are_the_sources(out, source):
    """The copy formats keep the published bytes: the FP8 tiles and row groups (codes and UE8M0 bytes) and the FP4
    experts (e2m1 pairs and UE8M0 bytes), byte for byte."""
    src, t = source[1], stored(out)
    kept = 0
    for name, array in src.items():
        if array.dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu, np.int8):
            assert t[name][2] == np.ascontiguousarray(array).tobytes(), name
            assert t[name][0] == {np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(np.int8): "I8"}.get(
                array.dtype, "F8_E8M0"
            )
            kept += 1
    assert kept > 200


def test_w8_decodes_as_mv8_multiplies(out, source):
    """``mv8``: row ``o``, input ``i`` -> ``e4m3(code) * 2^(tile[(o/32)*tiles_i + i/32] - 127)``, restated; against
    the float the source's quantizer started from (within e4m3's rounding)."""
    t, name = stored(out), "layers.0.attn.wq_b.weight"
    O, I = t[name][1]
    codes = np.frombuffer(t[name][2], ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(O, I)
    tiles = np.frombuffer(t["layers.0.attn.wq_b.scale"][2], np.uint8)
    k = np.array([[tiles[(o // 32) * (-(-I // 32)) + i // 32] for i in range(I)] for o in range(O)], np.int32)
    w = codes * np.ldexp(np.float32(1), k - 127)
    src = source[1]
    want = src[name].astype(np.float32) * np.repeat(
        np.repeat(np.ldexp(np.float32(1), src["layers.0.attn.wq_b.scale"].view(np.uint8).astype(np.int32) - 127), 32, 0),
        32,
        1,
    )
    assert np.array_equal(w, want[:O, :I]) and np.abs(w).max() > 0


def test_config_and_engram_sidecar(out, source):
    c = text_config(out)
    assert len(c["compress_ratios"]) >= c["n_layers"]  # cfg_load exits otherwise
    assert (out / ENGRAM_FILE).read_bytes() == (source[0] / ENGRAM_FILE).read_bytes()
    side = json.loads((out / ENGRAM_FILE).read_text())
    assert side["layer_ids"] == c["engram_layer_ids"]
    assert all(isinstance(m, str) for row in side["multipliers"] for m in row)  # never rounded through a double
    t = stored(out)
    for L, rows in zip(c["engram_layer_ids"], tiny.engram_rows(c), strict=True):
        assert len(t[f"layers.{L}.engram.embed.weight"][2]) // c["engram_head_dim"] == rows  # engram_table_open


# -------------------------------------------------------------------------------- refused before any work
def _refused(src: Path, tmp_path: Path, **options) -> str:
    out = tmp_path / "out"
    with pytest.raises(TargetRefused) as exc:
        convert(str(src), out, ConvertOptions(target="deepseek_v41", **options))
    assert not any(out.glob("*.safetensors")) if out.exists() else True
    msg = str(exc.value)
    assert "\n" not in msg and "deepseek_v41" in msg
    return msg


def test_no_engram_sidecar_is_refused(source, tmp_path):
    src = tmp_path / "src"
    tiny.write(src)  # the published layout ships no dsv41_engram.json
    assert "dsv41_engram.json" in _refused(src, tmp_path) and "engram off" in _refused(src, tmp_path)


def test_a_sidecar_that_disagrees_or_rounds_its_multipliers_is_refused(source, tmp_path):
    src = tmp_path / "src"
    tiny.write(src)
    side = engram_sidecar(tiny.config_text())
    (src / ENGRAM_FILE).write_text(json.dumps({**side, "head_dim": 64}))
    assert "head_dim 64" in _refused(src, tmp_path)
    side["multipliers"] = [[int(m) for m in row] for row in side["multipliers"]]
    (src / ENGRAM_FILE).write_text(json.dumps(side))
    assert "decimal strings" in _refused(src, tmp_path)


def test_too_few_compress_ratios_is_refused(tmp_path):
    src = tmp_path / "src"
    c = tiny.config_text()
    tiny.write(src)
    cfg = tiny.config(c)
    cfg["text_config"]["compress_ratios"] = [0, 2]
    (src / "config.json").write_text(json.dumps(cfg))
    (src / ENGRAM_FILE).write_text(json.dumps(engram_sidecar(c)))
    assert "compress_ratios has 2 entries for 4 layers" in _refused(src, tmp_path)


@pytest.mark.parametrize(("option", "value"), [("dense", "int8-row"), ("mtp", "fp8-e8m0-t32"), ("embed", "f32")])
def test_options_the_engine_cannot_read_are_refused(source, tmp_path, option, value):
    msg = _refused(source[0], tmp_path, **{option: value})
    assert f"`{option}={value}`" in msg


def test_colitools_readers_read_it(out):
    """inspect / verify read the copy formats by their pairs: the FP8 tiles as fp8-e4m3-e8m0-t32, the engram tables
    as -r32, the experts as mxfp4 (resolver.resolve_fp8_e8m0 by the scale's shape)."""
    from colitools.formats.container import resolve_container
    from colitools.verify.container import verify_container

    assert verify_container(out).problems == []
    files = [SafetensorsFile(f) for f in sorted(out.glob("*.safetensors"))]
    try:
        got = {n: r.format.name for n, r in resolve_container(files).items() if r.format is not None}
    finally:
        for f in files:
            f.close()
    assert got["layers.1.engram.embed.weight"] == "fp8-e4m3-e8m0-r32"
    assert got["layers.0.attn.wq_a.weight"] == got["mtp.0.main_proj.weight"] == "fp8-e4m3-e8m0-t32"
    assert got["layers.0.ffn.experts.0.w1.weight"] == got["mtp.1.ffn.experts.1.w2.weight"] == "mxfp4"
