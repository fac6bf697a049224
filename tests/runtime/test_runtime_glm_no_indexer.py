"""GLM-5 containers without the DSA indexer (issue 27 item 7): colibri's converter
(``c/tools/convert_fp8_to_int4.py`` without ``--indexer``) leaves ``...self_attn.indexer.*`` out, and c/colibri.c
(``model_init``) then runs dense attention over every key. ``colitools run`` does the same and says so in one
line; on the glm_moe_dsa fixture (``index_topk`` 64 >= its 40 tokens, so every key is selected anyway) the
tokens are the oracle's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from oracle_refs import ORACLES, reference
from safetensors import safe_open
from safetensors.numpy import save_file

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.runtime import load_model

INDEXER = ".self_attn.indexer."


@pytest.fixture(scope="module")
def no_indexer(tmp_path_factory) -> Path:
    """The glm_moe_dsa fixture converted (f32 recipe), then every indexer tensor removed from its shards and
    index, and the manifest dropped: a foreign container as colibri's converter leaves it."""
    out = tmp_path_factory.mktemp("glm-no-indexer") / "out"
    convert(str(ORACLES / "glm_moe_dsa"), out, ConvertOptions(experts="f32", dense="f32", embed="f32",
                                                               progress=False, min_free_gb=0.0))  # fmt: skip
    removed = 0
    for shard in sorted(out.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as f:
            meta = f.metadata()
            kept = {n: f.get_tensor(n) for n in f.keys() if INDEXER not in n}  # noqa: SIM118
            removed += len(list(f.keys())) - len(kept)
        save_file(kept, str(shard), metadata=meta)
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {n: s for n, s in index["weight_map"].items() if INDEXER not in n}
    index_path.write_text(json.dumps(index))
    (out / "colitools.json").unlink()
    assert removed == 2 * 5  # wq_b, wk, k_norm.weight / .bias, weights_proj of both layers
    return out


def test_runs_dense_attention_token_exact(no_indexer):
    ref = reference("glm_moe_dsa", "f32")
    prompt, n = [int(t) for t in ref["prompt_ids"]], len(ref["generated_ids"])
    with load_model(no_indexer, record_usage=False) as model:
        assert all(getattr(layer.attn, "indexer", None) is None for layer in model.layers)
        assert model.generate(prompt, n) == [int(t) for t in ref["generated_ids"]]
        model.reset()
        argmax, _ = model.score([int(t) for t in ref["teacher_forced"]["input_ids"]])
    assert argmax == [int(t) for t in ref["teacher_forced"]["argmax"]]


def test_cli_says_so_in_one_line(no_indexer):
    ids = ",".join(map(str, reference("glm_moe_dsa", "f32")["prompt_ids"]))
    r = subprocess.run([sys.executable, "-m", "colitools", "run", str(no_indexer), "--prompt-ids", ids,
                        "--max-new-tokens", "2", "--no-usage"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "DSA indexer" in line]
    assert notes == [
        f"colitools: note: {no_indexer}: no DSA indexer (model.layers.0.self_attn.indexer.wq_b.weight is "
        "absent): dense attention over every key, as c/colibri.c runs such a container (exact while the "
        "context is <= index_topk 64)"
    ]


def test_a_container_with_the_indexer_keeps_it(tmp_path):
    out = tmp_path / "out"
    shutil.copytree(ORACLES / "glm_moe_dsa", out)
    with load_model(out, record_usage=False) as model:
        assert all(layer.attn.indexer is not None for layer in model.layers)
