"""docs/FORMATS.md §3 applied to whole containers (pairing, merged stamps and shapes, layouts, the config.json
cross-check) and the §5 shard-name rule.

Weights are encoded with the registry's reference codecs, written with the safetensors writer and resolved from
the headers alone."""

from __future__ import annotations

import numpy as np
import pytest

from colitools.formats.container import check_shard_name, config_shapes, merge_entries, resolve_container
from colitools.formats.errors import FormatError, ResolveError
from colitools.formats.registry import by_name
from colitools.formats.resolver import Resolved, encode_shapes, encode_stamps
from colitools.formats.safetensors_io import read_header, write_safetensors

I8 = Resolved(1, "int8-row")
I4 = Resolved(2, "int4-row")
FP8 = Resolved(8, "fp8-e4m3-b128")


def G(gs: int) -> Resolved:
    return Resolved(4, "int4-grouped", gs)


def test_merge_stamps_across_shards():
    assert merge_entries(
        "colibri.fmt", [("s1", {"a": "int8-row"}), ("s2", {"a": "int8-row", "b": "mxfp4"})]
    ) == {
        "a": "int8-row",
        "b": "mxfp4",
    }
    with pytest.raises(
        ResolveError, match="tensor a: colibri.fmt is 'int8-row' in s1 but 'fp8-e4m3-b128' in s2"
    ):
        merge_entries("colibri.fmt", [("s1", {"a": "int8-row"}), ("s2", {"a": "fp8-e4m3-b128"})])


# ---------------------------------------------------------------------------------------- containers
def _quantized(name, fmt, w, gs=None):
    codes, scales = by_name(fmt).encode(w, gs, name=name, fast=False)
    if fmt == "mxfp4":
        base = name.removesuffix(".weight")
        return {base + ".weight_packed": codes, base + ".weight_scale": scales}
    return {name: codes, name + ".qs": scales}


def _write(path, tensors, shapes=None, stamps=None, layout=None):
    meta = {"colitools.shapes": encode_shapes(shapes or {})}
    if stamps is not None:
        meta["colibri.fmt"] = encode_stamps(stamps)
    if layout is not None:
        meta["colitools.layout"] = layout
    write_safetensors(path, tensors, meta)
    return read_header(path)


RNG = np.random.default_rng(7)
W = RNG.standard_normal((8, 128)).astype(np.float32)
EXP = "model.layers.1.mlp.experts.{}.{}.weight"


def test_resolve_container_pairs_every_kind(tmp_path):
    tensors = {
        **_quantized(EXP.format(0, "gate_proj"), "int4-grouped", W, 64),
        **_quantized(EXP.format(0, "up_proj"), "int4-row", W),
        **_quantized(EXP.format(1, "gate_proj"), "mxfp4", W),
        **_quantized("model.layers.1.self_attn.q_proj.weight", "int8-row", W),
        **_quantized("model.layers.1.self_attn.o_proj.weight", "int3-g64", W),
        **_quantized("model.layers.1.self_attn.k_proj.weight", "int2-row", W),
        "model.norm.weight": np.ones(128, np.float32),
        "model.embed_tokens.weight": np.ones((10, 128), np.float16),
        "model.mask": np.zeros(4, np.uint8),
        "model.ids": np.zeros(4, np.int64),
    }
    shapes = {
        EXP.format(0, "gate_proj"): (8, 128),
        EXP.format(0, "up_proj"): (8, 128),
        "model.layers.1.mlp.experts.1.gate_proj.weight_packed": (8, 128),
        "model.layers.1.self_attn.q_proj.weight": (8, 128),
        "model.layers.1.self_attn.o_proj.weight": (8, 128),
        "model.layers.1.self_attn.k_proj.weight": (8, 128),
    }
    shard = _write(tmp_path / "m.safetensors", tensors, shapes)
    got = resolve_container([shard])
    assert list(got) == list(shard.tensors)  # every tensor, in file order
    fmt = {n: (t.kind, t.format.label if t.format else None) for n, t in got.items()}
    assert fmt[EXP.format(0, "gate_proj")] == ("quantized", "int4-g64")
    assert fmt[EXP.format(0, "gate_proj") + ".qs"] == ("scale", None)
    assert fmt[EXP.format(0, "up_proj")] == ("quantized", "int4-row")
    assert fmt["model.layers.1.mlp.experts.1.gate_proj.weight_packed"] == ("quantized", "mxfp4")
    assert fmt["model.layers.1.mlp.experts.1.gate_proj.weight_scale"] == ("scale", None)
    assert fmt["model.layers.1.self_attn.q_proj.weight"] == ("quantized", "int8-row")
    assert fmt["model.layers.1.self_attn.o_proj.weight"] == ("quantized", "int3-g64")
    assert fmt["model.layers.1.self_attn.k_proj.weight"] == ("quantized", "int2-row")
    assert fmt["model.norm.weight"] == ("float", "f32")
    assert fmt["model.embed_tokens.weight"] == ("float", "f32")
    assert fmt["model.mask"] == ("other", None) and fmt["model.ids"] == ("other", None)
    q = got["model.layers.1.self_attn.q_proj.weight"]
    assert (q.logical_shape, q.nbytes, q.scale, q.scale_nbytes, q.layout) == (
        (8, 128), 1024, "model.layers.1.self_attn.q_proj.weight.qs", 32, "pairs",
    )  # fmt: skip
    assert (
        got["model.layers.1.self_attn.q_proj.weight.qs"].scale_of == "model.layers.1.self_attn.q_proj.weight"
    )


