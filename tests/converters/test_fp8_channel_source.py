"""Issue 25: compressed-tensors ``float-quantized`` FP8 (one scale per output channel), as Meta's
Llama-4-Maverick-17B-128E-Instruct-FP8 ships its routed experts (per expert, ``[O, I]`` F8_E4M3 +
``.weight_scale`` BF16 ``[O, 1]``), shared expert and dense feed-forward layers (docs/FORMATS.md §5).

The fixture ``tests/converters/data/llama4_fp8`` was quantized by compressed-tensors' own compressor
(``oracles/make_llama4_fp8.py``); ``reference/dequant.safetensors`` is compressed-tensors' own dequantization of
every FP8 weight. The decode rule is pinned on hand-computed bytes too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats import source_encodings as se
from colitools.formats.errors import ColitoolsError, FormatError
from colitools.formats.inspect import inspect_path
from colitools.formats.safetensors_io import SafetensorsFile

FIXTURE = Path(__file__).resolve().parent / "data" / "llama4_fp8"
F32 = ConvertOptions(experts="f32", dense="f32", embed="f32")


def output_tensors(out: Path) -> dict[str, np.ndarray]:
    tensors = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        with SafetensorsFile(shard) as f:
            tensors.update({n: np.array(f.read(n)) for n in f.tensors})
    return tensors


def test_the_decode_rule_on_hand_computed_bytes():
    """e4m3 0x38 = 1.0, 0xB8 = -1.0, 0x40 = 2.0, 0x01 = 2^-9 (the least subnormal); BF16 scales 0.5 and 3.0 (per
    row) or 0.25 (per tensor): one float32 multiply each."""
    codes = np.array([[0x38, 0xB8, 0x40], [0x01, 0x40, 0x38]], np.uint8)
    rows = np.array([[0.5], [3.0]], ml_dtypes.bfloat16)
    want = np.array([[0.5, -0.5, 1.0], [3.0 * 2.0**-9, 6.0, 3.0]], np.float32)
    got = se.Fp8Channel.decode({"data": codes.view(ml_dtypes.float8_e4m3fn), "scale": rows}, 2, 3)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    tensor = np.array([0.25], np.float32)
    assert np.array_equal(
        se.Fp8Channel.decode({"data": codes, "scale": tensor}, 2, 3), want / np.array([[2.0], [12.0]])
    )


def test_every_weight_decodes_to_compressed_tensors_dequantization(tmp_path):
    convert(str(FIXTURE), tmp_path / "o", F32)
    out = output_tensors(tmp_path / "o")
    want = load_file(str(FIXTURE / "reference" / "dequant.safetensors"))
    experts = [n for n in want if ".feed_forward.experts." in n]
    assert len(want) == 18 and len(experts) == 12  # 4 experts x 3, the shared expert, layer 0's dense MLP
    for name, w in want.items():
        assert out[name].dtype == np.float32 and np.array_equal(out[name], w), name
        assert name.removesuffix("weight") + "weight_scale" not in out


def test_inspect_names_the_source_encoding():
    report = inspect_path(FIXTURE)
    assert report.source_encodings["routed experts"] == {
        "compressed-tensors fp8 per channel": {"tensors": 12, "bytes": 50688}
    }


def test_the_default_recipe_says_it_quantizes_a_second_time(tmp_path):
    summary = convert(str(FIXTURE), tmp_path / "o", ConvertOptions())
    (line,) = summary.warnings
    assert (
        "12 FP8 channel tensors as int4-row" in line
        and "no registered format holds FP8 channel exactly" in line
    )
    manifest = json.loads((tmp_path / "o" / "colitools.json").read_text())
    assert (
        manifest["experts_choice"]["sources"] == ["FP8 channel"] and manifest["experts_choice"]["kept"] == []
    )


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "src", ignore=shutil.ignore_patterns("reference"))
    return tmp_path / "src"


def test_a_scale_that_does_not_fit_is_refused_naming_it(tmp_path):
    src = _copy(tmp_path)
    f = SafetensorsFile(src / "model.safetensors")
    name = "language_model.model.layers.1.feed_forward.experts.0.gate_proj.weight_scale"
    header = {n: (t.dtype, list(t.shape)) for n, t in f.tensors.items()}
    f.close()
    assert header[name] == ("BF16", [64, 1])
    raw = (src / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    text = raw[8 : 8 + n].decode()
    at = text.index(f'"{name}"')
    patched = text[:at] + text[at:].replace('"shape":[64,1]', '"shape":[1,64]', 1)
    assert len(patched) == len(text)
    (src / "model.safetensors").write_bytes(raw[:8] + patched.encode() + raw[8 + n :])
    with pytest.raises(FormatError) as exc:
        convert(str(src), tmp_path / "o", ConvertOptions())
    assert name in str(exc.value) and "[1, 64]" in str(exc.value) and "\n" not in str(exc.value)


def test_a_block_scaled_float_quantized_config_is_refused_in_one_line(tmp_path):
    src = _copy(tmp_path)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "block"
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ColitoolsError) as exc:
        convert(str(src), tmp_path / "o", ConvertOptions())
    assert "strategy 'block' are not supported" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").glob("*.safetensors"))


def test_transformers_fbgemm_fp8_is_refused_in_one_line_naming_it(tmp_path):
    """transformers' own ``FbgemmFp8Config`` (``quant_method: fbgemm_fp8``; for Llama-4 its
    ``FbgemmFp8Llama4TextExperts`` stacks ``gate_up_proj`` F8 ``[E, H, 2I]`` + ``gate_up_proj_scale [E, 1, 2I]``) is not
    how the release ships and no source encoding declares it: refused before any work, exit 1, one line."""
    src = _copy(tmp_path)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                     "modules_to_not_convert": ["language_model.lm_head"]}  # fmt: skip
    (src / "config.json").write_text(json.dumps(config))
    exe = str(Path(sys.executable).parent / "colitools")
    proc = subprocess.run([exe, "convert", str(src), str(tmp_path / "o"), "--min-free-gb", "0"], capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "quant_method 'fbgemm_fp8' is not supported" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def _float_copy_from_reference(tmp_path: Path) -> Path:
    """The fixture with every FP8 weight replaced by compressed-tensors' own dequantization (F32) and its scales and
    quantization_config dropped: a float checkpoint of the same values, made without colitools' decoder."""
    src = tmp_path / "float"
    src.mkdir()
    want = load_file(str(FIXTURE / "reference" / "dequant.safetensors"))
    with SafetensorsFile(FIXTURE / "model.safetensors") as f:
        tensors = {n: np.array(f.read(n)) for n in f.tensors}
    for name, w in want.items():
        tensors[name] = w
        tensors.pop(name.removesuffix("weight") + "weight_scale")
        tensors.pop(name.removesuffix("weight") + "input_scale", None)
    from safetensors.numpy import save_file

    save_file({n: np.ascontiguousarray(t) for n, t in tensors.items()}, str(src / "model.safetensors"))
    config = json.loads((FIXTURE / "config.json").read_text())
    config.pop("quantization_config")
    (src / "config.json").write_text(json.dumps(config))
    return src


