"""`taxes calibrate`: measure this machine's hardware figures and save them as a hardware profile.

What it measures (plan; the measuring itself, on the devices, is taxes.run.calibrate and
taxes.run.calibration_measurements, with the probes of kernels/probes.py); what it derives from the readings (fits, derive); the profile it assembles from the
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

__all__ = ["CalibrationError", "FIGURES", "FULL", "Plan", "QUICK", "assemble_profile", "base_for_gpu",
           "calibration_origin", "check_profile_name", "derive_figures", "failure_lines", "gpu_summary", "origin_line",
           "read_progress", "run_metadata", "save_profile", "summary_rows"]