def test_resolve_container_applies_stamps_merged_over_shards(tmp_path):
    fp8 = RNG.integers(0, 0x7E, (2, 256), dtype=np.uint8)
    a = _write(tmp_path / "a.safetensors", {"x.weight": fp8, "x.weight.qs": np.ones((1, 2), np.float32)},
               {"x.weight": (2, 256)}, {"x.weight": "fp8-e4m3-b128"})  # fmt: skip
    b = _write(tmp_path / "b.safetensors", {"y.weight": fp8, "y.weight.qs": np.ones(2, np.float32)},
               {"y.weight": (2, 256)}, {"x.weight": "fp8-e4m3-b128"})  # fmt: skip
    got = resolve_container([a, b])
    assert got["x.weight"].format == FP8 and got["x.weight"].stamp == "fp8-e4m3-b128"
    assert got["y.weight"].format == I8 and got["y.weight"].stamp is None
    c = _write(tmp_path / "c.safetensors", {"z": np.ones(1, np.float32)}, stamps={"x.weight": "int8-row"})
    with pytest.raises(
        ResolveError,
        match="x.weight: colibri.fmt is 'fp8-e4m3-b128' in .*a.safetensors but 'int8-row' in .*c.safetensors",
    ):
        resolve_container([a, c])


def _one(tmp_path, tensors, shapes=None, stamps=None, layout=None, name="s.safetensors"):
    return [_write(tmp_path / name, tensors, shapes, stamps, layout)]


# fmt: off
CONTAINER_ERRORS = [
    ("a .qs without its weight", {"w.qs": np.ones(8, np.float32)}, None, None, None, "scale tensor w.qs has no weight w"),
    ("U8 weight with .qs but no shape entry", _quantized("w", "int8-row", W), {}, None, None, "has no colitools.shapes entry"),
    ("weight_packed without weight_scale", {"m.weight_packed": np.zeros((8, 64), np.uint8)}, None, None, None,
     "has no scale tensor m.weight_scale"),
    ("U8 weight_scale without weight_packed", {"m.weight_scale": np.zeros((8, 4), np.uint8)}, None, None, None,
     "m.weight_packed is missing"),
    ("mxfp4 scale of a wrong dtype", {"m.weight_packed": np.zeros((8, 64), np.uint8), "m.weight_scale": np.zeros((8, 4), np.float32)},
     None, None, None, "m.weight_scale is F32, expected U8"),
    ("mxfp4 pair with wrong scale bytes", {"m.weight_packed": np.zeros((8, 64), np.uint8), "m.weight_scale": np.zeros((8, 5), np.uint8)},
     None, None, None, "mxfp4 needs 512 and 32"),
    ("a .qs on a float weight", {"w": W, "w.qs": np.ones(8, np.float32)}, {"w": (8, 128)}, None, None, "is F32, not U8"),
    ("a .qs of the wrong dtype", {"w": np.zeros((8, 128), np.uint8), "w.qs": np.ones(8, np.float16)}, {"w": (8, 128)}, None, None,
     "w.qs is F16, expected F32"),
    ("bytes that resolve to nothing", {"w": np.zeros((8, 127), np.uint8), "w.qs": np.ones(8, np.float32)}, {"w": (8, 128)}, None, None,
     "no known layout"),
    ("shape entry for a missing tensor", {"n": np.ones(2, np.float32)}, {"ghost": (1, 2)}, None, None,
     "colitools.shapes names tensor ghost, which is not in the container"),
    ("stamp for a missing tensor", {"n": np.ones(2, np.float32)}, None, {"ghost": "int8-row"}, None,
     "colibri.fmt names tensor ghost"),
    ("stamp on a float tensor", {"n": np.ones((2, 2), np.float32)}, None, {"n": "int8-row"}, None, "plain F32 tensor but is stamped"),
    ("stamp on an mxfp4 pair", _quantized("m.weight", "mxfp4", W), None, {"m.weight_packed": "int4-row"}, None, "mxfp4 pair but is stamped"),
    ("shape entry contradicting a float tensor", {"n": np.ones((2, 3), np.float32)}, {"n": (3, 2)}, None, None, "says \\[3, 2\\]"),
    ("stamp on a non-weight", {"ids": np.ones(2, np.int64)}, None, {"ids": "int8-row"}, None, "is not a weight"),
    ("planar shard with int8-row", _quantized("w", "int8-row", W), {"w": (8, 128)}, None, "planar64-v8", "planar needs int4-row or int4-g64"),
    ("planar shard with int4-g32", _quantized("w", "int4-grouped", W, 32), {"w": (8, 128)}, None, "planar64-v8", "planar needs"),
    ("planar shard with I % 64 != 0", _quantized("w", "int4-row", W[:, :96]), {"w": (8, 96)}, None, "planar64-v8", "I % 64 == 0"),
    ("unknown layout", {"n": np.ones(2, np.float32)}, None, None, "planar", "unknown colitools.layout"),
]
# fmt: on


