"""Generated model directories for the mirror tests: shards of U8 tensors with exact, hand-chosen byte counts.

Shards are written with the project's own safetensors writer, which pads the header so the data starts at
4096: a shard's size is exactly ``4096 + sum(tensor bytes)`` (``HEADER``), which keeps the expected plans
computable by hand in the tests.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from colitools.formats.safetensors_io import write_safetensors
from colitools.formats.usage import UsageHistory, engine_id, write_usage

HEADER = 4096
REPO = Path(__file__).resolve().parents[2]

Tensors = list[tuple[str, int]]  # (name, byte count) in file order


def expert_tensors(layer: int, expert: int, *, weight: int = 1000, scale: int = 40,
                   projs: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj"),
                   prefix: str = "model.layers") -> Tensors:
    """One pairs-layout expert: its weight tensors back to back, then their ``.qs`` scales in the same order."""
    base = f"{prefix}.{layer}.mlp.experts.{expert}"
    out = [(f"{base}.{p}.weight", weight) for p in projs]
    if scale:
        out += [(f"{base}.{p}.weight.qs", scale) for p in projs]
    return out


def k3_expert_tensors(layer: int, expert: int, *, packed: int = 512, scale: int = 32,
                      projs: tuple[str, ...] = ("w1", "w3", "w2")) -> Tensors:
    """A K3-style mxfp4 expert: ``block_sparse_moe.experts.E.wN.weight_packed`` codes, then the scales."""
    base = f"language_model.model.layers.{layer}.block_sparse_moe.experts.{expert}"
    return [(f"{base}.{p}.weight_packed", packed) for p in projs] + [
        (f"{base}.{p}.weight_scale", scale) for p in projs
    ]


def write_shard(path: Path, tensors: Tensors, metadata: dict[str, str] | None = None, fill: int = 0) -> int:
    """Write U8 tensors of the given byte counts; returns the file size (always HEADER + data)."""
    arrays = {name: np.full(n, (fill + i) % 251, dtype=np.uint8) for i, (name, n) in enumerate(tensors)}
    write_safetensors(path, arrays, metadata)
    size = path.stat().st_size
    assert size == HEADER + sum(n for _, n in tensors), "fixture assumption: header padded to 4096"
    return size


def write_config(model: Path, *, n_layers: int, n_experts: int, model_type: str = "olmoe") -> None:
    (model / "config.json").write_text(
        json.dumps({"model_type": model_type, "num_hidden_layers": n_layers, "num_experts": n_experts})
    )


def write_history(path: Path, counts: dict[tuple[int, int], int], *, n_layers: int, n_experts: int,
                  engine: str | None = "olmoe") -> None:
    history = UsageHistory(n_layers, n_experts, engine_id(engine) if engine else None)
    for (layer, expert), n in counts.items():
        history.add(layer, expert, n)
    write_usage(path, history)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Run the real CLI entry point (``colitools.cli.main``) in this process: parsing, printing, exit codes."""
    from colitools.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return CliResult(code, out.getvalue(), err.getvalue())


def run_cli_process(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start ``python -m colitools ARGS`` as a child process (for kills and real exit statuses)."""
    return subprocess.Popen([sys.executable, "-m", "colitools", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, cwd=REPO, **kwargs)


def three_shard_model(tmp_path: Path, counts: dict[tuple[int, int], int]) -> Path:
    """A two-layer, four-expert olmoe model of three one-expert shards (a: expert (0, 0), b: (0, 1), c: (1, 0);
    7216 bytes each) with the routing history ``counts``."""
    d = tmp_path / "model"
    d.mkdir()
    write_config(d, n_layers=2, n_experts=4)
    write_shard(d / "a.safetensors", expert_tensors(0, 0), fill=1)
    write_shard(d / "b.safetensors", expert_tensors(0, 1), fill=2)
    write_shard(d / "c.safetensors", expert_tensors(1, 0), fill=3)
    write_history(d / ".coli_usage", counts, n_layers=2, n_experts=4)
    return d
