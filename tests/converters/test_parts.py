"""``convert --part K/N`` + ``colitools merge``: N processes with separate folders, merged, give one machine's
output byte for byte; the Hub server's log shows each shard fetched only by the parts whose units read it; every
refusal of ``merge`` is one line naming the folder, and no part loses a file.

Real processes (the console script), real files, the real huggingface_hub client against the fake Hub
(``hubserver.py``). The reference is the ordinary one-machine conversion of the same source.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from convcheck import snapshot
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.parts import assign, parse_part
from colitools.formats.errors import ParameterError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import COMMAND, colitools, one_line_error  # noqa: E402

SPEC = Tiny(layers=5, experts=4, hidden=256, inter=128, shards=4)  # shards of ~0.6 MB: above a header read
FLAGS = ("--min-free-gb", "0", "--no-progress")


def run_parts(source, folders: list[Path], *extra: str) -> None:
    """``convert --part k/N`` for each folder, each in its own process, started together."""
    n = len(folders)
    procs = [
        subprocess.Popen([*COMMAND, "convert", str(source), str(f), "--part", f"{k}/{n}", *FLAGS, *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k, f in enumerate(folders, 1)
    ]  # fmt: skip
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def same_manifest(merged: Path, whole: Path) -> None:
    """``colitools.json`` of both: equal in key order too, but for the ``run`` section's time; its counts are the
    parts' summed (every unit converted once)."""
    a, b = (json.loads((f / "colitools.json").read_text()) for f in (merged, whole))
    assert a["run"].pop("finished_at") and b["run"].pop("finished_at")
    assert json.dumps(a) == json.dumps(b)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("parts") / "src"
    make_checkpoint(folder, SPEC)
    return folder


@pytest.fixture(scope="module")
def whole(model) -> Path:
    """The one-machine conversion: the reference."""
    out = model.parent / "whole"
    result = colitools("convert", model, out, *FLAGS)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def converted_parts(model) -> list[Path]:
    """Parts 1/3 .. 3/3, converted once by three processes at the same time."""
    folders = [model.parent / f"part{k}" for k in (1, 2, 3)]
    run_parts(model, folders)
    return folders


@pytest.fixture
def three(converted_parts, tmp_path) -> list[Path]:
    """A copy of the three part folders for one test (merge moves their files away)."""
    folders = [tmp_path / f.name for f in converted_parts]
    for source, copy in zip(converted_parts, folders, strict=True):
        shutil.copytree(source, copy)
    return folders


def convert_part(source, folder: Path, part: str, *extra: str) -> None:
    result = colitools("convert", source, folder, "--part", part, *FLAGS, *extra)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------- the share
def test_the_share_is_contiguous_runs_placed_by_each_units_byte_midpoint():
    # hand-worked: total 60, N 3; midpoints 5, 15, 25, 35, 45, 55 -> thirds 0, 0, 1, 1, 2, 2
    assert assign([10] * 6, 3) == [1, 1, 2, 2, 3, 3]
    # a big first unit: total 104, midpoints 50, 100.5, 101.5, 102.5, 103.5 of 52 per part -> 1, 2, 2, 2, 2
    assert assign([100, 1, 1, 1, 1], 2) == [1, 2, 2, 2, 2]
    # more parts than units: midpoints 2.5 and 7.5 of 10, in quarters of 2.5 -> 1.0 and 3.0: parts 2 and 4
    assert assign([5, 5], 4) == [2, 4]
    assert assign([0, 0, 0], 3) == [1, 2, 3]  # no bytes at all: one unit weighs one


@pytest.mark.parametrize("seed", range(20))
def test_every_part_is_within_one_unit_of_an_equal_share(seed):
    import random

    rng = random.Random(seed)
    sizes = [rng.randint(1, 1000) for _ in range(rng.randint(1, 60))]
    n = rng.randint(1, 8)
    parts = assign(sizes, n)
    assert parts == sorted(parts) and all(1 <= k <= n for k in parts)
    for k in range(1, n + 1):
        got = sum(b for b, p in zip(sizes, parts, strict=True) if p == k)
        assert abs(got - sum(sizes) / n) <= max(sizes), (sizes, n, parts)


