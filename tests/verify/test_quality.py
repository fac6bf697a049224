"""`colitools verify quality`: the weight-level error of a conversion (docs/FORMATS.md §9's figures).

Expected values come from hand computation (a pair [3, 4] -> [3, 5]) or from an independent computation: the
output's codes read with the upstream ``safetensors`` package, decoded by the numpy reference decoders of
``formats/reference.py``, against the source arrays the test generated (upcast by ml_dtypes), the sums taken
here in numpy float64 (not by ``error_stats``)."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats import reference as ref
from colitools.formats.error_stats import REL_BOUND, SUM_ORDER, TINY, ErrorStats, tensor_error
from colitools.formats.errors import ParameterError, VerifyError
from colitools.formats.safetensors_io import SafetensorsFile
from colitools.verify.quality import agree, weight_quality

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "converters"))
from cli_helpers import one_line_error, run_cli  # noqa: E402
from test_native import make_int4, make_mxfp4  # noqa: E402
from tinyckpt import Tiny, make_checkpoint  # noqa: E402

OPTS = dict(progress=False, min_free_gb=0.0)
NORM = "model.norm.weight"


def figures_by_hand(w: np.ndarray, w2: np.ndarray) -> dict[str, float]:
    """The six figures of FORMATS §11 computed independently: numpy float64, elementwise."""
    a, b = np.asarray(w, np.float64).ravel(), np.asarray(w2, np.float64).ravel()
    d = b - a
    return {"n": a.size, "sse": float(np.sum(d * d)), "ssw": float(np.sum(a * a)), "ssq": float(np.sum(b * b)),
            "dot": float(np.sum(a * b)), "max_abs": float(np.max(np.abs(d)))}  # fmt: skip


def assert_figures(stats: ErrorStats, want: dict[str, float]) -> None:
    assert stats.n == want["n"]
    assert stats.max_abs == want["max_abs"]  # a maximum: exact
    for key in ("sse", "ssw", "ssq", "dot"):  # float32 blocks: within the bound FORMATS §11 states
        size = math.sqrt(want["ssw"] * want["ssq"]) if key == "dot" else want[key]  # >= the terms' magnitudes
        tol = REL_BOUND * size + want["n"] * TINY
        assert abs(getattr(stats, key) - want[key]) <= tol, (key, getattr(stats, key), want[key])


# ------------------------------------------------------------------------------------- (a) by hand
def test_hand_pair_figures():
    s = tensor_error(np.array([3.0, 4.0], np.float32), np.array([3.0, 5.0], np.float32))
    assert (s.n, s.sse, s.ssw, s.ssq, s.dot, s.max_abs) == (2, 1.0, 25.0, 34.0, 29.0, 1.0)
    assert s.rel_error == pytest.approx(0.2, rel=1e-15)  # sqrt(1 / 25)
    assert s.cosine == pytest.approx(29 / math.sqrt(25 * 34), rel=1e-15)
    assert s.sqnr_db == pytest.approx(10 * math.log10(25), rel=1e-15)  # 13.979 dB
    lossless = tensor_error(np.array([3.0, 4.0]), np.array([3.0, 4.0]))
    assert (lossless.rel_error, lossless.cosine, lossless.sqnr_db) == (0.0, 1.0, math.inf)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path, dict]:
    """A BF16 tiny MoE (hidden 128: gate / up [32, 128] are int4-g64, down [128, 32] int4-row) whose final norm
    is F32 [3, 4, 0, ...], converted with the default recipe."""
    root = tmp_path_factory.mktemp("quality")
    norm = np.zeros(128, np.float32)
    norm[:2] = (3.0, 4.0)
    src = make_checkpoint(root / "src", Tiny(hidden=128, inter=32, extra={NORM: norm}, shards=2))
    convert(str(root / "src"), root / "out", ConvertOptions(**OPTS))
    return root / "src", root / "out", src


def _edit_f32(out: Path, name: str, index: int, value: float) -> None:
    """Overwrite element ``index`` of the F32 tensor ``name`` in place (its shard found by the index)."""
    shard = out / json.loads((out / "model.safetensors.index.json").read_text())["weight_map"][name]
    with SafetensorsFile(shard) as f:
        info = f.tensors[name]
        assert info.dtype == "F32"
    with open(shard, "r+b") as fh:
        fh.seek(info.begin + 4 * index)
        fh.write(np.float32(value).tobytes())


def test_hand_pair_through_the_command(tiny, tmp_path):
    src, out, _ = tiny
    edited = tmp_path / "out"
    shutil.copytree(out, edited)
    # the output's norm is now [3, 5, 0, ...] against the source's [3, 4, 0, ...]; convert recorded it lossless
    _edit_f32(edited, NORM, 1, 5.0)
    proc = run_cli("verify", "quality", edited, "--source", src, "--json")
    assert proc.returncode == 4, proc.stderr  # recorded 0, recomputed 1: the one disagreement
    report = json.loads(proc.stdout)
    got = next(t for t in report["tensors"] if t["name"] == NORM)
    assert (got["n"], got["sse"], got["ssw"], got["ssq"], got["dot"], got["max_abs"]) == (
        128,
        1,
        25,
        34,
        29,
        1,
    )
    assert got["rel_error"] == pytest.approx(0.2, rel=1e-15)
    assert got["sqnr_db"] == pytest.approx(10 * math.log10(25), rel=1e-15)
    assert got["cosine"] == pytest.approx(29 / math.sqrt(25 * 34), rel=1e-15)
    assert [d["name"] for d in report["disagreements"]] == [NORM]
    assert report["disagreements"][0]["recorded"]["sse"] == 0.0
    text = run_cli("verify", "quality", edited, "--source", src)
    assert text.returncode == 4, text.stderr
    row = next(line for line in text.stdout.splitlines() if line.startswith(NORM))
    assert row.split()[1:] == ["f32", "0.2", "0.994692", "13.98", "1"]  # 29 / sqrt(850) = 0.9946918...
    assert (
        f"DISAGREE: {NORM}: sse 0.0 recorded, 1.0 recomputed; ssq 25.0 recorded, 34.0 recomputed"
        in text.stdout
    )


def _without_records(out: Path, dest: Path) -> dict:
    """A copy of ``out`` whose manifest records no error figures (a colitools from before they were recorded);
    returns the manifest."""
    shutil.copytree(out, dest)
    manifest = json.loads((dest / "colitools.json").read_text())
    for unit in manifest["units"].values():
        unit.pop("errors", None)
    manifest["recipe"].pop("quantizer", None)
    (dest / "colitools.json").write_text(json.dumps(manifest))
    return manifest


def test_recorded_figures_of_a_hand_made_manifest(tiny, tmp_path):
    _, out, _ = tiny
    rec = tmp_path / "out"
    manifest = _without_records(out, rec)
    manifest["recipe"]["quantizer"] = "rtn"
    unit = manifest["units"]["globals"]
    unit["errors"] = {
        NORM: [2, 1.0, 25.0, 34.0, 29.0, 1.0],
        "lm_head.weight": [4, 0.5, 50.0, 50.0, 49.75, 0.5],
    }
    (rec / "colitools.json").write_text(json.dumps(manifest))
    report = weight_quality(rec)
    assert report.figures == "recorded" and report.quantizer == "rtn" and report.ok
    by = {t.name: t for t in report.tensors}
    assert by[NORM].stats.rel_error == pytest.approx(0.2, rel=1e-15)
    assert (by[NORM].role, by[NORM].format, by["lm_head.weight"].role, by["lm_head.weight"].format) == (
        "norm/1-D",
        "f32",
        "head",
        "int8-row",
    )
    assert report.whole.sse == 1.5 and report.whole.ssw == 75.0 and report.whole.n == 6
    # sums, not a mean of ratios
    assert report.whole.rel_error == pytest.approx(math.sqrt(1.5 / 75), rel=1e-15)
    proc = run_cli("verify", "quality", rec)
    assert proc.returncode == 0, proc.stderr
    assert "figures as recorded at conversion, quantizer rtn" in proc.stdout


# ------------------------------------------------------------------------------- (b) a real conversion
def _output_arrays(out: Path) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        tensors.update(load_file(str(shard)))  # the upstream reader, not ours
    return tensors


def test_int4_g64_and_int4_row_equal_an_independent_computation(tiny):
    src, out, values = tiny
    report = weight_quality(out, str(src))
    assert report.figures == "recomputed" and report.not_compared == [] and report.disagreements == []
    by = {t.name: t for t in report.tensors}
    arrays = _output_arrays(out)
    gate = "model.layers.1.mlp.experts.2.gate_proj.weight"  # [32, 128]: int4-g64
    down = "model.layers.0.mlp.experts.3.down_proj.weight"  # [128, 32]: I <= 64, int4-row (§2.4)
    assert by[gate].format == "int4-g64" and by[down].format == "int4-row"
    w_gate = ref.decode_int4_grouped(arrays[gate], arrays[gate + ".qs"], 32, 128, 64)
    w_down = ref.decode_int4_row(arrays[down], arrays[down + ".qs"], 128, 32)
    for name, decoded in ((gate, w_gate), (down, w_down)):
        want = figures_by_hand(values[name].astype(np.float64), decoded)
        assert want["sse"] > 0
        assert_figures(by[name].stats, want)
        assert by[name].role == "routed experts" and by[name].layer == int(name.split(".")[2])


def test_lossless_tensors_report_exactly_zero(tiny):
    src, out, _ = tiny
    report = weight_quality(out, str(src))
    by = {t.name: t for t in report.tensors}
    router = by["model.layers.0.mlp.gate.weight"]  # BF16 source -> F32 (rule 2): exact
    bias = by["model.layers.1.mlp.gate.e_score_correction_bias"]
    for t in (router, bias, by[NORM]):
        assert t.format == "f32" and t.stats.sse == 0.0 and t.stats.max_abs == 0.0
        assert t.stats.rel_error == 0.0 and t.stats.sqnr_db == math.inf and t.stats.cosine == 1.0


def test_aggregates_are_sums_of_their_tensors(tiny):
    src, out, _ = tiny
    report = weight_quality(out, str(src))
    for role, stats in report.per_role.items():
        mine = [t.stats for t in report.tensors if t.role == role]
        assert stats.n == sum(s.n for s in mine)
        for key in ("sse", "ssw", "ssq", "dot"):
            assert getattr(stats, key) == pytest.approx(sum(getattr(s, key) for s in mine), rel=1e-12)
        assert stats.max_abs == max(s.max_abs for s in mine)
    experts = report.per_role["routed experts"]
    assert experts.rel_error == pytest.approx(math.sqrt(experts.sse / experts.ssw), rel=1e-15)
    assert set(report.per_format) == {"f32", "int4-g64", "int4-row", "int8-row"}
    assert sum(s.n for s in report.per_layer.values()) == report.whole.n
    # every weight the conversion wrote is compared: 2 layers x (4 attention, router, bias, 2 norms, 3 shared,
    # 4 experts x 3) + embed, head, final norm
    assert len(report.tensors) == 2 * (4 + 1 + 1 + 2 + 3 + 12) + 3


def test_recorded_and_recomputed_agree_then_a_changed_record_is_exit_4(tiny, tmp_path):
    src, out, _ = tiny
    rec = tmp_path / "out"
    manifest = _without_records(out, rec)
    report = weight_quality(out, str(src))
    units = manifest["units"]
    for t in report.tensors:  # the recomputed figures written as convert records them
        key = "globals" if t.layer is None else f"model.layers.{t.layer}"
        s = t.stats
        units[key].setdefault("errors", {})[t.name] = [s.n, s.sse, s.ssw, s.ssq, s.dot, s.max_abs]
        units[key]["error_order"] = SUM_ORDER
    (rec / "colitools.json").write_text(json.dumps(manifest))
    same = run_cli("verify", "quality", rec, "--source", src, "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["disagreements"] == []
    assert json.loads(same.stdout)["recorded"] == len(report.tensors)
    gate = "model.layers.1.mlp.experts.2.gate_proj.weight"
    units["model.layers.1"]["errors"][gate][1] *= 1 + 1e-6  # sse off by a millionth
    (rec / "colitools.json").write_text(json.dumps(manifest))
    proc = run_cli("verify", "quality", rec, "--source", src)
    assert proc.returncode == 4, proc.stderr
    assert f"DISAGREE: {gate}: sse" in proc.stdout and "NOT OK: 1 tensor(s) disagree" in proc.stdout


def test_figures_recorded_before_the_fixed_order_agree_within_its_bound_only(tiny, tmp_path):
    """A unit without ``error_order`` (colitools summed in float64 before FORMATS §11's order): its figures agree
    within twice the order's bound (2 x 22 x 2^-24 = 2.6e-6), not within REL_TOL; a larger change still disagrees."""
    src, out, _ = tiny
    rec = tmp_path / "out"
    manifest = json.loads((out / "colitools.json").read_text())
    shutil.copytree(out, rec)
    units = manifest["units"]
    assert all(u["error_order"] == SUM_ORDER for u in units.values() if "errors" in u)  # convert records it
    gate = "model.layers.1.mlp.experts.2.gate_proj.weight"
    sse = units["model.layers.1"]["errors"][gate][1]
    for unit in units.values():
        unit.pop("error_order", None)
    units["model.layers.1"]["errors"][gate][1] = sse * (1 + 2e-6)
    (rec / "colitools.json").write_text(json.dumps(manifest))
    assert run_cli("verify", "quality", rec, "--source", src).returncode == 0
    units["model.layers.1"]["errors"][gate][1] = sse * (1 + 4e-6)
    (rec / "colitools.json").write_text(json.dumps(manifest))
    proc = run_cli("verify", "quality", rec, "--source", src)
    assert proc.returncode == 4 and f"DISAGREE: {gate}: sse" in proc.stdout


def test_what_convert_records_is_what_verify_recomputes(tiny):
    src, out, _ = tiny
    recorded = weight_quality(out)
    assert recorded.figures == "recorded" and recorded.recorded == len(recorded.tensors) > 0
    recomputed = weight_quality(out, str(src))
    assert recomputed.disagreements == [] and recomputed.recorded == len(recomputed.tensors)
    assert {t.name for t in recorded.tensors} == {t.name for t in recomputed.tensors}


def test_agree_tolerates_summation_order_only():
    a = ErrorStats(10, 1.0, 100.0, 99.0, 99.5, 0.25)
    assert agree(a, ErrorStats(10, 1.0 + 1e-14, 100.0, 99.0, 99.5, 0.25)) is None
    assert "sse" in agree(a, ErrorStats(10, 1.0 + 1e-7, 100.0, 99.0, 99.5, 0.25))
    assert "max_abs" in agree(a, ErrorStats(10, 1.0, 100.0, 99.0, 99.5, 0.2500001))
    assert "n 10" in agree(a, ErrorStats(11, 1.0, 100.0, 99.0, 99.5, 0.25))


def test_native_int4_kept_codes_report_zero(tmp_path):
    make_int4(tmp_path / "src", g=32)
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="native", **OPTS))
    report = weight_quality(tmp_path / "out", str(tmp_path / "src"))
    experts = [t for t in report.tensors if t.role == "routed experts"]
    assert len(experts) == 6 and {t.format for t in experts} == {"int4-g32", "int4-row"}
    assert all(t.stats.sse == 0 and t.stats.max_abs == 0 and t.stats.n > 0 for t in experts)


