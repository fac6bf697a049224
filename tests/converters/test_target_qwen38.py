"""``--target qwen38``: the main container c/qwen38.c reads plus the ``experts-int4g64/`` sidecar, checked against
the loader's own rules, restated here from colibri's ``c/qwen38_core.h`` (read, not run: the engine is not built
here) rather than from the converter:

* ``q38_load_cfg``: ``text_config.model_type`` ``qwen4_exp_text``, ``output_gate_type`` ``sigmoid`` given,
  ``layer_types`` entries ``linear_attention`` / ``full_attention`` / ``qwen_sparse_attention`` only, an integer
  ``eos_token_id``, one ``ple_layer_ids`` entry;
* ``q38_load_weight``: every resident matrix (embedding, head, gated residuals, router, shared expert, attention,
  indexer, DeltaNet, PLE projections) rank 2 of the config's shape and BF16 / F16 / F32 (no codes);
  ``q38_load_tensor``: norms, conv kernels, ``dt_bias``, ``A_log``, ``shared_expert_gate`` float;
* ``q38_load_ple``: the three hash buffers I64 of ``ngram_size`` / ``ngram_heads`` entries, the table as
  ``split_ngram_parts`` row shards ``shard_{p}.weight`` ``[rows, ple_embed_dim / ngram_heads]`` float;
* ``q38_expert_int4_attach``: ``index.json`` format / version / codes / scales / geometry, every expert one record
  of its six tensors (U8 codes, F32 ``.qs``) back to back; the main container holds no routed expert.

Both Qwen3.8 fixtures: ``qwen38`` (BF16) and ``qwen38_fp8`` (the routed experts FP8 with 128x128 BF16 block
scales, as published). From the FP8 source the sidecar holds what colibri's ``c/tools/convert_qwen38_experts_int4.py``
writes, restated here: its dequantization (``E4M3_LUT[byte] * f32(weight_scale_inv[r // 128, c // 128])``) and its
quantizer (per 64 inputs ``scale = max(absmax, 1e-12) / 7``, ``code = rint(w / scale)`` clamped to [-8, 7], stored
``v + 8``, planar: byte k of a 64-block holds element k low, element k + 32 high).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import TargetRefused
from colitools.formats.safetensors_io import SafetensorsFile

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
FIXTURE = ORACLES / "qwen38"
SOURCES = ("qwen38", "qwen38_fp8")  # BF16; the routed experts FP8 as published
FLOAT = ("BF16", "F16", "F32")
P = "model.language_model."
_CONVERTED: dict[str, Path] = {}


def converted(name: str, factory) -> Path:
    """``--target qwen38`` of fixture ``name``, converted once per module."""
    if name not in _CONVERTED:
        o = factory.mktemp(name) / "out"
        convert(str(ORACLES / name), o, ConvertOptions(target="qwen38"))
        _CONVERTED[name] = o
    return _CONVERTED[name]


@pytest.fixture(scope="module", params=SOURCES)
def out(request, tmp_path_factory):
    return converted(request.param, tmp_path_factory)


def headers(folder: Path, pattern: str) -> dict[str, tuple[str, tuple[int, ...], int, str]]:
    """name -> (dtype, shape, data offset, file) of every tensor in ``folder``'s ``pattern`` files."""
    res = {}
    for f in sorted(folder.glob(pattern)):
        st = SafetensorsFile(f)
        for name, info in st.tensors.items():
            res[name] = (info.dtype, tuple(info.shape), info.begin, f.name)
        st.close()
    return res


def test_config_is_what_q38_load_cfg_accepts(out):
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert text["model_type"] == "qwen4_exp_text" and text["output_gate_type"] == "sigmoid"
    assert text["layer_types"] == [
        "linear_attention",
        "full_attention",
    ]  # transformers saved indexed_attention
    assert isinstance(text["eos_token_id"], int) and len(text["ple_layer_ids"]) == 1
    assert text["hidden_act"] == "silu" and text["tie_word_embeddings"] is False


