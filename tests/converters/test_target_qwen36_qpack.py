"""``convert --target qwen36 --layout qpack``: the routed experts as MLX-affine codes in a QPACK v1 container
(formats/qpack.py, docs/FORMATS.md §2.12 and §4) beside the snapshot colibri's qwen36 engine reads
(``SNAP=<out> QWEN36_QPACK=<out>``).

The container's bytes are checked against the codec and container rules applied directly to the source weights
(formats/affine.py and formats/qpack.py, whose byte rules tests/formats/test_affine.py and test_qpack.py pin by
hand); the runtime is checked against the same model with every weight in f32 and the routed experts replaced
by the values the container decodes to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ColitoolsError
from colitools.formats import qpack
from colitools.verify.kld import F32_RECIPE

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
FIXTURE = ORACLES / "qwen3_5_moe"
PREFIX = "model.language_model.layers"


def _convert(dest: Path, **kw) -> Path:
    convert(str(FIXTURE), dest, ConvertOptions(progress=False, min_free_gb=0.0, **kw))
    return dest


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-qwen36-qpack")
    return {
        "rtn": _convert(root / "rtn", target="qwen36", layout="qpack"),
        "mse": _convert(
            root / "mse", target="qwen36", layout="qpack", quantizer="mse", experts="affine4-g32"
        ),
        "q8": _convert(root / "q8", target="qwen36", layout="qpack", experts="affine8-g64"),
    }


@pytest.fixture(scope="module")
def source():
    return load_file(FIXTURE / "model.safetensors")


def _text():
    return json.loads((FIXTURE / "config.json").read_text())["text_config"]


@pytest.mark.parametrize(("folder", "bits", "gs", "quantizer"), [("rtn", 4, 64, "rtn"), ("mse", 4, 32, "mse"),
                                                                  ("q8", 8, 64, "rtn")])  # fmt: skip
def test_the_container_is_the_codec_applied_to_the_source(
    outputs, source, tmp_path, folder, bits, gs, quantizer
):
    c = _text()
    L, E, H, inter = c["num_hidden_layers"], c["num_experts"], c["hidden_size"], c["moe_intermediate_size"]
    want = qpack.QpackWriter(tmp_path, layers=L, experts=E, hidden=H, inter=inter, bits=bits, gs=gs,
                             linear_layers=[t == "linear_attention" for t in c["layer_types"]])  # fmt: skip
    for layer in range(L):
        experts = [{p: source[f"{PREFIX}.{layer}.mlp.experts.{e}.{p}.weight"] for p in qpack.PROJECTIONS}
                   for e in range(E)]  # fmt: skip
        want.write_layer(layer, [qpack.encode_expert(x, bits, gs, quantizer) for x in experts])
    want.finish(c["model_type"], str(FIXTURE))
    out = outputs[folder]
    assert qpack.check(out) == []
    for layer in range(L):
        rel = qpack.layer_file(layer)
        assert (out / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel
    assert (out / qpack.LAYOUT).read_bytes() == (tmp_path / qpack.LAYOUT).read_bytes()
    manifest = json.loads((out / qpack.MANIFEST).read_text())
    assert manifest == json.loads((tmp_path / qpack.MANIFEST).read_text())
    assert (manifest["magic"], manifest["version"], manifest["quantBits"], manifest["quantGroupSize"]) == (
        "QPACK", 1, bits, gs)  # fmt: skip


def test_the_snapshot_holds_no_routed_expert_and_its_meta_no_expert_groups(outputs):
    out = outputs["rtn"]
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert not any(".mlp.experts." in n for n in index) and not any(
        f.endswith(".bin") for f in index.values()
    )
    assert any(".mlp.shared_expert." in n for n in index)
    meta = json.loads((out / "qwen36_meta.json").read_text())
    assert meta["expert_gs"] == 0 and "expert_down_bits" not in meta
    recorded = json.loads((out / "colitools.json").read_text())
    assert recorded["recipe"]["layout"] == "qpack" and recorded["recipe"]["experts"] == "affine4-g64"


def _decoded_source(container: Path, dest: Path) -> Path:
    """The fixture with its routed experts replaced by ``container``'s decoded values."""
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("reference"))
    c = qpack.open_qpack(container)
    tensors = load_file(dest / "model.safetensors")
    for layer in range(c.layout["layerCount"]):
        for e in range(c.layout["expertCount"]):
            for p, v in c.decode_expert(layer, e).items():
                tensors[f"{PREFIX}.{layer}.mlp.experts.{e}.{p}.weight"] = np.ascontiguousarray(v)
    save_file(tensors, dest / "model.safetensors")
    return dest


