"""Inkling-2 as shipped (docs/FORMATS.md §5 "MXFP8 expert stacks", issue 25 item 4): MXFP8 expert stacks ``w13_weight [E, 2I, H]`` (gate /
up rows interleaved) and ``w2_weight [E, H, I]`` F8_E4M3 with E8M0 scales ``[E, rows, ceil(cols/32)]``, declared as
``quant_method: fp8`` with ``weight_block_size: [1, 32]`` and ``scale_fmt: ue8m0``.

The checkpoint is the committed fixture ``oracles/inkling2_mxfp8``, whose bytes transformers' own FP8 quantizer op
wrote. Expected values are this test's own decode of those bytes (ml_dtypes' e4m3 table in float64 times
``2^(e - 127)``, exact, then float32), split by the test per expert (gate = even rows, up = odd rows, scales cut
the same way), never colitools' decoders."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from convcheck import open_output

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats import source_encodings as se

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "inkling2_mxfp8"
DTYPES = {
    "F8_E4M3": np.uint8,
    "U8": np.uint8,
    "F8_E8M0": np.uint8,
    "BF16": ml_dtypes.bfloat16,
    "F32": np.float32,
}
STACKS = ("mlp.experts.w13_weight", "mlp.experts.w2_weight")


def read_raw(path: Path) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
    """The header entries and every tensor's bytes as its dtype (F8 and E8M0 as uint8), read by hand."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = {k: v for k, v in json.loads(data[8 : 8 + n]).items() if k != "__metadata__"}
    out = {}
    for k, h in header.items():
        a, b = h["data_offsets"]
        out[k] = np.frombuffer(data[8 + n + a : 8 + n + b], dtype=DTYPES[h["dtype"]]).reshape(h["shape"])
    return header, out


