"""`taxes calibrate`: measure this machine's hardware figures and save them as a hardware profile.

Registered in cli/main.py with `cli.add_command(calibrate)`. The measuring is in taxes/model/calibrate.py.
"""

from __future__ import annotations

import click

from taxes.cli.options import SECONDS, format_option, gpus_option
from taxes.errors import TaxesError


def _check_options(gpus, output, force, name, base_name):
    """Everything that can be refused before touching a GPU."""
    from taxes.model.calibrate import check_profile_name
    from taxes.model.hardware import get_profile

    if gpus is not None and gpus < 1:
        raise TaxesError(f"--gpus {gpus}: give 1 or more")
    if output:
        from taxes.files import check_output
        from taxes.sanitize import path as shown

        if not output.lower().endswith(".json"):
            raise TaxesError(f"-o {shown(output)}: a profile is a JSON file; name it *.json")
        check_output(output, force, "-o")  # a regular file in an existing directory, new or --force
    if name is not None:
        check_profile_name(name)
    return get_profile(base_name) if base_name else None


@click.command("calibrate")
@gpus_option(None, "GPUs to calibrate on (default: all visible). Link and collective figures need 2 or more; "
                   "with 1 they are kept from the base profile and marked so.")
@click.option("--base", "base_name", default=None,
              help="Profile whose figures are kept where nothing is measured (default: by GPU name, else h200-sxm).")
@click.option("--name", default=None, help="Name of the new profile (default: KIND-xWORLD-calibrated, e.g. "
              "h100-x2-calibrated: what profile and validate load on such a machine).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the profile JSON here (default: NAME.json in the saved-profile directory, loadable by name); "
                   "replaced only with --force.")
@click.option("--quick", is_flag=True, help="Fewer sizes and repetitions: under a minute.")
@click.option("--peaks", type=click.Choice(("measured", "datasheet")), default="measured", show_default=True,
              help="measured: peaks are the best rates reached here and efficiencies fractions of them (docs/method.md); "
                   "datasheet: the base profile's peaks, efficiencies fractions of those.")
@click.option("--timeout-s", type=SECONDS, default=None,
              help="Stop the run after this many seconds (default: 300, --quick 150).")
@format_option(("table", "md", "json"), help="The figures printed on stdout, beside the base profile's.")
@click.option("--force", is_flag=True, help="Replace an existing -o file (the saved profile of the same name, "
              "without -o, is always replaced: a new calibration supersedes it).")
def calibrate(gpus, base_name, name, output, quick, peaks, timeout_s, fmt, force):
    """Measure this machine's hardware profile (matrix peak, HBM and link bandwidth, link latency, NCCL's
    curve, launch costs, flag round trip, rank skew) and save it for `taxes model --hardware NAME`."""
    from taxes.run.preflight import surely_no_gpu

    if surely_no_gpu():  # known without importing torch, which takes seconds
        raise TaxesError("calibrate needs CUDA GPUs and this machine has none; `taxes hardware list` shows the "
                         "built-in and saved profiles that `taxes model` can use instead")
    base = _check_options(gpus, output, force, name, base_name)
    from taxes.model import calibrate as cal
    from taxes.run import calibrate as measuring

    count = measuring.cuda_gpu_count()
    if count < 1:
        raise TaxesError(measuring.NO_GPU)
    world = gpus or count
    if world > count:
        raise TaxesError(f"--gpus {world}: this machine has {count} CUDA GPU{'s' if count != 1 else ''}")
    names = measuring.cuda_gpu_names(world)
    base = base or cal.base_for_gpu(names[0])
    from taxes.model.hardware import calibrated_name

    name = name or calibrated_name(names[0], world)  # KIND-xWORLD-calibrated: what profile and validate look for
    cal.check_profile_name(name)

    _say(f"taxes calibrate on {cal.gpu_summary(names)}{' (quick)' if quick else ''}, base {base.name}: "
         f"this takes {'under a minute' if quick else 'two to three minutes'}")
    if world == 1:
        _say("one GPU: link, collective, flag and skew figures are kept from the base profile")
    profile, raw = measuring.run_calibration(world, base, quick, name, peaks, timeout_s or (150.0 if quick else 300.0))
    path = cal.save_profile(profile, output)

    _print_figures(profile, base, fmt)
    for line in cal.failure_lines(raw):
        _say(f"taxes: calibrate: {line}; its figures keep {base.name}'s values")
    use = str(path) if output else profile.name
    _say(f"wrote {path}; use it with: taxes model WORKLOAD --hardware {use}")


def _say(line: str) -> None:
    """One line on stderr, sanitised (never wrapped: each message stays one line for scripts and logs)."""
    from taxes.console import say

    say(" ".join(line.split()))


def _print_figures(profile, base, fmt: str) -> None:
    from taxes.model import calibrate as cal

    title, header = f"{profile.name}: {profile.source}", ["figure", base.name, "calibrated", "how"]
    rows = [[str(c) for c in row] for row in cal.summary_rows(profile, base)]
    if fmt == "table":
        from taxes.console import print_table, stdout_console

        print_table(stdout_console(), title, header, rows)
    else:
        from taxes.files import write_stdout
        from taxes.reports.tables import table_text

        write_stdout(table_text(header, rows, fmt, title))
