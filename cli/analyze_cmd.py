"""`taxes analyze TRACE...`: the taxes of any PyTorch program, from its torch.profiler traces (one per rank).
Registered in cli/main.py with `cli.add_command(analyze)`; the analysis lives in taxes/analyze.py, the
rules in docs/analyze.md. JSON output imports no plotting library."""

from __future__ import annotations

import os
import re

import click

from taxes.errors import TaxesError

FORMATS = ("table", "md", "json", "html")
STEP_ROWS = ("launch", "host_bound", "sync", "compile", "data_loading", "graph_gaps", "queued", "sync_wait",
             "exposed_transfer", "locality", "compute", "unattributed")
MAX_ROWS = 60  # per table; the JSON holds everything


def _fmt(v) -> str:
    if v is None or v != v:
        return "-"
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


def sections(an) -> list[tuple[str, list[str], list[list[str]]]]:
    """The analysis as (title, header, rows) tables, shared by the table, md and html formats."""
    out = []
    d = an.decomposition
    rows = [[str(r.rank), str(r.step), r.flag or "", _fmt(r.span_us)] + [_fmt(getattr(r, k)) for k in STEP_ROWS]
            for r in d.itertuples(index=False)]
    out.append(("every step, us (flagged steps are left out of the statistics)",
                ["rank", "step", "flag", "span"] + list(STEP_ROWS), rows[:MAX_ROWS]))
    w = an.what_if.pivot_table(index=["rank", "step"], columns="change", values="projected_us").reset_index() \
        if len(an.what_if) else None
    if w is not None:
        span = d.set_index(["rank", "step"])["span_us"]
        out.append(("what if, per step (predicted): the step's time with the tax removed, us",
                    ["rank", "step", "span", "CUDA graphs", "full overlap", "fusion"],
                    [[str(x.rank), str(x.step), _fmt(span[(x.rank, x.step)]), _fmt(x.graphs), _fmt(x.overlap), _fmt(x.fusion)]
                     for x in w.itertuples(index=False)][:MAX_ROWS]))
    if len(an.host_frames):
        out.append(("where the host was before host-bound gaps (own time, top frames)", ["rank", "step", "frame", "us"],
                    [[str(x.rank), str(x.step), _short(x.frame, 70), _fmt(x.us)] for x in an.host_frames.itertuples(index=False)][:MAX_ROWS]))
    comm = []
    for r, tl in sorted(an.timelines.items()):
        a = tl.activities[tl.activities["comm"] != ""]
        for rule, g in a.groupby("comm"):
            comm.append([str(r), rule, str(len(g)), _fmt(float((g["end_us"] - g["start_us"]).sum()))])
    if comm:
        out.append(("communication, by the rule that classified it", ["rank", "rule", "activities", "us"], comm))
    if len(an.instances):
        inst = an.instances
        out.append((f"collective instances ({len(inst)}; {int((~inst['matched']).sum())} unmatched)",
                    ["instance", "kernel", "step", "identified by", "ranks", "matched", "arrival skew us", "slowest rank",
                     "max wait us"],
                    [[_short(x.key, 40), _short(x.name, 40), str(x.step), x.source, str(x.n_ranks), "yes" if x.matched else "NO",
                      _fmt(x.skew_us), str(x.slowest_rank) if x.matched else "-", _fmt(x.max_wait_us)]
                     for x in inst.itertuples(index=False)][:MAX_ROWS]))
        st = an.stragglers
        out.append(("stragglers: per rank, at matched instances", ["rank", "instances", "arrived last", "wait it caused us",
                                                                   "wait it paid us"],
                    [[str(x.rank), str(x.instances), str(x.times_last), _fmt(x.caused_wait_us), _fmt(x.own_wait_us)]
                     for x in st.itertuples(index=False)]))
    if len(an.locality):
        g = an.locality.groupby(["rank", "producer", "consumer", "source"]).agg(
            n=("bytes", "size"), mb=("moved_bytes", "sum")).reset_index()
        out.append(("intermediates through device memory (producer -> consumer)",
                    ["rank", "written by", "read by", "evidence", "times", "MB moved"],
                    [[str(x.rank), _short(x.producer, 40), _short(x.consumer, 40), x.source, str(x.n), f"{x.mb / 1e6:,.2f}"]
                     for x in g.itertuples(index=False)][:MAX_ROWS]))
    return out


