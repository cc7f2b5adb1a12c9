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
