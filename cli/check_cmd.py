"""`taxes check`: does a measured result document meet the method's own checks (taxes/documents/checks.py)?
Registered in cli/main.py. Exit 0 when every check holds, 1 when any fails (a CI gate on measuring itself);
--strict also fails documents made from a dirty checkout or whose measured variants have no rows; 2 on bad
input."""

from __future__ import annotations

import click

from taxes.errors import TaxesError


def _us(x) -> str:
    return "-" if x is None or x != x else f"{x:.1f}"


def check_markdown(frame, failing_only: bool = True) -> str:
    """A summary table per check, then the rows that fail (or all rows)."""
    from taxes.reports.markdown_table import md_table
    from taxes.reports.rows import checks_summary_rows, pct

    out = [md_table(*checks_summary_rows(frame)), ""]
    detail = frame[~frame["ok"]] if failing_only else frame
    if len(detail):
        out += ["Failing:" if failing_only else "All:", "",
                md_table(["check", "workload", "shape", "variant", "where", "value us", "reference us", "error", "cause"],
                         [[r.check, r.workload, r.shape, r.variant, r.where, _us(r.value), _us(r.reference), pct(r.error),
                           r.cause] for r in detail.itertuples()]), ""]
    return "\n".join(out)


@click.command("check")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--hardware", "hardware_name", default=None,
              help="Re-attribute the documents with this hardware profile first (measured times stay).")
@click.option("--all", "show_all", is_flag=True, help="List every row, not only the failing ones.")
@click.option("--strict", is_flag=True, help="Also fail documents from a dirty checkout or without rows.")
@click.option("-o", "--output", help="Write the Markdown here instead of stdout ('-' is stdout).")
@click.option("--force", is_flag=True, help="Replace an -o file that already exists.")
def check_cmd(results, hardware_name, show_all, strict, output, force):
    """The method's checks on measured result documents: the rows add up to the E2E above them (0.1%),
    measuring cost at most 3% of plain E2E, unattributed within 5% of E2E, and launch + host_bound of the
    timeline against the E2E ladder bsp - graph within 20%. Exit 1 when any fails. Documents that hold no
    measurement (model documents) are skipped with a note; when none is measured, that is an error."""
    from taxes.documents.checks import all_checks, checks_frame, provenance_problems
    from taxes.console import say
    from taxes.documents.io import check_output, write_output
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
            from taxes.model.hardware import get_profile
            from taxes.documents.profile_document import reattribute

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
    text = check_markdown(frame, failing_only=not show_all) if not frame.empty else ""
    if strict:
        from taxes.sanitize import markdown

        text += "".join(f"strict: {markdown(p)}\n" for p in problems)
    write_output(output, text, force)
    failed = int((~frame["ok"]).sum()) if not frame.empty else 0
    if failed or (strict and problems):
        say(f"taxes check: {failed} failing check row{'s' if failed != 1 else ''}"
            + (f", {len(problems)} strict problem{'s' if len(problems) != 1 else ''}" if strict and problems else ""))
        raise SystemExit(1)