def test_native_mxfp4_stacks_split_per_expert_report_zero_and_int4_does_not(tmp_path):
    values = make_mxfp4(tmp_path / "src")
    convert(str(tmp_path / "src"), tmp_path / "kept", ConvertOptions(experts="native", **OPTS))
    kept = weight_quality(tmp_path / "kept", str(tmp_path / "src"))
    experts = {t.name: t for t in kept.tensors if t.role == "routed experts"}
    assert len(experts) == 6 and {t.format for t in experts.values()} == {"mxfp4"}
    assert all(t.stats.sse == 0 and t.stats.n > 0 for t in experts.values())
    convert(str(tmp_path / "src"), tmp_path / "int4", ConvertOptions(experts="int4-g64", **OPTS))
    requant = {t.name: t for t in weight_quality(tmp_path / "int4", str(tmp_path / "src")).tensors}
    # rows I..2I of expert 1's gate_up stack (gate first)
    name = "model.layers.0.mlp.experts.1.up_proj.weight"
    arrays = _output_arrays(tmp_path / "int4")
    decoded = ref.decode_int4_row(arrays[name], arrays[name + ".qs"], 32, 64)  # I = 64 <= 64: int4-row
    want = figures_by_hand(values["model.layers.0.mlp.experts.gate_up_proj"][1][32:], decoded)
    assert want["sse"] > 0
    assert_figures(requant[name].stats, want)


