"""Big tensors are read, encoded and written by row slabs (``unit_writer._slab_rows``): the output is byte-identical
to encoding each tensor whole and to the reference encoding of the source (``convcheck.check_output``), for every
kind of source and output that slabs; a NaN in a slab gives the whole tensor's message. ``SLAB_BYTES`` is set
small so that the tiny checkpoints' tensors span many slabs (the same code path as a [262144, 7168] embedding)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from convcheck import check_output, snapshot
from tinyckpt import BF16, Tiny, make_checkpoint

from colitools.converters import unit_writer
from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ColitoolsError

CASES = {
    "bf16-int8-int4": (Tiny(layers=2, vocab=300, hidden=128, dtype="BF16"), {"dense": "int4-g64"}),
    "f16-int4-mxfp4": (Tiny(layers=2, vocab=300, hidden=128, dtype="F16"), {"dense": "mxfp4", "embed": "int4-g64"}),
    "f32-int3-f32": (Tiny(layers=2, vocab=300, hidden=128, dtype="F32"), {"dense": "int3-g64", "embed": "f32"}),
    "bf16-bf16": (Tiny(layers=1, vocab=300, hidden=128, dtype="BF16"), {"dense": "bf16", "embed": "bf16"}),
    "fp8-int8-f32": (Tiny(layers=2, vocab=300, hidden=128, dtype="FP8", block=(4, 32)), {"dense": "f32"}),
    "fp8-int4": (Tiny(layers=2, vocab=300, hidden=128, dtype="FP8", block=(4, 32)), {"dense": "int4-g64"}),
}  # fmt: skip


def _convert(src, out, recipe, monkeypatch, slab_bytes):
    monkeypatch.setattr(unit_writer, "SLAB_BYTES", slab_bytes)
    return convert(str(src), out, ConvertOptions(min_free_gb=0, progress=False, **recipe))


@pytest.mark.parametrize("case", list(CASES))
def test_slabs_write_the_bytes_of_whole_tensors(case, tmp_path, monkeypatch):
    spec, recipe = CASES[case]
    tensors = make_checkpoint(tmp_path / "src", spec)
    _convert(tmp_path / "src", tmp_path / "whole", recipe, monkeypatch, 1 << 40)
    # ~7 rows of a 128-wide BF16 tensor per slab (FP8: whole 4-row scale blocks): uneven last slabs everywhere
    _convert(tmp_path / "src", tmp_path / "slabs", recipe, monkeypatch, 1800)
    slabs, slab_errors = _split_errors(snapshot(tmp_path / "slabs"))
    whole, whole_errors = _split_errors(snapshot(tmp_path / "whole"))
    assert slabs == whole
    # the recorded error figures: a slabbed tensor's are its slabs' sums added (docs/INTERNALS.md), equal to the
    # whole tensor's but for the last bits of the float64 sums
    assert slab_errors.keys() == whole_errors.keys() and whole_errors
    for name, figures in whole_errors.items():
        assert slab_errors[name] == pytest.approx(figures, rel=1e-12, abs=1e-300), name
    check_output(tmp_path / "slabs", tensors, {}, block=spec.block)


def _split_errors(snap: dict[str, bytes]) -> tuple[dict[str, bytes], dict[str, list[float]]]:
    """``snap`` without the per-unit error figures of its manifest, and those figures by tensor."""
    manifest = json.loads(snap["colitools.json without run"])
    errors = {n: e for u in manifest["units"].values() for n, e in u.pop("errors", {}).items()}
    return {**snap, "colitools.json without run": json.dumps(manifest, sort_keys=True).encode()}, errors


def test_slab_rows_are_whole_scale_blocks_and_skip_small_tensors(tmp_path, monkeypatch):
    spec = Tiny(layers=1, vocab=300, hidden=128, dtype="FP8", block=(4, 32))
    make_checkpoint(tmp_path / "src", spec)
    monkeypatch.setattr(unit_writer, "SLAB_BYTES", 1800)
    from colitools.converters.runner import load_plan
    from colitools.converters.sources import LocalFolderSource

    plan = load_plan(LocalFolderSource(tmp_path / "src"), ConvertOptions(dense="int8-row"))
    rows = {}
    for u in plan.units:
        for f in u.files:
            for g in f.groups:
                for j in g.jobs:
                    rows[j.out_name] = unit_writer._slab_rows(j, f, g, (4, 32))
    assert rows["model.embed_tokens.weight"] == 1800 // (128 * 2)  # BF16: 7 rows of 256 bytes
    assert rows["model.layers.0.self_attn.q_proj.weight"] == 12  # FP8: 14 rows of 128 bytes -> 3 blocks of 4
    assert rows["model.norm.weight"] is None  # 1-D
    assert rows["model.layers.0.mlp.experts.0.gate_proj.weight"] == 12  # FP8 [32, 128]: 4 KB, slabbed too
    assert rows["model.layers.0.mlp.gate.weight"] is None  # BF16 [4, 128]: 1 KB, under SLAB_BYTES


def test_a_nan_in_a_slab_is_the_whole_tensors_error(tmp_path, monkeypatch):
    spec = Tiny(layers=1, vocab=300, hidden=128, dtype="BF16")
    tensors = make_checkpoint(tmp_path / "src", spec)
    emb = tensors["model.embed_tokens.weight"].astype(np.float32)
    emb[200, 5] = np.nan
    emb[250, 7] = np.inf
    spec.extra = {"model.embed_tokens.weight": emb.astype(BF16)}
    make_checkpoint(tmp_path / "src", spec)
    messages = []
    for slab_bytes, out in ((1 << 40, "whole"), (1800, "slabs")):
        with pytest.raises(ColitoolsError) as err:
            _convert(tmp_path / "src", tmp_path / out, {}, monkeypatch, slab_bytes)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "model.embed_tokens.weight" in messages[1] and "[200, 5]" in messages[1]
