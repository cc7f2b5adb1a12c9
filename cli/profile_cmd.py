"""`taxes profile WORKLOAD`: measure every variant on this node's GPUs (or check the kernels on the CPU
with --emulate) and attribute each one's time (taxes/run/profile.py)."""

from __future__ import annotations

import click

from taxes.cli.options import SECONDS, complete_workload, force_option, format_option, gpus_option, variants_option
from taxes.errors import TaxesError

FORMATS = ("table", "md", "json", "html")


@click.command("profile")
@click.argument("workload", shell_complete=complete_workload)
@gpus_option(2, "Ranks, one per GPU (torchrun's WORLD_SIZE wins).")
@click.option("--shape", "shapes", multiple=True, help="e.g. M=8192,N=8192,K=8192 (repeat for several cases; "
              "defaults per workload)")
@click.option("--dtype", default="bf16", show_default=True)
@variants_option()
@click.option("--iters", type=int, default=30, show_default=True)
@click.option("--warmup", type=int, default=5, show_default=True)
@click.option("--rounds", type=int, default=5, show_default=True,
              help="time the variants interleaved, in this many blocks of iterations each (1: one after another)")
@click.option("--hardware", "hardware_name", default=None,
              help="profile for the floor and the model: a built-in, a saved calibration, or a JSON path "
                   "(default: the calibration saved for this GPU kind and world, else the built-in for the GPU)")
@click.option("--emulate", is_flag=True, help="CPU: run the kernels under Triton's interpreter (logic only)")
@click.option("--clock", type=click.Choice(["auto", "cupti", "torch.profiler", "both"]), default="auto", show_default=True,
              help="per-kernel clock of the instrumented iterations: cupti-python, torch.profiler, or both (the "
                   "cheaper kept per variant); auto: cupti-python when installed")
@click.option("--start", "start", type=click.Choice(["barrier", "aligned", "ahead"]), default="barrier",
              show_default=True, help="how each iteration starts: barrier (isolated: a host barrier, the ranks' "
              "exit skew its own row), aligned (the devices also leave an all-reduce together), ahead (the host "
              "queues the whole iteration behind a spin kernel first: what a model's layer sees)")
@click.option("--wait-s", type=float, default=5.0, show_default=True, help="budget of every in-kernel wait")
@click.option("--timeout-s", type=SECONDS, default=600.0, show_default=True, help="the whole run's time limit")
@click.option("--config", "config_text", default="", help="fused kernels' configuration overrides, e.g. block_n=128,copiers=16")
@click.option("-o", "--output", default=None, help="the result document: a path, or a directory to add a new one to "
              "(written whole or not at all; regular files only)")
@force_option()
@format_option(FORMATS, help="the report printed on stdout")
@click.option("--strict", is_flag=True, help="refuse to run from a checkout with uncommitted changes (or of unknown commit)")
def profile_cmd(workload, gpus, shapes, dtype, variants, iters, warmup, rounds, hardware_name, emulate, clock,
                start, wait_s, timeout_s, config_text, output, force, fmt, strict):
    """Run every variant of WORKLOAD on this node's GPUs and split each one's time into the three taxes."""
    from taxes.console import say
    from taxes.documents.placement import check_document_output, write_document
    from taxes.model.hardware import get_profile
    from taxes.run.machine import NO_GPU, run_hardware, run_world, under_torchrun
    from taxes.run.preflight import surely_no_gpu

    check_document_output(output, force)
    if not emulate and not under_torchrun() and surely_no_gpu():  # before importing torch: that takes seconds
        raise TaxesError(NO_GPU)
    from taxes.run.profile import parse_config, plan, run_profile

    if strict:
        from taxes.provenance import require_clean_checkout

        require_clean_checkout("profile")
    if hardware_name:
        get_profile(hardware_name)  # a bad name fails before anything runs
    config = parse_config(config_text)
    if not emulate:
        gpus = run_world(gpus, emulate)
    hw = run_hardware(hardware_name, emulate, gpus, "profile")
    chosen = list(variants) or None
    job = plan(workload, list(shapes) or None, gpus, chosen, dtype, iters, warmup, emulate, wait_s, True, config,
               rounds, clock, start)  # every input checked before anything runs
    if emulate:
        from taxes.run.emulation import check_emulated_memory, emulation_config_for, emulation_cost_note

        tiles = emulation_config_for(workload, job.shapes, gpus)
        job = plan(workload, job.shapes, gpus, chosen, dtype, iters, warmup, emulate, wait_s, True,
                   tiles | config, rounds, clock, start)  # tiles that fit the shape; the user's --config wins
        check_emulated_memory(job)
        note = emulation_cost_note(workload, job.shapes, gpus)
        if note:
            say(note)
        run_world(gpus, emulate)
        say("taxes: --emulate runs the kernels under Triton's interpreter: correctness only, its timings mean nothing")
    doc = run_profile(job, hw, emulate, timeout_s)
    if doc is None:  # a torchrun rank other than 0
        return
    path = write_document(doc, output, force)
    render_report(doc, fmt)
    if path:
        from taxes.files import announce_written

        announce_written(path)
    failed = [v for c in doc["cases"] for v in c["variants"] if not v["correctness"].get("passed")]
    if failed:
        raise TaxesError(f"profile: {len(failed)} variant(s) failed: "
                         + "; ".join(f"{v['variant']}: {v['config'].get('error', 'wrong result')}" for v in failed))


def render_report(doc: dict, fmt: str) -> None:
    """The report of the run on stdout (tables at the terminal's width or, piped, their whole width)."""
    from taxes.console import stdout_console
    from taxes.files import write_stdout
    from taxes.reports import render

    if fmt == "table":
        render.render_terminal(doc, stdout_console())
    elif fmt == "md":
        write_stdout(render.render_markdown(doc))
    elif fmt == "json":
        write_stdout(render.render_json(doc))
    else:
        write_stdout(render.render_html(doc))
