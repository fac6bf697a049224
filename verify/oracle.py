"""``colitools verify oracle``: convert a committed oracle fixture with a recipe, run the result with the
reference runtime, and compare with the transformers reference token by token.

A fixture folder (``oracles/<name>/``) is a Hugging Face model folder plus ``reference/<recipe>.json`` files
written by ``oracles/make_oracles.py`` (schema in ``oracles/README.md``). For every recipe this checks:

* the converter gave every tensor the format the oracle generator chose independently (``tensor_formats``);
* all greedy tokens are identical (runtime with a KV cache vs transformers' greedy generation);
* the teacher-forced argmax is identical at every position;
* the last-position logits agree within ``atol`` (catches e.g. an RMSNorm eps error that leaves tokens intact).

Positions whose reference top-1/top-2 margin is below ``NEAR_TIE`` are reported as near-ties instead of
mismatches (no committed oracle has any). The converted container is also checked with ``verify_container``.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from colitools.formats import targets
from colitools.formats.errors import VerifyError
from colitools.formats.jsonfile import parse_json_object
from colitools.formats.registry import WEIGHT_SUFFIX, Mxfp4, by_name

NEAR_TIE = 1e-4
DEFAULT_ATOL = 1e-4
REFERENCE_DIR = "reference"

# recipe_formats keys of a reference -> ConvertOptions fields
_OPTION_KEYS = ("experts", "dense", "embed", "mtp", "layout", "target")  # target: formats/targets/


@dataclass
class RecipeResult:
    """The comparison of one fixture x recipe."""

    fixture: str
    recipe: str
    greedy_total: int = 0
    greedy_matched: int = 0
    first_greedy_mismatch: int | None = None
    forced_total: int = 0
    forced_matched: int = 0
    near_ties: list[int] = field(default_factory=list)
    logits_max_abs_diff: float = float("nan")
    format_mismatches: list[str] = field(default_factory=list)
    container_problems: list[str] = field(default_factory=list)
    generated_ids: list[int] = field(default_factory=list)
    expected_ids: list[int] = field(default_factory=list)
    atol: float = DEFAULT_ATOL

    @property
    def ok(self) -> bool:
        return (
            self.greedy_matched == self.greedy_total
            and self.forced_matched + len(self.near_ties) == self.forced_total
            and self.logits_max_abs_diff <= self.atol
            and not self.format_mismatches
            and not self.container_problems
        )

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()}
        d["ok"] = self.ok
        d["logits_max_abs_diff"] = float(self.logits_max_abs_diff)
        return d


def fixture_recipes(fixture_dir: Path) -> list[str]:
    """The recipes a fixture has references for, in a stable order (f32 first)."""
    ref_dir = fixture_dir / REFERENCE_DIR
    if not ref_dir.is_dir():
        raise VerifyError(f"{fixture_dir}: not an oracle fixture (no {REFERENCE_DIR}/ folder)")
    names = sorted(p.stem for p in ref_dir.glob("*.json"))
    for n in list(names):  # a reference may stand for several recipes (planar shares default's values)
        shared = _read_json(ref_dir / f"{n}.json").get("recipes_sharing_this_reference") or []
        names += [r for r in shared if r not in names]
    order = ["f32", "default", "int3", "mxfp4", "planar"]
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


def load_reference(fixture_dir: Path, recipe: str) -> dict[str, Any]:
    """The reference of ``recipe``; ``planar`` uses default's (same values, only the byte layout differs)."""
    ref_dir = fixture_dir / REFERENCE_DIR
    path = ref_dir / f"{recipe}.json"
    if not path.is_file():
        for other in sorted(ref_dir.glob("*.json")):
            if recipe in (_read_json(other).get("recipes_sharing_this_reference") or []):
                path = other
                break
        else:
            have = ", ".join(fixture_recipes(fixture_dir)) or "none"
            raise VerifyError(f"{fixture_dir}: no reference for recipe {recipe!r} (have: {have})")
    ref = _read_json(path)
    _check_reference(path, ref)
    if recipe == "planar":
        ref["recipe_formats"] = {**(ref.get("recipe_formats") or {}), "layout": "planar"}
    ref["recipe"] = recipe
    return ref


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise VerifyError(f"{path}: unreadable reference ({exc})") from None
    return parse_json_object(raw, str(path), error=VerifyError)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_reference(path: Path, ref: dict[str, Any]) -> None:
    """The keys a run reads, with their types: a damaged reference is one VerifyError naming the key."""
    forced = ref.get("teacher_forced")
    logits = ref.get("logits")
    problems = [
        (key, "a list of token ids")
        for key, value in (("prompt_ids", ref.get("prompt_ids")), ("generated_ids", ref.get("generated_ids")))
        if not _int_list(value)
    ]
    if not isinstance(forced, dict):
        problems.append(("teacher_forced", "an object"))
    else:
        problems += [
            (f"teacher_forced.{key}", "a list of token ids")
            for key in ("input_ids", "argmax")
            if not _int_list(forced.get(key))
        ]
        margins = forced.get("margins")
        if margins is not None and not (
            isinstance(margins, list)
            and all(isinstance(m, int | float) and not isinstance(m, bool) for m in margins)
            and len(margins) >= len(forced.get("argmax") or [])
        ):
            problems.append(("teacher_forced.margins", "a list of numbers, one per argmax position"))
    if not (isinstance(logits, dict) and isinstance(logits.get("file"), str) and logits["file"]
            and Path(logits["file"]).name == logits["file"]):  # fmt: skip
        problems.append(("logits.file", "a file name in the reference folder"))
    if problems:
        key, want = problems[0]
        raise VerifyError(f"{path}: {key} must be {want}")


