"""Timing on the device: a variant's barrier-aligned iterations, and back-to-back calls with the host ahead.

An iteration (docs/method.md): all ranks meet at a barrier (device synchronised first; the ranks' start
gate, RankContext.start_barrier, lets them go within about a microsecond), then each
records a start event on its stream, runs the variant, records an end event. A rank's sample is
end - start; the iteration's E2E is the slowest rank's sample (taken when the document is built).
Inputs rotate over several sets so a small problem is not served from L2.

Back-to-back calls (`device_batch_us`, `device_calls_us`; what `taxes calibrate` measures with): a sleep
kernel first holds the device while the host queues every call, so the device time read between events
holds no launch cost.
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


class AlignedStart:
    """An iteration start the ranks' devices share: after the host barrier, each rank queues a spin kernel of
    lead_us (during which its host queues everything that follows) and a one-element all-reduce; the devices
    leave the all-reduce within about a microsecond of each other, whatever the barrier's exit skew (tens of
    us, at times a millisecond, on the H100 machines), and the iteration's start event comes after it. On
    emulated ranks the host barrier stands in (the host is the device)."""

    def __init__(self, ctx, lead_us: float = 500.0):
        self.ctx, self.lead_us = ctx, lead_us
        self.token = torch.zeros(1, device=ctx.device)
        self.cycles = sleep_cycles_per_us(ctx.device) if ctx.device.type == "cuda" else None

    def __call__(self) -> None:
        if self.ctx.device.type == "cuda":
            import torch.distributed as dist

            torch.cuda._sleep(max(1, int(self.lead_us * self.cycles)))
            dist.all_reduce(self.token)
        else:
            self.ctx.barrier()


def time_iterations(ctx, run, input_sets: list, iters: int, warmup: int, label: str = "",
                    align=None) -> list[float]:
    """Run `run(*input_sets[i % n])` warmup + iters times; return this rank's iteration times in us.
    align: an AlignedStart, run after the barrier and before the start event (None: the barrier alone)."""
    on_gpu = ctx.device.type == "cuda"
    samples = []
    if on_gpu:  # created (and their CUDA events made, by a first record) outside the timed region
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        end.synchronize()
    for i in range(warmup + iters):
        args = input_sets[i % len(input_sets)]
        ctx.start_barrier()
        if align is not None:
            align()
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


def sleep_cycles_per_us(device) -> float:
    """torch.cuda._sleep spins a number of clock cycles; measure how many make a microsecond here."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end) * 1e3, 1.0)


def device_batch_us(fn, calls: int, cycles_per_us: float, spin_us: float | None = None) -> tuple[float, bool]:
    """Device time per call of `calls` back-to-back fn() with the host ahead: a sleep kernel first holds
    the device while the host queues every call, so no launch cost is inside the timed window.
    Returns (us per call, whether the host really finished queueing before the sleep ended)."""
    spin_us = spin_us or 1000 + 60 * calls
    torch.cuda._sleep(int(spin_us * cycles_per_us))
    slept = torch.cuda.Event()
    slept.record()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    ahead = not slept.query()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls, ahead


def device_calls_us(fn, calls: int, cycles_per_us: float) -> tuple[list[float], bool]:
    """Device time of each of `calls` back-to-back fn() (events between them), host ahead as above."""
    torch.cuda._sleep(int((1000 + 200 * calls) * cycles_per_us))
    slept = torch.cuda.Event()
    slept.record()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    ev[0].record()
    for i in range(calls):
        fn()
        ev[i + 1].record()
    ahead = not slept.query()
    ev[-1].synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(calls)], ahead


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
