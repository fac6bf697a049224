"""Test helper: the committed oracle fixtures and their references (oracles/README.md)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import zstandard

from colitools.formats.families import RUNNABLE_MODEL_TYPES
from colitools.runtime import generate, load_model

ORACLES = Path(__file__).resolve().parents[2] / "oracles"
RECIPES = ("f32", "default", "int3", "mxfp4", "planar")
LOGITS_ATOL = 1e-4


def fixtures() -> list[str]:
    """The fixtures the runtime can run (model_type in RUNNABLE_MODEL_TYPES: every fixture today, which
    tests/test_oracle_fixtures.py checks)."""
    names = sorted(p.parent.parent.name for p in ORACLES.glob("*/reference/f32.json"))
    return [n for n in names if json.loads((ORACLES / n / "config.json").read_text())["model_type"]
            in RUNNABLE_MODEL_TYPES]  # fmt: skip


# Natively quantized sources the runtime does not read directly (INT4 compressed-tensors, modelopt NVFP4 / MXFP8):
# the runtime runs their conversions (and tests/runtime/containers.py's decoded stand-in for the f32 reference).
DECODED_SOURCE_METHODS = ("compressed-tensors", "modelopt")


def runtime_reads_source(fixture: str) -> bool:
    qc = json.loads((ORACLES / fixture / "config.json").read_text()).get("quantization_config") or {}
    return qc.get("quant_method") not in DECODED_SOURCE_METHODS


def native_fixtures() -> list[str]:
    """The runnable fixtures with a ``native`` reference (natively quantized sources, docs/FORMATS.md §5)."""
    return [f for f in fixtures() if (ORACLES / f / "reference" / "native.json").exists()]


def reference(fixture: str, recipe: str) -> dict:
    name = "default" if recipe == "planar" else recipe
    return json.loads((ORACLES / fixture / "reference" / f"{name}.json").read_text())


def reference_logits(fixture: str, ref: dict) -> np.ndarray:
    """``[2, V]``: row 0 = logits of the last greedy step (KV cache), row 1 = teacher-forced last position."""
    raw = (ORACLES / fixture / "reference" / ref["logits"]["file"]).read_bytes()
    return np.load(io.BytesIO(zstandard.ZstdDecompressor().decompress(raw)))


def check_against_reference(model_dir, fixture: str, ref: dict, cap: int | None = None) -> None:
    want = reference_logits(fixture, ref)
    with load_model(model_dir, cap=cap, record_usage=False) as model:
        res = generate(model, ref["prompt_ids"], len(ref["generated_ids"]))
        argmax, last = model.score(ref["teacher_forced"]["input_ids"])
    assert res.generated_ids == ref["generated_ids"]
    assert argmax == ref["teacher_forced"]["argmax"]
    np.testing.assert_allclose(res.last_logits, want[0], rtol=0, atol=LOGITS_ATOL)
    np.testing.assert_allclose(last, want[1], rtol=0, atol=LOGITS_ATOL)
