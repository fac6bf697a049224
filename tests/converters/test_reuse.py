"""``convert --replace`` (converters/reuse.py, docs/FORMATS.md §10): converting again into an existing output
with another budget copies the tensors whose source, format and options are unchanged from it, and gives the
bytes of a fresh conversion with the new options, also after a SIGKILL at any point."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colitools.converters.options import ConvertOptions
from colitools.converters.reuse import DONOR_FILE
from colitools.converters.runner import convert
from colitools.formats.error_stats import SUM_ORDER
from colitools.formats.errors import ConvertError
from colitools.formats.filenames import INDEX_FILE, MANIFEST_FILE
from colitools.formats.safetensors_io import read_header
from tests.converters.midkill import sigkill_when

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "oracles" / "deepseek_v3"
BEFORE, AFTER = 4.0, 4.3  # two budgets (bits per weight) whose allocations share about half the tensors


def _convert(out: Path, **options):
    return convert(str(FIXTURE), out, ConvertOptions(progress=False, **options))


def _files(folder: Path) -> dict[str, bytes]:
    """Every file of an output but its manifest, by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != MANIFEST_FILE}  # fmt: skip


def _manifest(folder: Path) -> dict:
    data = json.loads((folder / MANIFEST_FILE).read_text())
    data.pop("run", None)  # times and counters of the last run
    data.get("budget", {}).pop("measurement", None)  # this run's: measured or read from the cache, its seconds
    return data


def _formats(folder: Path) -> dict[str, str]:
    return {t: v["format"] for t, v in _manifest(folder)["budget"]["tensors"].items()}


