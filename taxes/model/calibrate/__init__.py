"""`taxes calibrate`: measure this machine's hardware figures and save them as a hardware profile.

What it measures (plan), on the devices (measurements, with the probes of kernels/probes.py), in one run
on every GPU (run); what it derives from the readings (fits, derive); the profile it assembles from the
figures and saves (assemble); what the command shows (present). Only the measuring needs GPUs; everything
after it is plain functions of the readings, tested on CPU with synthetic ones.
"""

from taxes.model.calibrate.assemble import (
    assemble_profile,
    base_for_gpu,
    check_profile_name,
    gpu_summary,
    read_progress,
    run_metadata,
    save_profile,
)
from taxes.model.calibrate.derive import derive_figures
from taxes.model.calibrate.fits import CalibrationError
from taxes.model.calibrate.plan import FIGURES, FULL, QUICK, Plan
from taxes.model.calibrate.present import calibration_origin, failure_lines, origin_line, summary_rows

_ON_GPUS = ("NO_GPU", "calibrate", "calibrate_job", "cuda_gpu_count", "cuda_gpu_names", "run_calibration")


def __getattr__(name: str):
    """The measuring run (taxes.model.calibrate.run) imports torch: only when it is asked for, so that reading a
    profile's calibration (`taxes hardware list`) stays quick."""
    if name in _ON_GPUS:
        from taxes.model.calibrate import run

        return getattr(run, name)
    raise AttributeError(f"module 'taxes.model.calibrate' has no attribute {name!r}")

__all__ = ["CalibrationError", "FIGURES", "FULL", "NO_GPU", "Plan", "QUICK", "assemble_profile", "base_for_gpu",
           "calibrate", "calibrate_job", "calibration_origin", "check_profile_name", "cuda_gpu_count", "cuda_gpu_names",
           "derive_figures", "failure_lines", "gpu_summary", "origin_line", "read_progress", "run_calibration",
           "run_metadata", "save_profile", "summary_rows"]
