"""Timing one variant on every rank: barrier-aligned iterations timed with device events.

An iteration (docs/method.md): all ranks meet at a barrier (device synchronised first), then each
records a start event on its stream, runs the variant, records an end event. A rank's sample is
end - start; the iteration's E2E is the slowest rank's sample (taken when the document is built).
Inputs rotate over several sets so a small problem is not served from L2.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import time

import torch


@contextlib.contextmanager
def nvtx(name: str, on_gpu: bool):
    """An NVTX range (Nsight Systems shows it); nothing without a GPU."""
    if on_gpu:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if on_gpu:
            torch.cuda.nvtx.range_pop()


def time_iterations(ctx, run, input_sets: list, iters: int, warmup: int, label: str = "") -> list[float]:
    """Run `run(*input_sets[i % n])` warmup + iters times; return this rank's iteration times in us."""
    on_gpu = ctx.device.type == "cuda"
    samples = []
    if on_gpu:  # created (and their CUDA events made, by a first record) outside the timed region
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        end.synchronize()
    for i in range(warmup + iters):
        args = input_sets[i % len(input_sets)]
        ctx.barrier()
        with nvtx(f"{label} iter {i}", on_gpu):
            if on_gpu:
                start.record()
                run(*args)
                end.record()
                end.synchronize()
                us = start.elapsed_time(end) * 1e3
            else:
                t0 = time.perf_counter()
                run(*args)
                us = (time.perf_counter() - t0) * 1e6
        if i >= warmup:
            samples.append(us)
    return samples


class _HostClock:
    """Stand-in for CUDA events without a GPU (emulated ranks: timings mean nothing there)."""

    def __init__(self):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_us(self, other) -> float:
        return (other.t - self.t) * 1e6


class _DeviceClock:
    def __init__(self, external: bool = False):
        self.ev = torch.cuda.Event(enable_timing=True, external=external)

    def record(self):
        self.ev.record()

    def elapsed_us(self, other) -> float:
        return self.ev.elapsed_time(other.ev) * 1e3


def _capture_with_events(steps: list) -> tuple:
    """One CUDA graph of the steps with a timing event node before and after each (external events are
    recorded by the replay itself). The steps run once eagerly first (a real call, on every rank)."""
    for _, _, thunk in steps:
        thunk()
    torch.cuda.synchronize()
    marks = [(_DeviceClock(external=True), _DeviceClock(external=True)) for _ in steps]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for (_, _, thunk), (a, b) in zip(steps, marks):
            a.record()
            thunk()
            b.record()
    return g, steps, marks


def _annotate(name: str, on: bool):
    if not on:
        return contextlib.nullcontext()
    from torch.profiler import record_function

    return record_function(name)


def time_phases(ctx, phases_of, input_sets: list, iters: int, warmup: int, label: str = "",
                after=None, graph: bool = False, annotate: bool = False) -> list[dict]:
    """Per-phase timing: device events at the boundaries of every phase of each iteration.

    graph: the phases are captured (with their events) in one CUDA graph per input set and replayed.
    annotate: each phase also runs inside a torch.profiler record_function "taxes:LABEL:PHASE:ITER", so a
    profiler trace of the same iterations can be matched phase by phase (taxes.profiling.profiler_check).

    phases_of(*inputs) -> [(name, role, thunk)]; running the thunks in order is one call of the variant.
    Returns this rank's iterations: {"e2e_us", "phases": [{"name", "role", "start_us", "end_us"}]} with
    times from the iteration's start event; after(record) may add to each record (e.g. a kernel trace).
    Eager phases on a GPU get one event each, after the phase (a phase starts at the event before it: the
    iteration's start or the previous phase's end; every event record is host time between launches,
    which is what instrumenting costs where the host is the bottleneck), and issued_us: the host clock
    when the phase's call returned, from just after the start event's record (the device was idle then,
    after the barrier, so both clocks start together up to the submission latency, which the phases' own
    launches share). The device cannot have run the phase's last launch before it: the part of the phase
    before it, the device waiting on the host, is taxes.attribution.host_bound_us. Graphs keep an event
    node before and after each phase, so a graph's own gaps between kernels stay visible; emulated
    ranks too (their host clock is the phase clock)."""
    on_gpu = ctx.device.type == "cuda"
    clock = _DeviceClock if on_gpu else _HostClock
    graphs: dict[int, tuple] = {}
    records = []
    pool: list = []  # events reused across iterations (each iteration synchronises before the next)

    def fresh(n: int) -> list:
        while len(pool) < n:
            c = clock()
            c.record()  # the CUDA event is created on its first record: do that outside any timed region
            pool.append(c)
        return pool[:n]

    for i in range(warmup + iters):
        k = i % len(input_sets)
        if graph and on_gpu:
            if k not in graphs:
                graphs[k] = _capture_with_events(phases_of(*input_sets[k]))
            g, steps, marks = graphs[k]
            start, end = fresh(2)
        elif on_gpu:  # eager: one event after each phase; a phase starts where the one before it ended
            steps = phases_of(*input_sets[k])
            evs = fresh(1 + len(steps))
            start, end = evs[0], evs[-1]
            marks = list(zip(evs[:-1], evs[1:]))
        else:
            steps = phases_of(*input_sets[k])
            evs = fresh(2 + 2 * len(steps))
            start, end = evs[0], evs[1]
            marks = [(evs[2 + 2 * j], evs[3 + 2 * j]) for j in range(len(steps))]
        if on_gpu:
            torch.cuda.synchronize()
        ctx.barrier()
        issued = []  # eager on a GPU: the host clock when each phase's call returned
        shared = on_gpu and not graph  # phases share their boundary events
        with nvtx(f"{label} iter {i}", on_gpu):
            start.record()
            h0 = time.perf_counter()
            if graph and on_gpu:
                g.replay()
            else:
                for (name, _, thunk), (a, b) in zip(steps, marks):
                    with nvtx(name, on_gpu), _annotate(f"taxes:{label}:{name}:{i}", annotate):
                        if not shared:
                            a.record()
                        thunk()
                        if shared:
                            issued.append((time.perf_counter() - h0) * 1e6)
                        b.record()
            if not shared:
                end.record()
        if on_gpu:
            end.ev.synchronize()
        rec = {"e2e_us": start.elapsed_us(end),
               "phases": [{"name": name, "role": role, "start_us": start.elapsed_us(a), "end_us": start.elapsed_us(b)}
                          for (name, role, _), (a, b) in zip(steps, marks)]}
        for ph, t in zip(rec["phases"], issued):  # none on emulated ranks: their host clock is the phase clock
            ph["issued_us"] = t
        if after is not None:
            after(rec)
        if i >= warmup:
            records.append(rec)
    return records


