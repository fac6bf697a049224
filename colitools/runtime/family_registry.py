"""Which runtime family runs a model type: ``FAMILY`` of ``colitools/runtime/<name>.py`` (``name``: its family in
``formats/families.py``), loaded by name when first asked. Below the family protocol and the family modules, so
that ``config.py`` (which the family modules import) asks it without importing them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from colitools.formats import families
from colitools.formats.errors import RuntimeModelError

if TYPE_CHECKING:  # annotations only: the protocol module imports config.py, which imports this one
    from colitools.runtime.family import RuntimeFamily


def family_for(model_type: str | None, where: str = "config.json") -> RuntimeFamily:
    """The runtime family of ``model_type`` (``FAMILY`` of ``colitools/runtime/<name>.py``, ``name`` its family in
    ``formats/families.py``); RuntimeModelError for a type the runtime does not run."""
    if model_type not in families.RUNNABLE_MODEL_TYPES:
        raise RuntimeModelError(
            f"{where}: model_type {model_type!r} is not supported "
            f"(supported: {', '.join(families.RUNNABLE_MODEL_TYPES)})"
        )
    return importlib.import_module(f"colitools.runtime.{families.family_of(model_type).name}").FAMILY
