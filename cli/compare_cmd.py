"""`taxes compare`: two result documents, or two variants of one, for CI. Registered in cli/main.py with
`cli.add_command(compare)`; the statistics live in taxes/reports/compare.py."""

from __future__ import annotations

import os

import click

from taxes.errors import TaxesError

COMPARE_FORMATS = ("table", "md", "junit", "json", "benchmark-json")


def _step_summary_path() -> str | None:
    """$GITHUB_STEP_SUMMARY when set: GitHub Actions shows what a step appends there on the run's page.
    Checked before any work: a FIFO, device or directory there is refused in one line (taxes.files)."""
    from taxes.files import existing_kind
    from taxes.sanitize import path as shown

    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    what = existing_kind(path)
    if what not in (None, "file"):
        raise TaxesError(f"GITHUB_STEP_SUMMARY {shown(path)}: {what}, not a regular file; point it at a file "
                         "(or set it empty to skip the summary)")
    return path


def _append_step_summary(path: str | None, markdown: str) -> None:
    if not path:
        return
    from taxes.files import open_regular
    from taxes.sanitize import path as shown

    try:
        with open_regular(path, append=True) as f:
            f.write(markdown + "\n")  # one write: the summary gets the whole section or nothing
    except OSError as e:
        raise TaxesError(f"GITHUB_STEP_SUMMARY {shown(path)}: cannot append to it ({e.strerror or e})") from None


@click.command("compare")
@click.argument("paths", nargs=-1, metavar="BASE.json [NEW.json]")
@click.option("--variants", "variant_pair", metavar="A,B",
              help="Compare variant A (base) with variant B (new): within one document when only BASE.json is "
                   "given (e.g. bsp,fused-push), else BASE.json's A against NEW.json's B.")
@click.option("--fail-above", "fail_above", metavar="PCT",
              help="Exit 1 when any row is significantly slower by more than PCT (5% or 5); also the threshold "
                   "below which a significant change is called 'same'. Default: report only, exit 0.")
@click.option("--format", "fmt", type=click.Choice(COMPARE_FORMATS), default="table", show_default=True,
              help="benchmark-json is github-action-benchmark's customSmallerIsBetter input.")
@click.option("-o", "--output", help="Write the output here instead of stdout ('-' is stdout).")
@click.option("--confidence", default="95%", metavar="PCT", show_default=True, help="Of the bootstrap interval; 1 - it is the rank test's level.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Of the bootstrap resampling.")
@click.option("--force", is_flag=True, help="Replace an -o file that already exists (without it, that is an error).")
def compare(paths, variant_pair, fail_above, fmt, output, confidence, seed, force):
    """Per workload, shape and variant: NEW's E2E over BASE's (interquartile means), with a bootstrap confidence interval
    and a rank test, so that noise is not called a regression. Appends a Markdown summary to
    $GITHUB_STEP_SUMMARY when that is set. Exit 0, 1 (a significant slowdown beyond --fail-above) or 2
    (bad usage or input)."""
    from taxes.reports import compare as cmp
    from taxes.console import render_text, say, stdout_console
    from taxes.files import STDOUT, check_output, write_output
    from taxes.documents.results import load

    threshold = cmp.parse_threshold(fail_above) if fail_above is not None else 0.0
    conf = cmp.parse_confidence(confidence)
    pair = cmp.parse_variant_pair(variant_pair) if variant_pair is not None else None
    if len(paths) == 0 or len(paths) > 2:
        raise TaxesError(f"give BASE.json and NEW.json, or one document with --variants A,B (got {len(paths)} paths)")
    if len(paths) == 1 and pair is None:
        raise TaxesError("one document given: add NEW.json, or --variants A,B to compare two of its variants")
    if len(paths) == 1 and pair[0] == pair[1]:
        raise TaxesError(f"--variants {variant_pair}: name two different variants to compare within one document")
    check_output(output, force)  # before any work; the writer checks again
    step_summary = _step_summary_path()

    base = load(paths[0])
    new = load(paths[1]) if len(paths) == 2 else base
    base_name, new_name = (paths[0], paths[1]) if len(paths) == 2 else (paths[0], paths[0])
    if pair:
        cmp.check_variants(base, new, pair, base_name, new_name)
        if len(paths) == 1:
            base_name, new_name = f"{paths[0]} {pair[0]}", f"{paths[0]} {pair[1]}"
    from taxes.console import progress

    with progress("comparing (rank tests and bootstrap intervals)"):
        df = cmp.compare_documents(base, new, variants=pair, threshold=threshold, confidence=conf, seed=seed,
                                   base_name=base_name, new_name=new_name)

    render = {"md": cmp.render_markdown, "junit": cmp.render_junit, "json": cmp.render_json,
              "benchmark-json": cmp.render_benchmark_json}
    if fmt != "table":
        write_output(output, render[fmt](df), force)
    elif output and output != STDOUT:
        write_output(output, render_text(lambda c: cmp.render_terminal(df, c)), force)
    else:
        cmp.render_terminal(df, stdout_console())
    _append_step_summary(step_summary, cmp.render_markdown(df))

    bad = cmp.regressions(df)
    if fail_above is not None and len(bad):
        say(f"taxes compare: {len(bad)} significant slowdown{'s' if len(bad) > 1 else ''} beyond "
            f"{threshold:+.1%}: " + "; ".join(f"{cmp.row_name(r)} {cmp.change_text(r['ratio'])}" for _, r in bad.iterrows()))
        click.get_current_context().exit(1)
