"""Output targets (``colitools convert --target NAME``, docs/FORMATS.md "Targets"): the one owner of target facts.

A target says which colibri loader reads the container, which model types it applies to, which recipe options
that loader can read, and how routed experts are named and laid out. ``generic`` is the Hugging Face-named
``.qs`` container that ``c/colibri.c`` reads (``qt_from_disk`` / ``qt_resolve_fmt``); ``olmoe`` is the layout of
colibri's OLMoE engine (``c/olmoe.c``), as its converter ``c/tools/convert_olmoe_merged.py`` writes it:

* dense tensors by their Hugging Face names, read by ``load_t`` through ``st_read_f32``, which accepts BF16, F16
  and F32 only (a U8 ``.qs`` weight is refused: "not a float tensor");
* per routed expert one merged int8 blob ``model.layers.{L}.mlp.experts.{E}.merged_weight`` (I8, 1-D,
  ``2*I*H + H*I`` bytes: gate ``[I, H]``, up ``[I, H]``, down ``[H, I]`` row-major, back to back) and its scales
  ``model.layers.{L}.mlp.experts.{E}.qs`` (F32, 1-D, ``I + I + H``: gate rows, up rows, down rows), read by
  ``load_expert_merged`` (byte counts checked exactly against ``intermediate_size`` / ``hidden_size``) and
  used as ``w[o, i] = q[o, i] * scale[o]`` by ``matmul_q``: int8-row (docs/FORMATS.md §2).

Numpy-free (the CLI imports it for its help text).
"""

# ruff: noqa: E741  (O and I are the spec's names for out_features and in_features)
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colitools.formats import model_config, names
from colitools.formats.errors import FormatError, TargetRefused
from colitools.formats.format_names import GROUP_SIZES

GENERIC_NAME = "generic"
QWEN36 = "qwen36"
KIMI_K3 = "kimi_k3"
GLM53 = "glm53"
DEEPSEEK_V4 = "deepseek_v4"
INKLING = "inkling"
META_GROUP_SIZE = "expert_gs"  # qwen36_meta.json: the int4 experts' group size, 0 = row scales


INT8_ROW, INT4_ROW, INT4_GROUPED = "int8-row", "int4-row", "int4-grouped"  # registry names of merged parts
SIGNED_NIBBLE_XOR = 0x88  # a byte of pairs codes (v + 8 per nibble) XOR this = two signed nibbles (v & 0xF)


@dataclass(frozen=True)
class MergedPart:
    """One projection inside a merged expert blob: ``[O, I]`` in format ``fmt`` (group size ``gs``), its codes
    at bytes ``data`` of the blob and its scales at elements ``scales`` of the scale tensor (both half-open,
    relative to the tensor). ``signed_nibbles``: int4 codes as two's complement nibbles (low nibble = element
    2k), i.e. the pairs codes of docs/FORMATS.md §2.2 XOR ``SIGNED_NIBBLE_XOR``."""

    projection: str  # gate | up | down
    O: int
    I: int
    data: tuple[int, int]
    scales: tuple[int, int]
    fmt: str = INT8_ROW
    gs: int | None = None
    signed_nibbles: bool = False
    expert: int | None = None  # the routed expert (a fused stack's part); None: the blob's own expert


