"""What every target module shares (``formats/targets/``, one module per colibri engine): the ``Target`` class,
its ``Rewrite`` and ``MetaFile``, the recipe options a target reads, and the constants and helpers several targets
use. The package's ``__init__`` assembles ``TARGETS`` from the engine modules."""


from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from colitools.formats import model_config, names
from colitools.formats.errors import TargetRefused
from colitools.formats.expert_layouts import (  # re-exported: the layouts' facts, read by the runtime and mirror
    INT4_GROUPED,
    INT4_ROW,
    INT8_ROW,
    PAIRS,
    ExpertLayout,
    Grouped,
    PlannedTensor,
    Spelling,
    written_as,
)
from colitools.formats.filenames import CONFIG_FILE

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


# what an engine lets differ among the routed experts' formats: each projection of each expert ("tensor"), each
# expert (its projections alike: "expert"), each layer (every expert of a layer alike: "layer"), nothing ("uniform")
EXPERT_GRANULARITIES = ("tensor", "expert", "layer", "uniform")


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
    group_size, down)`` -> its JSON object (``shapes``: the source tensors' shapes by their written names;
    ``experts`` / ``group_size``: the format of the written routed experts; ``down``: their down projections'
    format when it is another, a merged blob's mixed slab, else None)."""

    name: str
    build: Callable[[dict[str, Any], dict[str, tuple[int, ...]], str, int | None, str | None], dict[str, Any]]


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
    # the grain at which its engine lets the routed experts' formats differ (``EXPERT_GRANULARITIES``), read in its
    # loader (each target module cites the lines): a size budget (docs/FORMATS.md §12) chooses at this grain
    expert_granularity: str = "tensor"

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
        self, config: dict[str, Any], shapes: dict[str, tuple[int, ...]], experts: str, group_size: int | None,
        down: str | None = None,
    ) -> dict[str, dict[str, Any]]:  # fmt: skip
        """The engine's own metadata file(s) by file name (``meta``; none for most targets)."""
        if self.meta is None:
            return {}
        return {self.meta.name: self.meta.build(config, shapes, experts, group_size, down)}

    @property
    def engine(self) -> str:
        """The colibri engine's source file that reads this layout (``c/olmoe.c``): the loader's first word."""
        return self.loader.split()[0]

    def describe(self) -> dict[str, Any]:
        """What ``colitools targets`` shows of this target (its ``--json``: these keys): the engine, the functions
        that read the layout, the model types it runs (None: any), the layout's prose, why it is refused, the grain
        at which its engine lets the routed experts' formats differ."""
        return {
            "name": self.name,
            "engine": self.engine,
            "loader": self.loader,
            "model_types": list(self.model_types) if self.model_types is not None else None,
            "help": self.help,
            "refused": self.refused,
            "expert_granularity": self.expert_granularity,
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


V4_YARN_BETAS = (32, 1)  # DeepSeek-V4's released beta_fast / beta_slow (inert at factor 1)


# ----------------------------------------------------------------------------------------- glm53 config
# c/glm53.c load_cfg reads the KDA geometry from text_config.linear_attn_config (required: num_heads, head_dim,
# short_conv_kernel_size; gate_lower_bound defaults to -5), where a transformers 5.24 glm5_next config has flat keys
GLM53_KDA_KEYS = (("num_heads", "linear_num_heads"), ("head_dim", "linear_head_dim"),
                  ("short_conv_kernel_size", "linear_conv_kernel_dim"), ("gate_lower_bound", "linear_lower_bound"))  # fmt: skip


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


# c/colibri.c qt_resolve_fmt's formats (FMT_NAMES: 0-6 and 8; floats as F32 / BF16 / F16 through
# st_read_f32): no mxfp4 (ord 7 is Vulkan-only in c/kimi_k3.c, no .qs pair) and no fp8-e4m3-e8m0 (``.scale``
# F8_E8M0, a name qt_from_disk never looks up)
COLIBRI_C_FORMATS = (
    "f32", "int8-row", "int4-row", "int2-row", "int4-grouped", "int3-g64", "e8-iq3-lattice", "fp8-e4m3-b128",
)  # fmt: skip


PAIRS_ONLY = (("layout", ("pairs",)),)  # every family engine reads pairs experts from the main container


DROPPED_TOWERS = "its converter leaves the multimodal towers out (`towers=drop`)"  # qwen36: visual.*
