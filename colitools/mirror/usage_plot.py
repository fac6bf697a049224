"""``usage show --plot``: a routing history as a layer x expert heatmap (hot experts at a glance).

matplotlib is an optional extra (``pip install 'colitools[plot]'``); it is imported only when a plot is asked
for, and without it the command fails with one line saying how to install it. The figure is drawn on a bare
``matplotlib.figure.Figure`` (no pyplot, no global backend state) and written atomically.

With a planned mirror (``usage show --model MIRROR``) the experts the plan put on the mirror are outlined, one
square marker per cell (the scatter collection labelled ``MARK_LABEL``), and a legend says so.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

import numpy as np

from colitools.formats.atomic import write_png_atomic
from colitools.formats.errors import MirrorError
from colitools.formats.usage import UsageHistory

__all__ = ["INSTALL_HINT", "MARK_LABEL", "plot_usage"]

INSTALL_HINT = "pip install 'colitools[plot]'"
MARK_LABEL = "on the mirror (routed tensor in a planned shard)"


def usage_matrix(history: UsageHistory) -> np.ndarray:
    """The counts as a dense ``[n_layers, n_experts]`` array (0 where an expert has no record)."""
    grid = np.zeros((history.n_layers, history.n_experts), dtype=np.int64)
    for (layer, expert), n in history.counts.items():
        grid[layer, expert] = n
    return grid


def _mark(ax, marked: Collection[tuple[int, int]], history: UsageHistory) -> None:
    """Outline the ``marked`` cells (inside the geometry) and add the legend that names them."""
    cells = sorted(k for k in marked if 0 <= k[0] < history.n_layers and 0 <= k[1] < history.n_experts)
    # a cell's size in points (the axes take about 3/4 of the figure)
    width, height = ax.figure.get_size_inches()
    cell = min(width * 54 / history.n_experts, height * 54 / history.n_layers)
    ax.scatter([e for _, e in cells], [layer for layer, _ in cells], marker="s", s=min(90.0, (0.55 * cell) ** 2),
               facecolors="none", edgecolors="#00e5ff", linewidths=1.6 if cell > 8 else 0.6,
               label=f"{MARK_LABEL}: {len(cells)}")  # fmt: skip
    ax.set_xlim(-0.5, history.n_experts - 0.5)  # the scatter must not widen the image's extent
    ax.set_ylim(history.n_layers - 0.5, -0.5)
    ax.figure.legend(loc="lower center", fontsize=8, frameon=False)  # in the strip tight_layout leaves free


def plot_usage(history: UsageHistory, out: str | os.PathLike, *, title: str,
               marked: Collection[tuple[int, int]] | None = None):  # fmt: skip
    """Draw ``history`` as a heatmap (colour = log10(1 + selections)) into the PNG ``out``; ``marked``: the
    (layer, expert) cells a mirror plan put on the mirror, outlined. Returns the matplotlib Figure drawn."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise MirrorError(f"`plot` needs matplotlib, an optional extra: {INSTALL_HINT}") from None
    grid = usage_matrix(history)
    extra = 0.4 if marked is not None else 0  # inches for the legend below the axes
    fig = Figure(
        figsize=(min(4 + history.n_experts / 12, 24), min(2 + extra + history.n_layers / 6, 16)), dpi=100
    )
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
    if marked is not None:
        _mark(ax, marked, history)
    fig.tight_layout(rect=(0, extra / fig.get_size_inches()[1], 1, 1) if extra else None)
    path = Path(out)
    try:
        write_png_atomic(fig, path)
    except OSError as exc:
        raise MirrorError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    return fig
