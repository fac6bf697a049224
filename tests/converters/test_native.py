"""Natively quantized sources end to end (docs/FORMATS.md §9, §6): MXFP4 (gpt-oss blocks), INT4 compressed-tensors
``pack-quantized``, NVFP4 (modelopt) and MXFP8 checkpoints generated here by the test's own packing code from
random codes and scales, converted with ``native`` and with the default recipe.

Expected values are the test's own decode of the codes it drew (float64 products of the E2M1 / e4m3 tables and
powers of two, exact, then float32), never colitools' decoders; a ``native`` tensor must decode element for
element to exactly those values, and its bytes must be the source's bytes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from convcheck import check_output, open_output
from tinyckpt import write_tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConfigError, ConvertError, FormatError
from colitools.formats import container
from colitools.formats.registry import by_name

F32, BF16, E4M3 = np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)
H, INTER, E, V = 64, 32, 2, 96


def e4m3_f64(b: np.ndarray) -> np.ndarray:
    return np.asarray(b, np.uint8).view(E4M3).astype(np.float64)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Codes 0..15 ``[..., I]`` (I even) -> bytes, low nibble = even element."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def pack_int32(codes: np.ndarray) -> np.ndarray:
    """Codes 0..15 ``[O, I]`` -> int32 ``[O, ceil(I/8)]``, element k at bits 4k (compressed-tensors order)."""
    O, I = codes.shape
    pad = np.zeros((O, -(-I // 8) * 8), np.uint32)
    pad[:, :I] = codes
    words = np.zeros((O, pad.shape[1] // 8), np.uint32)
    for k in range(8):
        words |= pad[:, k::8] << np.uint32(4 * k)
    return words.view(np.int32)


def base_tensors(rng, layers: int = 1) -> dict[str, np.ndarray]:
    """The float part of a tiny MoE checkpoint (embeddings, attention, norms, router)."""
    t = {
        "model.embed_tokens.weight": (rng.standard_normal((V, H)) * 0.05).astype(BF16),
        "lm_head.weight": (rng.standard_normal((V, H)) * 0.05).astype(BF16),
        "model.norm.weight": np.ones(H, BF16),
    }
    for L in range(layers):
        p = f"model.layers.{L}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[f"{p}.self_attn.{proj}.weight"] = (rng.standard_normal((H, H)) * 0.05).astype(BF16)
        t[f"{p}.mlp.gate.weight"] = (rng.standard_normal((E, H)) * 0.05).astype(BF16)
        t[f"{p}.input_layernorm.weight"] = np.ones(H, BF16)
        t[f"{p}.post_attention_layernorm.weight"] = np.ones(H, BF16)
    return t


def config(model_type: str, qc: dict | None, inter: int = INTER) -> dict:
    cfg = {"model_type": model_type, "hidden_size": H, "vocab_size": V, "num_hidden_layers": 1,
           "num_experts": E, "moe_intermediate_size": inter, "num_experts_per_tok": 1}  # fmt: skip
    if qc is not None:
        cfg["quantization_config"] = qc
    return cfg


def save(folder: Path, tensors: dict, cfg: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_tensors(folder, tensors, 1)
    (folder / "config.json").write_text(json.dumps(cfg))


# ------------------------------------------------------------------------------------------- fixtures
def make_mxfp4(folder: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """qwen3_moe-like checkpoint whose fused experts are gpt-oss MXFP4 blocks ``[E, O, I/32, 16]`` (gate rows
    first, the qwen3 stack convention); edge blocks: an all-zero block, negative-zero codes, extreme exponents.
    Returns the float32 value of every logical tensor (the float ones upcast, the MXFP4 ones decoded here)."""
    rng = np.random.default_rng(seed)
    tensors = base_tensors(rng)
    values = {n: a.astype(F32) for n, a in tensors.items()}
    for kind, (O, I) in (("gate_up_proj", (2 * INTER, H)), ("down_proj", (H, INTER))):
        codes = rng.integers(0, 16, (E, O, I), dtype=np.uint8)
        scales = rng.integers(115, 135, (E, O, I // 32), dtype=np.uint8)
        codes[0, 0, :32] = 0  # a zero block with scale byte 0
        scales[0, 0, 0] = 0
        codes[0, 1, :32] = 8  # negative-zero codes
        scales[1, 0, -1] = 254  # 2^127 with small codes stays finite
        codes[1, 0, -32:] = rng.integers(0, 3, 32)
        scales[1, 1, 0] = 1  # 2^-126
        base = f"model.layers.0.mlp.experts.{kind}"
        tensors[base + "_blocks"] = pack_nibbles(codes).reshape(E, O, I // 32, 16)
        tensors[base + "_scales"] = scales
        val = E2M1[codes] * np.exp2(np.repeat(scales.astype(np.float64) - 127, 32, axis=2))
        values[base] = val.astype(F32)  # exact: every product is a float32 (normal or subnormal)
    save(folder, tensors, config("qwen3_moe", {"quant_method": "mxfp4"}))
    return values


def make_int4(folder: Path, g: int = 32, inter: int = INTER, symmetric: bool = True, seed: int = 1):
    """deepseek_v3/Kimi-like checkpoint whose routed experts are compressed-tensors pack-quantized INT4 with
    BF16 scales per ``g`` inputs (``weight_packed`` I32, ``weight_scale``, ``weight_shape``)."""
    rng = np.random.default_rng(seed)
    tensors = base_tensors(rng)
    values = {n: a.astype(F32) for n, a in tensors.items()}
    for e in range(E):
        for proj, (O, I) in (("gate_proj", (inter, H)), ("up_proj", (inter, H)), ("down_proj", (H, inter))):
            base = f"model.layers.0.mlp.experts.{e}.{proj}"
            codes = rng.integers(0, 16, (O, I), dtype=np.uint8)  # q + 8
            G = -(-I // g)
            scale = (rng.random((O, G)) * 0.01 + 1e-4).astype(BF16)
            tensors[base + ".weight_packed"] = pack_int32(codes)
            tensors[base + ".weight_scale"] = scale
            tensors[base + ".weight_shape"] = np.array([O, I], np.int64)
            q = codes.astype(np.float64) - 8
            if not symmetric:
                zc = rng.integers(6, 11, (O, G), dtype=np.uint8)
                tensors[base + ".weight_zero_point"] = pack_int32(zc.T).T.copy()  # packed along the rows
                q = q - np.repeat(zc.astype(np.float64) - 8, g, axis=1)[:, :I]
            s = np.repeat(scale.astype(np.float64), g, axis=1)[:, :I]
            values[base + ".weight"] = (q * s).astype(F32)  # q * bf16 scale is exact in float32
    group = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": symmetric,
                                                "strategy": "group", "group_size": g}}  # fmt: skip
    qc = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": group},
    }
    save(folder, tensors, config("deepseek_v3", qc, inter))
    return values


def make_nvfp4(folder: Path, seed: int = 2):
    rng = np.random.default_rng(seed)
    tensors = base_tensors(rng)
    values = {n: a.astype(F32) for n, a in tensors.items()}
    for e in range(E):
        for proj, (O, I) in (("gate_proj", (INTER, H)), ("up_proj", (INTER, H)), ("down_proj", (H, INTER))):
            name = f"model.layers.0.mlp.experts.{e}.{proj}.weight"
            codes = rng.integers(0, 16, (O, I), dtype=np.uint8)
            sb = rng.integers(0x30, 0x50, (O, I // 16), dtype=np.uint8)  # positive finite e4m3
            s2 = F32(rng.random() * 0.01 + 1e-3)
            tensors[name] = pack_nibbles(codes)
            tensors[name + "_scale"] = sb.view(E4M3)
            tensors[name + "_scale_2"] = np.array(s2, F32)
            tensors[name[: -len(".weight")] + ".input_scale"] = np.array(1.0, F32)
            prod = (E2M1[codes] * np.repeat(e4m3_f64(sb), 16, axis=1)).astype(F32)  # exact (<= 7 bits)
            values[name] = prod * s2  # the second float32 product rounds, as the spec's left-to-right rule
    save(folder, tensors, config("deepseek_v3", {"quant_method": "modelopt", "quant_algo": "NVFP4"}))
    return values


def make_mxfp8(folder: Path, seed: int = 3):
    rng = np.random.default_rng(seed)
    tensors = base_tensors(rng)
    values = {n: a.astype(F32) for n, a in tensors.items()}
    for e in range(E):
        for proj, (O, I) in (("gate_proj", (INTER, H)), ("up_proj", (INTER, H)), ("down_proj", (H, INTER))):
            name = f"model.layers.0.mlp.experts.{e}.{proj}.weight"
            q = rng.integers(0, 256, (O, I), dtype=np.uint8)
            q[(q & 0x7F) == 0x7F] = 0  # no NaN bytes
            sb = rng.integers(120, 134, (O, I // 32), dtype=np.uint8)
            tensors[name] = q.view(E4M3)
            tensors[name + "_scale"] = sb
            val = e4m3_f64(q) * np.exp2(np.repeat(sb.astype(np.float64) - 127, 32, axis=1))
            values[name] = val.astype(F32)
    save(folder, tensors, config("deepseek_v3", {"quant_method": "mxfp8"}))
    return values


# --------------------------------------------------------------------------------------------- checks
def expert_values(values: dict, out_name: str) -> np.ndarray:
    """The decoded source value of output expert tensor ``out_name`` (fused stacks sliced, gate rows first)."""
    if out_name in values:
        return values[out_name]
    base = out_name[: out_name.index(".experts.") + len(".experts")]
    e, proj = int(out_name.split(".")[-3]), out_name.split(".")[-2]
    if proj == "down_proj":
        return values[base + ".down_proj"][e]
    gu = values[base + ".gate_up_proj"][e]
    return gu[: gu.shape[0] // 2] if proj == "gate_proj" else gu[gu.shape[0] // 2 :]


def decoded_output(out: Path) -> dict[str, tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """logical weight name -> (format label, decoded float32, weight bytes, scale bytes), by the resolver."""
    files = open_output(out)
    resolved = container.resolve_container(files, config=json.loads((out / "config.json").read_text()))
    by_file = {f.path.name: f for f in files}
    got = {}
    for name, r in resolved.items():
        if r.kind != "quantized":
            continue
        f = by_file[Path(r.file).name]
        O, I = r.logical_shape
        codes, scales = f.read(name), f.read(r.scale)
        w = by_name(r.format.name).decode(codes, scales, O, I, r.format.group_size)
        logical = name[: -len(".weight_packed")] + ".weight" if name.endswith(".weight_packed") else name
        got[logical] = (r.format.label, w, codes, scales)
    for f in files:
        f.close()
    return got


def assert_lossless(out: Path, values: dict, want_label, n: int = 3 * E) -> dict:
    """Every expert tensor is ``want_label`` (or ``want_label(I)``) and decodes bit for bit to the source."""
    got = decoded_output(out)
    experts = {k: v for k, v in got.items() if ".experts." in k}
    assert len(experts) == n
    for name, (label, w, _, _) in experts.items():
        want = want_label(w.shape[1]) if callable(want_label) else want_label
        assert label == want, (name, label)
        assert w.tobytes() == expert_values(values, name).tobytes(), name  # bit for bit
    return experts


# ---------------------------------------------------------------------------------------------- tests
def test_mxfp4_native_copies_nibbles_and_e8m0_bytes(tmp_path):
    values = make_mxfp4(tmp_path / "src")
    summary = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="native"))
    experts = assert_lossless(tmp_path / "out", values, "mxfp4")
    assert summary.fallbacks == []
    from colitools.formats.safetensors_io import SafetensorsFile

    src = SafetensorsFile(tmp_path / "src/model.safetensors")
    blocks = src.read("model.layers.0.mlp.experts.down_proj_blocks")
    _, _, codes, scales = experts["model.layers.0.mlp.experts.1.down_proj.weight"]
    assert codes.tobytes() == blocks[1].tobytes()  # byte for byte
    assert scales.tobytes() == src.read("model.layers.0.mlp.experts.down_proj_scales")[1].tobytes()
    src.close()
    cfg = json.loads((tmp_path / "out/config.json").read_text())
    assert "quantization_config" not in cfg


def test_mxfp4_int4_g64_recipe_encodes_the_decoded_values(tmp_path):
    values = make_mxfp4(tmp_path / "src")  # (the default keeps MXFP4 experts: test_native_default.py)
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="int4-g64"))
    # I = 64 and 32 <= 64: the default int4-g64 is written as int4-row (§2.4)
    fmts = {f"model.layers.0.mlp.experts.{e}.{p}.weight": "int4-row"
            for e in range(E) for p in ("gate_proj", "up_proj", "down_proj")}  # fmt: skip
    logical = dict(values)
    check_output(tmp_path / "out", logical, fmts)


@pytest.mark.parametrize("g", [32, 16])
def test_int4_native_keeps_codes_and_widened_scales(tmp_path, g):
    values = make_int4(tmp_path / "src", g=g)
    summary = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="native"))
    experts = assert_lossless(tmp_path / "out", values, lambda I: "int4-row" if I <= g else f"int4-g{g}")
    assert summary.fallbacks == []
    from colitools.formats.safetensors_io import SafetensorsFile

    src = SafetensorsFile(tmp_path / "src/model.safetensors")
    name = "model.layers.0.mlp.experts.0.down_proj"
    _, _, codes, scales = experts[name + ".weight"]
    assert codes.tobytes() == src.read(name + ".weight_packed").tobytes()  # the int32 LE bytes are pairs
    assert scales.tobytes() == src.read(name + ".weight_scale").astype(F32).tobytes()
    src.close()
    # the manifest names every native tensor's format
    manifest = json.loads((tmp_path / "out/colitools.json").read_text())
    assert manifest["source_quantization_config"]["format"] == "pack-quantized"


def test_int4_native_row_and_group_fallbacks(tmp_path):
    # I = 64 <= g = 128: int4-row (one scale per row, same values); down_proj I = 32 <= 128 too
    values = make_int4(tmp_path / "a", g=128)
    convert(str(tmp_path / "a"), tmp_path / "oa", ConvertOptions(experts="native"))
    assert_lossless(tmp_path / "oa", values, "int4-row")
    # inter 96 with g = 64: gs 64 at I = 96 resolves as 48 -> int8-row, a recorded fallback (decoded)
    make_int4(tmp_path / "b", g=64, inter=96)
    s = convert(str(tmp_path / "b"), tmp_path / "ob", ConvertOptions(experts="native"))
    downs = [f for f in s.fallbacks if f["tensor"].endswith("down_proj.weight")]
    assert len(downs) == E and all(f["written"] == "int8-row" and f["requested"] == "native" for f in downs)
    got = decoded_output(tmp_path / "ob")
    assert got["model.layers.0.mlp.experts.0.gate_proj.weight"][0] == "int4-row"  # I = 64 <= g = 64


def test_asymmetric_int4_native_is_decoded_and_said_so(tmp_path, caplog):
    values = make_int4(tmp_path / "src", g=32, symmetric=False)
    with caplog.at_level(logging.WARNING, logger="colitools"):  # the CLI prints it as a warning line
        s = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="native"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("native:")]
    assert len(lines) == 1 and "asymmetric or act-order INT4" in lines[0], caplog.text
    assert len(s.fallbacks) == 3 * E and all(f["written"] == "int4-row" for f in s.fallbacks)
    fmts = {n: "int4-row" for n in values if ".experts." in n}  # the default int4-g64 at I <= 64
    check_output(tmp_path / "out", values, fmts)  # the default encoding of the exact decoded values


@pytest.mark.parametrize("make", [make_nvfp4, make_mxfp8])
def test_nvfp4_and_mxfp8_are_decoded(tmp_path, make):
    values = make(tmp_path / "src")
    s = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="native", dense="native"))
    assert len(s.fallbacks) == 3 * E
    fmts = {n: "int4-row" for n in values if ".experts." in n}  # the default int4-g64 at I <= 64
    check_output(tmp_path / "out", values, fmts)
    names = {n for f in open_output(tmp_path / "out") for n in f.tensors}
    assert not any("input_scale" in n or n.endswith("_scale_2") for n in names)
    # f32: the decoded values themselves
    convert(str(tmp_path / "src"), tmp_path / "o32", ConvertOptions(experts="f32"))
    check_output(tmp_path / "o32", values, {n: "f32" for n in fmts})


def test_unknown_quant_method_is_refused_before_work(tmp_path):
    make_mxfp4(tmp_path / "src")
    cfg = json.loads((tmp_path / "src/config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (tmp_path / "src/config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"quant_method 'awq' is not supported") as exc:
        convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="native"))
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_companion_without_weight_is_refused(tmp_path):
    make_mxfp4(tmp_path / "src")
    from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors

    f = SafetensorsFile(tmp_path / "src/model.safetensors")
    t = {n: f.read(n) for n in f.tensors if not n.endswith("down_proj_blocks")}
    f.close()
    write_safetensors(tmp_path / "src/model.safetensors", t)
    with pytest.raises(FormatError, match="down_proj_scales: companion without its weight"):
        convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dry_run=True))


# ------------------------------------------------------------------- the producer-made INT4 checkpoint
PRODUCER_INT4 = Path(__file__).resolve().parents[2] / "oracles/quant_vectors/int4_pack_quantized"


def test_compressed_tensors_checkpoint_native_is_lossless(tmp_path):
    """``oracles/quant_vectors/int4_pack_quantized``: experts compressed by compressed-tensors itself (bfloat16
    scales); ``expect.safetensors`` its own decompression (bfloat16). Native keeps codes and scales; every
    decoded element, rounded to the producer's bfloat16, is the producer's value."""
    from colitools.formats.safetensors_io import SafetensorsFile

    s = convert(str(PRODUCER_INT4), tmp_path / "out", ConvertOptions(experts="native"))
    assert s.fallbacks == []
    f = SafetensorsFile(PRODUCER_INT4 / "expect.safetensors")
    expect = {n: f.read(n) for n in f.tensors}
    f.close()
    got = decoded_output(tmp_path / "out")
    assert {k for k in got if ".experts." in k} == set(expect) and len(expect) == 6
    for name, theirs in expect.items():
        label, w, _, _ = got[name]
        assert label == ("int4-row" if w.shape[1] <= 32 else "int4-g32"), (name, label)
        assert np.array_equal(w.astype(BF16).view(np.uint16), theirs.view(np.uint16)), name


# ------------------------------------------------------------------- gpt-oss's own MXFP4 stack layout
def make_gpt_oss_mxfp4(folder: Path, seed: int = 5) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A gpt-oss checkpoint as openai/gpt-oss-* ship it (transformers 5.24 ``Mxfp4GptOssExperts``):
    ``mlp.experts.gate_up_proj_blocks [E, 2I, H/32, 16]`` whose even rows are gate, odd rows up;
    ``down_proj_blocks [E, H, I/32, 16]``; E8M0 ``_scales`` per row and 32 inputs; BF16 stack biases
    ``gate_up_proj_bias [E, 2I]`` (interleaved the same way) and ``down_proj_bias [E, H]``; router
    ``mlp.router``. Returns (per-expert output name -> the test's own decode of its rows, the raw source)."""
    rng = np.random.default_rng(seed)
    tensors = base_tensors(rng)
    del tensors["model.layers.0.mlp.gate.weight"]
    tensors["model.layers.0.mlp.router.weight"] = (rng.standard_normal((E, H)) * 0.05).astype(BF16)
    tensors["model.layers.0.mlp.router.bias"] = (rng.standard_normal(E) * 0.05).astype(BF16)
    p = "model.layers.0.mlp.experts"
    want: dict[str, np.ndarray] = {}
    for kind, (O, I) in (("gate_up_proj", (2 * INTER, H)), ("down_proj", (H, INTER))):
        codes = rng.integers(0, 16, (E, O, I), dtype=np.uint8)
        scales = rng.integers(118, 134, (E, O, I // 32), dtype=np.uint8)
        scales[1, 3, 0] = 0  # 2^-127: subnormal products
        tensors[f"{p}.{kind}_blocks"] = pack_nibbles(codes).reshape(E, O, I // 32, 16)
        tensors[f"{p}.{kind}_scales"] = scales
        val = (E2M1[codes] * np.exp2(np.repeat(scales.astype(np.float64) - 127, 32, axis=2))).astype(F32)
        bias = (rng.standard_normal((E, O)) * 0.1).astype(BF16)
        tensors[f"{p}.{kind}_bias"] = bias
        for e in range(E):
            if kind == "gate_up_proj":
                for k, proj in enumerate(("gate_proj", "up_proj")):
                    want[f"{p}.{e}.{proj}.weight"] = val[e, k::2]
                    want[f"{p}.{e}.{proj}.bias"] = bias[e, k::2].astype(F32)
            else:
                want[f"{p}.{e}.down_proj.weight"] = val[e]
                want[f"{p}.{e}.down_proj.bias"] = bias[e].astype(F32)
    cfg = {"model_type": "gpt_oss", "hidden_size": H, "vocab_size": V, "num_hidden_layers": 1,
           "num_local_experts": E, "intermediate_size": INTER, "num_experts_per_tok": 1,
           "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
               "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}  # fmt: skip
    save(folder, tensors, cfg)
    return want, tensors


def test_gpt_oss_mxfp4_native_splits_interleaved_rows_losslessly(tmp_path):
    want, src = make_gpt_oss_mxfp4(tmp_path / "src")
    summary = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="native"))
    assert summary.fallbacks == []
    got = decoded_output(tmp_path / "out")
    p = "model.layers.0.mlp.experts"
    weights = {k for k in want if k.endswith(".weight")}
    assert {k for k in got if ".experts." in k} == weights and len(weights) == 3 * E
    for name in weights:
        label, w, codes, scales = got[name]
        assert label == "mxfp4", (name, label)
        assert w.tobytes() == want[name].tobytes(), name  # bit for bit
    # the bytes are the source's rows: gate = even rows of gate_up_proj_blocks, up = odd rows
    blocks, sc = src[f"{p}.gate_up_proj_blocks"], src[f"{p}.gate_up_proj_scales"]
    for e in range(E):
        for k, proj in enumerate(("gate_proj", "up_proj")):
            _, _, codes, scales = got[f"{p}.{e}.{proj}.weight"]
            assert codes.tobytes() == blocks[e, k::2].tobytes() and scales.tobytes() == sc[e, k::2].tobytes()
    _, values = open_output_values(tmp_path / "out")
    for name in (k for k in want if k.endswith(".bias")):
        assert values[name].dtype == F32 and np.array_equal(values[name], want[name]), name


def open_output_values(out: Path) -> tuple[dict, dict[str, np.ndarray]]:
    files = open_output(out)
    values = {n: f.read(n) for f in files for n in f.tensors}
    for f in files:
        f.close()
    return files, values


@pytest.mark.parametrize("experts", ["f32", "int4-g64", "mxfp4", "int3-g64"])
def test_gpt_oss_mxfp4_other_recipes_decode_the_same_rows(tmp_path, experts):
    want, src = make_gpt_oss_mxfp4(tmp_path / "src")
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts=experts))
    label = {"int4-g64": "int4-row"}.get(experts, experts)  # I <= 64: int4-g64 is int4-row (§2.4)
    stored = ".weight_packed" if experts == "mxfp4" else ".weight"  # mxfp4's own spelling (§2.7)
    fmts = {n.removesuffix(".weight") + stored: label for n in want if n.endswith(".weight")}
    floats = {n: a.astype(F32) for n, a in src.items() if ".experts." not in n}
    check_output(tmp_path / "out", {**floats, **want}, fmts)  # the recipe's encoding of the decoded rows


def test_mxfp4_stack_of_a_transposed_family_without_a_native_orientation_is_refused(tmp_path, monkeypatch):
    import dataclasses

    from colitools.formats import families

    make_gpt_oss_mxfp4(tmp_path / "src")
    no_native = dataclasses.replace(families.GPT_OSS, native_orientation={})
    monkeypatch.setattr(families, "MODEL_TYPES", {**families.MODEL_TYPES, "gpt_oss": no_native})
    with pytest.raises(ConvertError, match=r"experts\.down_proj: a natively quantized \(mxfp4\) expert stack, but "
                                           r"the family 'gpt_oss' does not fix how the rows of its mxfp4 stacks") as exc:
        convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dry_run=True))
    assert "\n" not in str(exc.value)
