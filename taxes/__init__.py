"""taxes: a profiler and analytical cost model for the three multi-GPU performance taxes.

taxes.profile(workload, shape, gpus=...): profile a workload on this node's GPUs (or emulated), returning
the result document and pandas frames of it (taxes.run.profile.profile documents the arguments).
taxes.step(): mark the end of one step of a program run by `taxes trace` (nothing otherwise), for programs
whose steps are not optimizer.step() calls, e.g. an inference loop."""

from taxes.documents.provenance import VERSION as __version__


def profile(*args, **kwargs):
    """taxes.run.profile.profile: imported on first call, so that `import taxes` (in every program run by
    `taxes trace`) loads no torch."""
    from taxes.run.profile import profile as run

    return run(*args, **kwargs)


from taxes.run.trace_hook import step  # noqa: E402

__all__ = ["__version__", "profile", "step"]
