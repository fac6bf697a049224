"""Issue 11: the current generation converts (docs/FORMATS.md §5 rows 0-6), with every tensor where the spec puts it.

``data/new_families.json`` holds, for each model type, the ``config.json`` and the tensor names / dtypes / shapes
that transformers 5.24.0 ``save_pretrained`` wrote for a tiny random model (``from_config``; the multimodal ones
through their ``ForConditionalGeneration`` class; Kimi K2.5 with ``save_original_format=False``, its
original-format save writes ``language_model.model.blocks.N``). The tests fill those tensors with seeded random
values and convert them with the oracle recipes. The expected format of every output tensor comes from
``expected_format`` below, written from the spec's table (names and regular expressions), not from the converter.
These checks are conversion-only; the runtime tests of the families it runs use the oracle fixtures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError, ParameterError
from colitools.formats.registry import writer_group_size
from colitools.formats.safetensors_io import SafetensorsFile, SafetensorsWriter
from colitools.verify.container import verify_container

DATA = json.loads((Path(__file__).parent / "data" / "new_families.json").read_text())["families"]
FAMILIES = sorted(DATA)
RECIPES = {  # as oracles/oracle_recipes.py
    "f32": {"experts": "f32", "dense": "f32", "embed": "f32"},
    "default": {},
    "int3": {"experts": "int3-g64"},
    "mxfp4": {"experts": "mxfp4"},
}
NP = {"F32": np.float32, "I64": np.int64}

# ------------------------------------------------------------------ the spec's table, written independently
TOWER = re.compile(r"^(model\.)?(visual|vision_tower|mm_projector|vision_model|audio_tower)\.")
ROUTER = re.compile(r"\.(mlp\.gate|mlp\.router|ffn\.gate|block_sparse_moe\.gate)\.(weight|bias)$"
                    r"|shared_expert_gate\.weight$|e_score_correction_bias$")  # fmt: skip
SMALL_2D = re.compile(r"(\.|^)hc_|ape$|sinks?$|attn_sink|dt_bias$|A_log$|attn_res\.|rel_logits_proj\.|"
                      r"l2_clip\.scale$|attn_sink_proj\.weight$|index_kpool_compress_gate$|static_w$")  # fmt: skip
EMBED = re.compile(r"(^|\.)(embed_tokens|embed|lm_head|head|unembed)\.weight$")
ROUTED = re.compile(r"\.experts\.\d+\.")


def expected_format(name: str, dtype: str, shape: tuple[int, ...], recipe: str) -> str:
    """Format of output tensor ``name`` under ``recipe`` per docs/FORMATS.md §5 (first matching row)."""
    opts = {"experts": "int4-g64", "dense": "int8-row", "embed": "int8-row", **RECIPES[recipe]}
    if dtype not in ("F32", "BF16", "F16"):
        return f"{dtype} (copied)"  # row 0
    if TOWER.match(name):
        return f"{dtype} (copied)"  # row 1, keep
    if ROUTER.search(name) or len(shape) != 2 or SMALL_2D.search(name):
        return "f32"  # row 2
    if EMBED.search(name):
        option = opts["embed"]
    elif ROUTED.search(name):
        option = opts["experts"]
    else:
        option = opts["dense"]
    if option.startswith("int4-g"):
        gs = writer_group_size(shape[1], int(option[len("int4-g") :]))
        return "int4-row" if gs is None else f"int4-g{gs}"
    return option


# ------------------------------------------------------------------------------------------ fixture folder
def write_family(family: str, folder: Path, seed: int = 0) -> dict[str, np.ndarray]:
    spec = DATA[family]
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, dtype, shape in spec["tensors"]:
        if dtype == "I64":
            tensors[name] = rng.integers(0, 8, size=shape).astype(np.int64)
        else:
            tensors[name] = rng.standard_normal(shape).astype(NP[dtype])
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(spec["config"]))
    entries = [(n, d, tuple(s)) for n, d, s in spec["tensors"]]
    w = SafetensorsWriter(folder / "model.safetensors", entries, {"format": "pt"})
    for n, _, _ in entries:
        w.write(n, memoryview(np.ascontiguousarray(tensors[n]).reshape(-1).view(np.uint8)))
    w.close()
    return tensors


def read_output(out: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """(output tensor name -> format as the container says, float tensors' values)."""
    manifest = json.loads((out / "colitools.json").read_text())
    assert manifest["state"] == "complete"
    formats: dict[str, str] = {}
    values: dict[str, np.ndarray] = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        f = SafetensorsFile(shard)
        meta = json.loads((f.metadata or {}).get("colitools.shapes", "{}"))
        for name, info in f.tensors.items():
            if name.endswith((".qs", ".weight_scale")):
                continue
            if info.dtype in ("F32", "BF16") and name not in meta:
                formats[name] = "f32"
                values[name] = f.read(name)
            elif name not in meta:
                formats[name] = f"{info.dtype} (copied)"
                values[name] = f.read(name)
            else:
                formats[name] = "?"  # quantized: the per-role summary below says which
        f.close()
    return formats, values


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Every family x recipe converted once (tiny: ~0.1 s each)."""
    root = tmp_path_factory.mktemp("families")
    done = {}
    for family in FAMILIES:
        src = root / family / "src"
        tensors = write_family(family, src)
        for recipe, opts in RECIPES.items():
            out = root / family / recipe
            summary = convert(str(src), out, ConvertOptions(**opts))
            done[family, recipe] = (tensors, out, summary)
    return done


# ----------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("family", FAMILIES)
def test_family_converts_and_verifies_clean(converted, family, recipe):
    tensors, out, summary = converted[family, recipe]
    report = verify_container(out)
    assert report.problems == [], report.problems
    assert summary.fallbacks == []


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_tensor_gets_the_format_the_spec_table_gives(converted, family, recipe):
    tensors, out, summary = converted[family, recipe]
    import colitools.converters.planner as planner_mod  # the plan's own per-tensor labels, compared below
    from colitools.converters.inventory import HeaderTensor, build_inventory
    from colitools.converters.recipe import Recipe

    spec = DATA[family]
    headers = {"model.safetensors": {n: HeaderTensor(d, tuple(s)) for n, d, s in spec["tensors"]}}
    inv = build_inventory(
        headers, dict.fromkeys(headers["model.safetensors"], "model.safetensors"), spec["config"]
    )
    plan = planner_mod.plan_conversion(inv, Recipe.from_options(**RECIPES[recipe]))
    got = {}
    for job in (j for u in plan.units for j in u.jobs):
        got[job.out_name] = f"{job.source.dtype} (copied)" if job.target.is_source else job.target.label
    want = {n: expected_format(n, job.source.dtype, job.shape, recipe)
            for n, job in ((j.out_name, j) for u in plan.units for j in u.jobs)}  # fmt: skip
    assert got == want
    # and the container holds exactly those tensors, the float / copied ones as planned
    formats, _ = read_output(out)
    assert set(formats) == {plan_job_weight(j) for u in plan.units for j in u.jobs}
    for n, f in formats.items():  # an F32 tensor copied and one written F32 are the same bytes on disk
        if f != "?":
            assert f == want[n].replace("F32 (copied)", "f32"), n


def plan_job_weight(job) -> str:
    return job.target.tensor_names(job.out_name)[0]


def test_copied_and_f32_tensors_hold_the_source_values(converted):
    tensors, out, _ = converted["deepseek_v4", "default"]
    _, values = read_output(out)
    tid = "model.layers.0.ffn.gate.tid2eid"
    assert values[tid].dtype == np.int64 and np.array_equal(values[tid], tensors[tid])
    for name in ("model.layers.0.hc_attn_fn", "model.layers.0.attn.compressor.ape", "model.hc_head.hc_fn"):
        assert values[name].dtype == np.float32 and np.array_equal(values[name], tensors[name])
    tensors, out, _ = converted["kimi_linear", "default"]
    _, values = read_output(out)
    assert values["model.layers.0.self_attn.A_log"].shape == (1, 1, 4, 1)
    assert np.array_equal(values["model.layers.0.self_attn.q_conv1d.weight"],
                          tensors["model.layers.0.self_attn.q_conv1d.weight"])  # fmt: skip


def test_gpt_oss_stacks_are_split_transposed_with_interleaved_columns(converted):
    tensors, out, _ = converted["gpt_oss", "f32"]
    _, values = read_output(out)
    p = "model.layers.1.mlp.experts"
    gu, down = tensors[f"{p}.gate_up_proj"], tensors[f"{p}.down_proj"]  # [E, H, 2I], [E, I, H]
    gub, downb = tensors[f"{p}.gate_up_proj_bias"], tensors[f"{p}.down_proj_bias"]
    for e in (0, 5):
        assert np.array_equal(values[f"{p}.{e}.gate_proj.weight"], gu[e][:, 0::2].T)
        assert np.array_equal(values[f"{p}.{e}.up_proj.weight"], gu[e][:, 1::2].T)
        assert np.array_equal(values[f"{p}.{e}.down_proj.weight"], down[e].T)
        assert np.array_equal(values[f"{p}.{e}.gate_proj.bias"], gub[e][0::2])
        assert np.array_equal(values[f"{p}.{e}.up_proj.bias"], gub[e][1::2])
        assert np.array_equal(values[f"{p}.{e}.down_proj.bias"], downb[e])


def test_inkling2_w13_rows_are_interleaved_and_kimi_k25_gate_rows_come_first(converted):
    tensors, out, _ = converted["inkling2", "f32"]
    _, values = read_output(out)
    p = "model.llm.layers.1.mlp.experts"
    w13, w2 = tensors[f"{p}.w13_weight"], tensors[f"{p}.w2_weight"]
    assert np.array_equal(values[f"{p}.3.gate_proj.weight"], w13[3][0::2])
    assert np.array_equal(values[f"{p}.3.up_proj.weight"], w13[3][1::2])
    assert np.array_equal(values[f"{p}.3.down_proj.weight"], w2[3])
    tensors, out, _ = converted["kimi_k25", "f32"]
    _, values = read_output(out)
    p = "model.language_model.layers.1.mlp.experts"
    gu = tensors[f"{p}.gate_up_proj"]
    assert np.array_equal(values[f"{p}.2.gate_proj.weight"], gu[2][:64])
    assert np.array_equal(values[f"{p}.2.up_proj.weight"], gu[2][64:])


def test_summary_counts_formats_per_role(converted):
    _, out, summary = converted["qwen3_5_moe", "default"]
    roles = summary.formats_per_role
    assert roles["conv"] == {"f32": 3} and roles["ssm params"] == {"f32": 6}
    assert roles["routed experts"] == {"int4-row": 4 * 8 * 3}
    assert set(roles["tower"]) == {"F32 (copied)"}
    manifest = json.loads((out / "colitools.json").read_text())
    assert manifest["formats_per_role"] == roles and manifest["dropped_towers"] == []
    assert "conv             3 x f32" in summary.text()


def test_towers_drop_leaves_them_out_and_lists_them(converted, tmp_path):
    _, out, _ = converted["glm5_next", "default"]
    summary = convert(str(out.parent / "src"), tmp_path / "o", ConvertOptions(towers="drop"))
    towers = sorted(n for n, _, _ in DATA["glm5_next"]["tensors"] if TOWER.match(n))
    assert towers and summary.dropped_towers == towers
    formats, _ = read_output(tmp_path / "o")
    assert not any(TOWER.match(n) for n in formats)
    assert json.loads((tmp_path / "o" / "colitools.json").read_text())["dropped_towers"] == towers
    assert verify_container(tmp_path / "o").problems == []
    with pytest.raises(ParameterError, match="`towers='sometimes'`"):
        ConvertOptions(towers="sometimes").recipe()


def test_an_expert_stack_of_a_family_with_no_known_orientation_is_one_line_before_work(tmp_path):
    src = tmp_path / "src"
    write_family("gpt_oss", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "gpt_oss_remix"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError) as err:
        convert(str(src), tmp_path / "out", ConvertOptions(dry_run=True))
    msg = str(err.value)
    assert "\n" not in msg and "expert stack" in msg and "'gpt_oss_remix'" in msg
    assert not (tmp_path / "out").exists()
