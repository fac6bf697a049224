"""``convert --quantizer mse`` end to end (FORMATS §11): the bytes are the reference encoder's on the source, the
recipe and the manifest say so, the runtime runs the output exactly as the same values stored as F32 (signed
scales included), a rtn folder is never resumed with mse, and every written tensor's error is recorded and
lower than rtn's."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from colitools.converters.manifest import Manifest
from colitools.converters.model_card import build_card
from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats import container
from colitools.formats.error_stats import REL_BOUND, ErrorStats
from colitools.formats.errors import ConvertError, ParameterError
from colitools.formats.registry import by_name
from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors
from colitools.runtime.generate import generate
from colitools.runtime.model import load_model
from tests.converters.convcheck import open_output, source_weight
from tests.runtime.containers import source_tensors

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "olmoe"
PROMPT = [3, 17, 101, 5, 250, 9]


def _convert(out: Path, quantizer: str, fixture: Path = FIXTURE, **options) -> None:
    convert(str(fixture), str(out), ConvertOptions(min_free_gb=0, progress=False, quantizer=quantizer, **options))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("quantizer")
    outs = {q: base / q for q in ("rtn", "mse")}
    for q, out in outs.items():
        _convert(out, q)
    return outs


def _decoded(out: Path) -> dict[str, np.ndarray]:
    """Every tensor of a converted folder as the float32 values a reader decodes (F32 kept as is)."""
    files = open_output(out)
    resolved = container.resolve_container(files, config=json.loads((out / "config.json").read_text()))
    by_file = {str(f.path): f for f in files}
    values = {}
    for name, r in resolved.items():
        f = by_file[r.file]
        if r.kind == "float":
            values[name] = f.read(name).astype(np.float32)
        elif r.kind == "quantized":
            O, I = r.logical_shape
            fmt = by_name(r.format.name)
            values[name] = fmt.decode(f.read(name), f.read(r.scale), O, I, r.format.group_size)
    for f in files:
        f.close()
    return values


def test_mse_bytes_are_the_reference_encoders_and_the_recipe_records_it(outputs):
    tensors = source_tensors(FIXTURE)
    files = open_output(outputs["mse"])
    resolved = container.resolve_container(files, config=json.loads((FIXTURE / "config.json").read_text()))
    by_file = {str(f.path): f for f in files}
    negative = 0
    for name, r in resolved.items():
        if r.kind != "quantized":
            continue
        fmt, gs = by_name(r.format.name), r.format.group_size
        want = fmt.encode(source_weight(tensors, name), gs, fast=False, quantizer="mse")
        f = by_file[r.file]
        assert f.read(name).tobytes() == want[0].tobytes(), name
        assert f.read(r.scale).tobytes() == np.asarray(want[1]).tobytes(), name
        negative += int((np.asarray(want[1]) < 0).sum())
    assert negative > 0  # the generic target with the pairs layout writes signed scales (FORMATS §11)
    manifest = json.loads((outputs["mse"] / "colitools.json").read_text())
    assert manifest["recipe"]["quantizer"] == "mse"
    rtn = json.loads((outputs["rtn"] / "colitools.json").read_text())
    assert "quantizer" not in rtn["recipe"]  # rtn's fingerprint is what it was before the option existed
    assert manifest["recipe_fingerprint"] != rtn["recipe_fingerprint"]


def test_the_runtime_runs_signed_scales_as_the_same_values_stored_f32(outputs, tmp_path):
    """The mse output against a container of exactly its decoded values as F32 tensors: the int4 / int8
    kernels with negative scales must give the float path's tokens and (to float rounding) its logits."""
    values = _decoded(outputs["mse"])
    f32 = tmp_path / "as-f32"
    f32.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (outputs["mse"] / name).exists():
            shutil.copy(outputs["mse"] / name, f32 / name)
    write_safetensors(f32 / "model.safetensors", values)
    with load_model(outputs["mse"], record_usage=False) as model:
        got = generate(model, PROMPT, 12)
        got_argmax, got_last = model.score(PROMPT + got.generated_ids)
    with load_model(f32, record_usage=False) as model:
        want = generate(model, PROMPT, 12)
        want_argmax, want_last = model.score(PROMPT + want.generated_ids)
    assert got.generated_ids == want.generated_ids
    assert got_argmax == want_argmax
    np.testing.assert_allclose(got_last, want_last, rtol=0, atol=1e-4)


