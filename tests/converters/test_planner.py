"""Inventory validation and the conversion plan: units, file names, tensor order, metadata, sizes, disk peak."""

from __future__ import annotations

import json

import pytest

from colitools.converters.inventory import HeaderTensor, build_inventory
from colitools.converters.planner import plan_conversion
from colitools.converters.recipe import Recipe, Role
from colitools.errors import ConvertError, FormatError
from colitools.formats.safetensors_io import SafetensorsWriter

H, I, E, V = 128, 64, 3, 32
CONFIG = {
    "hidden_size": H,
    "vocab_size": V,
    "num_hidden_layers": 2,
    "moe_intermediate_size": I,
    "n_routed_experts": E,
}


ONE_LAYER = {**CONFIG, "num_hidden_layers": 1}  # the checkpoints below that hold layer 0 only


def _layer(L: int, dtype: str = "BF16", inter: int = I) -> dict[str, HeaderTensor]:
    p = f"model.layers.{L}"
    t = {
        f"{p}.input_layernorm.weight": HeaderTensor(dtype, (H,)),
        f"{p}.self_attn.q_proj.weight": HeaderTensor(dtype, (H, H)),
        f"{p}.mlp.gate.weight": HeaderTensor(dtype, (E, H)),
    }
    for e in range(E):
        t[f"{p}.mlp.experts.{e}.down_proj.weight"] = HeaderTensor(dtype, (H, inter))
        t[f"{p}.mlp.experts.{e}.gate_proj.weight"] = HeaderTensor(dtype, (inter, H))
        t[f"{p}.mlp.experts.{e}.up_proj.weight"] = HeaderTensor(dtype, (inter, H))
    return t


def _globals() -> dict[str, HeaderTensor]:
    return {
        "model.embed_tokens.weight": HeaderTensor("BF16", (V, H)),
        "model.norm.weight": HeaderTensor("BF16", (H,)),
        "lm_head.weight": HeaderTensor("BF16", (V, H)),
    }


def _inventory(layers=(0, 1), config=CONFIG, split=True, extra=None):
    """Two shards: globals + layer 0 + the first expert of layer 1 in shard a, the rest in shard b."""
    a, b = dict(_globals()), {}
    for L in layers:
        for name, t in _layer(L).items():
            (b if L == 1 and split and ".experts.0." not in name else a)[name] = t
    if extra:
        b.update(extra)
    headers = {"a.safetensors": a, "b.safetensors": b}
    wm = {n: s for s, h in headers.items() for n in h}
    return build_inventory(headers, wm, config)


def test_units_are_globals_then_layers_and_files_are_numbered_in_order():
    plan = plan_conversion(_inventory(layers=(0, 1, 2), config={**CONFIG, "num_hidden_layers": 3}), Recipe())
    assert [u.key for u in plan.units] == ["globals", "model.layers.0", "model.layers.1", "model.layers.2"]
    assert [f.name for f in plan.files] == [f"model-0000{k}-of-00004.safetensors" for k in range(1, 5)]
    assert plan.units[2].shards == ("a.safetensors", "b.safetensors")  # layer 1's experts span both shards
    assert plan.units[1].shards == ("a.safetensors",)