def test_resident_matrices_are_float_of_the_config_shapes(out):
    cfg = json.loads((out / "config.json").read_text())["text_config"]
    H, hc, r, V = cfg["hidden_size"], cfg["hc_count"], cfg["hc_lowrank"], cfg["vocab_size"]
    W, E, I = hc * H, cfg["num_experts"], cfg["shared_expert_intermediate_size"]
    t = headers(out, "model-*.safetensors")
    want = {f"{P}embed_tokens.weight": (V, H), "lm_head.weight": (V, H),
            f"{P}hyper_connection_mixer.input_mix_weight_down.weight": (r, W),
            f"{P}hyper_connection_mixer.input_mix_weight_up.weight": (W, r)}  # fmt: skip
    for L in (0, 1):
        p = f"{P}layers.{L}."
        for kind in ("attn", "mlp"):
            want[f"{p}{kind}_hyper_connection.input_mix_weight_down.weight"] = (r, W)
            want[f"{p}{kind}_hyper_connection.input_mix_weight_up.weight"] = (W, r)
            want[f"{p}{kind}_hyper_connection.block_inject_weight.weight"] = (hc, W)
        want[f"{p}mlp.gate.weight"] = (E, H)
        want.update({f"{p}mlp.shared_expert.{k}_proj.weight": (I, H) for k in ("gate", "up")})
        want[f"{p}mlp.shared_expert.down_proj.weight"] = (H, I)
    want[f"{P}layers.0.linear_attn.in_proj_qkv.weight"] = (128, H)
    want[f"{P}layers.0.ple.key_proj.weight"] = (W, cfg["ple_embed_dim"])
    want[f"{P}layers.1.self_attn.q_proj.weight"] = (2 * cfg["num_attention_heads"] * cfg["head_dim"], H)
    want[f"{P}layers.1.self_attn.indexer.index_qk_proj.weight"] = (3 * cfg["indexer_head_dim"], H)
    for name, shape in want.items():
        dtype, got, _, _ = t[name]
        assert dtype in FLOAT and got == shape, (name, dtype, got)
    # nothing a loader of floats cannot read, but the hash buffers
    for name, (dtype, *_) in t.items():
        assert dtype in FLOAT or (dtype == "I64" and ".ple_embedding." in name), (name, dtype)
        assert ".experts." not in name  # routed experts: the sidecar's


