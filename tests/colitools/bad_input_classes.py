"""The input classes issue 24 added to the bad-input harness (``test_bad_inputs.py``), as mutators of file bytes.

* ``surrogate``: a lone surrogate escape (``"\\udfff"``, JSON text Python's json accepts and nothing can encode)
  in a key or a string value of a JSON file, or in a tensor name / ``__metadata__`` key or value of a
  safetensors header (``name-surrogate``); ``name-text``: other odd but valid text in a tensor name.
* ``path-escape``: a file name a JSON file records (manifest, index weight_map, receipt, sidecar index) made
  absolute or leaving the folder; the case folder holds a real ``outside.safetensors`` for a reader that follows.
* ``huge-size``: a declared size or geometry (``size``, ``total_size``, ``experts``, ``hidden_size``,
  ``num_hidden_layers``...) made huge; ``huge-geometry`` (usage): a header or headerless record declaring
  ``-1 1 4000000000`` and the like.
* ``int:<role>`` / ``nan:<role>``: one tensor of a role (routed expert, attention, embed, head, router, norm,
  FP8 scale...) stored as an integer dtype of the same item size, or holding a NaN.

Each mutator takes the file's bytes and a seeded ``random.Random`` and returns the damaged bytes. The expected
outcome of a (class, command) pair is the harness's (``test_bad_inputs.EXPECT``).
"""

from __future__ import annotations

import json
import random
import re
import struct

SURROGATE = "\udfff"
ESCAPES = [
    "../outside.safetensors", "/etc/hostname", "a/../../outside.safetensors", "experts-int4g64/../../outside.safetensors",
    "./../outside.safetensors", "C:\\outside.safetensors", "..\\outside.safetensors", "..", "/",
]  # fmt: skip
SIZE_KEYS = ("size", "total_size", "record_bytes", "experts", "layers", "hidden_size", "moe_intermediate_size",
             "num_hidden_layers", "num_experts", "vocab_size", "intermediate_size", "in_bytes", "out_bytes",
             "num_attention_heads", "head_dim", "num_experts_per_tok")  # fmt: skip
HUGE_INTS = [4_000_000_000, 100_000, 10**18, 2**63, 2**64 + 1, 1_048_577]
GEOMETRY_HEADERS = ["-1 100000 100000", "-1 1 4000000000", "-1 4000000000 1", "-1 1048577 1", "-1 1024 1025"]
HEADERLESS_RECORDS = ["0 4000000000 1", "4000000000 0 1", "100000 100000 1"]


