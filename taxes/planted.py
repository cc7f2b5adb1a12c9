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
  sync_wait   (two or more ranks) every rank runs a small collective; rank 1 spins X us before it:
              planted = X; recovered = rank 0's `sync_wait`.
Rows: {"tax", "case", "planted_us", "recovered_us", "error_pct", "ok", "method", ...}; ok within 10% or
2 us, whichever is larger.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pandas as pd

from taxes import attribute as att
from taxes.harness import time_iterations
from taxes.instrument import assemble, make_recorder, record_iterations

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


class LateRank:
    """Every rank: a small all-reduce; rank `late` spins `spin` us before it."""

    def __init__(self, ctx, spin: float, late: int = 1):
        import torch

        self.ctx, self.spin, self.late = ctx, spin, late
        self.t = torch.ones(1024, device=ctx.device)
        self.spun: list = []

    def phases(self, *inputs, traced: bool = False):
        import torch.distributed as dist

        steps = []
        if self.ctx.rank == self.late and self.spin:
            steps.append(("spin", "host", lambda: self.spun.append(spin_us(self.spin))))
        steps.append(("all-reduce", "communication", lambda: dist.all_reduce(self.t)))
        return steps

    def __call__(self, *inputs):
        for _, _, f in self.phases():
            f()


# ---- measuring one runner -------------------------------------------------------------------------


class Replayed:
    """A runner's launching steps captured in one CUDA graph: calling it replays the graph."""

    def __init__(self, runner):
        import torch

        self.runner = runner
        steps = [s for s in runner.phases() if s[1] != "host"]
        for _, _, f in steps:
            f()
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for _, _, f in steps:
                f()

    def phases(self, *inputs, traced: bool = False):
        return self.runner.phases(*inputs, traced=traced)

    def __call__(self, *inputs):
        self.graph.replay()


def measure(ctx, runner, iters: int, warmup: int, clock: str, graph: bool = False, locality_bytes: float = 0.0,
            us_per_byte: float | None = None, comm: tuple = ()) -> dict:
    """Plain and instrumented timing of one runner, attributed; every rank returns its own view and the
    timeline rows of all ranks are combined by the caller (single rank: this rank's). Launch calls are
    recorded in every iteration: a known answer wants the exact launch path, whatever it costs."""
    inputs = [()]
    plain = time_iterations(ctx, Replayed(runner) if graph and ctx.device.type == "cuda" else runner, inputs, iters,
                            warmup)
    raw = record_iterations(ctx, runner, inputs, iters, warmup,
                            make_recorder(clock, ctx.device.type == "cuda", api="all"), graph=graph, fused=False)
    return {"plain": plain, "raw": raw, "comm": comm, "locality_bytes": locality_bytes, "us_per_byte": us_per_byte}


