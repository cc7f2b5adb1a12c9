"""`taxes analyze TRACE...`: the taxes of any PyTorch program, from its torch.profiler traces (one per rank).
Registered in cli/main.py with `cli.add_command(analyze)`; the analysis lives in taxes/attribution/analyze.py, the
rules in docs/analyze.md. JSON output imports no plotting library."""

from __future__ import annotations

import click

from taxes.errors import TaxesError

FORMATS = ("table", "md", "json", "html")
STEP_ROWS = ("launch", "host_bound", "sync", "compile", "data_loading", "graph_gaps", "queued", "sync_wait",
             "exposed_transfer", "locality", "compute", "unattributed")
MAX_ROWS = 60  # per table; the JSON holds everything


NOT_MEASURED = "not measured"


def _fmt(v) -> str:
    if v is None or v != v:
        return "-"
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


def _cell(v, not_measured: bool) -> str:
    return NOT_MEASURED if not_measured and (v is None or v != v) else _fmt(v)


def sections(an) -> list[tuple[str, list[str], list[list[str]]]]:
    """The analysis as (title, header, rows) tables, shared by the table, md and html formats."""
    out = []
    d = an.decomposition
    rows = [[str(r.rank), str(r.step), r.flag or "", _fmt(r.span_us)] + [_cell(getattr(r, k), k in an.not_measured)
                                                                        for k in STEP_ROWS]
            for r in d.itertuples(index=False)]
    out.append(("every step, us (flagged steps are left out of the statistics)",
                ["rank", "step", "flag", "span"] + list(STEP_ROWS), rows[:MAX_ROWS]))
    w = an.what_if.pivot_table(index=["rank", "step"], columns="change", values="projected_us").reset_index() \
        if len(an.what_if) else None
    if w is not None:
        span = d.set_index(["rank", "step"])["span_us"]
        out.append(("what if, per step (predicted): the step's time with the tax removed, us",
                    ["rank", "step", "span", "CUDA graphs", "full overlap", "fusion"],
                    [[str(x["rank"]), str(x["step"]), _fmt(span[(x["rank"], x["step"])]), _fmt(x.get("graphs")),
                      _fmt(x.get("overlap")), _cell(x.get("fusion"), "locality" in an.not_measured)]
                     for x in w.to_dict("records")][:MAX_ROWS]))
    if len(an.host_frames):
        out.append(("where the host was before host-bound gaps (own time, top frames)", ["rank", "step", "frame", "us"],
                    [[str(x.rank), str(x.step), _short(x.frame, 70), _fmt(x.us)] for x in an.host_frames.itertuples(index=False)][:MAX_ROWS]))
    comm = [[str(x.rank), x.rule, str(x.activities), _fmt(x.us)] for x in an.comm_by_rule.itertuples(index=False)]
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
        from taxes.attribution.analyze import untrusted

        st = an.stragglers
        doubt = untrusted(an)
        out.append(("stragglers: per rank, at matched instances (score: its share of the wait it caused; the "
                    "straggler caused at least twice a fair share)" + (f"; {doubt}" if doubt else ""),
                    ["rank", "instances", "arrived last", "wait it caused us", "wait it suffered us", "mean lateness us",
                     "score", "straggler", "where it was while the others waited"],
                    [[str(x.rank), str(x.instances), str(x.times_last), _fmt(x.caused_wait_us), _fmt(x.suffered_wait_us),
                      _fmt(x.lateness_us), f"{x.score:.2f}", "YES" if x.straggler else "", _short(x.where, 160)]
                     for x in st.itertuples(index=False)][:MAX_ROWS]))
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


def report_view(doc: dict, an, images: bool) -> dict:
    """What every view of the analysis shows first (taxes.reports.render.html_view), with the rows the traces
    cannot support reading "not measured" wherever they appear, a NOT MEASURED mark naming what to record to
    get them, and an UNTRUSTED mark when the record cost more than taxes.attribution.analyze.UNTRUSTED of the plain step."""
    from taxes.attribution.analyze import untrusted
    from taxes.documents.method import TAXES
    from taxes.reports import html as render
    from taxes.reports.plots import COMPONENT_TITLES

    view = render.html_view(doc, images=images)
    missing = {k: why for k, why in an.not_measured.items() if k in COMPONENT_TITLES}
    titles = {COMPONENT_TITLES[k] for k in missing} | {f"= {t} tax" for t, parts in TAXES.items()
                                                        if any(p in missing for p in parts)}
    for case in view["cases"]:
        for t in case["tables"]:
            cols = [i for i, h in enumerate(t["header"]) if i and h in titles]
            for r in t["rows"]:
                if r and r[0] in titles:
                    r[1:] = [NOT_MEASURED] * (len(r) - 1)
                for i in cols:
                    if i < len(r):
                        r[i] = NOT_MEASURED
    if missing:
        by_why: dict = {}
        for k, why in missing.items():
            by_why.setdefault(why, []).append(COMPONENT_TITLES[k])
        view["marks"].append(("NOT MEASURED", "; ".join(f"{', '.join(names)}: {why}" for why, names in by_why.items())))
    doubt = untrusted(an)
    if doubt:
        view["marks"].append(("UNTRUSTED", f"bulk-synchronous rows and stragglers: {doubt}"))
    return view