def test_pairs_order_non_experts_then_each_expert_codes_then_scales():
    plan = plan_conversion(_inventory(), Recipe())
    names = [n for n, _, _ in plan.units[1].files[0].entries]
    p = "model.layers.0"
    assert names[:4] == [f"{p}.input_layernorm.weight", f"{p}.mlp.gate.weight",
                         f"{p}.self_attn.q_proj.weight", f"{p}.self_attn.q_proj.weight.qs"]  # fmt: skip
    x = f"{p}.mlp.experts.0"
    assert names[4:10] == [f"{x}.gate_proj.weight", f"{x}.up_proj.weight", f"{x}.down_proj.weight",
                           f"{x}.gate_proj.weight.qs", f"{x}.up_proj.weight.qs", f"{x}.down_proj.weight.qs"]  # fmt: skip
    assert names[10] == f"{p}.mlp.experts.1.gate_proj.weight"
    entries = dict((n, (d, s)) for n, d, s in plan.units[1].files[0].entries)
    assert entries[f"{x}.gate_proj.weight"] == ("U8", (I, H // 2))
    assert entries[f"{x}.gate_proj.weight.qs"] == ("F32", (I, H // 64))
    assert entries[f"{x}.down_proj.weight.qs"] == ("F32", (H,))  # I = 64 <= gs: int4-row
    assert entries[f"{p}.mlp.gate.weight"] == ("F32", (E, H))


def test_metadata_shapes_cover_every_quantized_weight():
    plan = plan_conversion(_inventory(), Recipe())
    meta = plan.units[1].files[0].metadata
    shapes = json.loads(meta["colitools.shapes"])
    assert shapes["model.layers.0.mlp.experts.2.down_proj.weight"] == [H, I]
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == [H, H]
    assert "model.layers.0.mlp.gate.weight" not in shapes
    assert "colibri.fmt" not in meta and "colitools.layout" not in meta
    assert list(shapes) == sorted(shapes)


def test_planar_layer_writes_its_experts_to_the_sidecar():
    plan = plan_conversion(_inventory(), Recipe(layout="planar"))
    layer = plan.units[1]
    assert len(layer.files) == 2 and len(plan.files) == 5
    rest, experts = layer.files
    assert experts.planar and experts.sidecar_layer == 0
    assert experts.name == "experts-int4g64/layer-000.safetensors"
    assert experts.metadata == {"format": "colibri.qwen38.experts-int4g64", "version": "1", "layer": "0"}
    assert all(".experts." in n for n, _, _ in experts.entries)
    assert not any(".experts." in n for n, _, _ in rest.entries)
    # main shards are numbered among themselves; the sidecar files are not counted
    assert [f.name for f in plan.main_files] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert [f.name for f in plan.sidecar_files] == [f"experts-int4g64/layer-00{L}.safetensors" for L in (0, 1)]
    # one record per expert: gate, up, down codes then their scales, one F32 per (row, 64-block)
    names = [n for n, _, _ in experts.entries]
    x = "model.layers.0.mlp.experts.0"
    assert names[:6] == [f"{x}.{p}_proj.weight" for p in ("gate", "up", "down")] + [
        f"{x}.{p}_proj.weight.qs" for p in ("gate", "up", "down")
    ]
    entries = {n: (d, s) for n, d, s in experts.entries}
    assert entries[f"{x}.gate_proj.weight.qs"] == ("F32", (I, H // 64))
    assert entries[f"{x}.down_proj.weight.qs"] == ("F32", (H, I // 64))  # int4-row: its scale per 64-block
    assert experts.size == SafetensorsWriter.file_size(experts.entries, experts.metadata, metadata_last=True)


def test_planar_is_refused_before_work_naming_the_tensor():
    with pytest.raises(
        ConvertError,
        match=r"`layout=planar`: routed expert tensor model\.layers\.0\.mlp\.experts\.0\.down_proj\.weight \[128, 64\].*int4-g32",
    ):
        plan_conversion(_inventory(), Recipe(layout="planar", experts="int4-g32"))
    cfg = {**ONE_LAYER, "moe_intermediate_size": 96}
    extra = _layer(0, inter=96)
    with pytest.raises(ConvertError, match="down_proj"):
        headers = {"a.safetensors": extra}
        plan_conversion(
            build_inventory(headers, dict.fromkeys(extra, "a.safetensors"), cfg), Recipe(layout="planar")
        )


def test_sizes_are_byte_arithmetic_of_the_writer():
    plan = plan_conversion(_inventory(), Recipe())
    for f in plan.files:
        assert f.size == SafetensorsWriter.file_size(f.entries, f.metadata)
        assert f.size % 4096 == f.data_size % 4096  # header padded to a page
    assert plan.out_bytes == sum(f.size for f in plan.files)
    assert plan.in_bytes == sum(t.nbytes for t in plan.inventory.tensors.values())


def test_peak_disk_counts_downloaded_shards_alive():
    plan = plan_conversion(_inventory(), Recipe())
    sizes = plan.inventory.shard_sizes
    outs = [u.out_bytes for u in plan.units]
    assert plan.peak_disk() == sum(outs)
    # shard a: units 0..2, shard b: unit 2 only -> at unit 2 both alive
    assert plan.peak_disk(transient=sizes) == sum(outs) + sizes["a.safetensors"] + sizes["b.safetensors"]
    assert plan.peak_disk(kept=sizes, workers=3) == plan.peak_disk(transient=sizes, workers=3)


def test_summary_lists_units_and_formats_per_role():
    s = plan_conversion(_inventory(), Recipe()).summary()
    assert s["files"] == 3 and s["units"][0]["unit"] == "globals"
    assert s["formats_per_role"]["routed experts"] == {"int4-g64": 12, "int4-row": 6}
    assert s["formats_per_role"]["router"] == {"f32": 2}
    assert s["formats_per_role"]["norm/1-D"] == {"f32": 3}


def test_fused_experts_are_split_per_expert():
    p = "model.layers.0.mlp.experts"
    headers = {"m.safetensors": {f"{p}.gate_up_proj": HeaderTensor("BF16", (E, 2 * I, H)),
                                 f"{p}.down_proj": HeaderTensor("BF16", (E, H, I))}}  # fmt: skip
    plan = plan_conversion(
        build_inventory(headers, dict.fromkeys(headers["m.safetensors"], "m.safetensors"), ONE_LAYER), Recipe()
    )
    names = [n for n, _, _ in plan.files[0].entries]
    assert names[:3] == [f"{p}.0.gate_proj.weight", f"{p}.0.up_proj.weight", f"{p}.0.down_proj.weight"]
    jobs = plan.units[0].jobs
    assert jobs[0].fused_rows == (0, 0, I) and jobs[1].fused_rows == (0, I, 2 * I)
    assert plan.in_bytes == (E * 2 * I * H + E * H * I) * 2


def test_mtp_layer_gets_the_mtp_format():
    inv = _inventory(layers=(0, 1, 2), config={**CONFIG, "num_hidden_layers": 2, "num_nextn_predict_layers": 1})
    plan = plan_conversion(inv, Recipe.from_options(mtp="int4-row"))
    jobs = {j.out_name: j for j in plan.units[3].jobs}
    assert jobs["model.layers.2.mlp.experts.0.gate_proj.weight"].target.fmt == "int4-row"
    assert jobs["model.layers.2.self_attn.q_proj.weight"].role.value == "mtp"


# ----------------------------------------------------------------------------------------- bad inputs
def _bad(headers, wm=None, config=ONE_LAYER):
    wm = wm if wm is not None else {n: s for s, h in headers.items() for n in h}
    return build_inventory(headers, wm, config)


def test_missing_shard_and_missing_tensor_are_errors():
    with pytest.raises(ConvertError, match="its shard b.safetensors is missing"):
        _bad({"a.safetensors": _globals()}, {"model.norm.weight": "b.safetensors"})
    with pytest.raises(ConvertError, match="that shard has no such tensor"):
        _bad({"a.safetensors": {}}, {"model.norm.weight": "a.safetensors"})
    with pytest.raises(
        ConvertError, match="model.norm.weight: present in shard a.safetensors, but it is not in weight_map"
    ):
        _bad(
            {"a.safetensors": _globals()},
            {"lm_head.weight": "a.safetensors", "model.embed_tokens.weight": "a.safetensors"},
        )


@pytest.mark.parametrize("shard", ["../x.safetensors", "/abs.safetensors", "sub/x.safetensors", "x.bin"])
def test_shard_names_that_leave_the_folder_are_refused(shard):
    with pytest.raises(FormatError, match="refused"):
        _bad({shard: {"model.norm.weight": HeaderTensor("BF16", (H,))}})


def test_fp8_pairing_errors():
    w = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(ConvertError, match="FP8 weight without its scale"):
        _bad({"a.safetensors": {w: HeaderTensor("F8_E4M3", (H, H))}})
    with pytest.raises(
        ConvertError, match=r"scale grid \[1, 1\] does not match weight .* \(expected \[2, 1\]\)"
    ):
        _bad(
            {
                "a.safetensors": {
                    w: HeaderTensor("F8_E4M3", (H + 1, H)),
                    w + "_scale_inv": HeaderTensor("F32", (1, 1)),
                }
            }
        )
    with pytest.raises(ConvertError, match="scale without its weight"):
        _bad({"a.safetensors": {w + "_scale_inv": HeaderTensor("F32", (1, 1))}})
    with pytest.raises(ConvertError, match="which is BF16, not FP8"):
        _bad(
            {
                "a.safetensors": {
                    w: HeaderTensor("BF16", (H, H)),
                    w + "_scale_inv": HeaderTensor("F32", (1, 1)),
                }
            }
        )
    # scale in another shard than its weight is fine
    inv = _bad({"a.safetensors": {w: HeaderTensor("F8_E4M3", (H + 1, H))},
                "b.safetensors": {w + "_scale_inv": HeaderTensor("F32", (2, 1))}})  # fmt: skip
    assert inv.tensors[w].scale.shard == "b.safetensors"


def test_shape_mismatch_against_config_names_tensor_and_key():
    with pytest.raises(
        ConvertError,
        match=r"model.embed_tokens.weight: shape \[32, 64\] does not match config.json vocab_size x hidden_size",
    ):
        _bad({"a.safetensors": {"model.embed_tokens.weight": HeaderTensor("BF16", (V, 64))}})
    with pytest.raises(
        ConvertError, match=r"down_proj.weight: shape \[128, 32\].*hidden_size x moe_intermediate_size"
    ):
        _bad(
            {
                "a.safetensors": {
                    "model.layers.0.mlp.experts.0.down_proj.weight": HeaderTensor("BF16", (H, 32))
                }
            }
        )
    with pytest.raises(ConvertError, match="expert index 3 >= config.json expert count 3"):
        _bad({"a.safetensors": {"model.layers.0.mlp.experts.3.up_proj.weight": HeaderTensor("BF16", (I, H))}})
    with pytest.raises(ConvertError, match=r"gate_up_proj: shape"):
        _bad({"a.safetensors": {"model.layers.0.mlp.experts.gate_up_proj": HeaderTensor("BF16", (E, I, H))}})


def test_non_float_and_non_2d_tensors_get_rules_0_and_2():
    # docs/FORMATS.md §5 as amended (issue 11): integer tensors are copied, every non-2-D float tensor is F32
    inv = _bad({"a.safetensors": {"model.layers.0.attn.position_ids": HeaderTensor("I64", (8,)),
                                  "model.layers.0.conv.weight": HeaderTensor("BF16", (2, 2, 2, 2))}})  # fmt: skip
    plan = plan_conversion(inv, Recipe())
    got = {j.out_name: (j.role, j.weight_entry[1]) for j in plan.units[0].jobs}
    assert got == {"model.layers.0.attn.position_ids": (Role.COPY, "I64"),
                   "model.layers.0.conv.weight": (Role.FLOAT, "F32")}  # fmt: skip
