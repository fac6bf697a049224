"""A ``num_hidden_layers`` below the decoder layers a checkpoint holds is refused by ``convert`` and ``run`` (issue 24
item 17: the extra layer became an MTP layer of a family without MTP, and ``run`` silently used fewer layers); a
layer the config declares as MTP (``num_nextn_predict_layers``) is kept. The real console script on copies of the
tiny oracle checkpoints."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from oracle_refs import ORACLES

EXE = str(Path(sys.executable).parent / "colitools")


def _copy(fixture: str, dest: Path, **config) -> Path:
    """The oracle's checkpoint (shards and config, no references) with ``config`` keys changed (None: removed)."""
    dest.mkdir()
    for f in (ORACLES / fixture).iterdir():
        if f.is_file():
            shutil.copy(f, dest / f.name)
    cfg = json.loads((dest / "config.json").read_text())
    for key, value in config.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *map(str, args)], capture_output=True, text=True)


def _run(model: Path) -> subprocess.CompletedProcess:
    return _cli("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--no-usage")


def _refusal(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("colitools: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_a_layer_past_num_hidden_layers_without_mtp_is_refused_by_convert_and_run(tmp_path):
    src = _copy("olmoe", tmp_path / "src", num_hidden_layers=1)  # the checkpoint has layers 0 and 1
    for proc in (_cli("convert", src, tmp_path / "out", "--min-free-gb", "0"), _run(src)):
        line = _refusal(proc)
        assert "config.json: num_hidden_layers is 1 and no MTP layers" in line
        assert "is of layer 1" in line and "model.layers.1." in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.safetensors"))


def test_a_converted_container_whose_config_undercounts_its_layers_is_refused_by_run(tmp_path):
    src = _copy("qwen3_moe", tmp_path / "src")
    assert _cli("convert", src, tmp_path / "out", "--min-free-gb", "0").returncode == 0
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    (tmp_path / "out" / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    line = _refusal(_run(tmp_path / "out"))
    assert "num_hidden_layers is 1" in line and "is of layer 1" in line


def test_a_declared_mtp_layer_is_kept_and_an_undeclared_one_refused(tmp_path):
    """DeepSeek-V3 declares its MTP layers (``num_nextn_predict_layers``): with one base layer, layer 1 is the MTP
    layer, converted by the ``--mtp`` rule and not run; without the key the same layer is refused."""
    mtp = _copy("deepseek_v3", tmp_path / "mtp", num_hidden_layers=1, num_nextn_predict_layers=1)
    done = _cli("convert", mtp, tmp_path / "out", "--min-free-gb", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert "mtp" in json.loads(done.stdout)["formats_per_role"]
    assert _run(mtp).returncode == 0 and _run(tmp_path / "out").returncode == 0
    bare = _copy("deepseek_v3", tmp_path / "bare", num_hidden_layers=1, num_nextn_predict_layers=None)
    line = _refusal(_run(bare))
    assert "num_hidden_layers is 1 and no MTP layers" in line and "is of layer 1" in line
