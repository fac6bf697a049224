"""A seeded, table-driven bad-input harness: every command on malformed inputs (issue 9, "Must show").

Valid inputs are built once (the bundled OLMoE fixture, its conversion, a routing usage file from a real run, a
mirror receipt from a real ``mirror stage``); each case copies what it needs, damages one file or one option
value in one way (truncation, corrupt JSON, wrong types, huge / negative numbers, deep nesting, unicode,
missing files, wrong option values) and runs the real console script with a timeout. Every case must end with an
exit code from README's table, no traceback on stderr, and a refusal (exit 1 or 2) must be exactly one line
``colitools: error: ...``. The cases run two at a time; the same seed always gives the same cases.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "oracles" / "olmoe"
SEED = 20_250_9
TIMEOUT = 240  # generous: a hang fails the case, no timing is asserted
POOL = 2
SHARD = "model-00002-of-00003.safetensors"  # an expert shard of the converted fixture (a mirrored one)

# README "Exit codes": 0 success, 1 error, 2 usage error / plan not admitted, 3 disk floor (convert), 4 found
# problems (verify, mirror verify, mirror stage's final verify)
EXIT_CODES = {0, 1, 2, 3, 4}


# ------------------------------------------------------------------------------------------- mutations
def _json_bytes(value) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


BAD_VALUES = [
    "two", "", -1, 0, -(10**30), 10**30, 1e308, -1e308, 0.5, None, True, [], {}, [0, "x"], {"a": {"b": [None]}},
    "ü\u202e名\u0000", "\ud800", 2**63, -(2**63) - 1, [[[[[[[[[[1]]]]]]]]]],
]  # fmt: skip


def _paths(value, prefix=()):
    """Every path to a value inside parsed JSON (dict keys and list indices)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:20]):
            yield from _paths(v, (*prefix, i))