def attributed(per_rank: list[dict]) -> dict:
    """Combine every rank's measurement of one runner: rows (interquartile mean), plain and instrumented
    E2E (interquartile means of the slowest rank), busy time per iteration."""
    tls = [assemble(r, m["raw"], comm_phases=m["comm"]) for r, m in enumerate(per_rank)]
    m0 = per_rank[0]
    a = att.attribute(tls, locality_bytes=m0["locality_bytes"] or None, us_per_byte=m0["us_per_byte"])
    s = att.summarize(a.rows)
    plain = att.iqm([max(v) for v in zip(*[m["plain"] for m in per_rank])])
    kept = a.rows[a.rows["step"].isin(s["kept"])]
    return {"rows": s["rows"], "per_rank": s["per_rank"], "e2e_us": s["e2e_us"], "plain_us": plain,
            "busy_us": float(kept.groupby("step")["busy_us"].max().mean()) if len(kept) else 0.0,
            "launch_path_us": _launch_path(tls[0], s["kept"]),
            "launch_latency_us": float(a.rows["launch_latency_us"].median()) if len(a.rows) else None}


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

    clock, iters, warmup = opts["clock"], opts["iters"], opts["warmup"]
    out: dict = {}
    k, extra, spin = opts.get("k", 20), opts.get("extra", 40), opts.get("spin_us", 25.0)
    out["base"] = measure(ctx, Chain(ctx, k), iters, warmup, clock)
    out["extra"] = measure(ctx, Chain(ctx, k, extra=extra), iters, warmup, clock)
    spun = Chain(ctx, k, spin=spin)
    out["spin"] = measure(ctx, spun, iters, warmup, clock)
    out["spin"]["spun_us"] = statistics.median(spun.spun) if spun.spun else 0.0
    out["spin"]["spins_per_iteration"] = k
    longer = Chain(ctx, k, spin=2 * spin)
    out["spin_more"] = measure(ctx, longer, iters, warmup, clock)
    out["spin_more"]["spun_us"] = statistics.median(longer.spun) if longer.spun else 0.0
    if ctx.device.type == "cuda":
        out["graph"] = measure(ctx, Chain(ctx, k, extra=extra), iters, warmup, clock, graph=True)
    else:  # emulated ranks replay nothing: the eager sequence stands in (the logic of the rows, not a graph)
        out["graph"] = measure(ctx, Chain(ctx, k), iters, warmup, clock)
    n = opts.get("elements", 128 << 20 if ctx.device.type == "cuda" else 1 << 12)
    us_per_byte = _copy_us_per_byte(ctx, n)
    for name, fused in (("unfused", False), ("fused", True)):
        r = Elementwise(ctx, n, fused)
        out[name] = measure(ctx, r, iters, warmup, clock, locality_bytes=r.intermediate_bytes, us_per_byte=us_per_byte)
        out[name]["intermediate_bytes"] = r.intermediate_bytes
    out["us_per_byte"] = us_per_byte
    if ctx.world > 1 and ctx.device.type == "cuda":
        for x in opts.get("late_us", (20.0, 100.0, 500.0)):
            late = LateRank(ctx, x)
            out[f"late {x:g}"] = measure(ctx, late, iters, warmup, clock, comm=("all-reduce",))
            out[f"late {x:g}"]["spun_us"] = statistics.median(late.spun) if late.spun else 0.0
        out["late 0"] = measure(ctx, LateRank(ctx, 0.0), iters, warmup, clock, comm=("all-reduce",))
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
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
    def A(key):
        return attributed([r[key] for r in results])

    base, extra, spun, graph = A("base"), A("extra"), A("spin"), A("graph")
    rows = []
    d_busy = extra["busy_us"] - base["busy_us"]
    rows.append(row("launch", "extra small kernels", extra["e2e_us"] - base["e2e_us"] - d_busy,
                    extra["rows"]["launch"] - base["rows"]["launch"],
                    "change of instrumented E2E (events) less the added kernels' busy time (per-kernel clock), "
                    "against the change of the launch row",
                    plain_planted_us=(extra["plain_us"] or 0) - (base["plain_us"] or 0) - d_busy))
    per_spin = results[0]["spin"]["spun_us"]
    n_spins = results[0]["spin"]["spins_per_iteration"]
    rows.append(row("host_bound", "host spin before each launch", n_spins * per_spin,
                    spun["rows"]["host_bound"] - base["rows"]["host_bound"],
                    f"{n_spins} spins of {per_spin:.1f} us (median, as the spin measured itself) per iteration, "
                    "against the change of the host_bound row"))
    more = A("spin_more")
    rows.append(row("launch", "a longer host spin leaves launch unchanged",
                    more["launch_path_us"] - spun["launch_path_us"], more["rows"]["launch"] - spun["rows"]["launch"],
                    f"the launch row with spins of {per_spin:.1f} and {results[0]['spin_more']['spun_us']:.1f} us, "
                    "against the change of the launching calls' own time the device waited through (API records: "
                    "each call's start until its kernel started, and its kernel's end until it returned)",
                    launch_path_us=[spun["launch_path_us"], more["launch_path_us"]],
                    host_bound_change_us=more["rows"]["host_bound"] - spun["rows"]["host_bound"],
                    against_no_spin={"launch_row_change_us": spun["rows"]["launch"] - base["rows"]["launch"],
                                     "launch_path_change_us": spun["launch_path_us"] - base["launch_path_us"]}))
    un, fu = A("unfused"), A("fused")
    rows.append(row("locality", "one extra HBM round trip", un["busy_us"] - fu["busy_us"], un["rows"]["locality"],
                    f"change of kernel busy time (per-kernel clock) against {un['rows']['locality']:.1f} us = "
                    f"{results[0]['unfused']['intermediate_bytes'] / 2**20:.0f} MiB x the time per byte of a device "
                    "copy timed in the same run",
                    bytes=results[0]["unfused"]["intermediate_bytes"]))
    rows.append(graph_row(extra, graph, plain_ladder=(extra["plain_us"] or 0) - (graph["plain_us"] or 0)))
    for key in sorted(k for k in results[0] if k.startswith("late ") and k != "late 0"):
        late = A(key)
        x = results[1][key]["spun_us"] if len(results) > 1 else 0.0
        rows.append(row("sync_wait", f"rank 1 late by {x:.0f} us", x, late["per_rank"][0]["sync_wait"],
                        "rank 1 spins before the collective (as the spin measured itself) against rank 0's sync_wait"))
    return rows


def summary(rows: list[dict]) -> str:
    ok = sum(r["ok"] for r in rows)
    return f"{ok} of {len(rows)} planted taxes recovered within {100 * TOLERANCE:.0f}% (or {TOLERANCE_US:g} us)"