@pytest.mark.parametrize(("case", "tensors", "shapes", "stamps", "layout", "words"), CONTAINER_ERRORS,
                         ids=[c[0] for c in CONTAINER_ERRORS])  # fmt: skip
def test_resolve_container_errors(tmp_path, case, tensors, shapes, stamps, layout, words):
    files = _one(tmp_path, tensors, shapes, stamps, layout)
    with pytest.raises(ResolveError, match=words) as info:
        resolve_container(files)
    assert "\n" not in str(info.value)


def test_planar_shard_accepts_int4_g64_and_int4_row(tmp_path):
    tensors = {**_quantized("a", "int4-grouped", W, 64), **_quantized("b", "int4-row", W)}
    got = resolve_container(_one(tmp_path, tensors, {"a": (8, 128), "b": (8, 128)}, layout="planar64-v8"))
    assert got["a"].layout == "planar64-v8" and got["a"].format == G(64) and got["b"].format == I4


def test_tensor_stored_in_two_shards_is_an_error(tmp_path):
    a = _write(tmp_path / "a.safetensors", {"n": np.ones(2, np.float32)})
    b = _write(tmp_path / "b.safetensors", {"n": np.ones(2, np.float32)})
    with pytest.raises(ResolveError, match="tensor n is stored twice"):
        resolve_container([a, b])


def test_given_shapes_must_agree_with_metadata(tmp_path):
    files = _one(tmp_path, _quantized("w", "int8-row", W), {"w": (8, 128)})
    assert resolve_container(files, shapes={"w": (8, 128)})["w"].format == I8
    with pytest.raises(ResolveError, match="colitools.shapes is \\[8, 128\\]"):
        resolve_container(files, shapes={"w": (16, 64)})


def test_mxfp4_without_shape_entry_uses_its_2d_shape(tmp_path):
    got = resolve_container(_one(tmp_path, _quantized("m.weight", "mxfp4", W)))
    assert got["m.weight_packed"].logical_shape == (8, 128)


CONFIG = {"hidden_size": 128, "vocab_size": 10, "moe_intermediate_size": 8, "intermediate_size": 999}