def test_run_reads_the_source_as_its_float_copy(tmp_path):
    """``colitools run`` on the unconverted source (F8_E4M3 + BF16 ``weight_scale [O, 1]``: not MXFP8's E8M0 bytes)
    gives the logits of the float checkpoint built from compressed-tensors' own dequantization, bit for bit."""
    from colitools.runtime.generate import score
    from colitools.runtime.model import load_model

    ids = [1, 5, 9, 2, 7, 3]
    runs = []
    for path in (FIXTURE, _float_copy_from_reference(tmp_path)):
        model = load_model(path, cap=4, record_usage=False)
        try:
            runs.append(score(model, ids))
        finally:
            model.close()
    (tokens, logits), (want_tokens, want_logits) = runs
    assert tokens == want_tokens and np.array_equal(logits, want_logits)


def test_run_refuses_a_float_scale_of_another_shape_in_one_line(tmp_path):
    from colitools.formats.errors import RuntimeModelError
    from colitools.runtime.model import load_model

    src = _copy(tmp_path)
    name = "language_model.model.layers.1.feed_forward.experts.0.gate_proj.weight_scale"
    with SafetensorsFile(src / "model.safetensors") as f:
        tensors = {n: np.array(f.read(n)) for n in f.tensors}
    tensors[name] = np.ascontiguousarray(np.repeat(tensors[name], 2, axis=1))  # [64, 2]: neither a row nor a tensor
    from safetensors.numpy import save_file

    save_file(tensors, str(src / "model.safetensors"))
    with pytest.raises((RuntimeModelError, ColitoolsError)) as exc:
        model = load_model(src, cap=4, record_usage=False)
        try:
            model.forward([1, 2, 3])
        finally:
            model.close()
    msg = str(exc.value)  # the runtime names tensors by their canonical spelling (model.layers..., mlp.experts)
    assert "layers.1.mlp.experts.0.gate_proj.weight_scale" in msg and "[64, 2]" in msg and "\n" not in msg
