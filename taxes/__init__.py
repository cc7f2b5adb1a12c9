"""taxes: a profiler and analytical cost model for the three multi-GPU performance taxes.

taxes.profile(workload, shape, gpus=...): profile a workload on this node's GPUs (or emulated), returning
the result document and pandas frames of it (taxes.profiling.profile documents the arguments).
taxes.step(): mark the end of one step of a program run by `taxes trace` (nothing otherwise), for programs
whose steps are not optimizer.step() calls, e.g. an inference loop."""

__version__ = "0.1.0"

from taxes.profiling import profile  # noqa: E402
from taxes.trace_hook import step  # noqa: E402

__all__ = ["__version__", "profile", "step"]
