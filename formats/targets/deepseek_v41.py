"""The ``deepseek_v41`` target (docs/FORMATS.md §4 "Targets")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from colitools.formats.expert_layouts import ExpertRecord
from colitools.formats.targets.base import (
    DEEPSEEK_V41,
    PAIRS_ONLY,
    V4_FP4_EXPERTS,
    V41_ENGRAM_FILE,
    V41_FLOAT_DTYPES,
    V41_LIMITS,
    Target,
)


def _v41_int(mcfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    """The first of ``keys`` c/deepseek_v41.c ``cfg_load`` reads (its short name, then the released one)."""
    for key in keys:
        value = mcfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return default


def deepseek_v41_check(mcfg: dict[str, Any]) -> str | None:
    """Why c/deepseek_v41.c (``cfg_load``, ``model_load``, its fixed scratch) cannot run a text config, or None:
    ``n_layers`` outside 1..64, fewer ``compress_ratios`` than layers (it exits), ``n_activated_experts`` past 64,
    ``head_dim`` / ``index_head_dim`` past 512, FP4 experts whose ``dim`` / ``moe_inter_dim`` is not a multiple of
    32 (``expert_read`` sizes their scales ``dim / 32``), more than 4 engram tables, 8 n-gram orders or 16 heads,
    an engram ``head_dim`` not a multiple of 32 or past 512, more than 8 DSpark target layers."""
    lim = V41_LIMITS
    n = _v41_int(mcfg, "n_layers", "num_hidden_layers")
    ratios = mcfg.get("compress_ratios")
    checks = (
        (not 1 <= n <= lim["layers"], f"n_layers {n} is outside 1..{lim['layers']} (V41_MAX_LAYERS)"),
        (not isinstance(ratios, list) or len(ratios) < n,
         f"compress_ratios has {len(ratios) if isinstance(ratios, list) else 0} entries for {n} layers"),
        (_v41_int(mcfg, "n_activated_experts", "num_experts_per_tok") > lim["topk"],
         f"n_activated_experts is past moe_run_at's {lim['topk']}"),
        (max(_v41_int(mcfg, "head_dim"), _v41_int(mcfg, "index_head_dim")) > lim["dim512"],
         f"head_dim / index_head_dim past the engine's {lim['dim512']}-float scratch"),
        (any(_v41_int(mcfg, *k) % 32 for k in (("dim", "hidden_size"), ("moe_inter_dim", "moe_intermediate_size"))),
         "dim and moe_inter_dim must be multiples of 32 (FP4 experts: one E8M0 byte per 32 inputs)"),
        (len(mcfg.get("dspark_target_layer_ids") or ()) > 8, "more than 8 dspark_target_layer_ids"),
    )  # fmt: skip
    why = next((reason for bad, reason in checks if bad), None)
    return why or _v41_engram_check(mcfg)


def _v41_engram_check(mcfg: dict[str, Any]) -> str | None:
    """The engram limits of ``engram_load_sidecar`` / ``engram_row`` (None without engram layers)."""
    lim, tables = V41_LIMITS, mcfg.get("engram_layer_ids") or []
    if not tables:
        return None
    hd = _v41_int(mcfg, "engram_head_dim")
    checks = (
        (len(tables) > lim["tables"], f"{len(tables)} engram tables (V41_MAX_ENGRAM is {lim['tables']})"),
        (_v41_int(mcfg, "engram_max_ngram_size") > lim["ngram"], f"engram_max_ngram_size past {lim['ngram']}"),
        (_v41_int(mcfg, "engram_n_heads") > lim["engram_heads"], f"engram_n_heads past {lim['engram_heads']}"),
        (hd % 32 or not 0 < hd <= lim["dim512"], f"engram_head_dim {hd} is not a multiple of 32 up to 512"),
    )
    return next((reason for bad, reason in checks if bad), None)


def deepseek_v41_side_files(mcfg: dict[str, Any], read: Callable[[str], Any]) -> str | None:
    """c/deepseek_v41.c ``engram_load_sidecar``: without ``dsv41_engram.json`` the engine runs with engram OFF,
    silently ("a text-only container without engram is legal"), and its tables (bucket primes, hash
    multipliers as decimal strings, the tokenizer's compressed-token map) cannot be derived from the weights:
    a config with ``engram_layer_ids`` needs the file in the source, agreeing with the config."""
    tables = mcfg.get("engram_layer_ids") or []
    if not tables:
        return None
    side = read(V41_ENGRAM_FILE)
    if side is None:
        return (
            f"engram layers {tables} need {V41_ENGRAM_FILE} beside config.json (colibri's "
            f"c/tools/prepare_dsv41.py writes it); without it c/deepseek_v41.c runs with engram off"
        )
    if not isinstance(side, dict):
        return f"{V41_ENGRAM_FILE} is not a JSON object"
    want = {"layer_ids": list(tables), "max_ngram_size": mcfg.get("engram_max_ngram_size"),
            "n_heads": mcfg.get("engram_n_heads"), "head_dim": mcfg.get("engram_head_dim")}  # fmt: skip
    for key, value in want.items():
        if side.get(key) != value:
            return f"{V41_ENGRAM_FILE} has {key} {side.get(key)!r}, config.json {value!r}"
    missing = [k for k in ("primes", "offsets", "multipliers", "token_map") if k not in side]
    if missing:
        return f"{V41_ENGRAM_FILE} lacks {', '.join(missing)}"
    if any(not isinstance(m, str) for row in side["multipliers"] for m in row):
        return f"{V41_ENGRAM_FILE} stores multipliers as JSON numbers; c/deepseek_v41.c needs decimal strings"
    return None


TARGET = Target(
    DEEPSEEK_V41,
    "c/deepseek_v41.c (cfg_load; model_load's w8_load / wb_load / wf_load, expert_read, "
    "engram_load_sidecar / engram_table_open, spec_load, vision_load)",
    help="the released checkpoint's names and bytes: dense FP8 kept byte for byte (fp8-e8m0-t32: 32x32 "
    "UE8M0 tiles; the engram tables fp8-e8m0-r32: one UE8M0 byte per 32 inputs of a row), FP4 experts kept "
    "as mxfp4 bytes (I8 .weight + F8_E8M0 .scale), BF16 router / compressor / indexer keys / heads, F32 the "
    "rest, dsv41_engram.json copied; model_type deepseek_v41 only.",
    model_types=("deepseek_v41",),
    reads=(
        ("experts", ("native", "mxfp4")),
        ("dense", ("native",)),
        ("mtp", ("native",)),
        ("embed", ("bf16",)),
        *PAIRS_ONLY,
    ),
    why=(
        ("dense", "c/deepseek_v41.c w8_load reads the source's FP8 tiles as they are (`dense=native`)"),
        ("mtp", "c/deepseek_v41.c spec_load reads the DSpark stages' FP8 as they are (`mtp=native`)"),
    ),
    defaults=(("experts", "native"), ("dense", "native"), ("embed", "bf16"), ("mtp", "native")),
    experts=ExpertRecord(formats=("mxfp4",), spelling=V4_FP4_EXPERTS, spell_mtp=True),  # expert_read
    # one expert format (the release's FP4 bytes, ``reads``); c/deepseek_v41.c itself was not read for this (its
    # source is not in the 4ef9a99 tree): nothing for a budget to choose
    expert_granularity="uniform",
    float_dtypes=tuple(V41_FLOAT_DTYPES.items()),
    engine_formats=("fp8-e4m3-e8m0-t32", "fp8-e4m3-e8m0-r32", "mxfp4"),
    config_check=deepseek_v41_check,
    side_check=deepseek_v41_side_files,
)
