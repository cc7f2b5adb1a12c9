"""The one console setup of every command: where tables go, how wide they may be, and how a table too wide
for the terminal is folded instead of cut.

- stdout on a terminal (or COLUMNS set): tables fit its width. A table wider than that is folded: its
  columns are split into several tables of the same rows, each repeating the first (key) column, so that
  no cell is ever cut short ('1,056…'). A cell still too wide for the whole width wraps onto more lines.
- stdout piped or to a file without COLUMNS, and `-o FILE`: no width limit; each table keeps its natural
  width.
- Every cell and title is printed as plain text (rich Text: no markup read) after taxes.sanitize.printable,
  so names from documents and traces can neither style the output nor reach the terminal as escapes.
- stderr: one-line messages, sanitised, never wrapped.
"""

from __future__ import annotations

import io
import os
import sys

from taxes.sanitize import printable

UNLIMITED = 100_000  # "no width limit": wider than any table taxes prints


def _width_from_env() -> int | None:
    try:
        cols = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return cols if cols > 0 else None


def stdout_console():
    """Tables on stdout: the terminal's width (or COLUMNS), else no limit."""
    from rich.console import Console

    width = _width_from_env()
    if width is None and not _isatty(sys.stdout):
        width = UNLIMITED
    return Console(file=sys.stdout, highlight=False, width=width, soft_wrap=False)


def stderr_console():
    from rich.console import Console

    return Console(file=sys.stderr, stderr=True, highlight=False, soft_wrap=True)


def text_console(buf: io.StringIO):
    """A console rendering plain text (no colour) without a width limit: for `-o FILE` and tests."""
    from rich.console import Console

    return Console(file=buf, width=UNLIMITED, color_system=None, highlight=False, soft_wrap=False)


def render_text(draw) -> str:
    """What draw(console) prints, as plain text without a width limit (trailing spaces trimmed)."""
    buf = io.StringIO()
    draw(text_console(buf))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _isatty(f) -> bool:
    try:
        return f.isatty()
    except (AttributeError, ValueError):
        return False


def say(message: str) -> None:
    """One line on stderr, sanitised (never wrapped: each message stays one line for scripts and logs)."""
    sys.stderr.write(printable(message) + "\n")
    sys.stderr.flush()


def text(value, style: str | None = None):
    from rich.text import Text

    return Text(printable(value), style=style or "")


def _cell_width(s: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in s.split("\n")), default=0)


def print_table(console, title: str | None, header: list[str], rows: list[list[str]], *, left: int = 1,
                row_styles: list[str | None] | None = None, cell_styles: dict | None = None,
                caption: str | None = None, text_columns: tuple[int, ...] = (), fold: bool = True) -> None:
    """A table whose cells are never cut: folded into several tables (each repeating the first `left`
    columns) when it is wider than the console; fold=False keeps it one table whose cells wrap onto more
    lines instead (a summary read across its row). The first `left` columns and text_columns are
    left-aligned text, the others right-aligned (numbers). cell_styles: {(row, column): style}."""
    header = [printable(h) for h in header]
    rows = [[printable(c) for c in r] for r in rows]
    if not fold:
        _one_table(console, title, header, rows, list(range(len(header))), min(left, len(header)), row_styles,
                   cell_styles, caption, None, text_columns, widths=_fitted_widths(header, rows, console.width - 1))
        return
    widths = [max([_cell_width(h)] + [_cell_width(r[i]) for r in rows if i < len(r)]) + 3
              for i, h in enumerate(header)]  # + padding and the border
    limit = max(20, console.width - 1)
    keys = list(range(min(left, len(header))))
    key_width = sum(widths[i] for i in keys)
    groups, cur, used = [], [], key_width
    for i in range(len(keys), len(header)):
        if cur and used + widths[i] > limit:
            groups.append(cur)
            cur, used = [], key_width
        cur.append(i)
        used += widths[i]
    groups.append(cur)
    for n, cols in enumerate(groups):
        part = f" ({n + 1} of {len(groups)})" if len(groups) > 1 and title else ""
        _one_table(console, (title + part) if title else None, header, rows, keys + cols, len(keys), row_styles,
                   cell_styles, caption if n == len(groups) - 1 else None,
                   [min(widths[i] - 3, max(8, limit // (3 * len(keys)))) for i in keys], text_columns)


def _fitted_widths(header: list[str], rows: list[list[str]], limit: int) -> list[int]:
    """Column widths for one table within `limit` characters (3 of border and padding per column): every
    column its natural width when they all fit; else each at least its longest word (so text wraps between
    words), and the room left shared in proportion to what each still lacks. Where even the longest words
    do not fit together, the widest give way (their words fold)."""
    cells = [[h] + [r[i] for r in rows if i < len(r)] for i, h in enumerate(header)]
    natural = [max(_cell_width(x) for x in col) for col in cells]
    room = limit - 3 * len(header) - 1
    if sum(natural) <= room:
        return natural
    words = [max([_cell_width(w) for x in col for w in x.split()] or [1]) for col in cells]
    while sum(words) > room and max(words) > 4:
        words[words.index(max(words))] -= 1
    spare = max(0, room - sum(words))
    lack = [n - w for n, w in zip(natural, words)]
    total = sum(lack) or 1
    widths = [w + spare * x // total for w, x in zip(words, lack)]
    for i in sorted(range(len(widths)), key=lambda i: -lack[i])[:room - sum(widths)]:  # what rounding left over
        widths[i] += 1
    return widths


def _one_table(console, title, header, rows, cols, n_keys, row_styles, cell_styles, caption, key_min,
               text_columns, widths: list[int] | None = None) -> None:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(title, style="bold") if title else None, caption=Text(caption) if caption else None,
              show_lines=False)
    for i in cols:
        # a cell wraps (at spaces first) only when one column is wider than the whole console
        t.add_column(Text(header[i]), justify="left" if i < n_keys or i in text_columns else "right", overflow="fold",
                     min_width=key_min[i] if key_min and i < n_keys else None, width=widths[i] if widths else None)
    for r, row in enumerate(rows):
        cells = []
        for i in cols:
            style = (cell_styles or {}).get((r, i))
            cells.append(Text(row[i] if i < len(row) else "", style=style or ""))
        t.add_row(*cells, style=(row_styles[r] if row_styles else None) or None)
    console.print(t)


class progress:
    """`with progress("rendering the charts"):` a spinner on stderr while the block runs, when stderr is a
    terminal (nothing otherwise: scripts and logs get no control characters)."""

    def __init__(self, what: str):
        self.what = printable(what)
        self._status = None

    def __enter__(self):
        if _isatty(sys.stderr):
            self._status = stderr_console().status(f"taxes: {self.what} ...")
            self._status.__enter__()
        return self

    def update(self, what: str) -> None:
        if self._status is not None:
            self._status.update(f"taxes: {printable(what)} ...")

    def __exit__(self, *exc):
        if self._status is not None:
            self._status.__exit__(*exc)
        return False
