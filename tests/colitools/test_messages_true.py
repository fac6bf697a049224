"""Issue 43 item 9: messages that say what is there, through the real console script."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from cli_helpers import one_line_error, run_cli

from colitools.formats import source_encodings

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
SECOND_TIME = "quantized a second time"


def test_verify_container_counts_every_format_it_saw_as_inspect_does():
    mxfp8 = ORACLES / "qwen3_moe_mxfp8"
    verify = run_cli("verify", "container", mxfp8)
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.splitlines()[0] == f"{mxfp8}: 1 shard(s), 117 tensors (21 bf16, 48 mxfp8)"
    for fixture in ("qwen3_moe_mxfp8", "deepseek_v3_fp8", "deepseek_v3_int4", "gpt_oss_mxfp4", "olmoe"):
        formats = json.loads(run_cli("verify", "container", ORACLES / fixture, "--json").stdout)["formats"]
        totals = json.loads(run_cli("inspect", ORACLES / fixture, "--json").stdout)["totals"]
        assert formats == {t["format"]: t["tensors"] for t in totals}, fixture


def _with_dtype(model: Path, name: str, dtype: str) -> None:
    """Tensor ``name`` of the model's one shard relabelled ``dtype`` (same item size: the same bytes)."""
    shard = next(model.glob("*.safetensors"))
    data = shard.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    header[name]["dtype"] = dtype
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= n
    shard.write_bytes(data[:8] + raw.ljust(n) + data[8 + n :])


def test_the_refusal_of_an_integer_expert_names_each_encoding_once(tmp_path):
    model = Path(shutil.copytree(ORACLES / "olmoe", tmp_path / "olmoe"))
    _with_dtype(model, "model.layers.0.mlp.experts.0.gate_proj.weight", "I32")
    line = one_line_error(run_cli("convert", model, tmp_path / "out", "--dry-run"), "stored as I32", code=1)
    labels = {e.label for e in source_encodings.ENCODINGS.values()}
    known = line.split("colitools reads (", 1)[1].split(")", 1)[0].split(", ")
    assert sorted(known) == sorted(labels) and "MXFP4" in known  # two encodings share the label MXFP4


def _interrupted_conversion(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    assert run_cli("convert", ORACLES / "olmoe", out).returncode == 0
    manifest = json.loads((out / "colitools.json").read_text())
    (out / "colitools.json").write_text(json.dumps({**manifest, "state": "converting"}))
    return out


def test_inspect_and_verify_warnings_are_colitools_warning_lines(tmp_path):
    out = _interrupted_conversion(tmp_path)
    inspect = run_cli("inspect", out)
    assert inspect.returncode == 0, inspect.stderr
    warned = [line for line in inspect.stderr.splitlines() if "the conversion is not complete" in line]
    assert warned and all(line.startswith("colitools: warning: ") for line in warned), inspect.stderr
    verify = run_cli("verify", "container", ORACLES / "qwen3_moe_mxfp8")
    assert "colitools: warning: no colitools.json" in verify.stderr
    assert "warning" not in verify.stdout and verify.stdout.splitlines()[-1] == "OK"
    assert not [line for line in verify.stderr.splitlines() if line.startswith("warning:")]


def _iku1(layers: int, experts: int, cells: dict[tuple[int, int], int]) -> bytes:
    body = [cells.get((layer, e), 0) for layer in range(layers) for e in range(experts)]
    return struct.pack(f"<4s2I{len(body)}I", b"IKU1", layers, experts, *body)


def test_usage_show_names_the_engine_of_an_iku1_history(tmp_path):
    model = Path(shutil.copytree(ORACLES / "inkling", tmp_path / "inkling"))
    (model / ".coli_usage").write_bytes(_iku1(2, 4, {(0, 1): 7}))
    data = json.loads(run_cli("usage", "show", model / ".coli_usage", "--json").stdout)
    assert (data["engine"], data["engine_matches_model"]) == ("inkling", True)
    text = run_cli("usage", "show", model / ".coli_usage").stdout
    assert "engine     'inkling': colibri's inkling engine" in text


def test_usage_show_refuses_a_plot_that_is_not_a_png(tmp_path):
    model = Path(shutil.copytree(ORACLES / "inkling", tmp_path / "inkling"))
    (model / ".coli_usage").write_bytes(_iku1(2, 4, {(0, 1): 7}))
    result = run_cli("usage", "show", model / ".coli_usage", "--plot", tmp_path / "x.jpg")
    one_line_error(result, "--plot", "x.jpg", "PNG", code=2)
    assert not (tmp_path / "x.jpg").exists()


def test_run_on_an_nvfp4_source_names_nvfp4():
    result = run_cli("run", ORACLES / "qwen3_moe_nvfp4", "--prompt-ids", "1,2", "--max-new-tokens", "1",
                     "--no-usage")  # fmt: skip
    one_line_error(result, "NVFP4", "convert", code=1)


def test_inspect_summary_and_its_formats_table_agree_on_qwen36_routed_experts(tmp_path):
    out = tmp_path / "q36"
    assert run_cli("convert", ORACLES / "qwen3_5_moe", out, "--target", "qwen36").returncode == 0
    summary = json.loads(run_cli("inspect", out, "--summary", "--json").stdout)
    (label, routed), = summary["formats_per_role"]["routed experts"].items()
    totals = {t["format"]: t["tensors"] for t in summary["totals"]}
    assert totals[label] == routed == 24  # 2 layers x 4 experts x 3 projections in 8 merged blobs
    manifest = json.loads((out / "colitools.json").read_text())
    assert totals == {k: v["tensors"] for k, v in manifest["format_totals"].items()}


def test_no_second_quantization_warning_when_the_values_are_written_unchanged(tmp_path):
    k3 = run_cli("convert", ORACLES / "kimi_k3", tmp_path / "k3", "--target", "kimi_k3")
    assert k3.returncode == 0, k3.stderr
    assert SECOND_TIME not in k3.stderr
    assert json.loads((tmp_path / "k3" / "colitools.json").read_text())["warnings"] == []
    again = run_cli("convert", ORACLES / "kimi_k3", tmp_path / "k3", "--target", "kimi_k3")  # complete already
    assert again.returncode == 0 and SECOND_TIME not in again.stderr
    nvfp4 = run_cli("convert", ORACLES / "qwen3_moe_nvfp4", tmp_path / "nv")  # values changed: still said
    assert nvfp4.returncode == 0 and f"colitools: warning: natively quantized routed experts are decoded and " \
        f"{SECOND_TIME}" in nvfp4.stderr
    assert SECOND_TIME in json.loads((tmp_path / "nv" / "colitools.json").read_text())["warnings"][0]
