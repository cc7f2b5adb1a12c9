"""`taxes`: the command line. Each command is a thin layer over functions in taxes/.

The one error path: every failure a user can cause or meet ends as one line on stderr,
`taxes: error: ...`, and exit code 2 (bad input, an unusable environment, a file that cannot be read or
written, a full disk or closed stdout, too little memory, SIGTERM or SIGHUP); Ctrl-C exits 130. A bug in
taxes is one line too (exit 2, TAXES_DEBUG=1 shows the traceback). Exit 1 is kept for verdicts: `taxes
compare --fail-above` found a slowdown, `taxes check` found a failing check. Files are written whole or
not at all (taxes.documents.io), so a failure leaves nothing half-written.
"""

from __future__ import annotations

import os
import signal
import sys

import click

import taxes
from taxes.cli.options import complete_workload
from taxes.errors import TaxesError

FORMATS = ("table", "json", "md", "csv")
COMPLETE_VAR = "_TAXES_COMPLETE"


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the command (a BaseException, so no `except Exception` swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _install_signal_handlers() -> None:
    """SIGTERM and SIGHUP end the command through the same path as an error: temporary files are removed
    (taxes.documents.io) and the ranks of a run are reaped. A forked child (emulated ranks) keeps the default
    action: it dies at once, as before."""
    main_pid = os.getpid()

    def on_signal(signum, frame):
        if os.getpid() != main_pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated(signum)

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, on_signal)


class ClosedStream:
    """Standard output as Python finds it when the command was started with that descriptor closed
    (`taxes model ... >&-`: sys.stdout is None): every write is the OSError a closed descriptor gives
    (EBADF), so the one error path says so in one line, and a command that writes only to -o FILE works.
    A closed stderr (or stdin) drops what is written: it carries messages only, never data."""

    def __init__(self, name: str, discard: bool = False):
        self.name, self.discard = name, discard

    def write(self, data) -> int:
        if self.discard:
            return len(data)
        import errno

        raise OSError(errno.EBADF, f"{self.name} is closed")

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:  # nothing was written, so nothing is lost
        pass

    def isatty(self) -> bool:
        return False

    @property
    def buffer(self):
        return self

    @property
    def closed(self) -> bool:
        return False


