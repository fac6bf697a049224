"""Issue 43 item 4: a mirror's leftovers of a larger selection (listed, pruned on request, verified as the engine
would read them), and what `mirror plan` / `stage` print when nothing is admitted."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from mirror_builders import (
    run_cli,
    three_shard_model,
)

from colitools.mirror.plan import plan_mirror
from colitools.mirror.stage import stage_mirror
from colitools.mirror.verify import verify_mirror

MIB = 1 << 20


@pytest.fixture
def model(tmp_path) -> Path:
    """a: expert (0,0) used 100x; b: (0,1) used 10x; c: (1,0) used once. Each shard 7216 bytes."""
    return three_shard_model(tmp_path, {(0, 0): 100, (0, 1): 10, (1, 0): 1})


def stage_cli(model: Path, mirror: Path, budget: int, *extra: str):
    return run_cli("mirror", "stage", "--model", str(model), "--mirror", str(mirror), "--budget-gib",
                   str(budget / 2**30), "--reserve-gib", "0", *extra)  # fmt: skip


def corrupt_data_byte(path: Path) -> None:
    """One data byte flipped, header and size untouched: the engine would still accept the file."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_smaller_stage_lists_the_shards_it_no_longer_selects_and_prune_removes_them(model, tmp_path):
    mirror = tmp_path / "mirror"
    size = (model / "a.safetensors").stat().st_size
    assert stage_cli(model, mirror, 3 * size).returncode == 0
    (mirror / "notes.txt").write_text("not a shard of the model: never touched")
    kept = stage_cli(model, mirror, size)
    assert kept.returncode == 0, kept.stderr
    assert "no longer selected" in kept.stdout and "b.safetensors, c.safetensors" in kept.stdout
    assert "--prune" in kept.stdout
    assert (mirror / "b.safetensors").is_file() and (mirror / "c.safetensors").is_file()  # not removed without it
    data = json.loads(stage_cli(model, mirror, size, "--json").stdout)
    assert (data["unselected"], data["pruned"]) == (["b.safetensors", "c.safetensors"], [])
    pruned = stage_cli(model, mirror, size, "--prune")
    assert pruned.returncode == 0 and "pruned (no longer selected): b.safetensors, c.safetensors" in pruned.stdout
    assert sorted(p.name for p in mirror.iterdir() if not p.name.startswith(".")) == ["a.safetensors", "notes.txt"]
    assert (mirror / "a.safetensors").read_bytes() == (model / "a.safetensors").read_bytes()


def test_verify_checks_a_leftover_the_engine_would_read_receipt_or_not(model, tmp_path):
    mirror = tmp_path / "mirror"
    size = (model / "a.safetensors").stat().st_size
    stage_mirror(model, mirror, budget_bytes=3 * size, reserve_bytes=0, progress=False)
    assert stage_mirror(model, mirror, budget_bytes=size, reserve_bytes=0, progress=False).ready
    corrupt_data_byte(mirror / "c.safetensors")  # the receipt lists a only
    for v in (verify_mirror(mirror), verify_mirror(mirror, model)):
        assert not v.ready
        assert [f.name for f in v.files if not f.ok] == ["c.safetensors"]
    shutil.copy(model / "c.safetensors", mirror / "c.safetensors")
    good = verify_mirror(mirror)  # b and c good copies: ready, and checked
    assert good.ready and [(f.name, f.in_receipt) for f in good.files] == [
        ("a.safetensors", True), ("b.safetensors", False), ("c.safetensors", False)]
    corrupt_data_byte(mirror / "c.safetensors")
    r = run_cli("mirror", "verify", "--mirror", str(mirror))
    assert r.returncode == 4 and "ready: no" in r.stdout and "not in the receipt" in r.stdout
    again = stage_cli(model, mirror, size)  # stage's own verify sees it too
    assert again.returncode == 4 and "ready: no" in again.stdout
    (mirror / "b.safetensors").write_bytes(b"not what the engine reads: another size")
    assert stage_cli(model, mirror, size, "--prune").returncode == 0
    assert verify_mirror(mirror).ready


def test_plan_that_is_not_admitted_prints_no_selection_free_space_or_speed_up(model, tmp_path):
    r = run_cli("mirror", "plan", "--model", str(model), "--mirror", str(tmp_path / "mirror"),
                "--budget-gib", "1", "--reserve-gib", "1000000")  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "admitted: no (free_space_reserve)" in r.stdout
    assert "selected" not in r.stdout and "projected free" not in r.stdout and "predicted" not in r.stdout
    assert "nothing to copy: copying the selection (21.14 KiB) would leave less than the" in r.stdout
    assert "free -" not in r.stdout and "-" not in r.stdout.split("budget", 1)[1].split("\n", 1)[0]


def test_stage_refusal_is_an_error_line(model, tmp_path):
    r = stage_cli(model, tmp_path / "mirror", 100)
    assert r.returncode == 2
    assert r.stderr.startswith("colitools: error: refused (no_usage_ranked_shards_fit_the_budget): nothing copied")


def test_sizes_are_printed_in_the_unit_that_shows_them(model, tmp_path, monkeypatch):
    from colitools.mirror.plan import format_bytes

    assert [format_bytes(n) for n in (0, 1023, 7216, int(7.5 * MIB), 3 << 30, 5 << 40)] == [
        "0 B", "1023 B", "7.05 KiB", "7.50 MiB", "3.00 GiB", "5.00 TiB"]
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100 * MIB, 90 * MIB, 10 * MIB))
    p = plan_mirror(model, tmp_path / "mirror", budget_bytes=1 << 30, reserve_bytes=10 * MIB - 100)
    assert not p.admitted
    warning = next(w for w in p.warnings if "no selectable shard" in w)
    assert "0.00 GiB" not in warning
    assert "10.00 MiB free" in warning and "room for 100 B" in warning and "needs 7.05 KiB" in warning
