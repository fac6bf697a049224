"""``convert --target qwen36``: colibri's Qwen3.5/3.6 engine layout (c/qwen36.c), written and read back by colitools.

Facts followed (colibri, read for facts only): ``c/tools/convert_qwen36.py`` ``make_merged`` builds one blob per
routed expert, ``model.layers.{L}.mlp.experts.{E}.merged_weight``: gate | up | down ``quantize_row`` codes
(``--ebits 8``: int8, ``row_max.clamp(1e-12) / 127``, ``round`` clamped to [-128, 127]; ``--ebits 4``:
``row_max / 7`` clamped to [-8, 7], the whole flattened blob packed by ``pack_int4``: byte k = (v[2k] & 0xF) |
(v[2k+1] & 0xF) << 4) or ``quantize_row_grouped`` (``--gs``: one scale per ``gs`` inputs, ``qwen36_meta.json``
``expert_gs``), and ``...experts.{E}.qs`` = gate | up | down scales (F32). Every other tensor is renamed
``model.language_model.`` -> ``model.`` and kept float (``c/qwen36.c`` ``load_t_n`` reads it through
``st_read_f32``); ``visual.*`` is skipped; ``config.json`` is the flat text config (the source's is
``config.hf.json``); ``qwen36_meta.json`` carries the keys ``load_meta`` reads. ``load_expert_merged`` tells int8
(``3*I*H`` bytes) from int4 (half that) by size and unpacks int4 with ``unpack_int4_to_int8`` (sign-extended
nibbles, low nibble first).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from convcheck import stored_tensors as _tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ColitoolsError, ConvertError
from colitools.formats.safetensors_io import SafetensorsFile

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
FIXTURE = ORACLES / "qwen3_5_moe"
RECIPES = {  # output folder -> --experts (the converter's --ebits / --gs)
    "int8": "int8-row",  # --ebits 8
    "int4": "int4-row",  # --ebits 4 (the default of both)
    "int4g32": "int4-g32",  # --ebits 4 --gs 32
}


def _convert(dest: Path, **kw) -> Path:
    convert(str(FIXTURE), dest, ConvertOptions(progress=False, min_free_gb=0.0, **kw))
    return dest


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-qwen36")
    out = {name: _convert(root / name, target="qwen36", experts=experts) for name, experts in RECIPES.items()}
    out["generic-int4"] = _convert(root / "generic-int4", experts="int4-row", dense="f32", embed="f32")
    return out


@pytest.fixture(scope="module")
def source():
    with SafetensorsFile(FIXTURE / "model.safetensors") as src:
        return {n: src.read(n) for n in src.tensors}


def _text_config():
    return json.loads((FIXTURE / "config.json").read_text())["text_config"]


# -------------------------------------------------- a re-statement of convert_qwen36.py (numpy, torch semantics)
def _quantize_row(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    qmax = (1 << (bits - 1)) - 1
    w = w.astype(np.float32)
    scales = np.maximum(np.abs(w).max(axis=1, keepdims=True), np.float32(1e-12)) / np.float32(qmax)
    return np.clip(np.rint(w / scales), -qmax - 1, qmax).astype(np.int8), scales[:, 0].astype(np.float32)


def _quantize_row_grouped(w: np.ndarray, bits: int, gs: int) -> tuple[np.ndarray, np.ndarray]:
    qmax = (1 << (bits - 1)) - 1
    O, I = w.shape
    pad = (-I) % gs
    g = np.pad(w.astype(np.float32), ((0, 0), (0, pad))).reshape(O, -1, gs)
    scales = np.maximum(np.abs(g).max(axis=2, keepdims=True), np.float32(1e-12)) / np.float32(qmax)
    q = np.clip(np.rint(g / scales), -qmax - 1, qmax).astype(np.int8).reshape(O, -1)[:, :I]
    return q, scales.reshape(O, -1).astype(np.float32)


def _pack_int4(q: np.ndarray) -> np.ndarray:
    q = np.clip(q.astype(np.int16), -8, 7)
    if q.size % 2:
        q = np.concatenate([q, np.zeros(1, np.int16)])
    return ((q[0::2] & 0xF) | ((q[1::2] & 0xF) << 4)).astype(np.uint8)


def _make_merged(gate, up, down, ebits, gs=0):
    def quant(t):
        if gs:
            q, s = _quantize_row_grouped(t, ebits, gs)
            return q, s.reshape(-1)
        return _quantize_row(t, ebits)

    (gq, gsc), (uq, usc), (dq, dsc) = quant(gate), quant(up), quant(down)
    flat = np.concatenate([gq.reshape(-1), uq.reshape(-1), dq.reshape(-1)])
    blob = _pack_int4(flat) if ebits <= 4 else flat.astype(np.int8)
    return blob, np.concatenate([gsc, usc, dsc]).astype(np.float32)


def _unpack_int4_to_int8(raw: np.ndarray) -> np.ndarray:
    """c/qwen36.c unpack_int4_to_int8: out[2b] = (int8)(byte << 4) >> 4, out[2b+1] = (int8)(byte & 0xF0) >> 4."""
    raw = raw.astype(np.uint8)
    lo = ((raw << 4).astype(np.uint8).view(np.int8) >> 4).astype(np.int8)
    hi = ((raw & 0xF0).astype(np.uint8).view(np.int8) >> 4).astype(np.int8)
    return np.stack([lo, hi], axis=1).reshape(-1)


# ---------------------------------------------------------------------------------------------------- bytes
@pytest.mark.parametrize(("folder", "ebits", "gs"), [("int8", 8, 0), ("int4", 4, 0), ("int4g32", 4, 32)])
def test_merged_blobs_are_make_merged_bytes(outputs, source, folder, ebits, gs):
    got = _tensors(outputs[folder])
    c = _text_config()
    H, I, E, L = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["num_hidden_layers"]
    n_scales = 2 * I * -(-H // gs) + H * -(-I // gs) if gs else 2 * I + H
    for layer in range(L):
        for e in range(E):
            src = f"model.language_model.layers.{layer}.mlp.experts.{e}"
            gate, up, down = (source[f"{src}.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj"))
            blob_ref, qs_ref = _make_merged(gate, up, down, ebits, gs)
            base = f"model.layers.{layer}.mlp.experts.{e}"
            dtype, shape, blob = got[f"{base}.merged_weight"]
            sdtype, sshape, qs = got[f"{base}.qs"]
            nbytes = 3 * I * H if ebits == 8 else 3 * I * H // 2
            assert (dtype, shape, sdtype, sshape) == (
                "I8" if ebits == 8 else "U8",
                (nbytes,),
                "F32",
                (n_scales,),
            )
            assert blob.tobytes() == blob_ref.tobytes(), base
            assert qs.tobytes() == qs_ref.tobytes(), base
            if ebits == 4:  # the loader's decode of those bytes is the converter's integers
                codes = _unpack_int4_to_int8(blob)
                q = np.concatenate([_quantize_row_grouped(t, 4, gs)[0].reshape(-1) if gs else
                                    _quantize_row(t, 4)[0].reshape(-1) for t in (gate, up, down)])  # fmt: skip
                assert np.array_equal(codes, q)


def test_every_other_tensor_is_renamed_and_float(outputs, source):
    got = _tensors(outputs["int4"])
    others = {n: t for n, t in got.items() if ".mlp.experts." not in n}
    expected = {}
    for name, value in source.items():
        if name.startswith("model.visual.") or ".mlp.experts." in name:
            continue  # visual.* skipped as convert_qwen36.py skips it; experts are blobs
        expected[name.replace("model.language_model.", "model.")] = value
    assert sorted(others) == sorted(expected)
    assert not any(n.startswith(("model.language_model.", "model.visual.")) for n in got)
    for name, value in expected.items():
        dtype, shape, data = others[name]
        assert (
            dtype == "F32" and shape == value.shape and data.tobytes() == value.astype(np.float32).tobytes()
        ), name
    # exactly two tensors per routed expert besides them
    c = _text_config()
    assert len(got) == len(expected) + 2 * c["num_experts"] * c["num_hidden_layers"]


def test_config_is_flat_and_the_source_config_is_kept(outputs):
    out = outputs["int4"]
    src = json.loads((FIXTURE / "config.json").read_text())
    assert json.loads((out / "config.json").read_text()) == src["text_config"]
    assert json.loads((out / "config.hf.json").read_text()) == src
    manifest = json.loads((out / "colitools.json").read_text())
    assert manifest["recipe"]["target"] == "qwen36" and manifest["recipe"]["towers"] == "drop"


def test_meta_json_has_load_meta_keys(outputs):
    # hand-derived from the fixture: config.json text_config and the layer-1 (full attention) weight shapes
    # q_proj [128, 64] (4 heads -> 32 = 2 * head_dim 16: the output gate), k/v_proj [32, 64] (2 heads -> 16),
    # o_proj [64, 64], q_norm [16]; DeltaNet 2 key heads x 16, 4 value heads x 16, kernel 4
    want = {
        "model_type": "qwen3_5_moe", "hidden": 64, "n_layers": 2, "n_active": 2,
        "layer_types": ["linear_attention", "full_attention"], "num_experts": 4, "topk": 2, "moe_inter": 64,
        "shared_inter": 64, "rms_eps": 1e-06, "ebits": 4, "scoring_func": "softmax", "n_group": 1,
        "topk_group": 1, "norm_topk_prob": True, "attn_output_gate": True, "rope_theta": 10000.0,
        "mrope_section": [16, 16, 16], "partial_rotary_factor": 0.25, "q_heads": 4, "kv_heads": 2,
        "q_head_dim": 32, "k_head_dim": 16, "v_head_dim": 16, "o_in": 64, "qk_rope_head_dim": 16,
        "head_dim": 16, "rope_dim": 16, "expert_gs": 0, "dn_vheads": 4, "dn_kheads": 2, "dn_kdim": 16,
        "dn_vdim": 16, "dn_convk": 4, "dn_conv_dim": 2 * 2 * 16 + 4 * 16,
    }  # fmt: skip
    assert json.loads((outputs["int4"] / "qwen36_meta.json").read_text()) == want
    assert json.loads((outputs["int8"] / "qwen36_meta.json").read_text()) == {**want, "ebits": 8}
    assert json.loads((outputs["int4g32"] / "qwen36_meta.json").read_text()) == {**want, "expert_gs": 32}


# -------------------------------------------------------------------------------------------------- readers
@pytest.mark.parametrize(
    ("folder", "label"), [("int8", "int8-row"), ("int4", "int4-row"), ("int4g32", "int4-g32")]
)
def test_inspect_and_verify_read_the_blobs(outputs, folder, label):
    from colitools.formats.inspect import inspect_path
    from colitools.verify.container import verify_container

    out = outputs[folder]
    report = verify_container(out)
    assert report.ok, report.problems
    assert report.formats == {"f32": 32, label: 8}
    inspected = inspect_path(out)
    merged = [t for t in inspected.tensors if t.name.endswith(".merged_weight")]
    assert len(merged) == 8 and all(t.kind == "quantized" and t.format.label == label for t in merged)
    assert [(p.projection, p.O, p.I) for p in merged[0].parts] == [
        ("gate", 64, 64),
        ("up", 64, 64),
        ("down", 64, 64),
    ]
    assert not inspected.unresolved


@pytest.mark.parametrize("folder", ["int4", "int4g32", "int8"])
def test_checkpoint_decodes_each_part_as_the_loader_does(outputs, folder):
    """Each gate / up / down part, read by the runtime's Checkpoint, is the loader's dequantisation of its bytes."""
    from colitools.runtime.weights import Checkpoint

    out = outputs[folder]
    config = json.loads((out / "config.json").read_text())
    ckpt = Checkpoint(out, config)
    got = _tensors(out)
    H, I = 64, 64
    gs = {"int4": 0, "int4g32": 32, "int8": 0}[folder]
    for layer in range(2):
        for e in range(4):
            base = f"model.layers.{layer}.mlp.experts.{e}"
            blob, qs = got[f"{base}.merged_weight"][2], got[f"{base}.qs"][2]
            q = (
                blob.view(np.int8) if folder == "int8" else _unpack_int4_to_int8(blob)
            )  # the loader's int8 slab
            offs, soffs = 0, 0
            for proj, (O, In) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                ng = -(-In // gs) if gs else 1
                part = q[offs : offs + O * In].reshape(O, In).astype(np.float32)
                s = qs[soffs : soffs + O * ng].reshape(O, ng)
                want = part * np.repeat(s, gs, axis=1)[:, :In] if gs else part * s  # matmul_q / matmul_q_gs
                offs, soffs = offs + O * In, soffs + O * ng
                decoded = ckpt.dense(f"{base}.{proj}.weight", O, In)
                assert np.array_equal(decoded, want), (base, proj)


def test_int4_parts_decode_like_the_generic_container_of_the_same_recipe(outputs):
    from colitools.runtime.weights import Checkpoint

    target = Checkpoint(outputs["int4"], json.loads((outputs["int4"] / "config.json").read_text()))
    generic = Checkpoint(
        outputs["generic-int4"], json.loads((outputs["generic-int4"] / "config.json").read_text())
    )
    for layer in range(2):
        for e in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                a = target.dense(f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight", 64, 64)
                b = generic.dense(
                    f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight", 64, 64
                )  # canonical name
                assert np.array_equal(a, b)


def test_group_sizes_with_equal_counts_need_the_meta(outputs, tmp_path):
    """int4-g32 and int4-g48 both give 2 groups per row at width 64: load_expert_merged reads expert_gs from
    qwen36_meta.json, and so do colitools' readers; without it they refuse rather than guess."""
    from colitools.formats.container import resolve_container
    from colitools.formats.inspect import open_model

    copy = tmp_path / "copy"
    shutil.copytree(outputs["int4g32"], copy)
    model = open_model(copy)
    assert model.merged_group_size == 32
    resolved = resolve_container(model.shards, config=model.config, merged_group_size=32)
    assert resolved["model.layers.0.mlp.experts.0.merged_weight"].format.label == "int4-g32"
    resolved = resolve_container(model.shards, config=model.config, merged_group_size=48)  # also 2 groups
    assert resolved["model.layers.0.mlp.experts.0.merged_weight"].format.label == "int4-g48"
    with pytest.raises(
        ColitoolsError, match=r"merged expert blob .*merged_weight is 6144 bytes with 384 scales"
    ):
        resolve_container(model.shards, config=model.config)
    (copy / "qwen36_meta.json").unlink()
    from colitools.verify.container import verify_container

    report = verify_container(copy)
    assert not report.ok and any("merged expert blob" in p and "expert_gs" in p for p in report.problems)
    (copy / "qwen36_meta.json").write_text(json.dumps({"expert_gs": "32"}))
    with pytest.raises(ColitoolsError, match="expert_gs must be a non-negative integer"):
        open_model(copy)


