"""Markdown: the one table writer every Markdown output uses, and a result document's report."""

from __future__ import annotations

from taxes.reports.rows import LEGEND, checks_rows, meta_line, sections
from taxes.reports.trace_tables import trace_sections, trace_warnings
from taxes.reports.verdict import failed_checks, marks, summary_rows, title
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


def render_markdown(doc: dict, trace_details: bool = False) -> str:
    """The report in Markdown; with trace_details, a `taxes analyze` document's own tables at the end."""
    out = [f"# {md_escape(title(doc))}", ""]
    for mark, why in marks(doc):
        out += [f"> **{mark}**: {md_escape(why)}", ""]
    out += [md_escape(meta_line(doc)), ""]
    header, rows, failed = summary_rows(doc)
    if rows:
        out += ["## Summary", "", md_table(header, rows), ""]
    bad = failed_checks(doc)
    if bad:
        out += ["**Failed checks:**", ""] + [f"- **FAILED** {md_escape(line)}" for line in bad] + [""]
    out += [md_escape(LEGEND), ""]
    for case_name, tables in sections(doc):
        out += [f"## {md_escape(case_name)}", ""]
        for name, header, rows in tables:
            out += ([f"{name.capitalize()}:", ""] if name == "per rank" else []) + [md_table(header, rows), ""]
    cr = checks_rows(doc)
    if cr:
        out += ["## Checks of the measurement", "", md_table(*cr), ""]
    if trace_details:
        for name, header, rows in trace_sections(doc):
            out += [f"### {md_escape(name)}", "", md_table(header, rows), ""]
        out += [f"**warning:** {md_escape(w)}" for w in trace_warnings(doc)] + ([""] if trace_warnings(doc) else [])
    return "\n".join(out)
