"""Source tensors the converter must refuse rather than pass through (docs/FORMATS.md §6):

* a routed expert weight of an integer dtype that no source encoding claims is not a "copied non-float"
  tensor: one ``colitools: error:`` line naming it and its dtype, exit 1, before any work (nothing written);
* NaN / inf in what the passthrough recipes write (``fp8``: ``e4m3(q) * weight_scale_inv``; ``f32`` / ``bf16``:
  the weight itself; ``native`` INT4: its widened scales) is refused with the message the quantized recipes
  give for the same source, so ``verify container`` never has to reject colitools' own output.

Checkpoints are written here (``tinyckpt``); the expected ``[o, i]`` and counts follow from what the test put
where, never from the converter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from test_native import make_int4
from tinyckpt import Tiny, make_checkpoint, write_tensors

from colitools.converters.options import ConvertOptions
from colitools.converters.runner import convert
from colitools.errors import ColitoolsError, ConvertError

F32, BF16 = np.float32, ml_dtypes.bfloat16
EXPERT = "model.layers.0.mlp.experts.1.up_proj.weight"  # [inter, hidden] = [32, 64]


def cli(*args) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colitools", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def one_error_line(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("colitools: error: "), result.stderr
    return lines[0].removeprefix("colitools: error: ")


def checkpoint(folder: Path, dtype: str = "BF16", **changes: np.ndarray) -> dict[str, np.ndarray]:
    """A one-layer tiny MoE checkpoint with ``changes`` (name -> array) written over the generated tensors."""
    tensors = make_checkpoint(folder, Tiny(layers=1, experts=2, dtype=dtype))
    tensors.update(changes)
    write_tensors(folder, tensors, 1)
    return tensors


def conversion_error(src: Path, out: Path, **options) -> str:
    with pytest.raises(ColitoolsError) as exc:
        convert(str(src), out, ConvertOptions(**options))
    assert "\n" not in str(exc.value)
    return str(exc.value)


# ----------------------------------------------------------------------- integer routed expert weights
@pytest.mark.parametrize("dtype", [np.int32, np.int8])
def test_an_integer_per_expert_weight_is_refused_by_the_cli_before_work(tmp_path, dtype):
    checkpoint(tmp_path / "src", **{EXPERT: np.ones((32, 64), dtype)})
    result = cli("convert", tmp_path / "src", tmp_path / "out")
    line = one_error_line(result)
    name = {np.int32: "I32", np.int8: "I8"}[dtype]
    assert line.startswith(f"tensor {EXPERT}: a routed expert weight stored as {name} [32, 64]"), line
    assert not (tmp_path / "out").exists()  # refused while planning: nothing written


def test_an_integer_expert_stack_is_refused(tmp_path):
    stack = "model.layers.0.mlp.experts.down_proj"
    tensors = make_checkpoint(tmp_path / "src", Tiny(layers=1, experts=2, fused=True))
    tensors[stack] = np.zeros(tensors[stack].shape, np.int8)
    write_tensors(tmp_path / "src", tensors, 1)
    msg = conversion_error(tmp_path / "src", tmp_path / "out", dry_run=True)
    assert msg.startswith(f"tensor {stack}: a routed expert weight stored as I8 [2, 64, 32]"), msg


def test_u8_codes_no_encoding_claims_are_refused_not_copied(tmp_path):
    # NVFP4 codes with their _scale but no _scale_2: no encoding claims the U8 tensor
    changes = {
        EXPERT: np.zeros((32, 32), np.uint8),
        EXPERT + "_scale": np.zeros((32, 4), ml_dtypes.float8_e4m3fn),
    }
    checkpoint(tmp_path / "src", **changes)
    msg = conversion_error(tmp_path / "src", tmp_path / "out", dry_run=True)
    assert f"tensor {EXPERT}: a routed expert weight stored as U8 [32, 32]" in msg, msg


def test_integer_tensors_outside_the_routed_experts_are_still_copied(tmp_path):
    tid2eid = np.arange(96 * 2, dtype=np.int64).reshape(96, 2)  # DeepSeek-V4's router table (rule 0)
    checkpoint(tmp_path / "src", **{"model.layers.0.mlp.gate.tid2eid": tid2eid})
    convert(str(tmp_path / "src"), tmp_path / "out")
    from convcheck import stored_arrays

    got = stored_arrays(tmp_path / "out")["model.layers.0.mlp.gate.tid2eid"]
    assert got.dtype == np.int64 and np.array_equal(got, tid2eid)


def test_packed_int4_codes_are_claimed_by_their_encoding(tmp_path):
    make_int4(tmp_path / "src")  # I32 weight_packed experts: an encoding's, not refused
    convert(str(tmp_path / "src"), tmp_path / "out", ConvertOptions(dry_run=True))


# --------------------------------------------------------------------------- non-finite passthrough
def test_fp8_passthrough_refuses_a_nan_scale_like_the_quantized_recipes(tmp_path):
    src = tmp_path / "src"
    checkpoint(
        src, "FP8", **{EXPERT + "_scale_inv": np.array([[np.nan]], F32)}
    )  # one 128x128 block: all of it
    want = f"tensor {EXPERT}: non-finite value nan at [0, 0] (2048 non-finite in total)"
    assert one_error_line(cli("convert", src, tmp_path / "o1", "--experts", "fp8")) == want
    assert conversion_error(src, tmp_path / "o2", experts="int4-g64") == want  # the quantized recipe's words
    assert conversion_error(src, tmp_path / "o3", experts="f32") == want


def test_fp8_passthrough_refuses_nan_codes_and_overflowing_products(tmp_path):
    tensors = make_checkpoint(tmp_path / "a", Tiny(layers=1, experts=2, dtype="FP8"))
    q = tensors[EXPERT].view(np.uint8).copy()
    q[3, 5], q[7, 1] = 0x7F, 0xFF  # e4m3fn NaN, both signs
    checkpoint(tmp_path / "a", "FP8", **{EXPERT: q.view(ml_dtypes.float8_e4m3fn)})
    want = f"tensor {EXPERT}: non-finite value nan at [3, 5] (2 non-finite in total)"
    assert conversion_error(tmp_path / "a", tmp_path / "oa", experts="fp8") == want
    assert conversion_error(tmp_path / "a", tmp_path / "oa2", experts="int8-row") == want

    q = tensors[EXPERT].view(np.uint8).copy()
    q[:] = 0  # zero codes: every product is 0, finite, whatever the scale
    q[2, 9] = 0x7E  # 448 * 1e38 overflows float32
    changes = {EXPERT: q.view(ml_dtypes.float8_e4m3fn), EXPERT + "_scale_inv": np.array([[1e38]], F32)}
    checkpoint(tmp_path / "b", "FP8", **changes)
    want = f"tensor {EXPERT}: non-finite value inf at [2, 9] (1 non-finite in total)"
    assert conversion_error(tmp_path / "b", tmp_path / "ob", experts="fp8") == want
    q[2, 9] = 0
    checkpoint(tmp_path / "c", "FP8", **{**changes, EXPERT: q.view(ml_dtypes.float8_e4m3fn)})
    convert(str(tmp_path / "c"), tmp_path / "oc", ConvertOptions(experts="fp8"))  # 0 * 1e38: finite, kept


@pytest.mark.parametrize("experts", ["f32", "bf16"])
def test_float_passthrough_refuses_a_nan_weight_like_the_quantized_recipes(tmp_path, experts):
    tensors = make_checkpoint(tmp_path / "src", Tiny(layers=1, experts=2))
    w = tensors[EXPERT].copy()
    w[3, 5], w[30, 60] = np.nan, -np.inf
    checkpoint(tmp_path / "src", **{EXPERT: w})
    want = f"tensor {EXPERT}: non-finite value nan at [3, 5] (2 non-finite in total)"
    assert one_error_line(cli("convert", tmp_path / "src", tmp_path / "o1", "--experts", experts)) == want
    assert conversion_error(tmp_path / "src", tmp_path / "o2", experts="int8-row") == want


def test_bf16_rounding_to_inf_is_refused(tmp_path):
    tensors = make_checkpoint(tmp_path / "src", Tiny(layers=1, experts=2, dtype="F32"))
    w = tensors[EXPERT].copy()
    w[1, 2] = np.finfo(F32).max  # finite in F32, rounds to inf in BF16
    checkpoint(tmp_path / "src", "F32", **{EXPERT: w})
    want = f"tensor {EXPERT}: non-finite value inf at [1, 2] (1 non-finite in total)"
    assert conversion_error(tmp_path / "src", tmp_path / "o", experts="bf16") == want
    convert(str(tmp_path / "src"), tmp_path / "o32", ConvertOptions(experts="f32"))  # finite as F32


def test_native_int4_refuses_a_nan_scale_like_its_decoded_path(tmp_path):
    make_int4(tmp_path / "src")
    from colitools.formats.safetensors_io import SafetensorsFile

    f = SafetensorsFile(tmp_path / "src/model.safetensors")
    tensors = {n: f.read(n) for n in f.tensors}
    f.close()
    name = "model.layers.0.mlp.experts.1.down_proj"
    scale = tensors[name + ".weight_scale"].copy()
    scale[4, 0] = np.nan
    tensors[name + ".weight_scale"] = scale
    write_tensors(tmp_path / "src", tensors, 1)
    want = f"tensor {name}.weight: the int4 source decodes to NaN or inf (a NaN scale byte)"
    with pytest.raises(ConvertError) as kept:
        convert(str(tmp_path / "src"), tmp_path / "o1", ConvertOptions(experts="native"))
    with pytest.raises(ConvertError) as decoded:
        convert(str(tmp_path / "src"), tmp_path / "o2", ConvertOptions(experts="int4-g64"))
    assert str(kept.value) == str(decoded.value) == want
