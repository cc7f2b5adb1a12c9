"""What each rank measures in `taxes profile`, per shape and variant (one process per GPU, or torchrun's).

1. build every variant and check one run against the float32 reference (output poisoned with NaN first);
   the ranks agree on failures, so no rank enters a collective the others skipped;
2. time, in rounds (every variant's iterations interleaved in blocks, so clock drift and host state touch
   every variant alike), a block of plain iterations (a start and an end event each: the E2E) and a block
   of instrumented ones (the same with the per-kernel clock on, taxes.run.instrument; fused variants run their
   traced build, which stamps each CTA's waits);
3. with cupti-python, after the rounds, a block of warm-up iterations per variant that records the launch
   calls: the rounds' instrumented iterations record device activities alone and take their launches
   from it (any API record, once on, made CUPTI intercept every later runtime call of the process, plain
   iterations included), so nothing plain runs after it;
4. with clock "both", one more instrumented block per variant under torch.profiler, so the cheaper clock
   can be chosen per variant.
Rank 0's launcher gathers every rank's records into one document (taxes.documents.profile_document).
"""

from __future__ import annotations

import sys

from taxes.method import round_sizes
from taxes.run.cases import TOLERANCE, cta_stamps, make_case, rel_error
from taxes.run.harness import agree, gpu_metadata, time_iterations, warm_clocks
from taxes.run.instrument import make_recorder, record_iterations
from taxes.traces.records import assemble_ranks, shifted
from taxes.traces.timeline import Timeline
from taxes.variants import get
from taxes.workloads import make_workload

_BAR: dict = {}  # rank 0's progress bar, for the life of its rank process


def progress(ctx, job, text: str, advance: int = 0) -> None:
    """Rank 0 shows the run's progress on stderr: a bar over every (shape, variant, step) on a terminal,
    one line per step otherwise (logs)."""
    if ctx.rank != 0 or not job.progress:
        return
    if not sys.stderr.isatty():
        print(f"[taxes] {text}", file=sys.stderr, flush=True)
        return
    if "bar" not in _BAR:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=Console(stderr=True), transient=True)
        bar.start()
        _BAR["bar"] = bar
        _BAR["task"] = bar.add_task("taxes", total=len(job.shapes) * len(job.variants) * 3)
    _BAR["bar"].update(_BAR["task"], description=f"[taxes] {text}", advance=advance)


def _progress_done() -> None:
    if "bar" in _BAR:
        _BAR.pop("bar").stop()


def rank_job(ctx, job) -> dict:
    """Everything one rank measures, per shape."""
    import torch

    if ctx.backend != "cuda":  # emulated: bf16 stores rounded as on a GPU, not truncated
        from taxes.kernels.device import round_bf16_like_a_gpu

        round_bf16_like_a_gpu()
    warm_clocks(ctx, 2.0)
    out = {"cases": [], "meta": gpu_metadata() if ctx.rank == 0 else {}}
    if ctx.rank == 0:
        out["meta"]["start_barrier"] = ctx.start_barrier_kind()
    clocks = _clocks(ctx, job.clock)
    align = iteration_start(ctx, getattr(job, "start", "barrier"))
    try:
        for shape in job.shapes:
            ctx.heap.reset()
            out["cases"].append(_rank_case(ctx, job, shape, clocks, align))
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        _progress_done()
    out["clocks"] = clocks
    return out


def iteration_start(ctx, start: str):
    """What runs between the host barrier and the start event (taxes.run.profile.STARTS): None for "barrier"."""
    from taxes.run.harness import AlignedStart

    if start == "barrier":
        return None
    return AlignedStart(ctx, lead_us=500.0 if start == "ahead" else 0.0)


def _clocks(ctx, wanted: str) -> dict:
    """The clocks this rank uses: {"main": name, "extra": name or None, "why": text}. cupti-python when it
    can record here (auto), torch.profiler otherwise; "both" adds torch.profiler after the rounds."""
    if ctx.device.type != "cuda":
        return {"main": "host", "extra": None, "why": "emulated ranks: the host clock (times mean nothing)"}
    from taxes.run.cupti import available

    missing = available()
    if wanted in ("auto", "both", "cupti") and missing is None:
        return {"main": "cupti", "extra": "torch.profiler" if wanted == "both" else None, "why": "cupti-python"}
    if wanted == "cupti":
        from taxes.errors import TaxesError

        raise TaxesError(f"profile: --clock cupti: {missing}; install taxes[cupti] or use --clock torch.profiler")
    return {"main": "torch.profiler", "extra": None,
            "why": f"torch.profiler ({missing})" if wanted != "torch.profiler" else "torch.profiler (asked for)"}