def test_fp8_passthrough_reports_zero(tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(dtype="FP8", hidden=128, inter=128, block=(128, 128)))
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dense="fp8", experts="fp8", **OPTS))
    report = weight_quality(tmp_path / "out", str(tmp_path / "src"))
    fp8 = [t for t in report.tensors if t.format == "fp8"]
    assert len(fp8) == 2 * (4 + 3 + 12)  # attention, shared experts, routed experts of 2 layers
    assert all(t.stats.sse == 0 and t.stats.max_abs == 0 for t in fp8)


def test_fp8_source_to_int8_row_equals_an_independent_computation(tmp_path):
    values = make_checkpoint(tmp_path / "src", Tiny(dtype="FP8", hidden=256, inter=128))
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(**OPTS))
    by = {t.name: t for t in weight_quality(tmp_path / "out", str(tmp_path / "src")).tensors}
    name = "model.layers.1.self_attn.o_proj.weight"  # [256, 256]: 2 x 2 blocks of 128
    q, s = values[name], values[name + "_scale_inv"]
    grid = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)
    w = q.astype(np.float32) * grid  # FORMATS §5: e4m3 value times its block's scale, one float32 multiply
    arrays = _output_arrays(tmp_path / "out")
    decoded = ref.decode_int8_row(arrays[name], arrays[name + ".qs"], 256, 256)
    want = figures_by_hand(w, decoded)
    assert by[name].format == "int8-row" and want["sse"] > 0
    assert_figures(by[name].stats, want)