def test_mirror_scan_and_plan_count_merged_blobs_as_expert_bytes(outputs, tmp_path):
    from colitools.formats.usage import UsageHistory, engine_id, write_usage
    from colitools.mirror.plan import plan_mirror
    from colitools.mirror.scan import discover_shards, model_geometry

    out = tmp_path / "model"
    shutil.copytree(outputs["int4"], out)
    shards = discover_shards([out])
    per_expert: dict[tuple[int, int], int] = {}
    routed = {}
    for shard in shards:
        for key, n in shard.expert_bytes.items():
            per_expert[key] = per_expert.get(key, 0) + n
        routed.update({key: shard.name for key in shard.routed})
    # one blob of 3*64*64/2 bytes and 2*64+64 F32 scales per expert, 2 layers x 4 experts; layer L in shard L+2
    record = 3 * 64 * 64 // 2 + 4 * (2 * 64 + 64)
    assert per_expert == {(layer, e): record for layer in range(2) for e in range(4)}
    assert routed == {
        (layer, e): f"model-0000{layer + 2}-of-00003.safetensors" for layer in range(2) for e in range(4)
    }
    geometry = model_geometry(out)
    assert (geometry.n_layers, geometry.n_experts) == (2, 4)
    history = UsageHistory(2, 4, engine_id(geometry.engine))
    history.add(0, 1, 5)
    history.add(1, 2, 1)
    write_usage(out / ".coli_usage", history)
    sizes = {s.name: s.size for s in shards}
    plan = plan_mirror(out, tmp_path / "mirror", budget_bytes=sizes["model-00002-of-00003.safetensors"],
                       reserve_bytes=0)  # fmt: skip
    data = plan.to_json()
    assert [f["name"] for f in data["files"]] == ["model-00002-of-00003.safetensors"]
    assert data["files"][0]["weighted_expert_bytes"] == 5 * record


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(experts="int3-g64"), "`experts=int3-g64` is refused"),
        (dict(experts="mxfp4"), "`experts=mxfp4` is refused"),
        (dict(experts="int2-row"), "`experts=int2-row` is refused"),
        (dict(dense="int8-row"), "`dense=int8-row` is refused"),
        (dict(embed="int4-row"), "`embed=int4-row` is refused"),
        (dict(layout="planar"), "`layout=planar` is refused"),
    ],
)
def test_recipes_the_loader_cannot_read_are_refused_in_one_line(tmp_path, options, says):
    with pytest.raises(ConvertError) as info:
        _convert(tmp_path / "out", target="qwen36", **options)
    message = str(info.value)
    assert says in message and "c/qwen36.c" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_another_model_type_is_refused_before_work_starts(tmp_path):
    with pytest.raises(
        ConvertError, match=r"`target=qwen36` is for model_type qwen3_5_moe, qwen3_5_moe_text "
    ):
        convert(str(ORACLES / "qwen3_moe"), tmp_path / "out", ConvertOptions(target="qwen36", progress=False))
    assert not any((tmp_path / "out").glob("*.safetensors"))


