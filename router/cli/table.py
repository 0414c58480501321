"""Plain-text tables for the terminal, like ``nodetool status``: a header row, columns padded
to their widest cell, numbers (cells starting with a digit) right-aligned.

>>> print(render(["name", "size"], [["a", "1.0 KiB"], ["bbb", "12 B"]]))
name     size
a     1.0 KiB
bbb      12 B
"""

from __future__ import annotations


def _is_number(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or (cell[0] in "-+." and cell[1:2].isdigit()))


def render(header: list[str], rows: list[list], gap: int = 2) -> str:
    """The table as one string (no trailing newline). Cells are str()-ed; None is ``-``."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in header]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    right = [all(_is_number(row[i]) or row[i] == "-" for row in cells) and
             any(_is_number(row[i]) for row in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        out = []
        for i, c in enumerate(row):
            out.append(c.rjust(widths[i]) if right[i] else c.ljust(widths[i]))
        return (" " * gap).join(out).rstrip()

    return "\n".join([line(header)] + [line(r) for r in cells])