def test_fp8_figures_recorded_by_the_fused_encoder_equal_an_independent_computation(tmp_path, monkeypatch):
    """Every FP8 tensor on the kernels (SMALL_ELEMS 0): int8-row attention and int4-g64 experts recorded by
    ``encode_from_fp8_measured`` (the dequant inside the sums), equal to a hand computation and to verify's."""
    from colitools.formats import kernels

    values = make_checkpoint(tmp_path / "src", Tiny(dtype="FP8", hidden=256, inter=128))
    monkeypatch.setattr(kernels._dispatch, "SMALL_ELEMS", 0)
    measured = []
    fused = kernels.encode_from_fp8_measured

    def spy(fmt, q, *args, **kw):
        out = fused(fmt, q, *args, **kw)
        measured.append((fmt, out[2] is not None))
        return out

    monkeypatch.setattr(kernels, "encode_from_fp8_measured", spy)
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="int4-g64", **OPTS))
    assert ("int8-row", True) in measured and ("int4-grouped", True) in measured
    recorded = {t.name: t for t in weight_quality(tmp_path / "out").tensors}
    arrays = _output_arrays(tmp_path / "out")
    for name, decode in (
        ("model.layers.1.self_attn.o_proj.weight", lambda c, s: ref.decode_int8_row(c, s, 256, 256)),
        ("model.layers.0.mlp.experts.3.down_proj.weight", lambda c, s: ref.decode_int4_grouped(c, s, 256, 128, 64)),
    ):
        q, s = values[name], values[name + "_scale_inv"]
        grid = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[: q.shape[0], : q.shape[1]]
        want = figures_by_hand(q.astype(np.float32) * grid, decode(arrays[name], arrays[name + ".qs"]))
        assert want["sse"] > 0
        assert_figures(recorded[name].stats, want)
    assert weight_quality(tmp_path / "out", str(tmp_path / "src")).disagreements == []