def _reserve_standard_streams() -> None:
    """A closed standard descriptor (0, 1 or 2) is held by /dev/null, so that no file taxes opens takes its
    number (and nothing meant for the terminal lands in a document), and its Python stream becomes a
    ClosedStream."""
    for fd, name, title in ((0, "stdin", "standard input"), (1, "stdout", "standard output"),
                            (2, "stderr", "standard error")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            held = os.open(os.devnull, os.O_RDWR)
            if held != fd:
                os.dup2(held, fd)
                os.close(held)
        except OSError:
            pass
        if getattr(sys, name) is None:
            setattr(sys, name, ClosedStream(title, discard=fd != 1))


class _Passed(BaseException):
    """An OSError or EOFError from a command, carried past click (which would turn a broken pipe into
    exit 1 and let other OSErrors escape as tracebacks) to the one error path below."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


class TaxesGroup(click.Group):
    """Every failure ends as one line on stderr and exit 2 (Ctrl-C: 130); never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (OSError, EOFError) as e:
            raise _Passed(e) from e

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if os.environ.get(complete_var or COMPLETE_VAR):  # shell completion: click answers and exits
            return super().main(args=args, prog_name=prog_name or "taxes", complete_var=complete_var or COMPLETE_VAR,
                                standalone_mode=True, **extra)
        args = list(sys.argv[1:] if args is None else args)
        _reserve_standard_streams()
        _install_signal_handlers()
        code = 0
        try:
            try:
                if not args:
                    click.echo(self.get_help(click.Context(self, info_name="taxes")))
                else:
                    _require_dependencies(args)
                    rv = super().main(args=args, prog_name=prog_name or "taxes", standalone_mode=False, **extra)
                    code = rv if isinstance(rv, int) else 0
                sys.stdout.flush()  # here, inside the error path: a full disk met at exit would be a traceback
            except _Passed as p:
                raise p.error from None
        except click.exceptions.Exit as e:
            code = e.exit_code
        except SystemExit as e:  # a verdict (exit 1)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except (click.exceptions.Abort, KeyboardInterrupt):
            _die("interrupted", 130)
        except Terminated as e:
            _die(f"stopped by {signal.Signals(e.signum).name}", 2)
        except click.ClickException as e:
            _die(e.format_message(), 2)
        except TaxesError as e:
            _die(str(e), 2)
        except BrokenPipeError:
            _quiet_exit(0)  # the reader went away (e.g. `| head`): nothing more to say
        except MemoryError:
            _die("out of memory: the input is too large for this machine's memory", 2)
        except (OSError, EOFError) as e:  # a disk full, stdout closed or unwritable, a file system error
            _die(_os_error_line(e), 2)
        except Exception as e:  # a bug in taxes: still one line, with the way to see more
            if os.environ.get("TAXES_DEBUG"):
                raise
            _die(f"internal error: {type(e).__name__}: {e} (set TAXES_DEBUG=1 for the traceback)", 2)
        _quiet_exit(code)


DEPENDENCIES = ("jsonschema", "scipy", "jinja2", "rich", "pandas", "numpy", "matplotlib")  # pyproject's, besides torch/triton


def _require_dependencies(args: list[str]) -> None:
    """Before any work: a missing dependency (an install with --no-deps) is one line now, not an internal
    error after a run's measurements."""
    import importlib.util

    if any(a in ("-h", "--help", "--version") for a in args):
        return
    missing = [m for m in DEPENDENCIES if importlib.util.find_spec(m) is None]
    if missing:
        raise TaxesError(f"missing dependencies: {', '.join(missing)}; install them (pip install {' '.join(missing)}), "
                         "or install taxes with its dependencies (pip install -e .)")


def _os_error_line(e: BaseException) -> str:
    from taxes.sanitize import path

    if not isinstance(e, OSError):
        return f"unexpected end of input ({type(e).__name__})"
    what = e.strerror or str(e)
    if e.filename is not None:
        return f"{path(e.filename)}: {what}"
    return f"cannot write the output: {what}"


def _quiet_exit(code: int):
    """Exit without Python's own flush at shutdown raising again on a stdout that failed."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # whatever is left in the buffer goes nowhere
    except (OSError, ValueError, AttributeError):
        pass
    sys.exit(code)


def _die(message: str, code: int):
    from taxes.sanitize import one_line

    text = one_line(" ".join(str(message).split()), limit=1000)
    try:
        sys.stderr.write(f"taxes: error: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    _quiet_exit(code)


def complete_hardware(ctx, param, incomplete: str) -> list[str]:
    """Shell completion of --hardware: built-in and saved profile names."""
    from taxes.model.hardware import BUILTIN, saved_profiles

    return [n for n in [*BUILTIN, *saved_profiles()] if n.startswith(incomplete)]


FORCE_HELP = "Replace output files that already exist (without it, an existing file is an error)."
OUTPUT_HELP = "Write the data here instead of stdout ('-' is stdout); written whole or not at all."


def _emit(data: str | bytes, output: str | None, force: bool = False) -> None:
    """Data to -o FILE (atomically, regular files only) or to stdout."""
    from taxes.documents.io import write_output

    write_output(output, data, force)


def _escape(text) -> str:
    """Text from files or the user for a one-line message: printable (taxes.sanitize)."""
    from taxes.sanitize import printable

    return printable(text)


def _table_text(draw) -> str:
    """What draw(console) prints, as plain text without a width limit (for -o FILE)."""
    from taxes.console import render_text

    return render_text(draw)


def _stdout_console():
    from taxes.console import stdout_console

    return stdout_console()


def _stderr_console():
    from taxes.console import stderr_console

    return stderr_console()


@click.group(cls=TaxesGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(taxes.__version__, prog_name="taxes")
def cli():
    """Profile and model the three multi-GPU performance taxes: bulk-synchronous, data-locality and
    kernel-launch."""


# ---- taxes model ----------------------------------------------------------------------------------


@cli.command()
@click.argument("workload", shell_complete=complete_workload)
@click.option("--hardware", "hardware_name", default="h200-sxm", show_default=True, shell_complete=complete_hardware,
              help="Built-in or saved profile name, or a profile .json path (taxes hardware list).")
@click.option("--world", type=int, default=2, show_default=True, help="Number of GPUs (ranks).")
@click.option("--shape", default="", help="Dimensions, e.g. M=8192,N=8192,K=8192 (8K works too); unset ones take defaults.")
@click.option("--dtype", default="bf16", show_default=True, help="bf16 or fp16.")
@click.option("--variant", "variants", multiple=True, help="Variant(s) to model (repeatable); default: all.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("-o", "--output", help=OUTPUT_HELP)
@click.option("--plot", help="Save a chart (*.png or *.svg): components per variant, or the sweep's lines.")
@click.option("--sweep", help="Vary one dimension, doubling: e.g. M=1024:16384.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
def model(workload, hardware_name, world, shape, dtype, variants, fmt, output, plot, sweep, force):
    """Predict E2E and the three taxes of WORKLOAD (ag-gemm, gemm-rs, flash-decode, tp-mlp) for every variant."""
    from taxes.model import predict as m
    from taxes.model.hardware import get_profile
    from taxes.documents.io import STDOUT, check_output
    from taxes.reports import render
    from taxes.documents.results import dumps, model_document, summary_frame
    from taxes.workloads import make_workload, model_variants, parse_shape

    known = model_variants(workload)  # tp-mlp has variants of its own
    for v in variants:
        if v not in known:
            raise TaxesError(f"unknown variant {_escape(v)!r}: the model knows {', '.join(known)}")
    variants = tuple(dict.fromkeys(variants)) or known
    plot_fmt = _plot_format(plot)
    if plot and output and plot != STDOUT and os.path.abspath(plot) == os.path.abspath(output):
        raise TaxesError(f"{_escape(plot)}: given as both -o and --plot; name two files")
    if plot == STDOUT and output in (None, STDOUT):
        raise TaxesError("--plot -: the chart would share stdout with the data; give -o FILE for the data")
    check_output(output, force)
    check_output(plot, force, "--plot")
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
        from taxes.sanitize import csv_cell

        _emit(summary_frame(doc).apply(lambda col: col.map(csv_cell)).to_csv(index=False), output, force)
    elif fmt == "md":
        _emit(_sweep_markdown(dim, values, preds) if sweep else render.render_markdown(doc), output, force)
    else:
        from taxes.console import say

        say(f"taxes model {w.name} on {hw.name} ({hw.source}), world {world}, {dtype}: predicted, us per iteration")
        draw = (lambda c: _sweep_terminal(dim, values, preds, c)) if sweep else (lambda c: render.render_terminal(doc, c))
        if output and output != STDOUT:
            _emit(_table_text(draw), output, force)
        else:
            draw(_stdout_console())
        say(render.LEGEND_MODEL)
    if plot:
        from taxes.reports import plots

        data = _sweep_chart(dim, values, preds, plot_fmt) if sweep else plots.stacked_bars(doc["cases"][0], plot_fmt)
        _emit(data, plot, force)


def _plot_format(plot: str | None) -> str | None:
    from taxes.documents.io import STDOUT

    if plot is None:
        return None
    if plot == STDOUT:
        return "png"
    from taxes.reports.plots import fmt_of

    try:
        return fmt_of(plot)
    except ValueError:
        raise TaxesError(f"--plot {_escape(plot)}: the chart is a PNG or SVG file; name it *.png or *.svg") from None


def _sweep_rows(dim, values, preds):
    from taxes.documents.method import TAXES

    variants = [p.variant for p in preds[0]]
    bsp, fused = _sweep_kinds(preds)
    header = [dim] + [f"{v} E2E" for v in variants]
    if bsp:
        header += [f"{bsp} {t}" for t in TAXES]
    if fused:
        header += ["best fused", "best fused bulk-sync + locality", "best fused of the floor"]
    if bsp and fused:
        header += [f"{bsp} / best fused"]
    rows = []
    for value, ps in zip(values, preds):
        by = {p.variant: p for p in ps}
        row = [str(value)] + [f"{by[v].e2e_us:,.1f}" for v in variants]
        if bsp:
            row += [f"{x:,.1f}" for x in by[bsp].taxes_us().values()]
        if fused:
            best = min((by[v] for v in fused), key=lambda p: p.e2e_us)
            t = best.taxes_us()
            row += [best.variant, f"{t['bulk-synchronous'] + t['data-locality']:,.1f}",
                    f"{best.floor.ideal_us / best.e2e_us:.2f}"]
            if bsp:
                row += [f"{by[bsp].e2e_us / best.e2e_us:.2f}x"]
        rows.append(row)
    return header, rows


def _sweep_kinds(preds) -> tuple[str | None, list[str]]:
    """The eager bulk-synchronous variant (bsp; all-bsp for tp-mlp) and the fused ones, read from the
    variants table rather than from their names."""
    from taxes import variants as variant_table

    w = preds[0][0].workload.name
    kinds = {p.variant: variant_table.modelled(w, p.variant) for p in preds[0]}
    bsp = next((v for v, k in kinds.items() if k.rung == "bsp" and not k.graphed), None)
    return bsp, [v for v, k in kinds.items() if k.fused]


def _sweep_terminal(dim, values, preds, console):
    from taxes.console import print_table
    from taxes.reports.plots import case_title
    from taxes.workloads import workload_dict

    w = preds[0][0].workload
    header, rows = _sweep_rows(dim, values, preds)
    print_table(console, f"sweep of {dim}: " + case_title(workload_dict(w)), header, rows)


def _sweep_markdown(dim, values, preds) -> str:
    from taxes.reports.markdown_table import md_table

    return md_table(*_sweep_rows(dim, values, preds)) + "\n"


def _sweep_chart(dim, values, preds, fmt: str = "png") -> bytes:
    from taxes.reports.plots import case_title, sweep_lines
    from taxes.workloads import workload_dict

    e2e: dict[str, list[float]] = {}
    for ps in preds:
        for p in ps:
            e2e.setdefault(p.variant, []).append(p.e2e_us)
    bsp, fused = _sweep_kinds(preds)
    best = [min((p for p in ps if p.variant in fused), key=lambda p: p.e2e_us) for ps in preds] if fused else []
    taxes_by: dict[str, dict[str, list[float]]] = {}
    if bsp:
        for ps in preds:
            for tax, val in next(p for p in ps if p.variant == bsp).taxes_us().items():
                taxes_by.setdefault(bsp, {}).setdefault(tax, []).append(val)
    for p in best:
        for tax, val in p.taxes_us().items():
            taxes_by.setdefault("best fused", {}).setdefault(tax, []).append(val)
    ratio = [e / b.e2e_us for e, b in zip(e2e[bsp], best)] if bsp and best else None
    of_floor = [b.floor.ideal_us / b.e2e_us for b in best] or None
    w = preds[0][0].workload
    return sweep_lines(dim, values, e2e, taxes_by, ratio, f"predicted, sweep of {dim}: {case_title(workload_dict(w))}",
                       fmt, of_floor)


# ---- taxes hardware -------------------------------------------------------------------------------


@cli.group()
def hardware():
    """Hardware profiles: built-in (datasheets) and saved (calibrated)."""


@hardware.command("list")
def hardware_list():
    """List every profile with its headline figures."""
    from taxes.model.calibrate.present import origin_line
    from taxes.console import print_table
    from taxes.model.hardware import all_profiles

    header = ["name", "source", "file", "bf16 TFLOP/s", "HBM GB/s", "link GB/s (peer / all)", "SMs", "description"]
    rows = []
    for name, (p, origin) in all_profiles().items():
        if p is None:
            rows.append([name, "-", origin, "-", "-", "-", "-", "does not load: taxes hardware show " + name])
            continue
        rows.append([name, origin_line(p), origin, f"{p.matrix_tflops.get('bf16', 0):,.0f}",
                     f"{p.hbm_gbps:,.0f}", f"{p.peer_link_gbps:,.0f} / {p.injection_gbps:,.0f}", str(p.sm_count),
                     p.description])
    print_table(_stdout_console(), "hardware profiles", header, rows, left=2)


@hardware.command("show")
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(("table", "json")), default="table", show_default=True)
def hardware_show(name, fmt):
    """Every figure of one profile (NAME, or a profile .json path). --format json gives a file to edit."""
    import json
    from dataclasses import asdict

    from taxes.model.hardware import get_profile, profile_to_dict

    p = get_profile(name)
    if fmt == "json":
        _emit(json.dumps(profile_to_dict(p), indent=1) + "\n", None)
        return
    from taxes.model.calibrate.present import calibration_origin
    from taxes.console import print_table

    o = calibration_origin(p)
    rows = [[k, str(o[k])] for k in ("machine", "date", "world", "commit") if o and o[k] is not None]
    rows += [[k, ", ".join(f"{d} {x:g}" for d, x in v.items()) if isinstance(v, dict) else f"{v:g}"]
             for k, v in asdict(p).items() if k not in ("name", "description", "source", "extra")]
    print_table(_stdout_console(), f"{p.name}: {p.description} ({p.source})", ["figure", "value"], rows)


# ---- taxes report ---------------------------------------------------------------------------------


@cli.command()
@click.argument("results", nargs=-1, required=True, metavar="RESULT.json...")
@click.option("--format", "fmt", type=click.Choice(("table", "md", "json", "html")), default="table", show_default=True)
@click.option("-o", "--output", help="Write the report here instead of stdout ('-' is stdout).")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--hardware", "hardware_name", default=None,
              help="Re-attribute a profile with this hardware profile (e.g. a later calibration); measured times stay.")
def report(results, fmt, output, force, hardware_name):
    """Render result documents (from taxes profile, taxes model --format json or taxes analyze --format json),
    verdict first; a taxes analyze document with every table taxes analyze shows. Several documents: one report after another (one HTML page); --format json writes the
    document back with its report, so it takes one."""
    from taxes.documents.io import STDOUT, check_output
    from taxes.reports import render
    from taxes.documents.results import load

    if fmt == "html" and not output:
        raise TaxesError("--format html writes a file: give -o REPORT.html (or -o - for stdout)")
    if fmt == "json" and len(results) > 1:
        raise TaxesError(f"--format json writes one document back with its report; give one file, not {len(results)}")
    check_output(output, force)
    from taxes.console import progress

    docs = []
    for path in results:
        with progress(f"reading {path}"):
            doc = load(path)
        if not doc["cases"]:
            raise TaxesError(f"{_escape(path)}: the document holds no cases")
        if hardware_name:
            if doc["metadata"]["kind"] != "profile":
                raise TaxesError(f"{_escape(path)}: --hardware re-attributes measured documents; this one is a "
                                 f"{doc['metadata']['kind']}")
            from taxes.documents.profile_document import reattribute
            from taxes.model.hardware import get_profile

            doc = reattribute(doc, get_profile(hardware_name))
        docs.append(doc)
    if fmt == "json":
        _emit(render.render_json(docs[0]), output, force)
    elif fmt == "md":
        _emit("\n".join(render.render_markdown(d, trace_details=True) for d in docs), output, force)
    elif fmt == "html":
        from taxes.console import progress

        with progress("rendering the charts"):
            page = render.render_html(docs, trace_details=True)
        _emit(page, output, force)
    else:
        from taxes.console import say

        for d in docs:
            say(render._meta_line(d))

        def draw(console):
            for i, d in enumerate(docs):
                if i:
                    console.print()
                render.render_terminal(d, console, trace_details=True)

        if output and output != STDOUT:
            _emit(_table_text(draw), output, force)
        else:
            draw(_stdout_console())
        say(render.LEGEND)


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
