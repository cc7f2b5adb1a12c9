"""A table of text cells, (header, rows), in the formats every command offers besides the terminal's:
Markdown, CSV and JSON (a list of objects keyed by the header)."""

from __future__ import annotations


def table_markdown(header: list[str], rows: list[list[str]], title: str | None = None) -> str:
    from taxes.reports.markdown_table import md_table
    from taxes.sanitize import markdown

    return (f"## {markdown(title)}\n\n" if title else "") + md_table(header, rows) + "\n"


def table_csv(header: list[str], rows: list[list[str]]) -> str:
    import csv
    import io

    from taxes.sanitize import csv_cell

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_cell(h) for h in header])
    writer.writerows([[csv_cell(c) for c in r] for r in rows])
    return out.getvalue()


def table_json(header: list[str], rows: list[list[str]]) -> str:
    import json

    return json.dumps([dict(zip(header, r)) for r in rows], indent=1) + "\n"


def table_text(header: list[str], rows: list[list[str]], fmt: str, title: str | None = None) -> str:
    """The table as md, csv or json text."""
    if fmt == "md":
        return table_markdown(header, rows, title)
    if fmt == "csv":
        return table_csv(header, rows)
    if fmt == "json":
        return table_json(header, rows)
    raise ValueError(f"no text format {fmt!r}")