def test_planar_sidecar_experts_are_compared_like_their_pairs(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, Tiny(hidden=128, inter=64))  # planar needs I % 64 == 0
    convert(str(src), tmp_path / "pairs", ConvertOptions(**OPTS))
    convert(str(src), tmp_path / "planar", ConvertOptions(layout="planar", **OPTS))
    planar = weight_quality(tmp_path / "planar", str(src))
    pairs = {t.name: t.stats for t in weight_quality(tmp_path / "pairs", str(src)).tensors}
    assert planar.not_compared == [] and len(planar.tensors) == len(pairs)
    experts = [n for n in pairs if ".experts." in n]
    assert len(experts) == 24 and all(pairs[n].sse > 0 for n in experts)
    by = {t.name: t.stats for t in planar.tensors}
    for name in experts:  # the same codes and scale values, in another byte order
        assert by[name] == pairs[name], name


def test_plot_is_a_png(tiny, tmp_path):
    src, out, _ = tiny
    report = weight_quality(out, str(src), plot=tmp_path / "q.png")
    assert report.plot == str(tmp_path / "q.png")
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------- (c) errors
def test_folder_without_manifest_is_one_line_exit_1(tiny, tmp_path):
    src, _, _ = tiny
    proc = run_cli("verify", "quality", src, "--source", src)
    one_line_error(proc, "colitools.json: not found", "not a colitools conversion", code=1)
    with pytest.raises(VerifyError, match="not a colitools conversion"):
        weight_quality(src)


