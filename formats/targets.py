"""Output targets (``colitools convert --target NAME``, docs/FORMATS.md §4 "Targets"): one object per target.

A ``Target`` is everything the converter and the readers need of one colibri loader: which model types it runs,
which values of each recipe option it reads (anything else is refused before work starts, in one line naming the
option and the target: its own declaration, ``reads`` / ``why``), how its routed experts are laid out and read
back (an ``ExpertLayout`` of ``formats/expert_layouts.py``: per-projection records, merged blobs, fused stacks),
the names and float dtypes it writes (``rewrite``), the files it adds beside the shards (``config_files``,
``meta_files``) and its ``--help`` prose. ``--target NAME`` is resolved once (``by_name``, from the options);
the object travels: the recipe asks it for defaults and refusals, the planner for every tensor's ``rewrite`` and
every file's ``group``, the output writer for its files, ``resolve_container`` for the layouts to read.

``generic`` is the Hugging Face-named ``.qs`` container that ``c/colibri.c`` reads (``qt_from_disk`` /
``qt_resolve_fmt``); ``olmoe`` is the layout of colibri's OLMoE engine (``c/olmoe.c``), as its converter
``c/tools/convert_olmoe_merged.py`` writes it:

* dense tensors by their Hugging Face names, read by ``load_t`` through ``st_read_f32``, which accepts BF16, F16
  and F32 only (a U8 ``.qs`` weight is refused: "not a float tensor");
* per routed expert one merged int8 blob ``model.layers.{L}.mlp.experts.{E}.merged_weight`` (I8, 1-D,
  ``2*I*H + H*I`` bytes: gate ``[I, H]``, up ``[I, H]``, down ``[H, I]`` row-major, back to back) and its scales
  ``model.layers.{L}.mlp.experts.{E}.qs`` (F32, 1-D, ``I + I + H``: gate rows, up rows, down rows), read by
  ``load_expert_merged`` (byte counts checked exactly against ``intermediate_size`` / ``hidden_size``) and
  used as ``w[o, i] = q[o, i] * scale[o]`` by ``matmul_q``: int8-row (docs/FORMATS.md §2).

Numpy-free (the CLI imports it for its help text).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from colitools.formats import families, model_config, names
from colitools.formats.errors import FormatError, TargetRefused
from colitools.formats.expert_layouts import (  # re-exported: the layouts' facts, read by the runtime and mirror
    FUSED,
    INT4_GROUPED,
    INT4_ROW,
    INT8_ROW,
    MERGED,
    PAIRS,
    SIGNED_NIBBLE_XOR,
    ExpertLayout,
    ExpertRecord,
    FusedLayout,
    Grouped,
    MergedLayout,
    MergedPart,
    PlannedTensor,
    Spelling,
    written_as,
)
from colitools.formats.filenames import CONFIG_FILE
from colitools.formats.format_names import GROUP_SIZES
from colitools.formats.jsonfile import load_json_object

__all__ = [
    "DEEPSEEK_V4", "DEEPSEEK_V41", "FUSED", "GENERIC", "GENERIC_NAME", "GLM53", "INKLING", "INT4_GROUPED", "INT4_ROW", "INT8_ROW",
    "KIMI_K3", "MERGED", "QWEN36", "QWEN38", "SIGNED_NIBBLE_XOR", "TARGETS", "TARGET_NAMES", "FusedLayout", "MergedLayout",
    "MergedPart", "MetaFile", "Rewrite", "Spelling", "Target", "by_name", "merged_group_size",
]  # fmt: skip

GENERIC_NAME = "generic"
QWEN36 = "qwen36"
KIMI_K3 = "kimi_k3"
GLM53 = "glm53"
DEEPSEEK_V4 = "deepseek_v4"
INKLING = "inkling"
QWEN38 = "qwen38"
DEEPSEEK_V41 = "deepseek_v41"
META_GROUP_SIZE = "expert_gs"  # qwen36_meta.json: the int4 experts' group size, 0 = row scales
HF_CONFIG_FILE = "config.hf.json"  # the source's config.json next to a flat one (``Target.flat_config``)
FORMAT_OPTIONS = ("experts", "dense", "embed", "mtp")  # the recipe's format options (docs/FORMATS.md §5)
FLOAT_OPTIONS = ("dense", "embed", "mtp")


def _floats(*values: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``reads`` entries giving ``--dense`` / ``--embed`` / ``--mtp`` the same values."""
    return tuple((option, values) for option in FLOAT_OPTIONS)


