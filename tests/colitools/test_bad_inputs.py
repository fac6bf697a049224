"""A seeded, table-driven bad-input harness: every command on malformed inputs (issues 9 and 24, "Must show").

Valid inputs are built once (the bundled OLMoE fixture, its conversion, a routing usage file from a real run, a
mirror receipt from a real ``mirror stage``, a planar conversion, an interrupted conversion, the MXFP8 and FP8
fixtures); each case copies what it needs, damages one file or one option value in one way (truncation, corrupt
JSON, wrong types, huge / negative numbers, deep nesting, unicode, missing files, wrong option values, and
issue 24's classes in ``bad_input_classes.py``: lone surrogates and odd text in every name field, file names
leaving the folder, huge declared sizes and geometries, integer and NaN tensors in every role) and runs the real
console script with a timeout. Every case must end with an exit code from docs/CLI.md's table, no traceback on
stderr, and a refusal (exit 1 or 2) must be exactly one line ``colitools: error: ...``; a case whose class must
be refused (``EXPECT``) must not exit 0, and the valid MXFP8 fixture must be read by every reader (exit 0). The
cases run two at a time; the same seed always gives the same cases.

Size: about 330 cases by default (CI). ``COLITOOLS_BAD_INPUT_CASES=1000 ./dev test tests/colitools/test_bad_inputs.py
-q`` runs 1000 (the file cases scaled up; 10-20 minutes on 2 cores); ``COLITOOLS_BAD_INPUT_REPORT=FILE`` writes
the figures (tracebacks, hangs, wrong accepts, per class) as JSON.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import bad_input_classes as classes
import pytest
from cli_helpers import COMMAND, cli_env, run_cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "oracles" / "olmoe"
MXFP8 = ROOT / "oracles" / "qwen3_moe_mxfp8"  # a natively quantized source: F8_E4M3 + U8 E8M0 scales
FP8 = ROOT / "oracles" / "deepseek_v3_fp8"  # F8_E4M3 + F32 128x128 weight_scale_inv
SEED = 20_250_9
TIMEOUT = 240  # generous: a hang fails the case, no timing is asserted
POOL = 2
SHARD = "model-00002-of-00003.safetensors"  # an expert shard of the converted fixture (a mirrored one)
SIDECAR_INDEX = "experts-int4g64/index.json"
SIDECAR_LAYER = "experts-int4g64/layer-000.safetensors"
CASES_ENV = "COLITOOLS_BAD_INPUT_CASES"  # the number of cases (default: the table's own counts)
REPORT_ENV = "COLITOOLS_BAD_INPUT_REPORT"  # write the figures to this JSON file

# docs/CLI.md "Exit codes": 0 success, 1 error, 2 usage error / plan not admitted, 3 disk floor (convert), 4 found
# problems (verify, mirror verify, mirror stage's final verify)
EXIT_CODES = {0, 1, 2, 3, 4}
WARNING_LINES = ("colitools: warning: ", "warning: ")  # a report's warnings beside its one error line


# ------------------------------------------------------------------------------------------- mutations
def _json_bytes(value) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


BAD_VALUES = [
    "two", "", -1, 0, -(10**30), 10**30, 1e308, -1e308, 0.5, None, True, [], {}, [0, "x"], {"a": {"b": [None]}},
    "ü\u202e名\u0000", "\ud800", 2**63, -(2**63) - 1, [[[[[[[[[[1]]]]]]]]]], 100_000, 4_000_000_000,
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
    if kind == "surrogate":
        return classes.json_surrogate(data, rng)
    if kind == "path-escape":
        return classes.json_path_escape(data, rng)
    if kind == "huge-size":
        return classes.json_huge_size(data, rng)
    if kind == "huge-file-size":  # a manifest's recorded file sizes
        return classes.json_huge_size(data, rng, keys=("size",), where=lambda p: p[0] == "units" and p[2] == "files")
    if kind == "huge-geometry":  # a sidecar index's geometry, which its layer files must match
        return classes.json_huge_size(data, rng, keys=("experts", "hidden_size", "moe_intermediate_size",
                                                       "record_bytes"))  # fmt: skip
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
    if kind == "name-surrogate":
        return classes.st_name_surrogate(data, rng)
    if kind == "name-text":
        return classes.st_name_text(data, rng)
    if kind == "emoji-name":  # a valid surrogate pair escape: text, read like any other name
        n, header = classes._header(data)
        return classes._with_header(data, n, classes._rename_tensor(header, "lm_head.weight", "\ud83d\ude00.weight"))
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
    if kind == "huge-geometry":
        return classes.usage_huge_geometry(data, rng)
    if kind == "huge-header":  # the model gives its geometry: only a header can contradict it
        return classes.usage_huge_geometry(data, rng, headerless=0.0)
    raise AssertionError(kind)


USAGE_KINDS = ["line", "line", "line", "truncate", "binary", "huge", "missing"]


# ---------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One run: ``argv`` with ``{model}`` (converted), ``{src}`` (float fixture), ``{mirror}``, ``{fixture}``,
    ``{new}`` (a fresh output folder), ``{mx}`` (the MXFP8 fixture), ``{fp8}`` (the FP8 fixture), ``{planar}`` (a
    planar conversion), ``{part}`` (an interrupted conversion), ``{hist}`` (a folder holding only a usage file)
    placeholders; ``damage`` = (base, file in it, mutator, kind) or None. ``expect``: "refuse" (any exit but 0)
    or "accept" (exit 0), None when any documented outcome will do; ``says``: text stdout or stderr must hold."""

    id: str
    argv: tuple[str, ...]
    damage: tuple[str, str, str, str] | None = None
    expect: str | None = None
    says: str | None = None