def _markdown(view, secs, warnings) -> str:
    from taxes.reports import markdown_table as render
    from taxes.sanitize import markdown as md

    out = [f"# {md(view['title'])}", ""]
    out += [line for mark, why in view["marks"] for line in (f"> **{mark}**: {md(why)}", "")]
    out += [md(view["meta"]), ""]
    if view["summary"]["rows"]:
        out += ["## Summary", "", render.md_table(view["summary"]["header"], view["summary"]["rows"]), ""]
    out += [f"- **FAILED** check: {md(line)}" for line in view["failed_checks"]] + ([""] if view["failed_checks"] else [])
    out += [f"- **warning:** {md(w)}" for w in warnings] + ([""] if warnings else [])
    out += [md(view["legend"]), ""]
    for case in view["cases"]:
        out += [f"## {md(case['title'])}", ""]
        for t in case["tables"]:
            out += ([f"{t['title'].capitalize()}:", ""] if t["title"] else []) + [render.md_table(t["header"], t["rows"]), ""]
    for title, header, rows in secs:
        out += [f"### {md(title)}", "", render.md_table(header, rows), ""]
    return "\n".join(out)


def _html(view, secs, warnings) -> str:
    import html

    from taxes.reports import html as render

    page = render._environment().get_template("report.html.j2").render(page_title=view["title"], docs=[view],
                                                                        css=render._CSS)
    extra = "".join(f"<h3>{html.escape(t)}</h3>" + render._html_table(h, r) for t, h, r in secs)
    warn = "".join(f"<p class='meta'><b>warning:</b> {html.escape(w)}</p>" for w in warnings)
    return page.replace("</body>", warn + extra + "</body>") if "</body>" in page else page + warn + extra


def _terminal(view, secs, console) -> None:
    from taxes.console import print_table, text

    console.print(text(view["title"], "bold"))
    for mark, why in view["marks"]:
        console.print(text(f"{mark}: {why}", "bold red" if mark in ("PERTURBED", "UNTRUSTED") else "yellow"))
    if view["summary"]["rows"]:
        print_table(console, "summary", view["summary"]["header"], view["summary"]["rows"], left=1, text_columns=(1,))
    for line in view["failed_checks"]:
        console.print(text(f"FAILED check: {line}", "bold red"))
    for case in view["cases"]:
        console.print()
        console.print(text(case["title"], "bold underline"))
        for t in case["tables"]:
            print_table(console, t["title"], t["header"], t["rows"], left=2 if t["title"] == "per rank" else 1)
    for title, header, rows in secs:
        print_table(console, title, header, rows, left=2 if header[:2] == ["rank", "step"] else 1)


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
    from taxes.traces.classify import read_patterns_file
    from taxes.documents.io import STDOUT, check_output, write_output
    from taxes.documents.results import dumps

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
    doc = A.analysis_document(an)
    if perfetto_out:
        from taxes.reports import perfetto

        write_output(perfetto_out, perfetto.dumps(an), force)
    if fmt == "json":
        text = dumps(doc)
    else:
        secs = sections(an)
        view = report_view(doc, an, images=fmt == "html")
        if fmt == "md":
            text = _markdown(view, secs, an.warnings)
        elif fmt == "html":
            text = _html(view, secs, an.warnings)
        else:
            from taxes.console import render_text, say, stdout_console

            say(view["meta"])
            if output and output != STDOUT:
                text = render_text(lambda c: _terminal(view, secs, c))
            else:
                _terminal(view, secs, stdout_console())
                say("labels: m measured, d derived, p predicted; times in us per step")
                return
    write_output(output, text, force)
