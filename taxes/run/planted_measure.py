"""Measuring one runner of the known answers (taxes.run.planted): its plain and instrumented iterations, a
graph replay of its launching steps."""

from __future__ import annotations

from taxes.run.harness import time_iterations
from taxes.run.instrument import capture_graph, host_work, launching, make_recorder, record_iterations


class Replayed:
    """A runner's launching steps captured in one CUDA graph per input set: calling it runs the runner's
    host steps (a planted spin, a gate's closing), replays the graph, then runs its host steps that wait
    for everything to be queued (a gate's opening)."""

    def __init__(self, runner, input_sets: list):
        self.runner = runner
        self.graphs = {id(inputs[0]) if inputs else k: capture_graph(launching(runner.phases(*inputs)))
                       for k, inputs in enumerate(input_sets)}

    def phases(self, *inputs, traced: bool = False):
        return self.runner.phases(*inputs, traced=traced)

    def __call__(self, *inputs):
        steps = self.runner.phases(*inputs)
        for f in host_work(steps, "host"):
            f()
        self.graphs[id(inputs[0]) if inputs else 0].replay()
        for f in host_work(steps, "host-after"):
            f()


def measure(ctx, runner, iters: int, warmup: int, clock: str, graph: bool = False, locality_bytes: float = 0.0,
            us_per_byte: float | None = None, comm: tuple = (), input_sets: list | None = None,
            fused: bool = False, align=None, plain_runner=None, instrumented_first: bool = False) -> dict:
    """Plain and instrumented timing of one runner; every rank returns its own records, combined by
    `attributed`. Launch calls are recorded in every iteration: a known answer wants the exact launch path,
    whatever it costs. fused: the instrumented iterations run the traced build and read its CTAs' waits.
    align: the iterations' start (taxes.run.harness.AlignedStart; None: the host barrier alone). plain_runner:
    what the plain iterations call (default: the runner, or its graph when graph)."""
    inputs = input_sets or [()]
    on_gpu = ctx.device.type == "cuda"
    if plain_runner is None:
        plain_runner = Replayed(runner, inputs) if graph and on_gpu else runner
    trace_of = ctas_of = None
    if fused:
        from taxes.run.cases import cta_stamps as ctas_of
        from taxes.run.measure import critical_waits as trace_of
    out = {}

    def plain():
        out["plain"] = time_iterations(ctx, plain_runner, inputs, iters, warmup, align=align)

    def instrumented():
        out["raw"] = record_iterations(ctx, runner, inputs, iters, warmup, make_recorder(clock, on_gpu, api="all"),
                                       graph=graph, fused=fused, trace_of=trace_of, align=align, ctas_of=ctas_of)

    for block in ((instrumented, plain) if instrumented_first else (plain, instrumented)):
        block()
    return {"plain": out["plain"], "raw": out["raw"], "comm": comm, "locality_bytes": locality_bytes,
            "us_per_byte": us_per_byte}
