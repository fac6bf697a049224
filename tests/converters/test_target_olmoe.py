"""``convert --target olmoe``: colibri's OLMoE engine layout (c/olmoe.c), written and read back by colitools.

Facts followed (colibri, read for facts only): ``c/olmoe.c`` ``model_init`` reads every dense tensor by its Hugging
Face name through ``load_t`` -> ``st_read_f32`` (BF16 / F16 / F32 only); ``load_expert_merged`` reads
``model.layers.{L}.mlp.experts.{E}.merged_weight`` (exactly ``2*I*H + H*I`` bytes, raw int8) and
``...experts.{E}.qs`` (exactly ``I + I + H`` floats), gate ``[I, H]`` | up ``[I, H]`` | down ``[H, I]``, one row
scale each; ``c/tools/convert_olmoe_merged.py`` ``convert_expert`` / ``quantize_row`` build them (torch.int8 codes,
F32 scales ``max(|row|, 1e-12) / 127``, ``round(w / s)`` clamped to [-128, 127]).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from convcheck import resolve_without_config
from convcheck import stored_tensors as _tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.recipe import Recipe
from colitools.converters.runner import convert
from colitools.errors import ColitoolsError, ConvertError
from colitools.formats.safetensors_io import SafetensorsFile
from colitools.formats.targets import TARGETS

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
FIXTURE = ORACLES / "olmoe_target"  # num_key_value_heads 4: c/olmoe.c reads no grouped-query heads
# the generic recipe holding the same values as --target olmoe's defaults
EQUIVALENT = dict(experts="int8-row", dense="f32", embed="f32")


def _convert(dest: Path, **kw) -> Path:
    convert(str(FIXTURE), dest, ConvertOptions(progress=False, min_free_gb=0.0, **kw))
    return dest


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-olmoe")
    return _convert(root / "olmoe", target="olmoe"), _convert(root / "generic", **EQUIVALENT)


def _config():
    return json.loads((FIXTURE / "config.json").read_text())


def test_merged_blobs_are_convert_olmoe_merged_layout(outputs):
    olmoe, generic = outputs
    got, ref = _tensors(olmoe), _tensors(generic)
    with SafetensorsFile(FIXTURE / "model.safetensors") as src:
        source = {n: src.read(n) for n in src.tensors}
    c = _config()
    H, I, E, L = c["hidden_size"], c["intermediate_size"], c["num_experts"], c["num_hidden_layers"]
    for layer in range(L):
        for e in range(E):
            base = f"model.layers.{layer}.mlp.experts.{e}"
            dtype, shape, blob = got[f"{base}.merged_weight"]
            sdtype, sshape, qs = got[f"{base}.qs"]
            assert (dtype, shape, sdtype, sshape) == ("I8", (2 * I * H + H * I,), "F32", (2 * I + H,))
            # hand-assembled from the generic container: gate | up | down codes, then their row scales
            projs = ("gate_proj", "up_proj", "down_proj")
            codes = np.concatenate([ref[f"{base}.{p}.weight"][2].reshape(-1) for p in projs]).view(np.int8)
            scales = np.concatenate([ref[f"{base}.{p}.weight.qs"][2].reshape(-1) for p in projs])
            assert blob.tobytes() == codes.tobytes() and qs.tobytes() == scales.tobytes()
            # and from the source, restating quantize_row / convert_expert (round half to even, as torch)
            stacked_q, stacked_s = [], []
            for p in projs:
                w = _source_weight(source, layer, e, p).astype(np.float32)
                s = np.maximum(np.abs(w).max(axis=1), np.float32(1e-12)) / np.float32(127)
                stacked_q.append(np.clip(np.rint(w / s[:, None]), -128, 127).astype(np.int8).reshape(-1))
                stacked_s.append(s.astype(np.float32))
            assert blob.tobytes() == np.concatenate(stacked_q).tobytes()
            assert qs.tobytes() == np.concatenate(stacked_s).tobytes()
    # every other tensor: the Hugging Face name, a float dtype st_read_f32 reads, no .qs weight anywhere else
    others = {n: t for n, t in got.items() if ".experts." not in n}
    assert all(t[0] in ("F32", "BF16", "F16") for t in others.values())
    wanted = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{s}"
        for i in range(L)
        for s in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                  "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                  "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate.weight")
    ]  # fmt: skip  (the names c/olmoe.c model_init loads)
    assert sorted(others) == sorted(wanted)
    for n in wanted:
        assert others[n][2].tobytes() == ref[n][2].tobytes(), n
    assert len(got) == len(wanted) + 2 * E * L


def _source_weight(source, layer, e, proj):
    name = f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
    if name in source:
        return source[name]
    stacks = f"model.layers.{layer}.mlp.experts."
    if proj == "down_proj":
        return source[stacks + "down_proj"][e]
    gate_up = source[stacks + "gate_up_proj"][e]
    half = gate_up.shape[0] // 2
    return gate_up[:half] if proj == "gate_proj" else gate_up[half:]


def test_readers_read_the_target_back(outputs):
    from colitools.formats.inspect import inspect_path
    from colitools.verify.container import verify_container

    olmoe, _ = outputs
    report = verify_container(olmoe)
    assert report.ok, report.problems
    assert report.formats == {"f32": 21, "int8-row": 12}
    inspected = inspect_path(olmoe)
    merged = [t for t in inspected.tensors if t.name.endswith(".merged_weight")]
    assert len(merged) == 12 and all(t.kind == "quantized" and t.format.name == "int8-row" for t in merged)
    assert [(p.projection, p.O, p.I) for p in merged[0].parts] == [("gate", 64, 64), ("up", 64, 64), ("down", 64, 64)]
    assert not inspected.unresolved
    manifest = json.loads((olmoe / "colitools.json").read_text())
    assert manifest["recipe"]["target"] == "olmoe"


def test_run_is_token_exact_with_the_generic_container_of_the_same_values(outputs):
    from colitools.runtime import load_model
    from colitools.verify.oracle import load_reference

    ref = load_reference(FIXTURE, "f32")
    prompt, n = [int(t) for t in ref["prompt_ids"]], len(ref["generated_ids"])
    forced = [int(t) for t in ref["teacher_forced"]["input_ids"]]
    runs = {}
    for folder in outputs:
        with load_model(folder, cap=2, record_usage=False) as model:
            gen = model.generate(prompt, n)
            model.reset()
            argmax, last = model.score(forced)
            runs[folder.name] = (gen, argmax, np.asarray(last, np.float32), model.expert_stats())
    a, b = runs["olmoe"], runs["generic"]
    assert a[0] == b[0] and len(a[0]) == n
    assert a[1] == b[1]
    assert float(np.max(np.abs(a[2] - b[2]))) <= 1e-4
    assert a[3].reads == a[3].misses  # one positional read per expert: blob and scales are adjacent


def test_bf16_dense_is_accepted_and_runs(tmp_path):
    from colitools.runtime import load_model

    out = _convert(tmp_path / "bf16", target="olmoe", dense="bf16", embed="bf16")
    t = _tensors(out)
    assert t["model.layers.0.self_attn.q_proj.weight"][0] == "BF16"
    assert t["model.layers.0.mlp.experts.0.merged_weight"][0] == "I8"
    with load_model(out, record_usage=False) as model:
        assert len(model.generate([1, 2, 3], 4)) == 4


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(experts="int3-g64"), "`experts=int3-g64` is refused"),
        (dict(experts="mxfp4"), "`experts=mxfp4` is refused"),
        (dict(experts="int4-g64"), "`experts=int4-g64` is refused"),
        (dict(dense="int8-row"), "`dense=int8-row` is refused"),
        (dict(embed="int8-row"), "`embed=int8-row` is refused"),
        (dict(layout="planar"), "`layout=planar` is refused"),
    ],
)
def test_recipes_the_loader_cannot_read_are_refused_in_one_line(tmp_path, options, says):
    with pytest.raises(ConvertError) as info:
        _convert(tmp_path / "out", target="olmoe", **options)
    message = str(info.value)
    assert says in message and "c/olmoe.c" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_another_model_type_is_refused_before_work_starts(tmp_path):
    with pytest.raises(ConvertError, match=r"`target=olmoe` is for model_type olmoe .* the source is 'qwen3_moe'"):
        convert(str(ORACLES / "qwen3_moe"), tmp_path / "out", ConvertOptions(target="olmoe", progress=False))
    assert not any((tmp_path / "out").glob("*.safetensors"))
    with pytest.raises(ConvertError, match="`target='nope'`: choose one of generic, olmoe"):
        ConvertOptions(target="nope").recipe()


def test_generic_recipe_fingerprint_is_unchanged():
    assert "target" not in Recipe.from_options().as_dict()
    assert Recipe.from_options().fingerprint() == Recipe().fingerprint()
    assert Recipe.from_options(target=TARGETS["olmoe"]).as_dict()["target"] == "olmoe"
    assert Recipe.from_options(target=TARGETS["olmoe"]).experts == "int8-row"


def test_a_merged_blob_of_the_wrong_size_is_refused(outputs, tmp_path):
    """As load_expert_merged refuses it: the byte counts must be exactly the config's."""
    import shutil

    from colitools.runtime import load_model

    olmoe, _ = outputs
    copy = tmp_path / "copy"
    shutil.copytree(olmoe, copy)
    config = json.loads((copy / "config.json").read_text())
    config["intermediate_size"] = config["moe_intermediate_size"] = 32
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ColitoolsError, match=r"merged expert blob .*merged_weight is 12288 bytes .* implies 6144"):
        load_model(copy, record_usage=False)


