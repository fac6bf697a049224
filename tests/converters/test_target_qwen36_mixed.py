"""``convert --target qwen36 --experts int4-g{gs} --experts-down int8-row``: colibri's mixed expert slab.

Facts followed (colibri, read for facts only; the engine that reads it is ``c/qwen36.c`` of zhyanbo/colibri @
d295eba, its ``Cfg`` comment and ``load_meta``): ``convert_qwen36.py --down-bits 8`` keeps gate and up int4
(``ebits``, ``expert_gs``) and writes down_proj int8 with its own scales (``expert_down_bits`` 8,
``expert_down_gs`` 0: per row); one slab per expert, ``[gate int4 packed | up int4 packed | down int8]``,
``2*inter*hidden`` bytes, told apart from int4 (1.5x) and int8 (3x) by size; ``.qs`` = gate | up | down scales.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from convcheck import stored_tensors as _tensors
from test_target_qwen36 import (
    FIXTURE,
    _pack_int4,
    _quantize_row,
    _quantize_row_grouped,
    _text_config,
    _unpack_int4_to_int8,
)

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ColitoolsError
from colitools.formats.safetensors_io import SafetensorsFile

GS = 32  # two groups per row at the fixture's width 64, so the gate/up scales differ from a row's


def _convert(dest: Path, **kw) -> Path:
    convert(str(FIXTURE), dest, ConvertOptions(progress=False, min_free_gb=0.0, **kw))
    return dest


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-qwen36-mixed")
    return {
        "mixed": _convert(root / "mixed", target="qwen36", experts=f"int4-g{GS}", experts_down="int8-row"),
        "generic": _convert(
            root / "generic", experts=f"int4-g{GS}", experts_down="int8-row", dense="f32", embed="f32"
        ),  # fmt: skip
    }


@pytest.fixture(scope="module")
def source():
    with SafetensorsFile(FIXTURE / "model.safetensors") as src:
        return {n: src.read(n) for n in src.tensors}


def _mixed_slab(gate, up, down):
    """convert_qwen36.py --ebits 4 --gs GS --down-bits 8, restated: gate/up grouped int4 packed as one run of
    nibbles, then down's int8 row codes; scales gate | up | down."""
    (gq, gsc), (uq, usc) = (_quantize_row_grouped(t, 4, GS) for t in (gate, up))
    dq, dsc = _quantize_row(down, 8)
    blob = np.concatenate(
        [_pack_int4(np.concatenate([gq.reshape(-1), uq.reshape(-1)])), dq.reshape(-1).view(np.uint8)]
    )
    return blob, np.concatenate([gsc.reshape(-1), usc.reshape(-1), dsc]).astype(np.float32)


def test_mixed_slabs_are_the_converters_bytes(outputs, source):
    got = _tensors(outputs["mixed"])
    c = _text_config()
    H, I = c["hidden_size"], c["moe_intermediate_size"]
    for layer in range(c["num_hidden_layers"]):
        for e in range(c["num_experts"]):
            src = f"model.language_model.layers.{layer}.mlp.experts.{e}"
            blob_ref, qs_ref = _mixed_slab(
                *(source[f"{src}.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj"))
            )
            base = f"model.layers.{layer}.mlp.experts.{e}"
            _, shape, blob = got[f"{base}.merged_weight"]
            _, sshape, qs = got[f"{base}.qs"]
            assert shape == (2 * I * H,) and sshape == (2 * I * (H // GS) + H,)
            assert blob.tobytes() == blob_ref.tobytes(), base
            assert qs.tobytes() == qs_ref.tobytes(), base


def test_meta_names_the_mixed_slab(outputs):
    meta = json.loads((outputs["mixed"] / "qwen36_meta.json").read_text())
    assert (meta["ebits"], meta["expert_gs"], meta["expert_down_bits"], meta["expert_down_gs"]) == (
        4,
        GS,
        8,
        0,
    )
    manifest = json.loads((outputs["mixed"] / "colitools.json").read_text())
    assert manifest["recipe"]["experts_down"] == "int8-row"


def test_each_part_decodes_as_the_loader_does(outputs):
    """gate/up: the unpacked nibbles times their group scales (matmul_q_gs), down: the int8 bytes times the row
    scale (matmul_qd's per-row path)."""
    from colitools.runtime.weights import Checkpoint

    out = outputs["mixed"]
    ckpt = Checkpoint(out, json.loads((out / "config.json").read_text()))
    got = _tensors(out)
    H = I = 64
    for layer in range(2):
        for e in range(4):
            base = f"model.layers.{layer}.mlp.experts.{e}"
            blob, qs = got[f"{base}.merged_weight"][2], got[f"{base}.qs"][2]
            nib = _unpack_int4_to_int8(blob[: I * H])
            ng = H // GS
            for k, proj in enumerate(("gate_proj", "up_proj")):
                q = nib[k * I * H : (k + 1) * I * H].reshape(I, H).astype(np.float32)
                s = qs[k * I * ng : (k + 1) * I * ng].reshape(I, ng)
                assert np.array_equal(ckpt.dense(f"{base}.{proj}.weight", I, H), q * np.repeat(s, GS, axis=1))
            d = blob[I * H :].view(np.int8).reshape(H, I).astype(np.float32) * qs[2 * I * ng :, None]
            assert np.array_equal(ckpt.dense(f"{base}.down_proj.weight", H, I), d)


def test_runs_token_identical_to_the_generic_container_of_the_same_formats(outputs):
    from colitools.runtime import generate, load_model

    tokens = {}
    for name in ("mixed", "generic"):
        with load_model(outputs[name], record_usage=False) as model:
            tokens[name] = generate(model, [1, 2, 3, 4], 32).generated_ids
    assert len(tokens["mixed"]) == 32 and tokens["mixed"] == tokens["generic"]


def test_verify_container_reads_the_mixed_slabs(outputs):
    from colitools.verify.container import verify_container

    report = verify_container(outputs["mixed"])
    assert report.ok, report.problems


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            dict(target="qwen36", experts="int4-row", experts_down="int4-row"),
            "`experts_down=int4-row` is refused",
        ),
        (dict(target="qwen36", experts="int8-row", experts_down="mxfp4"), "`experts_down=mxfp4` is refused"),
        (dict(target="olmoe", experts="int8-row", experts_down="int4-row"), "reads gate, up and down in one"),
    ],
)
def test_a_down_format_the_loader_cannot_read_is_refused_in_one_line(tmp_path, options, says):
    src = FIXTURE if options["target"] == "qwen36" else FIXTURE.parent / "olmoe_target"
    with pytest.raises(ColitoolsError, match=says) as exc:
        convert(str(src), tmp_path / "out", ConvertOptions(progress=False, min_free_gb=0.0, **options))
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "out" / "colitools.json").exists()
