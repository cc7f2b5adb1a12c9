"""`taxes`: the command line. Each command is a thin layer over functions in taxes/."""

from __future__ import annotations

import io
import os
import sys

import click

import taxes
from taxes.errors import TaxesError

FORMATS = ("table", "json", "md", "csv")


class TaxesGroup(click.Group):
    """Every failure the user can fix ends as one line on stderr and exit code 2; never a traceback."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        if not args:
            click.echo(self.get_help(click.Context(self, info_name="taxes")))
            sys.exit(0)
        try:
            rv = super().main(args=args, prog_name=prog_name or "taxes", standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            _die("interrupted", 130)
        except click.ClickException as e:
            _die(e.format_message(), 2)
        except TaxesError as e:
            _die(str(e), 2)
        except KeyboardInterrupt:
            _die("interrupted", 130)
        except BrokenPipeError:
            sys.stderr.close()  # the reader went away (e.g. `| head`); nothing more to say
            sys.exit(0)
        except Exception as e:  # a bug in taxes: still one line, with the way to see more
            if os.environ.get("TAXES_DEBUG"):
                raise
            _die(f"internal error: {type(e).__name__}: {e} (set TAXES_DEBUG=1 for the traceback)", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _die(message: str, code: int):
    text = " ".join(str(message).split())
    click.echo(f"taxes: error: {text}", err=True)
    sys.exit(code)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _stdout_console():
    """Tables on stdout; when stdout is not a terminal, wide enough that no column is truncated."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


FORCE_HELP = "Replace output files that already exist (without it, an existing file is an error)."


def _refuse_existing(paths, force: bool) -> None:
    """Before any work: an existing output file is kept unless --force (one line naming it)."""
    if force:
        return
    for path in filter(None, paths):
        if os.path.lexists(path):
            raise TaxesError(f"{path}: already exists; pass --force to replace it (or choose another name)")


def _emit_file(path: str, data: str | bytes, force: bool = False) -> None:
    """Write a file atomically; without force an existing file is refused (checked again as it is
    published, so a file that appeared meanwhile is not clobbered); a failure is one line."""
    from taxes.results import write_atomic, write_error

    try:
        write_atomic(path, data, overwrite=force)
    except OSError as e:
        raise write_error(path, e) from None
    _stderr_console().print(f"wrote {_escape(path)}")


def _emit(text: str | bytes, output: str | None, force: bool = False) -> None:
    """Data to -o FILE (atomically) or to stdout."""
    if output:
        _emit_file(output, text, force)
    else:
        click.echo(text, nl=False)


def _escape(text) -> str:
    """Text from files or the user, printed through rich: brackets are shown, not read as markup."""
    from rich.markup import escape

    return escape(str(text))


def _markup_safe(obj):
    """A copy of a document whose strings (keys too) print as themselves through rich; names without
    brackets (every name taxes writes) are unchanged."""
    if isinstance(obj, dict):
        return {(_escape(k) if isinstance(k, str) else k): _markup_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_markup_safe(v) for v in obj]
    return _escape(obj) if isinstance(obj, str) else obj


def _table_text(render) -> str:
    """Render rich output to plain text (for -o FILE)."""
    from rich.console import Console

    buf = io.StringIO()
    render(Console(file=buf, width=160, color_system=None, highlight=False))
    return buf.getvalue()


