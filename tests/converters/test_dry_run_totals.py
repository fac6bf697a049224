"""`convert --dry-run` prints the totals its `--json` gives (issue 43 item 7): the units still to convert, and the
whole plan's beside them when some units are done."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from colitools.converters.diskfloor import gb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import run_cli  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "olmoe"


def _bytes_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("bytes in "))


def test_the_dry_run_text_gives_the_pending_totals_of_its_json(tmp_path):
    out = tmp_path / "out"
    done = run_cli("convert", FIXTURE, out, "--min-free-gb", "0")
    assert done.returncode == 0, done.stderr
    (out / "model-00002-of-00003.safetensors").unlink()  # one unit to redo, two done
    text = run_cli("convert", FIXTURE, out, "--min-free-gb", "0", "--dry-run")
    data = json.loads(run_cli("convert", FIXTURE, out, "--min-free-gb", "0", "--dry-run", "--json").stdout)
    assert data["units_skipped"] == 2 and data["bytes_in"] < data["plan"]["in_bytes"]
    line = _bytes_line(text.stdout)
    assert line.startswith(f"bytes in {gb(data['bytes_in'])}, out {gb(data['bytes_out'])} (the whole plan: "
                           f"in {gb(data['plan']['in_bytes'])}, out {gb(data['plan']['out_bytes'])})"), line  # fmt: skip


def test_a_fresh_dry_run_has_one_set_of_totals(tmp_path):
    fresh = tmp_path / "fresh"
    text = run_cli("convert", FIXTURE, fresh, "--min-free-gb", "0", "--dry-run")
    data = json.loads(run_cli("convert", FIXTURE, fresh, "--min-free-gb", "0", "--dry-run", "--json").stdout)
    assert data["bytes_in"] == data["plan"]["in_bytes"]
    assert _bytes_line(text.stdout) == (
        f"bytes in {gb(data['bytes_in'])}, out {gb(data['bytes_out'])}, peak disk {gb(data['peak_disk_bytes'])}"
    )
    shutil.rmtree(fresh, ignore_errors=True)