def _rank_case(ctx, job, shape: dict, clocks: dict, align=None) -> dict:
    import torch

    w = make_workload(job.workload, shape, job.world, job.dtype)
    ctx.doing(f"building the {job.workload} inputs for {shape}")
    progress(ctx, job, f"{w.name} {shape}")
    case = make_case(ctx, w, job.wait_s, job.config)
    out = {"variants": [], "extra": case.extra, "shape": shape}
    built = []  # (variant, res, runner): every variant is built and checked first, then timed in rounds
    for variant in job.variants:
        ctx.doing(f"{variant}: build and check")
        progress(ctx, job, f"{variant}: check")
        res = {"variant": variant, "error": None, "rel_error": None, "samples": [], "traced_samples": [], "raw": {},
               "config": {}}
        holder = {}

        def build_and_check():
            runner = holder["run"] = build_variant(ctx, job, shape, case, variant)
            o = case.inputs[0][-1].fill_(float("nan"))
            got = runner(*case.inputs[0][:-1], o)
            if hasattr(runner, "check"):
                runner.check()
            res["rel_error"] = rel_error(got, case.reference)
            cfg, describe = getattr(runner, "cfg", None), getattr(runner, "describe", None)
            if callable(describe):  # the configuration as it ran (tuned fields resolved), where the runner says
                res["config"] = describe()
            else:
                res["config"] = dict(vars(cfg)) if cfg is not None and hasattr(cfg, "__dict__") else {}
            if not res["rel_error"] <= TOLERANCE:
                raise RuntimeError(f"relative error {res['rel_error']:.3g} above {TOLERANCE}")

        agree(ctx, res, build_and_check)
        progress(ctx, job, f"{variant}: checked", advance=1)
        built.append((variant, res, holder.get("run")))
        out["variants"].append(res)

    # cupti-python: the rounds record device activities alone; the launch calls come last (step 3 above:
    # +8.4 us of host time on PyTorch's attention call after API records, reports/clock_cost/sdpa_host_cost-h100.json)
    cupti_here = clocks["main"] == "cupti" and ctx.device.type == "cuda"
    api = "none" if cupti_here else "warmup"
    rounds = max(1, min(job.rounds, job.iters))
    blocks = round_sizes(job.iters, rounds)
    timed = alternate_fused(built, lambda item: variant_run(job.workload, item[0], item[2]).fused)
    for r, n in enumerate(blocks):
        warmup = job.warmup if r == 0 else min(job.warmup, 2)
        last = r == rounds - 1
        for variant, res, runner in timed:
            def plain():
                ctx.doing(f"{variant}: timing (round {r + 1} of {rounds})")
                progress(ctx, job, f"{variant}: round {r + 1}/{rounds}, {n} plain iterations", advance=int(last))
                res["samples"] += time_iterations(ctx, runner, case.inputs, n, warmup, label=variant, align=align)
                if hasattr(runner, "check"):
                    runner.check()

            def instrumented():
                ctx.doing(f"{variant}: instrumented timing (round {r + 1} of {rounds})")
                progress(ctx, job, f"{variant}: round {r + 1}/{rounds}, {n} instrumented iterations",
                         advance=int(last))
                _instrumented_block(ctx, job.workload, case, variant, runner, n, warmup, clocks["main"], res, api,
                                    align)

            def traced_plain():
                # the fused kernel's traced build timed without the clock: the measurement cost splits into
                # what the build's stamps cost and what the clock costs (taxes.documents.checks)
                ctx.doing(f"{variant}: the traced build without the clock (round {r + 1} of {rounds})")
                res["traced_samples"] += time_iterations(ctx, lambda *a: runner(*a, traced=True), case.inputs, n,
                                                         warmup, label=f"{variant} traced", align=align)
                if hasattr(runner, "check"):
                    runner.check()

            # plain first in even rounds, instrumented first in odd ones: a drift of the host or the clocks
            # across a round falls on both kinds alike instead of on the measurement cost
            order = (plain, instrumented) if r % 2 == 0 else (instrumented, plain)
            if runner is not None and takes_traced(runner) and get(job.workload, variant).fused:
                order = (order[0], traced_plain, order[1])
            for block in order:
                if block is plain or hasattr(runner, "phases"):
                    agree(ctx, res, block)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
    if cupti_here:  # the launch template, last: nothing plain runs after it
        for variant, res, runner in built:
            if hasattr(runner, "phases") and res["error"] is None:
                ctx.doing(f"{variant}: the launch sequence (API records)")
                agree(ctx, res, lambda: _instrumented_block(ctx, job.workload, case, variant, runner, 0,
                                                            max(2, min(job.warmup, 3)), "cupti", res, "warmup",
                                                            align))
    if clocks.get("extra"):  # a second clock is a comparison: its failure fails nothing else
        for variant, res, runner in built:
            if hasattr(runner, "phases") and res["error"] is None:
                extra = {"error": None}
                agree(ctx, extra, lambda: _instrumented_block(ctx, job.workload, case, variant, runner, job.iters,
                                                              job.warmup, clocks["extra"], res, "warmup", align))
                if extra["error"]:
                    res["raw"].pop(clocks["extra"], None)
                    res.setdefault("clock_errors", {})[clocks["extra"]] = extra["error"]
    worst = ctx.all_max([-1.0 if res["rel_error"] is None else res["rel_error"] for _, res, _ in built])
    for (_, res, _), e in zip(built, worst):
        res["rel_error"] = None if e < 0 else e
    for _, res, runner in built:  # the timelines leave the rank as plain data
        res["raw"] = {clock: merge_blocks(blocks_) for clock, blocks_ in res["raw"].items()}
        res["facts"] = {"splits": getattr(runner, "n_splits", None)}
        res["comm_phases"] = sorted({name for name, role, _ in runner.phases(*case.inputs[0], traced=False)
                                     if role == "communication"}) if runner is not None and hasattr(runner, "phases") else []
    built.clear()
    return out


