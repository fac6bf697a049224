"""End to end: generated tiny checkpoints -> ``convert`` -> resolved, byte-checked, loadable output (§4-§7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from convcheck import check_output, listing, snapshot
from tinyckpt import Tiny, make_checkpoint, write_tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ColitoolsError, ConvertError


def _expected(
    spec: Tiny, experts="int4-g64", dense="int8-row", embed="int8-row", mtp="int8-row"
) -> dict[str, str]:
    """Expected resolved format per output weight (docs/FORMATS.md §5 applied by hand for the generated geometry)."""
    out = {}
    for name in spec.names_2d():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            fmt = "f32"
        elif layer is not None and layer >= spec.layers:
            fmt = mtp
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            fmt = embed
        elif ".experts." in name and ".shared_experts." not in name:
            fmt = experts
        else:
            fmt = dense
        out[name] = fmt
    return out


def _int4_label(I: int, gs: int = 64) -> str:
    from colitools.formats.registry import writer_group_size

    g = writer_group_size(I, gs)
    return "int4-row" if g is None else f"int4-g{g}"


def _fix_int4(spec: Tiny, fmts: dict[str, str]) -> dict[str, str]:
    dims = spec.names_2d()
    return {
        n: (_int4_label(dims[n][1], int(f[6:])) if f.startswith("int4-g") else f) for n, f in fmts.items()
    }


def test_bf16_sharded_with_experts_split_over_two_shards(tmp_path):
    spec = Tiny(layers=2, experts=4, hidden=128, inter=96, shards=3)
    tensors = make_checkpoint(tmp_path / "src", spec)
    wm = json.loads((tmp_path / "src/model.safetensors.index.json").read_text())["weight_map"]
    layer1 = {wm[n] for n in wm if n.startswith("model.layers.1.mlp.experts.")}
    assert len(layer1) == 2  # the generated split really puts layer 1's experts in two shards
    summary = convert(str(tmp_path / "src"), tmp_path / "out")
    assert summary.units_converted == 3 and summary.fallbacks == []
    check_output(tmp_path / "out", tensors, _fix_int4(spec, _expected(spec)))
    out = tmp_path / "out"
    assert listing(out) == sorted(["colitools.json", "config.json", "generation_config.json", "model-00001-of-00003.safetensors",
                                   "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                   "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"])  # fmt: skip
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "src/tokenizer.json").read_bytes()
    manifest = json.loads((out / "colitools.json").read_text())
    assert manifest["state"] == "complete" and manifest["source"] == {
        "kind": "local",
        "path": str(tmp_path / "src"),
    }
    assert manifest["recipe"]["experts"] == "int4-g64"
    import hashlib

    for s in manifest["shards"]:
        data = (out / s["name"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (s["size"], s["sha256"])


def test_fp8_source_with_partial_blocks_passthrough_and_mtp_single_file(tmp_path):
    # hidden 160 and inter 96 are not multiples of 128: partial edge blocks in every grid
    spec = Tiny(layers=1, experts=2, hidden=160, inter=96, dtype="FP8", mtp=1)
    tensors = make_checkpoint(tmp_path / "src", spec)
    summary = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dense="fp8"))
    fmts = _fix_int4(spec, _expected(spec, dense="fp8-e4m3-b128"))
    check_output(tmp_path / "out", tensors, fmts)
    cfg = json.loads((tmp_path / "out/config.json").read_text())
    assert "quantization_config" not in cfg and cfg["hidden_size"] == 160
    manifest = json.loads((tmp_path / "out/colitools.json").read_text())
    assert manifest["source_quantization_config"]["weight_block_size"] == [128, 128]
    assert summary.formats_per_role["mtp"] == {"int8-row": 13}


def test_fused_fp8_experts_are_split_and_dequantized_per_slab(tmp_path):
    spec = Tiny(layers=1, experts=3, hidden=160, inter=80, dtype="FP8", fused=True, shards=2)
    tensors = make_checkpoint(tmp_path / "src", spec)
    convert(str(tmp_path / "src"), tmp_path / "out")
    fmts = {f"model.layers.0.mlp.experts.{e}.{p}.weight": _int4_label(160 if p != "down_proj" else 80)
            for e in range(3) for p in ("gate_proj", "up_proj", "down_proj")}  # fmt: skip
    check_output(tmp_path / "out", tensors, fmts)


def test_fused_bf16_experts_and_planar_layout(tmp_path):
    spec = Tiny(layers=2, experts=3, hidden=128, inter=64, fused=True, shards=2)
    tensors = make_checkpoint(tmp_path / "src", spec)
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(layout="planar"))
    resolved = check_output(
        tmp_path / "out", tensors, {"model.layers.1.mlp.experts.2.down_proj.weight": "int4-row"}
    )
    planar = {r.file for r in resolved.values() if r.layout == "planar64-v8"}
    side = tmp_path / "out/experts-int4g64"
    assert planar == {str(side / "layer-000.safetensors"), str(side / "layer-001.safetensors")}  # one per MoE layer
    assert all(r.layout == "pairs" for r in resolved.values() if ".experts." not in r.name)
    assert len(json.loads((tmp_path / "out/colitools.json").read_text())["shards"]) == 5


def test_mixtral_names(tmp_path):
    spec = Tiny(layers=2, experts=2, hidden=128, inter=192, mixtral=True)
    tensors = make_checkpoint(tmp_path / "src", spec)
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="int4-row"))
    check_output(tmp_path / "out", tensors, _expected(spec, experts="int4-row"))
    from colitools.formats.safetensors_io import SafetensorsFile

    names = list(SafetensorsFile(tmp_path / "out/model-00002-of-00003.safetensors").tensors)
    x = "model.layers.0.block_sparse_moe.experts.0"
    i = names.index(f"{x}.w1.weight")
    assert names[i : i + 6] == [f"{x}.w1.weight", f"{x}.w3.weight", f"{x}.w2.weight",
                                f"{x}.w1.weight.qs", f"{x}.w3.weight.qs", f"{x}.w2.weight.qs"]  # fmt: skip


def test_fallbacks_are_listed_with_reasons(tmp_path):
    # experts mxfp4: down has I = 48 (not % 32); dense int3: shared down has I = 48 (collides with int4);
    # embed fp8 from a BF16 source.
    spec = Tiny(layers=1, experts=2, hidden=128, inter=48)
    tensors = make_checkpoint(tmp_path / "src", spec)
    opts = ConvertOptions(experts="mxfp4", dense="int3-g64", embed="fp8")
    summary = convert(str(tmp_path / "src"), tmp_path / "out", opts)
    fmts = _expected(spec, experts="mxfp4", dense="int3-g64", embed="int8-row")
    for n in fmts:
        if n.endswith("down_proj.weight"):
            fmts[n] = "int8-row"
    check_output(tmp_path / "out", tensors, {k.replace(".weight", ".weight_packed") if v == "mxfp4" else k: v
                                             for k, v in fmts.items()})  # fmt: skip
    reasons = {f["tensor"]: (f["requested"], f["reason"]) for f in summary.fallbacks}
    assert reasons["model.layers.0.mlp.experts.1.down_proj.weight"][0] == "mxfp4"
    assert "I % 32" in reasons["model.layers.0.mlp.experts.1.down_proj.weight"][1]
    assert "int3-g64" in reasons["model.layers.0.mlp.shared_experts.down_proj.weight"][1]
    assert reasons["lm_head.weight"][0] == "fp8" and "BF16" in reasons["lm_head.weight"][1]
    manifest = json.loads((tmp_path / "out/colitools.json").read_text())
    assert manifest["fallbacks"] == summary.fallbacks and len(summary.fallbacks) == 5
    assert "fallbacks: 5" in summary.text()


def test_workers_produce_the_same_bytes(tmp_path):
    spec = Tiny(layers=3, experts=2, hidden=128, inter=64, shards=2)
    make_checkpoint(tmp_path / "src", spec)
    convert(str(tmp_path / "src"), tmp_path / "w1")
    convert(str(tmp_path / "src"), tmp_path / "w2", ConvertOptions(workers=2))
    assert snapshot(tmp_path / "w1") == snapshot(tmp_path / "w2")


def test_rerun_of_a_finished_conversion_does_nothing_and_another_recipe_is_refused(tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(hidden=128))
    convert(str(tmp_path / "src"), tmp_path / "out")
    before = snapshot(tmp_path / "out")
    again = convert(str(tmp_path / "src"), tmp_path / "out")
    assert (again.units_skipped, again.units_converted) == (3, 0)
    assert snapshot(tmp_path / "out") == before
    with pytest.raises(
        ConvertError, match=r"another recipe \(`experts=int4-g64` \(recorded\) vs int4-row \(now\)\)"
    ):
        convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(experts="int4-row"))


def test_dry_run_writes_nothing(tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(hidden=128, shards=2))
    s = convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dry_run=True))
    assert not (tmp_path / "out").exists()
    assert (
        s.plan["files"] == 3 and s.plan["out_bytes"] > 0 and s.plan["peak_disk_bytes"] == s.plan["out_bytes"]
    )
    assert "plan: 3 units" in s.text()


# ----------------------------------------------------------------------------------------- bad inputs
def _bad_source(tmp_path, mutate):
    spec = Tiny(layers=1, experts=2, hidden=128, inter=64, dtype="FP8", shards=2)
    tensors = make_checkpoint(tmp_path / "src", spec)
    mutate(tmp_path / "src", tensors)
    return tmp_path / "src"


def _rewrite(folder, tensors, shards=2):
    for p in folder.glob("*.safetensors"):
        p.unlink()
    write_tensors(folder, tensors, shards)


def _traversal(folder, tensors):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "../evil.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _missing_shard(folder, tensors):
    (folder / "model-00002-of-00002.safetensors").unlink()


def _shape_mismatch(folder, tensors):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["moe_intermediate_size"] = 32
    (folder / "config.json").write_text(json.dumps(cfg))


def _no_scale(folder, tensors):
    del tensors["model.layers.0.self_attn.o_proj.weight_scale_inv"]
    _rewrite(folder, tensors)


def _wrong_grid(folder, tensors):
    tensors["model.layers.0.self_attn.o_proj.weight_scale_inv"] = np.ones((2, 2), np.float32)
    _rewrite(folder, tensors)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_traversal, r"shard file name '\.\./evil\.safetensors'.*refused"),
        (_missing_shard, r"shard model-00002-of-00002\.safetensors .* is missing"),
        (
            _shape_mismatch,
            r"down_proj\.weight: shape \[128, 64\] does not match config\.json .*\(expected \[128, 32\]\)",
        ),
        (_no_scale, r"o_proj\.weight: FP8 weight without its scale tensor"),
        (
            _wrong_grid,
            r"o_proj\.weight_scale_inv: scale grid \[2, 2\] does not match weight .* \(expected \[1, 1\]\)",
        ),
    ],
)
def test_bad_input_is_one_clear_error_before_any_output(tmp_path, mutate, message):
    src = _bad_source(tmp_path, mutate)
    with pytest.raises(ColitoolsError, match=message):  # ConvertError; FormatError for the shard name
        convert(str(src), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_planar_refusal_happens_before_any_output(tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(hidden=128, inter=96))
    with pytest.raises(
        ConvertError, match=r"`layout=planar`: routed expert tensor model\.layers\.0\.mlp\.experts\.0\."
    ):
        convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(layout="planar"))
    assert not (tmp_path / "out").exists()


def test_cli_json_summary_and_one_line_errors(tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(hidden=128))
    run = [sys.executable, "-m", "colitools", "convert", str(tmp_path / "src"), str(tmp_path / "out")]
    done = subprocess.run([*run, "--json", "--min-free-gb", "0"], capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout)
    assert summary["units_converted"] == 3 and summary["bytes_in"] > 0 and "gb_per_s" in summary
    bad = subprocess.run([*run, "--experts", "int5"], capture_output=True, text=True)
    assert bad.returncode == 2  # a value outside the option's choices: a usage error
    assert bad.stderr.strip().splitlines() == ["colitools: error: --experts: unknown format 'int5'; choose one of: "
                                               + bad.stderr.split("choose one of: ")[1].strip()]  # fmt: skip
    dry = subprocess.run(
        [*run[:-1], str(tmp_path / "o2"), "--dry-run"], capture_output=True, text=True, check=True
    )
    assert "plan: 3 units" in dry.stdout and "peak disk" in dry.stdout


def test_hugging_face_source_end_to_end_with_cache_and_keep_source(hub, tmp_path):
    from huggingface_hub import hf_hub_download

    spec = Tiny(layers=2, experts=2, hidden=128, inter=64, shards=3, dtype="FP8")
    tensors = make_checkpoint(tmp_path / "repo", spec)
    hub.add_repo("org/tiny", {"main": tmp_path / "repo"})
    cached = Path(hf_hub_download("org/tiny", "model-00002-of-00003.safetensors"))  # already in the HF cache
    hub.reset_stats()
    summary = convert("org/tiny", tmp_path / "out", ConvertOptions(keep_source=True))
    check_output(tmp_path / "out", tensors, _fix_int4(spec, _expected(spec)))
    assert summary.source == {"kind": "hf", "repo_id": "org/tiny", "revision": hub.commit_of("org/tiny")}
    assert hub.stats("model-00002-of-00003.safetensors").gets == 0  # the cached shard was used, not fetched
    assert hub.stats("model-00001-of-00003.safetensors").gets >= 1
    assert cached.exists()  # never delete the user's cache
    kept = sorted(p.name for p in (tmp_path / "out/.colitools-download").glob("*.safetensors"))
    assert kept == ["model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    # the same conversion without --keep-source deletes its downloads and leaves the output folder clean
    convert("org/tiny", tmp_path / "out2")
    assert ".colitools-download" not in listing(tmp_path / "out2")
    ref, got = snapshot(tmp_path / "out"), snapshot(tmp_path / "out2")
    assert ref == got


def test_source_shards_are_released_after_their_last_unit(tmp_path):
    from colitools.converters.sources import LocalFolderSource

    make_checkpoint(tmp_path / "src", Tiny(layers=3, experts=2, hidden=128, inter=64, shards=3))
    out = tmp_path / "out"
    events = []

    class Downloaded(LocalFolderSource):  # a source whose shards count as downloads (deletable)
        def is_deletable(self, name):
            return name.endswith(".safetensors")

        def release(self, name):
            if name not in [e[0] for e in events]:  # a later release of a released file is a no-op
                done = json.loads((out / "colitools.json").read_text())["units"]
                events.append((name, list(done)))
            return True

    convert(Downloaded(tmp_path / "src"), out)
    wm = json.loads((tmp_path / "src/model.safetensors.index.json").read_text())["weight_map"]
    plan = json.loads((out / "colitools.json").read_text())["plan"]["units"]
    last_use = {}
    for i, key in enumerate(plan):
        prefix = "" if key == "globals" else key + "."
        for name, shard in wm.items():
            is_global = not name.startswith("model.layers.")
            if (key == "globals" and is_global) or (prefix and name.startswith(prefix)):
                last_use[shard] = i
    assert sorted(e[0] for e in events) == sorted(last_use)
    for shard, done in events:
        assert done == plan[: last_use[shard] + 1]  # released as soon as its last unit was recorded


def test_progress_bars_count_bytes(tmp_path, capsys):
    make_checkpoint(tmp_path / "src", Tiny(hidden=128))
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(progress=True))
    err = capsys.readouterr().err
    assert "convert" in err and "100%" in err and "B/s" in err


def test_help_lists_every_option():
    from typer.testing import CliRunner

    from colitools.cli.boundary import app

    text = CliRunner().invoke(app, ["convert", "--help"], terminal_width=200).output
    for option in ("--experts", "--dense", "--embed", "--mtp", "--group-size", "--layout", "--min-free-gb",
                   "--on-low-disk", "--keep-source", "--workers", "--token", "--revision", "--dry-run", "--json"):  # fmt: skip
        assert option in text, option


def test_memory_bounds_do_not_change_bytes(tmp_path, monkeypatch):
    from colitools.converters import unit_writer

    make_checkpoint(tmp_path / "src", Tiny(hidden=128, shards=2))
    convert(str(tmp_path / "src"), tmp_path / "a")
    monkeypatch.setattr(unit_writer, "ENCODE_AHEAD_BYTES", 0)  # every tensor read when needed
    monkeypatch.setattr(unit_writer, "encoder_threads", lambda: 1)  # one tensor at a time
    monkeypatch.setattr(unit_writer.FileSink, "QUEUE_BYTES", 1)  # one tensor in flight to the writer
    convert(str(tmp_path / "src"), tmp_path / "b")
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


def test_a_write_failure_publishes_nothing_of_that_unit(tmp_path, monkeypatch):
    from colitools.formats.errors import SafetensorsError
    from colitools.formats.safetensors_io import SafetensorsWriter

    make_checkpoint(tmp_path / "src", Tiny(hidden=128))
    real = SafetensorsWriter.write

    def failing(self, name, data):
        if name == "model.layers.1.mlp.experts.2.up_proj.weight":
            raise SafetensorsError(f"writing {self.path}: No space left on device")
        return real(self, name, data)

    monkeypatch.setattr(SafetensorsWriter, "write", failing)
    with pytest.raises(SafetensorsError, match="No space left"):
        convert(str(tmp_path / "src"), tmp_path / "out")
    manifest = json.loads((tmp_path / "out/colitools.json").read_text())
    assert list(manifest["units"]) == ["globals", "model.layers.0"] and manifest["state"] == "converting"
    assert not (tmp_path / "out/model-00003-of-00003.safetensors").exists()
    assert not [p for p in (tmp_path / "out").iterdir() if ".tmp-" in p.name]
    monkeypatch.setattr(SafetensorsWriter, "write", real)
    assert convert(str(tmp_path / "src"), tmp_path / "out").units_converted == 1
