"""`taxes check`: does a measured result document meet the method's own checks (taxes/checks.py)?
Registered in cli/main.py. Exit 0 when every check holds or without --strict; 1 with --strict when any
fails (a CI gate on measuring itself), 2 on bad input."""

from __future__ import annotations

import click

from taxes.errors import TaxesError


def _us(x) -> str:
    return "-" if x is None or x != x else f"{x:.1f}"


def check_markdown(frame, failing_only: bool = True) -> str:
    """A summary table per check, then the rows that fail (or all rows)."""
    from taxes.reports.render import checks_summary_rows, md_table, pct

    out = [md_table(*checks_summary_rows(frame)), ""]
    detail = frame[~frame["ok"]] if failing_only else frame
    if len(detail):
        out += ["Failing:" if failing_only else "All:", "",
                md_table(["check", "workload", "shape", "variant", "where", "value us", "reference us", "error"],
                         [[r.check, r.workload, r.shape, r.variant, r.where, _us(r.value), _us(r.reference), pct(r.error)]
                          for r in detail.itertuples()]), ""]
    return "\n".join(out)


@click.command("check")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--hardware", "hardware_name", default=None,
              help="Re-attribute the documents with this hardware profile first (measured times stay).")
@click.option("--all", "show_all", is_flag=True, help="List every row, not only the failing ones.")
@click.option("--strict", is_flag=True, help="Exit 1 if any check fails.")
def check_cmd(results, hardware_name, show_all, strict):
    """The method's checks on measured result documents: unattributed < 5% of E2E, instrumented E2E within
    2% of plain, the launch tax of the timeline and of the ladder within 20%, events against torch.profiler
    within 5%."""
    import pandas as pd

    from taxes.checks import checks_frame
    from taxes.results import load

    frames = []
    for path in results:
        doc = load(path)
        if doc["metadata"].get("kind") != "profile":
            raise TaxesError(f"{path}: checks need a measured document (taxes profile); this one is a "
                             f"{doc['metadata'].get('kind')}")
        if hardware_name:
            from taxes.hardware import get_profile
            from taxes.profiling import reattribute

            doc = reattribute(doc, get_profile(hardware_name))
        frames.append(checks_frame(doc))
    frame = pd.concat(frames, ignore_index=True) if frames else checks_frame({"cases": []})
    if frame.empty:
        raise TaxesError("no checks: the documents hold no attributed variants")
    click.echo(check_markdown(frame, failing_only=not show_all))
    if strict and not bool(frame["ok"].all()):
        raise SystemExit(1)
