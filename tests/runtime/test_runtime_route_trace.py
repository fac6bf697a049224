"""``colitools run --route-trace`` (colibri's ROUTE_TRACE stream), ``usage pairs`` on what it wrote, and the
runtime's save semantics (``--usage-decay``, ``--no-usage``, layers that do not route, an Inkling IKU1 history):
real processes on the oracle fixtures, every expectation counted independently in the test."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from oracle_refs import ORACLES
from tinymodels import write_gqa_model

from colitools.formats.usage import engine_id

_SCRIPT = Path(sys.executable).with_name("colitools")
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "colitools"]
PROMPT = [3, 17, 42, 5, 9]


def cli(*args) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def run(model: Path, *extra, new_tokens: int = 4) -> subprocess.CompletedProcess[str]:
    ids = ",".join(map(str, PROMPT))
    r = cli("run", model, "--prompt-ids", ids, "--max-new-tokens", new_tokens, "--ignore-eos", *extra)
    assert r.returncode == 0, r.stderr
    return r


def parse(trace: Path) -> list[tuple[int, int, int, list[int], list[float]]]:
    out = []
    for line in trace.read_text().splitlines():
        call, row, layer, *picks = line.split(" ")
        ids = [int(p.split(":")[0]) for p in picks]
        gates = [float(p.split(":")[1]) for p in picks]
        assert all(len(p.split(":")[1].split(".")[1]) == 4 for p in picks)  # %.4f
        out.append((int(call), int(row), int(layer), ids, gates))
    return out


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ORACLES / name, tmp_path / name))


def test_the_trace_has_one_line_per_moe_call_and_row_and_matches_the_usage_counts(tmp_path):
    model = copy("mixtral", tmp_path)  # 2 MoE layers, top-2 renormalised: each line's gates sum to 1
    run(model, "--route-trace", tmp_path / "t", new_tokens=4)
    lines = parse(tmp_path / "t")
    # prefill: call 0 = layer 0 x 5 rows, call 1 = layer 1 x 5 rows; then 3 decode steps of one row per layer
    expected = [(c, r, c % 2) for c in (0, 1) for r in range(5)] + [(c, 0, c % 2) for c in range(2, 8)]
    assert [(c, r, layer) for c, r, layer, _, _ in lines] == expected
    assert all(len(ids) == 2 and len(set(ids)) == 2 and abs(sum(g) - 1) <= 2e-4 for *_, ids, g in lines)
    assert all(g[0] >= g[1] for *_, g in lines)  # selection order: the larger gate first
    counted = Counter((layer, e) for _, _, layer, ids, _ in lines for e in ids)
    usage = (model / ".coli_usage").read_text().splitlines()
    assert usage[:2] == ["-1 2 6", f"-2 1 {engine_id('mixtral')}"]  # 2 layers x 6 experts
    assert {(int(a), int(b)): int(c) for a, b, c in (x.split() for x in usage[2:])} == counted


def expected_pairs(lines, moe_layers: int, top: int = 16, depth: int = 2) -> bytes:
    """An independent count: the runtime's calls go layer by layer through every MoE layer once per forward, so
    forward = call // moe_layers; co-activations counted with Counter (ties: first counted first)."""
    positions: dict[tuple[int, int], dict[int, list[int]]] = {}
    for call, row, layer, ids, _ in lines:
        positions.setdefault((call // moe_layers, row), {})[layer] = ids
    pairs: dict[tuple[int, int, int], Counter] = {}
    for layers in positions.values():
        for L, ids in layers.items():
            for dL in range(1, depth + 1):
                for e in ids:
                    for f in layers.get(L + dL, []):
                        pairs.setdefault((L, dL, e), Counter())[f] += 1
    body = [f"{L} {dL} {e} " + " ".join(f"{f}:{n}" for f, n in pairs[L, dL, e].most_common(top))
            for L, dL, e in sorted(pairs)]  # fmt: skip
    return (f"COLIPAIRS 1 {len(body)}\n" + "\n".join(body) + "\n").encode()


def test_usage_pairs_of_a_real_four_layer_run_equals_an_independent_count(tmp_path):
    model = write_gqa_model(tmp_path / "m", n_layers=4, seed=3)  # 4 MoE layers: dL = 1 and 2 both occur
    run(model, "--route-trace", tmp_path / "t1", "--no-usage", new_tokens=6)
    run(model, "--route-trace", tmp_path / "t2", "--no-usage", new_tokens=3)
    lines1, lines2 = parse(tmp_path / "t1"), parse(tmp_path / "t2")
    assert len(lines1) == 4 * (5 + 5)
    r = cli("usage", "pairs", tmp_path / "t1", tmp_path / "t2", "--out", tmp_path / "p")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{tmp_path / 't1'}: 10 positions",
        f"{tmp_path / 't2'}: 7 positions",
        f"wrote {tmp_path / 'p'}: {len((tmp_path / 'p').read_text().splitlines()) - 1} conditioning entries",
    ]
    # the two traces' forwards are counted apart: renumber the second trace's calls after the first's
    shifted = [(c + lines1[-1][0] + 1, *rest) for c, *rest in lines2]  # 24 calls: forwards stay whole
    assert (tmp_path / "p").read_bytes() == expected_pairs(lines1 + shifted, moe_layers=4)
    r = cli("usage", "pairs", tmp_path / "t1", "--out", tmp_path / "p1", "--top", 1, "--depth", 1)
    assert (tmp_path / "p1").read_bytes() == expected_pairs(lines1, moe_layers=4, top=1, depth=1)


def test_a_dense_layer_is_never_traced_nor_credited_from_an_old_history(tmp_path):
    model = copy("qwen3_moe", tmp_path)  # layer 1 is dense (mlp_only_layers)
    eid = engine_id("qwen3_moe")
    (model / ".coli_usage").write_bytes(f"-1 2 8\n-2 1 {eid}\n0 0 5\n1 3 9\n".encode())
    run(model, "--route-trace", tmp_path / "t")
    lines = parse(tmp_path / "t")
    assert {layer for _, _, layer, _, _ in lines} == {0} and [c for c, *_ in lines][-1] == 3  # 4 calls
    counted = Counter((0, e) for *_, ids, _ in lines for e in ids) + Counter({(0, 0): 5})
    body = "".join(f"{layer} {e} {n}\n" for (layer, e), n in sorted(counted.items()))
    assert (model / ".coli_usage").read_text() == f"-1 2 8\n-2 1 {eid}\n" + body


def test_usage_decay_multiplies_the_whole_history_at_the_save(tmp_path):
    model = copy("olmoe", tmp_path)
    eid = engine_id("olmoe")
    (model / ".coli_usage").write_bytes(f"-1 2 6\n-2 1 {eid}\n0 1 10\n1 5 3\n".encode())
    run(model, "--route-trace", tmp_path / "t", "--usage-decay", "0.5")
    counted = Counter((layer, e) for _, _, layer, ids, _ in parse(tmp_path / "t") for e in ids)
    counted += Counter({(0, 1): 10, (1, 5): 3})
    kept = {k: (n + 1) // 2 for k, n in counted.items()}  # floor(n * 0.5 + 0.5) in integers
    body = "".join(f"{layer} {e} {n}\n" for (layer, e), n in sorted(kept.items()) if n)
    assert (model / ".coli_usage").read_text() == f"-1 2 6\n-2 1 {eid}\n" + body


@pytest.mark.parametrize("bad", ["0", "1.5", "-1", "nan"])
def test_a_usage_decay_outside_zero_one_is_a_usage_error(tmp_path, bad):
    r = cli("run", ORACLES / "olmoe", "--prompt-ids", "3", "--usage-decay", bad, "--no-usage")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"colitools: error: --usage-decay must be in (0, 1], got {float(bad)}"
    ]


def test_no_usage_leaves_an_existing_history_byte_identical(tmp_path):
    model = copy("olmoe", tmp_path)
    before = f"-1 2 6\r\n-2 1 {engine_id('olmoe')}\r\n0 1 10\r\n".encode()  # CRLF, as Windows writes it
    (model / ".coli_usage").write_bytes(before)
    run(model, "--no-usage", "--route-trace", tmp_path / "t")
    assert (model / ".coli_usage").read_bytes() == before and (tmp_path / "t").stat().st_size > 0


def test_an_inkling_run_extends_its_iku1_history_and_saves_text(tmp_path):
    model = copy("inkling", tmp_path)  # model_type inkling_mm_model: 2 MoE layers x 4 experts
    (model / ".coli_usage").write_bytes(struct.pack("<4s2I8I", b"IKU1", 2, 4, 0, 7, 0, 0, 0, 0, 0, 2))
    run(model, "--route-trace", tmp_path / "t")
    counted = Counter((layer, e) for _, _, layer, ids, _ in parse(tmp_path / "t") for e in ids)
    counted += Counter({(0, 1): 7, (1, 3): 2})
    body = "".join(f"{layer} {e} {n}\n" for (layer, e), n in sorted(counted.items()))
    assert (model / ".coli_usage").read_text() == f"-1 2 4\n-2 1 {engine_id('inkling_mm_model')}\n" + body


def test_a_route_trace_that_cannot_be_opened_is_one_line(tmp_path):
    r = cli(
        "run", ORACLES / "olmoe", "--prompt-ids", "3", "--no-usage", "--route-trace", tmp_path / "no" / "t"
    )
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"colitools: error: cannot open the route trace {tmp_path / 'no' / 't'}: "
                                     "No such file or directory"]  # fmt: skip