def alternate_fused(items: list, is_fused) -> list:
    """The order the variants are timed in each round: fused and other variants taking turns as far as their
    numbers allow (the rest of the more numerous kind at the end), each kind in the order given. Under the
    cupti-python clock, an instrumented block of the fused tp-mlp layer that followed another fused tp-mlp
    block with no bulk-synchronous block between them ended in "unspecified launch failure" on 2 and 4 H200s
    (the same blocks with an all-bsp or all-graph block between them ran: docs/tp_mlp.md); the cause is not
    known, and where fused variants outnumber the others (fused-auto counts as what it picked) two of them
    still meet. On one H200 the same failure in flash decode (a fused block, then a graph variant's) came from
    the device-to-device copies of the fused kernels' stamps, now elementwise (taxes.run.instrument); whether
    that was tp-mlp's too is to be measured on several GPUs. The order only decides what runs next to what;
    documents list the variants as asked."""
    fused = [x for x in items if is_fused(x)]
    other = [x for x in items if not is_fused(x)]
    out = []
    while fused or other:
        if fused:
            out.append(fused.pop(0))
        if other:
            out.append(other.pop(0))
    return out


def takes_traced(runner) -> bool:
    """Whether the runner has a traced build it runs when called with traced=True (the fused kernels')."""
    import inspect

    try:
        return "traced" in inspect.signature(runner.__call__).parameters
    except (TypeError, ValueError):
        return False


def variant_run(workload: str, variant: str, runner):
    """The variant a runner runs: fused-auto's pick (taxes.run.auto.AutoRunner), else the variant itself."""
    return getattr(runner, "picked_variant", None) or get(workload, variant)


def build_variant(ctx, job, shape: dict, case, variant: str):
    """The variant's runner; for fused-auto, the runner of the variant it picks here (taxes.run.auto)."""
    if get(job.workload, variant).rung != "auto":
        return case.build(variant)
    from taxes.run.auto import AutoRunner, pick

    picked, why = pick(job.workload, shape, job.world, gpu_kind_here(ctx))
    return AutoRunner(case.build(picked), get(job.workload, picked), why)


def gpu_kind_here(ctx) -> str:
    """This rank's GPU kind (h100, h200, ...), "emulated" on emulated ranks."""
    if ctx.device.type != "cuda":
        return "emulated"
    import torch

    from taxes.model.hardware import gpu_kind

    return gpu_kind(torch.cuda.get_device_name(ctx.device))


def _instrumented_block(ctx, workload: str, case, variant: str, runner, n: int, warmup: int, clock: str,
                        res: dict, api: str = "warmup", align=None) -> None:
    v = variant_run(workload, variant, runner)
    raw = record_iterations(ctx, runner, case.inputs, n, warmup, make_recorder(clock, ctx.device.type == "cuda", api),
                            graph=v.graphed, fused=v.fused, trace_of=critical_waits if v.fused else None,
                            align=align)
    if hasattr(runner, "check"):
        runner.check()
    res["raw"].setdefault(clock, []).append(raw)


