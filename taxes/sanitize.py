"""One sanitiser for every string that comes from outside taxes (documents, traces, file names, hardware
profiles, the command line) on its way to a text output.

A result document or a trace can name a variant "\\x1b]0;pwned\\x07" or "<script>", a file can be called
"a\\nb.json". Every renderer passes such strings through here, so that:

- terminal (tables, stderr lines): control characters, escape sequences, line and paragraph separators
  and bidirectional overrides are shown escaped (`\\x1b`, `\\u202e`), never interpreted; rich markup
  (`[bold]`) is shown, not read (the terminal renderers build rich Text objects, which never parse markup);
- Markdown: the same, plus HTML (`<`, `>`, `&`) as entities, and the cell separator `|`, code spans
  (`` ` ``), inline links (`](`) and the backslash escaped (emphasis is left alone: it cannot change a
  table's structure);
- CSV: the same, plus a cell that a spreadsheet would run as a formula (`=`, `+`, `-`, `@` first) quoted
  with a leading apostrophe;
- HTML: jinja2's autoescape (taxes/reports/templates), after the control characters are escaped here.
"""

from __future__ import annotations

import json
import os

LIMIT = 400  # a single untrusted string is cut to this many characters in messages


def _escaped(c: str) -> str:
    return c.encode("unicode_escape").decode("ascii")


def printable(text, limit: int | None = None) -> str:
    """`text` as one printable line: every character str.isprintable() refuses (C0 and C1 controls, ESC,
    DEL, line and paragraph separators, bidirectional and other format characters) written as its Python
    escape; spaces kept; cut to `limit` characters with '...' when longer."""
    s = text if isinstance(text, str) else str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else _escaped(c) for c in s)
    if limit is not None and len(s) > limit:
        s = s[:max(0, limit - 3)] + "..."
    return s


def one_line(text, limit: int = LIMIT) -> str:
    """A message line: printable() and at most `limit` characters."""
    return printable(text, limit)


def path(p) -> str:
    """A file name for a message: bytes decoded as the OS does, then printable()."""
    return printable(os.fsdecode(p) if isinstance(p, (bytes, os.PathLike)) else p, limit=1000)


_MD_SPECIAL = {"\\": "\\\\", "|": "\\|", "`": "\\`", "<": "&lt;", ">": "&gt;", "&": "&amp;"}


def markdown(text) -> str:
    """Text for a Markdown table cell or heading: printable(), HTML as entities, the cell separator, code
    spans and inline links escaped. Trusted markup (e.g. **bold**) is added by the caller afterwards."""
    return "".join(_MD_SPECIAL.get(c, c) for c in printable(text)).replace("](", "]\\(")


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A CSV cell: strings printable(), and one a spreadsheet would read as a formula quoted with an
    apostrophe (numbers pass unchanged: a negative number is data, not a formula)."""
    if not isinstance(value, str):
        return value
    s = printable(value)
    return "'" + s if s.startswith(_FORMULA) else s


def deep(obj):
    """A copy of a JSON value whose strings (keys too) are printable() (for renderers that print whatever
    a document holds)."""
    if isinstance(obj, dict):
        return {(printable(k) if isinstance(k, str) else k): deep(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [deep(v) for v in obj]
    return printable(obj) if isinstance(obj, str) else obj


def json_type(v) -> str:
    """The JSON name of a parsed value's type, for messages ("an object", "a list", "null")."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(v), type(v).__name__)


def reject_constant(name: str):
    """json's parse_constant: NaN, Infinity and -Infinity are not JSON numbers; a document holding one is refused."""
    raise ValueError(f"{name} is not a number JSON allows")
