"""A result document's report on a rich console."""

from __future__ import annotations

from taxes.reports.rows import E2E_ROW, E2E_ROW_MODEL, checks_rows, sections
from taxes.reports.analysis import trace_sections, trace_warnings
from taxes.reports.verdict import failed_checks, marks, summary_rows, title

_MARK_STYLE = {"EMULATED": "bold red", "PREDICTED": "bold yellow", "PERTURBED": "bold red", "NO ROWS": "yellow",
               "DIRTY": "yellow"}
_ROW_STYLE = {E2E_ROW: "bold", E2E_ROW_MODEL: "bold", "speed-up vs bsp": "bold"}


def render_terminal(doc: dict, console, head: bool = True, trace_details: bool = False) -> None:
    """The report on a rich console: title, marks, summary (one table whatever the width: its text wraps),
    failed checks, then the details (every table folded to the console's width, never cut); with
    trace_details, a `taxes analyze` document's own tables after them (trace_sections)."""
    from taxes.console import print_table, text

    if head:
        console.print(text(title(doc), "bold"))
        for mark, why in marks(doc):
            console.print(text(f"{mark}: {why}", _MARK_STYLE.get(mark)))
        header, rows, failed = summary_rows(doc)
        if rows:
            checks = header.index("checks") if "checks" in header else -1
            print_table(console, "summary", header, rows, left=1, text_columns=tuple(range(1, len(header))),
                        cell_styles={(i, checks): "bold red" for i, bad in enumerate(failed) if bad}, fold=False)
        for line in failed_checks(doc):
            console.print(text(f"FAILED check: {line}", "bold red"))
    for case_name, tables in sections(doc):
        console.print()
        console.print(text(case_name, "bold underline"))
        for name, header, rows in tables:
            styles = [_ROW_STYLE.get(r[0], "dim" if r[0].startswith("=") else None) for r in rows]
            print_table(console, name, header, rows, left=2 if name == "per rank" else 1, row_styles=styles)
    cr = checks_rows(doc)
    if cr:
        bad = {i: "bold red" for i, r in enumerate(cr[1]) if r[2].endswith("FAIL")}
        print_table(console, "checks of the measurement", *cr, cell_styles={(i, 2): s for i, s in bad.items()})
    if trace_details:
        for name, header, rows in trace_sections(doc):
            print_table(console, name, header, rows, left=2 if header[:2] == ["rank", "step"] else 1)
        for w in trace_warnings(doc):
            console.print(text(f"warning: {w}", "yellow"))
