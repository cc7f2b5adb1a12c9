"""`taxes profile` and `taxes validate`: measure on this node's GPUs (or check the kernels on the CPU)."""

from __future__ import annotations

import os
import sys

import click

from taxes.cli.options import SECONDS, complete_workload
from taxes.errors import TaxesError
from taxes.run.preflight import surely_no_gpu


def _gpu_count() -> int:
    if surely_no_gpu():
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _preflight(gpus: int, emulate: bool) -> int:
    """The world size to run with, or a one-line error saying what is missing and what to do instead."""
    if emulate:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return gpus
    if _under_torchrun():
        return int(os.environ["WORLD_SIZE"])
    have = _gpu_count()
    if have == 0:
        raise TaxesError(NO_GPU)
    if have < gpus:
        raise TaxesError(f"profile: --gpus {gpus} asked for, this machine has {have}; use --gpus {have}, "
                         f"`taxes model --world {gpus}`, or --emulate")
    try:
        from taxes.run.preflight import check_gpus
    except ImportError:
        return gpus
    check_gpus(gpus)
    return gpus


def _write(doc: dict, output: str | None, force: bool) -> str | None:
    """Write the document: a file (refused if it exists, unless force), or a new file in a directory."""
    from taxes.documents.results import save, save_new

    if output is None:
        return None
    if os.path.isdir(output) and not os.path.islink(output):  # a results directory: add a new file, never overwrite one
        case = doc["cases"][0]
        stem = f"{case['workload']}_" + "_".join(f"{k}{v}" for k, v in case["shape"].items()) + f"_w{case['world']}"
        stem += f"_and_{len(doc['cases']) - 1}_more" if len(doc["cases"]) > 1 else ""
        return str(save_new(doc, output, stem))
    save(doc, output, overwrite=force)
    return output


def _check_profile_output(output: str | None, force: bool) -> None:
    """-o: a directory (a new file is added to it) or a file taxes may write (taxes.documents.io); checked before the run."""
    from taxes.documents.io import STDOUT, check_output

    if output == STDOUT:
        raise TaxesError("-o -: the result document goes to a file or a directory; --format json prints the "
                         "document with its report on stdout")
    if output and os.path.isdir(output) and not os.path.islink(output):
        return
    check_output(output, force)


