"""The report of a `taxes analyze` document in every format (table, Markdown, HTML): what every report of a
result document shows first (taxes.reports.html.html_view), then the analysis's own tables
(taxes.reports.analysis) and the warnings. The rows the traces cannot support read "not measured" wherever
they appear, a NOT MEASURED mark names what to record to get them, and an UNTRUSTED mark says when the
record cost too much of the plain step for its waits to describe the program. Everything is read from the
document, so a document written as JSON reports the same later.
"""

from __future__ import annotations

import html

from taxes.method import TAXES
from taxes.reports import html as html_report
from taxes.reports.analysis import NOT_MEASURED, not_measured, trace_sections, trace_warnings, untrusted
from taxes.reports.markdown_table import md_table
from taxes.reports import rows as report_rows
from taxes.reports.plots import COMPONENT_TITLES
from taxes.sanitize import markdown as md

LABELS = "labels: m measured, d derived, p predicted; times in us per step"


def report_view(doc: dict, images: bool) -> dict:
    """html_report.html_view's view of the document, its not-measured rows marked (module docstring)."""
    view = html_report.html_view(doc, images=images)
    missing = {k: why for k, why in not_measured(doc).items() if k in COMPONENT_TITLES}
    titles = {COMPONENT_TITLES[k] for k in missing} | {f"= {t} tax" for t, parts in TAXES.items()
                                                        if any(p in missing for p in parts)}
    for case in view["cases"]:
        for t in case["tables"]:
            cols = [i for i, h in enumerate(t["header"]) if i and h in titles]
            for r in t["rows"]:
                if r and r[0] in titles:
                    r[1:] = [NOT_MEASURED] * (len(r) - 1)
                for i in cols:
                    if i < len(r):
                        r[i] = NOT_MEASURED
    if missing:
        by_why: dict = {}
        for k, why in missing.items():
            by_why.setdefault(why, []).append(COMPONENT_TITLES[k])
        view["marks"].append(("NOT MEASURED", "; ".join(f"{', '.join(names)}: {why}" for why, names in by_why.items())))
    doubt = untrusted(doc)
    if doubt:
        view["marks"].append(("UNTRUSTED", f"bulk-synchronous rows and stragglers: {doubt}"))
    return view


def meta_line(doc: dict) -> str:
    """The line naming the machine, the versions and the statistic."""
    return report_rows.meta_line(doc)


def render_markdown(doc: dict) -> str:
    view, warnings = report_view(doc, images=False), trace_warnings(doc)
    out = [f"# {md(view['title'])}", ""]
    out += [line for mark, why in view["marks"] for line in (f"> **{mark}**: {md(why)}", "")]
    out += [md(view["meta"]), ""]
    if view["summary"]["rows"]:
        out += ["## Summary", "", md_table(view["summary"]["header"], view["summary"]["rows"]), ""]
    out += [f"- **FAILED** check: {md(line)}" for line in view["failed_checks"]] + ([""] if view["failed_checks"] else [])
    out += [f"- **warning:** {md(w)}" for w in warnings] + ([""] if warnings else [])
    out += [md(view["legend"]), ""]
    for case in view["cases"]:
        out += [f"## {md(case['title'])}", ""]
        for t in case["tables"]:
            out += ([f"{t['title'].capitalize()}:", ""] if t["title"] else []) + [md_table(t["header"], t["rows"]), ""]
    for title, header, rows in trace_sections(doc):
        out += [f"### {md(title)}", "", md_table(header, rows), ""]
    return "\n".join(out)


def render_html(doc: dict) -> str:
    """One self-contained page: the document's report with its charts, then the analysis's tables."""
    view, warnings = report_view(doc, images=True), trace_warnings(doc)
    page = html_report._environment().get_template("report.html.j2").render(page_title=view["title"], docs=[view],
                                                                        css=html_report._CSS)
    extra = "".join(f"<h3>{html.escape(t)}</h3>" + html_report._html_table(h, r) for t, h, r in trace_sections(doc))
    warn = "".join(f"<p class='meta'><b>warning:</b> {html.escape(w)}</p>" for w in warnings)
    return page.replace("</body>", warn + extra + "</body>") if "</body>" in page else page + warn + extra


def render_terminal(doc: dict, console) -> None:
    from taxes.console import print_table, text

    view = report_view(doc, images=False)
    console.print(text(view["title"], "bold"))
    for mark, why in view["marks"]:
        console.print(text(f"{mark}: {why}", "bold red" if mark in ("PERTURBED", "UNTRUSTED") else "yellow"))
    if view["summary"]["rows"]:
        print_table(console, "summary", view["summary"]["header"], view["summary"]["rows"], left=1, text_columns=(1,))
    for line in view["failed_checks"]:
        console.print(text(f"FAILED check: {line}", "bold red"))
    for case in view["cases"]:
        console.print()
        console.print(text(case["title"], "bold underline"))
        for t in case["tables"]:
            print_table(console, t["title"], t["header"], t["rows"], left=2 if t["title"] == "per rank" else 1)
    for title, header, rows in trace_sections(doc):
        print_table(console, title, header, rows, left=2 if header[:2] == ["rank", "step"] else 1)


def report_text(doc: dict, fmt: str) -> str:
    """The report as text: fmt "md", "html" or "table" (the terminal's tables, drawn as plain text)."""
    if fmt == "md":
        return render_markdown(doc)
    if fmt == "html":
        return render_html(doc)
    from taxes.console import render_text

    return render_text(lambda c: render_terminal(doc, c))
