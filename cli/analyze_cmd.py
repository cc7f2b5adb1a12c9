"""`taxes analyze TRACE...`: the three taxes of any PyTorch program, from its torch.profiler traces (one
per rank). Registered in cli/main.py with `cli.add_command(analyze)`; the analysis lives in
taxes/analyze.py, the rules in docs/analyze.md."""

from __future__ import annotations

import io
import os
import sys

import click

from taxes.errors import TaxesError

FORMATS = ("table", "md", "json", "html")
PART_TITLES = {"compute": "compute (kernels, less locality)", "locality": "data-locality tax",
               "sync_wait": "bulk-sync: sync wait", "exposed_transfer": "bulk-sync: exposed transfer",
               "launch": "kernel-launch tax", "other_idle": "other idle (dependency, sync)",
               "unattributed": "unattributed"}
MARK = {"measured": "m", "derived": "d"}


def _fmt(v: float) -> str:
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


def sections(an) -> list[tuple[str, list[str], list[list[str]]]]:
    """The analysis as (title, header, rows) tables, shared by every format."""
    from taxes import analyze as A

    out = []
    med = A.median_step(an)
    d = an.decomposition.set_index(["rank", "step"])
    ranks = sorted(an.ranks)
    if med is not None:
        slowest = max(ranks, key=lambda r: d.loc[(r, med), "span_us"])
        cols = [(f"rank {r}", d.loc[(r, med)]) for r in ranks] + [(f"slowest (rank {slowest})", d.loc[(slowest, med)])]
        rows = [["step span (E2E_r) m"] + [_fmt(c["span_us"]) for _, c in cols]]
        rows += [[f"{PART_TITLES[p]} {MARK[A.PART_LABELS[p]]}"] + [_fmt(c[p]) for _, c in cols] for p in A.PARTS]
        rows += [[f"= {tax} tax"] + [_fmt(sum(c[p] for p in parts)) for _, c in cols] for tax, parts in A.TAX_PARTS.items()]
        out.append((f"median step {med}: parts of each rank's step, us", ["us"] + [n for n, _ in cols], rows))
    t = an.decomposition
    out.append(("every step, us", ["rank", "step", "span"] + [PART_TITLES[p].split(" (")[0] for p in A.PARTS],
                [[str(r.rank), str(r.step), _fmt(r.span_us)] + [_fmt(getattr(r, p)) for p in A.PARTS]
                 for r in t.itertuples(index=False)]))
    if not an.gaps.empty:
        g = an.gaps.groupby(["rank", "cause"])["dur_us"].agg(["count", "sum", "median"]).reset_index()
        out.append(("device idle gaps by cause (all steps)", ["rank", "cause", "gaps", "total us", "median us", "goes to"],
                    [[str(r.rank), r.cause, str(r.count), _fmt(r.sum), _fmt(r.median), A.GAP_TAX[r.cause]]
                     for r in g.itertuples(index=False)]))
    if not an.collectives.empty:
        c = an.collectives.assign(kernel=an.collectives["name"].map(_short_name))
        g = c.groupby(["kernel", "rank"]).agg(n=("dur_us", "size"), dur=("dur_us", "mean"),
                                               wait=("sync_wait_us", "sum"), skew=("skew_us", "max")).reset_index()
        out.append(("NCCL kernels (matched across ranks by name and order)",
                    ["kernel", "rank", "count", "mean us", "sync wait us (sum)", "max arrival skew us"],
                    [[r.kernel, str(r.rank), str(r.n), _fmt(r.dur), _fmt(r.wait), _fmt(r.skew)]
                     for r in g.itertuples(index=False)]))
    if not an.locality.empty:
        g = an.locality.groupby(["rank", "producer", "consumer", "shape", "dtype"]).agg(
            n=("bytes", "size"), nbytes=("bytes", "first"), us=("locality_us", "first")).reset_index()
        out.append((f"intermediates through HBM (derived at {an.hardware}'s achievable HBM bandwidth)",
                    ["rank", "written by", "read by", "shape", "dtype", "MB", "us each", "times"],
                    [[str(r.rank), r.producer, r.consumer, r.shape, r.dtype, f"{r.nbytes / 1e6:,.2f}", f"{r.us:,.2f}",
                      str(r.n)] for r in g.itertuples(index=False)]))
    return out


def _short_name(name: str) -> str:
    base = name.split("(")[0]
    return base if len(base) <= 50 else base[:47] + "..."


def _markdown(doc, secs) -> str:
    from taxes.reports import render

    out = [render.render_markdown(doc).rstrip(), ""]
    for title, header, rows in secs:
        out += [f"### {title}", "", render.md_table(header, rows), ""]
    return "\n".join(out)