def last_cta_wait_ns(rows) -> float:
    """The wait of the CTA that finished last (rows: per CTA (start, end, wait) ns). The kernel ends when its
    last CTA does, so that CTA's wait is what waiting added to the kernel; a mean over CTAs dilutes it by
    every CTA that had nothing left to wait for (at world 4 an ag-gemm of 128 tiles on 132 CTAs leaves a
    late peer's 32 tiles to a quarter of them: docs/method.md)."""
    last = max(rows, key=lambda r: (r[1], r[2]))
    return max(0, last[2])


def held_wait_ns(rows) -> float:
    """How much earlier the kernel would have ended had no CTA waited: its last CTA's end less the latest
    end any CTA would have had without its own wait. A CTA that waited nothing but ended late holds the
    kernel as much as the one that waited."""
    return max(0, max(r[1] for r in rows) - max(r[1] - max(0, r[2]) for r in rows))


def longest_wait_ns(rows) -> float:
    """The longest any CTA waited: from the earliest moment a CTA wanted peer rows to their arrival. It moves
    with the late peer's arrival alone, not with how fast the other CTAs computed meanwhile, which is why it
    recovers a planted delay where the other rules do not (docs/method.md); as an absolute it also counts
    wait that other CTAs' compute covered (the SM sat idle, the kernel may not have been held that long)."""
    return max(0, max(r[2] for r in rows))


FUSED_WAIT_RULES = {"last": last_cta_wait_ns, "held": held_wait_ns, "longest": longest_wait_ns}
FUSED_WAIT_RULE = "longest"  # the rule the rows use (docs/method.md says why)


def waits_by_rule(stamps: dict, rule: str) -> dict:
    """{phase: us} from a call's stored CTA stamps (taxes.run.cases.cta_stamps) by one of FUSED_WAIT_RULES."""
    f = FUSED_WAIT_RULES[rule]
    return {name: f([(r[0], r[1], r[2] + r[3]) for r in rows]) / 1e3 for name, rows in stamps.items() if rows}


def critical_waits(runner) -> dict:
    """{phase: us} of a fused runner's last traced call by the rule in use (FUSED_WAIT_RULE)."""
    return waits_by_rule(cta_stamps(runner) or {}, FUSED_WAIT_RULE)


def merge_blocks(blocks: list[dict]) -> dict:
    """Several instrumented blocks of one variant (rounds) -> one raw record with steps numbered on. Each
    recorder counts from its own origin: a block is moved to where it lies on the host's shared clock
    (relative to the first block's origin), so the merged record stays on one clock with every other
    rank's; correlation ids are moved past the block before's."""
    import pandas as pd

    acts, launches, host, its = [], [], [], []
    offset, corr = 0, 0
    first = blocks[0].get("shared_origin_us")
    aligned = first is not None and all(b.get("shared_origin_us") is not None for b in blocks)
    shift = 0.0
    for b in blocks:
        if aligned:
            shift = b["shared_origin_us"] - first
        b = shifted(b, shift, corr)
        corr = 1 + max([corr] + [int(f["correlation"].max()) for f in (b["activities"], b["launches"])
                                 if not f.empty and "correlation" in f])
        if not aligned:  # origins unknown: each block after the one before, a second apart
            shift = max([shift] + [float(f["end_us"].max()) for f in (b["activities"], b["launches"], b["host"])
                                   if not f.empty]) + 1e6
        ren = {f"step {it['step']}": f"step {it['step'] + offset}" for it in b["iterations"]}
        h = b["host"].copy()
        if not h.empty:
            h["name"] = h["name"].map(lambda x: ren.get(x, x))
        host.append(h)
        acts.append(b["activities"])
        launches.append(b["launches"])
        its += [dict(it, step=it["step"] + offset) for it in b["iterations"]]
        offset += len(b["iterations"])
    def cat(frames):  # empty frames left out: an empty one's object columns would make every column object
        full = [f for f in frames if not f.empty]
        return pd.concat(full, ignore_index=True) if full else frames[0]

    return {"activities": cat(acts), "launches": cat(launches), "host": cat(host), "iterations": its,
            "clock": blocks[0]["clock"], "shared_origin_us": first if aligned else None}


def timelines_of(raws: list[dict], graph_phases: list | None, comm_phases: tuple) -> list[Timeline]:
    """Every rank's raw records of one variant and clock -> Timelines (rank order), on one clock."""
    return assemble_ranks(raws, graph_phases, comm_phases)
