"""What a converted container holds: docs/FORMATS.md §5 recipes applied with colitools' own codecs, and the FP8
block-scaled source convention of §5. Numpy only (no torch).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from colitools.formats import names, targets
from colitools.formats import registry as reg

FP8_BLOCK = 128
FP8_MAX = 448.0

# Recipes of docs/FORMATS.md §5 as colitools options. "planar" holds the same values as "default" (only the byte
# order of int4 expert codes differs), so its reference is default's.
RECIPES: dict[str, dict[str, str]] = {
    "f32": {"experts": "f32", "dense": "f32", "embed": "f32", "layout": "pairs"},
    "default": {"experts": "int4-g64", "dense": "int8-row", "embed": "int8-row", "layout": "pairs"},
    "int3": {"experts": "int3-g64", "dense": "int8-row", "embed": "int8-row", "layout": "pairs"},
    "mxfp4": {"experts": "mxfp4", "dense": "int8-row", "embed": "int8-row", "layout": "pairs"},
    "planar": {"experts": "int4-g64", "dense": "int8-row", "embed": "int8-row", "layout": "planar"},
}
RECIPE_OPTIONS = {
    "f32": "--experts f32 --dense f32 --embed f32",
    "default": "",
    "int3": "--experts int3-g64",
    "mxfp4": "--experts mxfp4",
    "planar": "--layout planar",
}
REFERENCE_OF = {"f32": "f32", "default": "default", "int3": "int3", "mxfp4": "mxfp4", "planar": "default"}
COMPUTED_RECIPES = ("f32", "default", "int3", "mxfp4")
BASE_RECIPES = tuple(RECIPES)  # every fixture's; a natively quantized one adds NATIVE (Fixture.extra_recipes)
# ``native`` (docs/FORMATS.md §6): experts keep the source's own quantization where a format holds it exactly
# (MXFP4 -> mxfp4, the source's values); everything not natively quantized gets the option's default.
NATIVE = "native"
RECIPES[NATIVE] = {"experts": NATIVE, "dense": "int8-row", "embed": "int8-row", "layout": "pairs"}
RECIPE_OPTIONS[NATIVE] = "--experts native"
REFERENCE_OF[NATIVE] = NATIVE
# what ``native`` writes for a tensor that is not natively quantized (converters/recipe.py ``DEFAULT_OPTIONS``; the
# other roles too: ``--target deepseek_v41`` gives ``--dense`` / ``--mtp`` ``native``)
NATIVE_DEFAULT = {"experts": "int4-g64", "dense": "int8-row", "embed": "int8-row", "mtp": "int8-row"}
# ``--target NAME`` (formats/targets/): recipe ``target-NAME`` for every fixture whose ``model_type`` is one of
# the target's ``model_types`` (``target_recipes``): the target's default formats (``Target.defaults``), its
# layout, and in ``apply_recipe`` the target's own facts: the loader's float dtype per tensor (``float_dtype``, by
# the written name), the towers and MTP modules it drops (no format recorded: the converter leaves them out).
TARGET_PREFIX = "target-"
TARGET_OPTIONS = ("experts", "dense", "embed", "mtp")


def target_recipe(name: str) -> str:
    return TARGET_PREFIX + name


for _t in targets.TARGETS.values():
    if _t.model_types is None:  # generic: the plain recipes above
        continue
    _r = target_recipe(_t.name)
    RECIPES[_r] = {**{o: _t.default(o) for o in TARGET_OPTIONS}, "layout": _t.default("layout") or "pairs",
                   "target": _t.name}  # fmt: skip
    RECIPE_OPTIONS[_r] = f"--target {_t.name}"
    REFERENCE_OF[_r] = _r


def target_recipes(model_type: str) -> tuple[str, ...]:
    """The ``target-NAME`` recipes of a fixture of ``model_type`` (formats/targets/ order)."""
    return tuple(
        target_recipe(t.name) for t in targets.TARGETS.values() if model_type in (t.model_types or ())
    )

def layer_of(name: str) -> int | None:
    m = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------------------ storage variants
def is_fp8_target(name: str, shape: tuple[int, ...]) -> bool:
    """DeepSeek-V3's FP8 set: 2-D linear weights except embeddings, lm_head and routers."""
    if len(shape) != 2 or not name.endswith(".weight"):
        return False
    return not (
        name.endswith("embed_tokens.weight")
        or name.endswith("lm_head.weight")
        or name.endswith("mlp.gate.weight")
        or name.endswith("block_sparse_moe.gate.weight")
        or name.endswith("shared_expert_gate.weight")
    )


