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

from dataclasses import dataclass

from colitools.formats.errors import FormatError

GENERIC_NAME = "generic"


@dataclass(frozen=True)
class MergedPart:
    """One projection inside a merged expert blob: ``[O, I]`` int8-row, its codes at bytes ``data`` of the blob
    and its row scales at elements ``scales`` of the scale tensor (both half-open, relative to the tensor)."""

    projection: str  # gate | up | down
    O: int
    I: int
    data: tuple[int, int]
    scales: tuple[int, int]


@dataclass(frozen=True)
class MergedLayout:
    """Routed experts as one blob per expert (``c/olmoe.c`` ``load_expert_merged``)."""

    leaf: str = "merged_weight"  # ...experts.{E}.merged_weight (names.MERGED_EXPERTS)
    scale_leaf: str = "qs"  # ...experts.{E}.qs
    projections: tuple[str, ...] = ("gate", "up", "down")
    fmt: str = "int8-row"  # the registry format of every part
    dtype: str = "I8"  # what convert_olmoe_merged.py stores (torch.int8); st.h reads U8 and I8 alike
    dtypes: tuple[str, ...] = ("I8", "U8")  # what a reader accepts
    scale_dtype: str = "F32"

    def names(self, expert_base: str, expert: int) -> tuple[str, str]:
        """``(blob name, scale name)`` of expert ``expert`` under ``expert_base`` (``model.layers.3.mlp.experts``)."""
        return f"{expert_base}.{expert}.{self.leaf}", f"{expert_base}.{expert}.{self.scale_leaf}"

    def parts(self, hidden: int, inter: int) -> tuple[MergedPart, ...]:
        """The parts of one blob of an expert of width ``inter`` in a model of hidden size ``hidden``."""
        out, d, s = [], 0, 0
        for proj in self.projections:
            O, I = (hidden, inter) if proj == "down" else (inter, hidden)
            out.append(MergedPart(proj, O, I, (d, d + O * I), (s, s + O)))
            d, s = d + O * I, s + O
        return tuple(out)

    def sizes(self, hidden: int, inter: int) -> tuple[int, int]:
        """``(blob bytes, scale elements)``: ``want_w`` / ``want_s`` of ``load_expert_merged``."""
        last = self.parts(hidden, inter)[-1]
        return last.data[1], last.scales[1]


MERGED = MergedLayout()


@dataclass(frozen=True)
class Target:
    """One ``--target``: the colibri loader it follows and what that loader can read."""

    name: str
    loader: str  # the colibri function(s) that read this layout
    model_types: tuple[str, ...] | None = None  # None: any model type
    merged: MergedLayout | None = None  # routed experts as merged blobs
    expert_options: tuple[str, ...] | None = None  # --experts values the loader reads (None: any)
    float_options: tuple[str, ...] | None = None  # --dense / --embed / --mtp values (None: any)
    defaults: tuple[tuple[str, str], ...] = ()  # option -> default for this target (else the recipe's)
    layouts: tuple[str, ...] | None = None  # --layout values (None: any)

    def default(self, option: str) -> str | None:
        return dict(self.defaults).get(option)

    def check_option(self, option: str, value: str) -> None:
        """FormatError (one line) when this target's loader cannot read ``--option value``."""
        allowed = self.expert_options if option == "experts" else self.float_options
        if allowed is not None and value not in allowed:
            raise FormatError(
                f"--target {self.name}: --{option} {value} is refused: {self.loader} reads "
                f"{' or '.join(allowed)} there"
            )

    def check_layout(self, layout: str) -> None:
        if self.layouts is not None and layout not in self.layouts:
            raise FormatError(
                f"--target {self.name}: --layout {layout} is refused: {self.loader} reads {', '.join(self.layouts)}"
            )

    def check_model_type(self, model_type: str | None) -> None:
        """FormatError (one line) when the source's ``model_type`` is not one this target's engine runs."""
        if self.model_types is not None and model_type not in self.model_types:
            raise FormatError(
                f"--target {self.name} is for model_type {', '.join(self.model_types)} ({self.loader}); "
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
    )
}
TARGET_NAMES = tuple(TARGETS)


def by_name(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise FormatError(f"--target {name!r}: choose one of {', '.join(TARGET_NAMES)}") from None
