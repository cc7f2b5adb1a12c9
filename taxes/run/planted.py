"""Known answers: workloads with a tax of known size added on purpose, and whether the attribution finds it.

`taxes validate --planted` runs each pair (without, with the planted tax) through the same plain timing,
instrumented timing and attribution as `taxes profile`, and reports per tax the planted amount, what the
rows recovered, and how the planted amount was known:

  launch      K small kernels, each its own launching call, against the same with N more small kernels
              launched between them: planted = the change of E2E (events) less the added kernels' busy
              time (the per-kernel clock); recovered = the change of the `launch` row.
  host_bound  the same K kernels with a spin of X us on the host before each call: planted = the spins'
              own time, as the spin measured it, that the device waited through (K x X less what hid behind
              busy work, which at these sizes is none); recovered = the change of `host_bound`. A second row
              checks that a longer spin (2X) moves no launch tax: planted = the change of the launching
              calls' own time the device waited through (API records: from each call's start until its
              kernel started, and from its kernel's end until the call returned), recovered = the change of
              `launch`. Both runs spin: against no spin at all the launch row rises (by 14 and by 40 us
              in two runs on an H100), because a spin drains the queue and exposes the part of each call
              that had overlapped the previous kernel, and the spin slows the calls themselves (their own
              time +9 and +32 us).
  locality    y = 2x then z = y + 1 (two kernels, y round-trips through HBM) against z = 2x + 1 (one kernel):
              planted = the change of kernel busy time; recovered = the `locality` row (2 |y| bytes x the
              time per byte of a 1 GiB device copy timed in the same run).
  graph       the launch case's sequence replayed from a CUDA graph: planted = the ladder, E2E(eager) -
              E2E(graph) (plain events); recovered = the timeline's launch + host_bound of the eager run
              minus those of the graph run (what a graph removes).
  sync_wait   (two or more ranks) rank 1 made late in each of SYNC_RUNNERS (bsp and bsp-graph of ag-gemm and
              gemm-rs, fused-push ag-gemm), each iteration started aligned on the devices
              (taxes.run.harness.AlignedStart): on its device (a spin kernel) or its host (a spin after its queue
              drained), by 20, 100 and 500 us, against the same run without the delay, interleaved in rounds.
              planted = each waiting rank's change of plain E2E (events, no per-kernel clock); recovered =
              its change of `sync_wait`; instrumented_planted_us = the change of E2E in the instrumented
              iterations (rule_ok: the rows against it).
Single-rank cases at world > 1 are checked on every rank against that rank's own truth; a row shows the rank
that missed by the most and holds every rank's values.
Rows: {"tax", "case", "planted_us", "recovered_us", "error_pct", "ok", "method", ...}; ok within 10% or
2 us, whichever is larger.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pandas as pd

from taxes.attribution import attribute as att
from taxes.run.harness import time_iterations
from taxes.run.instrument import make_recorder, record_iterations
from taxes.traces.records import assemble_ranks, phase_order

TOLERANCE = 0.10
TOLERANCE_US = 2.0


def spin_us(us: float) -> float:
    """Busy-wait on the host for `us` microseconds; returns how long it actually spun."""
    t0 = time.perf_counter()
    end = t0 + us * 1e-6
    while time.perf_counter() < end:
        pass
    return (time.perf_counter() - t0) * 1e6


class Chain:
    """K small kernels, each launched by its own call; optionally N extra small kernels spread between them
    (launch), and a host spin before each call (host_bound)."""

    def __init__(self, ctx, k: int, extra: int = 0, spin: float = 0.0):
        import torch

        self.k, self.extra, self.spin = k, extra, spin
        self.x = torch.zeros(1, device=ctx.device)
        self.scratch = torch.zeros(1, device=ctx.device)
        self.spun: list = []

    def phases(self, *inputs, traced: bool = False):
        steps = []
        per = [self.extra // self.k + (1 if i < self.extra % self.k else 0) for i in range(self.k)]
        for i in range(self.k):
            if self.spin:
                steps.append(("spin", "host", self._spin))
            steps.append((f"kernel {i}", "compute", self._kernel))
            steps += [(f"extra {i}.{j}", "compute", self._extra) for j in range(per[i])]
        return steps

    def _spin(self):
        self.spun.append(spin_us(self.spin))

    def _kernel(self):
        self.x.add_(1)

    def _extra(self):
        self.scratch.add_(1)

    def __call__(self, *inputs):
        for _, _, f in self.phases():
            f()


class Elementwise:
    """y = 2x then z = y + 1 (unfused: two kernels, y written and read back) or z = 2x + 1 (fused)."""

    def __init__(self, ctx, n: int, fused: bool):
        import torch

        g = torch.Generator(device=ctx.device).manual_seed(7)
        self.x = torch.randn(n, generator=g, device=ctx.device)
        self.y = torch.empty_like(self.x)
        self.z = torch.empty_like(self.x)
        self.fused = fused
        self.intermediate_bytes = 0.0 if fused else 2.0 * self.y.numel() * self.y.element_size()

    def phases(self, *inputs, traced: bool = False):
        from taxes.kernels.planted import affine

        if self.fused:
            return [("affine", "compute", lambda: affine(self.x, self.z, 2.0, 1.0))]
        return [("scale", "compute", lambda: affine(self.x, self.y, 2.0, 0.0)),
                ("shift", "compute", lambda: affine(self.y, self.z, 1.0, 1.0))]

    def __call__(self, *inputs):
        for _, _, f in self.phases():
            f()
        return self.z


# ---- a rank made late on purpose ------------------------------------------------------------------

# The runners a late rank is planted in (world > 1): NCCL and cuBLAS eager and in a graph for both
# collectives, and a fused kernel whose wait for the late peer happens inside it. Shapes small enough for
# a few seconds per run, large enough that each runs a real collective and GEMM.
SYNC_RUNNERS = (("ag-gemm", "bsp"), ("ag-gemm", "bsp-graph"), ("gemm-rs", "bsp"), ("gemm-rs", "bsp-graph"),
                ("ag-gemm", "fused-push"))
SYNC_SHAPES = {"ag-gemm": "M=4096,N=4096,K=4096", "gemm-rs": "M=4096,N=4096,K=4096"}
EMULATED_SHAPES = {"ag-gemm": "M=64,N=64,K=32", "gemm-rs": "M=64,N=64,K=64"}
EMULATED_CONFIG = {"ag-gemm": {"block_m": 16, "block_n": 16, "block_k": 16, "chunk_rows": 16, "copiers": 1,
                               "copy_block": 256, "num_stages": 1}}
DELAYS = ("device", "host")
LATE_US = (20.0, 100.0, 500.0)
# emulated ranks: the bulk-synchronous runners only (the interpreter has no clock for in-kernel waits), and
# delays of milliseconds (the host's own noise between two processes is tens to hundreds of us)
EMULATED_RUNNERS = (("ag-gemm", "bsp"), ("gemm-rs", "bsp"))
EMULATED_LATE_US = (3000.0, 10000.0)


def planted_heap_bytes(world: int, emulated: bool) -> int:
    """The symmetric heap each rank needs for the late-rank cases (the largest of SYNC_RUNNERS' cases)."""
    from taxes.run.profile import heap_bytes
    from taxes.workloads import make_workload, parse_shape

    if world < 2:
        return 64 << 20
    shapes = EMULATED_SHAPES if emulated else SYNC_SHAPES
    return max(heap_bytes(make_workload(wl, parse_shape(shapes[wl]), world)) for wl, _ in SYNC_RUNNERS)


class Late:
    """A runner with rank `late` made late on purpose. Measured with an aligned start (the ranks' devices
    leave an all-reduce together, with everything that follows already queued: taxes.run.harness.AlignedStart),
    so each rank reaches the runner's collective when its device gets there. Rank `late` is delayed by x_us
    just before the runner's first communication step (before its first step when it has none: a fused
    kernel): `device`, a spin kernel of about x_us on its stream (torch.cuda._sleep), whose length the
    per-kernel clock reads; `host`, its host first waits for its device to drain (a host spin delays a rank
    only when nothing is queued behind it), then spins x_us before the launching call. The run without a
    delay keeps everything else (x_us = 0: the drain stays). On emulated ranks (the host is the device) a
    device delay is a launching call that spins."""

    def __init__(self, ctx, runner, how: str, x_us: float, late: int = 1, cycles_per_us: float | None = None):
        if how not in DELAYS:
            raise ValueError(f"delay {how!r}: choose from {', '.join(DELAYS)}")
        self.ctx, self.runner, self.how, self.x, self.late = ctx, runner, how, float(x_us), late
        self.cycles_per_us = cycles_per_us
        self.spun: list = []

    def _device_spin(self):
        if self.ctx.device.type == "cuda":
            import torch

            torch.cuda._sleep(max(1, int(self.x * self.cycles_per_us)))
        else:
            self.spun.append(spin_us(self.x))

    def _drain(self):
        if self.ctx.device.type == "cuda":
            import torch

            torch.cuda.synchronize()

    def _host_spin(self):
        self.spun.append(spin_us(self.x))

    def phases(self, *inputs, traced: bool = False):
        steps = list(self.runner.phases(*inputs, traced=traced))
        if self.ctx.rank != self.late:
            return steps
        at = next((i for i, s in enumerate(steps) if s[1] == "communication"), 0)
        if self.how == "device":
            delay = [("delay", "compute", self._device_spin)] if self.x else []
        else:
            delay = [("drain", "host", self._drain)] + ([("delay", "host", self._host_spin)] if self.x else [])
        return steps[:at] + delay + steps[at:]

    def __call__(self, *inputs):
        for _, _, f in self.phases(*inputs):
            f()

    def __getattr__(self, name):  # the wrapped runner's trace of its last call (fused kernels' waits), its checks
        if name == "runner":
            raise AttributeError(name)
        return getattr(self.runner, name)


# ---- measuring one runner -------------------------------------------------------------------------


class Replayed:
    """A runner's launching steps captured in one CUDA graph per input set: calling it runs the runner's
    host steps (a planted spin), then replays the graph."""

    def __init__(self, runner, input_sets: list):
        import torch

        self.runner = runner
        self.graphs = {}
        for k, inputs in enumerate(input_sets):
            steps = [s for s in runner.phases(*inputs) if s[1] != "host"]
            for _, _, f in steps:
                f()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _, _, f in steps:
                    f()
            self.graphs[id(inputs[0]) if inputs else k] = g

    def phases(self, *inputs, traced: bool = False):
        return self.runner.phases(*inputs, traced=traced)

    def __call__(self, *inputs):
        for _, role, f in self.runner.phases(*inputs):
            if role == "host":
                f()
        self.graphs[id(inputs[0]) if inputs else 0].replay()


def measure(ctx, runner, iters: int, warmup: int, clock: str, graph: bool = False, locality_bytes: float = 0.0,
            us_per_byte: float | None = None, comm: tuple = (), input_sets: list | None = None,
            fused: bool = False, align=None, plain_runner=None, instrumented_first: bool = False) -> dict:
    """Plain and instrumented timing of one runner; every rank returns its own records, combined by
    `attributed`. Launch calls are recorded in every iteration: a known answer wants the exact launch path,
    whatever it costs. fused: the instrumented iterations run the traced build and read its CTAs' waits.
    align: the iterations' start (taxes.run.harness.AlignedStart; None: the host barrier alone). plain_runner:
    what the plain iterations call (default: the runner, or its graph when graph)."""
    inputs = input_sets or [()]
    on_gpu = ctx.device.type == "cuda"
    if plain_runner is None:
        plain_runner = Replayed(runner, inputs) if graph and on_gpu else runner
    trace_of = None
    if fused:
        from taxes.run.measure import critical_waits as trace_of
    out = {}

    def plain():
        out["plain"] = time_iterations(ctx, plain_runner, inputs, iters, warmup, align=align)

    def instrumented():
        out["raw"] = record_iterations(ctx, runner, inputs, iters, warmup, make_recorder(clock, on_gpu, api="all"),
                                       graph=graph, fused=fused, trace_of=trace_of, align=align)

    for block in ((instrumented, plain) if instrumented_first else (plain, instrumented)):
        block()
    return {"plain": out["plain"], "raw": out["raw"], "comm": comm, "locality_bytes": locality_bytes,
            "us_per_byte": us_per_byte}


def attributed(per_rank: list[dict], graph_phases: list | None = None) -> dict:
    """Combine every rank's measurement of one runner (on one clock): the rows of every rank, and per rank
    its own statistics ("by_rank": rank -> {rows, e2e_us (its own instrumented span), plain_us (its own
    plain samples), busy_us, launch_path_us}, each the interquartile mean over that rank's iterations);
    beside them the overall view (per iteration the slowest rank: rows, e2e_us, plain_us)."""
    tls = assemble_ranks([m["raw"] for m in per_rank], graph_phases, comm_phases=per_rank[0]["comm"])
    m0 = per_rank[0]
    a = att.attribute(tls, locality_bytes=m0["locality_bytes"] or None, us_per_byte=m0["us_per_byte"],
                      aligned_starts=True)
    s = att.summarize(a.rows)
    plains = [m.get("plain") or [] for m in per_rank]
    plain = att.iqm([max(v) for v in zip(*plains)]) if all(plains) else None
    by_rank = {}
    for tl, m, own in zip(tls, per_rank, plains):
        rows = a.rows[a.rows["rank"] == tl.rank]
        sr = att.summarize(rows)
        kept = rows[rows["step"].isin(sr["kept"])]
        by_rank[tl.rank] = {"rows": sr["rows"], "e2e_us": sr["e2e_us"], "plain_us": att.iqm(own) if own else None,
                            "busy_us": float(kept["busy_us"].mean()) if len(kept) else 0.0,
                            "launch_path_us": _launch_path(tl, sr["kept"]), "tl": tl}
    kept = a.rows[a.rows["step"].isin(s["kept"])]
    return {"rows": s["rows"], "per_rank": s["per_rank"], "e2e_us": s["e2e_us"], "plain_us": plain,
            "busy_us": float(kept.groupby("step")["busy_us"].max().mean()) if len(kept) else 0.0,
            "launch_path_us": by_rank[tls[0].rank]["launch_path_us"] if tls else 0.0,
            "launch_latency_us": float(a.rows["launch_latency_us"].median()) if len(a.rows) else None,
            "by_rank": by_rank, "notes": a.notes}


def graph_row(eager: dict, graph: dict, plain_ladder: float | None = None) -> dict:
    """The graph case: what a graph removed, E2E(eager) - E2E(graph) of the instrumented runs (the
    conditions the timelines were recorded in: launch calls recorded in every iteration make eager launches
    dearer, not graphs), against launch + host_bound of the eager timeline minus the graph's."""
    eager_lh = eager["rows"]["launch"] + eager["rows"]["host_bound"]
    graph_lh = graph["rows"]["launch"] + graph["rows"]["host_bound"]
    return row("graph", "the launch case replayed from a CUDA graph", eager["e2e_us"] - graph["e2e_us"],
               eager_lh - graph_lh,
               "the ladder E2E(eager) - E2E(graph) of the instrumented runs (events) against launch + host_bound "
               "of the eager timeline minus the graph's; plain_planted_us: the same ladder of the plain runs",
               plain_planted_us=plain_ladder, graph_gaps_us=graph["rows"]["graph_gaps"],
               graph_launch_us=graph["rows"]["launch"])


def _launch_path(tl, steps: list) -> float:
    """Per iteration (mean over `steps`), the launching calls' own time the device waited through: from each
    call's start until its first device activity started (the call, its launch, the launch latency), and
    from its last activity's end until the call returned, where it returned later (API records join calls
    to their activities). Per call, independent of the attribution's interval rules."""
    host = tl.host
    calls = host[host["kind"] == "call"].sort_values("start_us")
    spans = host[host["kind"] == "step"].set_index("name")
    la = tl.launches[tl.launches["kind"].isin(("launch", "graph"))]
    by_corr = tl.activities.groupby("correlation")
    first_start, last_end = by_corr["start_us"].min(), by_corr["end_us"].max()
    totals = []
    for s in steps:
        if f"step {s}" not in spans.index:
            continue
        h0, h1 = spans.at[f"step {s}", "start_us"], spans.at[f"step {s}", "end_us"]
        total = 0.0
        for c in calls[(calls["start_us"] >= h0) & (calls["end_us"] <= h1)].itertuples():
            corr = la.loc[(la["start_us"] >= c.start_us) & (la["start_us"] <= c.end_us), "correlation"]
            starts = first_start.reindex(corr.values).dropna()
            if len(starts):
                total += float(starts.min() - c.start_us)
                total += max(0.0, c.end_us - float(last_end.reindex(corr.values).max()))
        totals.append(total)
    return statistics.fmean(totals) if totals else 0.0


def row(tax: str, case: str, planted: float, recovered: float, method: str, **extra) -> dict:
    err = recovered - planted
    ok = abs(err) <= max(TOLERANCE * abs(planted), TOLERANCE_US)
    return {"tax": tax, "case": case, "planted_us": planted, "recovered_us": recovered,
            "error_pct": 100 * err / planted if planted else None, "ok": bool(ok), "method": method, **extra}


# ---- the cases ------------------------------------------------------------------------------------


def rank_cases(ctx, opts: dict) -> dict:
    """Everything one rank measures for --planted (run under kernels.runtime.launch)."""
    import torch

    out: dict = {}
    if opts.get("single", True):
        out.update(single_cases(ctx, opts))
    if ctx.world > 1:
        out.update(late_cases(ctx, opts))
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return out


def single_cases(ctx, opts: dict) -> dict:
    """The launch, host-bound, locality and graph cases, their iterations interleaved in opts["rounds"]
    rounds (each case's block in turn, plain first in even rounds and instrumented first in odd ones): the
    host's speed drifts by microseconds per launching call over seconds, and a case compared with another
    measured apart would carry that drift as a tax."""
    from taxes.run.measure import merge_blocks

    clock, iters, warmup = opts["clock"], opts["iters"], opts["warmup"]
    k, extra, spin = opts.get("k", 20), opts.get("extra", 40), opts.get("spin_us", 25.0)
    on_gpu = ctx.device.type == "cuda"
    n = opts.get("elements", 128 << 20 if on_gpu else 1 << 12)
    us_per_byte = _copy_us_per_byte(ctx, n)
    spun, longer = Chain(ctx, k, spin=spin), Chain(ctx, k, spin=2 * spin)
    unfused, fused = Elementwise(ctx, n, False), Elementwise(ctx, n, True)
    # emulated ranks replay nothing: the eager sequence stands in for the graph (the logic of the rows)
    cases = {"base": (Chain(ctx, k), False, {}), "extra": (Chain(ctx, k, extra=extra), False, {}),
             "spin": (spun, False, {}), "spin_more": (longer, False, {}),
             "graph": (Chain(ctx, k, extra=extra) if on_gpu else Chain(ctx, k), on_gpu, {}),
             "unfused": (unfused, False, {"locality_bytes": unfused.intermediate_bytes, "us_per_byte": us_per_byte}),
             "fused": (fused, False, {"locality_bytes": fused.intermediate_bytes, "us_per_byte": us_per_byte})}
    plains = {name: Replayed(runner, [()]) if graph else runner for name, (runner, graph, _) in cases.items()}
    got = {name: {"plain": [], "raw": []} for name in cases}
    rounds = max(1, min(opts.get("rounds", 4), iters))
    for r, n_iters in enumerate(_blocks(iters, rounds)):
        for name, (runner, graph, kw) in cases.items():
            m = measure(ctx, runner, n_iters, warmup if r == 0 else min(warmup, 2), clock, graph=graph,
                        plain_runner=plains[name], instrumented_first=r % 2 == 1, **kw)
            got[name]["plain"] += m["plain"]
            got[name]["raw"].append(m["raw"])
    out = {}
    for name, (runner, graph, kw) in cases.items():
        out[name] = {"plain": got[name]["plain"], "raw": merge_blocks(got[name]["raw"]), "comm": (),
                     "locality_bytes": kw.get("locality_bytes", 0.0), "us_per_byte": kw.get("us_per_byte")}
    for name, chain in (("spin", spun), ("spin_more", longer)):
        out[name]["spun_us"] = statistics.median(chain.spun) if chain.spun else 0.0
        out[name]["spins_per_iteration"] = k
    for name, r in (("unfused", unfused), ("fused", fused)):
        out[name]["intermediate_bytes"] = r.intermediate_bytes
    out["us_per_byte"] = us_per_byte
    return out


def late_cases(ctx, opts: dict) -> dict:
    """Rank 1 late on purpose in each of SYNC_RUNNERS (opts["runners"] picks some): for each kind of delay
    (DELAYS), once without it and once with each length (opts["late_us"]), opts["late_iters"] iterations
    each. Keys "WORKLOAD VARIANT HOW X" ("... HOW 0": the run without a delay)."""
    import torch

    from taxes.run.cases import make_case
    from taxes.run.harness import AlignedStart, sleep_cycles_per_us
    from taxes.run.measure import merge_blocks
    from taxes.variants import get
    from taxes.workloads import make_workload, parse_shape

    on_gpu = ctx.device.type == "cuda"
    clock, iters, warmup = opts["clock"], opts.get("late_iters", opts["iters"]), opts["warmup"]
    rounds = max(1, min(opts.get("late_rounds", 4), iters))
    xs = tuple(opts.get("late_us", LATE_US))
    cycles = sleep_cycles_per_us(ctx.device) if on_gpu else None
    align = AlignedStart(ctx, opts.get("lead_us", 500.0))
    out = {}
    for wl, variant in opts.get("runners", SYNC_RUNNERS):
        ctx.heap.reset()
        shape = (SYNC_SHAPES if on_gpu else EMULATED_SHAPES)[wl]
        w = make_workload(wl, parse_shape(shape), ctx.world, "bf16")
        case = make_case(ctx, w, 5.0, None if on_gpu else EMULATED_CONFIG.get(wl))
        ctx.doing(f"known answers: {wl} {variant}, rank 1 late")
        runner = case.build(variant)
        v = get(wl, variant)
        comm = tuple(n for n, role, _ in runner.phases(*case.inputs[0]) if role == "communication")
        plan = [(how, x) for how in DELAYS for x in (0.0,) + xs]
        lates = {p: Late(ctx, runner, p[0], p[1], cycles_per_us=cycles) for p in plan}
        graphed = v.graphed and on_gpu
        plains = {p: Replayed(lates[p], case.inputs) if graphed else lates[p] for p in plan}
        got = {p: {"plain": [], "raw": []} for p in plan}
        # every delay's iterations interleaved in rounds (plain first in even rounds, instrumented first in odd
        # ones): a drift of the host between the run without a delay and the runs with one falls on all alike
        for r, n in enumerate(_blocks(iters, rounds)):
            for p in plan:
                m = measure(ctx, lates[p], n, warmup if r == 0 else min(warmup, 2), clock, graph=graphed, comm=comm,
                            input_sets=case.inputs, fused=v.fused, align=align, plain_runner=plains[p],
                            instrumented_first=r % 2 == 1)
                got[p]["plain"] += m["plain"]
                got[p]["raw"].append(m["raw"])
        for (how, x), g in got.items():
            m = {"plain": g["plain"], "raw": merge_blocks(g["raw"]), "comm": comm, "locality_bytes": 0.0,
                 "us_per_byte": None}
            late = lates[(how, x)]
            m["spun_us"] = statistics.median(late.spun) if late.spun else 0.0
            m.update(workload=wl, variant=variant, shape=shape, how=how, x_us=x, late=late.late,
                     eager_twin=v.eager_twin)
            out[f"{wl} {variant} {how} {x:g}"] = m
        del runner, case
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return out


def _copy_us_per_byte(ctx, n: int) -> float:
    """HBM time per byte from a device copy of max(1 GiB, 4 n floats) timed here (read + write counted)."""
    import torch

    if ctx.device.type != "cuda":
        return 1.0 / 3.0e6
    nbytes = max(1 << 30, 4 * n)
    a = torch.empty(nbytes // 4, device=ctx.device)
    b = torch.empty_like(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(12):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times) / (2.0 * nbytes)


def known_answers(results: list[dict]) -> list[dict]:
    """Every rank's measurements -> the known-answer rows."""
    rows = single_rank_rows(results) if "base" in results[0] else []
    if len(results) > 1:
        rows += late_rows(results)
    return rows


def _each_rank(results: list[dict], case: str, tax: str, check) -> dict:
    """A case that concerns each rank alone (no collective): check(by_rank) -> (planted, recovered, extra)
    per rank; the row shows the rank that missed by the most (relative to its tolerance), and holds every
    rank's values; it is ok when every rank's is."""
    per = []
    for r in range(len(results)):
        planted, recovered, extra = check(r)
        one = row(tax, case, planted, recovered, "", **extra)
        slack = abs(recovered - planted) / max(TOLERANCE * abs(planted), TOLERANCE_US)
        per.append((slack, r, one))
    worst = max(per, key=lambda t: t[0])[2]
    out = dict(worst, rank=max(per, key=lambda t: t[0])[1], ok=all(p[2]["ok"] for p in per))
    if len(results) > 1:
        out["per_rank"] = [{"rank": r, "planted_us": o["planted_us"], "recovered_us": o["recovered_us"], "ok": o["ok"]}
                           for _, r, o in per]
    return out


def single_rank_rows(results: list[dict]) -> list[dict]:
    """The launch, host-bound, locality and graph cases, each rank against its own truth."""
    cache: dict = {}

    def A(key):
        if key not in cache:
            cache[key] = attributed([r[key] for r in results])["by_rank"]
        return cache[key]

    def B(key, r):
        return A(key)[r]

    rows = []

    def launch_case(r):
        base, extra = B("base", r), B("extra", r)
        d_busy = extra["busy_us"] - base["busy_us"]
        return (extra["e2e_us"] - base["e2e_us"] - d_busy, extra["rows"]["launch"] - base["rows"]["launch"],
                {"plain_planted_us": (extra["plain_us"] or 0) - (base["plain_us"] or 0) - d_busy})

    r0 = _each_rank(results, "extra small kernels", "launch", launch_case)
    r0["method"] = ("change of the rank's instrumented E2E (events) less the added kernels' busy time (per-kernel "
                    "clock), against the change of its launch row")
    rows.append(r0)

    def spin_case(r):
        per_spin, n = results[r]["spin"]["spun_us"], results[r]["spin"]["spins_per_iteration"]
        return n * per_spin, B("spin", r)["rows"]["host_bound"] - B("base", r)["rows"]["host_bound"], {}

    r1 = _each_rank(results, "host spin before each launch", "host_bound", spin_case)
    n_spins, per_spin = results[0]["spin"]["spins_per_iteration"], results[0]["spin"]["spun_us"]
    r1["method"] = (f"{n_spins} spins of {per_spin:.1f} us (median, as the spin measured itself) per iteration, "
                    "against the change of the host_bound row")
    rows.append(r1)

    def longer_case(r):
        spun, more = B("spin", r), B("spin_more", r)
        base = B("base", r)
        n = results[r]["spin"]["spins_per_iteration"]
        added = n * (results[r]["spin_more"]["spun_us"] - results[r]["spin"]["spun_us"])
        # the change of E2E (events) less the change of busy time (the per-kernel clock) and the spins' added
        # length (as they timed themselves): what else the device waited for, which no rule decided
        other = (more["e2e_us"] - spun["e2e_us"]) - (more["busy_us"] - spun["busy_us"]) - added
        return (more["launch_path_us"] - spun["launch_path_us"], more["rows"]["launch"] - spun["rows"]["launch"],
                {"launch_path_us": [spun["launch_path_us"], more["launch_path_us"]], "other_idle_change_us": other,
                 "host_bound_change_us": more["rows"]["host_bound"] - spun["rows"]["host_bound"],
                 "spins_added_us": added,
                 "against_no_spin": {"launch_row_change_us": spun["rows"]["launch"] - base["rows"]["launch"],
                                     "launch_path_change_us": spun["launch_path_us"] - base["launch_path_us"]}})

    r2 = _each_rank(results, "a longer host spin leaves launch unchanged", "launch", longer_case)
    r2["method"] = (f"the launch row with spins of {per_spin:.1f} and {results[0]['spin_more']['spun_us']:.1f} us, "
                    "against the change of the launching calls' own time the device waited through (API records: "
                    "each call's start until its kernel started, and its kernel's end until it returned); "
                    "other_idle_change_us: the change of E2E (events) less that of busy time (per-kernel clock) "
                    "and the spins' added length (as they timed themselves)")
    rows.append(r2)

    def locality_case(r):
        un, fu = B("unfused", r), B("fused", r)
        return un["busy_us"] - fu["busy_us"], un["rows"]["locality"], {"bytes": results[r]["unfused"]["intermediate_bytes"]}

    r3 = _each_rank(results, "one extra HBM round trip", "locality", locality_case)
    r3["method"] = (f"change of kernel busy time (per-kernel clock) against "
                    f"{results[0]['unfused']['intermediate_bytes'] / 2**20:.0f} MiB x the time per byte of a device "
                    "copy timed in the same run")
    rows.append(r3)

    def graph_case(r):
        eager, graph = B("extra", r), B("graph", r)
        lh = (eager["rows"]["launch"] + eager["rows"]["host_bound"]) - (graph["rows"]["launch"] + graph["rows"]["host_bound"])
        return (eager["e2e_us"] - graph["e2e_us"], lh,
                {"plain_planted_us": (eager["plain_us"] or 0) - (graph["plain_us"] or 0),
                 "graph_gaps_us": graph["rows"]["graph_gaps"], "graph_launch_us": graph["rows"]["launch"]})

    r4 = _each_rank(results, "the launch case replayed from a CUDA graph", "graph", graph_case)
    r4["method"] = ("the ladder E2E(eager) - E2E(graph) of the instrumented runs (events) against launch + host_bound "
                    "of the eager timeline minus the graph's; plain_planted_us: the same ladder of the plain runs")
    rows.append(r4)
    return rows


def late_rows(results: list[dict]) -> list[dict]:
    """Per runner, delay and length: the waiting ranks' change of sync wait against the same run without a
    delay (recovered), against the change of their own plain E2E (events around each iteration, no clock
    on: the truth, measured without the rule)."""
    rows = []
    keys = [k for k in results[0] if k.endswith(" 0") and k.split(" ")[-2:-1] in (["device"], ["host"])
            and isinstance(results[0][k], dict) and "how" in results[0][k]]
    for base_key in keys:
        wl, variant, how0 = base_key.split(" ")[:3]
        base = attributed([r[base_key] for r in results], _twin(results, base_key))
        late = results[0][base_key]["late"]
        waiting = [r for r in range(len(results)) if r != late]
        skew = statistics.fmean(base["by_rank"][r]["rows"]["start_skew"] for r in range(len(results)))
        for key in [k for k in results[0] if k.startswith(f"{wl} {variant} {how0} ") and k != base_key]:
            m1 = results[late][key]
            how, x = m1["how"], m1["x_us"]
            run = attributed([r[key] for r in results], _twin(results, key))
            per = []
            for r in waiting:
                truth = (run["by_rank"][r]["plain_us"] or 0.0) - (base["by_rank"][r]["plain_us"] or 0.0)
                # the same truth in the instrumented iterations themselves (their events, not the rows):
                # where it and the plain one differ, measuring moved the program, not the rule
                seen = run["by_rank"][r]["e2e_us"] - base["by_rank"][r]["e2e_us"]
                rec = run["by_rank"][r]["rows"]["sync_wait"] - base["by_rank"][r]["rows"]["sync_wait"]
                one = row("sync_wait", "", truth, rec, "")
                per.append({"rank": r, "planted_us": truth, "recovered_us": rec, "ok": one["ok"],
                            "instrumented_planted_us": seen, "rule_ok": row("sync_wait", "", seen, rec, "")["ok"],
                            "start_skew_change_us": run["by_rank"][r]["rows"]["start_skew"]
                            - base["by_rank"][r]["rows"]["start_skew"]})
            planted = statistics.fmean(p["planted_us"] for p in per)
            recovered = statistics.fmean(p["recovered_us"] for p in per)
            seen = statistics.fmean(p["instrumented_planted_us"] for p in per)
            delay = _delay_us(run["by_rank"][late]["tl"]) if how == "device" else m1["spun_us"]
            out = row("sync_wait", f"{wl} {variant}: rank {late} late by {x:g} us ({how})", planted, recovered,
                      "the waiting ranks' change of plain E2E (events, no per-kernel clock) against the change of "
                      "their sync_wait row, each against the same run without a delay; instrumented_planted_us: "
                      "the same change of E2E in the instrumented iterations (events), which rule_ok holds the "
                      "rows to",
                      workload=wl, variant=variant, shape=m1["shape"], delay=how, delay_asked_us=x,
                      iteration_start="aligned: after the host barrier, a spin kernel and a one-element "
                                      "all-reduce on every rank before the start event (taxes.run.harness.AlignedStart)",
                      delay_measured_us=delay, per_rank=per, harness_start_skew_us=skew,
                      late_rank_e2e_change_us=(run["by_rank"][late]["plain_us"] or 0.0)
                      - (base["by_rank"][late]["plain_us"] or 0.0),
                      instrumented_planted_us=seen, measuring_moved_us=seen - planted)
            out["ok"] = all(p["ok"] for p in per)
            out["rule_ok"] = all(p["rule_ok"] for p in per)
            rows.append(out)
    return rows


FACTS = ("how", "x_us", "late", "workload", "variant", "shape", "eager_twin", "comm", "spun_us",
         "spins_per_iteration", "intermediate_bytes", "locality_bytes", "us_per_byte")
SINGLE_CASES = ("base", "extra", "spin", "spin_more", "graph", "unfused", "fused")


def stored_facts(m: dict) -> dict:
    """What a late-rank case's stored records keep beside the raw records (FACTS)."""
    return {k: (list(m[k]) if k == "comm" else m[k]) for k in FACTS if k in m}


def results_from_records(records: dict, facts: dict | None = None) -> list[dict]:
    """Stored records ({case: [per rank: raw columns with plain_us and facts]}) as known_answers' per-rank
    results, so a run's rows can be redone by today's rules. Late-rank cases stored without facts take them
    from the case's name ("WORKLOAD VARIANT HOW X", rank 1 late); single-rank cases from `facts`
    ({case: {fact: value}}, e.g. what the run's document says of its spins), where the records lack them."""
    from taxes.traces.records import raw_from_columns
    from taxes.variants import get

    world = len(next(iter(records.values())))
    out = [{} for _ in range(world)]
    for key in SINGLE_CASES:
        for r, d in enumerate(records.get(key, [])):
            f = {"comm": (), "locality_bytes": 0.0, "us_per_byte": None} | (facts or {}).get(key, {}) | (d.get("facts") or {})
            out[r][key] = {"raw": raw_from_columns(d), "plain": list(d.get("plain_us") or []), **f,
                           "comm": tuple(f.get("comm") or ())}
    for key, ranks in records.items():
        parts = key.split(" ")
        if len(parts) != 4 or parts[2] not in DELAYS:
            continue
        wl, variant, how, x = parts
        v = get(wl, variant)
        for r, d in enumerate(ranks):
            facts = {"how": how, "x_us": float(x), "late": 1, "workload": wl, "variant": variant, "shape": "",
                     "eager_twin": v.eager_twin, "spun_us": 0.0,
                     "comm": () if v.fused else (("all-gather",) if wl == "ag-gemm" else ("reduce-scatter",))}
            facts.update(d.get("facts") or {})
            facts["comm"] = tuple(facts["comm"])
            out[r][key] = {"raw": raw_from_columns(d), "plain": list(d.get("plain_us") or []),
                           "locality_bytes": 0.0, "us_per_byte": None, **facts}
    return out


def _blocks(iters: int, rounds: int) -> list[int]:
    """iters split into `rounds` blocks as evenly as whole iterations allow."""
    return [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]


def _twin(results: list[dict], key: str) -> list | None:
    """A graphed runner's kernels named after its eager twin's steps, measured with the same delay: the
    late rank's [(kernel name, step)] in order (it holds the delay kernel the others lack)."""
    m = results[0][key]
    if not m.get("eager_twin"):
        return None
    twin_key = " ".join([m["workload"], m["eager_twin"]] + key.split(" ")[2:])
    if twin_key not in results[0]:
        return None
    late = m["late"]
    tls = assemble_ranks([r[twin_key]["raw"] for r in results], comm_phases=results[0][twin_key]["comm"])
    return phase_order(tls[late])


def _delay_us(tl) -> float | None:
    """The planted spin kernel's mean length per iteration, from the per-kernel clock."""
    a = tl.activities[tl.activities["phase"] == "delay"]
    return float((a["end_us"] - a["start_us"]).mean()) if len(a) else None


def summary(rows: list[dict]) -> str:
    ok = sum(r["ok"] for r in rows)
    return f"{ok} of {len(rows)} planted taxes recovered within {100 * TOLERANCE:.0f}% (or {TOLERANCE_US:g} us)"
