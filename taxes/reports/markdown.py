"""A result document's report in Markdown."""

from __future__ import annotations

from taxes.reports.markdown_table import md_table
from taxes.reports.rows import LEGEND, checks_rows, meta_line, sections
from taxes.reports.analysis import trace_sections, trace_warnings
from taxes.reports.verdict import failed_checks, marks, summary_rows, title
from taxes.sanitize import markdown as md_escape


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