@click.group(cls=TaxesGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(taxes.__version__, prog_name="taxes")
def cli():
    """Profile and model the three multi-GPU performance taxes: bulk-synchronous, data-locality and
    kernel-launch."""


# ---- taxes model ----------------------------------------------------------------------------------


@cli.command()
@click.argument("workload")
@click.option("--hardware", "hardware_name", default="h200-sxm", show_default=True,
              help="Built-in or saved profile name, or a profile .json path (taxes hardware list).")
@click.option("--world", type=int, default=2, show_default=True, help="Number of GPUs (ranks).")
@click.option("--shape", default="", help="Dimensions, e.g. M=8192,N=8192,K=8192 (8K works too); unset ones take defaults.")
@click.option("--dtype", default="bf16", show_default=True, help="bf16 or fp16.")
@click.option("--variant", "variants", multiple=True, help="Variant(s) to model (repeatable); default: all.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the data here instead of stdout.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Save a PNG: components per variant, or the sweep's lines.")
@click.option("--sweep", help="Vary one dimension, doubling: e.g. M=1024:16384.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def model(workload, hardware_name, world, shape, dtype, variants, fmt, output, plot, sweep, force):
    """Predict E2E and the three taxes of WORKLOAD (ag-gemm, gemm-rs, flash-decode, tp-mlp) for every variant."""
    from taxes import model as m
    from taxes.hardware import get_profile
    from taxes.reports import render
    from taxes.results import dumps, model_document, summary_frame
    from taxes.workloads import make_workload, model_variants, parse_shape

    known = model_variants(workload)  # tp-mlp has variants of its own
    for v in variants:
        if v not in known:
            raise TaxesError(f"unknown variant {v!r}: the model knows {', '.join(known)}")
    variants = tuple(dict.fromkeys(variants)) or known
    if plot and not plot.lower().endswith(".png"):
        raise TaxesError(f"--plot {plot}: the plot is a PNG file; name it *.png")
    for path in filter(None, (plot, output)):
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise TaxesError(f"{path}: its directory does not exist")
    if plot and output and os.path.abspath(plot) == os.path.abspath(output):
        raise TaxesError(f"{plot}: given as both -o and --plot; name two files")
    _refuse_existing((output, plot), force)
    hw = get_profile(hardware_name)
    w = make_workload(workload, parse_shape(shape), world, dtype)
    if sweep:
        dim, values = m.parse_sweep(sweep, w)
        preds = m.sweep(w, dim, values, hw, variants)
    else:
        dim, values, preds = None, None, [m.predict_all(w, hw, variants)]
    doc = model_document(preds, hw.name, world)

    if fmt == "json":
        _emit(dumps(doc), output, force)
    elif fmt == "csv":
        _emit(summary_frame(doc).to_csv(index=False), output, force)
    elif fmt == "md":
        _emit(_sweep_markdown(dim, values, preds) if sweep else render.render_markdown(doc), output, force)
    else:
        err = _stderr_console()
        err.print(f"[bold]taxes model[/bold] {w.name} on {_escape(hw.name)} ({_escape(hw.source)}), world {world}, "
                  f"{dtype}: predicted, us per iteration")
        safe = _markup_safe(doc)
        draw = (lambda c: _sweep_terminal(dim, values, preds, c)) if sweep else (lambda c: render.render_terminal(safe, c))
        if output:
            _emit(_table_text(draw), output, force)
        else:
            draw(_stdout_console())
        err.print(render.LEGEND)
    if plot:
        from taxes.reports import plots

        png = _sweep_png(dim, values, preds) if sweep else plots.stacked_bars(doc["cases"][0])
        _emit_file(plot, png, force)


def _sweep_rows(dim, values, preds):
    from taxes.model import TAXES

    variants = [p.variant for p in preds[0]]
    fused = [v for v in variants if v.startswith("fused")]
    header = [dim] + [f"{v} E2E" for v in variants]
    if "bsp" in variants:
        header += [f"bsp {t}" for t in TAXES]
    if fused:
        header += ["best fused", "best fused bulk-sync + locality"]
    if "bsp" in variants and fused:
        header += ["bsp / best fused"]
    rows = []
    for value, ps in zip(values, preds):
        by = {p.variant: p for p in ps}
        row = [str(value)] + [f"{by[v].e2e_us:,.1f}" for v in variants]
        if "bsp" in by:
            row += [f"{x:,.1f}" for x in by["bsp"].taxes_us().values()]
        if fused:
            best = min((by[v] for v in fused), key=lambda p: p.e2e_us)
            t = best.taxes_us()
            row += [best.variant, f"{t['bulk-synchronous'] + t['data-locality']:,.1f}"]
            if "bsp" in by:
                row += [f"{by['bsp'].e2e_us / best.e2e_us:.2f}x"]
        rows.append(row)
    return header, rows


def _sweep_terminal(dim, values, preds, console):
    from rich.table import Table

    from taxes.reports.plots import case_title
    from taxes.workloads import workload_dict

    w = preds[0][0].workload
    header, rows = _sweep_rows(dim, values, preds)
    t = Table(title=f"sweep of {dim}: " + case_title(workload_dict(w)), title_style="bold")
    for i, h in enumerate(header):
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*r)
    console.print(t)


def _sweep_markdown(dim, values, preds) -> str:
    from taxes.reports.render import md_table

    return md_table(*_sweep_rows(dim, values, preds)) + "\n"


def _sweep_png(dim, values, preds) -> bytes:
    from taxes.reports.plots import case_title, sweep_lines
    from taxes.workloads import workload_dict

    e2e: dict[str, list[float]] = {}
    for ps in preds:
        for p in ps:
            e2e.setdefault(p.variant, []).append(p.e2e_us)
    variants = list(e2e)
    fused = [v for v in variants if v.startswith("fused")]
    best = [min((p for p in ps if p.variant in fused), key=lambda p: p.e2e_us) for ps in preds] if fused else []
    taxes_by: dict[str, dict[str, list[float]]] = {}
    if "bsp" in variants:
        for ps in preds:
            for tax, val in next(p for p in ps if p.variant == "bsp").taxes_us().items():
                taxes_by.setdefault("bsp", {}).setdefault(tax, []).append(val)
    for p in best:
        for tax, val in p.taxes_us().items():
            taxes_by.setdefault("best fused", {}).setdefault(tax, []).append(val)
    ratio = [e / b.e2e_us for e, b in zip(e2e["bsp"], best)] if "bsp" in variants and best else None
    w = preds[0][0].workload
    return sweep_lines(dim, values, e2e, taxes_by, ratio, f"predicted, sweep of {dim}: {case_title(workload_dict(w))}")


# ---- taxes hardware -------------------------------------------------------------------------------


@cli.group()
def hardware():
    """Hardware profiles: built-in (datasheets) and saved (calibrated)."""


@hardware.command("list")
def hardware_list():
    """List every profile with its headline figures."""
    from rich.table import Table

    from taxes.hardware import all_profiles

    t = Table(title="hardware profiles", title_style="bold")
    for h in ("name", "source", "bf16 TFLOP/s", "HBM GB/s", "link GB/s (peer / all)", "SMs", "description"):
        t.add_column(h)
    for name, (p, origin) in all_profiles().items():
        if p is None:
            t.add_row(_escape(name), _escape(origin), "-", "-", "-", "-", "does not load: taxes hardware show " + _escape(name))
            continue
        t.add_row(_escape(name), _escape(origin if origin != "built-in" else p.source), f"{p.matrix_tflops.get('bf16', 0):,.0f}",
                  f"{p.hbm_gbps:,.0f}", f"{p.peer_link_gbps:,.0f} / {p.injection_gbps:,.0f}", str(p.sm_count),
                  _escape(p.description))
    _stdout_console().print(t)


@hardware.command("show")
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(("table", "json")), default="table", show_default=True)
def hardware_show(name, fmt):
    """Every figure of one profile (NAME, or a profile .json path). --format json gives a file to edit."""
    import json
    from dataclasses import asdict

    from taxes.hardware import get_profile, profile_to_dict

    p = get_profile(name)
    if fmt == "json":
        click.echo(json.dumps(profile_to_dict(p), indent=1))
        return
    from rich.table import Table

    t = Table(title=_escape(f"{p.name}: {p.description} ({p.source})"), title_style="bold")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in asdict(p).items():
        if k in ("name", "description", "source", "extra"):
            continue
        t.add_row(k, _escape(", ".join(f"{d} {x:g}" for d, x in v.items())) if isinstance(v, dict) else f"{v:g}")
    _stdout_console().print(t)


