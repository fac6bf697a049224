"""Issue 25 item 1: Qwen3-VL-MoE and Llama-4 expert stacks, ``gate_up_proj [E, H, 2I]`` with gate = the first I
columns (transformers ``chunk(2, dim=-1)``) and ``down_proj [E, I, H]`` (docs/FORMATS.md §5 "Expert stacks").

The expected per-expert weights are cut from the stacks here with numpy (``stack[e][:, :I].T``), not by the
converter's slicing; Qwen3-VL-MoE's stacks as transformers 5.24 saves them (``[E, 2I, H]`` / ``[E, H, I]``) must
give the same container as the published layout, and a square stack is decided by its module's other stack.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats.safetensors_io import SafetensorsFile
from colitools.runtime import load_model

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
F32 = ConvertOptions(experts="f32", dense="f32", embed="f32")
TOWERS = {"qwen3_vl_moe": ("model.visual.",), "llama4": ("vision_model.", "multi_modal_projector.")}


def output_tensors(out: Path) -> dict[str, np.ndarray]:
    tensors = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        f = SafetensorsFile(shard)
        tensors.update({n: np.array(f.read(n)) for n in f.tensors})
        f.close()
    return tensors


def stacks_of(folder: Path) -> dict[str, np.ndarray]:
    return {n: w for n, w in load_file(str(folder / "model.safetensors")).items() if n.endswith(("_up_proj", "down_proj"))
            and ".experts." in n}  # fmt: skip


@pytest.mark.parametrize("fixture", ["qwen3_vl_moe", "llama4"])
def test_gate_is_the_first_columns_and_up_the_last(fixture, tmp_path):
    convert(str(ORACLES / fixture), tmp_path / "o", F32)
    out = output_tensors(tmp_path / "o")
    stacks = stacks_of(ORACLES / fixture)
    assert stacks
    for name, w in stacks.items():
        base = name.rpartition(".")[0]
        E = w.shape[0]
        for e in range(E):
            if name.endswith("gate_up_proj"):
                I = w.shape[2] // 2
                assert np.array_equal(out[f"{base}.{e}.gate_proj.weight"], w[e][:, :I].T)
                assert np.array_equal(out[f"{base}.{e}.up_proj.weight"], w[e][:, I:].T)
            else:
                assert np.array_equal(out[f"{base}.{e}.down_proj.weight"], w[e].T)
        assert name not in out


def _rows_copy(src: Path, dst: Path) -> None:
    """The fixture with its stacks as transformers 5.24 saves Qwen3-VL-MoE: ``[E, 2I, H]`` / ``[E, H, I]``."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("reference"))
    tensors = load_file(str(src / "model.safetensors"))
    rows = {
        n: np.ascontiguousarray(w.transpose(0, 2, 1)) if n in stacks_of(src) else w
        for n, w in tensors.items()
    }
    save_file(rows, str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("recipe", [F32, ConvertOptions()], ids=["f32", "default"])
def test_qwen3_vl_moe_saved_by_rows_converts_like_the_published_layout(recipe, tmp_path):
    _rows_copy(ORACLES / "qwen3_vl_moe", tmp_path / "rows")
    assert stacks_of(tmp_path / "rows")["model.language_model.layers.0.mlp.experts.gate_up_proj"].shape == (
        4,
        256,
        64,
    )
    convert(str(ORACLES / "qwen3_vl_moe"), tmp_path / "a", recipe)
    convert(str(tmp_path / "rows"), tmp_path / "b", recipe)
    a, b = output_tensors(tmp_path / "a"), output_tensors(tmp_path / "b")
    assert a.keys() == b.keys() and any(".experts.3.down_proj" in n for n in a)
    for n in a:
        assert a[n].dtype == b[n].dtype and np.array_equal(a[n], b[n]), n


def _square_checkpoint(folder: Path, published: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A one-layer qwen3_vl_moe text checkpoint with H = 2I = 32 (``gate_up_proj`` square), stacks in the published
    or the transformers-saved layout; returns the true per-expert ``[O, I]`` weights."""
    H, I, E, V = 32, 16, 2, 8
    truth = {}
    gate_up, down = np.empty((E, H, 2 * I), np.float32), np.empty((E, I, H), np.float32)
    for e in range(E):
        g, u, d = (rng.standard_normal(s).astype(np.float32) for s in ((I, H), (I, H), (H, I)))
        truth |= {f"gate.{e}": g, f"up.{e}": u, f"down.{e}": d}
        gate_up[e], down[e] = np.concatenate([g.T, u.T], axis=1), d.T
    if not published:
        gate_up, down = gate_up.transpose(0, 2, 1).copy(), down.transpose(0, 2, 1).copy()
    p = "model.language_model."
    tensors = {f"{p}embed_tokens.weight": rng.standard_normal((V, H)).astype(np.float32),
               f"{p}norm.weight": np.ones(H, np.float32), "lm_head.weight": np.ones((V, H), np.float32),
               f"{p}layers.0.mlp.experts.gate_up_proj": gate_up, f"{p}layers.0.mlp.experts.down_proj": down,
               f"{p}layers.0.mlp.gate.weight": np.ones((E, H), np.float32)}  # fmt: skip
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    text = {"model_type": "qwen3_vl_moe_text", "hidden_size": H, "moe_intermediate_size": I, "num_experts": E,
            "num_experts_per_tok": 1, "num_hidden_layers": 1, "vocab_size": V, "num_attention_heads": 2}  # fmt: skip
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_vl_moe", "text_config": text}))
    return truth


@pytest.mark.parametrize("published", [True, False], ids=["published", "saved-by-rows"])
def test_a_square_gate_up_stack_is_decided_by_its_down_stack(published, tmp_path):
    truth = _square_checkpoint(tmp_path / "src", published, np.random.default_rng(25))
    convert(str(tmp_path / "src"), tmp_path / "o", F32)
    out = output_tensors(tmp_path / "o")
    base = "model.language_model.layers.0.mlp.experts"
    for e in range(2):
        for proj in ("gate", "up", "down"):
            assert np.array_equal(out[f"{base}.{e}.{proj}_proj.weight"], truth[f"{proj}.{e}"]), (proj, e)


@pytest.mark.parametrize("fixture", ["qwen3_vl_moe", "llama4"])
def test_towers_kept_or_dropped(fixture, tmp_path):
    towers = sorted(
        n for n in load_file(str(ORACLES / fixture / "model.safetensors")) if n.startswith(TOWERS[fixture])
    )
    assert towers
    convert(str(ORACLES / fixture), tmp_path / "keep", ConvertOptions())
    kept = output_tensors(tmp_path / "keep")
    source = load_file(str(ORACLES / fixture / "model.safetensors"))
    assert all(np.array_equal(kept[n], source[n]) and kept[n].dtype == source[n].dtype for n in towers)
    summary = convert(str(ORACLES / fixture), tmp_path / "drop", ConvertOptions(towers="drop"))
    assert summary.dropped_towers == towers
    assert not any(n.startswith(TOWERS[fixture]) for n in output_tensors(tmp_path / "drop"))


def test_llama4_router_is_f32_and_its_shared_expert_dense(tmp_path):
    convert(str(ORACLES / "llama4"), tmp_path / "o", ConvertOptions())
    f = SafetensorsFile(next((tmp_path / "o").glob("model-*.safetensors")))
    infos = dict(f.tensors)
    f.close()
    p = "language_model.model.layers.1.feed_forward."
    assert infos[p + "router.weight"].dtype == "F32" and list(infos[p + "router.weight"].shape) == [4, 64]
    assert infos[p + "shared_expert.gate_proj.weight"].dtype == "U8"  # int8-row, --dense
    assert p + "shared_expert.gate_proj.weight.qs" in infos


@pytest.mark.parametrize("rows", [False, True], ids=["published", "saved-by-rows"])
def test_the_runtime_runs_the_source_stacks_in_either_layout(rows, tmp_path):
    """The f32 reference's 32 greedy tokens from the source folder itself (no conversion), in the published layout
    and in transformers' [E, 2I, H] one."""
    src = ORACLES / "qwen3_vl_moe"
    if rows:
        _rows_copy(src, tmp_path / "rows")
        src = tmp_path / "rows"
    ref = json.loads((ORACLES / "qwen3_vl_moe" / "reference" / "f32.json").read_text())
    with load_model(src, record_usage=False) as model:
        assert model.generate(ref["prompt_ids"], 32) == ref["generated_ids"]
