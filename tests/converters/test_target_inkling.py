"""``convert --target inkling``: colibri's Inkling engine layout (c/inkling.c), written and read back by colitools.

Facts followed (colibri, read for facts only). ``c/inkling.c`` ``model_init`` looks up, with ``load_w`` / ``load_t``
(BF16 kept, F16 / F32 read as f32): ``model.embed_tokens.weight``, ``model.embed_norm.weight`` (optional),
``model.norm.weight``, ``lm_head.weight`` and per layer ``input_layernorm``, ``post_attention_layernorm``,
``self_attn.{q,k,v,r,o}_proj.weight``, ``self_attn.{q,k}_norm.weight``, ``self_attn.rel_logits_proj.proj``,
``self_attn.{k,v}_sconv.conv1d.weight``, ``attn_sconv`` / ``mlp_sconv.conv1d.weight``, and for a MoE layer
``mlp.gate.weight``, ``mlp.gate.e_score_correction_bias``, ``mlp.gate.global_scale`` (optional) and the shared
experts as stacks ``mlp.shared_experts.{gate,up,down}_proj`` (no ``.weight``). Its container detection takes a U8
``model.layers.{L}.mlp.experts.gate_up_proj`` as the container, ``rb13 = nbytes / (E * 2I)`` bytes a row, ``H``
(int8) or ``H / 2`` (int4: low nibble = even column, value + 8, ``matmul_q4``); ``slot_fill`` reads expert ``e``'s
``2I`` rows (gate rows, then up rows) at ``e * 2I * rb13`` and its ``2I`` scales at ``e * 2I`` of
``gate_up_proj.qs``, its ``H`` down rows at ``e * H * rb2`` of ``down_proj`` and ``e * H`` of ``down_proj.qs``.
``c/tools/convert_inkling_int4.py`` writes that: native names renamed (``RENAMES`` / ``SUBS``), ``w13_weight`` rows
de-interleaved (even rows = gate, odd = up), ``quant_int4_rows`` (``s = max|row| / 7`` floored to 1e-8,
``clip(rint(w / s), -8, 7) + 8``, ``lo | hi << 4``) or ``quant_int8_rows`` (``/ 127``, ``clip(-128, 127)``, viewed
U8), codes and scales 1-D; norms, sconv kernels, ``rel_logits_proj``, router, bias and global scales F32; every
other tensor in its source dtype; ``model.audio.*`` / ``model.visual.*`` / ``model.mtp.*`` skipped.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from convcheck import resolve_without_config
from convcheck import stored_arrays as _read
from convcheck import stored_headers as _headers

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError
from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
FIXTURE = ORACLES / "inkling"
H, I, E, NS, V = 64, 64, 4, 2, 200  # hidden, moe_intermediate_size, n_routed_experts, n_shared_experts, vocab
PROMPT = [90, 75, 65, 44, 180, 170, 31, 47]  # the fixture's reference prompt
# Per layer (layer 0 "hybrid_sliding": swa 2 heads x 32, 1 kv head; layer 1 "hybrid": 4 heads x 16, 2 kv heads;
# d_rel 4; rel extent = window 8 / rel_extent 16; conv kernel 4): q, k, r rows, head dim, extent.
GEOMETRY = {0: (64, 32, 8, 32, 8), 1: (64, 32, 16, 16, 16)}


def _expected_headers(dense: str) -> dict[str, tuple[str, list[int]]]:
    """Every tensor c/inkling.c model_init / slot_fill looks up for this fixture, its dtype and shape."""
    fl = "BF16" if dense == "bf16" else "F32"
    out = {
        "model.embed_tokens.weight": (fl, [V, H]), "model.embed_norm.weight": ("F32", [H]),
        "model.norm.weight": ("F32", [H]), "lm_head.weight": (fl, [V, H]),
    }  # fmt: skip
    for L, (q, k, r, hd, ext) in GEOMETRY.items():
        p = f"model.layers.{L}."
        out.update({
            p + "input_layernorm.weight": ("F32", [H]), p + "post_attention_layernorm.weight": ("F32", [H]),
            p + "self_attn.q_proj.weight": (fl, [q, H]), p + "self_attn.k_proj.weight": (fl, [k, H]),
            p + "self_attn.v_proj.weight": (fl, [k, H]), p + "self_attn.r_proj.weight": (fl, [r, H]),
            p + "self_attn.o_proj.weight": (fl, [H, q]),
            p + "self_attn.q_norm.weight": ("F32", [hd]), p + "self_attn.k_norm.weight": ("F32", [hd]),
            p + "self_attn.rel_logits_proj.proj": ("F32", [4, ext]),
            p + "self_attn.k_sconv.conv1d.weight": ("F32", [k, 1, 4]),
            p + "self_attn.v_sconv.conv1d.weight": ("F32", [k, 1, 4]),
            p + "attn_sconv.conv1d.weight": ("F32", [H, 1, 4]), p + "mlp_sconv.conv1d.weight": ("F32", [H, 1, 4]),
            p + "mlp.gate.weight": ("F32", [E + NS, H]), p + "mlp.gate.e_score_correction_bias": ("F32", [E]),
            p + "mlp.gate.global_scale": ("F32", [1]),
            p + "mlp.shared_experts.gate_proj": (fl, [NS, I, H]), p + "mlp.shared_experts.up_proj": (fl, [NS, I, H]),
            p + "mlp.shared_experts.down_proj": (fl, [NS, H, I]),
        })  # fmt: skip
    return out


def _stacks(experts: str) -> dict[str, tuple[str, list[int]]]:
    rb13, rb2 = (H, I) if experts == "int8-row" else (H // 2, I // 2)  # bytes a row of gate_up / down
    out = {}
    for L in GEOMETRY:
        p = f"model.layers.{L}.mlp.experts."
        if experts == "f32":  # --xbits 0: the float stacks, read with read_f32_slice
            out[p + "gate_up_proj"], out[p + "down_proj"] = ("F32", [E, 2 * I, H]), ("F32", [E, H, I])
            continue
        out[p + "gate_up_proj"] = ("U8", [E * 2 * I * rb13])
        out[p + "gate_up_proj.qs"] = ("F32", [E * 2 * I])
        out[p + "down_proj"] = ("U8", [E * H * rb2])
        out[p + "down_proj.qs"] = ("F32", [E * H])
    return out


def _convert(dest: Path, **kw) -> Path:
    convert(str(FIXTURE), dest, ConvertOptions(progress=False, min_free_gb=0.0, **kw))
    return dest


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-inkling")
    return {
        "int4": _convert(root / "int4", target="inkling"),  # the defaults: int4-row experts, bf16 dense
        "int4-f32": _convert(root / "int4-f32", target="inkling", dense="f32", embed="f32"),
        "int8-f32": _convert(root / "int8-f32", target="inkling", experts="int8-row", dense="f32", embed="f32"),
        "f32": _convert(root / "f32", target="inkling", experts="f32", dense="f32", embed="f32"),
        "generic-int4": _convert(root / "generic-int4", experts="int4-row", dense="f32", embed="f32"),
        "generic-int8": _convert(root / "generic-int8", experts="int8-row", dense="f32", embed="f32"),
    }


@pytest.fixture(scope="module")
def source():
    with SafetensorsFile(FIXTURE / "model.safetensors") as src:
        return {n: np.asarray(src.read(n)) for n in src.tensors}


# ------------------------------------------------------------------ restatements of the converter's rules
def _deinterleave(w13: np.ndarray) -> np.ndarray:
    """``deinterleave(t, 1)`` of convert_inkling_int4.py: rows 0, 2, 4, ... (gate) then 1, 3, 5, ... (up)."""
    return np.concatenate([w13[:, 0::2], w13[:, 1::2]], axis=1)


def _quant_rows(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """quant_int4_rows / quant_int8_rows on ``[rows, cols]`` float32: (U8 codes, F32 scales)."""
    qmax = 7.0 if bits == 4 else 127.0
    s = np.abs(w).max(axis=1, keepdims=True) / np.float32(qmax)
    s[s < 1e-8] = np.float32(1e-8)
    if bits == 8:
        return np.clip(np.rint(w / s), -128, 127).astype(np.int8).view(np.uint8), s[:, 0]
    q = np.clip(np.rint(w / s), -8, 7).astype(np.int32)
    lo, hi = (q[:, 0::2] + 8).astype(np.uint8), (q[:, 1::2] + 8).astype(np.uint8)
    return lo | (hi << 4), s[:, 0]


def _stack_codes(stack: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_expert_tensor: every expert's rows quantized, codes and scales flattened (1-D)."""
    E_, R, C = stack.shape
    codes, scales = _quant_rows(stack.reshape(E_ * R, C).astype(np.float32), bits)
    return codes.reshape(-1), scales.astype(np.float32)


