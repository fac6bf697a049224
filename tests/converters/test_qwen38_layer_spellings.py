"""A Qwen3.8 source whose ``layer_types`` spell its QSA layers ``qwen_sparse_attention`` (transformers 5.16.1,
colibri's ``c/tools/make_qwen38_tiny.py``) is read as the one spelled ``indexed_attention`` / ``full_attention``
wherever the family is read (``Family.layer_type_aliases``), and ``--target qwen38`` writes ``full_attention``, as
its help promises (issue 43 item 3)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from colitools.formats import model_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "colitools"))
from cli_helpers import run_cli  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "oracles" / "qwen38"
RUN = ("--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--no-usage", "--json")


def _respelled(tmp_path: Path, qsa: str) -> Path:
    src = tmp_path / f"src-{qsa}"
    shutil.copytree(FIXTURE, src)
    cfg = json.loads((src / "config.json").read_text())
    types = cfg["text_config"]["layer_types"]
    assert "indexed_attention" in types
    cfg["text_config"]["layer_types"] = [qsa if t == "indexed_attention" else t for t in types]
    (src / "config.json").write_text(json.dumps(cfg))
    return src


def _tokens(result) -> list[int]:
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)["generated_ids"]


def test_the_family_reads_every_spelling_of_its_qsa_layers():
    text = {"layer_types": ["linear_attention", "qwen_sparse_attention", "full_attention", "indexed_attention"]}
    read = model_config.canonical_keys(text, "qwen4_exp")["layer_types"]
    assert read == ["linear_attention", "indexed_attention", "indexed_attention", "indexed_attention"]


@pytest.mark.parametrize("qsa", ["qwen_sparse_attention", "full_attention"])
def test_run_and_convert_read_a_qwen_sparse_attention_source(tmp_path, qsa):
    src = _respelled(tmp_path, qsa)
    assert _tokens(run_cli("run", src, *RUN)) == _tokens(run_cli("run", FIXTURE, *RUN))
    out = tmp_path / "out"
    result = run_cli("convert", src, out, "--target", "qwen38", "--min-free-gb", "0", "--no-progress")
    assert result.returncode == 0, result.stderr
    written = json.loads((out / "config.json").read_text())["text_config"]["layer_types"]
    assert written == ["linear_attention", "full_attention"]  # what --target qwen38 promises, whatever the source
    # the same bytes as the conversion of the fixture as transformers 5.24 spells it (indexed_attention)
    ref = tmp_path / "ref"
    assert run_cli("convert", FIXTURE, ref, "--target", "qwen38", "--min-free-gb", "0", "--no-progress").returncode == 0
    def listing(root: Path) -> list[Path]:
        return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())

    assert listing(out) == listing(ref)
    for f in listing(ref):
        if f.name == "colitools.json":  # the manifest records the source: its path, its files' identities
            continue
        if f.name == "index.json":  # the sidecar's index records the source config's sha256
            mine, theirs = (json.loads((root / f).read_text()) for root in (out, ref))
            assert {**mine, "source": None} == {**theirs, "source": None}, f
        else:
            assert (out / f).read_bytes() == (ref / f).read_bytes(), f
    assert _tokens(run_cli("run", out, *RUN)) == _tokens(run_cli("run", ref, *RUN))