# DeepSeek-V4's released routed experts (what c/deepseek_v4.c's expert store reads, ``expert_record_bytes``:
# ``layers.{L}.ffn.experts.{E}.w{1,2,3}.weight`` / ``.scale``): mxfp4 bytes (docs/FORMATS.md §2.7: E2M1 pairs,
# low nibble = even input as native_quant.c ``coli_fp4_matvec_ref`` reads them, one E8M0 byte per 32 inputs) as
# I8 ``[O, I/2]`` and F8_E8M0 ``[O, I/32]``.
V4_FP4_EXPERTS = Spelling(".weight", "I8", ".scale", "F8_E8M0", "mxfp4")

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
class Rewrite:
    """How a target writes one planned tensor (``Target.rewrite``): its written name and expert base, and at
    most one change of what the recipe chose: ``float_dtype`` (``bf16`` / ``f32``: the loader's float dtype for
    it), ``keep_float`` (the loader reads it only as float: its source float dtype where its bytes can be kept,
    else f32), ``instead`` (a recipe option it is written as, recorded as a fallback with ``reason``) or
    ``spelling`` (the loader's tensor names and dtypes for its format's bytes)."""

    name: str
    expert_base: str | None
    float_dtype: str | None = None
    keep_float: bool = False
    instead: str | None = None
    reason: str | None = None
    spelling: Spelling | None = None


@dataclass(frozen=True)
class MetaFile:
    """An engine's own metadata file beside the shards: ``name`` and ``build(config, shapes, experts,
    group_size)`` -> its JSON object (``shapes``: the source tensors' shapes by their written names;
    ``experts`` / ``group_size``: the format of the written routed experts)."""

    name: str
    build: Callable[[dict[str, Any], dict[str, tuple[int, ...]], str, int | None], dict[str, Any]]