# ---- taxes report ---------------------------------------------------------------------------------


@cli.command()
@click.argument("result", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(("table", "md", "json", "html")), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report here instead of stdout.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--hardware", "hardware_name", default=None,
              help="Re-attribute a profile with this hardware profile (e.g. a later calibration); measured times stay.")
def report(result, fmt, output, force, hardware_name):
    """Render a result document (from taxes profile or taxes model --format json)."""
    from taxes.reports import render
    from taxes.results import load

    if fmt == "html" and not output:
        raise TaxesError("--format html writes a file: give -o REPORT.html")
    _refuse_existing((output,), force)
    doc = load(result)
    if not doc["cases"]:
        raise TaxesError(f"{result}: the document holds no cases")
    if hardware_name:
        if doc["metadata"]["kind"] != "profile":
            raise TaxesError(f"{result}: --hardware re-attributes measured documents; this one is a {doc['metadata']['kind']}")
        from taxes.hardware import get_profile
        from taxes.document import reattribute

        doc = reattribute(doc, get_profile(hardware_name))
    if fmt == "json":
        _emit(render.render_json(doc), output, force)
    elif fmt == "md":
        _emit(render.render_markdown(doc), output, force)
    elif fmt == "html":
        _emit(render.render_html(doc), output, force)
    else:
        err = _stderr_console()
        safe = _markup_safe(doc)
        err.print(render._meta_line(safe))
        if output:
            _emit(_table_text(lambda c: render.render_terminal(safe, c)), output, force)
        else:
            render.render_terminal(safe, _stdout_console())
        err.print(render.LEGEND)


def _register() -> None:
    """Commands that live in their own modules (one idea per file)."""
    from taxes.cli.analyze_cmd import analyze
    from taxes.cli.calibrate_cmd import calibrate
    from taxes.cli.check_cmd import check_cmd
    from taxes.cli.compare_cmd import compare
    from taxes.cli.profile_cmd import profile_cmd, validate_cmd
    from taxes.cli.trace_cmd import trace

    cli.add_command(profile_cmd)
    cli.add_command(validate_cmd)
    cli.add_command(compare)
    cli.add_command(analyze)
    cli.add_command(calibrate)
    cli.add_command(check_cmd)
    cli.add_command(trace)


_register()


def main():
    cli.main()


if __name__ == "__main__":
    main()