def test_every_tensor_error_is_recorded_and_mse_loses_less_than_rtn(outputs):
    tensors = source_tensors(FIXTURE)
    recorded = {}
    for q, out in outputs.items():
        units = json.loads((out / "colitools.json").read_text())["units"]
        recorded[q] = {n: ErrorStats(*v) for u in units.values() for n, v in u.get("errors", {}).items()}
    values = _decoded(outputs["mse"])
    experts = [n for n in recorded["mse"] if ".experts." in n]
    assert experts and set(recorded["mse"]) == set(recorded["rtn"])
    for name in experts[:6]:  # the figures against an independent computation (float64 numpy)
        w = source_weight(tensors, name).astype(np.float64)
        d = values[name].astype(np.float64) - w
        e = recorded["mse"][name]
        assert e.n == w.size
        assert math.isclose(e.sse, float((d * d).sum()), rel_tol=REL_BOUND)  # float32 blocks (FORMATS §11)
        assert math.isclose(e.ssw, float((w * w).sum()), rel_tol=REL_BOUND)
        assert e.max_abs == pytest.approx(float(np.abs(d).max()), rel=2.0**-23)  # the float32 difference
        assert e.sse <= recorded["rtn"][name].sse  # never worse, group by group, so tensor by tensor
    total = {q: sum((recorded[q][n] for n in experts), ErrorStats()) for q in outputs}
    assert total["mse"].rel_error < 0.9 * total["rtn"].rel_error
    norm = next(n for n in recorded["mse"] if n.endswith("input_layernorm.weight"))
    assert recorded["mse"][norm].sse == 0.0 and recorded["mse"][norm].ssw > 0  # F32 from F32: lossless


def test_a_rtn_folder_is_not_resumed_with_mse(outputs, tmp_path):
    out = tmp_path / "mixed"
    shutil.copytree(outputs["rtn"], out)
    with pytest.raises(ConvertError, match="quantizer"):
        _convert(out, "mse")


def test_an_unknown_quantizer_is_a_usage_error():
    with pytest.raises(ParameterError, match="`quantizer='fancy'`"):
        ConvertOptions(quantizer="fancy").recipe()


@pytest.mark.parametrize(
    ("fixture", "target", "signed"),
    [("olmoe_target", "olmoe", True), ("qwen3_5_moe", "qwen36", False)],
)
def test_a_family_target_gets_signed_scales_only_where_its_engine_was_run_on_them(fixture, target, signed, tmp_path):
    """c/olmoe.c ran signed mse scales token-exact (docs/FORMATS.md §11); c/qwen36.c was not run on them, so
    --target qwen36 writes positive ones (mse-positive) while still choosing them by error."""
    out = tmp_path / target
    _convert(out, "mse", FIXTURE.parent / fixture, target=target)
    scales = []
    for path in sorted(out.glob("*.safetensors")):
        f = SafetensorsFile(path)
        scales += [f.read(name).reshape(-1) for name in f.tensors if name.endswith(".qs")]
        f.close()
    scales = np.concatenate(scales)
    assert scales.size > 0
    assert bool((scales < 0).any()) == signed
    assert json.loads((out / "colitools.json").read_text())["recipe"]["quantizer"] == "mse"


@pytest.mark.parametrize("quantizer", ["rtn", "mse"])
def test_the_model_card_names_the_quantizer(outputs, quantizer):
    out = outputs[quantizer]
    files = [(p.name, p.stat().st_size) for p in sorted(out.iterdir()) if p.is_file()]
    card = build_card(out, Manifest.load(out / "colitools.json"), "me/model", files, endpoint="https://hub.example")
    assert f"| quantizer | {quantizer} |" in card
    assert ("minimise the squared error" in card) == (quantizer == "mse")


def test_the_planar_sidecar_gets_positive_scales(tmp_path):
    """--layout planar is read by colibri's qwen38 planar loader, never run on negative scales: the recipe's
    encoder mode is mse-positive (one mode per recipe, the main container's tensors included)."""
    out = tmp_path / "planar"
    _convert(out, "mse", layout="planar")
    sidecar = sorted((out / "experts-int4g64").glob("layer-*.safetensors"))
    assert sidecar
    scales = []
    for path in sidecar:
        f = SafetensorsFile(path)
        scales += [f.read(name).reshape(-1) for name in f.tensors if name.endswith(".qs")]
        f.close()
    scales = np.concatenate(scales)
    assert scales.size > 0 and (scales > 0).all()