def mxfp8_values(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``e4m3(b) * 2^(e - 127)`` per 32 inputs of the last axis, float64 (exact), then float32."""
    v = q.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    e = np.repeat(scale.astype(np.float64) - 127, 32, axis=-1)[..., : q.shape[-1]]
    return (v * np.exp2(e)).astype(np.float32)


def expected_experts(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-expert gate / up / down of every stack, by the converter's names."""
    out = {}
    for name in (n for n in raw if n.endswith(STACKS)):
        q, s = raw[name], raw[name + "_scale"]
        base = name.rsplit(".", 1)[0]
        for e in range(q.shape[0]):
            if name.endswith("w13_weight"):  # rows 0::2 gate, 1::2 up: codes and scales alike
                out[f"{base}.{e}.gate_proj.weight"] = mxfp8_values(q[e, 0::2], s[e, 0::2])
                out[f"{base}.{e}.up_proj.weight"] = mxfp8_values(q[e, 1::2], s[e, 1::2])
            else:
                out[f"{base}.{e}.down_proj.weight"] = mxfp8_values(q[e], s[e])
    return out


def converted_experts(out: Path) -> dict[str, np.ndarray]:
    files = open_output(out)
    try:
        return {n: f.read(n) for f in files for n in f.tensors if ".experts." in n}
    finally:
        for f in files:
            f.close()


def with_header(
    src: Path, dst: Path, retype: dict[str, str] | None = None, reshape: dict | None = None
) -> None:
    """A copy of folder ``src`` whose header names other dtypes / shapes for the same bytes (``reshape`` keeps the
    element count)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("reference"))
    path = dst / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    for k, dtype in (retype or {}).items():
        header[k]["dtype"] = dtype
    for k, shape in (reshape or {}).items():
        header[k]["shape"] = shape
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def test_the_fixture_is_inkling2_as_shipped():
    """What transformers' FineGrainedFP8 wrote: the config's declaration, F8_E4M3 stacks with U8 E8M0 scales of
    the stack's rows and ``cols / 32`` blocks (no NaN byte), every other tensor BF16."""
    cfg = json.loads((FIXTURE / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert (qc["quant_method"], qc["weight_block_size"], qc["scale_fmt"]) == ("fp8", [1, 32], "ue8m0")
    assert se.read_quant_config(cfg).of(se.Mxfp8) is True
    header, raw = read_raw(FIXTURE / "model.safetensors")
    text = cfg["text_config"]
    E, H, I = text["n_routed_experts"], text["hidden_size"], text["moe_intermediate_size"]
    stacks = [n for n in header if n.endswith(STACKS)]
    assert len(stacks) == 2 * text["num_hidden_layers"]
    for n in stacks:
        shape = [E, 2 * I, H] if n.endswith("w13_weight") else [E, H, I]
        assert header[n]["dtype"] == "F8_E4M3" and header[n]["shape"] == shape, n
        s = header[n + "_scale"]
        assert (
            s["dtype"] == "U8"
            and s["shape"] == [*shape[:2], shape[2] // 32]
            and (raw[n + "_scale"] < 0xFF).all()
        )
    rest = set(header) - set(stacks) - {n + "_scale" for n in stacks}
    assert rest and all(header[n]["dtype"] == "BF16" for n in rest)


@pytest.mark.parametrize("scale_dtype", ["U8", "F8_E8M0"])
def test_each_expert_is_its_stack_rows_with_the_scales_of_those_rows(tmp_path, scale_dtype):
    """``--experts f32``: every expert's gate, up and down hold exactly the decode of its rows of the stack (gate
    rows 0::2, up 1::2) with the scale rows cut the same way; the scales' F8_E8M0 spelling reads as the U8 one."""
    src = FIXTURE
    if scale_dtype != "U8":
        header, _ = read_raw(FIXTURE / "model.safetensors")
        src = tmp_path / "src"
        with_header(FIXTURE, src, retype={n: scale_dtype for n in header if n.endswith(tuple(s + "_scale" for s in STACKS))})  # fmt: skip
    convert(str(src), tmp_path / "out", ConvertOptions(experts="f32", progress=False, min_free_gb=0.0))
    _, raw = read_raw(FIXTURE / "model.safetensors")
    want, got = expected_experts(raw), converted_experts(tmp_path / "out")
    assert set(got) == set(want) and len(want) == 3 * 4 * 2
    for n, w in want.items():
        assert got[n].dtype == np.float32 and got[n].tobytes() == w.tobytes(), n
    # the scales follow the rows: the gate's codes with the scales of the first I rows (gate rows first) differ
    stack = next(n for n in raw if n.endswith("w13_weight"))
    q, sc = raw[stack], raw[stack + "_scale"]
    wrong = mxfp8_values(q[0, 0::2], sc[0, : q.shape[1] // 2])
    assert wrong.tobytes() != got[stack.rsplit(".", 1)[0] + ".0.gate_proj.weight"].tobytes()


def test_a_stack_scale_that_does_not_fit_is_one_line_naming_both(tmp_path):
    """The issue's shape: a ``w2_weight [E, H, I]`` scale must be ``[E, H, ceil(I/32)]``; a grid over the wrong
    axis (same byte count) is refused before work, ``colitools: error:`` in one line, exit 1."""
    layer = "model.llm.layers.0.mlp.experts.w2_weight"
    header, _ = read_raw(FIXTURE / "model.safetensors")
    E, H, I = header[layer]["shape"]
    with_header(FIXTURE, tmp_path / "src", reshape={layer + "_scale": [E, H * I // 32, 1]})
    r = subprocess.run([sys.executable, "-m", "colitools", "convert", str(tmp_path / "src"), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"colitools: error: tensor {layer}_scale: MXFP8 scale U8 [{E}, {H * I // 32}, 1] does not fit {layer} "
        f"[{E}, {H}, {I}] (expected U8 or F8_E8M0 [{E}, {H}, {-(-I // 32)}])"
    ]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.safetensors"))
