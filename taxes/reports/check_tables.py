"""`taxes check`'s result as tables: a summary per check, then the rows that fail (or every row)."""

from __future__ import annotations

DETAIL_HEADER = ["check", "workload", "shape", "variant", "where", "value us", "reference us", "error", "cause"]


def _us(x) -> str:
    return "-" if x is None or x != x else f"{x:.1f}"


def detail_rows(frame, failing_only: bool = True) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the check rows: the failing ones, or all."""
    from taxes.reports.rows import pct

    detail = frame[~frame["ok"]] if failing_only else frame
    return DETAIL_HEADER, [[r.check, r.workload, r.shape, r.variant, r.where, _us(r.value), _us(r.reference),
                            pct(r.error), r.cause] for r in detail.itertuples()]


def check_markdown(frame, failing_only: bool = True) -> str:
    """A summary table per check, then the rows that fail (or all rows)."""
    from taxes.reports.markdown_table import md_table
    from taxes.reports.rows import checks_summary_rows

    out = [md_table(*checks_summary_rows(frame)), ""]
    header, rows = detail_rows(frame, failing_only)
    if rows:
        out += ["Failing:" if failing_only else "All:", "", md_table(header, rows), ""]
    return "\n".join(out)


def check_terminal(frame, console, failing_only: bool = True) -> None:
    from taxes.console import print_table
    from taxes.reports.rows import checks_summary_rows

    print_table(console, "checks", *checks_summary_rows(frame))
    header, rows = detail_rows(frame, failing_only)
    if rows:
        print_table(console, "failing" if failing_only else "all rows", header, rows, left=2)


def check_json(frame, failing_only: bool = True) -> str:
    """Every check row (or the failing ones) as a JSON list of objects, numbers as numbers."""
    import json

    rows = frame[~frame["ok"]] if failing_only else frame
    records = [{k: (None if isinstance(v, float) and v != v else v.item() if hasattr(v, "item") else v)
                for k, v in r.items()} for r in rows.to_dict("records")]
    return json.dumps(records, indent=1, allow_nan=False) + "\n"
