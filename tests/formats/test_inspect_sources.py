"""``inspect`` reads source checkpoints as the converter does (issue 25 item 3): a natively quantized weight counts
once, under its logical weight's role, as its source encoding (``fp8 128x128``, ``mxfp4``, ``compressed-tensors
int4 g``, ``nvfp4``, ``mxfp8``, ``fused stack of E experts``); its companions (``weight_scale_inv``,
``_blocks`` / ``_scales``, ``weight_packed`` / ``weight_scale`` / ``weight_shape``, ``_scale`` / ``_scale_2`` /
``input_scale``) are counted with it, never as weights nor as ``copied non-float``. The expectations are computed
from the fixtures' headers by the spelling rules of docs/FORMATS.md §5, independently of the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from colitools.formats.inspect import inspect_path
from colitools.formats.safetensors_io import SafetensorsFile

ORACLES = Path(__file__).resolve().parents[2] / "oracles"


def _headers(fixture: str) -> dict:
    out = {}
    for path in sorted((ORACLES / fixture).glob("*.safetensors")):
        with SafetensorsFile(path) as f:
            out.update(f.tensors)
    return out


def _weights(h: dict, fixture: str) -> dict[str, tuple[str, ...]]:
    """data tensor -> its parts, by the §5 spellings."""
    out = {}
    for n, t in h.items():
        if n + "_scale_inv" in h and t.dtype == "F8_E4M3":
            out[n] = (n, n + "_scale_inv")
        elif n.endswith("_blocks"):
            out[n] = (n, n[: -len("_blocks")] + "_scales")
        elif n.endswith(".weight_packed"):
            b = n[: -len(".weight_packed")]
            out[n] = tuple(x for x in (n, b + ".weight_scale", b + ".weight_shape") if x in h)
        elif n + "_scale_2" in h:
            out[n] = (n, n + "_scale", n + "_scale_2", n[: -len(".weight")] + ".input_scale")
        elif n + "_scale" in h and t.dtype == "F8_E4M3":
            out[n] = (n, n + "_scale")
    return out


CASES = {
    "deepseek_v3_fp8": "fp8 128x128",
    "qwen38_fp8": "fp8 128x128",  # routed experts only, BF16 weight_scale_inv
    "deepseek_v3_int4": "compressed-tensors int4 g32",
    "qwen3_moe_nvfp4": "nvfp4",
    "qwen3_moe_mxfp8": "mxfp8",
    "gpt_oss_mxfp4": "mxfp4, fused stack of {E} experts",
}


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_source_weights_count_once_with_their_companions(fixture):
    h = _headers(fixture)
    weights = _weights(h, fixture)
    config = json.loads((ORACLES / fixture / "config.json").read_text())
    label = CASES[fixture].format(E=config.get("num_local_experts"))
    report = inspect_path(ORACLES / fixture)
    assert weights
    got = [(enc, c) for encs in report.source_encodings.values() for enc, c in encs.items()]
    assert {enc for enc, _ in got} == {label}
    assert sum(c["tensors"] for _, c in got) == len(weights)
    assert sum(c["bytes"] for _, c in got) == sum(
        h[p].nbytes for parts in weights.values() for p in parts if p in h
    )
    companions = {p for parts in weights.values() for p in parts[1:] if p in h}
    weights_counted = sum(n for fmts in report.formats_per_role.values() for n in fmts.values())
    assert weights_counted == len(h) - len(companions)  # every other tensor is one weight, companions none
    # companions are never copied non-float; only the source's own integer tensors are (Qwen3.8's I64 hash buffers)
    integer = {n for n, t in h.items() if n not in companions and n not in weights and t.dtype.startswith(("I", "U"))}
    assert sum(report.formats_per_role.get("copied non-float", {}).values()) == len(integer)
    per_role = {role: fmts[label] for role, fmts in report.formats_per_role.items() if label in fmts}
    assert sum(per_role.values()) == len(weights)
    assert {t.format: t.tensors for t in report.totals}[label] == len(weights)
    assert json.loads(json.dumps(report.to_json()))["source_encodings"] == report.source_encodings


def test_routed_experts_of_a_source_are_routed_experts():
    report = inspect_path(ORACLES / "deepseek_v3_fp8")
    config = json.loads((ORACLES / "deepseek_v3_fp8" / "config.json").read_text())
    h = _headers("deepseek_v3_fp8")
    routed = [n for n in _weights(h, "deepseek_v3_fp8") if ".experts." in n]
    assert report.source_encodings["routed experts"]["fp8 128x128"]["tensors"] == len(routed) > 0
    assert config["quantization_config"]["weight_block_size"] == [128, 128]


def test_a_converted_container_reports_no_source_encodings(tmp_path):
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert

    convert(str(ORACLES / "gpt_oss_mxfp4"), tmp_path / "out", ConvertOptions(min_free_gb=0))
    report = inspect_path(tmp_path / "out")
    assert report.source_encodings == {}
    manifest = json.loads((tmp_path / "out" / "colitools.json").read_text())
    assert report.formats_per_role == manifest["formats_per_role"]  # mxfp4's weight_packed is no INT4 source
