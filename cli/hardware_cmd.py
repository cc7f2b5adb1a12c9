"""`taxes hardware list|show`: the hardware profiles (taxes/model/hardware.py, tables in
taxes/model/profile_tables.py)."""

from __future__ import annotations

import click

from taxes.cli.options import emit, force_option, format_option, output_option, show


@click.group("hardware")
def hardware():
    """Hardware profiles: built-in (datasheets) and saved (calibrated)."""


@hardware.command("list")
@format_option(("table", "md", "json", "csv"))
@output_option()
@force_option()
def hardware_list(fmt, output, force):
    """List every profile with its headline figures."""
    from taxes.files import check_output
    from taxes.model.profile_tables import list_rows

    check_output(output, force)
    header, rows = list_rows()
    if fmt == "table":
        from taxes.console import print_table

        show(lambda c: print_table(c, "hardware profiles", header, rows, left=2), output, force)
    else:
        from taxes.reports.tables import table_text

        emit(table_text(header, rows, fmt, "hardware profiles"), output, force)


@hardware.command("show")
@click.argument("name")
@format_option(("table", "md", "json"), help="json: the profile itself, a file to edit and load by path.")
@output_option()
@force_option()
def hardware_show(name, fmt, output, force):
    """Every figure of one profile (NAME, or a profile .json path)."""
    from taxes.files import check_output
    from taxes.model.hardware import get_profile

    check_output(output, force)
    p = get_profile(name)
    if fmt == "json":
        import json

        from taxes.model.hardware import profile_to_dict

        emit(json.dumps(profile_to_dict(p), indent=1) + "\n", output, force)
        return
    from taxes.model.profile_tables import show_rows

    title, header, rows = show_rows(p)
    if fmt == "md":
        from taxes.reports.tables import table_markdown

        emit(table_markdown(header, rows, title), output, force)
    else:
        from taxes.console import print_table

        show(lambda c: print_table(c, title, header, rows), output, force)
