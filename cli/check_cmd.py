"""`taxes check`: does a measured result document meet the method's own checks (taxes/documents/checks.py)?
Exit 0 when every check holds, 1 when any fails (a CI gate on measuring itself); --strict also fails
documents made from a dirty checkout or whose measured variants have no rows; 2 on bad input."""

from __future__ import annotations

import click

from taxes.cli.options import force_option, format_option, output_option, show
from taxes.errors import TaxesError


@click.command("check")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--hardware", "hardware_name", default=None,
              help="Re-attribute the documents with this hardware profile first (measured times stay).")
@click.option("--all", "show_all", is_flag=True, help="List every row, not only the failing ones.")
@click.option("--strict", is_flag=True, help="Also fail documents from a dirty checkout or without rows.")
@format_option(("md", "table", "json", "csv"), default="md")
@output_option()
@force_option()
def check_cmd(results, hardware_name, show_all, strict, fmt, output, force):
    """The method's checks on measured result documents: the rows add up to the E2E above them (0.1%),
    measuring cost at most 3% of plain E2E, unattributed within 5% of E2E, and launch + host_bound of the
    timeline against the E2E ladder bsp - graph within 20%. Exit 1 when any fails. Documents that hold no
    measurement (model documents) are skipped with a note; when none is measured, that is an error."""
    from taxes.console import say
    from taxes.documents.checks import all_checks, checks_frame, provenance_problems
    from taxes.files import check_output
    from taxes.documents.results import load
    from taxes.sanitize import path as shown

    check_output(output, force)
    frames, problems, not_measured = [], [], []
    for path in results:
        doc = load(path)
        if doc["metadata"].get("kind") != "profile":  # a model (predicted) document has nothing to check
            not_measured.append((path, doc["metadata"].get("kind")))
            continue
        if hardware_name:
            from taxes.documents.profile_document import reattribute
            from taxes.model.hardware import get_profile

            doc = reattribute(doc, get_profile(hardware_name))
        frames.append(checks_frame(doc))
        problems += [f"{shown(path)}: {p}" for p in provenance_problems(doc)]
    if not_measured and not frames:
        path, kind = not_measured[0]
        raise TaxesError(f"{shown(path)}: checks need a measured document (taxes profile); this one is a {kind}"
                         + (f" (and {len(not_measured) - 1} more like it)" if len(not_measured) > 1 else ""))
    if not_measured:
        say(f"taxes check: skipped {len(not_measured)} document(s) that hold no measurement: "
            + ", ".join(f"{shown(p)} ({k})" for p, k in not_measured[:3]) + (" ..." if len(not_measured) > 3 else ""))
    frame = all_checks(frames)
    if frame.empty and not strict:
        raise TaxesError("no checks: the documents hold no attributed variants (measured under older rules? "
                         "`taxes report` shows their E2E)")
    _print(frame, fmt, not show_all, problems if strict else [], output, force)
    failed = int((~frame["ok"]).sum()) if not frame.empty else 0
    if failed or (strict and problems):
        say(f"taxes check: {failed} failing check row{'s' if failed != 1 else ''}"
            + (f", {len(problems)} strict problem{'s' if len(problems) != 1 else ''}" if strict and problems else ""))
        raise SystemExit(1)


def _print(frame, fmt: str, failing_only: bool, problems: list[str], output: str | None, force: bool) -> None:
    from taxes.files import write_output
    from taxes.reports import check_tables as ct

    if fmt == "table":
        def draw(console):
            if not frame.empty:
                ct.check_terminal(frame, console, failing_only)
            for p in problems:
                console.print(f"strict: {p}")

        show(draw, output, force)
        return
    if fmt in ("json", "csv"):  # the data alone on stdout; the strict problems as lines on stderr
        from taxes.console import say

        for p in problems:
            say(f"taxes check: strict: {p}")
    if fmt == "json":
        text = ct.check_json(frame, failing_only) if not frame.empty else "[]\n"
    elif fmt == "csv":
        from taxes.reports.tables import table_csv

        text = table_csv(*ct.detail_rows(frame, failing_only)) if not frame.empty else ""
    else:
        from taxes.sanitize import markdown

        text = ct.check_markdown(frame, failing_only) if not frame.empty else ""
        text += "".join(f"strict: {markdown(p)}\n" for p in problems)
    write_output(output, text, force)