@dataclass(frozen=True)
class MergedLayout:
    """Routed experts as one blob per expert (``c/olmoe.c`` and ``c/qwen36.c`` ``load_expert_merged``).

    A blob holds gate ``[I, H]``, up ``[I, H]`` and down ``[H, I]`` back to back, all in one format: int8-row
    (I8, ``O*I`` bytes each; both engines) or int4 (U8, the whole blob's ``3*I*H`` values flattened and packed two
    per byte as signed nibbles, ``convert_qwen36.py`` ``pack_int4``; qwen36 only) with row scales (int4-row) or
    group scales along the input (int4-grouped, ``expert_gs`` of ``qwen36_meta.json``). The scale tensor holds
    gate, up and down scales in that order. Which of these a target writes is its ``expert_options``; readers
    accept every one, telling them apart by byte and scale counts as ``load_expert_merged`` does."""

    leaf: str = "merged_weight"  # ...experts.{E}.merged_weight (names.MERGED_EXPERTS)
    scale_leaf: str = "qs"  # ...experts.{E}.qs (names.MERGED_SCALES)
    projections: tuple[str, ...] = ("gate", "up", "down")
    fmt: str = INT8_ROW  # the format of a blob whose target does not choose another
    dtype: str = "I8"  # int8 codes as the converters store them (torch.int8); st.h reads U8 and I8 alike
    int4_dtype: str = "U8"  # packed int4 codes (pack_int4 returns uint8)
    dtypes: tuple[str, ...] = ("I8", "U8")  # what a reader accepts
    scale_dtype: str = "F32"
    formats: tuple[str, ...] = (INT8_ROW, INT4_ROW, INT4_GROUPED)  # what a reader accepts

    def names(self, expert_base: str, expert: int) -> tuple[str, str]:
        """``(blob name, scale name)`` of expert ``expert`` under ``expert_base`` (``model.layers.3.mlp.experts``)."""
        return f"{expert_base}.{expert}.{self.leaf}", f"{expert_base}.{expert}.{self.scale_leaf}"

    def blob_dtype(self, fmt: str) -> str:
        return self.dtype if fmt == INT8_ROW else self.int4_dtype

    def parts(self, hidden: int, inter: int, fmt: str = INT8_ROW, gs: int | None = None) -> tuple[MergedPart, ...]:
        """The parts of one blob of an expert of width ``inter`` in a model of hidden size ``hidden``."""
        out, d, s = [], 0, 0
        int4 = fmt != INT8_ROW
        for proj in self.projections:
            O, I = (hidden, inter) if proj == "down" else (inter, hidden)
            nb = O * I // 2 if int4 else O * I
            ns = O * -(-I // gs) if fmt == INT4_GROUPED and gs else O
            out.append(MergedPart(proj, O, I, (d, d + nb), (s, s + ns), fmt, gs if fmt == INT4_GROUPED else None,
                                  int4))  # fmt: skip
            d, s = d + nb, s + ns
        return tuple(out)

    def sizes(self, hidden: int, inter: int, fmt: str = INT8_ROW, gs: int | None = None) -> tuple[int, int]:
        """``(blob bytes, scale elements)``: ``want_w`` / ``want_s`` of ``load_expert_merged``."""
        last = self.parts(hidden, inter, fmt, gs)[-1]
        return last.data[1], last.scales[1]

    def identify(
        self, hidden: int, inter: int, nbytes: int, n_scales: int, group_size: int | None = None
    ) -> tuple[str, int | None] | None:
        """``(format, group size)`` of a blob of ``nbytes`` bytes with ``n_scales`` scales, or None when no layout
        has those counts. ``group_size`` is the container's ``expert_gs`` (``qwen36_meta.json``; 0: row scales),
        which decides between layouts with equal counts (int4-g32 and int4-g48 at width 64, int4-row and
        int4-g64 at width 64), as it does in ``load_expert_merged``; without it such counts are None."""
        found = []
        if self.sizes(hidden, inter) == (nbytes, n_scales) and not group_size:
            found.append((INT8_ROW, None))
        if hidden % 2 == 0 and inter % 2 == 0:
            if self.sizes(hidden, inter, INT4_ROW) == (nbytes, n_scales) and not group_size:
                found.append((INT4_ROW, None))
            found += [(INT4_GROUPED, g) for g in GROUP_SIZES if group_size in (None, g)
                      and self.sizes(hidden, inter, INT4_GROUPED, g) == (nbytes, n_scales)]  # fmt: skip
        return found[0] if len(found) == 1 else None


MERGED = MergedLayout()


@dataclass(frozen=True)
class FusedLayout:
    """Routed experts as one fused stack per layer over all its experts (``c/inkling.c``: ``model_init``'s
    container detection and ``slot_fill``; written by ``c/tools/convert_inkling_int4.py``
    ``quantize_expert_tensor``). The one owner of these byte facts, used by the writer and every reader.

    ``{base}.gate_up_proj`` (U8, 1-D) holds expert ``e``'s ``2I`` rows, the ``I`` gate rows then the ``I`` up rows,
    at bytes ``[e * 2I * rowb, (e + 1) * 2I * rowb)`` with ``rowb`` bytes a row; ``{base}.down_proj`` its ``H`` rows
    of ``rowb'`` bytes. ``rowb == H`` (``rowb' == I``): int8-row codes (two's complement bytes); ``rowb == H / 2``:
    int4-row pairs codes (docs/FORMATS.md §2.2: low nibble = even column, value + 8). The engine tells them apart by
    ``rowb = nbytes / (E * 2I)`` of the first MoE layer's ``gate_up_proj`` (any other row size stops it) and reads
    ``down_proj`` in the same format. ``{stack}.qs`` (F32, 1-D): one scale per row, in row order (``E * 2I`` and
    ``E * H``); a weight is ``q[o, i] * scale[o]`` (``matmul_q`` / ``matmul_q4``). Only byte counts are read,
    never shapes (the converter writes both tensors 1-D). A float stack (``float_formats``, no ``.qs``) is
    ``[E, 2I, H]`` / ``[E, H, I]`` in the same row order."""

    stacks: tuple[tuple[str, tuple[str, ...]], ...] = (("gate_up_proj", ("gate", "up")), ("down_proj", ("down",)))
    scale_suffix: str = ".qs"
    dtype: str = "U8"  # int8 codes too: the engine takes U8 (st dtype 3) as "container", anything else as float
    scale_dtype: str = "F32"
    formats: tuple[str, ...] = (INT8_ROW, INT4_ROW)
    # float stacks [E, 2I, H] / [E, H, I] (the converter's --xbits 0: the de-interleaved source stack, its dtype):
    # the engine reads an expert's rows with read_f32_slice and keeps them f32 or quantizes them at load
    float_formats: tuple[str, ...] = ("f32", "bf16")

    def leaf_of(self, projection: str) -> str:
        """The stack holding ``projection`` (gate | up | down)."""
        return next(leaf for leaf, projections in self.stacks if projection in projections)

    def names(self, expert_base: str) -> tuple[tuple[str, str], ...]:
        """``((stack name, scale name), ...)`` of a layer's stacks under ``expert_base``
        (``model.layers.3.mlp.experts``), gate_up first."""
        return tuple((f"{expert_base}.{leaf}", f"{expert_base}.{leaf}{self.scale_suffix}") for leaf, _ in self.stacks)

    @staticmethod
    def row_bytes(fmt: str, width: int) -> int:
        return width if fmt == INT8_ROW else width // 2

    def geometry(self, leaf: str, hidden: int, inter: int) -> tuple[tuple[str, ...], int, int]:
        """``(projections, rows per expert, row width)`` of stack ``leaf``."""
        projections = dict(self.stacks)[leaf]
        return (projections, 2 * inter, hidden) if leaf == "gate_up_proj" else (projections, hidden, inter)

    def sizes(self, leaf: str, hidden: int, inter: int, experts: int, fmt: str) -> tuple[int, int]:
        """``(bytes, scales)`` of stack ``leaf`` over ``experts`` experts in ``fmt``."""
        _, rows, width = self.geometry(leaf, hidden, inter)
        return experts * rows * self.row_bytes(fmt, width), experts * rows

    def identify(self, leaf: str, hidden: int, inter: int, experts: int, nbytes: int, n_scales: int) -> str | None:
        """The format of stack ``leaf`` from its byte and scale counts (the engine's ``rowb``), or None."""
        found = [f for f in self.formats if (f == INT8_ROW or (hidden % 2 == 0 and inter % 2 == 0))
                 and self.sizes(leaf, hidden, inter, experts, f) == (nbytes, n_scales)]  # fmt: skip
        return found[0] if len(found) == 1 else None

    def parts(self, leaf: str, hidden: int, inter: int, experts: int, fmt: str) -> tuple[MergedPart, ...]:
        """Every expert's projections in stack ``leaf``: bytes and scales relative to the stack and its scales."""
        projections, rows, width = self.geometry(leaf, hidden, inter)
        rb, out = self.row_bytes(fmt, width), []
        O = rows // len(projections)
        for e in range(experts):
            for k, proj in enumerate(projections):
                r0 = e * rows + k * O
                out.append(MergedPart(proj, O, width, (r0 * rb, (r0 + O) * rb), (r0, r0 + O), fmt, expert=e))
        return tuple(out)


FUSED = FusedLayout()


@dataclass(frozen=True)
class Spelling:
    """How a target's loader names and types one format's two tensors: ``<base>{weight_suffix}`` stored as
    ``weight_dtype`` and ``<base>{scale_suffix}`` as ``scale_dtype`` (the bytes are the format's own)."""

    weight_suffix: str
    weight_dtype: str
    scale_suffix: str
    scale_dtype: str

    def tensor_names(self, name: str) -> tuple[str, str]:
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        return base + self.weight_suffix, base + self.scale_suffix


# DeepSeek-V4's released routed experts (what c/deepseek_v4.c's expert store reads, ``expert_record_bytes``:
# ``layers.{L}.ffn.experts.{E}.w{1,2,3}.weight`` / ``.scale``): mxfp4 bytes (docs/FORMATS.md §2.7: E2M1 pairs,
# low nibble = even input as native_quant.c ``coli_fp4_matvec_ref`` reads them, one E8M0 byte per 32 inputs) as
# I8 ``[O, I/2]`` and F8_E8M0 ``[O, I/32]``.
V4_FP4_EXPERTS = Spelling(".weight", "I8", ".scale", "F8_E8M0")

# c/deepseek_v4.c ``coli_v4_layer_plan`` (each ``add_1d`` / ``add_2d`` dtype, checked by ``coli_v4_layer_validate``)
# for the tensors that are not FP8 projections (``add_fp8``), by their released name inside a layer
# (``layers.{L}.`` stripped) or at the top; the globals the engine reads with ``coli_tensor_load_f32`` (BF16 or
# F32) as the released checkpoint has them. The FP8 projections (``attn.wq_a`` / ``wq_b`` / ``wkv`` / ``wo_a`` /
# ``wo_b``, ``attn.indexer.wq_b``, ``ffn.shared_experts.w1`` / ``w2`` / ``w3``) follow ``--dense`` / ``--mtp``,
# the embedding and head ``--embed`` (``bf16`` only: the head cache's ``find_head`` refuses any other head dtype),
# ``ffn.gate.tid2eid`` (I64) is copied.
V4_FLOAT_DTYPES: dict[str, str] = {
    **dict.fromkeys((
        "attn_norm.weight", "ffn_norm.weight", "attn.q_norm.weight", "attn.kv_norm.weight",
        "attn.compressor.norm.weight", "attn.compressor.wgate.weight", "attn.compressor.wkv.weight",
        "attn.indexer.compressor.norm.weight", "attn.indexer.compressor.wgate.weight",
        "attn.indexer.compressor.wkv.weight", "attn.indexer.weights_proj.weight", "ffn.gate.weight",
        "norm.weight",
    ), "bf16"),
    **dict.fromkeys((
        "attn.attn_sink", "attn.compressor.ape", "attn.indexer.compressor.ape", "ffn.gate.bias",
        "hc_attn_base", "hc_attn_fn", "hc_attn_scale", "hc_ffn_base", "hc_ffn_fn", "hc_ffn_scale",
        "hc_head_fn", "hc_head_base", "hc_head_scale",
    ), "f32"),
}  # fmt: skip
V4_FP8 = "fp8-e8m0"  # the recipe option of registry format fp8-e4m3-e8m0 (docs/FORMATS.md §2.9)


@dataclass(frozen=True)
class Target:
    """One ``--target``: the colibri loader it follows and what that loader can read."""

    name: str
    loader: str  # the colibri function(s) that read this layout
    model_types: tuple[str, ...] | None = None  # None: any model type
    merged: MergedLayout | None = None  # routed experts as merged blobs
    fused: FusedLayout | None = None  # routed experts as one fused stack per layer (shared experts stacked too)
    drop_mtp: bool = False  # the converter leaves MTP modules out (listed in the manifest like dropped towers)
    expert_options: tuple[str, ...] | None = None  # --experts values the loader reads (None: any)
    float_options: tuple[str, ...] | None = None  # --dense / --embed / --mtp values (None: any)
    defaults: tuple[tuple[str, str], ...] = ()  # option -> default for this target (else the recipe's)
    layouts: tuple[str, ...] | None = None  # --layout values (None: any)
    rename: tuple[tuple[str, str], ...] = ()  # output name prefixes: (source prefix, written prefix), first match
    flat_config: bool = False  # config.json is the text config, flat (the source's goes to config.hf.json)
    meta_file: str | None = None  # the engine's own metadata file (``meta_for``)
    towers: str | None = None  # forced --towers value (the converter drops them), None: the user's
    # tensors (by leaf) the loader reads only with its float reader: written in the source's float dtype, unchanged
    source_float_leaves: tuple[str, ...] = ()
    int4_group: int | None = None  # non-expert int4: only int4-g{n} at I % n == 0 (else int4_fallback, recorded)
    int4_fallback: str = INT8_ROW  # what such a tensor is written as instead (a recipe option)
    expert_formats: tuple[str, ...] | None = None  # labels every routed expert tensor must be written as
    # a routed expert's record: projections in this order, each weight directly followed by its scale
    expert_record: tuple[str, ...] | None = None
    refused: str | None = None  # a target colitools knows but does not write: why, and what to do instead
    option_values: tuple[tuple[str, tuple[str, ...]], ...] = ()  # per option, the values it reads (else above)
    name_map: Callable[[str], str | None] | None = None  # the loader's tensor names (after ``rename``; None: none)
    float_dtypes: tuple[tuple[str, str], ...] = ()  # (leaf name (``leaf_key``), bf16 / f32): whatever the role
    expert_spelling: Spelling | None = None  # routed experts' tensor names and dtypes (their bytes: the format's)
    config_extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # config.json keys the loader reads

    def check_writable(self) -> None:
        """TargetRefused (one line) for a target colitools does not write (``refused``)."""
        if self.refused is not None:
            raise TargetRefused(f"`target={self.name}` is refused: {self.refused}")

    def out_name(self, name: str) -> str | None:
        """The name this target writes for a source tensor name: ``rename`` (first match), then ``name_map``
        (a formats/names.py table; None when the loader looks up no such tensor)."""
        for old, new in self.rename:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        return self.name_map(name) if self.name_map is not None else name

    def float_dtype(self, written_name: str) -> str | None:
        """``bf16`` / ``f32`` for a tensor (by its written name) the loader reads as that float, else None."""
        if not self.float_dtypes:
            return None
        return dict(self.float_dtypes).get(leaf_key(written_name))

    def default(self, option: str) -> str | None:
        return dict(self.defaults).get(option)

    def check_option(self, option: str, value: str) -> None:
        """TargetRefused (one line) when this target's loader cannot read ``--option value``."""
        allowed = self.expert_options if option == "experts" else self.float_options
        allowed = dict(self.option_values).get(option, allowed)
        if allowed is not None and value not in allowed:
            raise TargetRefused(
                f"`target={self.name}`: `{option}={value}` is refused: {self.loader} reads "
                f"{' or '.join(allowed)} there"
            )

    def check_layout(self, layout: str) -> None:
        if self.layouts is not None and layout not in self.layouts:
            raise TargetRefused(
                f"`target={self.name}`: `layout={layout}` is refused: {self.loader} reads {', '.join(self.layouts)}"
            )

    def check_model_type(self, model_type: str | None) -> None:
        """TargetRefused (one line) when the source's ``model_type`` is not one this target's engine runs."""
        if self.model_types is not None and model_type not in self.model_types:
            raise TargetRefused(
                f"`target={self.name}` is for model_type {', '.join(self.model_types)} ({self.loader}); "
                f"the source is {model_type!r}"
            )


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(GENERIC_NAME, "c/colibri.c qt_from_disk / qt_resolve_fmt"),
        Target(
            "olmoe",
            "c/olmoe.c (model_init's load_t, load_expert_merged)",
            model_types=("olmoe",),
            merged=MERGED,
            expert_options=("int8-row",),
            float_options=("f32", "bf16"),
            defaults=(("experts", "int8-row"), ("dense", "f32"), ("embed", "f32"), ("mtp", "f32")),
            layouts=("pairs",),
        ),
        Target(
            QWEN36,
            "c/qwen36.c (load_cfg, load_meta, model_init's load_t_n, load_expert_merged)",
            model_types=("qwen3_5_moe", "qwen3_5_moe_text"),
            merged=MERGED,
            expert_options=(INT8_ROW, INT4_ROW, *(f"int4-g{g}" for g in GROUP_SIZES)),
            float_options=("f32", "bf16"),
            defaults=(("experts", INT4_ROW), ("dense", "f32"), ("embed", "f32"), ("mtp", "f32")),
            layouts=("pairs",),
            rename=(("model.language_model.", "model."),),
            flat_config=True,
            meta_file="qwen36_meta.json",
            towers="drop",
        ),
        Target(
            KIMI_K3,
            "c/kimi_k3.c (w_load, f32_load, expert_table_init)",
            model_types=("kimi_k3",),
            expert_options=("mxfp4", "native"),
            float_options=("f32", "bf16", INT8_ROW, "int4-g64"),
            defaults=(("experts", "mxfp4"), ("dense", INT8_ROW), ("embed", INT8_ROW), ("mtp", INT8_ROW)),
            layouts=("pairs",),
            source_float_leaves=("embed_tokens", "f_a_proj", "f_b_proj", "b_proj", "self_attention_res_proj",
                                 "mlp_res_proj", "output_attn_res_proj"),  # fmt: skip
            int4_group=64,
            expert_formats=("mxfp4",),
            expert_record=("gate", "down", "up"),  # w1p w1s w2p w2s w3p w3s (w2 is down, w3 up)
        ),
        Target(
            GLM53,
            "c/glm53.c (load_f32, load_mat, absorb_kvb, expert_geometry / expert_table_init)",
            model_types=("glm5_next", "glm5_next_text"),
            expert_options=("int4-g64",),
            float_options=("f32", "bf16", "int4-g64"),
            defaults=(("experts", "int4-g64"), ("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
            layouts=("pairs",),
            source_float_leaves=("embed_tokens", "kv_b_proj"),
            int4_group=64,
            int4_fallback="bf16",
            expert_formats=("int4-g64",),
            expert_record=("gate", "up", "down"),  # gate.w gate.qs up.w up.qs down.w down.qs
        ),
        Target(
            DEEPSEEK_V4,
            "c/deepseek_v4.c (coli_v4_layer_plan / coli_v4_layer_validate, coli_tensor_load_fp8, "
            "coli_tensor_load_f32, coli_v4_head_cache_load, expert_record_bytes)",
            model_types=("deepseek_v4",),
            expert_options=("mxfp4",),
            option_values=(("dense", (V4_FP8,)), ("mtp", (V4_FP8,)), ("embed", ("bf16",))),  # find_head: BF16
            defaults=(("experts", "mxfp4"), ("dense", V4_FP8), ("embed", "bf16"), ("mtp", V4_FP8)),
            layouts=("pairs",),
            expert_formats=("mxfp4",),
            name_map=names.deepseek_v4_released_name,
            float_dtypes=tuple(V4_FLOAT_DTYPES.items()),
            expert_spelling=V4_FP4_EXPERTS,
            config_extra=lambda config: deepseek_v4_config(config),
        ),
        Target(
            INKLING,
            "c/inkling.c (load_cfg; model_init's load_w / load_t and container detection; slot_fill)",
            model_types=("inkling", "inkling_mm_model", "inkling_text"),
            fused=FUSED,
            name_map=names.inkling_text_name,
            drop_mtp=True,
            expert_options=(INT4_ROW, INT8_ROW, "f32", "bf16"),  # convert_inkling_int4.py --xbits 4 / 8 / 0
            float_options=("f32", "bf16"),
            defaults=(("experts", INT4_ROW), ("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
            layouts=("pairs",),
            towers="drop",
        ),
    )
}
TARGET_NAMES = tuple(TARGETS)


def leaf_key(name: str) -> str:
    """A written name without its layer (``layers.{L}.`` / ``mtp.{K}.`` / a text root's ``...layers.{L}.``):
    the key of ``Target.float_dtypes``."""
    parsed = names.parse_name(name)
    if parsed.layer_prefix is not None and parsed.layer is not None:
        return name[len(f"{parsed.layer_prefix}.{parsed.layer}.") :]
    head, _, rest = name.partition(".")
    if head == "mtp" and rest.partition(".")[0].isdigit():
        return rest.partition(".")[2]
    return name


def by_name(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise TargetRefused(f"`target={name!r}`: choose one of {', '.join(TARGET_NAMES)}") from None


# ------------------------------------------------------------------------------- deepseek_v4 config.json
V4_QUANTIZATION = {  # the released checkpoint's quantization_config: FP8 e4m3 with UE8M0 128x128 block scales
    "quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}  # fmt: skip


def deepseek_v4_config(config: dict[str, Any]) -> dict[str, Any]:
    """The released checkpoint's ``config.json`` keys that c/deepseek_v4.c's ``coli_v4_config_parse`` reads and
    a transformers 5.24 config spells otherwise, derived from it (the transformers keys stay, for colitools'
    own readers): ``compress_ratios`` per layer (``layer_types`` through ``compress_rates``, 0 for a sliding
    layer; one 0 per MTP layer after them, as the released list has), ``num_hash_layers`` (the leading
    ``hash_moe`` layers of ``mlp_layer_types``), ``expert_dtype`` ``fp4``, ``topk_method`` ``noaux_tc`` and
    ``quantization_config`` (``V4_QUANTIZATION``). Keys the source already has are kept as they are."""
    mcfg = model_config.text_config(config)
    extra: dict[str, Any] = {}
    n = int(mcfg.get("num_hidden_layers") or 0)
    kinds, rates = mcfg.get("layer_types"), mcfg.get("compress_rates") or {}
    if "compress_ratios" not in mcfg and isinstance(kinds, list) and isinstance(rates, dict):
        mtp = int(mcfg.get("num_nextn_predict_layers") or 0)
        extra["compress_ratios"] = [int(rates.get(k, 0)) for k in kinds[:n]] + [0] * mtp
    mlp = mcfg.get("mlp_layer_types")
    if "num_hash_layers" not in mcfg and isinstance(mlp, list):
        hashed = 0
        while hashed < len(mlp) and mlp[hashed] == "hash_moe":
            hashed += 1
        extra["num_hash_layers"] = hashed
    extra.setdefault("expert_dtype", mcfg.get("expert_dtype", "fp4"))
    extra.setdefault("topk_method", mcfg.get("topk_method", "noaux_tc"))
    extra["quantization_config"] = dict(V4_QUANTIZATION)
    return extra


# --------------------------------------------------------------------------------------- qwen36_meta.json
def qwen36_meta(
    config: dict[str, Any], shapes: dict[str, tuple[int, ...]], experts: str, group_size: int | None
) -> dict[str, Any]:
    """``qwen36_meta.json`` as ``c/tools/convert_qwen36.py`` writes it and ``c/qwen36.c`` ``load_meta`` reads it.

    ``config`` is the source's ``config.json``, ``shapes`` the source tensor shapes by their *written* names
    (head dims come from the first full-attention layer's weights, as the converter takes them), ``experts``
    the routed experts' format (``int8-row`` -> ``ebits`` 8, int4 -> 4; ``expert_gs`` the int4-grouped group
    size, 0 for row scales). Where transformers defines a key the converter defaults differently
    (``norm_topk_prob``, ``attn_output_gate``: Qwen3.5-MoE always renormalises and always gates; rope values that
    transformers 5 keeps in ``rope_parameters``), the value is the one transformers runs the model with
    (docs/FORMATS.md §4 Targets)."""
    mcfg = model_config.text_config(config)
    rope = mcfg.get("rope_parameters") or {}
    n = int(mcfg["num_hidden_layers"])
    layer_types = mcfg.get("layer_types") or [
        "full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)
    ]
    meta: dict[str, Any] = {
        "model_type": config.get("model_type"),
        "hidden": int(mcfg["hidden_size"]),
        "n_layers": n,
        "n_active": len(layer_types),
        "layer_types": list(layer_types),
        "num_experts": int(mcfg["num_experts"]),
        "topk": int(mcfg["num_experts_per_tok"]),
        "moe_inter": int(mcfg.get("moe_intermediate_size", mcfg.get("intermediate_size", 0) // 2)),
        "shared_inter": int(mcfg.get("shared_expert_intermediate_size", mcfg.get("moe_intermediate_size", 0))),
        "rms_eps": float(mcfg.get("rms_norm_eps", 1e-6)),
        "ebits": 8 if experts == INT8_ROW else 4,
        "scoring_func": mcfg.get("scoring_func", "softmax"),
        "n_group": int(mcfg.get("n_group", 1)),
        "topk_group": int(mcfg.get("topk_group", 1)),
        "norm_topk_prob": bool(mcfg.get("norm_topk_prob", True)),
        "attn_output_gate": bool(mcfg.get("attn_output_gate", True)),
        "rope_theta": float(rope.get("rope_theta", mcfg.get("rope_theta", 10000000.0))),
        "mrope_section": rope.get("mrope_section", [16, 16, 16]),
        "partial_rotary_factor": float(rope.get("partial_rotary_factor", mcfg.get("partial_rotary_factor", 0.25))),
    }
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    if full:
        base = f"model.layers.{full[0]}.self_attn"
        n_q, n_kv = int(mcfg["num_attention_heads"]), int(mcfg["num_key_value_heads"])
        meta["q_heads"], meta["kv_heads"] = n_q, n_kv
        for key, proj, heads in (("q_head_dim", "q_proj", n_q), ("k_head_dim", "k_proj", n_kv),
                                 ("v_head_dim", "v_proj", n_kv)):  # fmt: skip
            if f"{base}.{proj}.weight" in shapes:
                meta[key] = int(shapes[f"{base}.{proj}.weight"][0]) // heads
        if f"{base}.o_proj.weight" in shapes:
            meta["o_in"] = int(shapes[f"{base}.o_proj.weight"][1])
        if f"{base}.q_norm.weight" in shapes:
            meta["qk_rope_head_dim"] = int(shapes[f"{base}.q_norm.weight"][0])
        meta["head_dim"] = meta.get("k_head_dim", meta.get("q_head_dim", 256))
        meta["rope_dim"] = meta.get("qk_rope_head_dim", meta["head_dim"] // 4)
    meta[META_GROUP_SIZE] = int(group_size or 0)  # 0 = per-row scales; > 0 = group size along the input
    dn = {
        "dn_vheads": ("linear_num_value_heads", "num_value_heads"),
        "dn_kheads": ("linear_num_key_heads", "num_key_heads"),
        "dn_kdim": ("linear_key_head_dim", "key_head_dim"),
        "dn_vdim": ("linear_value_head_dim", "value_head_dim"),
        "dn_convk": ("linear_conv_kernel_dim", "conv_kernel_size"),
    }
    for key, (name, alias) in dn.items():
        meta[key] = int(mcfg.get(name, mcfg.get(alias, 0)))
    meta["dn_conv_dim"] = meta["dn_kheads"] * meta["dn_kdim"] * 2 + meta["dn_vheads"] * meta["dn_vdim"]
    return meta


def merged_group_size(folder: str | os.PathLike) -> int | None:
    """``expert_gs`` of a container's target metadata file (``qwen36_meta.json``), or None without one: what
    ``MergedLayout.identify`` needs to tell group sizes with equal counts apart. FormatError (one line) for a
    file that is not a JSON object or an ``expert_gs`` that is not a non-negative integer."""
    for target in TARGETS.values():
        if target.meta_file is None:
            continue
        path = Path(folder) / target.meta_file
        if not path.is_file():
            continue
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise FormatError(f"{path}: not readable JSON ({exc})") from None
        gs = meta.get(META_GROUP_SIZE) if isinstance(meta, dict) else None
        if not isinstance(meta, dict) or (gs is not None and (type(gs) is not int or gs < 0)):
            raise FormatError(f"{path}: {META_GROUP_SIZE} must be a non-negative integer in a JSON object")
        return gs
    return None