def test_cli_refusals_are_one_line_exit_2_before_work(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    out = tmp_path / "out"
    r = run_cli("convert", ORACLES / "qwen3_moe", out, "--target", "qwen36", "--min-free-gb", "0")
    one_line_error(r, "--target qwen36 is for model_type", "'qwen3_moe'", code=2)
    r = run_cli("convert", FIXTURE, out, "--target", "qwen36", "--experts", "int3-g64", "--min-free-gb", "0")
    one_line_error(r, "--experts int3-g64 is refused", "c/qwen36.c", code=2)
    r = run_cli("convert", FIXTURE, out, "--target", "nope")
    one_line_error(r, "--target 'nope': choose one of generic, olmoe, qwen36", code=2)
    assert not out.exists() or not any(out.glob("*.safetensors"))


def test_a_rerun_redoes_a_missing_shard_and_writes_the_same_bytes(outputs, tmp_path):
    import hashlib

    copy = tmp_path / "copy"
    shutil.copytree(outputs["int4g32"], copy)

    def digests():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in copy.iterdir() if p.is_file()}

    before = digests()
    (copy / "model-00002-of-00003.safetensors").unlink()
    (copy / "qwen36_meta.json").unlink()
    _convert(copy, target="qwen36", experts="int4-g32")
    after = digests()
    assert {k: v for k, v in after.items() if k != "colitools.json"} == {
        k: v for k, v in before.items() if k != "colitools.json"
    }


