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
              (taxes.run.harness.AlignedStart): on its device (a spin kernel) or its host (the device waits at
              a gate its host opens after a spin: taxes.run.host_gate), by 20, 100 and 500 us, against the
              same run without the delay (the gate opened at once), interleaved in rounds.
              planted = each waiting rank's change of plain E2E (events, no per-kernel clock); recovered =
              its change of `sync_wait`; instrumented_planted_us = the change of E2E in the instrumented
              iterations (rule_ok: the rows against it).
Single-rank cases at world > 1 are checked on every rank against that rank's own truth; a row shows the rank
that missed by the most and holds every rank's values.
Rows: {"tax", "case", "planted_us", "recovered_us", "error_pct", "ok", "method", ...}; ok within 10% or
2 us, whichever is larger.

Here: the planted cases and how each rank runs them; taxes.run.planted_measure times one runner,
taxes.run.planted_answers makes the rows from every rank's measurements, taxes.run.planted_records reads
them back from stored records.
"""

from __future__ import annotations

import statistics

from taxes.method import round_sizes
from taxes.run.host_gate import spin_us
from taxes.run.planted_measure import Replayed, measure


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
    per-kernel clock reads; `host`, its device waits at a gate (taxes.run.host_gate) that its host, once
    everything after the gate is queued, opens after a spin of x_us: the device waits exactly as long as a
    drained device waits for a late host, without the noise of the launching call's own host path. The run
    without a delay keeps everything else (x_us = 0: the gate stays, opened at once). On emulated ranks (the
    host is the device) either delay is a spin on the host where the gate would be."""

    def __init__(self, ctx, runner, how: str, x_us: float, late: int = 1, cycles_per_us: float | None = None):
        if how not in DELAYS:
            raise ValueError(f"delay {how!r}: choose from {', '.join(DELAYS)}")
        self.ctx, self.runner, self.how, self.x, self.late = ctx, runner, how, float(x_us), late
        self.cycles_per_us = cycles_per_us
        self.spun: list = []
        self.gate = None
        if how == "host" and ctx.device.type == "cuda" and ctx.rank == late:
            from taxes.run.host_gate import HostGate

            self.gate = HostGate()

    def _device_spin(self):
        if self.ctx.device.type == "cuda":
            import torch

            torch.cuda._sleep(max(1, int(self.x * self.cycles_per_us)))
        else:
            self.spun.append(spin_us(self.x))

    def _host_spin(self):
        self.spun.append(spin_us(self.x))

    def _open_gate(self):
        self.spun.append(self.gate.open_after(self.x))

    def phases(self, *inputs, traced: bool = False):
        steps = list(self.runner.phases(*inputs, traced=traced))
        if self.ctx.rank != self.late:
            return steps
        at = next((i for i, s in enumerate(steps) if s[1] == "communication"), 0)
        if self.how == "device":
            delay = [("delay", "compute", self._device_spin)] if self.x else []
        elif self.gate is None:  # emulated ranks: the host is the device
            delay = [("delay", "host", self._host_spin)] if self.x else []
        else:  # the gate queued where the delay goes, opened once everything after it is queued
            return steps[:at] + [("gate", "host", self.gate.close)] + steps[at:] + \
                [("delay", "host-after", self._open_gate)]
        return steps[:at] + delay + steps[at:]

    def __call__(self, *inputs):
        for _, _, f in self.phases(*inputs):
            f()

    def __getattr__(self, name):  # the wrapped runner's trace of its last call (fused kernels' waits), its checks
        if name == "runner":
            raise AttributeError(name)
        return getattr(self.runner, name)



# ---- the cases ------------------------------------------------------------------------------------


def rank_cases(ctx, opts: dict) -> dict:
    """Everything one rank measures for --planted (run under kernels.runtime.launch)."""
    import torch

    from taxes.run.harness import warm_clocks

    warm_clocks(ctx, opts.get("warm_s", 2.0))  # as taxes profile does: the first case not timed on idle clocks
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
    for r, n_iters in enumerate(round_sizes(iters, rounds)):
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
        for r, n in enumerate(round_sizes(iters, rounds)):
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
