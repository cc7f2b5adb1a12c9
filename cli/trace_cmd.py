"""`taxes trace -- PROGRAM ...`: run a program with the profiler switched on from outside, then analyze its
traces (the recording lives in taxes/run/trace.py and taxes/run/trace_hook.py, the analysis in taxes/attribution/analyze.py)."""

from __future__ import annotations

import json
import os

import click

from taxes.cli.options import SECONDS
from taxes.errors import TaxesError
from taxes.run.trace import RECORDS


@click.command("trace", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out-dir", "out_dir", default="taxes-trace", show_default=True,
              help="Directory for the traces (rankR.json.gz), the plain step times and the report (each run's own).")
@click.option("--out", "out_alias", default=None, hidden=True)
@click.option("-o", "--output", default=None,
              help="Write the report here (default: stdout for table, else report.FORMAT in the --out-dir directory).")
@click.option("--force", is_flag=True, help="Replace an existing -o file.")
@click.option("--steps", type=int, default=5, show_default=True, help="Steps to profile.")
@click.option("--plain", "plain_steps", type=int, default=5, show_default=True,
              help="Steps timed without the profiler (their device time: the plain step time): before the profiled "
                   "ones, or with --record timing in blocks alternating with them.")
@click.option("--block", type=int, default=2, show_default=True,
              help="With --record timing: plain and profiled steps alternate in blocks of this many, plain-profiled "
                   "then profiled-plain, so a host whose speed drifts moves both alike (0: the plain steps first).")
@click.option("--skip", type=int, default=3, show_default=True, help="Warm-up steps before anything is timed.")
@click.option("--step", "signal", default="auto", show_default=True,
              help="What ends a step: auto (optimizer.step() or taxes.step()), nvtx:RANGE_NAME.")
@click.option("--hardware", "hardware_name", default=None,
              help="Hardware profile for the floors and locality (default: the one the trace's GPU name selects).")
@click.option("--record", type=click.Choice(RECORDS), default="auto", show_default=True,
              help="full: CPU ops, shapes, memory and tensors (locality), at a host cost per op; timing: CUDA "
                   "activity only, for programs whose host is the bottleneck (no op names, no locality); auto: "
                   "timing under torchrun (several ranks), full otherwise.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "md", "html"]), default="table", show_default=True)
@click.option("--timeout-s", type=SECONDS, default=None,
              help="Stop the program, and every process it started, after this many seconds.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def trace(ctx, out_dir, out_alias, output, force, steps, plain_steps, block, skip, signal, hardware_name, record, fmt,
          timeout_s, command):
    """Run COMMAND (a Python program, or torchrun ... for one trace per rank) with torch.profiler switched on
    from outside over a schedule of steps, time the same kind of steps without it, and analyze the traces:
    the three taxes of any PyTorch program, and what measuring cost."""
    from taxes.attribution import analyze as A
    from taxes.cli.analyze_cmd import write_report
    from taxes.documents.analysis_document import analysis_document
    from taxes.files import check_output, write_output
    from taxes.run import trace as T

    out_dir = out_alias or out_dir  # --out: the older spelling of --out-dir
    check_output(output, force)
    cmd = T.python_module_command(list(command))
    res = T.run(cmd, out_dir, steps=steps, plain=plain_steps, skip=skip, signal=signal, timeout_s=timeout_s,
                record=record, block=block)
    plain_path = os.path.join(out_dir, "plain.json")
    write_output(plain_path, json.dumps({str(r): v for r, v in res["plain"].items()}), force=True, announce=False)
    click.echo(f"taxes: traced {len(res['traces'])} rank(s) into {out_dir}; the program exited with "
               f"{res['returncode']}", err=True)
    report = output or (os.path.join(out_dir, f"report.{ {'table': 'txt'}.get(fmt, fmt) }") if fmt != "table" else None)
    if res["returncode"] not in (0, None):
        click.echo(f"taxes: warning: the program exited with {res['returncode']}; the traces are analysed anyway",
                   err=True)
    try:
        plain = T.plain_for_analysis(A.read_plain(plain_path))
        an = A.analyze(list(res["traces"]), hardware_name, plain_steps=plain)
        for w in an.warnings:
            click.echo(f"taxes: warning: {w}", err=True)
        write_report(analysis_document(an), fmt, report, force=force if output else True)
    except TaxesError as e:
        raise TaxesError(f"trace: analyze: {e}") from None
