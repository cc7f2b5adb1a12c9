"""The one Markdown table writer: every Markdown output of taxes (reports, compare, check, sweeps) and of
the benchmark scripts writes its tables here. It imports nothing heavy, so a command that only compares
numbers does not load the plotting stack."""

from __future__ import annotations

from taxes.sanitize import markdown as md_escape


def md_table(header: list[str], rows: list[list[str]], numbers=None, strong=()) -> str:
    """A Markdown table; every cell passes taxes.sanitize.markdown (no HTML, pipes or line breaks get
    through). numbers: the columns aligned right (default: all but the first); strong: (row, column) of
    cells set in bold, after their escaping."""
    right = range(1, len(header)) if numbers is None else numbers
    lines = ["| " + " | ".join(md_escape(h) for h in header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    for i, row in enumerate(rows):
        cells = [md_escape(c) for c in row]
        cells = [f"**{c}**" if (i, j) in strong else c for j, c in enumerate(cells)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
