"""Issue 25: FP8 block-scaled expert stacks in the transposed layout, as Qwen's Qwen3-VL-MoE ``*-FP8`` releases ship
them (``experts.gate_up_proj`` F8_E4M3 ``[E, H, 2I]`` + ``gate_up_proj_scale_inv`` ``[E, H/b, 2I/b]``, gate = the
first I columns; ``down_proj [E, I, H]`` + ``[E, I/b, H/b]``: docs/FORMATS.md §5).

The fixture ``tests/converters/data/qwen3_vl_moe_fp8`` was quantized by transformers 5.24's own FP8 op
(``oracles/make_qwen3_vl_moe_fp8.py``), and its ``reference/dequant.safetensors`` is transformers' own
dequantization of every FP8 tensor: the expected values, cut per expert here with numpy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.safetensors_io import SafetensorsFile

FIXTURE = Path(__file__).resolve().parent / "data" / "qwen3_vl_moe_fp8"
F32 = ConvertOptions(experts="f32", dense="f32", embed="f32")


def output_tensors(out: Path) -> dict[str, np.ndarray]:
    tensors = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        with SafetensorsFile(shard) as f:
            tensors.update({n: np.array(f.read(n)) for n in f.tensors})
    return tensors


def test_the_fixture_is_the_published_fp8_layout():
    with SafetensorsFile(FIXTURE / "model.safetensors") as f:
        got = {n: (t.dtype, tuple(t.shape)) for n, t in f.tensors.items() if ".experts." in n}
    base = "model.language_model.layers.0.mlp.experts."
    assert got == {
        base + "gate_up_proj": ("F8_E4M3", (4, 64, 256)),
        base + "gate_up_proj_scale_inv": ("F32", (4, 2, 8)),
        base + "down_proj": ("F8_E4M3", (4, 128, 64)),
        base + "down_proj_scale_inv": ("F32", (4, 4, 2)),
    }


def test_every_expert_decodes_to_transformers_dequantization(tmp_path):
    convert(str(FIXTURE), tmp_path / "o", F32)
    out = output_tensors(tmp_path / "o")
    want = load_file(str(FIXTURE / "reference" / "dequant.safetensors"))
    stacks = [n for n in want if n.endswith(("gate_up_proj", "down_proj"))]
    assert len(stacks) == 2 and len(want) == 10
    for name, w in want.items():
        if name not in stacks:  # the attention projections (FP8 2-D, 32x32 blocks)
            assert np.array_equal(out[name], w), name
            continue
        base = name.rpartition(".")[0]
        for e in range(w.shape[0]):
            if name.endswith("gate_up_proj"):
                I = w.shape[2] // 2
                assert np.array_equal(out[f"{base}.{e}.gate_proj.weight"], w[e][:, :I].T)
                assert np.array_equal(out[f"{base}.{e}.up_proj.weight"], w[e][:, I:].T)
            else:
                assert np.array_equal(out[f"{base}.{e}.down_proj.weight"], w[e].T)
        assert name not in out and name + "_scale_inv" not in out


def _float_twin(folder: Path) -> None:
    """The fixture with every FP8 tensor replaced by transformers' dequantization of it, the rest upcast exactly:
    all F32, no scales."""
    folder.mkdir()
    with SafetensorsFile(FIXTURE / "model.safetensors") as f:
        tensors = {n: np.asarray(f.read(n), np.float32) for n, t in f.tensors.items() if t.dtype == "BF16"}
    tensors.update(load_file(str(FIXTURE / "reference" / "dequant.safetensors")))
    save_file(tensors, str(folder / "model.safetensors"))
    config = json.loads((FIXTURE / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))


def test_the_default_recipe_writes_what_the_decoded_values_give(tmp_path):
    """The default recipe quantizes the decoded stacks as it would the same values stored as floats: the converted
    FP8 source and its float twin (transformers' dequantization stored F32) are the same bytes, towers aside."""
    _float_twin(tmp_path / "twin")
    convert(str(FIXTURE), tmp_path / "a", ConvertOptions())
    convert(str(tmp_path / "twin"), tmp_path / "b", ConvertOptions())
    a, b = output_tensors(tmp_path / "a"), output_tensors(tmp_path / "b")
    experts = [n for n in a if ".experts." in n]
    assert len(experts) == 2 * 12 and a.keys() == b.keys()  # 12 projections, codes and scales (int4-g64)
    for n in a:
        if ".visual." in n:  # towers keep their source dtype (BF16 / F32)
            continue
        assert a[n].dtype == b[n].dtype and np.array_equal(a[n].view(np.uint8), b[n].view(np.uint8)), n
    shutil.rmtree(tmp_path / "b")


def test_fp8_passthrough_of_a_transposed_stack_falls_back(tmp_path):
    """``--experts fp8`` cannot keep a transposed stack's bytes (its blocks run along the stored ``[in, out]``): the
    experts fall back to int8-row, recorded in the manifest, from the decoded values."""
    convert(str(FIXTURE), tmp_path / "o", ConvertOptions(experts="fp8"))
    manifest = json.loads((tmp_path / "o" / "colitools.json").read_text())
    fallbacks = [f for f in manifest["fallbacks"] if ".experts." in f["tensor"]]
    assert len(fallbacks) == 12 and all(f["written"] == "int8-row" for f in fallbacks), fallbacks[:2]


def test_the_plan_counts_every_source_byte_once(tmp_path):
    """A dry run reads the whole source: the FP8 stacks' codes and their scale grids, shared among the slices."""
    summary = convert(str(FIXTURE), tmp_path / "o", ConvertOptions(dry_run=True))
    with SafetensorsFile(FIXTURE / "model.safetensors") as f:
        assert summary.bytes_in == sum(t.nbytes for t in f.tensors.values())