def test_no_recorded_figures_without_source_is_one_line_exit_1(tiny, tmp_path):
    _, out, _ = tiny
    _without_records(out, tmp_path / "out")
    proc = run_cli("verify", "quality", tmp_path / "out", "--json")
    line = one_line_error(proc, "did not record errors; pass the source (--source)", code=1)
    assert json.loads(proc.stdout.splitlines()[-1])["exit_code"] == 1, line


@pytest.mark.parametrize(
    "values", [[1, 2.0], [2, 1.0, "25", 34.0, 29.0, 1.0], [1e400, 0, 0, 0, 0, 0], [-1, 0, 0, 0, 0, 0]]
)
def test_a_malformed_record_is_one_line_naming_the_tensor(tiny, tmp_path, values):
    _, out, _ = tiny
    manifest = _without_records(out, tmp_path / "out")
    manifest["units"]["globals"]["errors"] = {NORM: values}
    (tmp_path / "out" / "colitools.json").write_text(json.dumps(manifest))
    proc = run_cli("verify", "quality", tmp_path / "out")
    one_line_error(proc, f"errors['{NORM}'] is not [n, sse, ssw, ssq, dot, max_abs]", code=1)


def test_source_with_another_tensor_names_the_tensor(tiny, tmp_path):
    _, out, _ = tiny
    extra = {NORM: np.arange(128, dtype=np.float32),
             "model.layers.0.self_attn.q_norm.weight": np.ones(128, np.float32)}  # fmt: skip
    make_checkpoint(tmp_path / "other", Tiny(hidden=128, inter=32, extra=extra))
    proc = run_cli("verify", "quality", out, "--source", tmp_path / "other")
    one_line_error(
        proc, "tensor model.layers.0.self_attn.q_norm.weight", "not the source of this conversion", code=1
    )


def test_source_with_another_shape_names_the_tensor(tiny, tmp_path):
    _, out, _ = tiny
    make_checkpoint(tmp_path / "other", Tiny(hidden=128, inter=32, extra={NORM: np.ones(64, np.float32)}))
    proc = run_cli("verify", "quality", out, "--source", tmp_path / "other")
    one_line_error(proc, f"tensor {NORM}", "[64]", "[128]", "not the source of this conversion", code=1)


def test_plot_that_is_not_png_is_a_usage_error(tiny, tmp_path):
    _, out, _ = tiny
    proc = run_cli("verify", "quality", out, "--plot", tmp_path / "q.jpg")
    one_line_error(proc, "--plot", "q.jpg", "*.png", code=2)
    assert not (tmp_path / "q.jpg").exists()
    with pytest.raises(ParameterError):
        weight_quality(out, plot=tmp_path / "q.svg")


# ------------------------------------------------------------------------------------- target layouts
ORACLES = Path(__file__).resolve().parents[2] / "oracles"


@pytest.mark.parametrize(
    ("fixture", "target", "generic"),
    [
        (
            "olmoe_target",
            "olmoe",
            dict(experts="int8-row", dense="f32", embed="f32"),
        ),  # int8-row merged blobs
        ("qwen3_5_moe", "qwen36", None),  # int4 merged blobs of signed nibbles
    ],
)
def test_merged_expert_blobs_are_read_by_their_parts(tmp_path, fixture, target, generic):
    src = ORACLES / fixture
    convert(str(src), tmp_path / "t", ConvertOptions(target=target, **OPTS))
    report = weight_quality(tmp_path / "t", str(src))
    assert report.not_compared == [] and report.disagreements == []  # and convert recorded the same figures
    experts = {t.name: t.stats for t in report.tensors if t.role == "routed experts"}
    assert experts and all(s.sse > 0 and s.n > 0 for s in experts.values())
    if generic is not None:  # the generic container holding the same values: the same figures, per expert
        convert(str(src), tmp_path / "g", ConvertOptions(**generic, **OPTS))
        same = {t.name: t.stats for t in weight_quality(tmp_path / "g", str(src)).tensors}
        for name, stats in experts.items():
            assert same[name] == stats, name