def test_a_fused_expert_source_gives_the_same_blobs(outputs, source, tmp_path):
    """The released Qwen3.5/3.6 checkpoints ship fused ``mlp.experts.gate_up_proj [E, 2I, H]`` (gate rows first)
    and ``down_proj [E, H, I]``, which convert_qwen36.py splits per expert: the same blobs as per-expert tensors."""
    from colitools.formats.safetensors_io import write_safetensors

    fused = {n: v for n, v in source.items() if ".mlp.experts." not in n}
    for layer in range(2):
        base = f"model.language_model.layers.{layer}.mlp.experts"
        gate_up = [np.concatenate([source[f"{base}.{e}.gate_proj.weight"], source[f"{base}.{e}.up_proj.weight"]])
                   for e in range(4)]  # fmt: skip
        fused[f"{base}.gate_up_proj"] = np.stack(gate_up)
        fused[f"{base}.down_proj"] = np.stack([source[f"{base}.{e}.down_proj.weight"] for e in range(4)])
    src = tmp_path / "fused-src"
    src.mkdir()
    write_safetensors(src / "model.safetensors", fused)
    shutil.copy(FIXTURE / "config.json", src / "config.json")
    out = tmp_path / "out"
    convert(str(src), out, ConvertOptions(progress=False, min_free_gb=0.0, target="qwen36"))
    got, want = _tensors(out), _tensors(outputs["int4"])
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name][2].tobytes() == want[name][2].tobytes(), name