@dataclass(frozen=True)
class Target:
    """One ``--target``: the colibri loader it follows, what that loader can read, and how it is written.

    ``reads``: per recipe option (``experts``, ``dense``, ``embed``, ``mtp``, ``layout``, ``towers``) the values
    the loader reads (an option not listed: any), ``why`` the reason given when another is refused (default
    "``loader`` reads ... there"); ``defaults``: this target's defaults (an option with one value read defaults
    to it). ``experts``: the routed experts' layout. Renames (``rename``: source prefixes, first match, then
    ``name_map``: a formats/names.py table, None for a tensor the loader looks up by no name), the loader's float
    dtype per written leaf (``float_dtypes``, whatever the role), leaves it reads only as float
    (``source_float_leaves``), its int4 rule for non-expert tensors (``int4_group``: only int4-g{n} at
    ``I % n == 0``, else ``int4_fallback``, recorded) and ``drop_mtp`` are applied by ``rewrite`` and the planner;
    ``flat_config`` / ``config_extra`` / ``meta`` by ``config_files`` / ``meta_files``. ``refused``: a target
    colitools knows but does not write (why, and what to do instead)."""

    name: str
    loader: str  # the colibri function(s) that read this layout
    help: str = ""  # what the layout holds, as `colitools targets` shows it
    model_types: tuple[str, ...] | None = None  # None: any model type
    reads: tuple[tuple[str, tuple[str, ...]], ...] = ()
    why: tuple[tuple[str, str], ...] = ()
    defaults: tuple[tuple[str, str], ...] = ()
    experts: ExpertLayout = PAIRS
    drop_mtp: bool = False  # the converter leaves MTP modules out (listed like dropped towers)
    rename: tuple[tuple[str, str], ...] = ()
    name_map: Callable[[str], str | None] | None = None
    float_dtypes: tuple[tuple[str, str], ...] = ()  # (leaf name (``leaf_key``), bf16 / f32)
    source_float_leaves: tuple[str, ...] = ()
    int4_group: int | None = None
    int4_fallback: str = INT8_ROW  # a recipe option
    flat_config: bool = False  # config.json is the text config, flat (the source's goes to config.hf.json)
    config_extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # config.json keys it reads
    meta: MetaFile | None = None
    refused: str | None = None
    engine_formats: tuple[str, ...] | None = None  # registry names the engine reads (None: any); else refused
    config_check: Callable[[dict[str, Any]], str | None] | None = None  # why the engine cannot run a config
    # why the engine cannot run with the source's side files: (config, read(name) -> JSON object or None)
    side_check: Callable[[dict[str, Any], Callable[[str], Any]], str | None] | None = None
    tokenizer_stub: bool = False  # the engine loads tokenizer.json in every mode: an id-only one when absent
    # its engine multiplies codes by a negative scale as by a positive one, shown by running it on such output
    # (FORMATS §9): ``--quantizer mse`` may then write negative scales (pairs layout only), else positive ones
    signed_scales: bool = False

    # ------------------------------------------------------------------------------------ options, sources
    def check_writable(self) -> None:
        """TargetRefused (one line) for a target colitools does not write (``refused``)."""
        if self.refused is not None:
            raise TargetRefused(f"`target={self.name}` is refused: {self.refused}")

    def allowed(self, option: str) -> tuple[str, ...] | None:
        """The values of ``option`` this target's loader reads (None: any)."""
        return dict(self.reads).get(option)

    def default(self, option: str) -> str | None:
        """This target's default for ``option``: declared, else the one value its loader reads, else None (the
        recipe's own default)."""
        value, allowed = dict(self.defaults).get(option), self.allowed(option)
        return value if value is not None or allowed is None or len(allowed) != 1 else allowed[0]

    def check_option(self, option: str, value: str) -> None:
        """TargetRefused (one line naming the option and the target) when this target cannot honour
        ``--option value``."""
        allowed = self.allowed(option)
        if allowed is not None and value not in allowed:
            why = dict(self.why).get(option) or f"{self.loader} reads {' or '.join(allowed)} there"
            raise TargetRefused(f"`target={self.name}`: `{option}={value}` is refused: {why}")

    def check_model_type(self, model_type: str | None) -> None:
        """TargetRefused (one line) when the source's ``model_type`` is not one this target's engine runs."""
        if self.model_types is not None and model_type not in self.model_types:
            raise TargetRefused(
                f"`target={self.name}` is for model_type {', '.join(self.model_types)} ({self.loader}); "
                f"the source is {model_type!r}"
            )

    def check_source(self, config: dict[str, Any]) -> None:
        """TargetRefused (one line) for a source this target's engine cannot run: another model type
        (``check_model_type``) or a config its engine misreads (``config_check``)."""
        self.check_model_type(model_config.model_type(config))
        why = self.config_check(model_config.text_config(config)) if self.config_check is not None else None
        if why is not None:
            raise TargetRefused(f"`target={self.name}`: the source is refused: {why}")

    def check_side_files(self, config: dict[str, Any], read: Callable[[str], Any]) -> None:
        """TargetRefused (one line) when a file the engine reads beside ``config.json`` is missing from the source
        or disagrees with its config (``side_check``; ``read(name)``: the source file's JSON, None if absent)."""
        why = self.side_check(model_config.text_config(config), read) if self.side_check is not None else None
        if why is not None:
            raise TargetRefused(f"`target={self.name}`: the source is refused: {why}")

    def check_format(self, job: PlannedTensor) -> None:
        """TargetRefused (one line naming the tensor and its format) when ``job`` would be written in a format
        this target's engine has no reader for (``engine_formats``)."""
        fmt = job.target.fmt
        if self.engine_formats is None or fmt in self.engine_formats or job.target.is_float:
            return
        raise TargetRefused(
            f"`target={self.name}`: tensor {job.source.name} would be written as {fmt}, which {self.loader} "
            f"does not read (it reads {', '.join(self.engine_formats)}); choose another format, or convert "
            f"without a target for colitools' own readers"
        )

    def engine_files(self, copied: Sequence[str], config: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Files the engine needs that the source lacks, by name (``tokenizer_stub``: an id-only
        ``tokenizer.json`` when none was copied)."""
        if not self.tokenizer_stub or TOKENIZER_FILE in copied:
            return {}
        return {
            TOKENIZER_FILE: id_only_tokenizer(int(model_config.text_config(config).get("vocab_size") or 0))
        }

    # ------------------------------------------------------------------------------------------ names
    def out_name(self, name: str) -> str | None:
        """The name this target writes for a source tensor name: ``rename`` (first match), then ``name_map``
        (None when the loader looks up no such tensor)."""
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

    # ------------------------------------------------------------------------------------------ writing
    def rewrite(self, job: PlannedTensor) -> Rewrite | None:
        """How this target writes planned tensor ``job`` (its recipe name and format): renamed, in the loader's
        float dtype, kept float, re-chosen by the int4 rule, or in the loader's expert spelling; None when it
        is written as planned. TargetRefused (one line) for a tensor the loader looks up by no name."""
        name, base = job.out_name, job.expert_base
        if self.rename or self.name_map is not None:
            out = self.out_name(name)
            if out is None:
                raise TargetRefused(
                    f"`target={self.name}`: tensor {job.source.name} ({name}) has no name {self.loader} looks up "
                    f"(formats/names.py); convert it with `target=generic`"
                )
            if base is not None:  # a table of whole names (Inkling's) maps no prefix: the name's own base
                base = self.out_name(base) or names.parse_name(out).expert_base
            name = out
        t = job.target
        want = self.float_dtype(name)
        if want is not None and not t.is_source:  # the loader's dtype check, whatever the recipe's role
            return Rewrite(name, base, float_dtype=want)
        self.check_format(job)  # (a tensor the loader reads as a float above is written float, whatever its format)
        leaves = self.source_float_leaves
        if leaves and names.parse_name(job.source.name).leaf in leaves and not t.is_float:
            return Rewrite(name, base, keep_float=True)  # quantized by the recipe: not here
        g = self.int4_group
        if (
            g
            and not job.routed
            and t.fmt in (INT4_ROW, INT4_GROUPED)
            and not written_as(t, job.I, (f"int4-g{g}",))
        ):
            reason = f"{self.loader} reads int4 only as int4-g{g} with I % {g} == 0 (I = {job.I})"
            return Rewrite(name, base, instead=self.int4_fallback, reason=reason)
        spelling = self.experts.spelling_for(job)
        if spelling is None and (name, base) == (job.out_name, job.expert_base):
            return None
        return Rewrite(name, base, spelling=spelling)

    def group(self, groups: Sequence[Sequence[PlannedTensor]]) -> list[Grouped]:
        """One output file's groups of planned tensors as this target writes them (``experts.group``)."""
        return self.experts.group(groups, self)

    def config_files(self, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The config files written beside the shards, by file name, in writing order: ``config.json`` without
        ``quantization_config`` (the source's is recorded in the manifest); with ``flat_config`` the text config
        flat there and the source's as ``config.hf.json``, as its converter writes them; with ``config_extra``
        the keys its loader reads added (``deepseek_v4``: the released checkpoint's, its
        ``quantization_config`` included)."""
        clean = {k: v for k, v in config.items() if k != "quantization_config"}
        files: dict[str, dict[str, Any]] = {}
        if self.flat_config:
            files[HF_CONFIG_FILE] = clean
            clean = {k: v for k, v in model_config.text_config(clean).items() if k != "quantization_config"}
        if self.config_extra is not None:
            clean = {**clean, **self.config_extra(clean)}
        files[CONFIG_FILE] = clean
        return files

    def meta_files(
        self, config: dict[str, Any], shapes: dict[str, tuple[int, ...]], experts: str, group_size: int | None
    ) -> dict[str, dict[str, Any]]:
        """The engine's own metadata file(s) by file name (``meta``; none for most targets)."""
        if self.meta is None:
            return {}
        return {self.meta.name: self.meta.build(config, shapes, experts, group_size)}

    @property
    def engine(self) -> str:
        """The colibri engine's source file that reads this layout (``c/olmoe.c``): the loader's first word."""
        return self.loader.split()[0]

    def describe(self) -> dict[str, Any]:
        """What ``colitools targets`` shows of this target (its ``--json``: these keys): the engine, the functions
        that read the layout, the model types it runs (None: any), the layout's prose, why it is refused."""
        return {
            "name": self.name,
            "engine": self.engine,
            "loader": self.loader,
            "model_types": list(self.model_types) if self.model_types is not None else None,
            "help": self.help,
            "refused": self.refused,
        }


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
    ``hash_moe`` layers of ``mlp_layer_types``), ``expert_dtype`` ``fp4``, ``topk_method`` ``noaux_tc``,
    ``rope_scaling`` (``deepseek_v4_rope_scaling``) and ``quantization_config`` (``V4_QUANTIZATION``). Keys the source already has are kept as they are."""
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
    if not isinstance(mcfg.get("rope_scaling"), dict):
        extra["rope_scaling"] = deepseek_v4_rope_scaling(mcfg)
    extra.setdefault("expert_dtype", mcfg.get("expert_dtype", "fp4"))
    extra.setdefault("topk_method", mcfg.get("topk_method", "noaux_tc"))
    extra["quantization_config"] = dict(V4_QUANTIZATION)
    return extra


V4_YARN_BETAS = (32, 1)  # DeepSeek-V4's released beta_fast / beta_slow (inert at factor 1)


def deepseek_v4_rope_scaling(mcfg: dict[str, Any]) -> dict[str, Any]:
    """``rope_scaling`` as the released config spells it and ``coli_v4_config_parse`` requires it (an object
    with ``factor``, ``beta_fast``, ``beta_slow`` (integers) and ``original_max_position_embeddings``), from
    transformers 5.24's ``rope_parameters`` (the compressed layers' ``compress`` entry, where c/deepseek_v4.c
    applies YaRN, else ``main``, else the flat dict). A rope without YaRN gets ``factor`` 1.0, with which the
    engine's ``rope_frequency`` is the plain frequency whatever the betas, and ``original_max_position_embeddings``
    = ``max_position_embeddings``."""
    params = mcfg.get("rope_parameters") or {}
    rope = next((params[k] for k in ("compress", "main") if isinstance(params.get(k), dict)), params)
    rope = rope if isinstance(rope, dict) and rope.get("rope_type") == "yarn" else {}
    return {
        "type": "yarn",
        "factor": float(rope.get("factor", 1.0)),
        "beta_fast": int(rope.get("beta_fast", V4_YARN_BETAS[0])),
        "beta_slow": int(rope.get("beta_slow", V4_YARN_BETAS[1])),
        "original_max_position_embeddings": int(
            rope.get("original_max_position_embeddings", mcfg.get("max_position_embeddings") or 0)
        ),
    }


# ----------------------------------------------------------------------------------------- glm53 config
# c/glm53.c load_cfg reads the KDA geometry from text_config.linear_attn_config (required: num_heads, head_dim,
# short_conv_kernel_size; gate_lower_bound defaults to -5), where a transformers 5.24 glm5_next config has flat keys
GLM53_KDA_KEYS = (("num_heads", "linear_num_heads"), ("head_dim", "linear_head_dim"),
                  ("short_conv_kernel_size", "linear_conv_kernel_dim"), ("gate_lower_bound", "linear_lower_bound"))  # fmt: skip


def glm53_config(config: dict[str, Any]) -> dict[str, Any]:
    """``linear_attn_config`` as c/glm53.c ``load_cfg`` reads it (``GLM53_KDA_KEYS``, from the flat
    ``linear_*`` keys), added to the text config (``text_config`` of a multimodal config, else the top level)
    when the source has none; the flat keys stay, for colitools' own readers. Nothing when the source already
    has one (a hub config), or has no flat KDA keys to derive it from. No ``full_attn_layers`` / ``kda_layers``:
    the engine takes the layer kinds from ``layer_types`` and only cross-checks those optional lists."""
    text = model_config.text_config(config)
    if isinstance(text.get("linear_attn_config"), dict):
        return {}
    if any(text.get(flat) is None for _, flat in GLM53_KDA_KEYS[:3]):  # the three it requires
        return {}
    kda = {key: text[flat] for key, flat in GLM53_KDA_KEYS if text.get(flat) is not None}
    if text is config:
        return {"linear_attn_config": kda}
    return {"text_config": {**text, "linear_attn_config": kda}}


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
        "shared_inter": int(
            mcfg.get("shared_expert_intermediate_size", mcfg.get("moe_intermediate_size", 0))
        ),
        "rms_eps": float(mcfg.get("rms_norm_eps", 1e-6)),
        "ebits": 8 if experts == INT8_ROW else 4,
        "scoring_func": mcfg.get("scoring_func", "softmax"),
        "n_group": int(mcfg.get("n_group", 1)),
        "topk_group": int(mcfg.get("topk_group", 1)),
        "norm_topk_prob": bool(mcfg.get("norm_topk_prob", True)),
        "attn_output_gate": bool(mcfg.get("attn_output_gate", True)),
        "rope_theta": float(rope.get("rope_theta", mcfg.get("rope_theta", 10000000.0))),
        "mrope_section": rope.get("mrope_section", [16, 16, 16]),
        "partial_rotary_factor": float(
            rope.get("partial_rotary_factor", mcfg.get("partial_rotary_factor", 0.25))
        ),
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


# ------------------------------------------------------------------------------------ qwen38 config.json
def qwen38_config(config: dict[str, Any]) -> dict[str, Any]:
    """c/qwen38_core.h ``q38_load_cfg`` takes ``layer_types`` entries ``linear_attention`` / ``full_attention`` /
    ``qwen_sparse_attention`` only: the QSA layers, whatever their spelling in the source (transformers 5.24's
    ``indexed_attention``, 5.16.1's ``qwen_sparse_attention``: the family's ``layer_type_aliases``), are written
    as the release's ``full_attention``, as ``--target qwen38``'s help promises (transformers and colitools read
    that as indexed attention too)."""
    text = model_config.text_config(config)
    types = text.get("layer_types")
    if not isinstance(types, list):
        return {}
    qsa = "indexed_attention"
    aliases = families.QWEN38.layer_type_aliases
    spelled_types = ["full_attention" if qsa in (t, aliases.get(t)) else t for t in types]
    if spelled_types == types:
        return {}
    spelled = {**text, "layer_types": spelled_types}
    return {"text_config": spelled} if text is not config else spelled


# ----------------------------------------------------------------------- what an engine cannot run or lacks
TOKENIZER_FILE = "tokenizer.json"
ID_TOKEN = "<|id_{}|>"  # the id-only tokenizer's token for id N


def id_only_tokenizer(vocab_size: int) -> dict[str, Any]:
    """A ``tokenizer.json`` of ``vocab_size`` tokens ``<|id_N|>`` (a WordLevel model, no merges): what
    c/tok.h ``tok_load`` needs to start an engine that loads one in every mode (``c/deepseek_v4.c``'s main, even
    with ``--oracle``) when the source ships none; it names ids, it knows no text."""
    unk = ID_TOKEN.format(0)
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {ID_TOKEN.format(i): i for i in range(vocab_size)}, "unk_token": unk},
    }  # fmt: skip


def olmoe_heads(config: dict[str, Any]) -> str | None:
    """c/olmoe.c reads no ``num_key_value_heads``: it multiplies ``k_proj`` / ``v_proj`` as ``[hidden,
    hidden]`` (``model_init``, ``attention``), so a grouped-query config would be read past both buffers."""
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads", heads)
    if kv == heads:
        return None
    return (
        f"num_key_value_heads {kv} != num_attention_heads {heads}: c/olmoe.c multiplies k_proj / v_proj as "
        f"[hidden, hidden] (it reads no num_key_value_heads)"
    )


# ------------------------------------------------------------------------------------------- deepseek_v41
# c/deepseek_v41.c model_load / spec_load (a4306c8): the float matrices ``wb_load`` reads as raw BF16 (exactly
# ``O*I*2`` bytes: an F16 or F32 tensor would be refused or misread) and the small tensors ``wf_load`` reads through
# ``st_read_f32`` (F32, BF16 or F16 widened), written F32; by leaf (``layers.{L}.`` / ``mtp.{S}.`` stripped). The
# FP8 matrices (``w8_load``: ``attn.wq_a`` / ``wq_b`` / ``wkv`` / ``wo_a`` / ``wo_b``, ``attn.indexer.wq_b``,
# ``ffn.shared_experts.w1`` / ``w2`` / ``w3``, ``engram.wkv``, ``mtp.0.main_proj``) and the engram tables
# (``engram_table_open``) keep the source's FP8 (``--dense native``: fp8-e4m3-e8m0-t32 / -r32, byte for byte).
V41_FLOAT_DTYPES: dict[str, str] = {
    **dict.fromkeys((
        "embed.weight", "head.weight", "ffn.gate.weight", "attn.compressor.wkv.weight",
        "attn.compressor.wgate.weight", "attn.indexer.wk.weight", "attn.indexer.weights_proj.weight",
        "markov_head.embed.weight", "markov_head.head.weight", "confidence_head.proj.weight",
    ), "bf16"),
    **dict.fromkeys((
        "attn.attn_sink", "ffn.gate.bias", "hc_attn_base", "hc_attn_fn", "hc_attn_scale", "hc_ffn_base",
        "hc_ffn_fn", "hc_ffn_scale", "engram.q_weight", "engram.k_weight",
    ), "f32"),
}  # fmt: skip
V41_ENGRAM_FILE = "dsv41_engram.json"  # engram_load_sidecar: the hash tables (c/tools/prepare_dsv41.py writes it)
# the engine's compiled maxima (V41_MAX_LAYERS / _ENGRAM / _NGRAM / _EHEADS, moe_run_at's ``chosen[64]``,
# compressor_run's ``kv[512]``, attention_run's ``key[512]``, engram_row's ``bytes[512]``, vision's ``[4096]``)
V41_LIMITS = {"layers": 64, "tables": 4, "ngram": 8, "engram_heads": 16, "topk": 64, "dim512": 512, "vision": 4096}


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


# c/colibri.c qt_resolve_fmt's formats (FMT_NAMES: 0-6 and 8; floats as F32 / BF16 / F16 through
# st_read_f32): no mxfp4 (ord 7 is Vulkan-only in c/kimi_k3.c, no .qs pair) and no fp8-e4m3-e8m0 (``.scale``
# F8_E8M0, a name qt_from_disk never looks up)
COLIBRI_C_FORMATS = (
    "f32", "int8-row", "int4-row", "int2-row", "int4-grouped", "int3-g64", "e8-iq3-lattice", "fp8-e4m3-b128",
)  # fmt: skip

PAIRS_ONLY = (("layout", ("pairs",)),)  # every family engine reads pairs experts from the main container
DROPPED_TOWERS = "its converter leaves the multimodal towers out (`towers=drop`)"  # qwen36: visual.*

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            GENERIC_NAME,
            "c/colibri.c qt_from_disk / qt_resolve_fmt",
            help="Hugging Face names, every format c/colibri.c reads: named explicitly it refuses mxfp4 and "
            "fp8-e8m0, which c/colibri.c lacks (the default, no target, writes them for colitools' readers).",
            engine_formats=COLIBRI_C_FORMATS,
            # c/colibri.c @ 4ef9a99 ran mse outputs with signed scales token-exact (docs/FORMATS.md §11)
            signed_scales=True,
        ),
        Target(
            "olmoe",
            "c/olmoe.c (model_init's load_t, load_expert_merged)",
            help="merged int8 experts (...experts.{E}.merged_weight + .qs), dense tensors f32 or bf16; model_type "
            "olmoe only.",
            model_types=("olmoe",),
            reads=(("experts", (INT8_ROW,)), *_floats("f32", "bf16"), *PAIRS_ONLY),
            defaults=(("experts", INT8_ROW), ("dense", "f32"), ("embed", "f32"), ("mtp", "f32")),
            experts=MERGED,
            config_check=olmoe_heads,
            signed_scales=True,  # c/olmoe.c @ 4ef9a99: merged int8 experts, ~41% negative scales, token-exact
        ),
        Target(
            QWEN36,
            "c/qwen36.c (load_cfg, load_meta, model_init's load_t_n, load_expert_merged)",
            help="merged int8-row / int4-row / int4-g{gs} experts (signed nibbles), float dense tensors renamed "
            "model.language_model. -> model., flat config.json, qwen36_meta.json; model_type qwen3_5_moe only.",
            model_types=("qwen3_5_moe", "qwen3_5_moe_text"),
            reads=(
                ("experts", (INT8_ROW, INT4_ROW, *(f"int4-g{g}" for g in GROUP_SIZES))),
                *_floats("f32", "bf16"),
                *PAIRS_ONLY,
                ("towers", ("drop",)),
            ),
            why=(("towers", f"c/qwen36.c runs the text model only: {DROPPED_TOWERS}"),),
            defaults=(("experts", INT4_ROW), ("dense", "f32"), ("embed", "f32"), ("mtp", "f32")),
            experts=MERGED,
            rename=(("model.language_model.", "model."),),
            flat_config=True,
            meta=MetaFile("qwen36_meta.json", qwen36_meta),
        ),
        Target(
            KIMI_K3,
            "c/kimi_k3.c (w_load, f32_load, expert_table_init)",
            help="mxfp4 experts in the engine's slot order, f32_load tensors kept float, int8-row or int4-g64 "
            "(I % 64 == 0) projections; model_type kimi_k3 only.",
            model_types=("kimi_k3",),
            reads=(
                ("experts", ("mxfp4", "native")),
                *_floats("f32", "bf16", INT8_ROW, "int4-g64"),
                *PAIRS_ONLY,
            ),
            defaults=(("experts", "mxfp4"), ("dense", INT8_ROW), ("embed", INT8_ROW), ("mtp", INT8_ROW)),
            # w1p w1s w2p w2s w3p w3s (w2 is down, w3 up)
            experts=ExpertRecord(formats=("mxfp4",), order=("gate", "down", "up")),
            source_float_leaves=(
                "embed_tokens",
                "f_a_proj",
                "f_b_proj",
                "b_proj",
                "self_attention_res_proj",
                "mlp_res_proj",
                "output_attn_res_proj",
            ),
            int4_group=64,
        ),
        Target(
            GLM53,
            "c/glm53.c (load_f32, load_mat, absorb_kvb, expert_geometry / expert_table_init)",
            help="int4-g64 experts in the engine's slot order, float or int4-g64 projections, "
            "text_config.linear_attn_config added; model_type glm5_next only.",
            model_types=("glm5_next", "glm5_next_text"),
            reads=(("experts", ("int4-g64",)), *_floats("f32", "bf16", "int4-g64"), *PAIRS_ONLY),
            defaults=(("experts", "int4-g64"), ("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
            # gate.w gate.qs up.w up.qs down.w down.qs
            experts=ExpertRecord(formats=("int4-g64",), order=("gate", "up", "down")),
            source_float_leaves=("embed_tokens", "kv_b_proj"),
            int4_group=64,
            int4_fallback="bf16",
            config_extra=glm53_config,
        ),
        Target(
            DEEPSEEK_V4,
            "c/deepseek_v4.c (coli_v4_layer_plan / coli_v4_layer_validate, coli_tensor_load_fp8, "
            "coli_tensor_load_f32, coli_v4_head_cache_load, expert_record_bytes)",
            help="the released checkpoint's names and dtypes (fp8-e8m0 projections: F8_E4M3 + F8_E8M0 .scale per "
            "128x128 block, mxfp4 experts as I8 .weight + F8_E8M0 .scale, BF16 norms / router / compressor, F32 "
            "sinks and hc_*), config.json with compress_ratios / num_hash_layers; model_type deepseek_v4 only.",
            model_types=("deepseek_v4",),
            reads=(
                ("experts", ("mxfp4",)),
                ("dense", (V4_FP8,)),
                ("mtp", (V4_FP8,)),
                ("embed", ("bf16",)),
                *PAIRS_ONLY,
            ),  # embed: find_head takes a BF16 head only
            defaults=(("experts", "mxfp4"), ("dense", V4_FP8), ("embed", "bf16"), ("mtp", V4_FP8)),
            experts=ExpertRecord(formats=("mxfp4",), spelling=V4_FP4_EXPERTS),
            name_map=names.deepseek_v4_released_name,
            float_dtypes=tuple(V4_FLOAT_DTYPES.items()),
            config_extra=deepseek_v4_config,
            tokenizer_stub=True,
        ),
        Target(
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
            float_dtypes=tuple(V41_FLOAT_DTYPES.items()),
            engine_formats=("fp8-e4m3-e8m0-t32", "fp8-e4m3-e8m0-r32", "mxfp4"),
            config_check=deepseek_v41_check,
            side_check=deepseek_v41_side_files,
        ),
        Target(
            INKLING,
            "c/inkling.c (load_cfg; model_init's load_w / load_t and container detection; slot_fill)",
            help="the text names c/inkling.c looks up, one fused expert stack per layer (gate_up_proj / down_proj: "
            "int4-row or int8-row U8 rows + .qs, or f32 / bf16), shared experts as float stacks, towers and MTP "
            "left out; model_type inkling_mm_model only.",
            model_types=("inkling", "inkling_mm_model", "inkling_text"),
            # convert_inkling_int4.py --xbits 4 / 8 / 0; MTP modules are left out whatever the recipe says, so
            # --mtp takes only the value recorded for them
            reads=(
                ("experts", (INT4_ROW, INT8_ROW, "f32", "bf16")),
                ("dense", ("f32", "bf16")),
                ("embed", ("f32", "bf16")),
                ("mtp", ("bf16",)),
                *PAIRS_ONLY,
                ("towers", ("drop",)),
            ),
            why=(
                ("towers", f"c/inkling.c reads no tower from the container: {DROPPED_TOWERS}"),
                ("mtp", "c/inkling.c reads no MTP modules: its converter leaves them out (model.mtp.)"),
            ),
            defaults=(("experts", INT4_ROW), ("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
            experts=FUSED,
            name_map=names.inkling_text_name,
            drop_mtp=True,
            signed_scales=True,  # c/inkling.c @ 4ef9a99: int4-row / int8-row experts, ~45% negative, token-exact
        ),
        Target(
            QWEN38,
            "c/qwen38.c (qwen38_core.h q38_load_cfg, q38_load_weight / q38_load_tensor, q38_load_ple, "
            "q38_expert_int4_attach)",
            help="the release's names with float resident weights (bf16 / f32: q38_load_weight reads no codes), "
            "PLE n-gram shards float, I64 PLE hash buffers, routed experts int4-g64 only in the experts-int4g64/ "
            "sidecar (Q38_INT4_DIR), layer_types spelled full_attention; model_type qwen4_exp only.",
            model_types=("qwen4_exp", "qwen4_exp_text"),
            reads=(("experts", ("int4-g64",)), *_floats("bf16", "f32"), ("layout", ("planar",))),
            why=(("layout", "c/qwen38.c reads int4 routed experts from the experts-int4g64/ sidecar only"),),
            defaults=(("dense", "bf16"), ("embed", "bf16"), ("mtp", "bf16")),
            config_extra=qwen38_config,
        ),
    )
}
TARGET_NAMES = tuple(TARGETS)
# the default (no --target): the generic names and every format colitools' own readers read
GENERIC = replace(TARGETS[GENERIC_NAME], engine_formats=None)
EXPERT_READERS: tuple[ExpertLayout, ...] = (FUSED, MERGED)  # the layouts resolve_container claims tensors for
# the targets' spellings of a format's two tensors, which resolve_container pairs by name and dtype
SPELLINGS: tuple[Spelling, ...] = tuple(
    dict.fromkeys(t.experts.spelling for t in TARGETS.values() if t.experts.spelling)
)


def by_name(name: str) -> Target:
    """The target called ``name`` (``--target NAME``); TargetRefused (one line) naming the choices."""
    try:
        return TARGETS[name]
    except KeyError:
        raise TargetRefused(f"`target={name!r}`: choose one of {', '.join(TARGET_NAMES)}") from None


def merged_group_size(folder: str | os.PathLike) -> int | None:
    """``expert_gs`` of a container's target metadata file (``qwen36_meta.json``), or None without one: what
    ``MergedLayout.identify`` needs to tell group sizes with equal counts apart. FormatError (one line) for a
    file that is not a JSON object or an ``expert_gs`` that is not a non-negative integer."""
    for target in TARGETS.values():
        if target.meta is None:
            continue
        path = Path(folder) / target.meta.name
        if not path.is_file():
            continue
        gs = load_json_object(path).get(META_GROUP_SIZE)
        if gs is not None and (type(gs) is not int or gs < 0):
            raise FormatError(f"{path}: {META_GROUP_SIZE} must be a non-negative integer in a JSON object")
        return gs
    return None
