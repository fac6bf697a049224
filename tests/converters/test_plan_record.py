"""The recorded plan (``converters/plan_record.py``): a resume reuses it when the sources, the recipe and the code
are those it was made from, plans afresh otherwise, never runs anything but colitools' own classes from it, and a
finished output holds no record."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from convcheck import listing, snapshot
from tinyckpt import Tiny, make_checkpoint

from colitools.converters import plan_record
from colitools.converters.ledger import Ledger
from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert, plan_for
from colitools.converters.sources import LocalFolderSource

SPEC = Tiny(layers=3, experts=4, hidden=128, inter=64, shards=3, dtype="FP8")
OPTIONS = ConvertOptions(min_free_gb=0, progress=False)


@pytest.fixture
def started(tmp_path):
    """A source and an output folder as a conversion leaves them once it started: ledger open, plan recorded."""
    make_checkpoint(tmp_path / "src", SPEC)
    src, out = LocalFolderSource(tmp_path / "src"), tmp_path / "out"
    planned = plan_for(src, out, OPTIONS)
    assert not planned.recorded  # nothing recorded yet: planned afresh
    Ledger.open(out, planned.plan, src.describe(), planned.identities)
    plan_record.record(out, planned.plan, planned.key)
    return tmp_path / "src", out, planned


def _plan_facts(plan) -> list:
    """Everything a conversion takes from a plan: units, files with their entries, sizes, metadata, and every
    job's source and target."""
    return [
        (u.key, u.shards, u.in_bytes, [(f.name, f.size, f.entries, f.metadata) for f in u.files],
         [(j.out_name, j.source, j.target, j.O, j.I, j.fused_rows) for j in u.jobs])
        for u in plan.units
    ]  # fmt: skip


def test_a_resume_reuses_the_recorded_plan(started):
    src, out, first = started
    again = plan_for(LocalFolderSource(src), out, OPTIONS)
    assert again.recorded and again.key == first.key
    assert _plan_facts(again.plan) == _plan_facts(first.plan)
    assert again.plan.format_totals() == first.plan.format_totals()
    assert again.plan.role_formats() == first.plan.role_formats()


def test_a_touched_shard_or_another_recipe_plans_afresh(started):
    src, out, first = started
    other = ConvertOptions(min_free_gb=0, progress=False, experts="int8-row")
    assert not plan_for(LocalFolderSource(src), out, other).recorded
    shard = sorted(src.glob("*.safetensors"))[1]
    os.utime(shard)  # same bytes, new ctime: the shard's identity the ledger records changed
    assert not plan_for(LocalFolderSource(src), out, OPTIONS).recorded


class _Marker:
    """Unpickling this would create the file ``path``."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_record_naming_anything_but_colitools_classes_is_not_run(started, tmp_path):
    src, out, first = started
    marker = tmp_path / "ran"
    (out / plan_record.PLAN_FILE).write_bytes(first.key.encode() + b"\n" + pickle.dumps(_Marker(marker)))
    again = plan_for(LocalFolderSource(src), out, OPTIONS)
    assert not again.recorded and not marker.exists()
    (out / plan_record.PLAN_FILE).write_bytes(first.key.encode() + b"\n" + b"not a pickle")
    assert not plan_for(LocalFolderSource(src), out, OPTIONS).recorded


def test_a_resume_from_the_record_is_byte_identical_and_leaves_no_record(started, tmp_path):
    src, out, _ = started
    ref = tmp_path / "ref"
    convert(str(src), ref, OPTIONS)
    assert (out / plan_record.PLAN_FILE).is_file()
    cmd = [sys.executable, "-m", "colitools", "convert", str(src), str(out), "--min-free-gb", "0"]
    subprocess.run(cmd, check=True, capture_output=True)
    assert snapshot(out) == snapshot(ref) and listing(out) == listing(ref)
    assert plan_record.PLAN_FILE not in listing(out)


def test_every_targets_plan_reloads_from_its_record():
    """A target's plan holds its spellings and name functions: each loads back (else its resumes plan afresh)."""
    import io
    import json

    from colitools.converters.runner import load_plan
    from colitools.formats import targets
    from colitools.formats.errors import TargetRefused

    oracles = Path(__file__).parents[2] / "oracles"
    folders = [p for p in sorted(oracles.iterdir()) if (p / "config.json").is_file()]
    kinds = {p: json.loads((p / "config.json").read_text()).get("model_type") for p in folders}
    tried = 0
    for target in targets.TARGETS.values():
        for folder in (p for p in folders if kinds[p] in (target.model_types or ())):
            try:
                plan = load_plan(LocalFolderSource(folder), ConvertOptions(target=target.name))
            except TargetRefused:  # a fixture this target's engine cannot run (the next one may)
                continue
            again = plan_record._PlanUnpickler(io.BytesIO(pickle.dumps(plan))).load()
            assert _plan_facts(again) == _plan_facts(plan), target.name
            tried += 1
            break
    assert tried >= 3