def _decode(codes: np.ndarray, scales: np.ndarray, O: int, In: int, bits: int) -> np.ndarray:
    """``matmul_q`` / ``matmul_q4``'s weight: int8 bytes as signed, or (nibble - 8), times the row scale."""
    if bits == 8:
        q = codes.view(np.int8).astype(np.float32).reshape(O, In)
    else:
        b = codes.reshape(O, In // 2)
        q = np.empty((O, In), np.float32)
        q[:, 0::2], q[:, 1::2] = (b & 0xF).astype(np.float32) - 8, (b >> 4).astype(np.float32) - 8
    return q * scales.reshape(O, 1)


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize(
    ("name", "experts", "dense"), [("int4", "int4-row", "bf16"), ("int8-f32", "int8-row", "f32"), ("f32", "f32", "f32")]
)
def test_names_dtypes_and_shapes_are_what_model_init_and_slot_fill_look_up(outputs, name, experts, dense):
    got = {n: (h[1], list(h[2])) for n, h in _headers(outputs[name]).items()}  # (file, dtype, shape, ...)
    assert got == {**_expected_headers(dense), **_stacks(experts)}
    assert not any(n.startswith(("model.audio.", "model.visual.")) for n in got)  # skipped, as the converter does
    manifest = json.loads((outputs[name] / "colitools.json").read_text())
    assert manifest["recipe"]["target"] == "inkling"


@pytest.mark.parametrize(("name", "bits"), [("int4", 4), ("int8-f32", 8)])
def test_fused_stacks_hold_the_converters_codes_and_row_scales(outputs, source, name, bits):
    data = _read(outputs[name])
    for L in GEOMETRY:
        native = f"model.llm.layers.{L}.mlp.experts."
        for stack, want in (("gate_up_proj", _deinterleave(source[native + "w13_weight"])),
                            ("down_proj", source[native + "w2_weight"])):  # fmt: skip
            codes, scales = _stack_codes(want, bits)
            written = f"model.layers.{L}.mlp.experts.{stack}"
            assert np.array_equal(data[written].view(np.uint8), codes), written
            assert np.array_equal(data[written + ".qs"], scales), written


def test_shared_experts_and_float_tensors_are_the_source_values_under_the_text_names(outputs, source):
    data = _read(outputs["int4-f32"])
    for L in GEOMETRY:
        n, t = f"model.llm.layers.{L}.", f"model.layers.{L}."
        w13 = _deinterleave(source[n + "mlp.shared_experts.shared_w13_weight"])
        assert np.array_equal(data[t + "mlp.shared_experts.gate_proj"], w13[:, :I])
        assert np.array_equal(data[t + "mlp.shared_experts.up_proj"], w13[:, I:])
        assert np.array_equal(data[t + "mlp.shared_experts.down_proj"], source[n + "mlp.shared_experts.shared_w2_weight"])
        for native, text in (("attn.wq_du.weight", "self_attn.q_proj.weight"),
                             ("attn.k_sconv.weight", "self_attn.k_sconv.conv1d.weight"),
                             ("attn.rel_logits_proj.proj", "self_attn.rel_logits_proj.proj"),
                             ("mlp.gate.bias", "mlp.gate.e_score_correction_bias"),
                             ("mlp_norm.weight", "post_attention_layernorm.weight")):  # fmt: skip
            assert np.array_equal(data[t + text], source[n + native]), text
    assert np.array_equal(data["model.embed_norm.weight"], source["model.llm.embed_norm.weight"])
    assert np.array_equal(data["lm_head.weight"], source["model.llm.unembed.weight"])
    bf = _read(outputs["int4"])  # the default: bf16, round to nearest even
    want = source["model.llm.layers.1.attn.wo_ud.weight"].astype(ml_dtypes.bfloat16)
    assert np.array_equal(bf["model.layers.1.self_attn.o_proj.weight"].view(np.uint16), want.view(np.uint16))


def _check_read_back(folder: Path, source: dict, bits: int) -> None:
    from colitools.formats.inspect import inspect_path
    from colitools.mirror.scan import discover_shards, model_geometry
    from colitools.runtime.weights import Checkpoint, sanitize
    from colitools.verify.container import verify_container

    report = verify_container(folder)
    assert report.ok, report.problems
    assert report.formats[f"int{bits}-row"] == 2 * len(GEOMETRY)  # two stacks a layer
    assert not inspect_path(folder).unresolved
    config = json.loads((folder / "config.json").read_text())
    ckpt = Checkpoint(folder, config)
    try:
        w13 = _deinterleave(source["model.llm.layers.1.mlp.experts.w13_weight"])[3]  # expert 3, [2I, H]
        for proj, rows in (("gate", w13[:I]), ("up", w13[I:])):
            codes, scales = _quant_rows(rows, bits)
            got = ckpt.dense(sanitize(f"model.layers.1.mlp.experts.3.{proj}_proj.weight", config["model_type"]), I, H)
            assert np.array_equal(got, _decode(codes, scales, I, H, bits)), proj
    finally:
        ckpt.close()
    record = 2 * I * H * bits // 8 + 2 * I * 4 + H * I * bits // 8 + H * 4  # an expert's rows of both stacks + .qs
    per_expert, routed = {}, set()
    for shard in discover_shards([folder], [], model_geometry(folder).n_experts):
        for key, n in shard.expert_bytes.items():
            per_expert[key] = per_expert.get(key, 0) + n
        routed |= shard.routed
    assert per_expert == {(L, e): record for L in GEOMETRY for e in range(E)}
    assert routed == set(per_expert)


@pytest.mark.parametrize(("name", "bits"), [("int4", 4), ("int8-f32", 8)])
def test_readers_read_the_target_back(outputs, source, name, bits):
    _check_read_back(outputs[name], source, bits)


def _colibri_container(dest: Path, source: dict, bits: int) -> Path:
    """A container written the way c/tools/convert_inkling_int4.py writes one (RENAMES / SUBS, deinterleave,
    quantize_expert_tensor, F32_RE kept F32, the rest passed through, towers skipped): test code after that tool."""
    renames = {"model.llm.embed.weight": "model.embed_tokens.weight",
               "model.llm.embed_norm.weight": "model.embed_norm.weight",
               "model.llm.norm.weight": "model.norm.weight", "model.llm.unembed.weight": "lm_head.weight"}  # fmt: skip
    subs = [(".attn.wq_du.", ".self_attn.q_proj."), (".attn.wk_dv.", ".self_attn.k_proj."),
            (".attn.wv_dv.", ".self_attn.v_proj."), (".attn.wr_du.", ".self_attn.r_proj."),
            (".attn.wo_ud.", ".self_attn.o_proj."), (".attn.q_norm.", ".self_attn.q_norm."),
            (".attn.k_norm.", ".self_attn.k_norm."), (".attn.k_sconv.weight", ".self_attn.k_sconv.conv1d.weight"),
            (".attn.v_sconv.weight", ".self_attn.v_sconv.conv1d.weight"),
            (".attn.rel_logits_proj.proj", ".self_attn.rel_logits_proj.proj"),
            (".attn_sconv.weight", ".attn_sconv.conv1d.weight"), (".mlp_sconv.weight", ".mlp_sconv.conv1d.weight"),
            (".attn_norm.weight", ".input_layernorm.weight"), (".mlp_norm.weight", ".post_attention_layernorm.weight"),
            (".mlp.gate.bias", ".mlp.gate.e_score_correction_bias"),
            (".mlp.experts.w2_weight", ".mlp.experts.down_proj"),
            (".mlp.shared_experts.shared_w2_weight", ".mlp.shared_experts.down_proj")]  # fmt: skip
    out = {}
    for name, t in source.items():
        if name.startswith(("model.audio.", "model.visual.", "model.mtp.")):
            continue
        base = renames.get(name, name.replace("model.llm.layers.", "model.layers."))
        for a, b in subs:
            base = base.replace(a, b)
        if name.endswith(".mlp.experts.w13_weight") and not bits:  # --xbits 0: the de-interleaved stack
            out[base.replace(".w13_weight", ".gate_up_proj")] = _deinterleave(t)
        elif name.endswith(".mlp.experts.w2_weight") and not bits:
            out[base] = t
        elif name.endswith(".mlp.experts.w13_weight"):
            out[base.replace(".w13_weight", ".gate_up_proj")], out[base.replace(".w13_weight", ".gate_up_proj.qs")] = (
                _stack_codes(_deinterleave(t), bits))  # fmt: skip
        elif name.endswith(".mlp.experts.w2_weight"):
            out[base], out[base + ".qs"] = _stack_codes(t, bits)
        elif name.endswith(".shared_w13_weight"):
            w = _deinterleave(t)
            pref = base.replace(".shared_w13_weight", "")
            out[pref + ".gate_proj"], out[pref + ".up_proj"] = w[:, :I].copy(), w[:, I:].copy()
        else:
            keep_f32 = base.endswith(("norm.weight", "layernorm.weight", "rel_logits_proj.proj", "conv1d.weight",
                                      "global_scale", "e_score_correction_bias", ".mlp.gate.weight"))  # fmt: skip
            out[base] = t.astype(np.float32) if keep_f32 else t  # F32 source: passthrough is F32
    dest.mkdir()
    write_safetensors(dest / "out-00001.safetensors", out)
    shutil.copy(FIXTURE / "config.json", dest / "config.json")
    return dest


def test_readers_and_runtime_read_a_container_written_as_convert_inkling_int4_writes_it(outputs, source, tmp_path):
    from colitools.runtime import generate, load_model

    folder = _colibri_container(tmp_path / "colibri-inkling", source, 4)
    _check_read_back(folder, source, 4)
    tokens = {}
    for name, path in (("colibri", folder), ("target", outputs["int4-f32"])):
        with load_model(path, record_usage=False) as model:
            tokens[name] = generate(model, PROMPT, 32).generated_ids
    assert len(tokens["colibri"]) == 32 and tokens["colibri"] == tokens["target"]


def test_a_transformers_named_checkpoint_converts_to_the_same_output(outputs, source, tmp_path):
    """A text-named float checkpoint as transformers 5.24 saves the multimodal model (``model.language_model.``,
    ``embed_tokens.embed_norm``, ``gate_up_proj`` stacks by rows, shared-expert stacks) is read by the runtime as
    the reference runs it and converts with ``--target inkling`` to exactly the native fixture's output."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from oracle_refs import check_against_reference, reference

    text = _read(_colibri_container(tmp_path / "text", source, 0))  # float stacks under the engine's names
    hf = {}
    for name, value in text.items():
        name = "model.embed_tokens.embed_norm.weight" if name == "model.embed_norm.weight" else name
        hf[name if name.startswith("lm_head.") else "model.language_model." + name[len("model.") :]] = value
    folder = tmp_path / "transformers"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", hf)
    shutil.copy(FIXTURE / "config.json", folder / "config.json")
    check_against_reference(folder, "inkling", reference("inkling", "f32"))
    convert(str(folder), tmp_path / "out", ConvertOptions(progress=False, min_free_gb=0.0, target="inkling",
                                                          experts="f32", dense="f32", embed="f32"))  # fmt: skip
    out = tmp_path / "out"
    got, want = _read(out), _read(outputs["f32"])
    assert got.keys() == want.keys()
    assert all(got[n].dtype == want[n].dtype and np.array_equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize(("target", "generic"), [("int4-f32", "generic-int4"), ("int8-f32", "generic-int8")])
def test_an_inkling_output_runs_token_identical_to_the_generic_container_of_the_same_formats(outputs, target, generic):
    """colitools' runtime reads the fused stacks back: 32 greedy tokens equal the generic container's with the same
    formats (int4-row / int8-row experts, f32 dense and embeddings), whose decoded weights are the same."""
    from colitools.runtime import generate, load_model

    tokens = {}
    for name in (target, generic):
        with load_model(outputs[name], record_usage=False) as model:
            tokens[name] = generate(model, PROMPT, 32).generated_ids
    assert len(tokens[target]) == 32 and tokens[target] == tokens[generic]


def test_an_f32_output_runs_token_exact_against_the_transformers_reference(outputs):
    """``--target inkling --experts f32 --dense f32 --embed f32`` has the formats of the fixture's ``f32`` recipe:
    every greedy token, every teacher-forced position and the logits equal transformers'
    (oracles/inkling/reference/f32.json)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from oracle_refs import check_against_reference, reference

    ref = reference("inkling", "f32")
    assert ref["recipe_formats"] == {"experts": "f32", "dense": "f32", "embed": "f32", "layout": "pairs"}
    check_against_reference(outputs["f32"], "inkling", ref)


def test_a_float_container_written_as_convert_inkling_int4_xbits_0_writes_it_runs_token_exact(source, tmp_path):
    """The converter's ``--xbits 0`` output (float stacks, the source's F32 passed through) read by colitools and
    run: the transformers reference's tokens, teacher-forced positions and logits."""
    from colitools.formats.inspect import inspect_path
    from colitools.verify.container import verify_container

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from oracle_refs import check_against_reference, reference

    folder = _colibri_container(tmp_path / "colibri-inkling-f32", source, 0)
    report = verify_container(folder)
    assert report.ok, report.problems
    assert not inspect_path(folder).unresolved
    check_against_reference(folder, "inkling", reference("inkling", "f32"))


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(experts="int4-g64"), "`experts=int4-g64` is refused"),
        (dict(experts="int3-g64"), "`experts=int3-g64` is refused"),
        (dict(experts="int2-row"), "`experts=int2-row` is refused"),
        (dict(experts="mxfp4"), "`experts=mxfp4` is refused"),
        (dict(dense="int8-row"), "`dense=int8-row` is refused"),
        (dict(embed="int4-row"), "`embed=int4-row` is refused"),
        (dict(layout="planar"), "`layout=planar` is refused"),
    ],
)
def test_recipes_the_loader_cannot_read_are_refused_in_one_line(tmp_path, options, says):
    with pytest.raises(ConvertError) as info:
        convert(str(FIXTURE), tmp_path / "out", ConvertOptions(target="inkling", progress=False, min_free_gb=0.0,
                                                               **options))  # fmt: skip
    message = str(info.value)
    assert says in message and "c/inkling.c" in message and "\n" not in message
    assert info.value.exit_code == 2 and not (tmp_path / "out").exists()


