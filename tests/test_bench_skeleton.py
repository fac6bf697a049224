"""bench/skeleton.py (issue 25, the skeleton method): the dtypes and shapes it derives from a published config
reproduce the published index's ``metadata.total_size`` to the byte, the tensors whose published shapes are known
have them, and each shard is a valid safetensors file whose data is a hole."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from colitools.formats.inspect import inspect_path
from colitools.formats.safetensors_io import SafetensorsFile

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import skeleton  # noqa: E402

RELEASES = sorted(p.name for p in (BENCH / "published").iterdir() if p.is_dir())


@pytest.mark.parametrize("release", RELEASES)
def test_skeleton_reproduces_the_published_total_size(tmp_path, release):
    report = skeleton.build(BENCH / "published" / release, tmp_path / release)
    assert report["published_total_size"] is not None and report["difference"] == 0
    for shard in sorted((tmp_path / release).glob("*.safetensors")):
        with SafetensorsFile(shard) as f:
            assert (
                f.file_size
                == shard.stat().st_size
                == f.data_start + sum(t.nbytes for t in f.tensors.values())
            )
        assert shard.stat().st_blocks * 512 < 16 << 20  # a hole, not data


def test_gpt_oss_20b_tensors_have_their_published_shapes(tmp_path):
    skeleton.build(BENCH / "published" / "gpt-oss-20b", tmp_path / "g")
    known = {  # openai/gpt-oss-20b's safetensors headers
        "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", (32, 5760, 90, 16)),
        "model.layers.0.mlp.experts.gate_up_proj_scales": ("U8", (32, 5760, 90)),
        "model.layers.0.mlp.experts.gate_up_proj_bias": ("BF16", (32, 5760)),
        "model.layers.0.mlp.experts.down_proj_blocks": ("U8", (32, 2880, 90, 16)),
        "model.layers.0.mlp.router.weight": ("BF16", (32, 2880)),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", (4096, 2880)),
        "model.layers.0.self_attn.k_proj.weight": ("BF16", (512, 2880)),
        "model.layers.0.self_attn.sinks": ("BF16", (64,)),
        "model.embed_tokens.weight": ("BF16", (201088, 2880)),
    }
    got = {}
    for shard in (tmp_path / "g").glob("*.safetensors"):
        with SafetensorsFile(shard) as f:
            got.update({n: (t.dtype, tuple(t.shape)) for n, t in f.tensors.items()})
    assert {n: got[n] for n in known} == known
    report = inspect_path(tmp_path / "g")  # the skeleton reads as the source it stands for
    assert report.source_encodings["routed experts"]["mxfp4, fused stack of 32 experts"]["tensors"] == 48


# the oracle fixtures (saved by transformers / compressed-tensors / modelopt conventions): the skeleton's derivation
# from config.json alone gives every tensor its stored dtype and shape, companions included
# (multimodal ones: the vision tower and projector from vision_config, formats/towers.py; qwen3_vl_moe_fp8: FP8 stacks
# in the transposed layout with their [E, H/b, 2I/b] scale grids, quantized by transformers' own FP8 op; llama4_fp8:
# compressed-tensors float-quantized per-expert weights with [O, 1] scales)
FIXTURES = ["deepseek_v3", "deepseek_v3_fp8", "deepseek_v3_int4", "glm4_moe", "gpt_oss", "gpt_oss_mxfp4", "mixtral",
            "qwen2_moe", "qwen3_moe", "qwen3_moe_mxfp8", "qwen3_moe_nvfp4", "qwen3_next", "qwen3_vl_moe", "llama4",
            "../tests/converters/data/qwen3_vl_moe_fp8", "../tests/converters/data/llama4_fp8"]  # fmt: skip


@pytest.mark.parametrize("fixture", FIXTURES)
def test_derived_dtypes_and_shapes_are_the_stored_ones(fixture):
    root = BENCH.parent / "oracles" / fixture
    config = json.loads((root / "config.json").read_text())
    stored, weight_map = {}, {}
    for path in sorted(root.glob("*.safetensors")):
        with SafetensorsFile(path) as f:
            for name, t in f.tensors.items():
                stored[name], weight_map[name] = (t.dtype, tuple(t.shape)), path.name
    assert skeleton.tensor_entries(config, weight_map) == stored


def test_a_published_tensor_listing_is_reproduced_tensor_by_tensor(tmp_path):
    """Qwen3-VL-30B-A3B-Thinking-FP8's listing of its shards (every tensor's dtype and shape as the release holds
    it): the derivation from its config.json gives all 1170, vision tower and FP8 stack scale grids included."""
    report = skeleton.build(BENCH / "published" / "Qwen3-VL-30B-A3B-Thinking-FP8", tmp_path / "q")
    assert report["shapes_checked"] == report["tensors"] == 1170 and report["shapes_wrong"] == []
    listing = skeleton.published_shapes(BENCH / "published" / "Qwen3-VL-30B-A3B-Thinking-FP8")
    assert listing["model.language_model.layers.0.mlp.experts.gate_up_proj_scale_inv"] == (
        "F32",
        (128, 16, 12),
    )
    assert listing["model.visual.patch_embed.proj.weight"] == ("BF16", (1152, 3, 2, 16, 16))
