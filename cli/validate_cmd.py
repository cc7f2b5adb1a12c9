"""`taxes validate`: the model against measurement over a grid of shapes (taxes/documents/validation.py), or
with --planted the attribution against taxes of known size (taxes/run/known_answers.py)."""

from __future__ import annotations

import os

import click

from taxes.cli.options import SECONDS, emit, force_option, format_option, gpus_option, output_option, show
from taxes.errors import TaxesError

FORMATS = ("table", "md", "json", "csv")


@click.command("validate")
@click.argument("documents", nargs=-1, metavar="[DOCUMENT]...")
@click.option("--workloads", default="ag-gemm,flash-decode", show_default=True)
@gpus_option(2)
@click.option("--hardware", "hardware_name", default=None,
              help="default: with --from, the profile the first document names, else the calibration saved for its GPUs and world; else as in profile")
@click.option("--iters", type=int, default=20, show_default=True)
@click.option("--emulate", is_flag=True)
@click.option("--from", "from_docs", multiple=True,
              help="validate existing result documents instead of running; the documents after it (a shell's glob) "
                   "are taken too")
@output_option("Write the validation table here instead of stdout (an existing directory is taken as --out-dir); "
               "--planted: the known-answer document (default: GPU-xWORLD.json in --out-dir).")
@click.option("--out-dir", default=None, metavar="DIR",
              help="Write the files here: the result documents and validation.json; --planted: GPU-xWORLD.json "
                   "(default reports/known_answer).")
@click.option("--timeout-s", type=SECONDS, default=560.0, show_default=True)
@click.option("--planted", is_flag=True, help="known answers instead: run workloads with taxes planted on purpose "
              "and check the attribution recovers each")
@click.option("--clock", type=click.Choice(["auto", "cupti", "torch.profiler"]), default="auto", show_default=True)
@click.option("--records", default=None, help="--planted: also write every case's raw records here (.json.gz)")
@click.option("--each-calibration", default=None, metavar="DIR",
              help="with --from: also the E2E error of every variant with every calibrated profile in DIR (its spread)")
@format_option(FORMATS)
@force_option()
def validate_cmd(documents, workloads, gpus, hardware_name, iters, emulate, from_docs, output, out_dir, timeout_s, planted, clock,
                 records, each_calibration, fmt, force):
    """Predicted against measured E2E and taxes over a grid of shapes: signed error per case, then the mean
    absolute error. With --planted: the attribution against taxes of known size."""
    from taxes.files import check_output
    from taxes.run.machine import no_gpu
    from taxes.run.preflight import surely_no_gpu

    if documents and planted:
        raise TaxesError(f"{_shown(documents[0])}: --planted runs its own cases and reads no documents")
    from_docs = (*from_docs, *documents)  # `--from results/*.json`: the shell hands the rest over as arguments
    if output and os.path.isdir(output) and out_dir is None:  # the older spelling: -o DIR
        output, out_dir = None, output
    if out_dir and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise TaxesError(f"--out-dir {_shown(out_dir)}: not a directory (validate writes several files there)")
    if planted:
        if not emulate and surely_no_gpu():
            raise TaxesError(no_gpu("validate"))
        return _planted(gpus, emulate, iters, clock, out_dir, timeout_s, records, fmt, output, force)
    check_output(output, force)
    if out_dir and os.path.isdir(out_dir):
        check_output(os.path.join(out_dir, "validation.json"), force, "--out-dir")  # before any work
    if not from_docs and not emulate and surely_no_gpu():
        raise TaxesError(no_gpu("validate") + "; or --from RESULT.json to validate measured documents")
    from taxes.documents import validation

    if from_docs:
        from taxes.documents.profile_document import reattribute
        from taxes.model.hardware import get_profile

        measured = [validation.measured_document(p) for p in from_docs]
        hw = get_profile(hardware_name) if hardware_name else validation.document_profile(measured[0])[0]
        docs = [reattribute(d, hw) for d in measured]  # the same measurements, floors from this profile
    else:
        from taxes.run.machine import run_hardware, run_world
        from taxes.run.validate_grid import grid_workloads, measure_grid

        names = grid_workloads(workloads)
        world = run_world(gpus, emulate)
        hw = run_hardware(hardware_name, emulate, world, "validate")
        docs = measure_grid(names, world, hw, iters, emulate, timeout_s, out_dir)
    if not docs:
        return
    summary = validation.table(docs, hw, list(from_docs), each_calibration if from_docs else None)
    _print(summary, fmt, output, force)
    if out_dir:
        _save_summary(summary, out_dir, force)


def _print(summary: dict, fmt: str, output: str | None, force: bool) -> None:
    from taxes.reports import validation_table as vt

    if fmt == "json":
        import json

        emit(json.dumps(summary, indent=1, allow_nan=False) + "\n", output, force)
        return
    header, rows = vt.rows(summary)
    if fmt == "csv":
        from taxes.reports.tables import table_csv

        emit(table_csv(header, rows), output, force)
    elif fmt == "md":
        from taxes.reports.tables import table_markdown
        from taxes.sanitize import markdown

        emit(table_markdown(header, rows, vt.title(summary)) + "\n"
             + "".join(f"- {markdown(line)}\n" for line in vt.summary_lines(summary)), output, force)
    else:
        from taxes.console import print_table, say

        show(lambda c: print_table(c, vt.title(summary), header, rows, left=4), output, force)
        for line in vt.summary_lines(summary):
            say(line)


def _save_summary(summary: dict, out_dir: str, force: bool) -> None:
    import json

    from taxes.files import announce_written, write_atomic, write_error

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "validation.json")
    try:
        write_atomic(path, json.dumps(summary, indent=1, allow_nan=False) + "\n", overwrite=force)
    except OSError as e:
        raise write_error(path, e) from None
    announce_written(path)


def _planted(gpus, emulate, iters, clock, out_dir, timeout_s, records, fmt, output, force) -> None:
    """Known answers: measured, written to -o FILE (the document is the product) or DIR/GPU-xWORLD.json,
    shown on stdout."""
    from taxes.files import announce_written, check_output
    from taxes.run.known_answers import known_answer_path, known_answer_rows, run_planted
    from taxes.run.machine import run_world

    path = output or known_answer_path(out_dir, run_world(gpus, emulate), emulate)
    if os.path.isdir(os.path.dirname(os.path.abspath(path))):  # else run_planted makes the directory
        check_output(path, force, "-o" if output else "--out-dir")
    check_output(records, force, "--records")
    rows, path = run_planted(gpus, emulate, iters, clock, path, timeout_s, records)
    header, table = known_answer_rows(rows)
    if fmt == "json":
        import json

        emit(json.dumps(rows, indent=1) + "\n", None)
    elif fmt == "table":
        from taxes.console import print_table, say
        from taxes.run.planted_answers import summary

        show(lambda c: print_table(c, "known answers", header, table, left=2), None, False)
        say(summary(rows))
    else:
        from taxes.reports.tables import table_text

        emit(table_text(header, table, fmt, "known answers"), None)
    if path:
        announce_written(path)


def _shown(text) -> str:
    from taxes.sanitize import printable

    return printable(text)