def test_a_stack_without_parts_is_listed_not_compared_never_guessed(tmp_path):
    src = ORACLES / "inkling"
    convert(str(src), tmp_path / "t", ConvertOptions(target="inkling", **OPTS))
    report = weight_quality(tmp_path / "t", str(src))
    shared = [n for n, why in report.not_compared if "stored in the stack" in why]
    assert shared and all(".shared_experts." in n for n in shared)
    assert len(shared) == len(report.not_compared)
    assert not any(t.name in shared for t in report.tensors)
    assert report.disagreements == [] and any(t.role == "routed experts" for t in report.tensors)


# ------------------------------------------------------------------------------------------- a Hub source
def _hub_fixture():
    """The converter tests' fake Hugging Face Hub fixture (tests/converters/conftest.py ``hub``)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "converters" / "conftest.py"
    spec = importlib.util.spec_from_file_location("converters_conftest_for_quality", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.hub


hub = _hub_fixture()


def test_a_hub_source_is_read_as_convert_reads_it_and_its_downloads_deleted(hub, tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(hidden=128, inter=32, shards=2))
    hub.add_repo("org/tiny", {"main": tmp_path / "src"})
    convert("org/tiny", tmp_path / "out", ConvertOptions(**OPTS))
    shards = sorted(p.name for p in (tmp_path / "src").glob("*.safetensors"))
    hub.reset_stats()
    work = tmp_path / "work"
    report = weight_quality(tmp_path / "out", "org/tiny", workdir=work)
    assert report.disagreements == [] and report.recorded == len(report.tensors) > 0
    for (
        s
    ) in shards:  # each shard downloaded whole once (its header read by a range request to plan, as convert)
        size = (tmp_path / "src" / s).stat().st_size
        assert [r for r in hub.stats(s).ranges if r == (0, size)] == [(0, size)], hub.stats(s).ranges
    assert not list(work.rglob("*.safetensors"))  # and deleted once no later tensor needed it
    local = {t.name: t.stats for t in weight_quality(tmp_path / "out", str(tmp_path / "src")).tensors}
    assert {t.name: t.stats for t in report.tensors} == local


# ------------------------------------------------------------------------------------------ row slabs
@pytest.mark.parametrize("dtype", ["BF16", "FP8"])
def test_row_slabs_give_the_whole_tensors_figures(tmp_path, monkeypatch, dtype):
    import colitools.verify.quality as quality

    # FP8: [256, 256] attention in two 128-row scale blocks; experts [128, 256] / [256, 128]
    make_checkpoint(tmp_path / "src", Tiny(dtype=dtype, hidden=256, inter=128))
    outputs = [tmp_path / "out"]
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(**OPTS))
    if dtype == "FP8":  # and the fp8 passthrough, decoded by the 128-row blocks of its scale grid
        outputs.append(tmp_path / "fp8")
        convert(str(tmp_path / "src"), tmp_path / "fp8", ConvertOptions(dense="fp8", **OPTS))
    slabs = []
    source_rows = quality._source_rows

    def counted(job, reader, block, r0, r1):
        slabs.append((job.out_name, r0, r1))
        return source_rows(job, reader, block, r0, r1)

    for out in outputs:
        whole = {t.name: t for t in weight_quality(out, str(tmp_path / "src")).tensors}
        assert slabs == []  # 16 MB slabs: none of these tensors is cut
        with monkeypatch.context() as m:
            m.setattr(quality, "SLAB_BYTES", 4 * 256 * 3)  # 3 rows of 256 float32 (FP8: its 128-row blocks)
            m.setattr(quality, "_source_rows", counted)
            slabbed = weight_quality(out, str(tmp_path / "src"))
        attention = [(r0, r1) for n, r0, r1 in slabs if n == "model.layers.0.self_attn.q_proj.weight"]
        assert attention == (
            [(0, 128), (128, 256)] if dtype == "FP8" else [(r, min(r + 3, 256)) for r in range(0, 256, 3)]
        )
        slabs.clear()
        assert slabbed.disagreements == [] and len(slabbed.tensors) == len(whole)
        for t in slabbed.tensors:
            w = whole[t.name].stats
            assert (t.stats.n, t.stats.max_abs) == (w.n, w.max_abs), t.name
            for key in ("sse", "ssw", "ssq", "dot"):
                assert getattr(t.stats, key) == pytest.approx(getattr(w, key), rel=1e-12), (t.name, key)
        if out.name == "fp8":
            fp8 = [t for t in slabbed.tensors if t.format == "fp8"]
            assert fp8 and all(t.stats.sse == 0 and t.stats.max_abs == 0 for t in fp8)


# ------------------------------------------------------------------------------- read around the page cache
def test_figures_from_the_drive_read_around_the_page_cache_equal_those_from_the_page_cache(tmp_path, monkeypatch):
    """Every shard evicted: each read not wholly cached goes around the page cache (O_DIRECT, every read here
    with DIRECT_MIN lowered to one byte) and gives the figures of a run from the page cache, bit for bit."""
    import os

    from colitools.formats.safetensors_io import direct

    make_checkpoint(tmp_path / "src", Tiny(hidden=512, inter=256))
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(**OPTS))
    shards = sorted((tmp_path / "src").glob("*.safetensors")) + sorted((tmp_path / "out").glob("*.safetensors"))
    fd = os.open(shards[0], os.O_RDONLY)
    try:
        if direct.cached(fd, 0, 1) is None or direct.open_direct(shards[0]) is None:
            pytest.skip("no cachestat or no O_DIRECT here: verify reads through the page cache")
    finally:
        os.close(fd)
    cached = weight_quality(tmp_path / "out", str(tmp_path / "src"))
    monkeypatch.setattr(direct, "DIRECT_MIN", 1)
    os.sync()
    for path in shards:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    drive = weight_quality(tmp_path / "out", str(tmp_path / "src"))
    assert drive.disagreements == [] and len(drive.tensors) == len(cached.tensors) > 10
    assert [(t.name, t.stats) for t in drive.tensors] == [(t.name, t.stats) for t in cached.tensors]
    fd = os.open(shards[0], os.O_RDONLY)
    try:  # read around it: the source shard is not back in the page cache whole (a buffered pass would be)
        assert direct.cached(fd, 0, os.fstat(fd).st_size) is False
    finally:
        os.close(fd)


def test_a_truncated_source_shard_from_the_drive_is_one_line_naming_it(tmp_path):
    import os

    make_checkpoint(tmp_path / "src", Tiny(hidden=512, inter=256))
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(**OPTS))
    shard = max((tmp_path / "src").glob("*.safetensors"), key=lambda p: p.stat().st_size)
    os.truncate(shard, shard.stat().st_size - 100_000)  # its last tensors cut
    os.sync()
    for path in [*(tmp_path / "src").glob("*.safetensors"), *(tmp_path / "out").glob("*.safetensors")]:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    proc = run_cli("verify", "quality", tmp_path / "out", "--source", tmp_path / "src")
    one_line_error(proc, shard.name, code=1)


# ----------------------------------------------------------------- source encodings and targets, end to end
@pytest.mark.parametrize(
    ("fixture", "target", "lossless"),
    [
        ("gpt_oss_mxfp4", None, {"f32", "mxfp4"}),  # MXFP4 stacks, gate / up rows interleaved: kept (native)
        ("deepseek_v3_fp8", None, {"f32"}),  # FP8 128x128 blocks, partial edge blocks
        ("qwen3_moe_nvfp4", None, {"f32"}),  # NVFP4 decoded and requantized
        ("qwen3_moe_mxfp8", None, {"f32"}),
        ("kimi_k3", None, {"f32", "mxfp4"}),  # compressed-tensors mxfp4-pack-quantized: kept
        ("qwen3_vl_moe", None, {"f32"}),  # transposed [E, H, 2I] stacks
        (
            "deepseek_v41",
            "deepseek_v41",
            {"f32", "bf16", "fp8-e8m0-t32", "fp8-e8m0-r32", "mxfp4"},
        ),  # as released
        ("qwen38", "qwen38", {"f32", "bf16"}),  # experts in the planar sidecar
    ],
)
def test_every_tensor_is_compared_and_agrees_with_what_convert_recorded(tmp_path, fixture, target, lossless):
    src = ORACLES / fixture
    options = ConvertOptions(**OPTS) if target is None else ConvertOptions(target=target, **OPTS)
    convert(str(src), tmp_path / "out", options)
    report = weight_quality(tmp_path / "out", str(src))
    assert report.not_compared == [] and report.disagreements == []
    assert report.recorded == len(report.tensors) - len(report.copied) > 0
    for label, stats in report.per_format.items():
        assert (stats.sse == 0) == (label in lossless), (label, stats)
