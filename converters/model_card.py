"""The ``README.md`` model card ``colitools upload`` publishes with a converted folder.

Everything in it is read from what the conversion recorded, never from memory: the manifest (``colitools.json``:
source repo and pinned commit, colitools version, recipe, fallbacks, target, file sizes and sha256) and the
container itself through ``formats.inspect.inspect_path`` (the formats table of ``inspect --summary``). The YAML
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
from colitools.formats.filenames import CONFIG_FILE
from colitools.formats.inspect import inspect_path
from colitools.formats.jsonfile import load_json_object
from colitools.formats.targets import GENERIC_NAME, TARGETS

CARD_FILE = "README.md"
TAG = "colitools"


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


def build_card(outdir: Path, manifest: Manifest, repo_id: str, files: list[tuple[str, int]]) -> str:
    """The ``README.md`` to upload for ``outdir`` as ``repo_id``: the user's own card with completed metadata
    when ``outdir`` holds one, else a generated card. ``files``: (name, bytes) of everything uploaded besides
    the card."""
    from huggingface_hub import ModelCard, ModelCardData

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
    body = "\n".join(_body(manifest, repo_id, report, files))
    return f"---\n{ModelCardData(**meta).to_yaml()}\n---\n{body}\n"


def _config(outdir: Path) -> dict[str, Any]:
    try:
        return load_json_object(outdir / CONFIG_FILE)
    except FormatError:  # the card only reads the model type from it
        return {}


def _body(manifest: Manifest, repo_id: str, report, files: list[tuple[str, int]]) -> Iterator[str]:
    data = manifest.data
    source = data.get("source") or {}
    tool = data.get("tool") or {}
    yield f"# {repo_id.split('/')[-1]}"
    yield ""
    if source.get("kind") == "hf":
        repo, commit = source.get("repo_id"), source.get("revision")
        yield (f"Converted from [{repo}](https://huggingface.co/{repo}) at commit `{commit}` by "
               f"colitools {tool.get('version')}.")  # fmt: skip
    else:
        yield f"Converted from a local folder by colitools {tool.get('version')}."
    yield ""
    yield "## Recipe (format per role)"
    yield ""
    yield from _table(["option", "value"], [[k, str(v)] for k, v in (data.get("recipe") or {}).items()])
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
    yield from _engine(data.get("target"), repo_id)
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


def _engine(target: Any, repo_id: str) -> Iterator[str]:
    name = target if isinstance(target, str) and target in TARGETS else GENERIC_NAME
    yield "## Run it"
    yield ""
    yield f"Target `{name}`: read by colibri's {TARGETS[name].loader}."
    yield ""
    yield "```sh"
    yield f'model="$(hf download {repo_id})"   # the downloaded snapshot folder'
    yield 'colitools verify container "$model"'
    yield "```"
    yield ""
    yield 'Then `colitools run "$model"` with a prompt (text or token ids; `colitools run` help lists them).'

    yield ""


def _table(headers: list[str], rows: list[list[str]]) -> Iterator[str]:
    yield "| " + " | ".join(headers) + " |"
    yield "|" + "---|" * len(headers)
    for row in rows:
        yield "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
