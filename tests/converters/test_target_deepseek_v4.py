"""``convert --target deepseek_v4``: colibri's DeepSeek-V4 engine layout (c/deepseek_v4.c), written and read back.

Facts followed (colibri, read for facts only). ``coli_v4_layer_plan`` lists every tensor of layer ``L`` as
``layers.{L}.{leaf}`` (``add_spec``: no ``model.`` prefix) and ``coli_v4_layer_validate`` requires each by name,
dtype, rank and shape ("missing tensor", "dtype/rank mismatch", "shape mismatch"); ``add_fp8`` adds
``{p}.weight`` F8_E4M3 ``[O, I]`` + ``{p}.scale`` F8_E8M0 ``[ceil(O/128), ceil(I/128)]``, and
``coli_tensor_load_fp8`` decodes ``e4m3(code) * 2^(e8m0 - 127)`` per 128x128 block. The routed experts' store
reads ``layers.{L}.ffn.experts.{E}.w{1,2,3}.weight`` / ``.scale`` (``expert_record_bytes``): FP4 E2M1 pairs as I8
``[O, I/2]`` with one F8_E8M0 byte per 32 inputs ``[O, I/32]`` (``expert_dtype: fp4``). The embedding, head and
final norm go through ``coli_tensor_load_f32`` (BF16 or F32), the head cache's ``find_head``
(``coli_v4_head_cache_load``) requires ``head.weight`` BF16 of rank 2, the hyper head ``hc_head_fn`` / ``_base``
/ ``_scale`` F32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from convcheck import stored_tensors
from safetensors.numpy import load_file

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ConvertError

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
FIXTURE = ORACLES / "deepseek_v4"
CONFIG = json.loads((FIXTURE / "config.json").read_text())
RECIPE = "target-deepseek_v4"


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    out = tmp_path_factory.mktemp("target-deepseek_v4") / "out"
    convert(str(FIXTURE), out, ConvertOptions(target="deepseek_v4", progress=False, min_free_gb=0.0))
    return out


# ----------------------------------------------------------------- coli_v4_layer_plan, restated from the C code
def layer_plan(c: dict, layer: int, ratio: int, hashed: bool) -> dict[str, tuple[str, tuple[int, ...]]]:
    """c/deepseek_v4.c ``coli_v4_layer_plan``: name -> (dtype, shape) of every tensor it validates."""
    hidden, heads, head_dim = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    q_rank, experts, moe, hc = (
        c["q_lora_rank"],
        c["n_routed_experts"],
        c["moe_intermediate_size"],
        c["hc_mult"],
    )
    o_group_width = (heads // c["o_groups"]) * head_dim
    o_width = c["o_groups"] * c["o_lora_rank"]
    hc_params = (2 + hc) * hc
    plan: dict[str, tuple[str, tuple[int, ...]]] = {}

    def add(dtype: str, shape: tuple[int, ...], leaf: str) -> None:
        plan[f"layers.{layer}.{leaf}"] = (dtype, shape)

    def add_fp8(rows: int, columns: int, prefix: str) -> None:
        add("F8_E4M3", (rows, columns), f"{prefix}.weight")
        add("F8_E8M0", (-(-rows // 128), -(-columns // 128)), f"{prefix}.scale")

    add("F32", (heads,), "attn.attn_sink")
    add("BF16", (head_dim,), "attn.kv_norm.weight")
    add("BF16", (q_rank,), "attn.q_norm.weight")
    add_fp8(head_dim, hidden, "attn.wkv")
    add_fp8(o_width, o_group_width, "attn.wo_a")
    add_fp8(hidden, o_width, "attn.wo_b")
    add_fp8(q_rank, hidden, "attn.wq_a")
    add_fp8(heads * head_dim, q_rank, "attn.wq_b")
    add("BF16", (hidden,), "attn_norm.weight")
    if ratio:
        coff = 2 if ratio == 4 else 1
        add("F32", (ratio, coff * head_dim), "attn.compressor.ape")
        add("BF16", (head_dim,), "attn.compressor.norm.weight")
        add("BF16", (coff * head_dim, hidden), "attn.compressor.wgate.weight")
        add("BF16", (coff * head_dim, hidden), "attn.compressor.wkv.weight")
    if ratio == 4:
        ih, n = c["index_head_dim"], c["index_n_heads"]
        add("F32", (4, 2 * ih), "attn.indexer.compressor.ape")
        add("BF16", (ih,), "attn.indexer.compressor.norm.weight")
        add("BF16", (2 * ih, hidden), "attn.indexer.compressor.wgate.weight")
        add("BF16", (2 * ih, hidden), "attn.indexer.compressor.wkv.weight")
        add("BF16", (n, hidden), "attn.indexer.weights_proj.weight")
        add_fp8(n * ih, q_rank, "attn.indexer.wq_b")
    add("BF16", (experts, hidden), "ffn.gate.weight")
    if hashed:
        add("I64", (c["vocab_size"], c["num_experts_per_tok"]), "ffn.gate.tid2eid")
    else:
        add("F32", (experts,), "ffn.gate.bias")
    add_fp8(moe, hidden, "ffn.shared_experts.w1")
    add_fp8(hidden, moe, "ffn.shared_experts.w2")
    add_fp8(moe, hidden, "ffn.shared_experts.w3")
    add("BF16", (hidden,), "ffn_norm.weight")
    add("F32", (hc_params,), "hc_attn_base")
    add("F32", (hc_params, hc * hidden), "hc_attn_fn")
    add("F32", (3,), "hc_attn_scale")
    add("F32", (hc_params,), "hc_ffn_base")
    add("F32", (hc_params, hc * hidden), "hc_ffn_fn")
    add("F32", (3,), "hc_ffn_scale")
    return plan


def expert_tensors(c: dict, layer: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The expert store's tensors (``expert_record_bytes``' names): FP4 I8 ``[O, I/2]`` + E8M0 ``[O, I/32]``."""
    hidden, moe = c["hidden_size"], c["moe_intermediate_size"]
    out = {}
    for e in range(c["n_routed_experts"]):
        for w, (O, I) in (("w1", (moe, hidden)), ("w2", (hidden, moe)), ("w3", (moe, hidden))):
            out[f"layers.{layer}.ffn.experts.{e}.{w}.weight"] = ("I8", (O, I // 2))
            out[f"layers.{layer}.ffn.experts.{e}.{w}.scale"] = ("F8_E8M0", (O, I // 32))
    return out


GLOBALS = {  # coli_tensor_load_f32 (BF16 or F32; the released BF16), find_head (BF16), the hyper head (F32)
    "embed.weight": ("BF16", (CONFIG["vocab_size"], CONFIG["hidden_size"])),
    "head.weight": ("BF16", (CONFIG["vocab_size"], CONFIG["hidden_size"])),
    "norm.weight": ("BF16", (CONFIG["hidden_size"],)),
    "hc_head_fn": ("F32", (CONFIG["hc_mult"], CONFIG["hc_mult"] * CONFIG["hidden_size"])),
    "hc_head_base": ("F32", (CONFIG["hc_mult"],)),
    "hc_head_scale": ("F32", (1,)),
}


def expected_tensors() -> dict[str, tuple[str, tuple[int, ...]]]:
    ratios = [CONFIG["compress_rates"][kind] for kind in CONFIG["layer_types"]]  # [4, 8]
    want = dict(GLOBALS)
    for layer, ratio in enumerate(ratios):
        want |= layer_plan(CONFIG, layer, ratio, CONFIG["mlp_layer_types"][layer] == "hash_moe")
        want |= expert_tensors(CONFIG, layer)
    return want


def test_every_tensor_has_the_name_dtype_and_shape_coli_v4_layer_validate_checks(v4):
    got = {name: (dtype, shape) for name, (dtype, shape, _) in stored_tensors(v4).items()}
    assert got == expected_tensors()  # exactly: nothing missing, nothing extra, every dtype and shape


def test_fp8_projections_are_the_e8m0_rule_of_the_fixture_weights(v4):
    """Codes and scale bytes against a restatement of the rule (docs/FORMATS.md §2.9) on the source's values."""
    src = load_file(str(FIXTURE / "model.safetensors"))
    stored = stored_tensors(v4)
    checked = 0
    for name, (dtype, _, codes) in stored.items():
        if dtype != "F8_E4M3":
            continue
        source = name.replace("layers.", "model.layers.", 1)
        w = src[source].astype(np.float32)
        scale = stored[name[: -len(".weight")] + ".scale"][2].view(np.uint8)
        O, I = w.shape
        want_scale = np.zeros_like(scale)
        want_codes = np.zeros((O, I), np.uint8)
        for bo in range(-(-O // 128)):
            for bi in range(-(-I // 128)):
                block = w[bo * 128 : (bo + 1) * 128, bi * 128 : (bi + 1) * 128]
                x = np.float32(max(float(np.abs(block).max()), 1e-4)) * np.float32(1 / 448)
                k = int(np.ceil(np.log2(np.float64(x))))  # x is never a power of two here
                want_scale[bo, bi] = k + 127
                q = np.clip(block / np.float32(2.0**k), -448, 448).astype(ml_dtypes.float8_e4m3fn)
                want_codes[bo * 128 : (bo + 1) * 128, bi * 128 : (bi + 1) * 128] = q.view(np.uint8)
        assert np.array_equal(scale, want_scale), name
        assert np.array_equal(codes.view(np.uint8), want_codes), name
        checked += 1
    assert checked == 17  # 5 attention + 3 shared-expert projections per layer, layer 0's indexer wq_b


def test_float_tensors_are_the_bf16_rounding_or_the_f32_bytes_of_the_source(v4):
    src = load_file(str(FIXTURE / "model.safetensors"))
    stored = stored_tensors(v4)
    saved = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base",
             "hc_head_scale": "model.hc_head.hc_scale", "head.weight": "head.weight"}  # fmt: skip
    for name, (dtype, _, data) in stored.items():
        if dtype not in ("BF16", "F32", "I64"):
            continue
        source = saved.get(name) or "model." + name.replace(".attn.kv_norm.", ".attn.norm.")
        want = src[source]
        if dtype == "BF16":
            assert np.array_equal(data.view(np.uint16), want.astype(ml_dtypes.bfloat16).view(np.uint16)), name
        else:
            assert data.tobytes() == want.tobytes(), name


def test_config_json_has_the_released_keys_the_engine_parses(v4):
    config = json.loads((v4 / "config.json").read_text())
    assert config["compress_ratios"] == [4, 8]  # layer_types through compress_rates, no MTP layer
    assert config["num_hash_layers"] == 1  # mlp_layer_types ["hash_moe", "moe"]
    assert config["expert_dtype"] == "fp4" and config["topk_method"] == "noaux_tc"
    assert config["quantization_config"] == {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    assert {k: v for k, v in config.items() if k in CONFIG} == CONFIG  # the transformers keys stay
    manifest = json.loads((v4 / "colitools.json").read_text())
    assert manifest["recipe"]["target"] == "deepseek_v4"
    # coli_v4_config_parse requires rope_scaling {factor, beta_fast, beta_slow, original_max_position_embeddings}
    # (integers for the betas); the fixture's rope has no YaRN: factor 1 makes rope_frequency the plain one
    assert config["rope_scaling"] == {"type": "yarn", "factor": 1.0, "beta_fast": 32, "beta_slow": 1,
                                      "original_max_position_embeddings": 512}  # fmt: skip


def test_rope_scaling_carries_a_yarn_rope_of_the_compressed_layers():
    from colitools.formats.targets import deepseek_v4_rope_scaling

    yarn = {"rope_type": "yarn", "factor": 16.0, "beta_fast": 32, "beta_slow": 1, "rope_theta": 160000.0,
            "original_max_position_embeddings": 65536}  # fmt: skip
    mcfg = {
        "max_position_embeddings": 1048576,
        "rope_parameters": {"main": {"rope_type": "default"}, "compress": yarn},
    }
    assert deepseek_v4_rope_scaling(mcfg) == {"type": "yarn", "factor": 16.0, "beta_fast": 32, "beta_slow": 1,
                                              "original_max_position_embeddings": 65536}  # fmt: skip


def test_an_id_only_tokenizer_is_written_when_the_source_has_none(v4):
    """c/deepseek_v4.c's main loads <dir>/tokenizer.json in every mode (tok_load exits without one): the target
    writes one of vocab_size tokens <|id_N|>, which the tokenizers library reads id for id."""
    from tokenizers import Tokenizer

    assert not (FIXTURE / "tokenizer.json").exists()
    tok = Tokenizer.from_file(str(v4 / "tokenizer.json"))
    assert tok.get_vocab_size() == json.loads((FIXTURE / "config.json").read_text())["vocab_size"]
    assert tok.decode([0, 7, 199], skip_special_tokens=False) == "<|id_0|> <|id_7|> <|id_199|>"


def test_readers_read_the_target_back(v4):
    from colitools.formats.inspect import inspect_path
    from colitools.mirror.scan import discover_shards
    from colitools.runtime.weights import Checkpoint, sanitize
    from colitools.verify.container import verify_container

    report = verify_container(v4)
    assert report.ok, report.problems
    info = inspect_path(v4)
    assert not info.unresolved
    ckpt = Checkpoint(v4, json.loads((v4 / "config.json").read_text()))
    stored = stored_tensors(v4)
    codes, scale = stored["layers.1.attn.wq_b.weight"][2], stored["layers.1.attn.wq_b.scale"][2]
    got = ckpt.dense(sanitize("model.layers.1.attn.wq_b.weight"), 128, 48)  # the runtime's own spelling
    e4m3 = codes.view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(got, e4m3 * np.float32(2.0 ** (int(scale.view(np.uint8)[0, 0]) - 127)))
    # an expert: E2M1 pairs, low nibble = even input, one E8M0 scale per 32 inputs
    packed = stored["layers.0.ffn.experts.3.w2.weight"][2].view(np.uint8)
    e8 = stored["layers.0.ffn.experts.3.w2.scale"][2].view(np.uint8)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    nibbles = np.stack([packed & 0xF, packed >> 4], axis=2).reshape(64, 64)
    want = e2m1[nibbles] * np.repeat(np.ldexp(np.float32(1), e8.astype(np.int32) - 127), 32, axis=1)
    got = ckpt.dense(sanitize("model.layers.0.ffn.experts.3.w2.weight"), 64, 64)
    assert np.array_equal(got, want)
    record = 3 * (64 * 32 + 64 * 2)  # w1, w2, w3: I8 [64, 32] + E8M0 [64, 2] each
    per_expert, routed = {}, set()
    for shard in discover_shards([v4]):
        for key, n in shard.expert_bytes.items():
            per_expert[key] = per_expert.get(key, 0) + n
        routed |= shard.routed
    assert per_expert == {(layer, e): record for layer in (0, 1) for e in range(4)}
    assert routed == set(per_expert)


def test_run_is_token_exact_against_the_oracle_of_the_conversion(v4):
    """The runtime on the target output gives the transformers reference computed on its decoded weights
    (oracles/deepseek_v4/reference/target-deepseek_v4.json): every greedy and teacher-forced token, logits 1e-4."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from oracle_refs import check_against_reference, reference

    check_against_reference(v4, "deepseek_v4", reference("deepseek_v4", RECIPE))
    check_against_reference(v4, "deepseek_v4", reference("deepseek_v4", RECIPE), cap=1)  # placement-free


def test_cli_run_prints_the_oracles_tokens(v4):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import run_cli

    ref = json.loads((FIXTURE / "reference" / f"{RECIPE}.json").read_text())
    r = run_cli("run", v4, "--prompt-ids", ",".join(map(str, ref["prompt_ids"])), "--max-new-tokens", "32",
                "--no-usage", "--ignore-eos", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generated_ids"] == ref["generated_ids"]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(experts="int4-g64"), "`experts=int4-g64` is refused"),
        (dict(experts="fp8"), "`experts=fp8` is refused"),
        (dict(dense="int8-row"), "`dense=int8-row` is refused"),
        (dict(dense="bf16"), "`dense=bf16` is refused"),
        (dict(embed="int8-row"), "`embed=int8-row` is refused"),
        (dict(embed="f32"), "`embed=f32` is refused"),  # find_head: "missing or invalid BF16 head.weight"
        (dict(mtp="int4-row"), "`mtp=int4-row` is refused"),
        (dict(layout="planar"), "`layout=planar` is refused"),
    ],
)
def test_recipes_the_loader_cannot_read_are_refused_in_one_line(tmp_path, options, says):
    with pytest.raises(ConvertError) as info:
        convert(str(FIXTURE), tmp_path / "out", ConvertOptions(target="deepseek_v4", progress=False,
                                                               min_free_gb=0.0, **options))  # fmt: skip
    message = str(info.value)
    assert says in message and "c/deepseek_v4.c" in message and "\n" not in message
    assert info.value.exit_code == 2 and not (tmp_path / "out").exists()


def test_cli_refused_option_exit_2(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
    from cli_helpers import one_line_error, run_cli

    r = run_cli("convert", FIXTURE, tmp_path / "out", "--target", "deepseek_v4", "--dense", "int8-row")
    one_line_error(r, "--target deepseek_v4: --dense int8-row is refused", "reads fp8-e8m0 there", code=2)


def test_fp8_source_with_power_of_two_scales_passes_through_bit_for_bit(tmp_path):
    """A V3-style FP8 source (F8_E4M3 + F32 ``weight_scale_inv``, 128x128 blocks): where every block scale is a
    power of two the e4m3 bytes are kept and the E8M0 byte is ``log2(scale) + 127``; elsewhere the tensor is
    re-encoded from its dequantized values (docs/FORMATS.md §2.9)."""
    from tinyckpt import Tiny, make_checkpoint, write_tensors

    src = tmp_path / "src"
    spec = Tiny(dtype="FP8", hidden=192, inter=160)
    tensors = make_checkpoint(src, spec)
    pow2 = "model.layers.0.self_attn.q_proj.weight"  # [192, 192]: a 2 x 2 grid with partial edge blocks
    k = np.array([[-7, -9], [-8, 0]])
    tensors[pow2 + "_scale_inv"] = np.ldexp(np.float32(1), k).astype(np.float32)
    write_tensors(src, tensors, spec.shards)
    convert(str(src), tmp_path / "out", ConvertOptions(dense="fp8-e8m0", progress=False, min_free_gb=0.0))
    stored = stored_tensors(tmp_path / "out")
    base = pow2[: -len(".weight")]
    dtype, shape, codes = stored[pow2]
    assert (dtype, shape) == ("F8_E4M3", (192, 192)) and stored[base + ".scale"][0] == "F8_E8M0"
    assert codes.tobytes() == tensors[pow2].tobytes()  # the source's e4m3 bytes
    assert stored[base + ".scale"][2].view(np.uint8).tolist() == (k + 127).tolist()
    other = "model.layers.0.self_attn.k_proj.weight"  # random scales: re-encoded by the rule
    w = tensors[other].astype(np.float32) * np.repeat(
        np.repeat(tensors[other + "_scale_inv"], 128, 0), 128, 1)[:192, :192]  # fmt: skip
    scale = stored[other[: -len(".weight")] + ".scale"][2].view(np.uint8).astype(int)
    for bo in range(2):
        for bi in range(2):
            amax = np.float32(np.abs(w[bo * 128 : (bo + 1) * 128, bi * 128 : (bi + 1) * 128]).max())
            assert scale[bo, bi] - 127 == int(np.ceil(np.log2(np.float64(amax * np.float32(1 / 448)))))
    got = stored[other][2].view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    s = np.repeat(np.repeat(np.ldexp(1.0, scale - 127), 128, 0), 128, 1)[:192, :192]
    assert np.all(np.abs(got * s - w) <= np.abs(w) / 16 + s * 2.0**-10)  # within half an e4m3 step
    assert stored[other][2].tobytes() != tensors[other].tobytes()  # re-encoded, not the source bytes


@pytest.mark.parametrize(
    ("scale_shape", "weight_dtype", "says"),
    [
        ((1, 2), ml_dtypes.float8_e4m3fn, "needs weight bytes 3072 and one scale byte per block (fp8-e8m0 [1, 1] = 1"),
        ((1,), ml_dtypes.float8_e4m3fn, "got 3072 and scale [1] = 1"),  # the byte count of [1, 1], not its shape
        (
            (48, 1),
            np.int8,
            "mxfp4 needs 1536 and 96",
        ),  # I8 codes [48, 32] -> [48, 64]: 48 * 64 / 32 scale bytes
    ],
)
def test_a_v4_pair_with_the_wrong_scale_grid_is_refused_in_one_line(
    tmp_path, scale_shape, weight_dtype, says
):
    from colitools.formats.container import resolve_container
    from colitools.formats.errors import ResolveError
    from colitools.formats.safetensors_io import SafetensorsFile, write_safetensors

    path = tmp_path / "model.safetensors"
    shape = (48, 64) if weight_dtype is not np.int8 else (48, 32)
    write_safetensors(path, {
        "layers.0.attn.wq_a.weight": np.zeros(shape, np.uint8).view(weight_dtype),
        "layers.0.attn.wq_a.scale": np.full(scale_shape, 127, np.uint8).view(ml_dtypes.float8_e8m0fnu),
    })  # fmt: skip
    with SafetensorsFile(path) as f, pytest.raises(ResolveError) as info:
        resolve_container([f])
    assert says in str(info.value) and "layers.0.attn.wq_a" in str(info.value) and "\n" not in str(info.value)
