"""`colitools inspect` and `colitools formats`, run as the real console script in a subprocess.

Malformed files must give one line `colitools: error: ...` naming the file and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import one_line_error as assert_one_line_error
from cli_helpers import run_cli

from colitools.formats.registry import by_name
from colitools.formats.resolver import encode_shapes, encode_stamps
from colitools.formats.safetensors_io import write_safetensors


def run(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=120)


def raw_file(path: Path, header: bytes | dict, data: bytes = b"", n: int | None = None) -> Path:
    """A hand-made safetensors file: u64 length (``n`` overrides it), header bytes, data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if n is None else n) + text + data)
    return path


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


MALFORMED = {
    "truncated": lambda p: _truncated(p),
    "shorter than the length field": lambda p: (p.write_bytes(b"\x05\x00\x00"), p)[1],
    "header length past EOF": lambda p: raw_file(p, b'{"a":1}', n=1000),
    "header bomb (declared length)": lambda p: raw_file(p, b"{}", n=2**40),
    "header bomb (nested JSON)": lambda p: raw_file(p, b"[" * 200_000 + b"]" * 200_000),
    "overlapping offsets": lambda p: raw_file(
        p, {"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 4, 12)}, bytes(12)
    ),
    "hole in the data": lambda p: raw_file(
        p, {"a": _entry("F32", [1], 0, 4), "b": _entry("F32", [1], 8, 12)}, bytes(12)
    ),
    "bad dtype": lambda p: raw_file(p, {"a": _entry("Q7", [2], 0, 8)}, bytes(8)),
    "non-string metadata": lambda p: raw_file(p, {"__metadata__": {"colitools.shapes": {"a": [1, 2]}}}),
    "byte count does not match shape": lambda p: raw_file(p, {"a": _entry("F32", [3], 0, 8)}, bytes(8)),
    "negative dimension": lambda p: raw_file(p, {"a": _entry("F32", [-2], 0, 8)}, bytes(8)),
    "header not JSON": lambda p: raw_file(p, b"not json at all"),
    "header not an object": lambda p: raw_file(p, b"[1, 2]"),
    "header not UTF-8": lambda p: raw_file(p, b'{"\xff": 1}'),
    "data past the last tensor": lambda p: raw_file(p, {"a": _entry("F32", [1], 0, 4)}, bytes(9)),
    "stamps not JSON": lambda p: raw_file(p, {"__metadata__": {"colibri.fmt": "{oops"}}),
    "shapes entry malformed": lambda p: raw_file(p, {"__metadata__": {"colitools.shapes": '{"a": [1]}'}}),
}


def _truncated(path: Path) -> Path:
    write_safetensors(path, {"a": np.arange(64, dtype=np.float32), "b": np.ones(16, np.float32)})
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    return path


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_file_gives_one_line_naming_the_file(tmp_path, case):
    path = MALFORMED[case](tmp_path / f"bad-{case.split()[0]}.safetensors")
    result = run("inspect", path)
    assert_one_line_error(result, str(path))
    assert result.stdout == ""


def test_malformed_json_mode_also_one_line(tmp_path):
    path = raw_file(tmp_path / "bomb.safetensors", b"{}", n=2**40)
    assert_one_line_error(run("inspect", "--json", path), str(path))


def test_missing_path_is_one_line(tmp_path):
    assert_one_line_error(run("inspect", tmp_path / "nowhere"), "no such file or directory")


def test_unresolvable_tensor_is_one_line(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"w": np.zeros((4, 99), np.uint8), "w.qs": np.ones(4, np.float32)},
                      {"colitools.shapes": encode_shapes({"w": (4, 100)})})  # fmt: skip
    assert_one_line_error(run("inspect", path), "tensor w", "396", "16", "no known layout")
    write_safetensors(path, {"w.qs": np.ones(4, np.float32)})
    assert_one_line_error(run("inspect", path), "w.qs has no weight w")


