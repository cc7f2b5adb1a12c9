"""`taxes analyze TRACE...`: the taxes of any PyTorch program, from its torch.profiler traces (one per rank).
Registered in cli/main.py with `cli.add_command(analyze)`; the analysis lives in taxes/attribution/analyze.py, its
document in taxes/documents/analysis_document.py, its report in taxes/reports/analysis_report.py, the rules in
docs/analyze.md. JSON output imports no plotting library."""

from __future__ import annotations

import click

from taxes.errors import TaxesError

FORMATS = ("table", "md", "json", "html")


def write_report(doc: dict, fmt: str, output: str | None, force: bool) -> None:
    """The analysis document's report (taxes.reports.analysis_report) in `fmt`, to `output` (a file, or
    stdout when none); json writes the document itself."""
    from taxes.files import STDOUT, write_output

    if fmt == "json":
        from taxes.documents.results import dumps

        text = dumps(doc)
    else:
        from taxes.reports import analysis_report as R  # draws charts: not imported for JSON

        if fmt == "table":
            from taxes.console import say, stdout_console

            say(R.meta_line(doc))
            if not output or output == STDOUT:
                R.render_terminal(doc, stdout_console())
                say(R.LABELS)
                return
        text = R.report_text(doc, fmt)
    write_output(output, text, force)


def _pair_execution_traces(traces, ets) -> dict:
    """--et files to traces: by the rankN both names carry, else in the order given."""
    from taxes.traces.kineto import name_rank

    if not ets:
        return {}
    if len(ets) > len(traces):
        raise TaxesError(f"{len(ets)} execution traces (--et) for {len(traces)} traces")
    by_rank = {r: t for t in traces if (r := name_rank(t)) is not None}
    out = {}
    for i, e in enumerate(ets):
        r = name_rank(e)
        if r is not None and r in by_rank:
            out[by_rank[r]] = e
        elif len(ets) == len(traces):
            out[traces[i]] = e
        else:
            raise TaxesError(f"--et {e}: cannot tell which trace it belongs to (put rankN in both file names)")
    return out


@click.command("analyze")
@click.argument("traces", nargs=-1, required=True)
@click.option("--hardware", "hardware_name", default=None,
              help="Hardware profile (name or .json path); default: the one the traces' GPU name selects.")
@click.option("--plain", "plain_file", type=click.Path(dir_okay=False),
              help='Step times measured without the profiler: JSON {"<rank>": [us per step, ...]}.')
@click.option("--comm-pattern", "comm_patterns", multiple=True,
              help="Regular expression: kernels whose name it matches are communication (repeatable).")
@click.option("--comm-patterns", "patterns_file", type=click.Path(dir_okay=False),
              help="A file of such expressions, one per line (# comments).")
@click.option("--et", "execution_traces", multiple=True,
              help="A rank's execution trace (ExecutionTraceObserver JSON), for locality from tensor identity; "
                   "also found as NAME.et.json beside NAME.json.")
@click.option("--perfetto", "perfetto_out", type=click.Path(dir_okay=False),
              help="Also write a Perfetto/Chrome trace with the attribution as tracks beside the kernels.")
@click.option("--jobs", type=click.IntRange(1, 256), default=None, help="Worker processes (default: one per core).")
@click.option("--scheduler", default=None, envvar="DASK_SCHEDULER_ADDRESS", show_envvar=True,
              help="A Dask scheduler's address (tcp://HOST:PORT): read and attribute the ranks on its workers, which "
                   "must see the trace paths and import taxes (pip install 'taxes[dask]').")
@click.option("--allow-special-files", "special_files", is_flag=True,
              help="Read traces, --plain and --comm-patterns from FIFOs and devices too (refused otherwise: they may "
                   "block or never end).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--force", is_flag=True, help="Replace an existing -o / --perfetto file.")
def analyze(traces, hardware_name, plain_file, comm_patterns, patterns_file, execution_traces, perfetto_out, jobs,
            scheduler, special_files, fmt, output, force):
    """Split every step of torch.profiler TRACES (one .json or .json.gz per rank, of any PyTorch program)
    into compute and the taxes, per rank."""
    from taxes.attribution import analyze as A
    from taxes.documents.analysis_document import analysis_document
    from taxes.traces.classify import read_patterns_file
    from taxes.files import STDOUT, check_output, write_output

    if fmt == "html" and (not output or output == STDOUT):
        raise TaxesError("--format html writes a file: give -o REPORT.html")
    if perfetto_out == STDOUT:
        raise TaxesError("--perfetto -: the Perfetto trace is a file; give it a name")
    check_output(output, force)
    check_output(perfetto_out, force, "--perfetto")
    patterns = list(comm_patterns) + (read_patterns_file(patterns_file, special_files) if patterns_file else [])
    plain = A.read_plain(plain_file, special_files) if plain_file else None
    an = A.analyze(list(traces), hardware_name, plain_steps=plain, comm_patterns=tuple(patterns),
                   execution_traces=_pair_execution_traces(list(traces), list(execution_traces)), jobs=jobs,
                   scheduler=scheduler or None, special_files=special_files,
                   keep_timelines=True if perfetto_out else None)
    for w in an.warnings:
        click.echo(f"taxes: warning: {w}", err=True)
    doc = analysis_document(an)
    if perfetto_out:
        from taxes.reports import perfetto

        write_output(perfetto_out, perfetto.dumps(an), force)
    write_report(doc, fmt, output, force)
