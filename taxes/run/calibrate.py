"""One calibration run: every figure measured on every rank (one process per GPU), the readings gathered
on rank 0 and assembled into the profile.

A figure that fails on a rank is recorded as one line and the others still run; each rank saves its
readings after every figure, so a run that dies part-way (a rank fails or overruns its time) still gives
a profile from what was measured, with raw["run_error"] saying why it stopped.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from taxes.model.calibrate.assemble import assemble_profile, json_clean, read_progress, run_metadata
from taxes.run.calibration_measurements import (
    device_info,
    error_line,
    measure_combine,
    measure_copiers,
    measure_hbm,
    measure_launch,
    measure_matmul,
    measure_nccl,
    measure_peer,
    measure_pingpong,
    measure_skew,
    measure_triton_gemm,
)
from taxes.model.calibrate.plan import FIGURES, FULL, PAIR_FIGURES, QUICK, heap_bytes_for
from taxes.errors import TaxesError
from taxes.model.hardware import HardwareProfile
from taxes.run.harness import gpu_metadata, sleep_cycles_per_us
from taxes.kernels import runtime
from taxes.kernels.rank import RankError
from taxes.files import write_atomic

NO_GPU = ("calibrate needs CUDA GPUs and this machine has none; `taxes hardware list` shows the built-in "
          "and saved profiles that `taxes model` can use instead")


def _save_progress(progress_dir, rank: int, readings: dict) -> None:
    if progress_dir:
        try:
            write_atomic(Path(progress_dir) / f"rank{rank}.json", json.dumps(json_clean(readings), allow_nan=False))
        except (OSError, ValueError):
            pass


def measure(ctx, quick: bool = False, progress_dir: str | None = None, figures=FIGURES) -> dict:
    """Every figure on this rank (all ranks call it together); a figure that fails is recorded as one
    line and the others still run. Readings are saved to progress_dir/rankR.json after each figure."""
    plan = QUICK if quick else FULL
    readings = {"rank": ctx.rank, "world": ctx.world, "quick": quick, "device": device_info(ctx.device),
                "figures": {}, "errors": {}}
    cycles = sleep_cycles_per_us(ctx.device)
    readings["sleep_cycles_per_us"] = cycles
    steps = {"launch": measure_launch, "hbm": measure_hbm, "matmul": measure_matmul, "nccl": measure_nccl,
             "peer": measure_peer, "pingpong": measure_pingpong, "skew": measure_skew, "triton_gemm": measure_triton_gemm,
             "combine": measure_combine, "copiers": measure_copiers}
    for name in figures:
        if name in PAIR_FIGURES and ctx.world < 2:
            continue
        ctx.doing(f"calibrating {name}")
        t0 = time.perf_counter()
        failed = 0.0
        try:
            readings["figures"][name] = steps[name](ctx, plan, cycles)
        except Exception as e:
            readings["errors"][name] = error_line(e)
            failed = 1.0
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
        readings.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 3)
        _save_progress(progress_dir, ctx.rank, readings)  # before the next collective, which a dead GPU fails
        if ctx.world > 1 and ctx.all_max([failed])[0] and not failed:
            readings["errors"].setdefault(name, "failed on another rank")
            _save_progress(progress_dir, ctx.rank, readings)
        torch.cuda.empty_cache()
    return readings


def gather_readings(ctx, readings: dict) -> list[dict]:
    if ctx.world == 1:
        return [readings]
    out = [None] * ctx.world
    dist.all_gather_object(out, readings)
    return out


def calibrate(ctx, base_profile: HardwareProfile, quick: bool = False, *, name: str | None = None,
              peaks: str = "measured", progress_dir: str | None = None) -> tuple[HardwareProfile, dict]:
    """Measure every figure on all ranks (every rank calls this) and build the profile from them."""
    readings = gather_readings(ctx, measure(ctx, quick, progress_dir))
    meta = run_metadata(quick, [r["device"]["name"] for r in readings], base_profile.name)
    if ctx.rank == 0:  # clocks, power and temperature right after the measuring (nvidia-smi)
        meta["clocks"] = gpu_metadata().get("clocks", [])
    return assemble_profile(readings, base_profile, meta, name=name or f"{base_profile.name}-calibrated", peaks=peaks)


def calibrate_job(ctx, base_profile, quick, name, peaks, progress_dir):
    """The per-rank entry point for runtime.launch: rank 0 returns (profile, raw)."""
    result = calibrate(ctx, base_profile, quick, name=name, peaks=peaks, progress_dir=progress_dir)
    return result if ctx.rank == 0 else None


def cuda_gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cuda_gpu_names(count: int) -> list[str]:
    return [torch.cuda.get_device_name(i) for i in range(count)]


def run_calibration(world: int, base: HardwareProfile, quick: bool, name: str, peaks: str = "measured",
                    timeout_s: float = 300.0, job=calibrate_job) -> tuple[HardwareProfile, dict]:
    """Calibrate on `world` GPUs, one process each. If the run dies part-way (a rank fails or overruns
    timeout_s), the profile is built from the readings saved so far and raw["run_error"] says why."""
    if world < 1 or world > cuda_gpu_count():
        raise TaxesError(f"calibrate on {world} GPUs: this machine has {cuda_gpu_count()}")
    tmp = tempfile.mkdtemp(prefix="taxes-calibrate-")
    try:
        try:
            results = runtime.launch(job, world, base, quick, name, peaks, tmp, backend="cuda",
                             heap_bytes=heap_bytes_for(world, quick), timeout_s=timeout_s)
            return results[0]
        except RankError as e:
            readings = read_progress(tmp, world)
            if not any(r.get("figures") for r in readings):
                raise TaxesError(f"calibration failed before any figure was measured: {e}") from None
            gpus = [r["device"]["name"] for r in readings if r.get("device")]
            return assemble_profile(readings, base, run_metadata(quick, gpus, base.name), name=name, peaks=peaks,
                                    run_error=str(e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
