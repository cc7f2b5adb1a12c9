"""`taxes`: the command line. Each command is a thin layer over functions in taxes/.

The one error path: every failure a user can cause or meet ends as one line on stderr,
`taxes: error: ...`, and exit code 2 (bad input, an unusable environment, a file that cannot be read or
written, a full disk or closed stdout, too little memory, SIGTERM or SIGHUP); Ctrl-C exits 130. A bug in
taxes is one line too (exit 2, TAXES_DEBUG=1 shows the traceback). Exit 1 is kept for verdicts: `taxes
compare --fail-above` found a slowdown, `taxes check` found a failing check. Files are written whole or
not at all (taxes.files), so a failure leaves nothing half-written.
"""

from __future__ import annotations

import os
import signal
import sys

import click

import taxes
from taxes.errors import TaxesError

COMPLETE_VAR = "_TAXES_COMPLETE"


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the command (a BaseException, so no `except Exception` swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _install_signal_handlers() -> None:
    """SIGTERM and SIGHUP end the command through the same path as an error: temporary files are removed
    (taxes.files) and the ranks of a run are reaped. A forked child (emulated ranks) keeps the default
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


@click.group(cls=TaxesGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(taxes.__version__, prog_name="taxes")
def cli():
    """Profile and model the three multi-GPU performance taxes: bulk-synchronous, data-locality and
    kernel-launch."""


def _register() -> None:
    """Every command lives in its own module (cli/NAME_cmd.py), which only parses options and calls taxes/."""
    from taxes.cli.analyze_cmd import analyze
    from taxes.cli.calibrate_cmd import calibrate
    from taxes.cli.check_cmd import check_cmd
    from taxes.cli.compare_cmd import compare
    from taxes.cli.hardware_cmd import hardware
    from taxes.cli.model_cmd import model
    from taxes.cli.profile_cmd import profile_cmd
    from taxes.cli.report_cmd import report
    from taxes.cli.trace_cmd import trace
    from taxes.cli.validate_cmd import validate_cmd

    for command in (model, hardware, report, profile_cmd, validate_cmd, compare, analyze, calibrate, check_cmd, trace):
        cli.add_command(command)


_register()


def main():
    cli.main()


if __name__ == "__main__":
    main()