def fp8_block_quantize(w: np.ndarray, scale_dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """w f32 [M, N] -> (e4m3fn values [M, N], scale_inv [ceil(M/128), ceil(N/128)] in ``scale_dtype``), amax/448
    per block. A BF16 scale (Qwen3.8 as published) is rounded (to nearest even) before it divides, so the codes are
    the nearest e4m3 of ``w`` over the scale stored; ``|w / s|`` may then pass 448 by at most 2^-8 (saturated)."""
    M, N = w.shape
    gm, gn = -(-M // FP8_BLOCK), -(-N // FP8_BLOCK)
    padded = np.zeros((gm * FP8_BLOCK, gn * FP8_BLOCK), dtype=np.float32)
    padded[:M, :N] = w
    blocks = padded.reshape(gm, FP8_BLOCK, gn, FP8_BLOCK)
    amax = np.abs(blocks).max(axis=(1, 3)).astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1.0)).astype(scale_dtype)
    full = np.repeat(np.repeat(scale.astype(np.float32), FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:M, :N]
    q = np.clip(w / full, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    assert np.isfinite(q.astype(np.float32)).all()
    return q, scale


def fp8_block_dequant(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Independent ceil-grid dequant: w[r, c] = f32(e4m3(q[r, c])) * s[r // 128, c // 128]."""
    M, N = q.shape
    rows = np.arange(M) // FP8_BLOCK
    cols = np.arange(N) // FP8_BLOCK
    return q.astype(np.float32) * scale.astype(np.float32)[rows[:, None], cols[None, :]]


# gpt-oss MXFP4 (docs/FORMATS.md §5; transformers 5.24 integrations/mxfp4.py): ``<base>_blocks`` U8
# ``[..., O, I/32, 16]`` (low nibble = even element) + ``<base>_scales`` U8 ``[..., O, I/32]`` (E8M0, bias 127).
MXFP4_BLOCK = 32
MXFP4_BLOCKS, MXFP4_SCALES = "_blocks", "_scales"  # the tensor-name suffixes of <base>
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# magnitude index thresholds, ties to the even mantissa: |r| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, ...
_E2M1_UPPER = ((0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False), (5.0, True))


def mxfp4_quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The OCP MX rule, written out here: per row and 32 consecutive inputs, ``e = floor(log2 amax) - 2``
    (``amax = m 2^ex``, ``0.5 <= m < 1``: ``e = ex - 3``; clamped to [-127, 127]; an all-zero block gets byte 0),
    codes the nearest E2M1 magnitude of ``w / 2^e`` (ties to the even mantissa, saturating at 6), sign in bit 3
    (never on a zero). ``w`` float32 ``[..., O, I]`` -> (blocks U8 ``[..., O, I/32, 16]``, scales U8
    ``[..., O, I/32]``)."""
    *lead, O, I = w.shape
    assert I % MXFP4_BLOCK == 0, I
    x = w.astype(np.float64).reshape(*lead, O, I // MXFP4_BLOCK, MXFP4_BLOCK)
    amax = np.abs(x).max(axis=-1)
    _, ex = np.frexp(amax)
    e = np.where(amax > 0, np.clip(ex - 3, -127, 127), -127).astype(np.int64)
    r = np.abs(x) / np.exp2(e)[..., None]
    idx = np.zeros(r.shape, np.uint8)
    for upper, inclusive in _E2M1_UPPER:
        idx += (r > upper) if inclusive else (r >= upper)
    codes = np.where((x < 0) & (idx > 0), idx | 8, idx).astype(np.uint8).reshape(*lead, O, I)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return (np.ascontiguousarray(blocks.reshape(*lead, O, I // MXFP4_BLOCK, 16)),
            np.ascontiguousarray((e + 127).astype(np.uint8)))


def mxfp4_dequant(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``e2m1(nibble) * 2^(scale - 127)`` (float64 products, exact, then float32): blocks ``[..., O, G, 16]``,
    scales ``[..., O, G]`` -> float32 ``[..., O, 32 G]``."""
    table = np.array(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), np.float64)
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = table[codes] * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1).astype(np.float32)


def _e2m1_codes(x: np.ndarray) -> np.ndarray:
    """Nearest E2M1 code of every element of ``x`` (float64, already divided by its scale): magnitude index by
    ``_E2M1_UPPER`` (ties to the even mantissa, saturating at 6), sign in bit 3 (never on a zero)."""
    r = np.abs(x)
    idx = np.zeros(r.shape, np.uint8)
    for upper, inclusive in _E2M1_UPPER:
        idx += (r > upper) if inclusive else (r >= upper)
    return np.where((x < 0) & (idx > 0), idx | 8, idx).astype(np.uint8)


# NVFP4 (modelopt; docs/FORMATS.md §9): ``<n>`` U8 ``[O, I/2]`` E2M1 (low nibble = even element), ``<n>_scale``
# F8_E4M3 ``[O, I/16]``, ``<n>_scale_2`` F32 scalar; value ``(e2m1 * e4m3(scale)) * scale_2``.
NVFP4_BLOCK = 16
NV_SCALE, NV_SCALE_2 = "_scale", "_scale_2"


def nvfp4_quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """modelopt's NVFP4 rule: ``scale_2 ~ amax(w) / (6 * 448)`` (here rounded up to a power of two, so that
    modelopt's ``(e2m1 * s) * scale_2`` and compressed-tensors' ``e2m1 * (s / global_scale)`` are the same exact
    product: docs/FORMATS.md §8), per row and 16 inputs ``s = e4m3(amax_block / 6 / scale_2)`` (nearest), codes the
    nearest E2M1 of ``w / (f32(s) * scale_2)`` (saturating at 6). ``w`` float32 ``[O, I]`` -> (packed U8
    ``[O, I/2]``, scale e4m3fn ``[O, I/16]``, scale_2 F32 ``[]``)."""
    O, I = w.shape
    assert I % NVFP4_BLOCK == 0, I
    x = w.astype(np.float64).reshape(O, I // NVFP4_BLOCK, NVFP4_BLOCK)
    amax = float(np.abs(x).max())
    scale_2 = np.float32(2.0 ** math.ceil(math.log2(amax / (6 * FP8_MAX)))) if amax > 0 else np.float32(1.0)
    s = (np.abs(x).max(axis=-1) / 6 / np.float64(scale_2)).astype(ml_dtypes.float8_e4m3fn)
    sf = s.astype(np.float64) * np.float64(scale_2)
    codes = _e2m1_codes(x / np.where(sf > 0, sf, 1.0)[..., None]).reshape(O, I)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(packed), np.ascontiguousarray(s), np.asarray(scale_2, np.float32)


# MXFP8 (docs/FORMATS.md §9): ``<n>`` F8_E4M3 ``[O, I]`` + ``<n>_scale`` U8 E8M0 ``[O, I/32]``; value
# ``e4m3(b) * 2^(e - 127)``.
MXFP8_BLOCK = 32


def mxfp8_quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The OCP MX rule for E4M3 elements: per row and 32 inputs ``e = floor(log2 amax) - 8`` (E4M3's largest
    exponent; clamped to [-127, 127], an all-zero block gets byte 0), elements ``e4m3(w / 2^e)`` (nearest,
    saturating at 448). ``w`` float32 ``[O, I]`` -> (e4m3fn ``[O, I]``, scale U8 ``[O, I/32]``)."""
    O, I = w.shape
    assert I % MXFP8_BLOCK == 0, I
    x = w.astype(np.float64).reshape(O, I // MXFP8_BLOCK, MXFP8_BLOCK)
    amax = np.abs(x).max(axis=-1)
    _, ex = np.frexp(amax)  # amax = m 2^ex, 0.5 <= m < 1: floor(log2 amax) = ex - 1
    e = np.where(amax > 0, np.clip(ex - 1 - 8, -127, 127), -127).astype(np.int64)
    r = np.clip(x / np.exp2(e)[..., None], -FP8_MAX, FP8_MAX)
    q = r.astype(ml_dtypes.float8_e4m3fn).reshape(O, I)
    return np.ascontiguousarray(q), np.ascontiguousarray((e + 127).astype(np.uint8))


# ----------------------------------------------------------------------------------------------- recipes
ROUTER_SUFFIXES = (
    "mlp.gate.weight",
    "block_sparse_moe.gate.weight",
    "shared_expert_gate.weight",
    "e_score_correction_bias",
)
FUSED_RE = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj|w13_weight|w2_weight)$")  # + Inkling native
# Stacked shared experts (Inkling native [n, 2I, H] gate/up rows interleaved, [n, H, I]): split along the first axis
# into <base>.{k}.{gate,up,down}_proj.weight, rule 6 (docs/FORMATS.md "Stacked shared experts").
SHARED_STACK_RE = re.compile(r"^(.*\.shared_experts)\.(shared_w13_weight|shared_w2_weight)$")
EXPERT_RE = re.compile(r"\.experts\.\d+\.")
INT3_COLLIDING_WIDTHS = {24, 47, 48, 95, 96, 143, 144}


# The current generation (docs/FORMATS.md §5 rows 1-2): multimodal towers keep their source values;
# small 2-D parameters (hyper-connections, sinks, A_log, dt_bias, ...) and every router spelling stay F32.
TOWER_RE = re.compile(r"^(model\.)?(visual|vision_tower|mm_projector|vision_model|multi_modal_projector|audio_tower|"
                      r"audio)\.|^(vision|aligner)\.")  # fmt: skip  (the last two: DeepSeek-V4.1's released names)
ROUTER_RE = re.compile(r"\.(mlp\.gate|mlp\.router|ffn\.gate|block_sparse_moe\.gate|feed_forward\.router)\."
                       r"(weight|bias)$")  # fmt: skip
SMALL_2D_RE = re.compile(r"(\.|^)hc_|ape$|sinks?$|attn_sink|dt_bias$|A_log$|attn_res\.|rel_logits_proj\.|"
                         r"l2_clip\.scale$|attn_sink_proj\.weight$|index_kpool_compress_gate$|static_w$|"
                         r"engram\.[qk]_weight$")  # fmt: skip


# Qwen3.8's PLE n-gram tables (row shards): like an embedding
LOOKUP_TABLE_RE = re.compile(r"\.ngram_embedding\.(shard_\d+\.)?weight$")


def tensor_role(name: str, ndim: int, n_layers: int) -> str:
    """docs/FORMATS.md §5, first matching rule."""
    if TOWER_RE.match(name):
        return "tower"
    if ndim < 2 or name.endswith(ROUTER_SUFFIXES) or ROUTER_RE.search(name) or SMALL_2D_RE.search(name):
        return "router_1d"
    if ndim > 2 and not FUSED_RE.match(name) and not SHARED_STACK_RE.match(name):  # conv kernels (gated DeltaNet conv1d [C, 1, K]): F32
        return "router_1d"
    layer = layer_of(name)
    if (layer is not None and layer >= n_layers) or name.startswith("mtp."):  # mtp.{S}.: DeepSeek-V4.1's stages
        return "mtp"
    if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight") or name in ("head.weight", "embed.weight") \
            or LOOKUP_TABLE_RE.search(name):  # fmt: skip
        return "embed"  # head.weight / embed.weight: DeepSeek-V4's released ends (colitools' names.HEADS)
    if EXPERT_RE.search(name) or FUSED_RE.match(name):
        return "experts"
    return "dense"


def resolves_to(fmt: str, O: int, I: int, gs: int | None) -> bool:
    """docs/FORMATS.md §3 resolution of the bytes this format writes (no stamps: routed experts never get one)."""
    if fmt == "mxfp4":
        return I % 32 == 0
    f = reg.by_name(fmt)
    nb, ns = f.weight_nbytes(O, I, gs), f.scale_nbytes(O, I, gs)
    i8, i4, i2 = O * I, O * -(-I // 2), O * -(-I // 4)
    i3, e8 = O * -(-I // 64) * 24, O * -(-I // 256) * 98
    nblk = -(-O // 128) * -(-I // 128)
    if ns == 4 and nb == e8:
        got = "e8-iq3-lattice"
    elif nb == i8:
        row, blk = ns == 4 * O, ns == 4 * nblk
        if row and blk:
            return False  # ambiguous without a stamp
        got = "fp8-e4m3-b128" if blk and not row else "int8-row"
    elif nb == i4:
        got = "int4-row" if ns == 4 * O else "int4-grouped"
    elif nb == i2:
        got = "int2-row"
    elif nb == i3:
        got = "int3-g64"
    else:
        return False
    if got != fmt:
        return False
    if got == "int4-grouped":
        return reg.detect_group_size(O, I, ns) == gs
    return True


def encode_decode(
    w: np.ndarray, option: str, *, expert: bool, name: str
) -> tuple[np.ndarray, str, str | None]:
    """Values a converted container holds for ``w`` under recipe format ``option``:
    (float32 [O, I], format label, fallback reason or None)."""
    O, I = w.shape
    if option == "f32":
        return w, "f32", None
    fallback = None
    fmt, gs = None, None
    if option == "int8-row":
        fmt = "int8-row"
    elif option == "int4-row":  # a target's expert option (--target qwen36 / inkling)
        fmt = "int4-row"
    elif option.startswith("int4-g"):
        gs = reg.writer_group_size(I, int(option[len("int4-g") :]))
        fmt = "int4-row" if gs is None else "int4-grouped"
    elif option == "int3-g64":
        fmt = "int3-g64"
        if I in INT3_COLLIDING_WIDTHS:
            fmt, fallback = "int8-row", f"int3-g64 at I = {I} collides with another format's bytes"
    elif option == "mxfp4":
        fmt = "mxfp4"
        if I % 32:
            fmt, fallback = "int8-row", f"mxfp4 needs I % 32 == 0 (I = {I})"
    elif option == "fp8-e8m0":  # named by its .weight / .scale pair and dtypes: always resolves back
        f = reg.by_name("fp8-e4m3-e8m0")
        codes, scales = f.encode(w, None, name=name, fast=False)
        return np.ascontiguousarray(f.decode(codes, scales, O, I), dtype=np.float32), option, None
    else:
        raise ValueError(option)
    if expert and fallback is None and not resolves_to(fmt, O, I, gs):
        fmt, gs, fallback = "int8-row", None, f"{option} bytes of [{O}, {I}] would not resolve back"
    f = reg.by_name(fmt)
    codes, scales = f.encode(w, gs, name=name, fast=False)
    out = f.decode(codes, scales, O, I, gs)
    label = fmt if gs is None else f"int4-g{gs}"
    return np.ascontiguousarray(out, dtype=np.float32), label, fallback


COPIED_DTYPES = {"<i8": "I64", "<i4": "I32", "<i2": "I16", "|i1": "I8", "|u1": "U8", "|b1": "BOOL"}  # safetensors
FUSED_BIAS_RE = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)_bias$")


def apply_recipe(
    source: dict[str, np.ndarray], recipe: str, n_layers: int, orientation: str = "rows",
    native: Mapping[str, str] | frozenset[str] = frozenset(),
    decoded: Mapping[str, str] | None = None,
    bf16_stored: frozenset[str] = frozenset(),
) -> tuple[dict[str, np.ndarray], dict[str, str], list[dict[str, str]]]:
    """Dequantized weights (on-disk names) for a recipe, the format of every container tensor (per-expert names,
    as the converter writes them), and the fallbacks taken.

    ``orientation`` of fused expert stacks (docs/FORMATS.md §5 "Expert stacks", fixed by the family): ``rows``
    (transformers: gate_up ``[E, 2I, H]`` gate rows first, down ``[E, H, I]``) or ``transposed-interleaved``
    (gpt-oss: gate_up ``[E, H, 2I]`` gate / up columns interleaved, down ``[E, I, H]``, stack biases
    ``gate_up_proj_bias [E, 2I]`` interleaved the same way and ``down_proj_bias [E, H]``, kept F32).

    ``native``: the source tensors a format holds exactly, by name -> that format's label (MXFP4 stacks ->
    ``mxfp4``: their rows split per expert stay mxfp4; symmetric INT4 group g experts -> ``int4-g{g}``); under
    the ``native`` recipe they keep exactly the source's values. A plain set means every name is MXFP4.
    ``decoded``: natively quantized tensors no format holds exactly, name -> kind (``NVFP4``, ``MXFP8``): under
    ``native`` they get the default on their decoded values, listed as fallbacks (reason ``decoded: <kind>
    source, no format holds it exactly; written as <format>``, docs/FORMATS.md §5). ``bf16_stored``: the source
    tensors stored BF16; a tower among them keeps that dtype (rule 1) and is labelled ``bf16``, as is one of a
    target's ``source_float_leaves`` the recipe would quantize (kept in the source's dtype, its values)."""
    decoded = decoded or {}
    if not isinstance(native, Mapping):
        native = dict.fromkeys(native, "mxfp4")
    r = RECIPES[recipe]
    out: dict[str, np.ndarray] = {}
    formats: dict[str, str] = {}
    fallbacks: list[dict[str, str]] = []

    target = targets.by_name(r["target"]) if "target" in r else None

    def dropped(name: str, role: str) -> bool:
        """A tensor the target's converter leaves out: towers (its ``--towers`` default drop), MTP (``drop_mtp``)."""
        return (role == "tower" and target.default("towers") == "drop") or (role == "mtp" and target.drop_mtp)

    def one(name: str, w: np.ndarray, role: str, kept: str | None = None, stack: str | None = None) -> np.ndarray:  # fmt: skip
        option = {"router_1d": "f32", "tower": "f32", "mtp": r.get("mtp", "int8-row"), "embed": r["embed"],
                  "experts": r["experts"], "dense": r["dense"]}[role]  # fmt: skip
        if target is not None:  # the target's loader decides some dtypes, whatever the role
            if dropped(name, role):  # left out by the converter: the model still needs a value, no format
                return w
            option = target.float_dtype(target.out_name(name)) or option
            kept_float = names.parse_name(name).leaf in target.source_float_leaves
            if kept_float and w.ndim == 2 and option not in ("f32", "bf16"):  # Target.rewrite's keep_float
                formats[name] = "bf16" if name in bf16_stored else "f32"
                return w
        if option == "bf16":  # BF16 storage: float32 -> bfloat16 round to nearest even -> float32
            formats[name] = "bf16"
            return w.astype(ml_dtypes.bfloat16).astype(np.float32)
        if option == NATIVE and kept and w.ndim == 2:  # kept as they are (lossless): exactly the source's values
            formats[name] = kept
            return w
        requested = option
        if option == NATIVE:
            option = NATIVE_DEFAULT[role]
        if w.ndim < 2 or option == "f32":
            formats[name] = "bf16" if role == "tower" and name in bf16_stored else "f32"
            return w
        deq, label, why = encode_decode(w, option, expert=(role == "experts"), name=name)
        formats[name] = label
        if why:
            fallbacks.append({"tensor": name, "requested": option, "written": label, "reason": why})
        elif requested == NATIVE and (stack or name) in decoded:  # a stack's experts: the stack's encoding
            why = f"decoded: {decoded[stack or name]} source, no format holds it exactly; written as {label}"
            fallbacks.append({"tensor": name, "requested": NATIVE, "written": label, "reason": why})
        return deq

    for name, w in source.items():
        if not np.issubdtype(w.dtype, np.floating):  # row 0: non-float tensors copied unchanged
            out[name] = w
            formats[name] = f"{COPIED_DTYPES[w.dtype.str]} (copied)"
            continue
        role = tensor_role(name, w.ndim, n_layers)
        m = FUSED_RE.match(name)
        mb = FUSED_BIAS_RE.match(name)
        if mb:  # stack bias [E, n]: per-expert F32 biases
            base, kind = mb.groups()
            inter = orientation == "transposed-interleaved"
            for e in range(w.shape[0]):
                if kind == "gate_up_proj":
                    half = w.shape[1] // 2
                    g, u = (w[e, 0::2], w[e, 1::2]) if inter else (w[e, :half], w[e, half:])
                    one(f"{base}.{e}.gate_proj.bias", g, "router_1d")
                    one(f"{base}.{e}.up_proj.bias", u, "router_1d")
                else:
                    one(f"{base}.{e}.down_proj.bias", w[e], "router_1d")
            out[name] = w
        elif m and orientation == "transposed":  # Qwen3-VL-MoE as published, Llama-4
            base, kind = m.groups()
            parts = []
            for e in range(w.shape[0]):
                if kind == "gate_up_proj":  # [H, 2I]: gate = the first I columns, up = the last I (chunk(2, -1))
                    half = w.shape[2] // 2
                    g = one(f"{base}.{e}.gate_proj.weight", np.ascontiguousarray(w[e][:, :half].T), role)
                    u = one(f"{base}.{e}.up_proj.weight", np.ascontiguousarray(w[e][:, half:].T), role)
                    parts.append(np.concatenate([g.T, u.T], axis=1))
                else:  # [I, H]
                    parts.append(one(f"{base}.{e}.down_proj.weight", np.ascontiguousarray(w[e].T), role).T)
            out[name] = np.ascontiguousarray(np.stack(parts))
        elif m and orientation == "transposed-interleaved":
            base, kind = m.groups()
            parts = []
            kept = native.get(name)
            for e in range(w.shape[0]):
                if kind == "gate_up_proj":  # [H, 2I]: gate = columns 0, 2, ...; up = columns 1, 3, ...
                    g = one(f"{base}.{e}.gate_proj.weight", np.ascontiguousarray(w[e][:, 0::2].T), role, kept)
                    u = one(f"{base}.{e}.up_proj.weight", np.ascontiguousarray(w[e][:, 1::2].T), role, kept)
                    slab = np.empty_like(w[e])
                    slab[:, 0::2], slab[:, 1::2] = g.T, u.T
                    parts.append(slab)
                else:  # [I, H]
                    parts.append(one(f"{base}.{e}.down_proj.weight", np.ascontiguousarray(w[e].T), role, kept).T)
            out[name] = np.ascontiguousarray(np.stack(parts))
        elif m or SHARED_STACK_RE.match(name):  # rows / rows-interleaved stacks; stacked shared experts
            base, kind = (m or SHARED_STACK_RE.match(name)).groups()
            kind = "down_proj" if kind in ("down_proj", "w2_weight", "shared_w2_weight") else "gate_up_proj"
            inter = orientation == "rows-interleaved"
            parts = []
            kept = native.get(name)
            for e in range(w.shape[0]):
                if kind == "gate_up_proj":
                    half = w.shape[1] // 2
                    gw, uw = (w[e, 0::2], w[e, 1::2]) if inter else (w[e, :half], w[e, half:])
                    g = one(f"{base}.{e}.gate_proj.weight", np.ascontiguousarray(gw), role, kept, name)
                    u = one(f"{base}.{e}.up_proj.weight", np.ascontiguousarray(uw), role, kept, name)
                    slab = np.empty_like(w[e])
                    if inter:
                        slab[0::2], slab[1::2] = g, u
                    else:
                        slab[:half], slab[half:] = g, u
                    parts.append(slab)
                else:
                    parts.append(one(f"{base}.{e}.down_proj.weight", w[e], role, kept, name))
            out[name] = np.stack(parts)
        else:
            out[name] = one(name, w, role, native.get(name))
    return out, dict(sorted(formats.items())), fallbacks
