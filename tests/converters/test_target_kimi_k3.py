"""``convert --target kimi_k3``: colibri's Kimi K3 engine layout (c/kimi_k3.c), written and read back by colitools.

Facts followed (colibri, read for facts only): ``c/kimi_k3.c`` ``w_load`` reads a projection either as a float
tensor (BF16 / F16 / F32, quantized at load) or, pre-quantized, as U8 + ``<name>.qs`` F32 in exactly two
layouts: int8 per row (``nbytes == O*I``, ``numel(qs) == O``) or int4-g64 (``I % 64 == 0``, ``nbytes == O*I/2``,
``numel(qs) == O*I/64``, nibble ``v + 8``, low nibble first), anything else refused; ``f32_load`` and the
embedding lookup (``st_read_slice_f32``) read float tensors only (embed_tokens, the KDA ``f_a_proj`` /
``f_b_proj`` / ``b_proj``, norms, AttnRes vectors, conv taps, router); ``expert_table_init`` reads routed
experts ``...block_sparse_moe.experts.{E}.w{1,2,3}.weight_{packed,scale}`` as native MXFP4 with exact byte
counts ``moe_inter * latent / 2`` (w1, w3 packed), ``moe_inter * latent / 32`` (their E8M0 scales), ``latent *
moe_inter / 2`` and ``/ 32`` (w2), and reads an expert with one pread when its six tensors are back to back in
the order w1p w1s w2p w2s w3p w3s (``k3_repack.py`` ``expert_sort_key`` writes them so).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from convcheck import stored_arrays as _read
from convcheck import stored_headers as _headers
from k3tiny import DENSE_I, LATENT, MOE_I, E, H, make_k3

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError
from colitools.formats.safetensors_io import SafetensorsFile

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
PFX = "language_model.model."
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
FLOAT_ONLY = ("embed_tokens", "f_a_proj", "f_b_proj", "b_proj")  # 2-D tensors f32_load / st_read_slice_f32 read


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-k3")
    values = make_k3(root / "src")
    out = {}
    for name, kw in {"k3": {}, "k3-int4": {"dense": "int4-g64"}, "generic": {"experts": "mxfp4"}}.items():
        opts = ConvertOptions(progress=False, min_free_gb=0.0, **({"target": "kimi_k3"} if "k3" in name else {}),
                              **kw)  # fmt: skip
        convert(str(root / "src"), root / name, opts)
        out[name] = root / name
    return root / "src", values, out


# ------------------------------------------------------------ the loader's decodes, transcribed (numpy)
def _k3_mxfp4(packed: np.ndarray, scale: np.ndarray, O: int, I: int) -> np.ndarray:
    """E2M1 nibble (low nibble = even column, bit 3 = sign) times 2^(E8M0 byte - 127) per 32 inputs."""
    b = packed.reshape(O, I // 2)
    codes = np.stack([b & 0x0F, b >> 4], axis=2).reshape(O, I)
    exp = np.repeat(scale.reshape(O, I // 32).astype(np.int32) - 127, 32, axis=1)
    return (E2M1[codes].astype(np.float64) * np.exp2(exp)).astype(np.float32)


def _k3_w_load(codes: np.ndarray, qs: np.ndarray, O: int, I: int) -> np.ndarray:
    """w_load's pre-quantized branches (and w_rowdot's arithmetic): int8 rows or int4-g64; anything else refused."""
    nbytes, ns = codes.nbytes, qs.size
    if nbytes == O * I and ns == O:
        return codes.reshape(O, I).view(np.int8).astype(np.float32) * qs.reshape(O, 1)
    assert I % 64 == 0 and nbytes == O * (I // 2) and ns == O * (I // 64), "w_load refuses this tensor"
    b = codes.reshape(O, I // 2)
    v = np.stack([(b & 0xF).astype(np.int32) - 8, (b >> 4).astype(np.int32) - 8], axis=2).reshape(O, I)
    return v.astype(np.float32) * np.repeat(qs.reshape(O, I // 64), 64, axis=1)


# ---------------------------------------------------------------------------------------------- experts
def test_routed_experts_are_one_contiguous_mxfp4_record_in_slot_order(k3):
    _, values, out = k3
    head = _headers(out["k3"])
    data = _read(out["k3"])
    generic = _read(out["generic"])
    want = {"w1": (MOE_I, LATENT), "w2": (LATENT, MOE_I), "w3": (MOE_I, LATENT)}
    for e in range(E):
        base = f"{PFX}layers.1.block_sparse_moe.experts.{e}"
        slots = [f"{base}.{w}.weight_{k}" for w in ("w1", "w2", "w3") for k in ("packed", "scale")]
        files = {head[n][0] for n in slots}
        assert len(files) == 1
        for a, b in zip(slots, slots[1:], strict=False):  # expert_table_init: off[k] + want[k] == off[k+1]
            assert head[a][4] == head[b][3], (a, b)
        for w, (O, I) in want.items():
            packed, scale = data[f"{base}.{w}.weight_packed"], data[f"{base}.{w}.weight_scale"]
            assert packed.dtype == np.uint8 and packed.nbytes == O * I // 2 and scale.nbytes == O * I // 32
            assert packed.tobytes() == generic[f"{base}.{w}.weight_packed"].tobytes()  # the mxfp4 codec of §2.7
            assert scale.tobytes() == generic[f"{base}.{w}.weight_scale"].tobytes()
            src = values[f"{base}.{w}.weight"]
            decoded = _k3_mxfp4(packed, scale, O, I)
            # each element within 2^(e-127) * 2 of its value: half the widest E2M1 gap (4 -> 6), or what
            # saturating at 6 costs when the block max is below 8 (§2.7 picks e0 = ex - 3 or e0 + 1)
            unit = np.repeat(np.exp2(scale.reshape(O, I // 32).astype(np.float64) - 127), 32, axis=1)
            assert np.all(np.abs(decoded - src) <= 2 * unit + 1e-12), (base, w)


def test_float_only_tensors_keep_their_source_bytes_and_the_rest_is_what_w_load_reads(k3):
    src, values, out = k3
    with SafetensorsFile(src / "model.safetensors") as f:
        source = {n: f.read(n) for n in f.tensors}
    for folder in ("k3", "k3-int4"):
        head, data = _headers(out[folder]), _read(out[folder])
        for name, (_, dtype, shape, *_rest) in head.items():
            if name.endswith((".qs", ".weight_scale")) or ".experts." in name:
                continue
            leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
            if leaf in FLOAT_ONLY:
                assert dtype == "BF16" and data[name].tobytes() == source[name].tobytes(), name
            elif dtype == "U8":  # pre-quantized: int8 rows or int4-g64 exactly, as w_load accepts them
                O, I = values[name].shape
                w = _k3_w_load(data[name], data[name + ".qs"], O, I)
                if folder == "k3":
                    assert data[name].nbytes == O * I, name  # --dense / --embed int8-row (the defaults)
                step = np.abs(values[name]).max(axis=1, keepdims=True) / (127 if data[name].nbytes == O * I else 7)
                assert np.all(np.abs(w - values[name]) <= step * 0.5 + 1e-7), name
            else:
                assert dtype in ("F32", "BF16") and len(shape) != 2 or leaf in ("gate",), name  # norms, router
    # --dense int4-g64: int4 exactly where I % 64 == 0 (KDA / shared / dense projections), int8 elsewhere
    head = _headers(out["k3-int4"])
    assert head[f"{PFX}layers.0.self_attn.q_proj.weight"][1:3] == ("U8", (64, 32))  # [64, 64] int4
    assert head[f"{PFX}layers.0.mlp.down_proj.weight"][1:3] == ("U8", (H, DENSE_I))  # I = 96: int8
    assert head[f"{PFX}layers.1.block_sparse_moe.routed_expert_up_proj.weight"][1:3] == ("U8", (H, LATENT))
    manifest = json.loads((out["k3-int4"] / "colitools.json").read_text())
    reasons = {f["tensor"]: f["reason"] for f in manifest["fallbacks"]}
    assert "I % 64 == 0 (I = 96)" in reasons[f"{PFX}layers.0.mlp.down_proj.weight"]
    assert manifest["recipe"]["target"] == "kimi_k3"


def test_readers_read_the_target_back(k3):
    from colitools.formats.inspect import inspect_path
    from colitools.mirror.scan import discover_shards
    from colitools.runtime.weights import Checkpoint, sanitize
    from colitools.verify.container import verify_container

    _, values, out = k3
    folder = out["k3"]
    report = verify_container(folder)
    assert report.ok, report.problems
    assert report.formats["mxfp4"] == 3 * E and report.formats["bf16"] == 4
    assert not inspect_path(folder).unresolved
    ckpt = Checkpoint(folder, json.loads((folder / "config.json").read_text()))
    data = _read(folder)
    for e in range(E):
        base = f"{PFX}layers.1.block_sparse_moe.experts.{e}"
        for w, (O, I) in {"w1": (MOE_I, LATENT), "w2": (LATENT, MOE_I)}.items():
            got = ckpt.dense(sanitize(f"{base}.{w}.weight"), O, I)
            assert np.array_equal(got, _k3_mxfp4(data[f"{base}.{w}.weight_packed"],
                                                 data[f"{base}.{w}.weight_scale"], O, I))  # fmt: skip
    name = f"{PFX}layers.0.self_attn.q_proj.weight"
    assert np.array_equal(ckpt.dense(sanitize(name), 64, 64), _k3_w_load(data[name], data[name + ".qs"], 64, 64))
    # mirror plan's scan: the six tensors are the expert's bytes, w1.weight_packed routes it
    record = 2 * (MOE_I * LATENT // 2 + MOE_I * LATENT // 32) + LATENT * MOE_I // 2 + LATENT * MOE_I // 32
    per_expert, routed = {}, set()
    for shard in discover_shards([folder]):
        for key, n in shard.expert_bytes.items():
            per_expert[key] = per_expert.get(key, 0) + n
        routed |= shard.routed
    assert per_expert == {(1, e): record for e in range(E)} and routed == set(per_expert)


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(experts="int4-g64"), "`experts=int4-g64` is refused"),
        (dict(experts="native"), "would be written as int4-row"),  # a BF16 source has no native MXFP4
        (dict(dense="int2-row"), "`dense=int2-row` is refused"),
        (dict(embed="int4-row"), "`embed=int4-row` is refused"),
        (dict(layout="planar"), "`layout=planar` is refused"),
    ],
)
def test_recipes_the_loader_cannot_read_are_refused_in_one_line(k3, tmp_path, options, says):
    src, _, _ = k3
    with pytest.raises(ConvertError) as info:
        convert(str(src), tmp_path / "out", ConvertOptions(target="kimi_k3", progress=False, min_free_gb=0.0,
                                                           **options))  # fmt: skip
    message = str(info.value)
    assert says in message and "c/kimi_k3.c" in message and "\n" not in message
    assert info.value.exit_code == 2
    assert not any((tmp_path / "out").glob("*.safetensors"))


def test_cli_refuses_another_model_type_exit_2(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli("convert", ORACLES / "olmoe", tmp_path / "out", "--target", "kimi_k3", "--min-free-gb", "0")
    one_line_error(r, "--target kimi_k3 is for model_type kimi_k3", "'olmoe'", code=2)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.safetensors"))


def test_routed_experts_are_checked_against_the_latent_width(k3, tmp_path):
    """model_config.expert_hidden: routed_expert_hidden_size, not hidden_size, is the experts' input width."""
    import shutil

    from colitools.formats import model_config

    src, _, _ = k3
    config = json.loads((src / "config.json").read_text())
    assert model_config.read_facts(config).expert_hidden == LATENT
    assert model_config.read_facts({"hidden_size": 8}).expert_hidden == 8
    copy = tmp_path / "src"
    shutil.copytree(src, copy)
    config["text_config"]["routed_expert_hidden_size"] = 48
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match=r"w1.weight: shape \[64, 32\] does not match config.json "
                                           r"moe_intermediate_size x routed_expert_hidden_size \(expected \[64, 48\]\)"):
        convert(str(copy), tmp_path / "out", ConvertOptions(progress=False, min_free_gb=0.0))
