"""``usage show --plot``: a routing history as a layer x expert heatmap (hot experts at a glance).

matplotlib is an optional extra (``pip install 'colitools[plot]'``); it is imported only when a plot is asked
for, and without it the command fails with one line saying how to install it. The figure is drawn on a bare
``matplotlib.figure.Figure`` (no pyplot, no global backend state) and written atomically.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from colitools.formats.atomic import write_bytes_atomic
from colitools.formats.errors import MirrorError
from colitools.formats.usage import UsageHistory

__all__ = ["INSTALL_HINT", "plot_usage"]

INSTALL_HINT = "pip install 'colitools[plot]'"


def usage_matrix(history: UsageHistory) -> np.ndarray:
    """The counts as a dense ``[n_layers, n_experts]`` array (0 where an expert has no record)."""
    grid = np.zeros((history.n_layers, history.n_experts), dtype=np.int64)
    for (layer, expert), n in history.counts.items():
        grid[layer, expert] = n
    return grid


def plot_usage(history: UsageHistory, out: str | os.PathLike, *, title: str) -> Path:
    """Draw ``history`` as a heatmap (colour = log10(1 + selections)) into the PNG ``out``; returns its path."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise MirrorError(f"`plot` needs matplotlib, an optional extra: {INSTALL_HINT}") from None
    grid = usage_matrix(history)
    fig = Figure(figsize=(min(4 + history.n_experts / 12, 24), min(2 + history.n_layers / 6, 16)), dpi=100)
    ax = fig.subplots()
    image = ax.imshow(
        np.log10(1 + grid), aspect="auto", interpolation="nearest", cmap="inferno", origin="upper"
    )
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))  # layers and experts are whole numbers
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="log10(1 + selections)")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    path = Path(out)
    try:
        write_bytes_atomic(path, buffer.getvalue())
    except OSError as exc:
        raise MirrorError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    return path
