"""The ``README.md`` model card ``colitools upload`` publishes with a converted folder.

Everything in it is read from what the conversion recorded, never from memory: the manifest (``colitools.json``:
source repo and pinned commit, colitools version, recipe with its ``target``, fallbacks, the plan's source and
output bytes, file sizes and sha256) and the container itself through ``formats.inspect.inspect_path`` (the
formats table of ``inspect --summary``, the roles the model has, its weights for the bits per weight). It opens
with what a user weighs first (source size -> output size, bits per weight), links the source on the Hub it came
from (``endpoint``: huggingface_hub's ``HF_ENDPOINT``), and says which engine runs the layout (the target's colibri
engine, ``formats/targets/``) with the commands to fetch, check and run it. The YAML
front matter is what the Hub shows: ``base_model`` (a Hub source only: a local folder names no repo),
``base_model_relation: quantized``, and ``tags`` (``colitools``, each format written, the model type). No
``library_name``: no library the Hub knows loads these containers (transformers cannot; colibri's engines and
``colitools run`` do, as the card says).

A ``README.md`` the user put in the output folder is kept as written: only its front matter is completed
(``base_model`` when it has none, the tags added to its own), through huggingface_hub's ``ModelCard``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from colitools.converters.manifest import Manifest
from colitools.formats.errors import FormatError
from colitools.formats.families import RUNNABLE_MODEL_TYPES
from colitools.formats.filenames import CONFIG_FILE
from colitools.formats.inspect import inspect_path
from colitools.formats.jsonfile import load_json_object
from colitools.formats.targets import GENERIC_NAME, TARGETS, TOKENIZER_FILE

CARD_FILE = "README.md"
TAG = "colitools"
DEFAULT_ENDPOINT = "https://huggingface.co"
# the recipe options and the roles (``names.DETAIL_ROLES``) they decide: an option is listed only when the model has
# one of its roles (a model without MTP layers has no `mtp` row); options of no role (``target``, ...) always
OPTION_ROLES = {
    "experts": ("routed experts",), "layout": ("routed experts",), "mtp": ("mtp",), "embed": ("embed", "head"),
    "dense": ("attention", "shared experts", "dense mlp", "other"), "towers": ("tower",),
}  # fmt: skip


def _shown_recipe(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe as the card lists it: under a size budget (FORMATS §12) the budget instead of the per-role
    options it replaced (the formats per role follow in their own table)."""
    budget = recipe.get("budget")
    if not isinstance(budget, dict):
        return recipe
    shown = {k: v for k, v in recipe.items() if k not in ("experts", "dense", "embed", "mtp", "budget")}
    size = f"{budget['target_size']} bytes" if "target_size" in budget else f"{budget.get('target_bpw')} bits per weight"
    shown["budget"] = f"at most {size}, formats chosen per tensor to least weighted squared error"
    return shown


def card_metadata(manifest: Manifest, formats: list[str], model_type: str | None) -> dict[str, Any]:
    """The front matter the generated card carries (and a user's card is completed with)."""
    source = manifest.data.get("source") or {}
    meta: dict[str, Any] = {}
    if source.get("kind") == "hf" and source.get("repo_id"):
        meta["base_model"] = source["repo_id"]
        meta["base_model_relation"] = "quantized"
    tags = [TAG, *formats]
    if model_type:
        tags.append(model_type)
    meta["tags"] = list(dict.fromkeys(tags))
    return meta


def build_card(
    outdir: Path, manifest: Manifest, repo_id: str, files: list[tuple[str, int]], endpoint: str | None = None
) -> str:
    """The ``README.md`` to upload for ``outdir`` as ``repo_id``: the user's own card with completed metadata
    when ``outdir`` holds one, else a generated card. ``files``: (name, bytes) of everything uploaded besides
    the card; ``endpoint``: the Hub (default huggingface_hub's, ``HF_ENDPOINT``)."""
    from huggingface_hub import ModelCard, ModelCardData, constants

    report = inspect_path(outdir)
    config = _config(outdir)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    meta = card_metadata(manifest, [t.format for t in report.totals], model_type)
    own = outdir / CARD_FILE
    if own.is_file():
        text = own.read_text(encoding="utf-8")
        if not text.startswith("---"):
            return f"---\n{ModelCardData(**meta).to_yaml()}\n---\n{text}"
        card = ModelCard(text, ignore_metadata_errors=True)
        if meta.get("base_model") and not getattr(card.data, "base_model", None):
            card.data.base_model = meta["base_model"]
        card.data.tags = list(dict.fromkeys([*(card.data.tags or []), *meta["tags"]]))
        return card.content
    hub = (endpoint or constants.ENDPOINT or DEFAULT_ENDPOINT).rstrip("/")
    body = "\n".join(_body(manifest, repo_id, report, files, hub, model_type))
    return f"---\n{ModelCardData(**meta).to_yaml()}\n---\n{body}\n"


def _config(outdir: Path) -> dict[str, Any]:
    try:
        return load_json_object(outdir / CONFIG_FILE)
    except FormatError:  # the card only reads the model type from it
        return {}


