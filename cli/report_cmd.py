"""`taxes report RESULT.json...`: result documents rendered (taxes/reports/render.py)."""

from __future__ import annotations

import click

from taxes.cli.options import emit, force_option, format_option, output_option, show
from taxes.errors import TaxesError


@click.command("report")
@click.argument("results", nargs=-1, required=True, metavar="RESULT.json...")
@format_option(("table", "md", "json", "html"))
@output_option("Write the report here instead of stdout ('-' is stdout).")
@force_option()
@click.option("--hardware", "hardware_name", default=None,
              help="Re-attribute a profile with this hardware profile (e.g. a later calibration); measured times stay.")
def report(results, fmt, output, force, hardware_name):
    """Render result documents (from taxes profile, taxes model --format json or taxes analyze --format json),
    verdict first; a taxes analyze document with every table taxes analyze shows. Several documents: one
    report after another (one HTML page); --format json writes the document back with its report, so it
    takes one."""
    from taxes.console import progress, say
    from taxes.files import check_output
    from taxes.reports import render, rows

    if fmt == "html" and not output:
        raise TaxesError("--format html writes a file: give -o REPORT.html (or -o - for stdout)")
    if fmt == "json" and len(results) > 1:
        raise TaxesError(f"--format json writes one document back with its report; give one file, not {len(results)}")
    check_output(output, force)
    docs = [_read(path, hardware_name) for path in results]
    if fmt != "json" and len(docs) == 1 and docs[0]["metadata"].get("source") == "trace":
        from taxes.cli.analyze_cmd import write_report  # an analyze document: the report taxes analyze shows

        write_report(docs[0], fmt, output, force)
        return
    if fmt == "json":
        emit(render.render_json(docs[0]), output, force)
    elif fmt == "md":
        emit("\n".join(render.render_markdown(d, trace_details=True) for d in docs), output, force)
    elif fmt == "html":
        with progress("rendering the charts"):
            page = render.render_html(docs, trace_details=True)
        emit(page, output, force)
    else:
        for d in docs:
            say(rows.meta_line(d))

        def draw(console):
            for i, d in enumerate(docs):
                if i:
                    console.print()
                render.render_terminal(d, console, trace_details=True)

        show(draw, output, force)
        say(rows.LEGEND)


def _read(path: str, hardware_name: str | None) -> dict:
    """One document, re-attributed with --hardware where given."""
    from taxes.console import progress
    from taxes.documents.results import load
    from taxes.sanitize import printable

    with progress(f"reading {path}"):
        doc = load(path)
    if not doc["cases"]:
        raise TaxesError(f"{printable(path)}: the document holds no cases")
    if hardware_name:
        if doc["metadata"]["kind"] != "profile":
            raise TaxesError(f"{printable(path)}: --hardware re-attributes measured documents; this one is a "
                             f"{doc['metadata']['kind']}")
        from taxes.documents.profile_document import reattribute
        from taxes.model.hardware import get_profile

        doc = reattribute(doc, get_profile(hardware_name))
    return doc