@pytest.mark.parametrize("folder", ["rtn", "q8"])
def test_runs_token_identical_to_the_f32_model_of_the_decoded_experts(outputs, tmp_path, folder):
    from colitools.runtime import generate, load_model

    src = _decoded_source(outputs[folder], tmp_path / "src")
    convert(str(src), tmp_path / "f32", ConvertOptions(**F32_RECIPE, progress=False, min_free_gb=0.0))
    tokens = {}
    for name, path in (("qpack", outputs[folder]), ("f32", tmp_path / "f32")):
        with load_model(path, record_usage=False) as model:
            tokens[name] = generate(model, [1, 2, 3, 4], 32).generated_ids
    assert len(tokens["qpack"]) == 32 and tokens["qpack"] == tokens["f32"]


def test_verify_checks_the_layer_files_and_a_rerun_redoes_a_missing_one(outputs, tmp_path):
    from colitools.verify.container import verify_container

    out = tmp_path / "copy"
    shutil.copytree(outputs["rtn"], out)
    assert verify_container(out).ok
    before = (out / qpack.layer_file(1)).read_bytes()
    (out / qpack.layer_file(1)).write_bytes(before[:-1] + bytes([before[-1] ^ 1]))
    report = verify_container(out)
    assert not report.ok and any("layer_01.bin" in p for p in report.problems)
    (out / qpack.layer_file(1)).unlink()
    _convert(out, target="qwen36", layout="qpack")
    assert (out / qpack.layer_file(1)).read_bytes() == before and qpack.check(out) == []


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            dict(target="qwen36", layout="qpack", experts="int4-g64"),
            "`layout=qpack` holds the routed experts",
        ),
        (dict(target="qwen36", experts="affine4-g64"), "written only into a QPACK container"),
        (dict(experts="affine4-g64"), "written only into a QPACK container"),
        (dict(target="qwen36", layout="qpack", dense="affine4-g64"), "`dense=affine4-g64` is written only"),
        (dict(target="generic", layout="qpack"), "`layout=qpack` is refused"),
        (dict(target="qwen36", layout="qpack", experts_down="int8-row"), "one affine format"),
        (dict(target="qwen36", layout="qpack", group_size=48), "affine4-g48"),
    ],
)
def test_what_qpack_cannot_hold_is_refused_in_one_line_before_work(tmp_path, options, says):
    with pytest.raises(ColitoolsError, match=says) as exc:
        _convert(tmp_path / "out", **options)
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "out" / "colitools.json").exists()


def test_a_size_budget_chooses_among_the_affine_formats(tmp_path):
    """The budget's candidates for QPACK experts are the affine formats (one for all: the container records one
    bits / group size); the allocation is written as a whole container."""
    out = _convert(tmp_path / "out", target="qwen36", layout="qpack", target_size=400_000)
    recipe = json.loads((out / "colitools.json").read_text())["recipe"]
    bits, gs = (8, 32) if recipe["experts"] == "affine8-g32" else (None, None)
    assert recipe["experts"].startswith("affine") and "budget" in recipe
    assert qpack.check(out) == []
    manifest = json.loads((out / qpack.MANIFEST).read_text())
    assert f"affine{manifest['quantBits']}-g{manifest['quantGroupSize']}" == recipe["experts"]
    assert bits is None or (manifest["quantBits"], manifest["quantGroupSize"]) == (bits, gs)


def test_verify_quality_reads_the_container_and_recomputes_the_recorded_figures(outputs):
    """``verify quality --source``: every routed expert is found in the container (decoded from its layer file)
    and the figures recomputed from the source agree with those convert recorded."""
    from colitools.verify.quality import weight_quality

    report = weight_quality(outputs["mse"], source=str(FIXTURE), progress=False)
    assert report.ok, report.disagreements[:3]
    experts = [t for t in report.tensors if ".mlp.experts." in t.name]
    c = _text()
    assert len(experts) == 3 * c["num_experts"] * c["num_hidden_layers"]
    assert {t.format for t in experts} == {"affine4-g32"}
    assert all(0 < t.stats.sse < t.stats.ssw for t in experts)


def test_verify_container_runs_the_engines_qpack_checks_and_part_is_refused(outputs, tmp_path):
    from colitools.verify.container import verify_container

    out = tmp_path / "copy"
    shutil.copytree(outputs["rtn"], out)
    manifest = json.loads((out / qpack.MANIFEST).read_text())
    (out / qpack.MANIFEST).write_text(json.dumps({**manifest, "quantGroupSize": 32}))
    report = verify_container(out)
    assert not report.ok and any("QPACK container" in p and "disagrees with the packed shapes" in p
                                 for p in report.problems)  # fmt: skip
    with pytest.raises(ColitoolsError, match="`part` with `layout=qpack`"):
        _convert(tmp_path / "part", target="qwen36", layout="qpack", part="1/2")
    assert not (tmp_path / "part").exists()