def _cli(out: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "colitools", "convert", str(FIXTURE), str(out), "--target-bpw", str(AFTER), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """The reference: a fresh conversion with the second budget, in its own folder."""
    out = tmp_path_factory.mktemp("fresh") / "out"
    _convert(out, target_bpw=AFTER)
    return out


def test_replace_copies_the_unchanged_tensors_and_equals_a_fresh_conversion(tmp_path, fresh):
    out = tmp_path / "out"
    _convert(out, target_bpw=BEFORE)
    before = _formats(out)
    same = {n for n, data in _files(out).items() if n.endswith(".safetensors") and _files(fresh).get(n) == data}
    inodes = {n: (out / n).stat().st_ino for n in _files(out)}
    summary = _convert(out, target_bpw=AFTER, replace=True)
    assert _files(out) == _files(fresh)
    # a file the new conversion writes byte for byte as it was is kept in place (not rewritten), the others not
    assert same and {n for n in same | set(inodes) if (out / n).exists() and (out / n).stat().st_ino == inodes[n]
                     and n.endswith(".safetensors")} == same
    assert _manifest(out) == _manifest(fresh)
    assert not (out / DONOR_FILE).exists()
    # copied: every written tensor but those whose format the two allocations (each read from its own
    # conversion) differ on; this fixture writes every tensor from float values, each with its error record
    after = _formats(fresh)
    written = [t for u in _manifest(fresh)["units"].values() for t in u["errors"]]
    changed = [t for t in after if before[t] != after[t]]
    assert 0 < len(changed) < len(after)
    assert summary.tensors_copied == len(written) - len(changed)


def test_without_replace_another_budget_is_still_refused(tmp_path):
    out = tmp_path / "out"
    _convert(out, target_bpw=BEFORE)
    with pytest.raises(ConvertError, match="another recipe .*add `replace`"):
        _convert(out, target_bpw=AFTER)


def test_a_donor_file_not_as_recorded_is_not_copied_from(tmp_path, fresh):
    out = tmp_path / "out"
    _convert(out, target_bpw=BEFORE)
    units = _manifest(out)["units"]
    layer = next(k for k in units if k != "globals")
    name = units[layer]["files"][0]["name"]
    path = out / name
    info = next(iter(read_header(path).tensors.values()))
    data = bytearray(path.read_bytes())
    data[info.begin] ^= 0x01  # one bit of a tensor it would copy: same size, another sha256
    path.write_bytes(bytes(data))
    summary = _convert(out, target_bpw=AFTER, replace=True)
    assert _files(out) == _files(fresh)
    copied_there = len(units[layer]["keys"])  # at most this many could have come from that file
    full = _convert(tmp_path / "again", target_bpw=BEFORE)
    assert full.tensors_copied == 0
    again = _convert(tmp_path / "again", target_bpw=AFTER, replace=True)
    assert summary.tensors_copied < again.tensors_copied
    assert again.tensors_copied - summary.tensors_copied <= copied_there


def _one_unit_of(out: Path, recipe_fingerprint: str):
    """A poll: ``out``'s ledger is the new recipe's and has recorded a unit."""

    def poll() -> bool:
        try:
            m = json.loads((out / MANIFEST_FILE).read_text())
        except (OSError, ValueError):
            return False
        return m.get("recipe_fingerprint") == recipe_fingerprint and len(m.get("units") or {}) >= 1

    return poll


def test_sigkill_between_units_leaves_a_resumable_conversion_never_a_published_mix(tmp_path, fresh):
    out = tmp_path / "out"
    _convert(out, target_bpw=BEFORE)
    new_recipe = _manifest(fresh)["recipe_fingerprint"]
    proc = _cli(out, "--replace", env={"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "2"})
    sigkill_when(proc, _one_unit_of(out, new_recipe))
    m = json.loads((out / MANIFEST_FILE).read_text())
    assert m["state"] == "converting" and m["recipe_fingerprint"] == new_recipe
    assert not (out / INDEX_FILE).exists()  # the old output's index went before any new file was written
    assert (out / DONOR_FILE).is_file()
    rerun = _cli(out)  # the same options resume it (--replace not needed any more)
    assert rerun.wait(120) == 0, rerun.stderr.read()
    assert _files(out) == _files(fresh)
    assert _manifest(out) == _manifest(fresh)


def test_sigkill_after_a_new_file_replaced_an_old_one_unrecorded(tmp_path, fresh):
    out = tmp_path / "out"
    _convert(out, target_bpw=BEFORE)
    proc = _cli(out, "--replace", env={"COLITOOLS_TEST_KILL_AT": "published:1"})
    assert proc.wait(120) == -9, proc.stderr.read()
    m = json.loads((out / MANIFEST_FILE).read_text())
    assert m["state"] == "converting"
    # one file published over the previous output's (its bytes are not the donor's record any more), not recorded
    donor = [f for r in json.loads((out / DONOR_FILE).read_text())["records"] for f in r["files"]]
    replaced = [f["name"] for f in donor if hashlib.sha256((out / f["name"]).read_bytes()).hexdigest() != f["sha256"]]
    recorded = {f["name"] for u in m["units"].values() for f in u["files"]}
    assert len(replaced) == 1 and replaced[0] not in recorded
    rerun = _cli(out, "--json")
    stdout, stderr = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, stderr
    assert _files(out) == _files(fresh)
    assert _manifest(out) == _manifest(fresh)
    assert json.loads(stdout)["units_converted"] == 3 - len(m["units"])


def test_units_recorded_before_the_figures_order_are_encoded_again_not_copied(tmp_path, fresh):
    """A unit whose error figures were summed in colitools' earlier order (no ``error_order``, FORMATS §11) is no
    donor: its tensors are encoded again, so every unit of the result holds figures of one order."""
    out, same = tmp_path / "out", tmp_path / "same"
    _convert(out, target_bpw=BEFORE)
    _convert(same, target_bpw=BEFORE)
    data = json.loads((out / MANIFEST_FILE).read_text())
    old = next(k for k, u in data["units"].items() if k != "globals" and u.get("errors"))
    assert data["units"][old].pop("error_order") == SUM_ORDER  # what convert records
    (out / MANIFEST_FILE).write_text(json.dumps(data))
    without = _convert(out, target_bpw=AFTER, replace=True, dry_run=True).tensors_copied
    with_all = _convert(same, target_bpw=AFTER, replace=True, dry_run=True).tensors_copied
    assert 0 < without < with_all and with_all - without <= len(data["units"][old]["errors"])
    _convert(out, target_bpw=AFTER, replace=True)
    assert _files(out) == _files(fresh) and _manifest(out) == _manifest(fresh)


def test_dry_run_says_how_many_tensors_replace_would_copy_and_two_workers_copy_them(tmp_path, fresh):
    out = tmp_path / "out"
    _convert(out, target_bpw=BEFORE)
    before = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    dry = _convert(out, target_bpw=AFTER, replace=True, dry_run=True)
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == before  # a dry run writes nothing
    real = _convert(out, target_bpw=AFTER, replace=True, workers=2)
    assert real.tensors_copied == dry.tensors_copied > 0
    assert _files(out) == _files(fresh)


def test_planar_converted_again_as_pairs_copies_all_but_the_routed_experts(tmp_path):
    out, pairs = tmp_path / "out", tmp_path / "pairs"
    _convert(out, layout="planar")
    summary = _convert(out, replace=True)
    _convert(pairs)
    assert _files(out) == _files(pairs)  # the sidecar (its layer files and index) is gone with the planar layout
    units = _manifest(pairs)["units"].values()
    experts = [t for u in units for t in u["errors"] if ".mlp.experts." in t]
    assert summary.tensors_copied == sum(len(u["errors"]) for u in units) - len(experts) > 0


def test_a_killed_replace_replaced_again_with_a_third_budget_equals_a_fresh_one(tmp_path, fresh):
    out, third = tmp_path / "out", tmp_path / "third"
    _convert(out, target_bpw=BEFORE)
    one_new_unit = _one_unit_of(out, _manifest(fresh)["recipe_fingerprint"])

    sigkill_when(_cli(out, "--replace", env={"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "2"}), one_new_unit)
    # the donor now: the second budget's finished units, and the first's records of the files not yet replaced
    summary = _convert(out, target_bpw=4.6, replace=True)
    _convert(third, target_bpw=4.6)
    assert _files(out) == _files(third)
    assert _manifest(out) == _manifest(third)
    assert summary.tensors_copied > 0


def test_large_tensors_are_copied_in_pieces(tmp_path, fresh, monkeypatch):
    from colitools.converters import reuse

    out = tmp_path / "out"
    _convert(out, target_bpw=BEFORE)
    monkeypatch.setattr(reuse.DonorStream, "CHUNK", 96)  # every tensor over 96 bytes goes in pieces
    pieces = []
    real = reuse.DonorStream.take_parts

    def counted(self, *args):
        for piece in real(self, *args):
            pieces.append(piece.nbytes)
            yield piece

    monkeypatch.setattr(reuse.DonorStream, "take_parts", counted)
    summary = _convert(out, target_bpw=AFTER, replace=True)
    assert summary.tensors_copied > 0 and len(pieces) > summary.tensors_copied and max(pieces) <= 96
    assert _files(out) == _files(fresh)


def test_a_file_kept_in_place_is_checked_and_rewritten_when_not_as_recorded(tmp_path, fresh):
    out = tmp_path / "out"
    _convert(out, target_bpw=BEFORE)
    same = [n for n, data in _files(out).items() if n.endswith(".safetensors") and _files(fresh).get(n) == data]
    path = out / same[0]
    info = next(iter(read_header(path).tensors.values()))
    data = bytearray(path.read_bytes())
    data[info.begin] ^= 0x01  # same size and header, another sha256 than its record
    path.write_bytes(bytes(data))
    inode = path.stat().st_ino
    _convert(out, target_bpw=AFTER, replace=True)
    assert _files(out) == _files(fresh)
    assert path.stat().st_ino != inode  # written again, from the source
