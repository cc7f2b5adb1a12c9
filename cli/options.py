"""The options every command shares (the grammar), their option types, and writing a result."""

from __future__ import annotations

import functools
import math

import click

MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: longer than any run, and within what the system's timers take


class Seconds(click.ParamType):
    """A time limit in seconds: a finite number above 0 and at most MAX_TIMEOUT_S. click's FloatRange takes
    nan (it compares false with both bounds) and inf; a rank given either fails only once it is running."""

    name = "seconds"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
            self.fail(f"{value!r}: give a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} (a week)", param, ctx)
        return seconds


SECONDS = Seconds()


def complete_workload(ctx, param, incomplete: str) -> list[str]:
    """Shell completion of a WORKLOAD argument."""
    from taxes.workloads import WORKLOADS

    return [w for w in WORKLOADS if w.startswith(incomplete)]


def complete_hardware(ctx, param, incomplete: str) -> list[str]:
    """Shell completion of --hardware: built-in and saved profile names."""
    from taxes.model.hardware import BUILTIN, saved_profiles

    return [n for n in [*BUILTIN, *saved_profiles()] if n.startswith(incomplete)]


# ---- the grammar every command shares (README, "Command-line grammar") -----------------------------
# -o/--output the command's main output; --out-dir DIR where it writes several files; --gpus N the world
# size; --variants a,b the variants; --format the rendering; --force replaces existing outputs. Older
# spellings stay as hidden aliases.

FORCE_HELP = "Replace output files that already exist (without it, an existing file is an error)."
OUTPUT_HELP = "Write the result here instead of stdout ('-' is stdout); written whole or not at all."


def output_option(help: str = OUTPUT_HELP, **kw):
    return click.option("-o", "--output", default=None, help=help, **kw)


def force_option(help: str = FORCE_HELP):
    return click.option("--force", is_flag=True, help=help)


def format_option(choices, default: str = "table", help: str | None = None):
    return click.option("--format", "fmt", type=click.Choice(tuple(choices)), default=default, show_default=True,
                        help=help)


def gpus_option(default: int | None = 2, help: str = "Number of GPUs (ranks): the world size."):
    """--gpus N, with --world N kept as a hidden alias (given, it is the one taken)."""

    def decorate(f):
        @functools.wraps(f)
        def command(*args, world_alias=None, **kwargs):
            if world_alias is not None:
                kwargs["gpus"] = world_alias
            return f(*args, **kwargs)

        command = click.option("--world", "world_alias", type=int, default=None, hidden=True)(command)
        return click.option("--gpus", type=int, default=default, show_default=default is not None, help=help)(command)

    return decorate


def variants_option(help: str = "Comma-separated variants (default: every variant of the workload)."):
    """--variants a,b, with the repeatable --variant NAME kept as a hidden alias that adds to the list; the
    command gets a tuple of names in the order given, each once (empty: none named)."""

    def decorate(f):
        @functools.wraps(f)
        def command(*args, variants="", variant_alias=(), **kwargs):
            names = [v.strip() for v in (variants or "").split(",") if v.strip()] + list(variant_alias)
            return f(*args, variants=tuple(dict.fromkeys(names)), **kwargs)

        command = click.option("--variant", "variant_alias", multiple=True, hidden=True)(command)
        return click.option("--variants", default="", metavar="A,B", help=help)(command)

    return decorate


def show(draw, output: str | None, force: bool) -> None:
    """A table drawn by draw(console): at the terminal (its width, or piped, the tables' whole width), or as
    plain text to -o FILE without a width limit."""
    from taxes.console import render_text, stdout_console
    from taxes.files import STDOUT, write_output

    if output and output != STDOUT:
        write_output(output, render_text(draw), force)
    else:
        draw(stdout_console())


def emit(data: str | bytes, output: str | None, force: bool = False) -> None:
    """Data to -o FILE (atomically, regular files only) or to stdout."""
    from taxes.files import write_output

    write_output(output, data, force)
