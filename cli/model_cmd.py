"""`taxes model WORKLOAD`: the model's prediction of every variant (taxes/model/predict.py)."""

from __future__ import annotations

import os

import click

from taxes.cli.options import (complete_hardware, complete_workload, emit, force_option, format_option, gpus_option,
                               output_option, show, variants_option)
from taxes.errors import TaxesError

FORMATS = ("table", "md", "json", "csv")


@click.command("model")
@click.argument("workload", shell_complete=complete_workload)
@click.option("--hardware", "hardware_name", default="h200-sxm", show_default=True, shell_complete=complete_hardware,
              help="Built-in or saved profile name, or a profile .json path (taxes hardware list).")
@gpus_option(2)
@click.option("--shape", default="", help="Dimensions, e.g. M=8192,N=8192,K=8192 (8K works too); unset ones take defaults.")
@click.option("--dtype", default="bf16", show_default=True, help="bf16 or fp16.")
@variants_option("Comma-separated variants to model (default: all).")
@format_option(FORMATS)
@output_option()
@click.option("--plot", help="Save a chart (*.png or *.svg): components per variant, or the sweep's lines.")
@click.option("--sweep", help="Vary one dimension, doubling: e.g. M=1024:16384.")
@force_option()
def model(workload, hardware_name, gpus, shape, dtype, variants, fmt, output, plot, sweep, force):
    """Predict E2E and the three taxes of WORKLOAD (ag-gemm, gemm-rs, flash-decode, tp-mlp) for every variant."""
    from taxes.files import STDOUT, check_output
    from taxes.documents.results import model_document
    from taxes.model import predict as m
    from taxes.model.hardware import get_profile
    from taxes.sanitize import printable
    from taxes.workloads import make_workload, model_variants, parse_shape

    known = model_variants(workload)  # tp-mlp has variants of its own
    for v in variants:
        if v not in known:
            raise TaxesError(f"unknown variant {printable(v)!r}: the model knows {', '.join(known)}")
    variants = variants or known
    plot_fmt = _plot_format(plot)
    if plot and output and plot != STDOUT and os.path.abspath(plot) == os.path.abspath(output):
        raise TaxesError(f"{printable(plot)}: given as both -o and --plot; name two files")
    if plot == STDOUT and output in (None, STDOUT):
        raise TaxesError("--plot -: the chart would share stdout with the data; give -o FILE for the data")
    check_output(output, force)
    check_output(plot, force, "--plot")
    hw = get_profile(hardware_name)
    w = make_workload(workload, parse_shape(shape), gpus, dtype)
    if sweep:
        dim, values = m.parse_sweep(sweep, w)
        preds = m.sweep(w, dim, values, hw, variants)
    else:
        dim, values, preds = None, None, [m.predict_all(w, hw, variants)]
    doc = model_document(preds, hw.name, gpus)
    _print(doc, fmt, output, force, w, hw, gpus, dtype, sweep and (dim, values, preds))
    if plot:
        emit(_chart(doc, plot_fmt, sweep and (dim, values, preds)), plot, force)


def _print(doc, fmt, output, force, w, hw, gpus, dtype, swept) -> None:
    """The prediction in the chosen format; the table path loads neither pandas nor matplotlib."""
    if fmt == "json":
        from taxes.documents.results import dumps

        emit(dumps(doc), output, force)
    elif fmt == "csv":
        from taxes.documents.results import summary_frame
        from taxes.sanitize import csv_cell

        emit(summary_frame(doc).apply(lambda col: col.map(csv_cell)).to_csv(index=False), output, force)
    elif fmt == "md":
        from taxes.reports import render
        from taxes.reports.sweep import sweep_markdown

        emit(sweep_markdown(*swept) if swept else render.render_markdown(doc), output, force)
    else:
        from taxes.console import say
        from taxes.reports import render, rows
        from taxes.reports.sweep import sweep_terminal

        say(f"taxes model {w.name} on {hw.name} ({hw.source}), world {gpus}, {dtype}: predicted, us per iteration")
        show((lambda c: sweep_terminal(*swept, c)) if swept else (lambda c: render.render_terminal(doc, c)),
             output, force)
        say(rows.LEGEND_MODEL)


def _chart(doc, plot_fmt, swept) -> bytes:
    if swept:
        from taxes.reports.sweep import sweep_chart

        return sweep_chart(*swept, plot_fmt)
    from taxes.reports import plots

    return plots.stacked_bars(doc["cases"][0], plot_fmt)


def _plot_format(plot: str | None) -> str | None:
    from taxes.files import STDOUT

    if plot is None:
        return None
    if plot == STDOUT:
        return "png"
    from taxes.reports.plots import fmt_of
    from taxes.sanitize import printable

    try:
        return fmt_of(plot)
    except ValueError:
        raise TaxesError(f"--plot {printable(plot)}: the chart is a PNG or SVG file; name it *.png or *.svg") from None