def emulation_config(workload: str, shape: dict, world: int) -> dict:
    """Tile sizes that fit a shape under Triton's interpreter, for --emulate: the GPU's tuned tiles (128 x 256,
    16 copier CTAs of 132) fit neither small shapes nor the interpreter's 4 programs. Each block is the
    largest of 64, 32, 16 that divides its dimension (the interpreter runs a tile as one numpy operation,
    so larger tiles run faster), 2 copier CTAs of 4, chunks of at most 32 rows. --config overrides these."""
    from taxes.workloads import DEFAULT_SHAPES

    full = {**DEFAULT_SHAPES.get(workload, {}), **shape}

    def block(n: int, sizes=(64, 32, 16)) -> int:
        return next((b for b in sizes if n % b == 0), sizes[-1])

    p = max(1, world)
    if workload == "ag-gemm":
        shard = full["M"] // p
        return {"block_m": block(shard), "block_n": block(full["N"] // p), "block_k": block(full["K"]), "grid": 4,
                "copiers": 2, "chunk_rows": block(shard, (32, 16, 8, 4, 2, 1))}
    if workload == "gemm-rs":
        return {"block_m": block(full["M"] // p), "block_n": block(full["N"]), "block_k": block(full["K"] // p),
                "grid": 4}
    if workload == "tp-mlp":
        import math

        shard = full["M"] // p
        return {"block_m": block(shard), "block_n": block(math.gcd(full["H"], 2 * full["F"] // p)),
                "block_k": block(math.gcd(full["H"], full["F"] // p)), "copiers": 2,
                "chunk_rows": block(shard, (32, 16, 8, 4, 2, 1))}
    if workload == "flash-decode":  # the last step of a split is masked: no divisibility needed
        return {"block_n": max(16, min(64, 1 << (max(1, full["S"]).bit_length() - 1)))}
    return {}


def emulation_config_for(workload: str, shapes: list[dict], world: int) -> dict:
    """One configuration for every shape of a run: the smallest of each tile (powers of two: a smaller one
    divides whatever a larger one divides)."""
    configs = [emulation_config(workload, s, world) for s in shapes or [{}]]
    return {k: min(c[k] for c in configs) for k in configs[0]}


def _check_emulated_memory(job) -> None:
    """Before an emulated run: its ranks' buffers and shared arenas fit this machine's memory, for the
    largest case (the arenas are sized for it; each rank holds one case at a time)."""
    from taxes.run.preflight import check_host_memory
    from taxes.run.profile import bytes_for_case, heap_bytes
    from taxes.workloads import make_workload

    cases = [make_workload(job.workload, s, job.world, job.dtype) for s in job.shapes]
    need = max(job.world * (heap_bytes(w) + bytes_for_case(w, job.variants, 1)) for w in cases)
    check_host_memory(need, ranks=job.world)


def _emulation_cost_note(workload: str, shapes: list[dict], world: int) -> str | None:
    """A warning when a shape is large for the interpreter (it runs each tile as numpy on the CPU)."""
    from taxes.workloads import DEFAULT_SHAPES

    for shape in shapes:
        full = {**DEFAULT_SHAPES.get(workload, {}), **shape}
        if workload in ("ag-gemm", "gemm-rs"):
            work = full["M"] * full["N"] * full["K"] / world
        elif workload == "tp-mlp":
            work = full["M"] * full["H"] * full["F"] * 3 / world
        else:
            work = full["B"] * full["Hq"] * full["D"] * full["S"] * 64
        if work > 2 ** 27:
            return ("taxes: --emulate with this shape runs for many minutes under the interpreter; a shape like "
                    + {"ag-gemm": "M=256,N=256,K=256", "gemm-rs": "M=256,N=256,K=256", "tp-mlp": "M=64,H=64,F=128",
                       "flash-decode": "B=1,Hq=8,Hkv=2,D=64,S=256"}[workload] + " takes seconds")
    return None




@click.command("profile")
@click.argument("workload", shell_complete=complete_workload)
@click.option("--gpus", type=int, default=2, show_default=True, help="ranks, one per GPU (torchrun's WORLD_SIZE wins)")
@click.option("--shape", "shapes", multiple=True, help="e.g. M=8192,N=8192,K=8192 (repeat for several cases; "
              "defaults per workload)")
@click.option("--dtype", default="bf16", show_default=True)
@click.option("--variants", default="", help="comma-separated (default: every variant of the workload)")
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
@click.option("-o", "--output", default=None, help="result document path, or a directory to add a new one to "
              "(written whole or not at all; regular files only)")
@click.option("--force", is_flag=True, help="overwrite an existing -o file")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "json", "html"]), default="table", show_default=True)
@click.option("--strict", is_flag=True, help="refuse to run from a checkout with uncommitted changes (or of unknown commit)")
def profile_cmd(workload, gpus, shapes, dtype, variants, iters, warmup, rounds, hardware_name, emulate, clock,
                start, wait_s, timeout_s, config_text, output, force, fmt, strict):
    """Run every variant of WORKLOAD on this node's GPUs and split each one's time into the three taxes."""
    from taxes.console import say
    from taxes.model.hardware import get_profile

    _check_profile_output(output, force)
    if not emulate and not _under_torchrun() and surely_no_gpu():  # before importing torch: that takes seconds
        raise TaxesError(NO_GPU)
    from taxes.run.profile import plan, run_profile

    if strict:
        from taxes.documents.provenance import collect

        p = collect()
        if p["git_dirty"] is not False or not p["git_commit"]:
            raise TaxesError("profile --strict: " + ("the checkout has uncommitted changes; commit them first"
                                                     if p["git_dirty"] else "the code's commit is unknown"))
    if hardware_name:
        get_profile(hardware_name)  # a bad name fails before anything runs
    config = parse_config(config_text)
    if not emulate:
        gpus = _preflight(gpus, emulate)
    hw = run_hardware(hardware_name, emulate, gpus, "profile")
    chosen = [v for v in variants.split(",") if v] or None
    job = plan(workload, list(shapes) or None, gpus, chosen, dtype, iters, warmup, emulate, wait_s, True, config,
               rounds, clock, start)  # every input checked before anything runs
    if emulate:
        tiles = emulation_config_for(workload, job.shapes, gpus)
        job = plan(workload, job.shapes, gpus, chosen, dtype, iters, warmup, emulate, wait_s, True,
                   tiles | config, rounds, clock, start)  # tiles that fit the shape; the user's --config wins
        _check_emulated_memory(job)
        note = _emulation_cost_note(workload, job.shapes, gpus)
        if note:
            say(note)
        _preflight(gpus, emulate)
        say("taxes: --emulate runs the kernels under Triton's interpreter: correctness only, its timings mean nothing")
    doc = run_profile(job, hw, emulate, timeout_s)
    if doc is None:  # a torchrun rank other than 0
        return
    path = _write(doc, output, force)
    _render(doc, fmt)
    if path:
        from taxes.documents.io import announce_written

        announce_written(path)
    failed = [v for c in doc["cases"] for v in c["variants"] if not v["correctness"].get("passed")]
    if failed:
        raise TaxesError(f"profile: {len(failed)} variant(s) failed: "
                         + "; ".join(f"{v['variant']}: {v['config'].get('error', 'wrong result')}" for v in failed))


NO_GPU = ("profile: no CUDA GPU on this machine; use `taxes model` for predictions, or --emulate to check the "
          "kernels under Triton's interpreter (its timings mean nothing)")


def parse_config(text: str) -> dict:
    """'block_n=128,producer=ctas' -> {"block_n": 128, "producer": "ctas"} (whole numbers become ints)."""
    out = {}
    for item in (x for x in text.split(",") if x.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TaxesError(f"--config: {item!r} is not key=value")
        value = value.strip()
        out[key.strip()] = int(value) if value.lstrip("-").isdigit() else {"true": True, "false": False}.get(value, value)
    return out


def _render(doc: dict, fmt: str) -> None:
    """The report of the run on stdout (tables at the terminal's width or, piped, their whole width)."""
    from taxes.console import stdout_console
    from taxes.documents.io import write_stdout
    from taxes.reports import render

    if fmt == "table":
        render.render_terminal(doc, stdout_console())
    elif fmt == "md":
        write_stdout(render.render_markdown(doc))
    elif fmt == "json":
        write_stdout(render.render_json(doc))
    else:
        write_stdout(render.render_html(doc))


# ---- validate -------------------------------------------------------------------------------------

VALIDATE_GRID = {
    "ag-gemm": ["M=1024,N=8192,K=8192", "M=4096,N=8192,K=8192", "M=8192,N=8192,K=8192", "M=4096,N=28672,K=8192"],
    "flash-decode": ["B=1,S=8192", "B=1,S=32768", "B=16,S=32768", "B=64,S=8192"],
}


def _print_validation(table: dict) -> None:
    """The validation table (taxes.model.validation.table) at the terminal: per row the E2E and each tax's signed
    error, then per world the E2E error and the per-tax errors where a tax is at least 5% of E2E."""
    from taxes.console import print_table, say, stdout_console
    from taxes.documents.method import TAXES

    def cell(r, t):
        e = r.get(f"{t}_error_pct")
        return "-" if e is None else f"{e:+.0f}% ({r[f'{t}_share_pct']:.0f}%)"

    print_table(stdout_console(), f"the model against measurement ({table['hardware']})",
                ["workload", "shape", "world", "variant", "measured us", "predicted us", "error"]
                + [f"{t} error (share)" for t in TAXES],
                [[r["workload"], r["shape"], str(r["world"]), r["variant"], f"{r['measured_e2e_us']:,.1f}",
                  f"{r['predicted_e2e_us']:,.1f}", f"{r['e2e_error_pct']:+.1f}%"] + [cell(r, t) for t in TAXES]
                 for r in table["rows"]], left=4)
    for world, s in table["per_world"].items():
        e = s["e2e"]
        say(f"world {world}: E2E mean absolute error {e['mean_absolute_error_pct']:.1f}% over {s['cases']} cases, "
            f"{e['within_10_pct']} within 10%; worst {e['worst']['variant']} {e['worst']['shape']} "
            f"({e['worst']['error_pct']:+.1f}%)")
        for tax, d in s["per_tax"].items():
            m = d.get("where_it_matters")
            if m:
                say(f"world {world}: {tax}: mean signed {m['mean_signed_error_pct']:+.0f}%, mean absolute "
                    f"{m['mean_absolute_error_pct']:.0f}% over the {m['cases']} cases where it is at least 5% of E2E "
                    f"({m['within_25_pct']} within 25%)")
    held = [h for h in table["held_out"] if h["held_out"]]
    say(f"held out (in no test and no tuning table): {', '.join(h['workload'] + ' ' + h['shape'] for h in held) or 'none'}")
    for c in table.get("calibrations", {}).get("profiles", []):
        say(f"with {c['profile']}: E2E mean absolute error {c['e2e_mean_absolute_error_pct']:.1f}% over {c['cases']} cases")


def gpu_kind(name: str) -> str:
    from taxes.model.hardware import gpu_kind as kind

    return kind(name)


def run_hardware(given: str | None, emulate: bool, world: int, command: str):
    """The hardware profile of a run: named (--hardware), else the one that describes this machine's GPUs
    (taxes.model.hardware.machine_profile); says which on stderr, and warns when a named one describes another GPU."""
    from taxes.console import say
    from taxes.model.hardware import get_profile, machine_profile

    if emulate:
        hw = get_profile(given or "h200-sxm")
        return hw
    hw, why, warn = machine_profile(_gpu_name(), world, given)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone speaks
        say(f"taxes {command}: hardware profile {hw.name} ({why})")
        if warn:
            say(f"taxes {command}: warning: {warn}")
    return hw


def run_planted(gpus: int, emulate: bool, iters: int, clock: str, output: str | None, timeout_s: float,
                records: str | None = None) -> tuple[list, str]:
    """Measure every planted case on `gpus` ranks; returns (rows, the file they were written to)."""
    import json

    from taxes.kernels.runtime import launch
    from taxes.run.planted import planted_heap_bytes, rank_cases
    from taxes.run.planted_answers import known_answers
    from taxes.documents.results import collect_metadata, write_atomic

    world = _preflight(gpus, emulate)
    opts = {"clock": _clock_name(clock, emulate), "iters": iters, "warmup": 3, "late_iters": 2 * iters}
    if emulate:
        from taxes.run.planted import EMULATED_LATE_US, EMULATED_RUNNERS

        opts.update(late_us=EMULATED_LATE_US, runners=EMULATED_RUNNERS)
    results = launch(rank_cases, world, opts, backend="emulated" if emulate else "cuda", timeout_s=timeout_s,
                     heap_bytes=planted_heap_bytes(world, emulate))
    if not results or results[0] is None:
        return [], ""
    rows = known_answers(results)
    gpu = "emulated" if emulate else gpu_kind(_gpu_name())
    path = output or os.path.join("reports", "known_answer", f"{gpu}-x{world}.json")
    meta = collect_metadata("known-answer", world, gpu, clock=opts["clock"], iterations=iters)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomic(path, json.dumps({"metadata": meta, "rows": rows}, indent=1) + "\n")
    if records:  # every case's raw records, to look into a row later
        import gzip

        from taxes.traces.records import raw_to_columns

        from taxes.run.planted_records import stored_facts

        recs = {k: [raw_to_columns(r[k]["raw"]) | {"plain_us": list(r[k]["plain"]), "facts": stored_facts(r[k])}
                    for r in results]
                for k in results[0] if isinstance(results[0][k], dict) and "raw" in results[0][k]}
        write_atomic(records, gzip.compress(json.dumps(recs).encode(), mtime=0))
    return rows, path


def _clock_name(clock: str, emulate: bool) -> str:
    if emulate:
        return "host"
    if clock in ("cupti", "torch.profiler"):
        return clock
    from taxes.run.cupti import available

    return "cupti" if available() is None else "torch.profiler"


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


@click.command("validate")
@click.option("--workloads", default="ag-gemm,flash-decode", show_default=True)
@click.option("--gpus", type=int, default=2, show_default=True)
@click.option("--hardware", "hardware_name", default=None,
              help="default: with --from, the profile the first document names, else the calibration saved for its GPUs and world; else as in profile")
@click.option("--iters", type=int, default=20, show_default=True)
@click.option("--emulate", is_flag=True)
@click.option("--from", "from_docs", multiple=True, help="validate existing result documents instead of running")
@click.option("-o", "--output", default=None, help="directory for the result documents and validation.json")
@click.option("--timeout-s", type=SECONDS, default=560.0, show_default=True)
@click.option("--planted", is_flag=True, help="known answers instead: run workloads with taxes planted on purpose "
              "and check the attribution recovers each (rows to reports/known_answer/GPU-xWORLD.json, or -o FILE)")
@click.option("--clock", type=click.Choice(["auto", "cupti", "torch.profiler"]), default="auto", show_default=True)
@click.option("--records", default=None, help="--planted: also write every case's raw records here (.json.gz)")
@click.option("--each-calibration", default=None, metavar="DIR",
              help="with --from: also the E2E error of every variant with every calibrated profile in DIR (its spread)")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--force", is_flag=True, help="replace DIR/validation.json when it exists (without it, that is an error)")
def validate_cmd(workloads, gpus, hardware_name, iters, emulate, from_docs, output, timeout_s, planted, clock, records,
                 each_calibration, fmt, force):
    """Predicted against measured E2E and taxes over a grid of shapes: signed error per case, then MAPE.
    With --planted: the attribution against taxes of known size."""
    import json

    from taxes.console import print_table, say, stdout_console
    from taxes.documents.io import announce_written, check_output, write_atomic, write_error, write_stdout

    if planted:
        check_output(output, True, "-o")  # a known-answer file is replaced, as before
        if not emulate and surely_no_gpu():
            raise TaxesError(NO_GPU.replace("profile:", "validate:"))
        rows, path = run_planted(gpus, emulate, iters, clock, output, timeout_s, records)
        if fmt == "json":
            write_stdout(json.dumps(rows, indent=1) + "\n")
        else:
            from taxes.run.planted_answers import summary

            print_table(stdout_console(), "known answers", ["tax", "case", "planted us", "recovered us", "error", "ok"],
                        [[r["tax"], r["case"], f"{r['planted_us']:.1f}", f"{r['recovered_us']:.1f}",
                          f"{r['error_pct']:+.1f}%" if r["error_pct"] is not None else "-", "yes" if r["ok"] else "NO"]
                         for r in rows], left=2)
            say(summary(rows))
        if path:
            announce_written(path)
        return

    if output and os.path.exists(output) and not os.path.isdir(output):
        raise TaxesError(f"-o {_shown(output)}: validate writes a directory (result documents and validation.json)")
    if output and os.path.isdir(output):
        check_output(os.path.join(output, "validation.json"), force, "-o")  # before any work
    if not from_docs and not emulate and surely_no_gpu():
        raise TaxesError(NO_GPU.replace("profile:", "validate:") + "; or --from RESULT.json to validate measured documents")
    from taxes.model import validation
    from taxes.documents.profile_document import reattribute
    from taxes.model.hardware import get_profile
    from taxes.documents.results import load

    if from_docs:
        measured = [_measured(p) for p in from_docs]
        hw = get_profile(hardware_name) if hardware_name else validation.document_profile(measured[0])[0]
    docs = [reattribute(d, hw) for d in measured] if from_docs else []  # the same measurements, floors from this profile
    if not docs:
        from taxes.run.profile import profile

        world = _preflight(gpus, emulate)
        hw = run_hardware(hardware_name, emulate, world, "validate")
        for wl in [w for w in workloads.split(",") if w]:
            if wl not in VALIDATE_GRID:
                raise TaxesError(f"validate: no grid for workload {_shown(wl)!r} (have {', '.join(VALIDATE_GRID)})")
            for shape in VALIDATE_GRID[wl] if not emulate else EMULATE_GRID[wl]:
                config = emulation_config(wl, _parse(shape), world) if emulate else None
                res = profile(wl, shape, world, None, "bf16", iters, 3, emulate, hw, timeout_s=timeout_s, progress=True,
                              config=config)
                if res.document is None:
                    continue
                docs.append(res.document)
                if output:
                    os.makedirs(output, exist_ok=True)
                    _write(res.document, output, False)
    if not docs:
        return
    summary = validation.table(docs, hw, list(from_docs), each_calibration if from_docs else None)
    if fmt == "json":
        write_stdout(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    else:
        _print_validation(summary)
    if output:
        os.makedirs(output, exist_ok=True)
        path = os.path.join(output, "validation.json")
        try:
            write_atomic(path, json.dumps(summary, indent=1, allow_nan=False) + "\n", overwrite=force)
        except OSError as e:
            raise write_error(path, e) from None
        announce_written(path)


def _measured(path: str) -> dict:
    """A document `validate --from` can judge the model by: one that holds measurements of a workload (not
    the model's own predictions, which would agree with themselves)."""
    from taxes.documents.results import TRACE_WORKLOAD, load

    doc = load(path)
    kind = doc["metadata"].get("kind")
    if kind != "profile":
        raise TaxesError(f"--from {_shown(path)}: a {kind} document holds predictions, not measurements; give "
                         "documents from taxes profile")
    if any(c["workload"] == TRACE_WORKLOAD for c in doc["cases"]):
        raise TaxesError(f"--from {_shown(path)}: made from traces (taxes analyze): no workload shape for the model "
                         "to predict; give documents from taxes profile")
    return doc


EMULATE_GRID = {"ag-gemm": ["M=64,N=64,K=32"], "flash-decode": ["B=1,Hq=8,Hkv=2,D=64,S=256"]}


def _parse(shape: str) -> dict:
    from taxes.workloads import parse_shape

    return parse_shape(shape)


def _shown(text) -> str:
    from taxes.sanitize import printable

    return printable(text)
