"""Containers written by colibri's converter (1-D codes and ``.qs``, ``out-00000.safetensors``, no metadata, no
index) are read by ``inspect``, ``verify container`` and ``run``, ``[O, I]`` coming from ``config.json`` by tensor
role (docs/FORMATS.md §3, "Foreign containers"; issue 10, "Must show" 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from colibri_layout import SHARD, write_colibri_layout, write_decoded_f32
from safetensors import safe_open

from colitools.errors import RuntimeModelError
from colitools.formats.container import config_shapes
from colitools.formats.inspect import inspect_path
from colitools.formats.model_config import text_config
from colitools.formats.names import is_tower
from colitools.runtime import generate, load_model
from colitools.verify.container import verify_container

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
FIXTURE = "olmoe"  # every width is 64: gs 64 resolves unambiguously (colibri's default --group-size 64)
_SCRIPT = Path(sys.executable).with_name("colitools")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "colitools"]


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    out = tmp_path_factory.mktemp("colibri") / "olmoe_i4"
    formats = write_colibri_layout(ORACLES / FIXTURE, out)
    return out, formats


def _cli(*args):
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def test_fixture_has_colibri_layout(foreign):
    out, formats = foreign
    assert sorted(p.name for p in out.glob("*.safetensors")) == [SHARD]
    assert not (out / "model.safetensors.index.json").exists()
    raw = (out / SHARD).read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert "__metadata__" not in header
    for name in formats:
        assert header[name]["dtype"] == "U8" and len(header[name]["shape"]) == 1
        assert header[name + ".qs"]["dtype"] == "F32" and len(header[name + ".qs"]["shape"]) == 1
    assert {f for f, *_ in formats.values()} == {"int8-row", "int4-row"}  # olmoe: I == 64 everywhere


def test_inspect_and_verify_resolve_every_tensor(foreign):
    out, formats = foreign
    report = inspect_path(out)
    assert report.unresolved == []
    by_name = {t.name: t for t in report.tensors}
    for name, (fmt, gs, O, I) in formats.items():
        t = by_name[name]
        assert (t.kind, t.format.name, t.format.group_size, t.logical_shape) == ("quantized", fmt, gs, (O, I))
    assert verify_container(out).problems == []
    r = _cli("inspect", out)
    assert r.returncode == 0, r.stderr
    r = _cli("verify", "container", out)
    assert r.returncode == 0, r.stdout + r.stderr


def test_run_matches_a_reference_on_the_decoded_weights(foreign, tmp_path):
    out, formats = foreign
    ref_dir = tmp_path / "decoded_f32"
    write_decoded_f32(out, ref_dir, formats)  # an independent path: F32 weights through the float kernels
    prompt = json.loads((ORACLES / FIXTURE / "reference" / "default.json").read_text())["prompt_ids"]
    results = []
    for model_dir in (out, ref_dir):
        with load_model(model_dir, cap=2, record_usage=False) as model:
            res = generate(model, prompt, 16)
            argmax, last = model.score(prompt + res.generated_ids)
        results.append((res.generated_ids, res.last_logits, argmax, last))
    (ids_q, logits_q, am_q, last_q), (ids_f, logits_f, am_f, last_f) = results
    assert ids_q == ids_f and am_q == am_f
    np.testing.assert_allclose(logits_q, logits_f, rtol=0, atol=1e-4)
    np.testing.assert_allclose(last_q, last_f, rtol=0, atol=1e-4)
    r = _cli(
        "run",
        out,
        "--prompt-ids",
        ",".join(map(str, prompt)),
        "--max-new-tokens",
        "4",
        "--no-usage",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generated_ids"] == ids_q[:4]


def test_a_tensor_no_source_gives_a_shape_is_reported_never_guessed(tmp_path):
    out = tmp_path / "c"
    write_colibri_layout(ORACLES / FIXTURE, out, extra_unresolved=True)
    bad = "model.layers.0.self_attn.extra_proj.weight"
    report = inspect_path(out)
    assert report.unresolved == [bad]
    kinds = {t.name: t.kind for t in report.tensors}
    assert kinds[bad] == "unresolved" and kinds["lm_head.weight"] == "quantized"
    problems = verify_container(out).problems
    assert len(problems) == 1 and bad in problems[0] and "[O, I] is unknown" in problems[0]
    with pytest.raises(RuntimeModelError, match=bad):
        load_model(out, cap=2, record_usage=False)
    r = _cli("inspect", out)
    assert r.returncode == 0 and bad in r.stdout and "unresolved" in r.stderr
    r = _cli("run", out, "--prompt-ids", "1,2", "--max-new-tokens", "1", "--no-usage")
    assert r.returncode != 0 and bad in r.stderr


def _known_family(p: Path) -> bool:
    from colitools.formats.families import RUNNABLE_MODEL_TYPES, family_of

    mt = json.loads((p / "config.json").read_text()).get("model_type")
    return mt in RUNNABLE_MODEL_TYPES and not family_of(mt).native_names


# linear_shapes derives geometry only for the known families (RUNNABLE_MODEL_TYPES but those with native names);
# the others get {}.
@pytest.mark.parametrize("fixture", sorted(p.name for p in ORACLES.iterdir()
                                           if (p / "config.json").exists() and _known_family(p)))  # fmt: skip
def test_config_shapes_agree_with_every_fixture(fixture):
    """config.json's derived [O, I] (model_config.linear_shapes) equals the stored shape of every fixture tensor
    it names, and names every 2-D linear weight of the fixtures' families but the DSA indexer."""
    src = ORACLES / fixture
    config = json.loads((src / "config.json").read_text())
    shapes, packed = {}, set()
    for path in src.glob("*.safetensors"):
        with safe_open(str(path), framework="numpy") as f:
            shapes.update({n: tuple(f.get_slice(n).get_shape()) for n in f.keys()})
            # natively quantized codes (INT4 I32 words, NVFP4 U8 pairs, DeepSeek-V4.1's FP4 I8 pairs) are stored
            # narrower than their [O, I]
            packed |= {n for n in f.keys() if f.get_slice(n).get_dtype() in ("I32", "U8", "I8")}
    implied = {n: d for n, d in config_shapes(config, shapes).items() if n not in packed}
    assert implied and all(shapes[n] == dims for n, dims in implied.items())
    linear = [n for n, s in shapes.items() if len(s) == 2 and n.endswith(".weight") and ".indexer." not in n
              and not is_tower(n) and ".attn.compressor." not in n and n not in packed]  # fmt: skip
    # towers have their own geometry (their own config section); DeepSeek-V4's layer compressors are as wide as
    # their layer type makes them (families.v4_shapes)
    n_layers = text_config(config)["num_hidden_layers"]
    layer = f"model.layers.{n_layers}."  # MTP layers' extra projections (eh_proj) are not derived
    # DeepSeek-V4.1 (native names): its DSpark stages (``mtp.{k}.``, its MTP spelling) and engram modules (a lookup
    # table and the projection of its rows, whose width depends on the engram sidecar's heads) are not derived from
    # config.json by the geometry blocks; the runtime checks them at load (families.v41_shapes)
    unchecked = (layer, "mtp.") if fixture == "deepseek_v41" else (layer,)
    assert [n for n in linear if n not in implied and not n.startswith(unchecked)
            and not (fixture == "deepseek_v41" and ".engram." in n)] == []  # fmt: skip
