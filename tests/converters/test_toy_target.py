"""What adding a ``--target`` takes (docs/INTERNALS.md "How to add"), shown by adding one here: ``toy-olmoe``, an
OLMoE variant with merged int8 experts, bf16 dense tensors and a metadata file of its own. It is one ``Target(...)``
of ``formats/targets/`` (registered in ``TARGETS`` for one test, then removed); nothing else is edited, and the
converter writes its layout: the merged blobs, the dense tensors in bf16, the meta file, and the manifest."""

from __future__ import annotations

import json
from pathlib import Path

from convcheck import stored_tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.formats import targets
from colitools.formats.expert_layouts import INT8_ROW
from colitools.formats.targets import MERGED, PAIRS_ONLY, MetaFile, Target, _floats
from colitools.verify.container import verify_container

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "olmoe_target"


def test_a_target_is_one_entry_of_formats_targets(tmp_path, monkeypatch):
    toy = Target(
        "toy-olmoe",
        "toy.c (load_t, load_expert_merged)",
        help="merged int8 experts, bf16 dense tensors, toy_meta.json; model_type olmoe only.",
        model_types=("olmoe",),
        reads=(("experts", (INT8_ROW,)), *_floats("bf16"), *PAIRS_ONLY),
        defaults=(("experts", INT8_ROW), ("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
        experts=MERGED,
        meta=MetaFile("toy_meta.json", lambda config, shapes, experts, gs, down: {"experts": experts}),
    )
    monkeypatch.setitem(targets.TARGETS, toy.name, toy)
    out = tmp_path / "out"
    convert(str(FIXTURE), out, ConvertOptions(target=toy.name, progress=False, min_free_gb=0.0))
    convert(str(FIXTURE), tmp_path / "olmoe", ConvertOptions(target="olmoe", progress=False, min_free_gb=0.0))
    got, olmoe = stored_tensors(out), stored_tensors(tmp_path / "olmoe")
    experts = [n for n in got if ".experts." in n]
    assert experts and all(got[n][2].tobytes() == olmoe[n][2].tobytes() for n in experts)  # the merged int8 blobs
    dense = [n for n in got if ".experts." not in n and not n.endswith(".qs")]
    linear = [n for n in dense if n.endswith(("_proj.weight", "embed_tokens.weight", "lm_head.weight"))]
    assert linear and {got[n][0] for n in linear} == {"BF16"} and {olmoe[n][0] for n in linear} == {"F32"}
    assert set(got) == set(olmoe) and all(got[n][0] == olmoe[n][0] for n in dense if n not in linear)  # norms
    assert json.loads((out / "toy_meta.json").read_text()) == {"experts": INT8_ROW}
    report = verify_container(out, hashes=True, progress=False)  # and colitools' readers read it back
    assert report.ok, report