def test_model_dir_with_bad_index_is_one_line(tmp_path):
    write_safetensors(tmp_path / "a.safetensors", {"x": np.ones(2, np.float32)})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "../a.safetensors"}})
    )
    assert_one_line_error(
        run("inspect", tmp_path), "model.safetensors.index.json", "'../a.safetensors'", "is refused"
    )


# ------------------------------------------------------------------------------- inspect on real files
RNG = np.random.default_rng(11)
NAMES = {
    "int4-g64": "model.layers.0.mlp.experts.0.gate_proj.weight",
    "int4-g32": "model.layers.0.mlp.experts.0.up_proj.weight",
    "int8-row": "model.layers.0.self_attn.q_proj.weight",
    "int3-g64": "model.layers.0.self_attn.o_proj.weight",
    "int4-row": "model.layers.0.mlp.experts.1.gate_proj.weight",
}


@pytest.fixture
def quantized_file(tmp_path):
    w = RNG.standard_normal((8, 128)).astype(np.float32)
    tensors, shapes = {}, {}
    for option, name in NAMES.items():
        fmt, gs = ("int4-grouped", int(option[6:])) if option.startswith("int4-g") else (option, None)
        codes, scales = by_name(fmt).encode(w, gs, name=name, fast=False)
        tensors[name], tensors[name + ".qs"], shapes[name] = codes, scales, (8, 128)
    packed, scale = by_name("mxfp4").encode(w, name="mx", fast=False)
    tensors["model.layers.0.mlp.experts.2.down_proj.weight_packed"] = packed
    tensors["model.layers.0.mlp.experts.2.down_proj.weight_scale"] = scale
    shapes["model.layers.0.mlp.experts.2.down_proj.weight_packed"] = (8, 128)
    fp8 = RNG.integers(0, 0x70, (2, 256), dtype=np.uint8)  # O == nblk: needs its stamp
    tensors["model.layers.0.mlp.shared_experts.up_proj.weight"] = fp8
    tensors["model.layers.0.mlp.shared_experts.up_proj.weight.qs"] = np.ones((1, 2), np.float32)
    shapes["model.layers.0.mlp.shared_experts.up_proj.weight"] = (2, 256)
    tensors["model.norm.weight"] = np.ones(128, np.float32)
    path = tmp_path / "model.safetensors"
    stamps = {"model.layers.0.mlp.shared_experts.up_proj.weight": "fp8-e4m3-b128"}
    write_safetensors(
        path, tensors, {"colitools.shapes": encode_shapes(shapes), "colibri.fmt": encode_stamps(stamps)}
    )
    return path


def test_inspect_table_shows_formats_group_sizes_stamps_and_totals(quantized_file):
    result = run("inspect", quantized_file)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.startswith("model.")}
    assert rows[NAMES["int4-g64"]][1:] == [
        "U8",
        "[8,",
        "64]",
        "[8,",
        "128]",
        "512",
        "int4-g64",
        "64",
        "-",
    ]
    assert rows[NAMES["int4-g32"]][-3:] == ["int4-g32", "32", "-"]
    assert rows[NAMES["int8-row"]][-3:] == ["int8-row", "-", "-"]
    assert rows[NAMES["int3-g64"]][-3:] == ["int3-g64", "-", "-"]
    assert rows[NAMES["int4-row"]][-3:] == ["int4-row", "-", "-"]
    assert rows[NAMES["int8-row"] + ".qs"][-3:] == ["(scale)", "-", "-"]
    assert rows["model.layers.0.mlp.experts.2.down_proj.weight_packed"][-3:] == ["mxfp4", "-", "-"]
    assert rows["model.layers.0.mlp.shared_experts.up_proj.weight"][-3:] == [
        "fp8",  # the format column uses the one vocabulary; the stamp column shows the stored stamp
        "-",
        "fp8-e4m3-b128",
    ]
    assert rows["model.norm.weight"][-3:] == ["f32", "-", "-"]
    totals = {
        line.split()[0]: line.split()[1:] for line in result.stdout.split("format  ")[-1].splitlines()[1:]
    }
    assert totals == {
        "f32": ["1", "512"],
        "fp8": ["1", "520"],
        "int3-g64": ["1", str(8 * 2 * 24 + 8 * 2 * 4)],
        "int4-g32": ["1", str(512 + 8 * 4 * 4)],
        "int4-g64": ["1", str(512 + 8 * 2 * 4)],
        "int4-row": ["1", str(512 + 32)],
        "int8-row": ["1", "1,056"],
        "mxfp4": ["1", "544"],
    }
    assert "layout pairs" in result.stdout.splitlines()[0]