def reference_logits(fixture_dir: Path, ref: dict[str, Any]) -> np.ndarray:
    """The reference logits rows ``[2, V]``: greedy last step, teacher-forced last position."""
    import zstandard

    path = fixture_dir / REFERENCE_DIR / ref["logits"]["file"]
    try:
        raw = zstandard.ZstdDecompressor().decompress(path.read_bytes())
        return np.load(io.BytesIO(raw), allow_pickle=False)
    except (OSError, ValueError, EOFError, zstandard.ZstdError) as exc:
        raise VerifyError(f"{path}: unreadable reference logits ({exc})") from None


def convert_options(ref: dict[str, Any]):
    """ConvertOptions for the reference's recipe (``recipe_formats``)."""
    from colitools.converters.options import ConvertOptions

    formats = ref.get("recipe_formats") or {}
    kwargs = {k: formats[k] for k in _OPTION_KEYS if formats.get(k) is not None}
    return ConvertOptions(**kwargs, progress=False, min_free_gb=0.0)


def unsupported_model_type(fixture_dir: str | os.PathLike[str]) -> str | None:
    """The fixture's ``model_type`` when the reference runtime cannot run it yet (not in
    ``RUNNABLE_MODEL_TYPES``), else None."""
    from colitools.formats.families import RUNNABLE_MODEL_TYPES
    from colitools.formats.filenames import CONFIG_FILE
    from colitools.formats.jsonfile import load_json_object
    from colitools.formats.model_config import model_type

    config = load_json_object(Path(fixture_dir) / CONFIG_FILE)
    mt = model_type(config)
    return None if mt in RUNNABLE_MODEL_TYPES else str(mt)


def not_runnable_message(fixture_dir: str | os.PathLike[str], mt: str) -> str:
    return f"{Path(fixture_dir).name}: model_type {mt} is not supported by the runtime yet"


def _convert_and_check(fixture_dir: Path, ref: dict[str, Any], result: RecipeResult, out: Path) -> None:
    """Convert with the reference's recipe into ``out``; record container problems and format mismatches."""
    from colitools.converters.runner import convert
    from colitools.formats.container import resolve_container
    from colitools.formats.inspect import open_model
    from colitools.verify.container import verify_container

    options = convert_options(ref)
    convert(str(fixture_dir), out, options)
    result.container_problems = verify_container(out).problems
    model_files = open_model(out)
    resolved = resolve_container(
        model_files.shards, config=model_files.config, merged_group_size=model_files.merged_group_size
    )
    parts = _merged_part_labels(resolved)
    target = options.target  # the reference's recorded --target, resolved by ConvertOptions
    for source_name, expected in sorted((ref.get("tensor_formats") or {}).items()):
        name = target.out_name(source_name)  # the reference names source tensors; a target may rename them
        if name not in resolved and name in parts:  # a projection inside a target's merged expert blob
            if parts[name] != expected:
                result.format_mismatches.append(f"{name}: converted as {parts[name]}, oracle expects {expected}")
            continue
        got = resolved.get(name)
        if got is None and isinstance(target.experts, targets.FusedLayout):  # a split shared expert, stacked
            got = resolved.get(_shared_stack_name(name) or "")
        if got is None and name.endswith(WEIGHT_SUFFIX):  # mxfp4: <base>.weight as <base>.weight_packed
            got = resolved.get(Mxfp4.tensor_names(name)[0])
        label = (  # the user-facing label (format_names.format_label): a float by its stored dtype (bf16)
            by_name(got.format.name).label(got.format.group_size, got.dtype)
            if got is not None and got.format is not None
            else None
        )
        if got is not None and got.format is None and got.kind == "other":  # row 0: copied non-float (I64)
            label = f"{got.dtype} (copied)"
        if label != expected:
            result.format_mismatches.append(f"{name}: converted as {label}, oracle expects {expected}")