def _html(doc, an, secs) -> str:
    import base64
    import html

    from taxes.reports import plots, render

    case = doc["cases"][0]
    esc = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>taxes analyze</title>"
             f"<style>{render._CSS}</style></head><body>", "<h1>taxes analyze</h1>",
             f"<p class='meta'>{esc(render._meta_line(doc))}</p>",
             "<p class='meta'>traces: " + esc(", ".join(f"rank {r}: {p}" for r, p in an.ranks.items())) + "</p>"]
    parts += [f"<p class='meta'><b>warning:</b> {esc(w)}</p>" for w in an.warnings]
    parts.append(render._html_table(*render.case_rows(case)))
    for title, header, rows in secs:
        parts.append(f"<h3>{esc(title)}</h3>" + render._html_table(header, rows))
    for png, alt in ((_parts_png(an), "parts of each rank's step, every step"),
                     (plots.timeline(case) if case["variants"][0]["phases"] else None, "timeline of the median step")):
        if png:
            parts.append(f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    parts.append("</body></html>")
    return "\n".join(parts)


def _parts_png(an) -> bytes:
    """One stacked bar per (rank, step): the parts of the step's span."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from taxes import analyze as A

    colors = {"compute": "#4C72B0", "locality": "#8172B3", "sync_wait": "#C44E52", "exposed_transfer": "#DD8452",
              "launch": "#DA8BC3", "other_idle": "#BBBBBB", "unattributed": "#CCB974"}
    d = an.decomposition
    labels = [f"r{r.rank} s{r.step}" for r in d.itertuples(index=False)]
    fig, ax = plt.subplots(figsize=(2 + 0.45 * len(labels), 4.2))
    bottom = [0.0] * len(labels)
    for p in A.PARTS:
        vals = d[p].clip(lower=0).tolist()
        ax.bar(labels, vals, bottom=bottom, color=colors[p], label=PART_TITLES[p], width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("us")
    ax.set_title("step span per rank, split into parts", fontsize=9)
    ax.tick_params(axis="x", labelsize=7, rotation=90)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _terminal(doc, secs, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from taxes.reports import render

    render.render_terminal(_markup_safe(doc), console)
    for title, header, rows in secs:
        t = Table(title=escape(title), title_style="bold")
        for i, h in enumerate(header):
            t.add_column(escape(h), justify="left" if i == 0 else "right", no_wrap=i == 0)
        for row in rows:
            t.add_row(*[escape(c) for c in row])
        console.print(t)


def _markup_safe(obj):
    from rich.markup import escape

    if isinstance(obj, dict):
        return {k: _markup_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_markup_safe(v) for v in obj]
    return escape(obj) if isinstance(obj, str) else obj


def _write(path: str, data: str, force: bool) -> None:
    """Atomically; an existing file only with --force; a failure is one line."""
    from taxes.results import write_atomic, write_error

    try:
        write_atomic(path, data, overwrite=force)
    except OSError as e:
        raise write_error(path, e) from None
    click.echo(f"wrote {path}", err=True)


@click.command("analyze")
@click.argument("traces", nargs=-1, required=True)
@click.option("--hardware", "hardware_name", default="h200-sxm", show_default=True,
              help="Profile whose HBM bandwidth prices the data-locality tax (taxes hardware list).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--force", is_flag=True, help="Replace an existing -o file.")
def analyze(traces, hardware_name, fmt, output, force):
    """Split every profiled step of torch.profiler TRACES (one .json or .json.gz per rank, of any PyTorch
    program) into compute and the three taxes, per rank."""
    from rich.console import Console

    from taxes import analyze as A
    from taxes.reports import render
    from taxes.results import dumps

    if fmt == "html" and not output:
        raise TaxesError("--format html writes a file: give -o REPORT.html")
    if output:
        if not os.path.isdir(os.path.dirname(os.path.abspath(output))):
            raise TaxesError(f"{output}: its directory does not exist")
        if os.path.lexists(output) and not force:
            raise TaxesError(f"{output}: already exists; pass --force to replace it (or choose another name)")
    an = A.analyze(traces, hardware_name)
    for w in an.warnings:
        click.echo(f"taxes: warning: {w}", err=True)
    doc = A.analysis_document(an)
    secs = sections(an)
    if fmt == "json":
        text = dumps(doc)
    elif fmt == "md":
        text = _markdown(doc, secs)
    elif fmt == "html":
        text = _html(doc, an, secs)
    else:
        Console(stderr=True, highlight=False).print(render._meta_line(doc), markup=False)
        if output:
            buf = io.StringIO()
            _terminal(doc, secs, Console(file=buf, width=160, color_system=None, highlight=False))
            text = buf.getvalue()
        else:
            _terminal(doc, secs, Console(highlight=False, width=None if sys.stdout.isatty() else 200))
            click.echo("labels: m measured, d derived; times in us per step", err=True)
            return
    if output:
        _write(output, text, force)
    else:
        click.echo(text, nl=False)
