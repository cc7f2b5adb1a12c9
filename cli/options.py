"""Option types shared by several commands."""

from __future__ import annotations

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
