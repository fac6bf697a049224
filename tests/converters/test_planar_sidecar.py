"""``--layout planar`` writes the experts-int4g64/ sidecar exactly as docs/FORMATS.md §4 (amended) says, following
colibri's ``c/tools/convert_qwen38_experts_int4.py`` (``layer_header``, ``new_index``, ``write_index``).

The header checks parse the raw bytes here (struct + json with pair order kept), independently of colitools'
reader; codes are checked against the numpy reference encoder reordered by ``pairs_to_planar``.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
from convcheck import listing, snapshot
from midkill import sigkill_mid_file
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.inspect import inspect_path
from colitools.formats.planar import pairs_to_planar
from colitools.formats.registry import by_name
from colitools.mirror.scan import discover_shards
from colitools.verify.container import verify_container

SPEC = Tiny(layers=3, experts=4, hidden=128, inter=64, shards=2)
INDEX_KEYS = [
    "format", "version", "complete", "group_size", "codes", "scales", "layers", "experts", "hidden_size",
    "moe_intermediate_size", "prefix", "record_bytes", "record", "quantizer", "files", "done", "source",
]  # fmt: skip
PROJ = ("gate", "up", "down")


@pytest.fixture(scope="module")
def planar(tmp_path_factory):
    root = tmp_path_factory.mktemp("planar")
    tensors = make_checkpoint(root / "src", SPEC)
    convert(str(root / "src"), root / "out", ConvertOptions(layout="planar", min_free_gb=0))
    return root / "src", root / "out", tensors


def _raw_header(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    text = raw[8 : 8 + n]
    pairs = json.loads(text, object_pairs_hook=lambda p: p)
    return raw, n, text, pairs


def test_layer_file_header_bytes_entries_first_metadata_last_aligned(planar):
    _, out, _ = planar
    side = out / "experts-int4g64"
    assert sorted(p.name for p in side.iterdir()) == [
        "index.json", "layer-000.safetensors", "layer-001.safetensors", "layer-002.safetensors",
    ]  # fmt: skip
    H, W, E = SPEC.hidden, SPEC.inter, SPEC.experts
    record = 3 * H * W // 2 + 4 * 3 * H * W // 64
    for L in range(3):
        raw, n, text, pairs = _raw_header(side / f"layer-{L:03d}.safetensors")
        assert (8 + n) % 4096 == 0
        body = text.rstrip(b" ")
        assert text[len(body) :] == b" " * (n - len(body))  # space padding only
        # compact JSON (colibri: json.dumps(header, separators=(",", ":"))), __metadata__ the last key
        assert (
            body
            == json.dumps(
                {k: (dict(v) if k == "__metadata__" else {kk: vv for kk, vv in v}) for k, v in pairs},
                separators=(",", ":"),
            ).encode()
        )
        assert [k for k, _ in pairs][-1] == "__metadata__"
        assert pairs[-1][1] == [
            ("format", "colibri.qwen38.experts-int4g64"),
            ("version", "1"),
            ("layer", str(L)),
        ]
        entries = pairs[:-1]
        assert len(entries) == 6 * E
        at = 0
        for e in range(E):
            x = f"model.layers.{L}.mlp.experts.{e}"
            want = [f"{x}.{p}_proj.weight" for p in PROJ] + [f"{x}.{p}_proj.weight.qs" for p in PROJ]
            shapes = [[W, H // 2], [W, H // 2], [H, W // 2], [W, H // 64], [W, H // 64], [H, W // 64]]
            got = entries[6 * e : 6 * e + 6]
            assert [k for k, _ in got] == want
            assert at == e * record  # records back to back, in expert order
            for k, (_, v) in enumerate(got):
                v = dict(v)
                assert v["dtype"] == ("U8" if k < 3 else "F32") and v["shape"] == shapes[k]
                assert v["data_offsets"][0] == at
                at = v["data_offsets"][1]
        assert at == E * record and len(raw) == 8 + n + at  # data to the end of the file


def test_index_json_keys_values_and_bytes(planar):
    _, out, _ = planar
    raw = (out / "experts-int4g64/index.json").read_bytes()
    keys = json.loads(raw, object_pairs_hook=lambda p: [k for k, _ in p])
    assert keys == INDEX_KEYS
    index = json.loads(raw)
    assert raw == (json.dumps(index, indent=1) + "\n").encode()  # colibri: json.dump(indent=1) + "\n"
    H, W = SPEC.hidden, SPEC.inter
    assert index["format"] == "colibri.qwen38.experts-int4g64" and index["version"] == 1
    assert type(index["version"]) is int and index["complete"] is True
    assert (index["group_size"], index["codes"], index["scales"]) == (64, "planar64-v8", "f32-per-64")
    assert (index["layers"], index["experts"], index["hidden_size"], index["moe_intermediate_size"]) == (
        3, 4, H, W,
    )  # fmt: skip
    assert index["prefix"] == "model"
    assert index["record_bytes"] == 2 * W * H // 2 + H * W // 2 + 4 * (2 * W * H // 64 + H * W // 64)
    assert index["record"] == [
        "gate codes",
        "up codes",
        "down codes",
        "gate scales",
        "up scales",
        "down scales",
    ]
    assert index["files"] == ["layer-000.safetensors", "layer-001.safetensors", "layer-002.safetensors"]
    assert index["done"] == [0, 1, 2]  # colibri's verifier: done == list(range(layers))
    assert set(index["source"]) == {"config_sha256", "shards"}


def test_codes_are_planar_reference_codes_and_scales_per_64_block(planar):
    _, out, tensors = planar
    f = out / "experts-int4g64/layer-001.safetensors"
    raw, n, _, pairs = _raw_header(f)
    entries = {k: dict(v) for k, v in pairs[:-1]}
    x = "model.layers.1.mlp.experts.2"
    for p, gs in (("gate", 64), ("down", None)):  # gate I = 128: int4-g64; down I = 64: int4-row
        name = f"{x}.{p}_proj.weight"
        w = np.asarray(tensors[name], dtype=np.float32)
        fmt = by_name("int4-grouped" if gs else "int4-row")
        codes, scales = fmt.encode(w, gs, name=name, fast=False)
        b, e = entries[name]["data_offsets"]
        assert raw[8 + n + b : 8 + n + e] == pairs_to_planar(codes).tobytes()
        b, e = entries[name + ".qs"]["data_offsets"]
        stored = np.frombuffer(raw[8 + n + b : 8 + n + e], "<f4").reshape(w.shape[0], w.shape[1] // 64)
        want = scales.reshape(w.shape[0], -1)
        assert np.array_equal(stored, np.broadcast_to(want, stored.shape))


def test_main_container_holds_no_routed_expert(planar):
    _, out, _ = planar
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert not any(".experts." in n for n in index["weight_map"])
    assert all(not v.startswith("experts-int4g64") for v in index["weight_map"].values())
    for shard in set(index["weight_map"].values()):
        _, _, _, pairs = _raw_header(out / shard)
        assert not any(".experts." in k for k, _ in pairs)
        assert "planar" not in json.dumps(pairs)


def test_inspect_lists_the_sidecar_tensors(planar):
    _, out, _ = planar
    report = inspect_path(out)
    side = [t for t in report.tensors if "experts-int4g64" in t.file]
    assert len(side) == 3 * SPEC.experts * 6
    assert all(t.layout == "planar64-v8" for t in side)
    assert {t.format.label for t in side if t.kind == "quantized"} == {"int4-g64", "int4-row"}
    assert report.layout == "pairs + sidecar planar64-v8" and len(report.sidecar) == 3


def test_verify_container_checks_the_sidecar(planar, tmp_path):
    import shutil

    _, out, _ = planar
    assert verify_container(out).ok
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    side = bad / "experts-int4g64"
    # a scale turned to NaN in a layer file (same size): reported as non-finite and as a sha256 mismatch
    f = side / "layer-001.safetensors"
    raw, n, _, pairs = _raw_header(f)
    b, _ = dict(dict(pairs[:-1])["model.layers.1.mlp.experts.3.up_proj.weight.qs"])["data_offsets"]
    with open(f, "r+b") as fh:
        fh.seek(8 + n + b)
        fh.write(np.float32(np.nan).tobytes())
    problems = verify_container(bad).problems
    assert any("layer-001.safetensors" in p and "non-finite" in p for p in problems), problems
    assert any("layer-001.safetensors" in p and "sha256" in p for p in problems), problems
    # an index that is not complete, and one with a key missing
    index = json.loads((side / "index.json").read_text())
    (side / "index.json").write_text(json.dumps({**index, "complete": False}, indent=1))
    assert any("not complete" in p for p in verify_container(bad).problems)
    (side / "index.json").write_text(json.dumps({k: v for k, v in index.items() if k != "quantizer"}))
    assert any("keys are" in p for p in verify_container(bad).problems)
    # a layer file whose __metadata__ moved first (what the generic writer would do)
    (side / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    f = side / "layer-002.safetensors"
    raw, n, _, pairs = _raw_header(f)
    moved = {"__metadata__": dict(pairs[-1][1]), **{k: dict(v) for k, v in pairs[:-1]}}
    text = json.dumps(moved, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    f.write_bytes(raw[:8] + text + raw[8 + n :])
    problems = verify_container(bad).problems
    assert any("layer-002.safetensors" in p and "__metadata__ is not the last" in p for p in problems), (
        problems
    )
    # a missing layer file
    f.unlink()
    assert any("layer-002.safetensors" in p and "missing" in p for p in verify_container(bad).problems)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("files", 3, "files is 3, expected a list"),
        ("done", "all", 'done is "all", expected a list'),
        ("files", ["../layer-000.safetensors"], "expected a list of layer-NNN.safetensors names"),
        ("prefix", "model\udfff", "is not Unicode text"),
    ],
)
def test_a_malformed_sidecar_index_is_a_problem_never_a_traceback(planar, tmp_path, key, value, words):
    import shutil

    _, out, _ = planar
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    index_path = bad / "experts-int4g64" / "index.json"
    index = json.loads(index_path.read_text())
    index_path.write_text(json.dumps({**index, key: value}, indent=1))  # ensure_ascii: "\udfff" stays an escape
    problems = verify_container(bad).problems
    assert any(words in p for p in problems), problems


def test_mirror_scan_counts_sidecar_files_as_expert_bytes(planar):
    _, out, _ = planar
    shards = {s.name: s for s in discover_shards([out])}
    side = [s for n, s in shards.items() if n.startswith("experts-int4g64/")]
    assert [s.name for s in side] == [f"experts-int4g64/layer-00{L}.safetensors" for L in range(3)]
    index = json.loads((out / "experts-int4g64/index.json").read_text())
    for L, s in enumerate(side):
        assert s.layout == "planar64-v8"
        assert s.expert_bytes == {(L, e): index["record_bytes"] for e in range(SPEC.experts)}
        assert s.routed == {(L, e) for e in range(SPEC.experts)}
    assert not any(s.expert_bytes for n, s in shards.items() if not n.startswith("experts-int4g64/"))


def test_index_is_complete_only_after_the_last_layer_file_is_published(planar, tmp_path):
    src, ref_out, _ = planar
    out = tmp_path / "out"
    # main shards: 2 (globals, layer 0's rest) ... the files are published in plan order; the last sidecar
    # file is the last file of all (layer 2's experts)
    manifest = json.loads((ref_out / "colitools.json").read_text())
    files = [f["name"] for f in manifest["plan"]["files"]]
    last = files.index("experts-int4g64/layer-002.safetensors") + 1
    done = subprocess.run(
        [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0",
         "--layout", "planar"],
        env={**os.environ, "COLITOOLS_TEST_KILL_AT": f"published:{last}"}, capture_output=True,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    assert (out / "experts-int4g64/layer-002.safetensors").exists()
    index = json.loads((out / "experts-int4g64/index.json").read_text())
    assert index["complete"] is False and 2 not in index["done"]
    assert any("not complete" in p for p in verify_container(out, hashes=False).problems)


@pytest.mark.parametrize("knob", ["COLITOOLS_TEST_SLOW_TENSOR_SECONDS", "COLITOOLS_TEST_KILL_AT"])
def test_sigkill_then_resume_is_byte_identical(planar, tmp_path, knob):
    src, ref_out, _ = planar
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0",
           "--layout", "planar"]  # fmt: skip
    if knob == "COLITOOLS_TEST_KILL_AT":  # right after the first sidecar file is published, before the ledger
        files = [f["name"] for f in json.loads((ref_out / "colitools.json").read_text())["plan"]["files"]]
        env = {knob: f"published:{files.index('experts-int4g64/layer-000.safetensors') + 1}"}
        assert (
            subprocess.run(cmd, env={**os.environ, **env}, capture_output=True).returncode == -signal.SIGKILL
        )
    else:  # mid-unit: a sidecar layer file is being written
        proc = subprocess.Popen(cmd, env={**os.environ, knob: "0.05"}, stderr=subprocess.DEVNULL)
        assert sigkill_mid_file(proc, out / "experts-int4g64", "layer-")  # a partial layer file was left behind
    subprocess.run(cmd, check=True, capture_output=True)
    assert snapshot(out) == snapshot(ref_out) and listing(out) == listing(ref_out)
    assert verify_container(out).ok
