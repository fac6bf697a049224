"""Plain-text rendering shared by the commands (tables for people; --json is for scripts)."""

from __future__ import annotations

from collections.abc import Sequence


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned text columns (numbers right-aligned), two spaces apart."""
    table = [[str(cell) for cell in row] for row in (headers, *rows)]
    widths = [max(len(cell) for cell in column) for column in zip(*table, strict=True)]
    numeric = [
        bool(rows) and all(row[i].replace(",", "").isdigit() for row in table[1:]) for i in range(len(widths))
    ]
    lines = []
    for r, row in enumerate(table):
        cells = [
            cell.rjust(w) if num and r else cell.ljust(w)
            for cell, w, num in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