def test_ple_buffers_and_table_shards_are_what_q38_load_ple_reads(out):
    cfg = json.loads((out / "config.json").read_text())["text_config"]
    heads = (cfg["ngram_size"] - 1) * cfg["heads_per_ngram"]
    t = headers(out, "model-*.safetensors")
    p = f"{P}layers.0.ple.ple_embedding."
    assert t[p + "layer_multipliers"][:2] == ("I64", (cfg["ngram_size"],))
    for b in ("ngram_heads_vocab_sizes", "ngram_heads_offsets"):
        assert t[p + b][:2] == ("I64", (heads,))
    for k in range(cfg["split_ngram_parts"]):
        dtype, shape, _, _ = t[f"{p}ngram_embedding.shard_{k}.weight"]
        assert dtype in FLOAT and shape == (76, cfg["ple_embed_dim"] // heads)


def test_sidecar_is_what_q38_expert_int4_attach_accepts(out):
    cfg = json.loads((out / "config.json").read_text())["text_config"]
    H, I, E = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    index = json.loads((out / "experts-int4g64" / "index.json").read_text())
    assert (index["format"], index["version"], index["codes"], index["scales"], index["group_size"]) == (
        "colibri.qwen38.experts-int4g64", 1, "planar64-v8", "f32-per-64", 64)  # fmt: skip
    assert (index["layers"], index["experts"], index["hidden_size"], index["moe_intermediate_size"]) == (
        2, E, H, I)  # fmt: skip
    assert index["complete"] is True
    sizes = {"gate": (I, H), "up": (I, H), "down": (H, I)}
    record = sum(o * (i // 2) + o * (i // 64) * 4 for o, i in sizes.values())
    assert index["record_bytes"] == record
    t = headers(out / "experts-int4g64", "*.safetensors")
    for L in range(2):
        for e in range(E):
            at = None
            for part in ("weight", "weight.qs"):
                for k, (o, i) in sizes.items():
                    dtype, shape, begin, _ = t[f"{P}layers.{L}.mlp.experts.{e}.{k}_proj.{part}"]
                    qs = part.endswith("qs")
                    assert (dtype, shape) == (("F32", (o, i // 64)) if qs else ("U8", (o, i // 2)))
                    assert at is None or begin == at  # one record, back to back, in record order
                    at = begin + o * (i // 64 * 4 if qs else i // 2)


def test_pairs_layout_is_refused_in_one_line(tmp_path):
    with pytest.raises(TargetRefused, match="layout=pairs` is refused: c/qwen38.c reads int4 routed experts"):
        convert(str(FIXTURE), tmp_path / "o", ConvertOptions(target="qwen38", layout="pairs"))


def e4m3_values(b: np.ndarray) -> np.ndarray:
    """The test's own e4m3fn decode by bits: bias 7, subnormals at exponent 0, 0x7F / 0xFF NaN."""
    e, m = (b >> 3) & 0xF, (b & 7).astype(np.float64)
    v = np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * np.exp2(e.astype(np.float64) - 7))
    v = np.where((e == 0xF) & (m == 7), np.nan, v)
    return np.where(b & 0x80, -v, v).astype(np.float32)


def colibri_int4_g64(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """convert_qwen38_experts_int4.py's quantize_g64 + pack_planar (widths a multiple of 64 here)."""
    O, I = w.shape
    g = w.reshape(O, I // 64, 64)
    scales = np.maximum(np.abs(g).max(axis=2, keepdims=True), np.float32(1e-12)) / np.float32(7.0)
    codes = (np.clip(np.rint(g / scales), -8, 7).astype(np.int16) + 8).astype(np.uint8)
    planar = codes[:, :, :32] | (codes[:, :, 32:] << 4)
    return planar.reshape(O, I // 2), scales.reshape(O, I // 64)


def test_sidecar_from_fp8_experts_is_what_colibris_converter_writes(tmp_path_factory):
    """The FP8 source's sidecar: every expert's codes and scales are colibri's int4-g64 of its FP8 values,
    byte for byte (the converter's own writer never consulted)."""
    out = converted("qwen38_fp8", tmp_path_factory)
    src, side = {}, {}
    for f in sorted((ORACLES / "qwen38_fp8").glob("*.safetensors")):
        st = SafetensorsFile(f)
        src.update({n: st.read(n) for n in st.tensors if ".mlp.experts." in n})
        st.close()
    for f in sorted((out / "experts-int4g64").glob("*.safetensors")):
        st = SafetensorsFile(f)
        side.update({n: st.read(n) for n in st.tensors})
        st.close()
    experts = [n for n in src if n.endswith("_proj.weight")]
    assert len(experts) == 2 * 4 * 3 and set(side) == {x for n in experts for x in (n, n + ".qs")}
    for name in experts:
        codes = np.asarray(src[name]).view(np.uint8)
        O, I = codes.shape
        s = np.asarray(src[name + "_scale_inv"]).view(ml_dtypes.bfloat16).astype(np.float32)
        w = e4m3_values(codes) * np.repeat(np.repeat(s, 128, axis=0)[:O], 128, axis=1)[:, :I]
        want_codes, want_scales = colibri_int4_g64(w)
        assert side[name].tobytes() == want_codes.tobytes(), name
        assert side[name + ".qs"].tobytes() == want_scales.astype("<f4").tobytes(), name