def warm_clocks(ctx, seconds: float) -> None:
    """Large matmuls for a while, so the first case is not timed on idle clocks (GPU only)."""
    if ctx.device.type != "cuda" or seconds <= 0:
        return
    a = torch.randn(8192, 8192, device=ctx.device, dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
    del a


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def gpu_metadata() -> dict:
    """GPU names, driver and clocks as nvidia-smi reports them now (empty without a GPU)."""
    meta: dict = {"gpu_names": [], "clocks": []}
    if not torch.cuda.is_available():
        return meta
    meta["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        for line in out.stdout.strip().splitlines():
            name, driver, sm, mem, max_sm, power, temp = (s.strip() for s in line.split(","))
            meta["clocks"].append({"name": name, "driver": driver, "sm_clock": sm, "mem_clock": mem,
                                   "max_sm_clock": max_sm, "power": power, "temperature_c": temp})
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    meta["cuda_version"] = torch.version.cuda
    try:
        meta["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        pass
    return meta


def agree(ctx, res: dict, step) -> None:
    """Run step() unless res["error"] is set; afterwards every rank knows whether any rank failed
    (res["error"]: this rank's one line, or "failed on another rank"), so no rank enters a collective
    the others skipped."""
    failed = 0.0
    if res["error"] is None:
        try:
            step()
        except Exception as e:
            res["error"] = f"rank {ctx.rank}: {type(e).__name__}: {e}".splitlines()[0][:300]
            failed = 1.0
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
    if ctx.all_max([failed])[0] and res["error"] is None:
        res["error"] = "failed on another rank"


def check_and_time(ctx, build, check, input_sets: list, iters: int, warmup: int) -> dict:
    """Build a variant, check it once, time it; every rank ends with the same verdict.

    build() -> run; check(run) -> relative error of one run on poisoned output; then `iters` timed
    iterations over input_sets. After each phase the ranks agree (all_max) whether any failed, so no
    rank enters a collective the others skipped. Returns samples (this rank), rel_error and median
    (maxima over ranks), error (None, or one line)."""
    res = {"samples": [], "rel_error": None, "median": float("inf"), "error": None, "run": None}

    def phase(step):
        agree(ctx, res, step)

    def build_and_check():
        res["run"] = build()
        res["rel_error"] = max(check(res["run"]), 0.0)

    def timing():
        run = res["run"]
        samples = time_iterations(ctx, run, input_sets, iters=iters, warmup=warmup)
        if hasattr(run, "check"):
            run.check()
        res.update(samples=samples, median=sorted(samples)[len(samples) // 2])

    phase(build_and_check)
    phase(timing)
    if res["error"] is None:
        res["rel_error"], res["median"] = ctx.all_max([res["rel_error"], res["median"]])
    return res