def _replace(value, path, new):
    if not path:
        return new
    head, *rest = path
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    return [_replace(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _delete(value, path):
    head, *rest = path
    if rest:
        if isinstance(value, dict):
            return {**value, head: _delete(value[head], rest)}
        return [_delete(v, rest) if i == head else v for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != head}
    return [v for i, v in enumerate(value) if i != head]


def mutate_json(data: bytes, rng: random.Random, kind: str) -> bytes | None:
    """A damaged copy of a JSON file (None: delete the file)."""
    value = json.loads(data)
    paths = [p for p in _paths(value) if p]
    if kind == "value":
        path = rng.choice(paths)
        return _json_bytes(_replace(value, path, rng.choice(BAD_VALUES)))
    if kind == "digits":  # a number too long to convert to int
        return _json_bytes(_replace(value, rng.choice(paths), 0)).replace(b": 0", b": " + b"9" * 5000, 1)
    if kind == "drop-key":
        return _json_bytes(_delete(value, rng.choice(paths)))
    if kind == "truncate":
        return data[: rng.randrange(0, max(len(data) - 1, 1))]
    if kind == "garbage-byte":
        i = rng.randrange(len(data))
        return data[:i] + bytes([rng.choice(b"\x00\xff{}[]\",:9-\\")]) + data[i + 1 :]
    if kind == "deep":
        return b"[" * 100_000 + b"]" * 100_000
    if kind == "deep-object":
        return b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    if kind == "not-object":
        return rng.choice([b"[]", b"42", b'"text"', b"null", b"", b"\xff\xfe\x00"])
    if kind == "not-utf8":
        return data.replace(b'"', b'"\xc3\x28', 1)
    if kind == "missing":
        return None
    raise AssertionError(kind)


JSON_KINDS = ["value", "value", "value", "digits", "drop-key", "truncate", "garbage-byte", "deep", "deep-object",
              "not-object", "not-utf8", "missing"]  # fmt: skip


def mutate_safetensors(data: bytes, rng: random.Random, kind: str) -> bytes | None:
    n = int.from_bytes(data[:8], "little")
    if kind == "truncate":
        return data[: rng.randrange(0, len(data) - 1)]
    if kind == "header-length":
        return rng.choice([2**64 - 1, 0, n + 1, n - 1, 10**9, len(data)]).to_bytes(8, "little") + data[8:]
    if kind == "header-byte":
        i = rng.randrange(8, 8 + n)
        return data[:i] + bytes([rng.choice(b"\x00\xff{}[]\",:9-")]) + data[i + 1 :]
    if kind == "header-value":
        header = json.loads(data[8 : 8 + n])
        names = [k for k in header if k != "__metadata__"]
        name = rng.choice(names)
        field = rng.choice(["dtype", "shape", "data_offsets"])
        bad = rng.choice(BAD_VALUES + [[-1, 5], [0, 2**70], ["a"], [10**6, 10**6]])
        header[name] = {**header[name], field: bad}
        text = json.dumps(header).encode()
        return len(text).to_bytes(8, "little") + text + data[8 + n :]
    if kind == "data-byte":
        i = rng.randrange(8 + n, len(data))
        return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
    if kind == "empty":
        return b""
    if kind == "missing":
        return None
    raise AssertionError(kind)


ST_KINDS = ["truncate", "header-length", "header-byte", "header-value", "header-value", "data-byte", "empty",
            "missing"]  # fmt: skip


def mutate_usage(data: bytes, rng: random.Random, kind: str) -> bytes | None:
    lines = data.decode().splitlines()
    if kind == "line":
        i = rng.randrange(len(lines))
        lines[i] = rng.choice([
            "0 1", "0 1 2 3", "a b c", "0 1 -5", "-1 -2 -3", "0 99 1", "99 0 1", "0 1 " + "9" * 5000,
            "0 1 1e3", "\u0661 \u0662 \u0663", "0 1 0x10", "-2 7 0", "-1 0 0", "-1 100000000000 100000000000",
            "\x00\x00\x00", "0 1 " + str(2**64), "-2 1 " + "9" * 40,
        ])  # fmt: skip
        return ("\n".join(lines) + "\n").encode("utf-8")
    if kind == "truncate":
        return data[: rng.randrange(0, max(len(data) - 1, 1))]
    if kind == "binary":
        return bytes(rng.randrange(256) for _ in range(64))
    if kind == "huge":
        return data + b"0 0 " + b"9" * 100_000 + b"\n"
    if kind == "missing":
        return None
    raise AssertionError(kind)


USAGE_KINDS = ["line", "line", "line", "truncate", "binary", "huge", "missing"]


# ---------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One run: ``argv`` with ``{model}`` (converted), ``{src}`` (float fixture), ``{mirror}``, ``{fixture}``,
    ``{new}`` (a fresh output folder) placeholders; ``damage`` = (base, file in it, mutator, kind) or None."""

    id: str
    argv: tuple[str, ...]
    damage: tuple[str, str, str, str] | None = None


RUN = ("run", "{model}", "--prompt-ids", "1,2", "--max-new-tokens", "1", "--no-usage")
CONVERT_DRY = ("convert", "{src}", "{new}", "--dry-run", "--min-free-gb", "0")
RESUME = ("convert", "{src}", "{model}", "--min-free-gb", "0", "--no-progress")
INSPECT = ("inspect", "{model}", "--json")
VERIFY = ("verify", "container", "{model}")
USAGE = ("usage", "show", "{model}/.coli_usage", "--model", "{model}")
PLAN = ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--reserve-gib", "0")
STAGE = ("mirror", "stage", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--reserve-gib", "0")
MVERIFY = ("mirror", "verify", "--mirror", "{mirror}", "--model", "{model}")
ORACLE = ("verify", "oracle", "{fixture}", "--recipe", "default")

# (base, file, mutator, commands, how many cases): which file of which input each command is driven with
FILE_PLAN = [
    ("model", "config.json", "json", [INSPECT, VERIFY, USAGE, PLAN, RUN], 12),
    ("src", "config.json", "json", [CONVERT_DRY, CONVERT_DRY, RUN], 9),
    ("model", "model.safetensors.index.json", "json", [INSPECT, VERIFY, PLAN, STAGE, RUN], 10),
    ("model", SHARD, "safetensors", [INSPECT, VERIFY, MVERIFY, PLAN, RUN], 10),
    ("src", "model.safetensors", "safetensors", [CONVERT_DRY, INSPECT], 6),
    ("model", "colitools.json", "json", [VERIFY, VERIFY, RESUME], 9),
    ("model", ".coli_usage", "usage", [USAGE, PLAN, STAGE], 12),
    ("mirror", ".colibri-mirror.json", "json", [MVERIFY], 8),
    ("fixture", "reference/default.json", "json", [ORACLE], 2),
]

# option values: each command with values out of range, of the wrong type, huge, negative, unicode, empty
OPTION_CASES = [
    ("convert", "{src}", "{new}", "--experts", "int4-g7"), ("convert", "{src}", "{new}", "--experts", ""),
    ("convert", "{src}", "{new}", "--experts", "名"), ("convert", "{src}", "{new}", "--dense", "int4-g64x"),
    ("convert", "{src}", "{new}", "--group-size", "0"), ("convert", "{src}", "{new}", "--group-size", "-64"),
    ("convert", "{src}", "{new}", "--group-size", "9" * 40), ("convert", "{src}", "{new}", "--group-size", "x"),
    ("convert", "{src}", "{new}", "--layout", "diagonal"), ("convert", "{src}", "{new}", "--min-free-gb", "nan"),
    ("convert", "{src}", "{new}", "--min-free-gb", "1e400"), ("convert", "{src}", "{new}", "--min-free-gb", "-5"),
    ("convert", "{src}", "{new}", "--on-low-disk", "panic"), ("convert", "{src}", "{new}", "--workers", "0"),
    ("convert", "{src}", "{new}", "--workers", "9" * 30), ("convert", "{src}", "{new}", "--revision", "main"),
    ("convert", "{src}", "{src}/config.json"), ("convert", "{src}/config.json", "{new}"),
    ("convert", "no/such\u202erepo!", "{new}"), ("convert", "../..", "{new}", "--dry-run"),
    ("convert", "{src}", "{new}", "--experts", "int3-g64", "--group-size", "32"),
    ("inspect", "{new}"), ("inspect", "{model}/config.json"), ("inspect", "/dev/null"), ("inspect", ""),
    ("verify", "container", "{new}"), ("verify", "container", "{model}/tokenizer.json"),
    ("verify", "oracle", "{new}"), ("verify", "oracle", "{model}"), ("verify", "oracle", "{fixture}", "-r", "nope"),
    ("verify", "oracle", "{fixture}", "--atol", "nan"), ("verify", "oracle", "{fixture}", "--atol", "-1"),
    ("verify", "oracle", "{fixture}", "--cap", "0"), ("verify", "bogus"),
    ("run", "{model}", "--prompt-ids", "1,,2"), ("run", "{model}", "--prompt-ids", "-1"),
    ("run", "{model}", "--prompt-ids", "9" * 5000), ("run", "{model}", "--prompt-ids", ""),
    ("run", "{model}", "--prompt-ids", "1", "--max-new-tokens", "0"),
    ("run", "{model}", "--prompt-ids", "1", "--max-new-tokens", "9" * 30),  # bounded: a usage error
    ("run", "{model}", "--prompt-ids", "1", "--cap", "-3"), ("run", "{model}", "--prompt-ids", "1", "--cap", "x"),
    ("run", "{model}", "--prompt-ids", "1", "--ram-gb", "0"), ("run", "{model}", "--prompt-ids", "1", "--ram-gb", "nan"),
    ("run", "{model}", "--prompt-ids", "1", "--ram-gb", "-1"), ("run", "{model}", "--prompt-ids", "1", "--ram-gb", "inf"),
    ("run", "{model}"), ("run", "{model}", "--prompt-ids", "1", "--prompt", "x"), ("run", "{new}", "--prompt-ids", "1"),
    ("run", "{src}/config.json", "--prompt-ids", "1"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "0"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "nan"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1e400"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--reserve-gib", "-1"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--disk-weights", "9,x"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--disk-weights", "0,0"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--disk-weights", "-1,2"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--disk-weights", "1e400,1"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--usage", "{new}"),
    ("mirror", "plan", "--model", "{new}", "--mirror", "{mirror}", "--budget-gib", "1"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{model}", "--budget-gib", "1"),
    ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--source-dir", "{new}"),
    ("mirror", "plan", "--mirror", "{mirror}", "--budget-gib", "1"),
    ("mirror", "stage", "--model", "{model}", "--mirror", "{model}", "--budget-gib", "1", "--reserve-gib", "0"),
    ("mirror", "stage", "--model", "{model}", "--mirror", "{model}/config.json", "--budget-gib", "1"),
    ("mirror", "stage", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "-2"),
    ("mirror", "verify", "--mirror", "{new}"), ("mirror", "verify", "--mirror", "{model}/config.json"),
    ("mirror", "verify"), ("mirror", "verify", "--mirror", "{mirror}", "--model", "{new}"),
    ("usage", "show", "{new}"), ("usage", "show", "{model}/.coli_usage", "--top", "0"),
    ("usage", "show", "{model}/.coli_usage", "--top", "9" * 30), ("usage", "show", "{model}"),
    ("usage", "show", "{model}/.coli_usage", "--model", "{new}"), ("usage", "show", "/dev/null"),
    ("formats", "--bogus"), ("formats", "extra"), ("formats", "--json", "--json"), ("bogus-command",),
]  # fmt: skip


def build_cases() -> list[Case]:
    rng = random.Random(SEED)
    kinds = {"json": JSON_KINDS, "safetensors": ST_KINDS, "usage": USAGE_KINDS}
    cases = []
    for base, file, mutator, commands, count in FILE_PLAN:
        for i in range(count):
            argv = commands[i % len(commands)]
            kind = rng.choice(kinds[mutator])
            name = f"{base}/{file}:{kind}:{argv[0]}{'-' + argv[1] if argv[0] in ('verify', 'mirror') else ''}:{i}"
            cases.append(Case(name, argv, (base, file, mutator, kind)))
    for i, argv in enumerate(OPTION_CASES):
        cases.append(Case(f"option:{i}:{' '.join(argv[:2])}", argv))
    return cases


CASES = build_cases()
MUTATORS = {"json": mutate_json, "safetensors": mutate_safetensors, "usage": mutate_usage}


# ------------------------------------------------------------------------------------------ running them
def colitools(argv, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*argv, env={"HF_HUB_OFFLINE": "1"}, timeout=TIMEOUT, cwd=cwd)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Path:
    """The valid inputs: src (the float fixture), model (converted, with a usage file), mirror (staged)."""
    root = tmp_path_factory.mktemp("bad_inputs_bases")
    shutil.copytree(FIXTURE, root / "src")
    shutil.copytree(FIXTURE, root / "fixture")
    steps = [
        ("convert", root / "src", root / "model", "--min-free-gb", "0", "--no-progress"),
        ("run", root / "model", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"),  # writes model/.coli_usage
        ("mirror", "stage", "--model", root / "model", "--mirror", root / "mirror", "--budget-gib", "1",
         "--reserve-gib", "0"),
    ]  # fmt: skip
    for argv in steps:
        result = colitools(argv)
        assert result.returncode == 0, (argv, result.stderr)
    assert (root / "model" / ".coli_usage").stat().st_size > 0 and (root / "mirror" / ".colibri-mirror.json").exists()
    return root


def _prepare(case_index: int, case: Case, bases: Path, work: Path) -> list[str]:
    """Copy the inputs of one case, damage the file it names, and return its argv."""
    here = work / f"case{case_index:03d}"
    here.mkdir()
    used = {b for b in ("src", "model", "mirror", "fixture") if any("{" + b + "}" in a for a in case.argv)}
    if case.damage is not None:
        used.add(case.damage[0])
    if "mirror" in used:  # the receipt and the mirrored copies belong to this model
        used.add("model")
    for b in used:
        shutil.copytree(bases / b, here / b, symlinks=True)
    if "mirror" in used:  # the receipt names the model it was staged from: point it at this case's copy
        receipt = here / "mirror" / ".colibri-mirror.json"
        text = receipt.read_text().replace(str(bases / "model"), str(here / "model"))
        receipt.write_text(text.replace(str(bases / "mirror"), str(here / "mirror")))
    if case.damage is not None:
        base, file, mutator, kind = case.damage
        path = here / base / file
        rng = random.Random(f"{SEED}:{case_index}")
        damaged = MUTATORS[mutator](path.read_bytes(), rng, kind)
        if damaged is None:
            path.unlink()
        else:
            path.write_bytes(damaged)
    names = {"src": here / "src", "model": here / "model", "mirror": here / "mirror", "fixture": here / "fixture",
             "new": here / "new"}  # fmt: skip
    return [a.format(**{k: str(v) for k, v in names.items()}) for a in case.argv]


@pytest.fixture(scope="module")
def results(bases, tmp_path_factory) -> dict[str, subprocess.CompletedProcess[str] | str]:
    work = tmp_path_factory.mktemp("bad_inputs_cases")
    argvs = [_prepare(i, case, bases, work) for i, case in enumerate(CASES)]

    def one(argv):
        try:
            return colitools(argv, cwd=work)
        except subprocess.TimeoutExpired:
            return f"no answer within {TIMEOUT} s (a hang): {argv}"

    with ThreadPoolExecutor(POOL) as pool:
        done = list(pool.map(one, argvs))
    return {case.id: result for case, result in zip(CASES, done, strict=True)}


def test_the_harness_is_seeded_and_large_enough():
    assert [c.id for c in build_cases()] == [c.id for c in CASES]
    assert 150 <= len(CASES) <= 300
    commands = {" ".join(a for a in c.argv[:2] if not a.startswith("{")) for c in CASES}
    for command in ("convert", "inspect", "verify container", "verify oracle", "run", "mirror plan",
                    "mirror stage", "mirror verify", "usage show", "formats"):  # fmt: skip
        assert any(c == command or c.startswith(command + " ") or c.split()[0] == command for c in commands), command


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_line_with_a_documented_exit_code(results, case):
    result = results[case.id]
    assert not isinstance(result, str), result
    where = f"{case.argv} {case.damage}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr, where
    assert result.returncode in EXIT_CODES, where
    if result.returncode == 3:
        assert case.argv[0] == "convert", where
    if result.returncode == 2 and case.argv[:2] in (("mirror", "plan"), ("mirror", "stage")) and (
        "admitted: no" in result.stdout
    ):
        return  # README: exit 2 is also a plan that was not admitted, reported on stdout with its reason
    if result.returncode in (1, 2):
        lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
        assert len(lines) == 1 and lines[0].startswith("colitools: error: "), where
    else:
        assert "colitools: error:" not in result.stderr, where