def test_inspect_json_for_scripts(quantized_file):
    result = run("inspect", "--json", quantized_file)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    by_tensor = {t["name"]: t for t in report["tensors"]}
    assert (by_tensor[NAMES["int4-g32"]]["format"], by_tensor[NAMES["int4-g32"]]["group_size"]) == (
        "int4-grouped",
        32,
    )
    assert by_tensor["model.layers.0.mlp.shared_experts.up_proj.weight"]["fmt"] == 8
    assert {t["format"]: t["tensors"] for t in report["totals"]}["int4-g64"] == 1
    assert report["layout"] == "pairs" and len(report["shards"]) == 1


def test_inspect_summary_omits_tensor_rows(quantized_file):
    result = run("inspect", "--summary", quantized_file)
    assert result.returncode == 0 and "model.norm.weight" not in result.stdout and "int4-g64" in result.stdout


def test_formats_command_table_and_json():
    result = run("formats")
    assert result.returncode == 0, result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines()[1:10]}
    assert "O * ceil(I/64) * 24" in lines["int3-g64"] and "3.5" in lines["int3-g64"]
    assert "ceil(O/128) * ceil(I/128) * 4" in lines["fp8-e4m3-b128"]
    assert "4.5" in lines["int4-grouped"] and "O * ceil(I/gs) * 4" in lines["int4-grouped"]
    rows = json.loads(run("formats", "--json").stdout)
    assert [r["ord"] for r in rows] == [*range(10), 101, 102, 103, 104]  # DeepSeek-V4.1's FP8 grids: colibri's private block
    assert rows[9] == {
        "ord": 9, "name": "fp8-e4m3-e8m0", "bits_per_weight": rows[9]["bits_per_weight"], "weight_bytes": "O * I",
        "scale_bytes": "ceil(O/128) * ceil(I/128)", "scale_tensor": "<base>.scale F8_E8M0", "group_sizes": None,
        "written": True, "options": ["fp8-e8m0"],
    }  # fmt: skip
    assert abs(rows[9]["bits_per_weight"] - 8 * (1 + 1 / 128**2)) < 1e-3
    t32, r32 = rows[10], rows[11]
    assert (t32["name"], t32["scale_bytes"], t32["scale_tensor"], t32["options"]) == (
        "fp8-e4m3-e8m0-t32", "ceil(O/32) * ceil(I/32)", "<base>.scale F8_E8M0", ["fp8-e8m0-t32"]
    )
    assert (r32["name"], r32["scale_bytes"], r32["options"]) == ("fp8-e4m3-e8m0-r32", "O * ceil(I/32)", ["fp8-e8m0-r32"])
    assert abs(t32["bits_per_weight"] - 8 * (1 + 1 / 32**2)) < 1e-3 and abs(r32["bits_per_weight"] - 8.25) < 1e-3
    assert rows[7] == {
        "ord": 7, "name": "mxfp4", "bits_per_weight": 4.25, "weight_bytes": "O * I/2", "scale_bytes": "O * I/32",
        "scale_tensor": "<base>.weight_scale U8 (E8M0)", "group_sizes": None, "written": True,
        "options": ["mxfp4"],
    }  # fmt: skip