def verify_recipe(
    fixture_dir: str | os.PathLike[str], recipe: str, *, cap: int | None = None, atol: float = DEFAULT_ATOL,
    workdir: str | os.PathLike[str] | None = None,
) -> RecipeResult:
    """Convert ``fixture_dir`` with ``recipe`` into a temporary folder, run it, compare with the reference."""
    from colitools.runtime import load_model
    from colitools.runtime.generate import generate

    fixture_dir = Path(fixture_dir)
    ref = load_reference(fixture_dir, recipe)
    mt = unsupported_model_type(fixture_dir)
    if mt is not None:
        raise VerifyError(not_runnable_message(fixture_dir, mt))
    result = RecipeResult(fixture_dir.name, recipe, atol=atol)
    with tempfile.TemporaryDirectory(prefix=f"colitools-oracle-{fixture_dir.name}-{recipe}-", dir=workdir) as tmp:
        out = Path(tmp) / "converted"
        _convert_and_check(fixture_dir, ref, result, out)
        prompt = [int(t) for t in ref["prompt_ids"]]
        expected_ids = [int(t) for t in ref["generated_ids"]]
        forced = ref["teacher_forced"]
        with load_model(out, cap=cap, record_usage=False) as model:
            gen = generate(model, prompt, len(expected_ids))
            argmax, last = model.score([int(t) for t in forced["input_ids"]])
    result.generated_ids, result.expected_ids = gen.generated_ids, expected_ids
    result.greedy_total = len(expected_ids)
    for i, (a, b) in enumerate(zip(gen.generated_ids, expected_ids, strict=False)):
        if a != b:
            result.first_greedy_mismatch = i
            break
        result.greedy_matched += 1
    margins = forced.get("margins") or [float("inf")] * len(forced["argmax"])
    result.forced_total = len(forced["argmax"])
    for pos, (a, b) in enumerate(zip(argmax, forced["argmax"], strict=False)):
        if a == b:
            result.forced_matched += 1
        elif margins[pos] < NEAR_TIE:
            result.near_ties.append(pos)
    want = reference_logits(fixture_dir, ref)
    got_rows = np.stack([np.asarray(gen.last_logits, np.float32), np.asarray(last, np.float32)])
    if got_rows.shape == want.shape:
        result.logits_max_abs_diff = float(np.max(np.abs(got_rows - want)))
    return result


def _shared_stack_name(name: str) -> str | None:
    """The float stack ``{base}.{p}_proj`` a fused target writes shared expert ``{base}.{k}.{p}_proj.weight`` into
    (formats/targets/ ``FusedLayout``: shared experts stacked too, expert k at index k), or None."""
    from colitools.formats.names import CANONICAL_PROJECTION, TensorRole, parse_name

    p = parse_name(name)
    if p.role is not TensorRole.SHARED_EXPERT or p.projection not in CANONICAL_PROJECTION:
        return None
    if not p.module.rpartition(".")[2].isdecimal():
        return None
    return f"{name.rsplit('.', 3)[0]}.{CANONICAL_PROJECTION[p.projection]}"


def _merged_part_labels(resolved) -> dict[str, str]:
    """Projection name -> format label of every part of a merged expert blob (formats/targets/)."""
    from colitools.formats.names import expert_tensor_name, parse_name

    out = {}
    for name, t in resolved.items():
        for part in t.parts:
            p = parse_name(name)
            expert = p.expert if part.expert is None else part.expert
            out[expert_tensor_name(p.expert_base, expert, part.projection)] = t.format.label
    return out


@dataclass
class OracleReport:
    """``verify oracle``: one fixture checked recipe by recipe, or refused before any work (``not_runnable``:
    the runtime has no family for its ``model_type``)."""

    fixture: str
    results: list[RecipeResult] = field(default_factory=list)
    not_runnable: str | None = None

    @property
    def ok(self) -> bool:
        return self.not_runnable is None and all(r.ok for r in self.results)

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.results]


def verify_oracle(
    fixture_dir: str | os.PathLike[str], recipes: list[str] | None = None, *, cap: int | None = None,
    atol: float = DEFAULT_ATOL, progress: Callable[[RecipeResult], None] | None = None,
) -> OracleReport:
    """``verify_recipe`` for each recipe (all the fixture has references for when ``recipes`` is None, f32
    first), calling ``progress`` after each. A fixture whose family the runtime cannot run is reported
    (``not_runnable``) before anything is converted."""
    fixture_dir = Path(fixture_dir)
    names = recipes or fixture_recipes(fixture_dir)
    report = OracleReport(fixture_dir.name)
    mt = unsupported_model_type(fixture_dir)
    if mt is not None:
        report.not_runnable = not_runnable_message(fixture_dir, mt)
        return report
    for name in names:
        report.results.append(verify_recipe(fixture_dir, name, cap=cap, atol=atol))
        if progress is not None:
            progress(report.results[-1])
    return report