# ------------------------------------------------------------------------------------------- JSON trees
def _walk(value, prefix=()):
    """``(path, value)`` for every node of parsed JSON (dict keys and list indices)."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            yield from _walk(v, (*prefix, i))


def _set(value, path, new):
    if not path:
        return new
    head, *rest = path
    if isinstance(value, dict):
        return {**value, head: _set(value[head], rest, new)}
    return [_set(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _rename(value, path, key):
    """The dict at ``path[:-1]`` with its key ``path[-1]`` renamed to ``key`` (order kept)."""
    *parent, old = path
    node = value
    for p in parent:
        node = node[p]
    renamed = {key if k == old else k: v for k, v in node.items()}
    return _set(value, tuple(parent), renamed)


def _escaped(value) -> bytes:
    return json.dumps(value).encode("ascii")  # ensure_ascii: a lone surrogate stays the escape "\udfff"


def json_surrogate(data: bytes, rng: random.Random) -> bytes:
    value = json.loads(data)
    nodes = list(_walk(value))
    strings = [p for p, v in nodes if p and isinstance(v, str)]
    keys = [p for p, _ in nodes if p and isinstance(p[-1], str)]
    if not strings and not keys:
        return _escaped({SURROGATE: value})
    if strings and (not keys or rng.random() < 0.5):
        path = rng.choice(strings)
        text = dict(nodes)[path]
        i = rng.randrange(len(text) + 1)
        return _escaped(_set(value, path, text[:i] + SURROGATE + text[i:]))
    path = rng.choice(keys)
    return _escaped(_rename(value, path, path[-1] + SURROGATE))


def json_path_escape(data: bytes, rng: random.Random) -> bytes:
    """A recorded file name (a string value or a weight_map value ending in .safetensors / .json) escaped."""
    value = json.loads(data)
    names = [p for p, v in _walk(value) if p and isinstance(v, str) and v.endswith((".safetensors", ".json"))]
    if not names:
        return _escaped({**value, "files": [rng.choice(ESCAPES)]} if isinstance(value, dict) else value)
    return _escaped(_set(value, rng.choice(names), rng.choice(ESCAPES)))


def json_huge_size(data: bytes, rng: random.Random, keys: tuple[str, ...] = SIZE_KEYS, where=None) -> bytes:
    """An integer under one of ``keys`` (at a path ``where(path)`` accepts, when given) made huge."""
    value = json.loads(data)
    ints = [p for p, v in _walk(value) if p and type(v) is int and (where is None or where(p))]
    sized = [p for p in ints if isinstance(p[-1], str) and p[-1] in keys]
    if not sized:
        return _escaped({**value, keys[0]: rng.choice(HUGE_INTS)} if isinstance(value, dict) else value)
    return _escaped(_set(value, rng.choice(sized), rng.choice(HUGE_INTS)))


# -------------------------------------------------------------------------------------------- safetensors
def _header(data: bytes) -> tuple[int, dict]:
    (n,) = struct.unpack("<Q", data[:8])
    return n, json.loads(data[8 : 8 + n])


def _with_header(data: bytes, n: int, header: dict) -> bytes:
    text = json.dumps(header).encode("ascii")  # data offsets are relative: the data bytes stay as they are
    return struct.pack("<Q", len(text)) + text + data[8 + n :]


def _rename_tensor(header: dict, old: str, new: str) -> dict:
    return {new if k == old else k: v for k, v in header.items()}


def st_name_surrogate(data: bytes, rng: random.Random) -> bytes:
    n, header = _header(data)
    meta = header.get("__metadata__") or {}
    names = [k for k in header if k != "__metadata__"]
    pick = rng.choice(["tensor"] * 3 + (["meta-key", "meta-value"] if meta else []))
    if pick == "tensor":
        old = rng.choice(names)
        i = rng.randrange(len(old) + 1)
        return _with_header(data, n, _rename_tensor(header, old, old[:i] + SURROGATE + old[i:]))
    key = rng.choice(list(meta))
    if pick == "meta-key":
        meta = {key + SURROGATE if k == key else k: v for k, v in meta.items()}
    else:
        meta = {**meta, key: meta[key] + SURROGATE}
    return _with_header(data, n, {**header, "__metadata__": meta})


ODD_NAMES = ["{name}\u0000", "{name}\n", "\u202e{name}", "{name}\ufeff", "", " ", "{name}" + "é" * 20_000, "\ud83d\ude00{name}",
             "{name}/../x", "__metadata__ ", "{name}\r\nSet-Cookie: x"]  # fmt: skip


def st_name_text(data: bytes, rng: random.Random) -> bytes:
    n, header = _header(data)
    old = rng.choice([k for k in header if k != "__metadata__"])
    return _with_header(data, n, _rename_tensor(header, old, rng.choice(ODD_NAMES).format(name=old)))


# ------------------------------------------------------------------------------ roles: integers and NaN
# role -> tensor names of the role in the bundled fixtures (OLMoE float, DeepSeek-V3 FP8, Qwen3-MoE MXFP8)
ROLES = {
    "expert": r"\.experts\.\d+\.(gate|up|down)_proj\.weight$",
    "expert-scale": r"\.experts\.\d+\.(gate|up|down)_proj\.weight_scale(_inv)?$",
    "attention": r"self_attn\.(q|k|v|o|q_a|q_b|kv_a|kv_b)_proj(_with_mqa)?\.weight$",
    "shared": r"shared_experts\.(gate|up|down)_proj\.weight$",
    "embed": r"embed_tokens\.weight$",
    "head": r"lm_head\.weight$",
    "router": r"mlp\.gate\.weight$",
    "norm": r"norm\.weight$",
}
# docs/FORMATS.md §5: an integer dtype is refused in a linear weight (rule 0 copies the other non-float tensors), a
# non-finite value in every float tensor written, rule 2's F32 routers and norms too (issue 43)
INT_REFUSED = ("expert", "attention", "shared", "embed", "head")
NAN_REFUSED = ("expert", "expert-scale", "attention", "shared", "embed", "head", "router", "norm")
SAME_SIZE_INT = {"F32": ["I32", "U32"], "BF16": ["I16", "U16"], "F16": ["I16", "U16"], "F8_E4M3": ["I8"]}
NAN_BYTES = {
    "F32": struct.pack("<f", float("nan")),
    "BF16": b"\xc0\x7f",
    "F16": b"\x00\x7e",
    "F8_E4M3": b"\x7f",
}
ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "U8": 1}


def role_kinds(data: bytes) -> list[str]:
    """``int:<role>`` and ``nan:<role>`` for every role this file has a float tensor of."""
    _, header = _header(data)
    kinds = []
    for role, pattern in ROLES.items():
        found = [v["dtype"] for k, v in header.items() if k != "__metadata__" and re.search(pattern, k)]
        if any(d in SAME_SIZE_INT for d in found):
            kinds.append(f"int:{role}")
        if any(d in NAN_BYTES for d in found):
            kinds.append(f"nan:{role}")
    return kinds


def st_role(data: bytes, rng: random.Random, kind: str) -> bytes:
    what, role = kind.split(":")
    n, header = _header(data)
    table = SAME_SIZE_INT if what == "int" else NAN_BYTES
    names = [
        k
        for k, v in header.items()
        if k != "__metadata__" and re.search(ROLES[role], k) and v["dtype"] in table
    ]
    name = rng.choice(names)
    entry = header[name]
    if what == "int":  # the same bytes and shape, read as integers
        header = {**header, name: {**entry, "dtype": rng.choice(SAME_SIZE_INT[entry["dtype"]])}}
        return _with_header(data, n, header)
    size = ITEMSIZE[entry["dtype"]]
    begin, end = entry["data_offsets"]
    at = 8 + n + begin + size * rng.randrange((end - begin) // size)
    return data[:at] + NAN_BYTES[entry["dtype"]] + data[at + size :]


# ------------------------------------------------------------------------------------------------- usage
def usage_huge_geometry(data: bytes, rng: random.Random, headerless: float = 0.3) -> bytes:
    """A geometry header declaring too many experts or, with probability ``headerless``, a legacy file without
    headers whose records imply them (only a reader without the model's geometry takes it)."""
    lines = [line for line in data.decode().splitlines() if not line.startswith("-1 ")]
    if rng.random() < headerless:
        body = [line for line in lines if not line.startswith("-")]
        return ("\n".join([*body, rng.choice(HEADERLESS_RECORDS)]) + "\n").encode()
    return ("\n".join([rng.choice(GEOMETRY_HEADERS), *lines]) + "\n").encode()
