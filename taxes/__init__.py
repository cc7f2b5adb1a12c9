"""taxes: a profiler and analytical cost model for the three multi-GPU performance taxes.

The facade, one function per question (each imports its stage on first call, so that `import taxes`, which
every program run by `taxes trace` does, loads no torch):

taxes.profile(workload, shape, gpus=...): profile a workload on this node's GPUs (or emulated), returning
    the result document and pandas frames of it (taxes.run.profile.profile documents the arguments).
taxes.analyze(paths, hardware=None, ...): the taxes of any PyTorch program from its torch.profiler traces, one
    per rank (taxes.attribution.analyze.analyze; taxes.documents.analysis_document turns it into a document).
taxes.predict(workload, shape=None, gpus=2, hardware="h200-sxm"): the model's prediction of every variant
    (taxes.model.predict.predict_all), without measuring anything.
taxes.step(): mark the end of one step of a program run by `taxes trace` (nothing otherwise), for programs
    whose steps are not optimizer.step() calls, e.g. an inference loop.

The stages below the facade, in the order the data flows: taxes.traces (timelines), taxes.run (our variants
measured), taxes.attribution, taxes.model, taxes.documents, taxes.reports.
"""

from taxes.provenance import VERSION as __version__


def profile(*args, **kwargs):
    """taxes.run.profile.profile (its docstring gives the arguments)."""
    from taxes.run.profile import profile as run

    return run(*args, **kwargs)


def analyze(paths, hardware: str | None = None, **kwargs):
    """taxes.attribution.analyze.analyze: every step of every rank of the traces at `paths` attributed."""
    from taxes.attribution.analyze import analyze as run

    return run(list(paths), hardware, **kwargs)


def predict(workload: str, shape: dict | str | None = None, gpus: int = 2, hardware: str = "h200-sxm",
            dtype: str = "bf16", variants=None):
    """Every variant's predicted iteration (taxes.model.predict.Prediction) for a workload at a shape
    ({'M': 8192} or 'M=8192,N=8192'), on `gpus` ranks of a hardware profile (a name or a .json path)."""
    from taxes.model.hardware import get_profile
    from taxes.model.predict import predict_all
    from taxes.workloads import make_workload, parse_shape

    dims = parse_shape(shape) if isinstance(shape, str) else dict(shape or {})
    return predict_all(make_workload(workload, dims, gpus, dtype), get_profile(hardware), variants)


from taxes.run.trace_hook import step  # noqa: E402

__all__ = ["__version__", "analyze", "predict", "profile", "step"]