def _short(name: str, n: int) -> str:
    name = str(name)
    return name if len(name) <= n else name[: n - 3] + "..."


def _markdown(doc, secs) -> str:
    from taxes.reports import render

    out = [render.render_markdown(doc).rstrip(), ""]
    for title, header, rows in secs:
        out += [f"### {title}", "", render.md_table(header, rows), ""]
    return "\n".join(out)


def _html(doc, secs) -> str:
    import html

    from taxes.reports import render

    page = render.render_html(doc)
    extra = "".join(f"<h3>{html.escape(t)}</h3>" + render._html_table(h, r) for t, h, r in secs)
    warn = "".join(f"<p class='meta'><b>warning:</b> {html.escape(w)}</p>" for w in doc["metadata"].get("warnings", []))
    return page.replace("</body>", warn + extra + "</body>") if "</body>" in page else page + warn + extra


def _terminal(doc, secs, console) -> None:
    from taxes.console import print_table
    from taxes.reports import render

    render.render_terminal(doc, console)  # rich Text cells: a name from the trace is shown, never read as markup
    for title, header, rows in secs:
        print_table(console, title, header, rows, left=2 if header[:2] == ["rank", "step"] else 1)


_RANK = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def _pair_execution_traces(traces, ets) -> dict:
    """--et files to traces: by the rankN both names carry, else in the order given."""
    if not ets:
        return {}
    if len(ets) > len(traces):
        raise TaxesError(f"{len(ets)} execution traces (--et) for {len(traces)} traces")
    by_rank = {int(m.group(1)): t for t in traces if (m := _RANK.search(os.path.basename(t)))}
    out = {}
    for i, e in enumerate(ets):
        m = _RANK.search(os.path.basename(e))
        if m and int(m.group(1)) in by_rank:
            out[by_rank[int(m.group(1))]] = e
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
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--force", is_flag=True, help="Replace an existing -o / --perfetto file.")
def analyze(traces, hardware_name, plain_file, comm_patterns, patterns_file, execution_traces, perfetto_out, jobs,
            fmt, output, force):
    """Split every step of torch.profiler TRACES (one .json or .json.gz per rank, of any PyTorch program)
    into compute and the taxes, per rank."""
    from taxes import analyze as A
    from taxes.classify import read_patterns_file
    from taxes.io import STDOUT, check_output, write_output
    from taxes.results import dumps

    if fmt == "html" and (not output or output == STDOUT):
        raise TaxesError("--format html writes a file: give -o REPORT.html")
    if perfetto_out == STDOUT:
        raise TaxesError("--perfetto -: the Perfetto trace is a file; give it a name")
    check_output(output, force)
    check_output(perfetto_out, force, "--perfetto")
    patterns = list(comm_patterns) + (read_patterns_file(patterns_file) if patterns_file else [])
    plain = A.read_plain(plain_file) if plain_file else None
    an = A.analyze(list(traces), hardware_name, plain_steps=plain, comm_patterns=tuple(patterns),
                   execution_traces=_pair_execution_traces(list(traces), list(execution_traces)), jobs=jobs)
    for w in an.warnings:
        click.echo(f"taxes: warning: {w}", err=True)
    doc = A.analysis_document(an)
    if perfetto_out:
        from taxes import perfetto

        write_output(perfetto_out, perfetto.dumps(an), force)
    if fmt == "json":
        text = dumps(doc)
    else:
        secs = sections(an)
        if fmt == "md":
            text = _markdown(doc, secs)
        elif fmt == "html":
            text = _html(doc, secs)
        else:
            from taxes.console import render_text, say, stdout_console
            from taxes.reports import render

            say(render._meta_line(doc))
            if output and output != STDOUT:
                text = render_text(lambda c: _terminal(doc, secs, c))
            else:
                _terminal(doc, secs, stdout_console())
                say("labels: m measured, d derived, p predicted; times in us per step")
                return
    write_output(output, text, force)