def test_cli_refuses_another_model_type_exit_2(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli("convert", ORACLES / "inkling2", tmp_path / "out", "--target", "inkling", "--min-free-gb", "0")
    one_line_error(r, "--target inkling is for model_type inkling, inkling_mm_model, inkling_text", "'inkling2'",
                   code=2)  # fmt: skip


def test_the_name_table_maps_every_native_text_tensor_and_reads_it_back(source):
    """formats/names.py's Inkling table: each native text-model tensor of the fixture has the name
    convert_inkling_int4.py gives it, and the reader's inverse gives the native name back (stacks keep their text
    names: their rows are de-interleaved)."""
    from colitools.formats.names import inkling_native_name, inkling_text_name

    stacks = {"mlp.experts.w13_weight", "mlp.experts.w2_weight", "mlp.shared_experts.shared_w13_weight",
              "mlp.shared_experts.shared_w2_weight"}  # fmt: skip
    for name in source:
        if name.startswith(("model.audio.", "model.visual.")) or name.split(".", 4)[-1] in stacks:
            continue
        text = inkling_text_name(name)
        assert text is not None and not text.startswith("model.llm."), name
        assert inkling_native_name(text) == name
    assert inkling_text_name("model.llm.layers.0.mlp.w13_dn.weight") is None  # a dense w13: not split (refused)
    assert inkling_text_name("model.language_model.embed_tokens.embed_norm.weight") == "model.embed_norm.weight"


def test_a_tensor_the_engine_looks_up_by_no_name_is_refused_in_one_line(source, tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    extra = {**source, "model.llm.layers.0.mlp.w13_dn.weight": np.zeros((2 * 96, H), np.float32)}
    write_safetensors(folder / "model.safetensors", extra)
    shutil.copy(FIXTURE / "config.json", folder / "config.json")
    with pytest.raises(ConvertError) as info:
        convert(str(folder), tmp_path / "out", ConvertOptions(target="inkling", progress=False, min_free_gb=0.0))
    message = str(info.value)
    assert "model.llm.layers.0.mlp.w13_dn.weight" in message and "c/inkling.c" in message and "\n" not in message
    assert info.value.exit_code == 2 and not (tmp_path / "out").exists()


def test_stacks_of_different_formats_are_a_verify_problem(outputs, tmp_path):
    """c/inkling.c decides int4 / int8 once, from the first MoE layer's gate_up_proj: a container whose layer 1
    stacks are int8 next to int4 ones is reported, naming them."""
    from colitools.verify.container import verify_container

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    int4, int8 = _read(outputs["int4-f32"]), _read(outputs["int8-f32"])
    tensors = {n: (int8[n] if n.startswith("model.layers.1.mlp.experts.") else v) for n, v in int4.items()}
    write_safetensors(mixed / "model.safetensors", tensors)
    shutil.copy(FIXTURE / "config.json", mixed / "config.json")
    report = verify_container(mixed)
    assert not report.ok
    assert any("model.layers.1.mlp.experts.gate_up_proj is int8-row" in p and "one format" in p for p in report.problems)


def test_a_fused_stack_without_config_is_named_or_reported_unresolved(outputs):
    """Without config.json a fused stack's rows (hidden size, expert width, expert count) are unknown: never
    guessed. A ResolveError naming the stack, or with report_unresolved the stack marked unresolved."""
    got = resolve_without_config(outputs["int4"], r"fused expert stack \S+experts\.gate_up_proj .*needs config.json")
    stacks = {n: t for n, t in got.items() if n.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))}
    assert stacks and all(t.kind == "unresolved" and "there is none" in t.problem for t in stacks.values())