def test_config_shapes_for_embeddings_and_experts():
    names = [
        "model.embed_tokens.weight", "lm_head.weight", EXP.format(3, "gate_proj"), EXP.format(3, "down_proj"),
        "model.layers.0.block_sparse_moe.experts.2.w2.weight", "model.layers.0.mlp.experts.1.up_proj.weight_packed",
        "model.layers.0.mlp.shared_experts.gate_proj.weight", "model.layers.0.self_attn.q_proj.weight",
    ]  # fmt: skip
    assert config_shapes(CONFIG, names) == {
        "model.embed_tokens.weight": (10, 128),
        "lm_head.weight": (10, 128),
        EXP.format(3, "gate_proj"): (8, 128),
        EXP.format(3, "down_proj"): (128, 8),
        "model.layers.0.block_sparse_moe.experts.2.w2.weight": (128, 8),
        "model.layers.0.mlp.experts.1.up_proj.weight_packed": (8, 128),
    }
    assert config_shapes({"text_config": CONFIG}, ["lm_head.weight"]) == {"lm_head.weight": (10, 128)}
    assert config_shapes({"intermediate_size": 7, "hidden_size": 4}, [EXP.format(0, "up_proj")]) == {
        EXP.format(0, "up_proj"): (7, 4)
    }
    assert config_shapes({}, names) == {}


def test_resolve_container_checks_config_shapes(tmp_path):
    tensors = {
        **_quantized(EXP.format(0, "gate_proj"), "int4-grouped", W, 64),
        **_quantized(EXP.format(0, "up_proj"), "int4-grouped", W, 64),
        **_quantized(EXP.format(0, "down_proj"), "int8-row", np.ascontiguousarray(W.T)),
        "model.embed_tokens.weight": np.ones((10, 128), np.float32),
    }
    shapes = {EXP.format(0, "gate_proj"): (8, 128), EXP.format(0, "up_proj"): (8, 128),
              EXP.format(0, "down_proj"): (128, 8)}  # fmt: skip
    files = _one(tmp_path, tensors, shapes)
    one_expert = {**CONFIG, "n_routed_experts": 1}
    assert resolve_container(files, config=one_expert)[EXP.format(0, "gate_proj")].format == G(64)
    with pytest.raises(
        ResolveError,
        match=r"gate_proj.weight is \[8, 128\] \(colitools.shapes\) but config.json implies \[16, 128\]",
    ):
        resolve_container(files, config={**one_expert, "moe_intermediate_size": 16})
    embed = _one(
        tmp_path, {"model.embed_tokens.weight": np.ones((10, 128), np.float32)}, name="e.safetensors"
    )
    with pytest.raises(
        ResolveError,
        match=r"embed_tokens.weight is \[10, 128\] \(its stored shape\) but config.json implies \[10, 64\]",
    ):
        resolve_container(embed, config={**CONFIG, "hidden_size": 64})
    with pytest.raises(ResolveError, match=r"implies \[12, 128\]"):
        resolve_container(embed, config={**CONFIG, "vocab_size": 12})


# ------------------------------------------------------------------------------------- shard names (§5)
def test_check_shard_name_accepts_plain_safetensors_names():
    for name in ("model.safetensors", "model-00001-of-00163.safetensors", "consolidated.00.safetensors"):
        assert check_shard_name(name, "index.json") == name


@pytest.mark.parametrize(
    ("shard", "reason"),
    [
        ("/etc/passwd.safetensors", "absolute path"),
        ("\\\\server\\model.safetensors", "absolute path"),
        ("C:model.safetensors", "absolute path"),
        ("sub/model.safetensors", "contains a path separator"),
        ("..\\model.safetensors", "contains a path separator"),
        ("..model.safetensors", "contains '..'"),
        ("model\0.safetensors", "contains a NUL character"),
        ("model.bin", "does not end in .safetensors"),
        ("", "not a file name"),
        (3, "not a file name"),
    ],
)
def test_check_shard_name_refuses_names_that_could_leave_the_directory(shard, reason):
    with pytest.raises(FormatError) as info:
        check_shard_name(shard, "model.safetensors.index.json", "evil.weight")
    assert str(info.value) == (
        f"model.safetensors.index.json: shard file name {shard!r} (tensor 'evil.weight') is refused: {reason}"
    )


def test_every_target_spelling_is_a_pair_the_container_reads():
    """A target's spelling of a format's two tensors (formats/targets/ ``SPELLINGS``: DeepSeek-V4's I8
    ``.weight`` + F8_E8M0 ``.scale`` mxfp4) is paired by name and dtype, for the formats resolve_container has a
    reader of such a pair for; a spelling of another format would need its reader there."""
    from colitools.formats import container, targets

    assert [s.fmt for s in targets.SPELLINGS] == ["mxfp4"]
    assert {s.fmt for s in targets.SPELLINGS} <= container.SPELLED_FORMATS
    assert container.SPELLED_PAIRS["I8"] == targets.V4_FP4_EXPERTS
