"""taxes: a profiler and analytical cost model for the three multi-GPU performance taxes."""

__version__ = "0.1.0"


def profile(*args, **kwargs):
    """Profile a workload on this node's GPUs (or emulated): taxes.profiling.profile, which documents the
    arguments. Returns a Result: the result document and pandas DataFrames of it."""
    from taxes.profiling import profile as _profile

    return _profile(*args, **kwargs)


def step() -> None:
    """Mark the end of one step of a program run by `taxes trace` (nothing otherwise): for programs whose
    steps are not optimizer.step() calls, e.g. an inference loop."""
    from taxes.trace_hook import step as _step

    _step()
