"""``convert --target glm53``: colibri's GLM-5.3-Flash engine layout (c/glm53.c), written and read back by colitools.

Facts followed (colibri, read for facts only): ``c/glm53.c`` ``load_f32`` reads float tensors only (embeddings,
norms, hyper-connection ``hc_*``, conv taps, ``A_log``, ``dt_bias``, the router and its bias, the indexer's
``k_norm`` and ``index_kpool_compress_ape``, the vision tower); ``absorb_kvb`` reads ``kv_b_proj`` as float;
``load_mat`` reads a projection as float or as the int4 gs64 container only (U8 codes of rank 2, ``nbytes * 2 ==
numel(qs) * 64``, columns a multiple of 64: int8 is refused); ``expert_geometry`` / ``expert_table_init`` stream
each routed expert as six pieces ``gate_proj.weight``, ``gate_proj.weight.qs``, ``up_proj.weight``, ``.qs``,
``down_proj.weight``, ``.qs`` of exactly ``moe_inter * hidden / 2`` bytes and ``moe_inter * hidden / 64`` F32
scales each, one read when they are back to back in that order. ``quantize_i4_grouped`` (the converter's
``quant_int4_grouped``): ``step = max(amax / 7, 1e-8)`` per 64 columns, ``lrintf(w / step)`` clamped to [-8, 7],
nibble ``v + 8``, even column in the low nibble.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from convcheck import stored_arrays as _read
from convcheck import stored_headers as _headers
from test_new_families import DATA, write_family

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
TEXT = DATA["glm5_next"]["config"]["text_config"]
H, MOE_I, N_E = TEXT["hidden_size"], TEXT["moe_intermediate_size"], TEXT["n_routed_experts"]
P = "model.language_model."
FLOAT_ONLY = ("embed_tokens", "kv_b_proj")  # 2-D tensors load_f32 / absorb_kvb read


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-glm53")
    values = write_family("glm5_next", root / "src")
    out = {}
    for name, kw in {"t": {}, "t-int4": {"dense": "int4-g64"}, "generic": {}}.items():
        target = {} if name == "generic" else {"target": "glm53"}
        convert(
            str(root / "src"), root / name, ConvertOptions(progress=False, min_free_gb=0.0, **target, **kw)
        )
        out[name] = root / name
    return root / "src", values, out


def _quantize_i4_grouped(w: np.ndarray, gs: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """c/glm53.c quantize_i4_grouped, restated: [rows, (columns + 1) / 2] codes, [rows, groups] steps."""
    rows, columns = w.shape
    groups = -(-columns // gs)
    codes = np.zeros((rows, (columns + 1) // 2), np.uint8)
    steps = np.zeros((rows, groups), np.float32)
    for g in range(groups):
        block = w[:, g * gs : (g + 1) * gs].astype(np.float32)
        step = np.maximum(np.abs(block).max(axis=1) / np.float32(7.0), np.float32(1e-8)).astype(np.float32)
        steps[:, g] = step
        level = np.clip(np.rint(block / step[:, None]), -8, 7).astype(np.int32) + 8
        for c in range(block.shape[1]):
            col = g * gs + c
            codes[:, col >> 1] |= (level[:, c] << (4 if col & 1 else 0)).astype(np.uint8)
    return codes, steps


def _glm53_int4(codes: np.ndarray, steps: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """matmul_i4_grouped's weights: (nibble - 8) * step of its 64-column group."""
    b = codes.reshape(rows, columns // 2)
    v = np.stack([(b & 0xF).astype(np.int32) - 8, (b >> 4).astype(np.int32) - 8], axis=2).reshape(
        rows, columns
    )
    return v.astype(np.float32) * np.repeat(steps.reshape(rows, columns // 64), 64, axis=1)


def test_routed_experts_are_six_pieces_in_slot_order_with_the_converters_codes(glm):
    _, values, out = glm
    head, data, generic = _headers(out["t"]), _read(out["t"]), _read(out["generic"])
    packed, scales = MOE_I * H // 2, MOE_I * H // 64 * 4  # expert_geometry
    layers = sorted({int(n.split(".")[3]) for n in head if ".mlp.experts." in n})
    assert layers == [1, 2, 3]  # mlp_layer_types: dense, sparse, sparse, sparse
    for layer in layers:
        for e in range(N_E):
            base = f"{P}layers.{layer}.mlp.experts.{e}"
            pieces = [f"{base}.{p}_proj.weight{q}" for p in ("gate", "up", "down") for q in ("", ".qs")]
            assert [head[n][4] - head[n][3] for n in pieces] == [packed, scales] * 3
            assert len({head[n][0] for n in pieces}) == 1
            for a, b in zip(pieces, pieces[1:], strict=False):
                assert head[a][4] == head[b][3], (a, b)  # back to back: expert_table_init's one read
            for p in ("gate", "up", "down"):
                name = f"{base}.{p}_proj.weight"
                codes, steps = _quantize_i4_grouped(values[name])
                assert data[name].tobytes() == codes.tobytes(), name
                assert data[name + ".qs"].tobytes() == steps.tobytes(), name
                assert data[name].tobytes() == generic[name].tobytes()  # the generic default holds the same
                w = _glm53_int4(data[name], data[name + ".qs"], *values[name].shape)
                assert np.all(np.abs(w - values[name]) <= np.repeat(steps, 64, axis=1) / 2 + 1e-7), name


def test_other_tensors_are_what_load_f32_and_load_mat_read(glm):
    _, values, out = glm
    for folder in ("t", "t-int4"):
        head, data = _headers(out[folder]), _read(out[folder])
        for name, (_, dtype, shape, *_rest) in head.items():
            if ".mlp.experts." in name or name.endswith(".qs"):
                continue
            leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
            if leaf in FLOAT_ONLY:
                assert dtype in ("F32", "BF16"), name
                if leaf == "kv_b_proj" and folder == "t-int4":  # not int4 as --dense: the source's bytes
                    assert dtype == "F32" and data[name].tobytes() == values[name].tobytes(), name
            elif dtype == "U8":  # load_mat's int4 gs64 container, nothing else
                assert folder == "t-int4" and len(shape) == 2, name
                qs = data[name + ".qs"]
                assert data[name].nbytes * 2 == qs.size * 64, name
                rows = shape[0]
                columns = qs.size * 64 // rows
                assert columns % 64 == 0 and (rows, columns) == values[name].shape, name
                w = _glm53_int4(data[name], qs, rows, columns)
                assert np.max(np.abs(w - values[name])) <= np.max(np.abs(values[name])) / 14 + 1e-6, name
            else:
                assert dtype in ("F32", "BF16"), name
    t4 = _headers(out["t-int4"])
    assert t4[f"{P}layers.1.self_attn.q_proj.weight"][1] == "U8"  # [64, 64]
    assert t4[f"{P}layers.0.mlp.down_proj.weight"][1] == "BF16"  # I = 96: not int4 gs64, so float
    manifest = json.loads((out["t-int4"] / "colitools.json").read_text())
    reasons = {f["tensor"]: (f["written"], f["reason"]) for f in manifest["fallbacks"]}
    written, reason = reasons[f"{P}layers.0.mlp.down_proj.weight"]
    assert written == "bf16" and "c/glm53.c" in reason and "(I = 96)" in reason
    assert manifest["recipe"]["target"] == "glm53"


# c/glm53.c load_cfg, restated: text_config.linear_attn_config's keys (req_num: a number, or the engine exits
# "config.json: missing linear_attn_config") and the flat transformers 5.24 key each comes from
KDA_KEYS = {"num_heads": "linear_num_heads", "head_dim": "linear_head_dim",
            "short_conv_kernel_size": "linear_conv_kernel_dim"}  # fmt: skip


def test_config_has_the_linear_attn_config_load_cfg_requires(glm, tmp_path):
    src, _, out = glm
    source = json.loads((src / "config.json").read_text())
    for folder, want in (("t", True), ("t-int4", True), ("generic", False)):
        config = json.loads((out[folder] / "config.json").read_text())
        text = config["text_config"]
        assert ("linear_attn_config" in text) is want, folder
        assert {k: v for k, v in text.items() if k != "linear_attn_config"} == source["text_config"], folder
        if want:
            kda = text["linear_attn_config"]
            for key, flat in KDA_KEYS.items():
                assert type(kda[key]) in (int, float) and kda[key] == source["text_config"][flat], key
            assert kda.get("gate_lower_bound", -5.0) == source["text_config"].get("linear_lower_bound", -5.0)
            assert "full_attn_layers" not in kda  # optional; load_layer_kinds takes layer_types
    # a source that already has one (a hub config) keeps it as it is
    hub = {"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4, "kda_layers": [1]}
    source["text_config"]["linear_attn_config"] = hub
    (tmp_path / "src").mkdir()
    for f in src.iterdir():
        (tmp_path / "src" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "src" / "config.json").write_text(json.dumps(source))
    convert(
        str(tmp_path / "src"),
        tmp_path / "out",
        ConvertOptions(target="glm53", progress=False, min_free_gb=0.0),
    )
    assert json.loads((tmp_path / "out" / "config.json").read_text())["text_config"] == source["text_config"]


def test_readers_read_the_target_back(glm):
    from colitools.formats.inspect import inspect_path
    from colitools.mirror.scan import discover_shards
    from colitools.runtime.weights import Checkpoint, sanitize
    from colitools.verify.container import verify_container

    _, values, out = glm
    folder = out["t"]
    report = verify_container(folder)
    assert report.ok, report.problems
    assert not inspect_path(folder).unresolved
    ckpt = Checkpoint(folder, json.loads((folder / "config.json").read_text()))
    data = _read(folder)
    name = f"{P}layers.2.mlp.experts.5.down_proj.weight"
    got = ckpt.dense(sanitize(name), H, MOE_I)
    assert np.array_equal(got, _glm53_int4(data[name], data[name + ".qs"], H, MOE_I))
    record = 3 * (MOE_I * H // 2 + MOE_I * H // 64 * 4)
    per_expert, routed = {}, set()
    for shard in discover_shards([folder]):
        for key, n in shard.expert_bytes.items():
            per_expert[key] = per_expert.get(key, 0) + n
        routed |= shard.routed
    assert per_expert == {(layer, e): record for layer in (1, 2, 3) for e in range(N_E)}
    assert routed == set(per_expert)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(experts="int8-row"), "`experts=int8-row` is refused"),
        (dict(experts="int4-g32"), "`experts=int4-g32` is refused"),
        (dict(dense="int8-row"), "`dense=int8-row` is refused"),
        (dict(embed="int4-row"), "`embed=int4-row` is refused"),
        (dict(layout="planar"), "`layout=planar` is refused"),
    ],
)
def test_recipes_the_loader_cannot_read_are_refused_in_one_line(glm, tmp_path, options, says):
    src, _, _ = glm
    with pytest.raises(ConvertError) as info:
        convert(str(src), tmp_path / "out", ConvertOptions(target="glm53", progress=False, min_free_gb=0.0,
                                                           **options))  # fmt: skip
    message = str(info.value)
    assert says in message and "c/glm53.c" in message and "\n" not in message
    assert info.value.exit_code == 2


def test_cli_refuses_another_model_type_exit_2(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli("convert", ORACLES / "glm4_moe", tmp_path / "out", "--target", "glm53", "--min-free-gb", "0")
    one_line_error(r, "--target glm53 is for model_type glm5_next", "'glm4_moe'", code=2)


def test_readers_accept_flat_expert_codes_as_convert_glm53_writes_them(glm, tmp_path):
    """colibri's converter stores an expert's codes and scales flat (1-D U8 nibbles, 1-D F32 scales, no shapes
    metadata: load_mat's comment) and everything else BF16; colitools takes [O, I] from config.json by role."""
    import shutil

    import ml_dtypes

    from colitools.formats.inspect import inspect_path
    from colitools.formats.safetensors_io import write_safetensors
    from colitools.runtime.weights import Checkpoint, sanitize
    from colitools.verify.container import verify_container

    src, values, _ = glm
    out = tmp_path / "colibri-glm53"
    out.mkdir()
    shutil.copy(src / "config.json", out / "config.json")
    tensors = {}
    for name, value in values.items():
        if ".mlp.experts." in name and name.endswith("_proj.weight"):
            codes, steps = _quantize_i4_grouped(value)
            tensors[name] = codes.reshape(-1)
            tensors[name + ".qs"] = steps.reshape(-1)
        elif value.dtype == np.float32:
            tensors[name] = value.astype(ml_dtypes.bfloat16)
        else:
            tensors[name] = value
    write_safetensors(out / "model.safetensors", tensors)
    report = verify_container(out)
    assert report.ok, report.problems
    assert report.formats["int4-row"] == 3 * 3 * N_E  # I = 64: one group per row
    assert not inspect_path(out).unresolved
    ckpt = Checkpoint(out, json.loads((out / "config.json").read_text()))
    name = f"{P}layers.3.mlp.experts.7.up_proj.weight"
    codes, steps = _quantize_i4_grouped(values[name])
    assert np.array_equal(ckpt.dense(sanitize(name), MOE_I, H), _glm53_int4(codes, steps, MOE_I, H))


def test_a_glm53_output_of_the_fixture_runs_token_identical_to_the_generic_container_of_the_same_formats(
    tmp_path,
):
    """The ``glm5_next`` oracle fixture has no ``target-glm53`` reference (at its seed two k-pool indexer scores tie
    exactly at the selection boundary: oracles/README.md; its copy ``glm5_next_target`` has one, run by
    tests/runtime/test_runtime_oracles.py), so its ``--target glm53`` output (int4 experts, BF16 dense and
    embedding) is run against the generic container holding the same values: the same greedy tokens,
    teacher-forced argmax and logits."""
    from colitools.runtime import load_model
    from colitools.verify.oracle import load_reference

    fixture = ORACLES / "glm5_next"
    same = {"target": "glm53"}, {"dense": "bf16", "embed": "bf16"}  # the target's defaults, generic spelling
    folders = []
    for name, kw in zip(("glm53", "generic"), same, strict=True):
        convert(str(fixture), tmp_path / name, ConvertOptions(progress=False, min_free_gb=0.0, **kw))
        folders.append(tmp_path / name)
    ref = load_reference(fixture, "f32")
    prompt, n = [int(t) for t in ref["prompt_ids"]], len(ref["generated_ids"])
    runs = []
    for folder in folders:
        with load_model(folder, cap=2, record_usage=False) as model:
            gen = model.generate(prompt, n)
            model.reset()
            argmax, last = model.score(prompt + gen)
            runs.append((gen, argmax, np.asarray(last, np.float32)))
    (g1, a1, l1), (g2, a2, l2) = runs
    assert len(g1) == n and g1 == g2 and a1 == a2
    assert float(np.max(np.abs(l1 - l2))) <= 1e-4
    assert json.loads((folders[0] / "colitools.json").read_text())["recipe"]["target"] == "glm53"


# ------------------------------------------------------------------ c/glm53.c's loader, restated (CI has no colibri)
def _glm53_inventory(text: dict) -> dict[str, tuple[str, object]]:
    """Every tensor c/glm53.c model_load_range / vision_load asks for (glm53_walk_tensors' list, no MTP layer)
    -> (loader, what it needs): ``f32`` load_f32 (element count the forward indexes, None: the tower's own),
    ``mat`` load_mat ([rows, columns] as mv uses them), ``kvb`` absorb_kvb (element count), ``piece``
    expert_table_init (bytes). Sizes from load_cfg's keys, as the forward (kda_layer, mla_layer, ffn_layer,
    expert_mats) indexes them."""
    kda = text["linear_attn_config"]
    D, V, E, I = (
        text["hidden_size"],
        text["vocab_size"],
        text["n_routed_experts"],
        text["moe_intermediate_size"],
    )
    Hc, KH, KD, CK = text["hc_mult"], kda["num_heads"], kda["head_dim"], kda["short_conv_kernel_size"]
    KP, NH, QL, KL = KH * KD, text["num_attention_heads"], text["q_lora_rank"], text["kv_lora_rank"]
    QK, VH, IH, ID = (
        text["qk_nope_head_dim"],
        text["v_head_dim"],
        text["index_n_heads"],
        text["index_head_dim"],
    )
    SI, DI = text.get("n_shared_experts", 1) * I, text["intermediate_size"]
    first_dense = text["mlp_layer_types"].index("sparse")
    out = {
        f"{P}embed_tokens.weight": ("f32", V * D),
        f"{P}norm.weight": ("f32", D),
        "lm_head.weight": ("mat", (V, D)),
    }
    for i, kind in enumerate(text["layer_types"]):
        L = f"{P}layers.{i}."
        out |= {L + "input_layernorm.weight": ("f32", D), L + "post_attention_layernorm.weight": ("f32", D)}
        for site in ("attn", "ffn"):
            out |= {f"{L}hc_{site}_fn": ("f32", (2 + Hc) * Hc * Hc * D), f"{L}hc_{site}_base": ("f32", (2 + Hc) * Hc),
                    f"{L}hc_{site}_scale": ("f32", 3)}  # fmt: skip
        a = L + "self_attn."
        if "linear" not in kind:  # load_layer_kinds: "attention" / "full" without "linear" is MLA + indexer
            out |= {a + "q_a_proj.weight": ("mat", (QL, D)), a + "q_a_layernorm.weight": ("f32", QL),
                    a + "q_b_proj.weight": ("mat", (NH * QK, QL)), a + "kv_a_proj_with_mqa.weight": ("mat", (KL, D)),
                    a + "kv_a_layernorm.weight": ("f32", KL), a + "kv_b_proj.weight": ("kvb", NH * (QK + VH) * KL),
                    a + "o_proj.weight": ("mat", (D, NH * VH)), a + "indexer.wq_b.weight": ("mat", (IH * ID, QL)),
                    a + "indexer.wk.weight": ("mat", (ID, D)), a + "indexer.weights_proj.weight": ("mat", (IH, D)),
                    a + "indexer.k_norm.weight": ("f32", ID), a + "indexer.k_norm.bias": ("f32", ID),
                    a + "indexer.index_kpool_compress_ape": ("f32", text["index_kpool"] * ID),
                    a + "indexer.index_kpool_compress_gate": ("mat", (ID, D))}  # fmt: skip
        else:
            out |= {a + f"{p}_proj.weight": ("mat", (KP, D)) for p in "qkv"}
            out |= {a + f"{p}_conv1d.weight": ("f32", KP * CK) for p in "qkv"}
            out |= {a + "o_proj.weight": ("mat", (D, KP)), a + "g_a_proj.weight": ("mat", (KD, D)),
                    a + "g_b_proj.weight": ("mat", (KP, KD)), a + "f_a_proj.weight": ("mat", (KD, D)),
                    a + "f_b_proj.weight": ("mat", (KP, KD)), a + "b_proj.weight": ("mat", (KH, D)),
                    a + "dt_bias": ("f32", KP), a + "A_log": ("f32", KH), a + "o_norm.weight": ("f32", KD)}  # fmt: skip
        m = L + "mlp."
        if i < first_dense:
            out |= {m + "gate_proj.weight": ("mat", (DI, D)), m + "up_proj.weight": ("mat", (DI, D)),
                    m + "down_proj.weight": ("mat", (D, DI))}  # fmt: skip
            continue
        out |= {m + "gate.weight": ("f32", E * D), m + "gate.e_score_correction_bias": ("f32", E),
                m + "shared_experts.gate_proj.weight": ("mat", (SI, D)),
                m + "shared_experts.up_proj.weight": ("mat", (SI, D)),
                m + "shared_experts.down_proj.weight": ("mat", (D, SI))}  # fmt: skip
        for e in range(E):  # expert_geometry: int4 codes then F32 gs64 scales, gate, up, down
            for p in ("gate", "up", "down"):
                out |= {f"{m}experts.{e}.{p}_proj.weight": ("piece", I * D // 2),
                        f"{m}experts.{e}.{p}_proj.weight.qs": ("piece", I * D // 64 * 4)}  # fmt: skip
    return out


VISION = ("patch_embed.proj.weight", "patch_embed.proj.bias", "post_layernorm.weight", "downsample.weight",
          "downsample.bias", "merger.proj.weight", "merger.post_projection_norm.weight",
          "merger.post_projection_norm.bias", "merger.gate_proj.weight", "merger.up_proj.weight",
          "merger.down_proj.weight")  # fmt: skip
VISION_BLOCK = ("norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                "attn.proj.bias", "attn.q_norm.weight", "attn.k_norm.weight", "mlp.gate_proj.weight",
                "mlp.gate_proj.bias", "mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight",
                "mlp.down_proj.bias")  # fmt: skip
FLOATS = ("F32", "BF16", "F16")  # st_read_f32's dtypes


@pytest.mark.parametrize("recipe", [{}, {"dense": "int4-g64"}], ids=["default", "dense-int4"])
def test_every_tensor_and_config_key_c_glm53_reads_is_there_as_it_reads_it(tmp_path, recipe):
    """The oracle fixture's ``--target glm53`` output against c/glm53.c's loader, restated (CI has no colibri;
    bench/colibri_compat.py runs the engine itself): load_cfg's required keys are numbers, every tensor it asks for is present with a
    dtype and size its loader accepts, each expert's six pieces are back to back in slot order, and nothing is left
    that it does not read."""
    out = tmp_path / "out"
    convert(str(ORACLES / "glm5_next_target"), out, ConvertOptions(target="glm53", progress=False, min_free_gb=0.0,
                                                                    **recipe))  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    text = config["text_config"]
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads",
                "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "n_routed_experts",
                "num_experts_per_tok", "moe_intermediate_size"):  # fmt: skip
        assert type(text[key]) is int, key
    assert text.get("qk_rope_head_dim", 0) == 0 and text["moe_intermediate_size"] % 32 == 0
    assert len(text["layer_types"]) == text["num_hidden_layers"]
    for key in (
        "depth",
        "hidden_size",
        "num_heads",
        "intermediate_size",
        "patch_size",
    ):  # load_vision's req_num
        assert type(config["vision_config"][key]) is int, key
    assert config["vision_config"]["out_hidden_size"] == text["hidden_size"]
    head = _headers(out)
    want = _glm53_inventory(text)
    want |= {f"model.visual.{n}": ("f32", None) for n in VISION}
    want |= {f"model.visual.blocks.{b}.{n}": ("f32", None) for b in range(config["vision_config"]["depth"]) for n in VISION_BLOCK}  # fmt: skip
    for name, (loader, need) in want.items():
        _, dtype, shape, begin, end = head[name]
        if loader == "f32" or loader == "kvb":
            assert dtype in FLOATS and (need is None or np.prod(shape) == need), (name, dtype, shape)
        elif loader == "piece":
            assert dtype == ("F32" if name.endswith(".qs") else "U8") and end - begin == need, (
                name,
                end - begin,
            )
        elif dtype == "U8":  # load_mat's int4 gs64 container: rank 2, nbytes * 2 == numel(qs) * 64
            qs = head[name + ".qs"]
            assert len(shape) == 2 and (end - begin) * 2 == np.prod(qs[2]) * 64, name
            assert (shape[0], np.prod(qs[2]) * 64 // shape[0]) == need and need[1] % 64 == 0, name
        else:
            assert dtype in FLOATS and shape == need, (name, dtype, shape, need)
    for name, (loader, _) in want.items():  # expert_table_init: one read when the six pieces are contiguous
        if loader == "piece" and name.endswith("gate_proj.weight"):
            base = name[: -len("gate_proj.weight")]
            spans = [head[base + p][3:] for p in ("gate_proj.weight", "gate_proj.weight.qs", "up_proj.weight",
                                                   "up_proj.weight.qs", "down_proj.weight", "down_proj.weight.qs")]  # fmt: skip
            assert all(spans[k][1] == spans[k + 1][0] for k in range(5)), base
            assert len({head[base + "gate_proj.weight"][0], head[base + "down_proj.weight.qs"][0]}) == 1, base
    read_qs = {n + ".qs" for n, (loader, _) in want.items() if loader == "mat"}
    assert set(head) <= set(want) | read_qs  # nothing written that the engine does not read
