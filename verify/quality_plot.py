"""``verify quality --plot``: relative error per layer, one panel per role, one line per format.

matplotlib is the optional extra ``usage show --plot`` uses (``pip install 'colitools[plot]'``), imported only
when a plot is asked for; without it the command fails with one line saying how to install it. The figure is a
bare ``matplotlib.figure.Figure`` (no pyplot, no global backend state), written atomically.

y is ``||w' - w|| / ||w||`` of the (role, layer, format) group (its sums, ``ErrorStats``), on a log scale of whole
decades, x the layer (the same range in every panel): a lossless group (0) has no point there and is named in its
panel's legend instead, a role that is lossless everywhere (routers, norms) in a note under the panels, as are
the tensors without a layer (embed, head, the final norm) with their figures.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

from colitools.formats.atomic import write_png_atomic
from colitools.formats.errors import VerifyError

INSTALL_HINT = "pip install 'colitools[plot]'"  # the extra of usage show --plot (pyproject.toml)
MAX_PANELS = 12


def plot_quality(report, out: str | os.PathLike, *, title: str):
    """Draw ``report`` (``quality.QualityReport``) into the PNG ``out``; returns the matplotlib Figure."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise VerifyError(f"`plot` needs matplotlib, an optional extra: {INSTALL_HINT}") from None
    groups = report.per_role_layer_format()
    lines: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    lossless: dict[str, set[str]] = defaultdict(set)
    globals_: list[str] = []
    for (role, layer, fmt), stats in groups.items():
        if layer is None:
            globals_.append(f"{role} {fmt}: {_rel(stats.rel_error)}")
        elif stats.sse == 0:
            lossless[role].add(fmt)
        else:
            lines[role][fmt].append((layer, stats.rel_error))
    roles = [r for r in report.per_role if r in lines][:MAX_PANELS]
    notes = [
        f"{r}: {', '.join(sorted(lossless[r]))} lossless (0)"
        for r in report.per_role
        if lossless[r] and r not in lines
    ]
    notes += [f"without layer: {'; '.join(globals_)}"] if globals_ else []
    layers = [k for k in report.per_layer if k is not None]
    x_range = (min(layers, default=0) - 0.5, max(layers, default=0) + 0.5)
    cols = 2 if len(roles) > 1 else 1
    rows = max(1, -(-len(roles) // cols))
    foot = 0.3 + 0.22 * len(notes)
    fig = Figure(figsize=(6.5 * cols, 2.9 * rows + foot + 0.5), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= len(roles):
            ax.set_visible(False)
            continue
        role = roles[k]
        for fmt in sorted(lines[role]):
            pts = sorted(lines[role][fmt])
            ax.plot(
                [x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, linewidth=1.2, label=fmt
            )
        for fmt in sorted(lossless[role] - set(lines[role])):
            ax.plot([], [], linestyle="none", label=f"{fmt}: lossless (0)")
        ax.set_yscale("log")
        ys = [y for pts in lines[role].values() for _, y in pts]
        decades = (math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys))))
        ax.set_ylim(10.0 ** decades[0], 10.0 ** max(decades[1], decades[0] + 1))  # whole decades
        ax.set_xlim(*x_range)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(role, fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylabel("relative error ||W'-W|| / ||W||", fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, title="format", title_fontsize=8)
    fig.suptitle(title, fontsize=11)
    for k, note in enumerate(reversed(notes)):
        fig.text(0.01, 0.01 + 0.22 * k / fig.get_size_inches()[1], note, fontsize=8)
    fig.tight_layout(rect=(0, foot / fig.get_size_inches()[1], 1, 1))
    path = Path(out)
    try:
        write_png_atomic(fig, path)
    except OSError as exc:
        raise VerifyError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    return fig


def _rel(x: float) -> str:
    return "0 (lossless)" if x == 0 else f"{x:.3g}"