def _body(
    manifest: Manifest, repo_id: str, report, files: list[tuple[str, int]], hub: str, model_type: str | None
) -> Iterator[str]:
    data = manifest.data
    source = data.get("source") or {}
    tool = data.get("tool") or {}
    recipe = _shown_recipe(data.get("recipe") if isinstance(data.get("recipe"), dict) else {})
    yield f"# {repo_id.split('/')[-1]}"
    yield ""
    yield from _sizes(data, report, files)
    if source.get("kind") == "hf":
        repo, commit = source.get("repo_id"), source.get("revision")
        yield (f"Converted from [{repo}]({hub}/{repo}) at commit `{commit}` by "
               f"colitools {tool.get('version')}.")  # fmt: skip
    else:
        yield f"Converted from a local folder by colitools {tool.get('version')}."
    yield ""
    yield "## Recipe (format per role)"
    yield ""
    roles = set(report.formats_per_role)
    rows = [[k, str(v)] for k, v in recipe.items() if k not in OPTION_ROLES or roles & set(OPTION_ROLES[k])]
    if "quantizer" not in recipe:  # rtn recipes record none (their fingerprint predates the option)
        rows.append(["quantizer", "rtn"])
    yield from _table(["option", "value"], rows)
    yield ""
    yield (
        "Scales: round to nearest (`amax / qmax`, colibri's own converters' rule)."
        if recipe.get("quantizer", "rtn") == "rtn"
        else "Scales: chosen per group to minimise the squared error (`--quantizer mse`), never worse than round "
        "to nearest; the same bytes per weight."
    )
    yield ""
    yield "## Formats (`colitools inspect --summary`)"
    yield ""
    rows = [[t.format, str(t.tensors), f"{t.bytes:,}"] for t in report.totals]
    yield from _table(["format", "weights", "bytes (with scales)"], rows)
    yield ""
    role_rows = [
        [role, ", ".join(f"{n} {f}" for f, n in fmts.items())]
        for role, fmts in report.formats_per_role.items()
    ]
    yield from _table(["role", "formats"], role_rows)
    yield ""
    yield from _fallbacks(data.get("fallbacks") or [])
    target = recipe.get("target", data.get("target"))  # recorded in the recipe (absent: generic)
    names = {name for name, _ in files}
    yield from _engine(target, repo_id, hub, model_type in RUNNABLE_MODEL_TYPES, TOKENIZER_FILE in names)
    yield "## Files"
    yield ""
    yield from _table(["file", "bytes"], [[name, f"{size:,}"] for name, size in files])
    yield ""
    yield f"Total: {sum(size for _, size in files):,} bytes. Each file's sha256 is in `colitools.json`."


def _fallbacks(fallbacks: list[Any]) -> Iterator[str]:
    yield "## Fallbacks"
    yield ""
    if not fallbacks:
        yield "None: every tensor got its role's format."
    for f in fallbacks:
        if isinstance(f, dict):
            yield (f"* `{f.get('tensor')}`: {f.get('written')} instead of {f.get('requested')} "
                   f"({f.get('reason')})")  # fmt: skip
        else:
            yield f"* {f}"
    yield ""


def _sizes(data: dict[str, Any], report, files: list[tuple[str, int]]) -> Iterator[str]:
    """The first line: source size -> output size, and the bits per weight of the weights as written (their
    codes and scales over their logical elements, from the container's own resolution)."""
    plan = data.get("plan") if isinstance(data.get("plan"), dict) else {}
    source_bytes = plan.get("in_bytes")
    out_bytes = sum(size for _, size in files)
    elements = weight_bytes = 0
    for t in report.tensors:
        if t.kind not in ("quantized", "float"):
            continue
        if t.parts:
            n = sum(part.O * part.I for part in t.parts)
        elif t.logical_shape is not None:
            n = t.logical_shape[0] * t.logical_shape[1]
        else:
            n = 1
            for d in t.shape:
                n *= d
        elements += n
        weight_bytes += t.nbytes + t.scale_nbytes
    bpw = f", {8 * weight_bytes / elements:.2f} bits per weight" if elements else ""
    before = f"{_size(source_bytes)} -> " if isinstance(source_bytes, int) else ""
    yield f"**{before}{_size(out_bytes)}{bpw}**"
    yield ""


def _size(n: int) -> str:
    """``n`` bytes in the unit that shows them (``1.50 GiB``, ``7.5 MiB``, ``812 bytes``)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def _engine(target: Any, repo_id: str, hub: str, runnable: bool, tokenizer: bool) -> Iterator[str]:
    name = target if isinstance(target, str) and target in TARGETS else GENERIC_NAME
    engine = TARGETS[name].engine
    yield "## Run it"
    yield ""
    yield (f"This layout (`--target {name}`) is what colibri's `{engine}` engine reads: build colibri and run that "
           "engine on the downloaded folder.")  # fmt: skip
    yield ""
    yield "```sh"
    where = "" if hub == DEFAULT_ENDPOINT else f"HF_ENDPOINT={hub} "
    yield f'model="$({where}hf download {repo_id})"   # the downloaded snapshot folder'
    yield 'colitools verify container "$model"   # every file against its recorded sha256'
    yield "```"
    yield ""
    if runnable:  # colitools' reference runtime runs it too (a text prompt needs the tokenizer)
        command = '`colitools run "$model" --prompt "Hello"`' if tokenizer else '`colitools run "$model" --prompt-ids 1,2,3`'
        yield f"colitools' reference runtime runs it as well: {command}."
        yield ""


def _table(headers: list[str], rows: list[list[str]]) -> Iterator[str]:
    yield "| " + " | ".join(headers) + " |"
    yield "|" + "---|" * len(headers)
    for row in rows:
        yield "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