def test_a_part_narrower_than_the_group_size_shares_the_blob_group_size(source, tmp_path):
    """hidden 64, expert width 32, --experts int4-g32: gate / up get two groups per row, down (width 32) one,
    which colitools writes int4-row: the blob is still make_merged(..., ebits 4, gs 32) and expert_gs is 32."""
    from colitools.formats.safetensors_io import write_safetensors
    from colitools.verify.container import verify_container

    narrow = {}
    for name, value in source.items():
        if ".mlp.experts." in name:
            value = value[:, :32] if name.endswith("down_proj.weight") else value[:32]
        narrow[name] = np.ascontiguousarray(value)
    src = tmp_path / "src"
    src.mkdir()
    write_safetensors(src / "model.safetensors", narrow)
    config = json.loads((FIXTURE / "config.json").read_text())
    config["text_config"]["moe_intermediate_size"] = 32
    (src / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    convert(
        str(src), out, ConvertOptions(progress=False, min_free_gb=0.0, target="qwen36", experts="int4-g32")
    )
    got = _tensors(out)
    for layer in range(2):
        for e in range(4):
            base = f"model.language_model.layers.{layer}.mlp.experts.{e}"
            parts = (narrow[f"{base}.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj"))
            blob_ref, qs_ref = _make_merged(*parts, 4, 32)
            mine = f"model.layers.{layer}.mlp.experts.{e}"
            assert got[f"{mine}.merged_weight"][2].tobytes() == blob_ref.tobytes()
            assert got[f"{mine}.qs"][2].tobytes() == qs_ref.tobytes() and qs_ref.size == 2 * 32 * 2 + 64
    assert json.loads((out / "qwen36_meta.json").read_text())["expert_gs"] == 32
    report = verify_container(out)
    assert report.ok, report.problems
    assert report.formats["int4-g32"] == 8


def test_readers_accept_a_container_written_as_convert_qwen36_writes_it(source, tmp_path):
    """colibri's own converter's output, restated here (not colitools' writer): globals in model-globals.safetensors
    and one model-{a:05d}.safetensors per layer, F16 dense tensors, int4 merged blobs (--ebits 4), no index, no
    metadata, a flat config.json and qwen36_meta.json. inspect, verify container and the runtime's Checkpoint read
    it; every expert part decodes to the converter's integers times its scales."""
    from colitools.formats.inspect import inspect_path
    from colitools.formats.safetensors_io import write_safetensors
    from colitools.runtime.weights import Checkpoint
    from colitools.verify.container import verify_container

    out = tmp_path / "colibri-qwen36"
    out.mkdir()
    full = json.loads((FIXTURE / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(full["text_config"]))
    (out / "config.hf.json").write_text(json.dumps(full))
    globals_ = {k.replace("model.language_model.", "model."): source[k].astype(np.float16)
                for k in ("model.language_model.embed_tokens.weight", "lm_head.weight",
                          "model.language_model.norm.weight")}  # fmt: skip
    write_safetensors(out / "model-globals.safetensors", globals_)
    ref = {}
    for layer in range(2):
        prefix = f"model.language_model.layers.{layer}."
        tens = {}
        for e in range(4):
            gate, up, down = (
                source[f"{prefix}mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up", "down")
            )
            mw, qs = _make_merged(gate, up, down, 4)
            tens[f"model.layers.{layer}.mlp.experts.{e}.merged_weight"] = mw
            tens[f"model.layers.{layer}.mlp.experts.{e}.qs"] = qs
            ref[(layer, e)] = (_unpack_int4_to_int8(mw), qs)
        for k, v in source.items():
            if k.startswith(prefix) and ".mlp.experts." not in k:
                tens[k.replace(prefix, f"model.layers.{layer}.")] = v.astype(np.float16)
        write_safetensors(out / f"model-{layer:05d}.safetensors", tens)
    (out / "qwen36_meta.json").write_text(
        json.dumps({"expert_gs": 0, "ebits": 4, "hidden": 64, "n_layers": 2})
    )

    report = verify_container(out)
    assert report.ok, report.problems
    assert report.formats["int4-row"] == 8
    assert not inspect_path(out).unresolved
    ckpt = Checkpoint(out, json.loads((out / "config.json").read_text()))
    for (layer, e), (q, qs) in ref.items():
        base = f"model.layers.{layer}.mlp.experts.{e}"
        offs, soffs = 0, 0
        for proj in ("gate_proj", "up_proj", "down_proj"):
            part = q[offs : offs + 64 * 64].reshape(64, 64).astype(np.float32) * qs[soffs : soffs + 64, None]
            assert np.array_equal(ckpt.dense(f"{base}.{proj}.weight", 64, 64), part), (base, proj)
            offs, soffs = offs + 64 * 64, soffs + 64


def test_a_qwen36_output_runs_token_identical_to_the_generic_container_of_the_same_formats(outputs):
    """colitools' runtime reads the merged blobs back: 32 greedy tokens equal the generic container's with the same
    formats (int4-row experts, float dense)."""
    from colitools.runtime import generate, load_model

    tokens = {}
    for name in ("int4", "generic-int4"):
        with load_model(outputs[name], record_usage=False) as model:
            tokens[name] = generate(model, [1, 2, 3, 4], 32).generated_ids
    assert len(tokens["int4"]) == 32 and tokens["int4"] == tokens["generic-int4"]


# ----------------------------------------------------------------- c/qwen36.c's loader, restated (CI has no colibri)
def _qwen36_inventory(cfg: dict, meta: dict) -> dict[str, int]:
    """Every tensor c/qwen36.c model_init_range asks for -> the element count load_t_n requires ("config implies"),
    from load_cfg's config.json keys and load_meta's qwen36_meta.json keys; attention layers are the meta's
    ``layer_types`` entries equal to "full_attention", the rest Gated DeltaNet."""
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    E, SI, VT = meta["num_experts"], meta["shared_inter"], meta["dn_vheads"] * meta["dn_vdim"]
    out = {"model.embed_tokens.weight": V * D, "lm_head.weight": V * D, "model.norm.weight": D}
    for i, kind in enumerate(meta["layer_types"]):
        L = f"model.layers.{i}."
        out |= {L + "input_layernorm.weight": D, L + "post_attention_layernorm.weight": D, L + "mlp.gate.weight": E * D,
                L + "mlp.shared_expert.gate_proj.weight": SI * D, L + "mlp.shared_expert.up_proj.weight": SI * D,
                L + "mlp.shared_expert.down_proj.weight": D * SI, L + "mlp.shared_expert_gate.weight": D}  # fmt: skip
        if kind == "full_attention":
            a = L + "self_attn."
            out |= {a + "q_proj.weight": meta["q_heads"] * meta["q_head_dim"] * D,
                    a + "k_proj.weight": meta["kv_heads"] * meta["k_head_dim"] * D,
                    a + "v_proj.weight": meta["kv_heads"] * meta["v_head_dim"] * D,
                    a + "o_proj.weight": D * meta["o_in"], a + "q_norm.weight": meta["head_dim"],
                    a + "k_norm.weight": meta["head_dim"]}  # fmt: skip
        else:
            a = L + "linear_attn."
            out |= {a + "in_proj_qkv.weight": meta["dn_conv_dim"] * D, a + "in_proj_z.weight": VT * D,
                    a + "in_proj_b.weight": meta["dn_vheads"] * D, a + "in_proj_a.weight": meta["dn_vheads"] * D,
                    a + "conv1d.weight": meta["dn_conv_dim"] * meta["dn_convk"], a + "dt_bias": meta["dn_vheads"],
                    a + "A_log": meta["dn_vheads"], a + "norm.weight": meta["dn_vdim"],
                    a + "out_proj.weight": D * VT}  # fmt: skip
    return out


@pytest.mark.parametrize("folder", list(RECIPES))
def test_every_tensor_and_key_c_qwen36_reads_is_there_as_it_reads_it(outputs, folder):
    """A ``--target qwen36`` output of the oracle fixture against c/qwen36.c's loader, restated (CI has no colibri;
    bench/colibri_compat.py runs the engine itself): load_cfg's required keys, validate_cfg's checks on the meta, load_t_n's element
    counts and float dtypes, load_expert_merged's byte and scale counts, and nothing written that it does not read."""
    cfg = json.loads((outputs[folder] / "config.json").read_text())
    meta = json.loads((outputs[folder] / "qwen36_meta.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "rms_norm_eps"):  # load_cfg's req_num
        assert type(cfg[key]) in (int, float), key
    assert (
        meta["n_layers"] == cfg["num_hidden_layers"] == len(meta["layer_types"])
        and meta["hidden"] == cfg["hidden_size"]
    )
    assert meta["q_heads"] % meta["kv_heads"] == 0 and meta["dn_vheads"] % meta["dn_kheads"] == 0
    dn_conv = 2 * meta["dn_kheads"] * meta["dn_kdim"] + meta["dn_vheads"] * meta["dn_vdim"]
    assert meta["dn_conv_dim"] == dn_conv and meta["dn_convk"] >= 2 and 0 < meta["dn_vdim"] <= 512
    rotary = int(meta["head_dim"] * meta["partial_rotary_factor"] + 0.5)
    assert 2 <= rotary <= meta["head_dim"] and rotary % 2 == 0
    stored = _tensors(outputs[folder])
    want = _qwen36_inventory(cfg, meta)
    for name, count in want.items():
        dtype, shape, _ = stored[name]
        assert dtype in ("F32", "BF16", "F16") and np.prod(shape) == count, (name, dtype, shape, count)
    I, D, gs = meta["moe_inter"], meta["hidden"], meta["expert_gs"]
    scales = 2 * (I * -(-D // gs) if gs else I) + (D * -(-I // gs) if gs else D)  # scale_count_gu / _d
    experts = set()
    for i in range(meta["n_layers"]):
        for e in range(meta["num_experts"]):
            w, s = f"model.layers.{i}.mlp.experts.{e}.merged_weight", f"model.layers.{i}.mlp.experts.{e}.qs"
            nbytes = stored[w][2].nbytes
            assert nbytes == (3 * I * D if meta["ebits"] == 8 else 3 * I * D // 2), w
            assert stored[s][0] == "F32" and stored[s][2].size == scales, s
            experts |= {w, s}
    assert set(stored) == set(want) | experts  # nothing written that the engine does not read