@pytest.mark.parametrize("text", ["0/3", "4/3", "3", "a/b", "1/0", "-1/3"])
def test_a_malformed_part_is_one_parameter_error(text):
    with pytest.raises(ParameterError, match="`part="):
        parse_part(text)
    assert parse_part(" 2 / 3 ") == parse_part("2/3")


# ---------------------------------------------------------------------------------------------- merge
def test_three_parts_in_three_processes_merge_into_one_machines_bytes(model, whole, three, tmp_path):
    before = {f: files_of(f) for f in three}
    out = tmp_path / "merged"
    result = colitools("merge", *three, out, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (
        report["ok"]
        and report["how"] == "moved"
        and report["copied"] == 0
        and [p["part"] for p in report["parts"]] == ["1/3", "2/3", "3/3"]
    )
    assert snapshot(out) == snapshot(whole)
    same_manifest(out, whole)
    assert sorted(files_of(out)) == sorted(files_of(whole))  # nothing more, nothing less
    for name, data in files_of(out).items():
        if name != "colitools.json":
            assert data == (whole / name).read_bytes(), name
    # every shard came from the part that wrote it (moved: gone there), with the bytes it had there
    moved = {name: data for b in before.values() for name, data in b.items() if name.endswith(".safetensors")}
    assert moved == {n: d for n, d in files_of(out).items() if n.endswith(".safetensors")}
    assert not any(p.name.endswith(".safetensors") for f in three for p in f.iterdir())
    check = colitools("verify", "container", out)
    assert check.returncode == 0, check.stdout + check.stderr
    again = colitools("convert", model, out, *FLAGS, "--json")  # the merged folder is a complete conversion
    assert again.returncode == 0 and json.loads(again.stdout)["units_converted"] == 0


def test_a_merge_killed_midway_loses_no_file_and_its_rerun_finishes(whole, three, tmp_path):
    before = {
        name: data for f in three for name, data in files_of(f).items() if name.endswith(".safetensors")
    }
    out = tmp_path / "merged"
    killed = colitools("merge", *three, out, COLITOOLS_TEST_KILL_AT="moved:3")
    assert killed.returncode == -9, killed.stderr
    staging = tmp_path / ".merged.merging"
    assert not out.exists() and len(list(staging.glob("*.safetensors"))) == 3
    where = {**{n: d for f in three for n, d in files_of(f).items()}, **files_of(staging)}
    assert {
        n: d for n, d in where.items() if n.endswith(".safetensors")
    } == before  # every shard somewhere, intact
    result = colitools("merge", *three, out)
    assert result.returncode == 0, result.stderr
    assert snapshot(out) == snapshot(whole) and not staging.exists()


def test_a_finished_part_rerun_does_nothing(model, three):
    again = colitools("convert", model, three[1], "--part", "2/3", *FLAGS, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["units_converted"] == 0 and report["part"]["part"] == "2/3"


def test_planar_parts_merge_with_the_sidecar_index_of_the_whole(model, tmp_path):
    whole = tmp_path / "whole"
    assert colitools("convert", model, whole, "--layout", "planar", *FLAGS).returncode == 0
    folders = [tmp_path / f"part{k}" for k in (1, 2, 3)]
    run_parts(model, folders, "--layout", "planar")
    index = "experts-int4g64/index.json"
    assert any(
        json.loads((f / index).read_text()) != json.loads((whole / index).read_text()) for f in folders
    )
    out = tmp_path / "merged"
    assert colitools("merge", *folders, out).returncode == 0
    assert (
        files_of(out).keys() == files_of(whole).keys()
        and (out / index).read_bytes() == (whole / index).read_bytes()
    )
    assert snapshot(out) == snapshot(whole)


def test_budgeted_parts_each_measure_alike_and_merge_into_the_whole(model, tmp_path):
    """A size budget: every part measures the whole source and allocates the same formats (its ``measurement``
    figures, seconds and cache hits, are how each run went, and differ between any two runs)."""
    whole = tmp_path / "whole"
    assert colitools("convert", model, whole, "--target-bpw", "5", *FLAGS).returncode == 0
    folders = [tmp_path / f"part{k}" for k in (1, 2, 3)]
    run_parts(model, folders, "--target-bpw", "5")
    out = tmp_path / "merged"
    result = colitools("merge", *folders, out)
    assert result.returncode == 0, result.stderr
    for name, data in files_of(whole).items():
        if name != "colitools.json" and not name.startswith(
            "."
        ):  # .colitools-budget.json: the measurement cache
            assert files_of(out)[name] == data, name
    a, b = (json.loads((f / "colitools.json").read_text()) for f in (out, whole))
    for m in (a, b):
        m["run"].pop("finished_at")
        m["budget"].pop("measurement")
    assert json.dumps(a) == json.dumps(b)


ORACLES = Path(__file__).resolve().parents[2] / "oracles"


@pytest.mark.parametrize(
    ("fixture", "target"),
    [("olmoe", None), ("inkling2_mxfp8", None), ("kimi_k3", "kimi_k3"), ("qwen38", "qwen38")],
)
def test_oracle_fixtures_merge_into_the_whole(fixture, target, tmp_path):
    """The committed fixtures, through the library: natively quantized experts (MXFP4 kept by --target kimi_k3,
    MXFP8 decoded), the planar qwen38 target. Kimi-K3's parts each carry the warning that their experts are
    quantized again; the whole drops it, every expert having come out unchanged, and so does the merge."""
    from colitools.converters.merge import merge
    from colitools.converters.options import ConvertOptions
    from colitools.converters.runner import convert

    options = {"min_free_gb": 0, **({"target": target} if target else {})}
    whole = convert(str(ORACLES / fixture), tmp_path / "whole", ConvertOptions(**options))
    folders = [tmp_path / f"part{k}" for k in (1, 2, 3)]
    carried = [convert(str(ORACLES / fixture), f, ConvertOptions(part=f"{k}/3", **options)).warnings
               for k, f in enumerate(folders, 1)]  # fmt: skip
    merge(folders, tmp_path / "merged")
    assert snapshot(tmp_path / "merged") == snapshot(tmp_path / "whole")
    same_manifest(tmp_path / "merged", tmp_path / "whole")
    if fixture == "kimi_k3":
        assert whole.warnings == [] and all(any("quantized a second time" in w for w in c) for c in carried)


def test_merge_onto_another_filesystem_copies_and_the_parts_keep_their_files(whole, three, tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == three[0].stat().st_dev:
        pytest.skip("no second filesystem here")
    before = {f: files_of(f) for f in three}
    out = shm / f"colitools-merge-test-{os.getpid()}"
    need = sum(
        len(d) for b in before.values() for n, d in b.items() if n != "colitools.json"
    )  # every part's files: more than the copy takes
    fake = tmp_path / "free"
    fake.write_text(str(need // 2))  # the disk floor's probe (converters/diskfloor.py) reads this instead
    try:
        line = one_line_error(colitools("merge", *three, out, COLITOOLS_FAKE_FREE_BYTES_FILE=str(fake)))
        assert f"{shm}: {need // 2:,} bytes free, and copying the parts' files here needs " in line, line
        assert not out.exists() and {f: files_of(f) for f in three} == before
        result = colitools("merge", *three, out, "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert (
            report["how"] == "copied"
            and report["moved"] == 0
            and report["copied"] == len(files_of(whole)) - 1
        )
        assert snapshot(out) == snapshot(whole)
        assert {f: files_of(f) for f in three} == before
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_a_damaged_file_stops_the_merge_before_anything_moves(three, tmp_path):
    victim = next(p for p in sorted(three[2].iterdir()) if p.name.endswith(".safetensors"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # same size: only the sha256 can tell
    victim.write_bytes(bytes(data))
    before = {f: files_of(f) for f in three}
    out = tmp_path / "merged"
    line = one_line_error(colitools("merge", *three, out))
    assert str(victim) in line and "sha256" in line, line
    assert {f: files_of(f) for f in three} == before  # every part keeps every file
    assert not out.exists() and not list(tmp_path.glob(".merged*"))


def test_a_missing_or_repeated_or_unfinished_part_is_refused_in_one_line(model, three, tmp_path):
    out = tmp_path / "merged"
    result = colitools("merge", three[0], three[2], out)
    assert result.returncode == 1 and "part 2/3 missing" in one_line_error(result)
    failure = json.loads(colitools("merge", three[0], three[2], out, "--json").stdout)
    assert failure["ok"] is False and failure["exit_code"] == 1 and "part 2/3 missing" in failure["error"]
    line = one_line_error(colitools("merge", three[0], three[1], three[1], three[2], out))
    assert f"{three[1]}: part 2/3 again (given twice)" in line, line
    twin = tmp_path / "twin"
    shutil.copytree(three[1], twin)
    line = one_line_error(colitools("merge", three[0], three[1], twin, three[2], out))
    assert f"{twin}: part 2/3 again (also {three[1]})" in line, line
    # a part killed right after its first published file, before its ledger recorded it
    killed = tmp_path / "killed"
    colitools("convert", model, killed, "--part", "2/3", *FLAGS, COLITOOLS_TEST_KILL_AT="published:1")
    line = one_line_error(colitools("merge", three[0], killed, three[2], out))
    assert f"{killed}: part 2/3 is not finished (0 of its" in line and "rerun its conversion" in line, line
    resumed = colitools("convert", model, killed, "--part", "2/3", *FLAGS)  # a part resumes as any conversion
    assert resumed.returncode == 0, resumed.stderr
    assert colitools("merge", three[0], killed, three[2], out).returncode == 0
    assert not out.joinpath(".colitools.lock").exists()


def test_parts_of_another_recipe_source_or_split_are_refused_naming_the_folder(model, three, tmp_path):
    out = tmp_path / "merged"
    other = tmp_path / "other-recipe"
    convert_part(model, other, "2/3", "--experts", "int8-row")
    line = one_line_error(colitools("merge", three[0], other, three[2], out))
    assert f"{other}: part 2/3 has another recipe (experts='int8-row', not 'int4-g64')" in line, line
    copy = tmp_path / "copy-of-src"
    make_checkpoint(copy, SPEC)
    moved = tmp_path / "moved-source"
    convert_part(copy, moved, "2/3")
    line = one_line_error(colitools("merge", three[0], moved, three[2], out))
    assert f"{moved}: part 2/3 converted another source ({copy}, not {model})" in line, line
    split = tmp_path / "split4"
    convert_part(model, split, "2/4")
    line = one_line_error(colitools("merge", three[0], split, three[2], out))
    assert f"{split}: part 2/4 of another split" in line, line
    line = one_line_error(colitools("convert", model, three[0], "--part", "2/3", *FLAGS))
    assert f"{three[0]}" in line and "holds part 1/3" in line, line
    line = one_line_error(colitools("convert", model, three[0], *FLAGS))
    assert f"{three[0]}" in line and "holds part 1/3 of a conversion, not the whole conversion" in line, line
    assert not out.exists()


@pytest.mark.parametrize("edit", ["same bytes", "other bytes"])
def test_a_shard_two_parts_read_must_hold_the_same_bytes_for_both(model, whole, edit, tmp_path):
    """A shard part 1 read is written again before part 2 reads it: a new inode, mtime and ctime. With the same
    bytes (its content fingerprint the same) the parts merge into the whole's shards; with a byte changed where
    the fingerprint samples (the file's last byte: the end of its last tensor) merge refuses, naming both."""
    source = tmp_path / "src"
    shutil.copytree(model, source)
    first, second, third = (tmp_path / f"part{k}" for k in (1, 2, 3))
    for folder, part in ((first, "1/3"), (third, "3/3")):
        convert_part(source, folder, part)
    shared = sorted(set(_read_shards(first)) & set(_dry_run_shards(source, "2/3")))[0]
    data = bytearray((source / shared).read_bytes())
    if edit == "other bytes":
        data[-1] ^= 0x01
    (source / shared).unlink()
    (source / shared).write_bytes(bytes(data))
    convert_part(source, second, "2/3")
    result = colitools("merge", first, second, third, tmp_path / "merged")
    if edit == "same bytes":
        assert result.returncode == 0, result.stderr
        shards = {n: d for n, d in files_of(tmp_path / "merged").items() if n.endswith(".safetensors")}
        assert shards == {n: d for n, d in files_of(whole).items() if n.endswith(".safetensors")}
        return
    line = one_line_error(result)
    assert f"{second}: part 2/3 read source shard {shared} as another file than {first} did" in line, line
    assert "fingerprint" in line, line


def _read_shards(folder: Path) -> list[str]:
    units = json.loads((folder / "colitools.json").read_text())["units"].values()
    return sorted({s for u in units for s in u["sources"]})


def _dry_run_shards(model: Path, part: str) -> list[str]:
    result = colitools("convert", model, model.parent / "nowhere", "--part", part, "--dry-run", "--json")
    return json.loads(result.stdout)["part"]["shards"]


def test_dry_run_of_a_part_lists_only_its_units(model, tmp_path):
    result = colitools("convert", model, tmp_path / "p", "--part", "3/3", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    units = [u["unit"] for u in plan["plan"]["units"]]
    # 6 units (globals + 5 layers) of about equal bytes: the last third is the last two layers
    assert units == ["model.layers.3", "model.layers.4"], units
    assert plan["part"]["units"] == 2 and plan["bytes_in"] == plan["part"]["in_bytes"]
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------------------------------------- the Hub
def _unit_shards(source: Path, unit: str) -> set[str]:
    """The source shards a unit reads, from the checkpoint's own index (globals: every tensor outside the layers)."""
    weight_map = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    if unit == "globals":
        return {s for n, s in weight_map.items() if not n.startswith("model.layers.")}
    return {s for n, s in weight_map.items() if n.startswith(unit + ".")}


def test_hub_parts_fetch_only_their_shards_and_merge_into_one_machines_bytes(hub, model, tmp_path):
    hub.add_repo("org/tiny", {"main": model})
    reference = tmp_path / "whole"
    assert colitools("convert", "org/tiny", reference, *FLAGS).returncode == 0
    shards = sorted(
        set(json.loads((model / "model.safetensors.index.json").read_text())["weight_map"].values())
    )
    folders = [tmp_path / f"part{k}" for k in (1, 2, 3)]
    fetched: list[dict[str, int]] = []
    for k, folder in enumerate(folders, 1):  # one after another: the server's counters are per part
        hub.reset_stats()
        result = colitools("convert", "org/tiny", folder, "--part", f"{k}/3", *FLAGS)
        assert result.returncode == 0, result.stderr
        fetched.append({s: _body_bytes(hub, s) for s in shards})
    sizes = {s: (model / s).stat().st_size for s in shards}
    for folder, got in zip(folders, fetched, strict=True):
        units = json.loads((folder / "colitools.json").read_text())["part"]["units"]
        needed = set().union(*(_unit_shards(model, u) for u in units))
        assert got == {s: sizes[s] if s in needed else 0 for s in shards}, (units, got)
    assert sum(map(sum, (f.values() for f in fetched))) < 2 * sum(sizes.values())  # not every shard by all
    out = tmp_path / "merged"
    result = colitools("merge", *folders, out)
    assert result.returncode == 0, result.stderr
    assert snapshot(out) == snapshot(reference)
    same_manifest(out, reference)
    # a part of another commit of the same repo
    newer = tmp_path / "newer"
    make_checkpoint(newer, Tiny(**{**SPEC.__dict__, "seed": 1}))
    commits = hub.add_repo("org/tiny", {"main": model, "v2": newer})
    other = tmp_path / "other-commit"
    assert (
        colitools("convert", "org/tiny", other, "--part", "2/3", "--revision", "v2", *FLAGS).returncode == 0
    )
    line = one_line_error(colitools("merge", folders[0], other, folders[2], tmp_path / "merged2"))
    want = f"{other}: part 2/3 converted another source (org/tiny@{commits['v2']}, not org/tiny@{commits['main']})"
    assert want in line, line


def _body_bytes(hub, name: str) -> int:
    """Bytes of ``name`` served for its data: every body response but the header reads (huggingface_hub's
    ``parse_safetensors_file_metadata`` asks for the first 100 001 bytes)."""
    return sum(end - start for start, end in hub.stats(name).ranges if (start, end) != (0, 100_001))
