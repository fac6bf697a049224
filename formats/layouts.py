"""The one vocabulary of expert layouts (docs/FORMATS.md §4).

A layout has two spellings: the ``--layout`` option value the user types (``planar``) and the name stored in a
shard's ``__metadata__["colitools.layout"]`` and in the sidecar index (``planar64-v8``, colibri's name of the code
order). Recipe, options, CLI, resolver and container all use this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """One expert layout: ``option`` as given to ``--layout``, ``stored`` as written to metadata."""

    option: str
    stored: str


PAIRS = Layout(option="pairs", stored="pairs")  # the default; a shard without colitools.layout is pairs
PLANAR = Layout(option="planar", stored="planar64-v8")
# the routed experts in a QPACK v1 container beside the main one (formats/qpack.py; --target qwen36 only)
QPACK = Layout(option="qpack", stored="qpack-v1")
LAYOUTS: tuple[Layout, ...] = (PAIRS, PLANAR, QPACK)
OPTION_NAMES: tuple[str, ...] = tuple(layout.option for layout in LAYOUTS)
STORED_NAMES: tuple[str, ...] = tuple(layout.stored for layout in LAYOUTS)