def test_mirror_scan_counts_merged_blobs_as_expert_bytes(outputs):
    """colitools mirror plan's scan: a merged blob routes its expert, blob and scales are its bytes."""
    from colitools.mirror.scan import classify_expert_tensor, discover_shards

    olmoe, _ = outputs
    c = _config()
    H, I, E, L = c["hidden_size"], c["intermediate_size"], c["num_experts"], c["num_hidden_layers"]
    per_expert, routed = {}, set()
    for shard in discover_shards([olmoe]):
        for key, n in shard.expert_bytes.items():
            per_expert[key] = per_expert.get(key, 0) + n
        routed |= shard.routed
    record = 2 * I * H + H * I + 4 * (2 * I + H)  # the I8 blob and its F32 scales
    assert per_expert == {(layer, e): record for layer in range(L) for e in range(E)}
    assert routed == set(per_expert)
    blob = classify_expert_tensor("model.layers.3.mlp.experts.17.merged_weight")
    scale = classify_expert_tensor("model.layers.3.mlp.experts.17.qs")
    assert (blob.key, blob.routed, scale.key, scale.routed) == ((3, 17), True, (3, 17), False)
    assert classify_expert_tensor("model.layers.3.mlp.shared_experts.qs") is None
    assert classify_expert_tensor("model.layers.3.mlp.experts.17.merged_weight.qs") is None


def test_a_merged_blob_without_config_is_named_or_reported_unresolved(outputs):
    """Without config.json a merged blob's gate/up/down geometry is unknown: never guessed. A ResolveError
    naming the blob, or with report_unresolved the blob marked unresolved (the rest still resolves)."""
    olmoe, _ = outputs
    got = resolve_without_config(olmoe, r"merged expert blob \S+merged_weight .*needs config.json's hidden")
    blobs = {n: t for n, t in got.items() if n.endswith(".merged_weight")}
    assert blobs and all(t.kind == "unresolved" and "there is none" in t.problem for t in blobs.values())
    assert got["model.norm.weight"].kind == "float"