BASES = ("src", "model", "mirror", "fixture", "mx", "fp8", "planar", "part", "hist")
RUN = ("run", "{model}", "--prompt-ids", "1,2", "--max-new-tokens", "1", "--no-usage")
CONVERT_DRY = ("convert", "{src}", "{new}", "--dry-run", "--min-free-gb", "0")
CONVERT = ("convert", "{src}", "{new}", "--min-free-gb", "0", "--no-progress")
CONVERT_F32 = (*CONVERT, "--experts", "f32", "--dense", "f32", "--embed", "f32")  # the float passthrough
RESUME = ("convert", "{src}", "{model}", "--min-free-gb", "0", "--no-progress")
INSPECT = ("inspect", "{model}", "--json")
SRC_INSPECT = ("inspect", "{src}", "--json")
SRC_RUN = ("run", "{src}", "--prompt-ids", "1,2", "--max-new-tokens", "1", "--no-usage")
VERIFY = ("verify", "container", "{model}")
USAGE = ("usage", "show", "{model}/.coli_usage", "--model", "{model}")
USAGE_ALONE = ("usage", "show", "{hist}/.coli_usage")  # the geometry from the file alone
PLAN = ("mirror", "plan", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--reserve-gib", "0")
STAGE = ("mirror", "stage", "--model", "{model}", "--mirror", "{mirror}", "--budget-gib", "1", "--reserve-gib", "0")
MVERIFY = ("mirror", "verify", "--mirror", "{mirror}", "--model", "{model}")
ORACLE = ("verify", "oracle", "{fixture}", "--recipe", "default")
FP8_CONVERT = ("convert", "{fp8}", "{new}", "--min-free-gb", "0", "--no-progress")
FP8_PASS = (*FP8_CONVERT, "--experts", "fp8", "--dense", "fp8")  # the FP8 passthrough
MX_INSPECT = ("inspect", "{mx}")
MX_VERIFY = ("verify", "container", "{mx}")
MX_RUN = ("run", "{mx}", "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--no-usage")
MX_CONVERT = ("convert", "{mx}", "{new}", "--min-free-gb", "0", "--no-progress")
MX_PLAN = ("mirror", "plan", "--model", "{mx}", "--mirror", "{new}", "--budget-gib", "1", "--reserve-gib", "0")
P_INSPECT = ("inspect", "{planar}")
P_VERIFY = ("verify", "container", "{planar}")
P_RUN = ("run", "{planar}", "--prompt-ids", "1,2", "--max-new-tokens", "1", "--no-usage")
P_PLAN = ("mirror", "plan", "--model", "{planar}", "--mirror", "{new}", "--budget-gib", "1", "--reserve-gib", "0")

SURROGATE, ESCAPE, HUGE = "surrogate", "path-escape", "huge-size"
NAME_SURROGATE, NAME_TEXT = "name-surrogate", "name-text"
ALL = "*"  # every command of the row


@dataclass(frozen=True)
class FileRow:
    """Cases damaging one file of one base, run with each of ``commands`` in turn; ``kinds`` defaults to the
    mutator's list; ``refuse`` maps a kind (or a prefix ending in ":") to the commands that must not
    accept it (``ALL``: every command of the row)."""

    base: str
    file: str
    mutator: str
    commands: tuple[tuple[str, ...], ...]
    count: int
    kinds: tuple[str, ...] = ()
    refuse: tuple[tuple[str, object], ...] = ()


ROLE_REFUSE = tuple((f"{what}:{role}", ALL) for what, roles in (("int", classes.INT_REFUSED),
                     ("nan", classes.NAN_REFUSED)) for role in roles)  # fmt: skip
FILE_PLAN = [
    FileRow("model", "config.json", "json", (INSPECT, VERIFY, USAGE, PLAN, RUN), 16,
            (*JSON_KINDS, SURROGATE, SURROGATE, HUGE), ((SURROGATE, ALL),)),
    FileRow("src", "config.json", "json", (CONVERT_DRY, CONVERT, SRC_RUN), 12,
            (*JSON_KINDS, SURROGATE, SURROGATE, HUGE), ((SURROGATE, ALL),)),
    FileRow("model", "model.safetensors.index.json", "json", (INSPECT, VERIFY, RUN), 12,
            (*JSON_KINDS, SURROGATE, ESCAPE, ESCAPE, HUGE), ((SURROGATE, ALL), (ESCAPE, ALL))),
    FileRow("model", "model.safetensors.index.json", "json", (PLAN, STAGE), 4),
    FileRow("model", SHARD, "safetensors", (INSPECT, VERIFY, MVERIFY, PLAN, RUN), 14,
            (*ST_KINDS, NAME_SURROGATE, NAME_SURROGATE, NAME_TEXT), ((NAME_SURROGATE, ALL),)),
    FileRow("src", "model.safetensors", "safetensors", (CONVERT_DRY, SRC_INSPECT), 9,
            (*ST_KINDS, NAME_SURROGATE, NAME_SURROGATE, NAME_TEXT), ((NAME_SURROGATE, ALL),)),
    FileRow("model", "colitools.json", "json", (VERIFY, VERIFY, RESUME), 14,
            (*JSON_KINDS, SURROGATE, ESCAPE, ESCAPE, "huge-file-size"),
            ((SURROGATE, ALL), (ESCAPE, ALL), ("huge-file-size", (VERIFY,)))),
    FileRow("model", ".coli_usage", "usage", (USAGE, PLAN, STAGE), 14, (*USAGE_KINDS, "huge-header"),
            (("huge-header", (USAGE,)),)),
    FileRow("hist", ".coli_usage", "usage", (USAGE_ALONE,), 8, (*USAGE_KINDS, "huge-geometry", "huge-geometry"),
            (("huge-geometry", ALL),)),
    FileRow("mirror", ".colibri-mirror.json", "json", (MVERIFY,), 10, (*JSON_KINDS, SURROGATE, ESCAPE, ESCAPE),
            ((SURROGATE, ALL), (ESCAPE, ALL))),
    FileRow("fixture", "reference/default.json", "json", (ORACLE,), 3, (*JSON_KINDS, SURROGATE)),
    FileRow("src", "model.safetensors", "roles", (CONVERT, CONVERT_F32), 24, refuse=ROLE_REFUSE),
    FileRow("fp8", "model.safetensors", "roles", (FP8_CONVERT, FP8_PASS), 30, refuse=ROLE_REFUSE),
    FileRow("mx", "model.safetensors", "roles", (MX_CONVERT,), 12, refuse=ROLE_REFUSE),
    FileRow("mx", "model.safetensors", "safetensors", (MX_INSPECT, MX_VERIFY, MX_RUN, MX_CONVERT), 10,
            (*ST_KINDS, NAME_SURROGATE, NAME_TEXT), ((NAME_SURROGATE, ALL),)),
    FileRow("planar", SIDECAR_INDEX, "json", (P_INSPECT, P_VERIFY, P_RUN), 12,
            (*JSON_KINDS, SURROGATE, ESCAPE, "huge-geometry"),
            ((SURROGATE, ALL), (ESCAPE, (P_VERIFY, P_RUN)), ("huge-geometry", (P_VERIFY,)))),
    FileRow("planar", SIDECAR_LAYER, "safetensors", (P_INSPECT, P_VERIFY, P_RUN, P_PLAN), 10,
            (*ST_KINDS, NAME_SURROGATE), ((NAME_SURROGATE, ALL),)),
    FileRow("planar", "colitools.json", "json", (P_VERIFY,), 4, (ESCAPE, SURROGATE), ((ESCAPE, ALL), (SURROGATE, ALL))),
]  # fmt: skip

# cases run as they are: the valid MXFP8 fixture through every reader, an interrupted conversion, a valid pair
FIXED_CASES = [
    Case("mxfp8:inspect", MX_INSPECT, expect="accept"),
    Case("mxfp8:inspect-json", ("inspect", "{mx}", "--json"), expect="accept"),
    Case("mxfp8:verify", MX_VERIFY, expect="accept", says="OK"),
    Case("mxfp8:run", MX_RUN, expect="accept"),
    Case("mxfp8:convert", MX_CONVERT, expect="accept"),
    Case("mxfp8:convert-native", (*MX_CONVERT, "--experts", "native"), expect="accept"),
    Case("mxfp8:convert-f32", (*MX_CONVERT, "--experts", "f32", "--dense", "f32", "--embed", "f32"), expect="accept"),
    Case("mxfp8:usage", ("usage", "show", "{mx}/.coli_usage"), expect="accept"),
    Case("mxfp8:plan", MX_PLAN, expect="accept"),
    Case("interrupted:run", ("run", "{part}", "--prompt-ids", "1", "--max-new-tokens", "1", "--no-usage"),
         expect="refuse", says="the conversion is not complete"),
    Case("interrupted:inspect", ("inspect", "{part}"), expect="accept", says="the conversion is not complete"),
    Case("interrupted:verify", ("verify", "container", "{part}"), expect="refuse"),
    Case("emoji-name:inspect", ("inspect", "{src}"), ("src", "model.safetensors", "safetensors", "emoji-name"),
         expect="accept"),
]  # fmt: skip

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


def _row_counts(target: int | None) -> list[int]:
    """Each file row's number of cases: the table's, or scaled so that all cases number ``target``."""
    counts = [row.count for row in FILE_PLAN]
    if target is None:
        return counts
    room = target - len(FIXED_CASES) - len(OPTION_CASES)
    assert room >= len(counts), f"{CASES_ENV}={target} is too few (at least {len(FIXED_CASES) + len(OPTION_CASES) + len(counts)})"
    exact = [c * room / sum(counts) for c in counts]
    scaled = [max(1, int(x)) for x in exact]
    by_remainder = sorted(range(len(counts)), key=lambda i: scaled[i] - exact[i])
    for i in by_remainder[: room - sum(scaled)]:  # largest remainders first (never more than one each)
        scaled[i] += 1
    return scaled


ROLE_FILES = {"src": FIXTURE / "model.safetensors", "fp8": FP8 / "model.safetensors", "mx": MXFP8 / "model.safetensors"}
DEFAULT_KINDS = {"json": JSON_KINDS, "safetensors": ST_KINDS, "usage": USAGE_KINDS}


def _kinds(row: FileRow) -> list[str]:
    if row.mutator == "roles":
        return classes.role_kinds(ROLE_FILES[row.base].read_bytes())
    return list(row.kinds or DEFAULT_KINDS[row.mutator])


def _expect(row: FileRow, kind: str, argv: tuple[str, ...]) -> str | None:
    for key, commands in row.refuse:
        if (kind == key or (key.endswith(":") and kind.startswith(key))) and (commands == ALL or argv in commands):
            return "refuse"
    return None


def _command_name(argv: tuple[str, ...]) -> str:
    words = [a for a in argv[:2] if not a.startswith("{")]
    flags = [a for a in argv if a in ("--experts", "--dry-run", "--json")]
    return "-".join(words + [f.strip("-") for f in flags])


def build_cases(target: int | None = None) -> list[Case]:
    """The seeded cases: every file row's (kind, command) pairs in a seeded order, as many as the row's count,
    then the fixed cases and the option cases."""
    rng = random.Random(SEED)
    cases = []
    for number, (row, count) in enumerate(zip(FILE_PLAN, _row_counts(target), strict=True)):
        pairs = [(kind, argv) for kind in dict.fromkeys(_kinds(row)) for argv in row.commands]
        rng.shuffle(pairs)
        pairs.sort(key=lambda pair: _expect(row, *pair) is None)  # the classes that must be refused come first
        for i in range(count):
            kind, argv = pairs[i % len(pairs)]
            name = f"{number}:{row.base}/{row.file}:{kind}:{_command_name(argv)}:{i}"
            cases.append(Case(name, argv, (row.base, row.file, row.mutator, kind), _expect(row, kind, argv)))
    cases += FIXED_CASES
    for i, argv in enumerate(OPTION_CASES):
        cases.append(Case(f"option:{i}:{' '.join(argv[:2])}", argv))
    return cases


TARGET = int(os.environ[CASES_ENV]) if os.environ.get(CASES_ENV) else None
CASES = build_cases(TARGET)
MUTATORS = {"json": mutate_json, "safetensors": mutate_safetensors, "usage": mutate_usage, "roles": classes.st_role}


# ------------------------------------------------------------------------------------------ running them
def colitools(argv, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*argv, env={"HF_HUB_OFFLINE": "1", **(env or {})}, timeout=TIMEOUT, cwd=cwd)


def _interrupted_conversion(src: Path, out: Path) -> None:
    """A conversion stopped by Ctrl-C after its first unit: colitools.json says "converting", no config.json."""
    env = cli_env({"COLITOOLS_TEST_SLOW_UNIT_SECONDS": "5"})
    args = ["convert", str(src), str(out), "--min-free-gb", "0", "--no-progress"]
    proc = subprocess.Popen([*COMMAND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "colitools.json").is_file() or not json.loads((out / "colitools.json").read_text()).get("units"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.communicate(timeout=60) and proc.returncode == 130
    assert not (out / "config.json").exists()


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Path:
    """The valid inputs: src (the float fixture), model (converted, with a usage file), mirror (staged), mx (the
    MXFP8 fixture with a usage file), fp8, planar (converted --layout planar), part (an interrupted conversion),
    hist (a folder with the model's usage file only)."""
    root = tmp_path_factory.mktemp("bad_inputs_bases")
    for name, fixture in (("src", FIXTURE), ("fixture", FIXTURE), ("mx", MXFP8), ("fp8", FP8)):
        shutil.copytree(fixture, root / name)
    steps = [
        ("convert", root / "src", root / "model", "--min-free-gb", "0", "--no-progress"),
        ("run", root / "model", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"),  # writes model/.coli_usage
        ("mirror", "stage", "--model", root / "model", "--mirror", root / "mirror", "--budget-gib", "1",
         "--reserve-gib", "0"),
        ("run", root / "mx", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"),
        ("convert", root / "src", root / "planar", "--layout", "planar", "--min-free-gb", "0", "--no-progress"),
    ]  # fmt: skip
    for argv in steps:
        result = colitools(argv)
        assert result.returncode == 0, (argv, result.stderr)
    assert (root / "model" / ".coli_usage").stat().st_size > 0 and (root / "mirror" / ".colibri-mirror.json").exists()
    (root / "hist").mkdir()
    shutil.copy(root / "model" / ".coli_usage", root / "hist" / ".coli_usage")
    _interrupted_conversion(root / "src", root / "part")
    return root


def _prepare(case_index: int, case: Case, bases: Path, work: Path) -> list[str]:
    """Copy the inputs of one case, damage the file it names, and return its argv."""
    here = work / f"case{case_index:04d}"
    here.mkdir()
    used = {b for b in BASES if any("{" + b + "}" in a for a in case.argv)}
    if case.damage is not None:
        used.add(case.damage[0])
    if "mirror" in used:  # the receipt and the mirrored copies belong to this model
        used.add("model")
    for b in used:
        shutil.copytree(bases / b, here / b, symlinks=True)
    shutil.copy(bases / "model" / SHARD, here / "outside.safetensors")  # what a name leaving the folder reaches
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
    names = {b: here / b for b in BASES} | {"new": here / "new"}
    return [a.format(**{k: str(v) for k, v in names.items()}) for a in case.argv]


@pytest.fixture(scope="module")
def results(bases, tmp_path_factory) -> dict[str, subprocess.CompletedProcess[str] | str]:
    work = tmp_path_factory.mktemp("bad_inputs_cases")

    def one(item):
        i, case = item
        argv = _prepare(i, case, bases, work)
        try:
            return colitools(argv, cwd=work)
        except subprocess.TimeoutExpired:
            return f"no answer within {TIMEOUT} s (a hang): {argv}"
        finally:
            shutil.rmtree(work / f"case{i:04d}", ignore_errors=True)  # 1000 cases of copies add up

    with ThreadPoolExecutor(POOL) as pool:
        done = list(pool.map(one, enumerate(CASES)))
    found = {case.id: result for case, result in zip(CASES, done, strict=True)}
    if os.environ.get(REPORT_ENV):
        Path(os.environ[REPORT_ENV]).write_text(json.dumps(figures(found), indent=1) + "\n")
    return found


def verdict(case: Case, result: subprocess.CompletedProcess[str] | str) -> str | None:
    """What is wrong with one case's outcome (None: nothing): a hang, a traceback, an undocumented exit code, a
    refusal that is not one line, a wrong accept or a wrong refusal."""
    if isinstance(result, str):
        return "hang"
    if "Traceback" in result.stderr:
        return "traceback"
    if result.returncode not in EXIT_CODES or (result.returncode == 3 and case.argv[0] != "convert"):
        return "exit code"
    if case.expect == "refuse" and result.returncode == 0:
        return "wrong accept"
    if case.expect == "accept" and result.returncode != 0:
        return "wrong refusal"
    if case.says and case.says not in result.stdout + result.stderr:
        return "message"
    not_admitted = case.argv[:2] in (("mirror", "plan"), ("mirror", "stage")) and "admitted: no" in result.stdout
    if result.returncode in (1, 2) and not (result.returncode == 2 and not_admitted):
        lines = [line for line in result.stderr.splitlines() if not line.startswith(WARNING_LINES)]
        if len(lines) != 1 or not lines[0].startswith("colitools: error: "):
            return "not one line"
    elif result.returncode not in (1, 2) and "colitools: error:" in result.stderr:
        return "error line without an error exit"
    return None


def figures(found: dict[str, subprocess.CompletedProcess[str] | str]) -> dict:
    """The harness's figures: cases, and per verdict the count and the classes (damage kind) of the cases."""
    out: dict = {"cases": len(found), "verdicts": {}}
    for case in CASES:
        bad = verdict(case, found[case.id])
        if bad is not None:
            entry = out["verdicts"].setdefault(bad, {"count": 0, "classes": {}, "cases": []})
            entry["count"] += 1
            kind = case.damage[3] if case.damage else case.id.split(":")[0]
            entry["classes"][kind] = entry["classes"].get(kind, 0) + 1
            entry["cases"].append(case.id)
    return out


def test_the_harness_is_seeded_and_large_enough():
    assert [c.id for c in build_cases(TARGET)] == [c.id for c in CASES]
    assert len({c.id for c in CASES}) == len(CASES)
    if TARGET is None:
        assert 250 <= len(CASES) <= 400
    else:
        assert len(CASES) == TARGET
    commands = {" ".join(a for a in c.argv[:2] if not a.startswith("{")) for c in CASES}
    for command in ("convert", "inspect", "verify container", "verify oracle", "run", "mirror plan",
                    "mirror stage", "mirror verify", "usage show", "formats"):  # fmt: skip
        assert any(c == command or c.startswith(command + " ") or c.split()[0] == command for c in commands), command
    kinds = {c.damage[3] for c in CASES if c.damage}
    for kind in (SURROGATE, NAME_SURROGATE, ESCAPE, "huge-geometry", "huge-file-size", "nan:expert", "int:expert",
                 "nan:norm", "int:router", "nan:expert-scale"):  # fmt: skip
        assert kind in kinds, kind
    assert sum(c.expect == "refuse" for c in CASES) >= 60 and sum(c.expect == "accept" for c in CASES) >= 10


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_line_with_a_documented_exit_code(results, case):
    result = results[case.id]
    assert not isinstance(result, str), result
    where = f"{case.argv} {case.damage}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-4000:]}"
    assert verdict(case, result) is None, f"{verdict(case, result)}: {where}"
