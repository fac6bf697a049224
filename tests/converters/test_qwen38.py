"""Issue 29, Qwen3.8 (transformers' ``qwen4_exp``) converts as released: its PLE n-gram tables (row shards
``ple.ple_embedding.ngram_embedding.shard_{k}.weight``) take the ``--embed`` option like an embedding, their I64
hash buffers are copied unchanged, the hyper-connection mixers are linear weights (``--dense``), the router F32.

The source is the committed ``oracles/qwen38`` fixture (transformers' own ``save_pretrained`` of
``Qwen4ExpForConditionalGeneration``); the expected values are read from its safetensors with the ``safetensors``
package, not from the converter. Every recipe's per-tensor formats against the oracle generator's own role table:
``tests/test_oracle_fixtures.py::test_conversion_only_fixture_converts_to_the_reference_formats``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.safetensors_io import SafetensorsFile
from colitools.verify.container import verify_container

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "qwen38"
L0 = "model.language_model.layers.0."
SHARDS = [f"{L0}ple.ple_embedding.ngram_embedding.shard_{k}.weight" for k in (0, 1)]
HASH_BUFFERS = [f"{L0}ple.ple_embedding.{b}" for b in ("layer_multipliers", "ngram_heads_offsets",
                                                        "ngram_heads_vocab_sizes")]  # fmt: skip
MIXERS = [f"{L0}attn_hyper_connection.{w}.weight" for w in ("input_mix_weight_down", "input_mix_weight_up",
                                                            "block_inject_weight")]  # fmt: skip


RAW = {"BF16": "<u2", "F32": "<f4", "I64": "<i8", "U8": "u1", "I8": "i1"}  # BF16 as its 16-bit patterns


def raw_tensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (safetensors dtype, values) of one file, read from its header and data directly."""
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name != "__metadata__":
            a, b = info["data_offsets"]
            data = np.frombuffer(blob[8 + n + a : 8 + n + b], dtype=RAW[info["dtype"]])
            out[name] = (info["dtype"], data.reshape(info["shape"]))
    return out


def source() -> dict[str, np.ndarray]:
    return {k: v for k, (_, v) in raw_tensors(FIXTURE / "model.safetensors").items()}


def written(out: Path) -> dict[str, tuple[str, bool, np.ndarray]]:
    """name -> (dtype, has a colitools.shapes entry, raw values) of every tensor the container holds."""
    res = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        meta = json.loads((SafetensorsFile(shard).metadata or {}).get("colitools.shapes", "{}"))
        for name, (dtype, values) in raw_tensors(shard).items():
            res[name] = (dtype, name in meta, values)
    return res


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen38")
    out = {}
    recipes = {"default": {}, "embed-bf16": {"embed": "bf16"}, "embed-f32": {"embed": "f32"}}
    for label, opts in recipes.items():
        summary = convert(str(FIXTURE), root / label, ConvertOptions(**opts))
        assert summary.fallbacks == []
        assert verify_container(root / label).problems == []
        out[label] = (written(root / label), summary)
    return out


def test_ngram_table_shards_are_int8_row_embeddings_by_default(converted):
    tensors, summary = converted["default"]
    for name in SHARDS:
        dtype, shaped, codes = tensors[name]
        assert (dtype, shaped, codes.shape) == ("U8", True, (76, 8)), name  # int8-row codes, one scale a row
        assert tensors[name + ".qs"][2].shape == (76,)
    assert summary.formats_per_role["embed"] == {"int8-row": 3}  # embed_tokens + the two shards


def test_ngram_table_shards_keep_their_bf16_bytes_with_embed_bf16(converted):
    src = source()
    tensors, _ = converted["embed-bf16"]
    for name in SHARDS:
        dtype, shaped, values = tensors[name]
        assert dtype == "BF16" and not shaped
        assert np.array_equal(values, src[name]), name


def test_ngram_table_shards_decode_exactly_with_embed_f32(converted):
    src = source()
    tensors, _ = converted["embed-f32"]
    for name in SHARDS:
        want = (src[name].astype(np.uint32) << 16).view(np.float32)  # BF16 -> F32 is exact
        assert tensors[name][0] == "F32" and np.array_equal(tensors[name][2], want), name


def test_ple_hash_buffers_are_copied_unchanged(converted):
    src = source()
    tensors, summary = converted["default"]
    for name in HASH_BUFFERS:
        dtype, _, values = tensors[name]
        assert dtype == "I64" and np.array_equal(values, src[name]), name
    assert int(src[HASH_BUFFERS[0]].max()) > 2**53  # multipliers a float would round
    assert summary.formats_per_role["copied non-float"] == {"I64 (copied)": 3}


def test_hyper_connection_mixers_are_dense_and_router_f32(converted):
    tensors, _ = converted["default"]
    for name in MIXERS:
        assert tensors[name][:2] == ("U8", True), name
    assert tensors[f"{L0}attn_hyper_connection.hc_norm.weight"][0] == "F32"
    assert tensors[f"{L0}mlp.gate.weight"][:2] == ("F32", False)
