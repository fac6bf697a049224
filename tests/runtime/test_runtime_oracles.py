"""The runtime against the committed oracles: every fixture's float checkpoint (f32 reference) and every
quantized recipe (container written with the reference's own per-tensor formats, pairs and planar layouts).

For each: the 32 greedy tokens (KV cache) and the teacher-forced argmax at every position are identical, and
both reference logit rows agree within 1e-4.
"""

from __future__ import annotations

import json

import pytest
from containers import build_container
from oracle_refs import ORACLES, check_against_reference, fixtures, reference, runtime_reads_source

FIXTURES = fixtures()


def test_every_family_has_a_fixture():
    families = {reference(f, "f32")["model_type"] for f in FIXTURES}
    assert families >= {
        "olmoe",
        "qwen2_moe",
        "qwen3_moe",
        "mixtral",
        "deepseek_v3",
        "glm4_moe",
        "glm_moe_dsa",
        "kimi_k25",
        "deepseek_v32",
        "qwen3_next",
        "qwen3_5_moe",
        "gpt_oss",
        "deepseek_v4",
        "kimi_linear",
        "glm5_next",
        "inkling_mm_model",
        "inkling2",
        "qwen3_vl_moe",
        "llama4",
        "kimi_k3",
        "deepseek_v41",
    }
    # the DSA indexer's selection really runs (index_topk < the sequence) for both indexer RoPE layouts
    assert {"glm_moe_dsa_sparse", "deepseek_v32_sparse"} <= set(FIXTURES)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_float_checkpoint_matches_f32_reference(fixture, tmp_path):
    """The source folder as it is; an INT4 / NVFP4 / MXFP8 source (which the runtime reads only converted) as
    its decoded float32 values (containers.source_tensors' own numpy decoders, all tensors F32)."""
    src = ORACLES / fixture
    ref = reference(fixture, "f32")
    if not runtime_reads_source(fixture):
        src = build_container(src, ref, tmp_path / "f32")
    check_against_reference(src, fixture, ref)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["default", "int3", "mxfp4", "planar"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_quantized_container_matches_recipe_reference(fixture, recipe, tmp_path):
    ref = reference(fixture, recipe)
    out = build_container(
        ORACLES / fixture, ref, tmp_path / "c", layout="planar" if recipe == "planar" else "pairs"
    )
    check_against_reference(out, fixture, ref, cap=2)


TARGET_RECIPES = [
    (f, r)
    for f in FIXTURES
    for r in json.loads((ORACLES / "index.json").read_text())["fixtures"][f]["recipes"]
    if reference(f, r)["recipe_formats"].get("target")
]


def test_target_recipes_are_listed():
    """One ``target-NAME`` recipe per target with a fixture of its family (formats/targets/ ``model_types``);
    ``target-olmoe`` and ``target-glm53`` fail the margin checks at the ``olmoe`` / ``glm5_next`` seeds, so they
    are on the ``olmoe_target`` / ``glm5_next_target`` copies made for them (oracles/README.md); ``target-qwen38``
    on the BF16 ``qwen38`` and on ``qwen38_fp8`` (the published FP8 experts, the sidecar's int4 from their values)."""
    assert TARGET_RECIPES == [
        ("deepseek_v4", "target-deepseek_v4"),
        ("deepseek_v41", "target-deepseek_v41"),
        ("glm5_next_target", "target-glm53"),
        ("inkling", "target-inkling"),
        ("kimi_k3", "target-kimi_k3"),
        ("olmoe_target", "target-olmoe"),
        ("qwen38", "target-qwen38"),
        ("qwen38_fp8", "target-qwen38"),
        ("qwen3_5_moe", "target-qwen36"),
    ]


@pytest.mark.parametrize(("fixture", "recipe"), TARGET_RECIPES)
def test_target_conversion_has_the_reference_formats(fixture, recipe, tmp_path):
    """The converter's ``--target`` output, read back (formats/container.py resolve_container: merged blobs, fused
    stacks, the target's names), holds every tensor in the format the reference was computed with, and towers /
    MTP modules the target drops are in neither."""
    from colitools.verify.oracle import RecipeResult, _convert_and_check, load_reference

    result = RecipeResult(fixture, recipe)  # the conversion half of verify_recipe, without running the model
    _convert_and_check(ORACLES / fixture, load_reference(ORACLES / fixture, recipe), result, tmp_path / "out")
    assert result.format_mismatches == [] and result.container_problems == []


@pytest.mark.parametrize(("fixture", "recipe"), TARGET_RECIPES)
def test_target_conversion_matches_its_reference(fixture, recipe, tmp_path):
    """A ``--target`` recipe (formats/targets/): the converter's own output (the loader's names, dtypes and
    layouts) read back by the runtime gives the reference computed on that conversion's decoded weights."""
    from colitools.converters.runner import convert
    from colitools.verify.oracle import convert_options

    ref = reference(fixture, recipe)
    convert(str(ORACLES / fixture), tmp_path / "c", convert_options(ref))
    check_against_reference(tmp_path / "c", fixture, ref, cap=2)
