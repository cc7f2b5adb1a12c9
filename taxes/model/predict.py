"""The analytical cost model: every variant's E2E and its three taxes, from shapes and hardware figures.

The model predicts one iteration on one rank as a sequence of steps (kernels and collectives) on that
rank's stream. Each step's duration is the sum of labelled parts, the same rows the attribution measures
(taxes.attribution.attribute): ideal, start skew, sync wait, exposed transfer, locality, inefficiency and the signed
remainder the attribution calls unattributed. A simulation of the host's launch queue places the steps in
time and turns the device's idle gaps into the launch tax. The components therefore add up to the
predicted E2E by construction, and the predicted timeline has the same form as a measured one. Every
figure comes from the hardware profile, and where `taxes calibrate` measured the mechanism behind a term
(its readings in the profile's extra), from that measurement. docs/model.md gives every formula, where its
figures come from, and how far it is from measurement.

Each workload's steps are built in taxes/model/steps.py, from the figures taxes/model/figures.py reads out
of the profile; this module places them in time, adds them up and checks the sum.

Every prediction passes the consistency checks (`check`) before it is returned; a violation raises
ModelInconsistency, never a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from taxes.errors import TaxesError
from taxes.model.figures import eager_gap_us, first_launch_us, replay_launch_us
from taxes.model.floor import Floor, floor_of
from taxes.model.hardware import HardwareProfile
from taxes.model.steps import STEPS as _STEPS
from taxes.model.steps import ModelOptions, Step
from taxes.method import TAXES
from taxes.variants import model_names, modelled
from taxes.workloads import Workload, replace_dim

# The additive components of E2E, in report order. They add up to E2E; start_skew (the ranks' spread at
# the start of an iteration, a property of how iterations start, not of the program) and unattributed (the
# signed difference between the kernels' own floors and the floor plus locality) are in no tax.
COMPONENTS = ("ideal", "start_skew", "sync_wait", "exposed_transfer", "locality", "launch", "inefficiency",
              "unattributed")
COMMUNICATION = ("start_skew", "sync_wait", "exposed_transfer")  # parts that only a peer can cause
COMPONENT_TITLES = {
    "ideal": "ideal (floor)",
    "start_skew": "ranks' start skew (the harness's barrier)",
    "sync_wait": "bulk-sync: sync wait",
    "exposed_transfer": "bulk-sync: exposed transfer",
    "locality": "data-locality tax",
    "launch": "kernel-launch tax",
    "inefficiency": "kernel inefficiency",
    "unattributed": "unattributed",
}
TOLERANCE_US = 1e-6  # rounding the checks allow, us (and the same share of E2E)


class ModelInconsistency(TaxesError):
    """A prediction broke one of the model's consistency checks (one line naming the check)."""


@dataclass
class Phase:
    """A step placed on the rank's timeline (us from the iteration's start)."""

    name: str
    role: str
    start_us: float
    end_us: float
    parts: dict[str, float] = field(default_factory=dict)


@dataclass
class Prediction:
    workload: Workload
    variant: str
    hardware: str
    e2e_us: float
    components: dict[str, float]
    floor: Floor
    exposed_communication_us: float
    phases: list[Phase]

    def taxes_us(self) -> dict[str, float]:
        return {tax: math.fsum(self.components[c] for c in parts) for tax, parts in TAXES.items()}


# ---- the launch queue ----------------------------------------------------------------------------


def schedule(steps: list[Step], graphed: bool, hw: HardwareProfile) -> tuple[list[Phase], float]:
    """Place steps on the device timeline; return the phases and the total idle (launch tax).

    Eager: the host issues launch i when launch i-1's call has returned, each call costing its launcher's
    host time (hw.launch_us(step.launcher): a torch op, a Triton kernel, a Triton kernel that builds TMA
    descriptors, an NCCL collective, as calibrate measures them back to back); the call's work reaches an
    idle device first_launch_us - launch_us after the call returns (calibrate's idle launch; 0 unmeasured).
    The device starts a step when its launch has arrived and eager_gap_us after the previous step ended, so
    a launch issued while the previous kernel runs costs nothing. CUDA graph: the replay reaches the idle
    device at replay_launch_us, then each kernel follows the previous one after launch_graph_us."""
    phases, t, idle, host = [], 0.0, 0.0, 0.0
    gap = hw.launch_graph_us if graphed else eager_gap_us(hw)
    for i, step in enumerate(steps):
        if graphed:
            ready = replay_launch_us(hw, step.launcher) if i == 0 else 0.0
        else:
            host += hw.launch_us(step.launcher)
            ready = host + first_launch_us(hw, step.launcher) - hw.launch_us(step.launcher)
        start = max(t + gap if i else 0.0, ready)
        idle += start - t
        t = start + step.duration_us
        phases.append(Phase(step.name, step.role, start, t, dict(step.parts)))
    return phases, idle


# ---- consistency checks ----------------------------------------------------------------------------


def _fail(pred: Prediction, what: str) -> ModelInconsistency:
    return ModelInconsistency(f"model: {what} ({pred.workload.name} {pred.variant}, world {pred.workload.world}, "
                              f"hardware {pred.hardware})")


def check(pred: Prediction, eager_launch_us: float | None = None) -> None:
    """The checks no prediction may fail; the first one failed raises ModelInconsistency:
    - every tax >= 0 (and ideal, start skew, inefficiency: only unattributed has a sign);
    - the floor <= the prediction;
    - one rank: no communication (no start skew, sync wait, exposed transfer, link time);
    - a CUDA graph pays no more launch tax than the same steps launched eagerly (eager_launch_us)."""
    tol = TOLERANCE_US + 1e-9 * abs(pred.e2e_us)
    comp = pred.components
    for c in COMPONENTS:
        if not math.isfinite(comp[c]):
            raise _fail(pred, f"{c} is not a finite number ({comp[c]})")
    for tax, parts in TAXES.items():
        for c in parts:
            if comp[c] < -tol:
                raise _fail(pred, f"the {tax} tax's {c} is negative ({comp[c]:.6g} us)")
    for c in ("ideal", "start_skew", "inefficiency"):
        if comp[c] < -tol:
            raise _fail(pred, f"{c} is negative ({comp[c]:.6g} us)")
    if pred.floor.ideal_us > pred.e2e_us + tol:
        raise _fail(pred, f"the floor {pred.floor.ideal_us:.6g} us exceeds the prediction {pred.e2e_us:.6g} us")
    if pred.workload.world == 1:
        talk = {c: comp[c] for c in COMMUNICATION if comp[c] > tol}
        talk |= {f"{ph.name} {c}": ph.parts[c] for ph in pred.phases for c in COMMUNICATION if ph.parts.get(c, 0.0) > tol}
        if pred.floor.link_us > tol or pred.floor.unhideable_link_us > tol:
            talk["link time"] = pred.floor.link_us
        if pred.exposed_communication_us > tol:
            talk["exposed communication"] = pred.exposed_communication_us
        if talk:
            name, value = next(iter(talk.items()))
            raise _fail(pred, f"communication with no peer: {name} {value:.6g} us at world 1")
    if eager_launch_us is not None and comp["launch"] > eager_launch_us + tol:
        raise _fail(pred, f"the CUDA graph pays {comp['launch']:.6g} us of launch tax, more than the same steps "
                          f"eager ({eager_launch_us:.6g} us): the profile's graph figures (first_launch_us graph, "
                          "launch_graph_us) exceed its eager ones")


# ---- prediction -------------------------------------------------------------------------------------


def steps_of(w: Workload, variant: str, hw: HardwareProfile, options: ModelOptions | None = None) -> list[Step]:
    """The steps one rank runs for one iteration of the variant, unplaced."""
    modelled(w.name, variant)
    if w.dtype not in hw.matrix_tflops:
        raise TaxesError(f"hardware {hw.name} has no matrix peak for dtype {w.dtype}")
    skew = hw.rank_skew_us if w.world > 1 else 0.0
    return _STEPS[w.name](w, variant, hw, floor_of(w, hw), options or ModelOptions(), skew)


def assemble(w: Workload, variant: str, hw: HardwareProfile, steps: list[Step], graphed: bool) -> Prediction:
    """Place the steps and add them up into a prediction (unchecked)."""
    fl = floor_of(w, hw)
    phases, idle = schedule(steps, graphed, hw)
    comp = {c: 0.0 for c in COMPONENTS}
    for s in steps:
        for c, v in s.parts.items():
            comp[c] += v
    comp["launch"] = idle
    e2e = math.fsum(comp[c] for c in COMPONENTS)
    exposed = 0.0
    if w.world > 1:  # the bsp collectives whole, and what fused kernels wait on their peers
        exposed = math.fsum(s.duration_us for s in steps if s.role == "communication") + math.fsum(
            s.parts.get("start_skew", 0.0) + s.parts.get("sync_wait", 0.0) + min(fl.unhideable_link_us, s.parts.get("ideal", 0.0))
            for s in steps if s.role == "compute" and s.parts.get("sync_wait", 0.0) + s.parts.get("start_skew", 0.0) > 0)
    return Prediction(w, variant, hw.name, e2e, comp, fl, exposed, phases)


def predict(w: Workload, variant: str, hw: HardwareProfile, options: ModelOptions | None = None) -> Prediction:
    """One variant's predicted iteration, checked (`check`): a CUDA graph against the same steps eager."""
    kind = modelled(w.name, variant)
    steps = steps_of(w, variant, hw, options)
    pred = assemble(w, variant, hw, steps, kind.graphed)
    eager = schedule(steps, False, hw)[1] if kind.graphed else None
    check(pred, eager)
    return pred


def predict_all(w: Workload, hw: HardwareProfile, variants=None, options: ModelOptions | None = None) -> list[Prediction]:
    """Every variant's prediction (variants: default, every variant the model knows for the workload)."""
    return [predict(w, v, hw, options) for v in (model_names(w.name) if variants is None else variants)]


def parse_sweep(text: str, workload: Workload) -> tuple[str, list[int]]:
    """'M=1024:16384' -> ('M', [1024, 2048, 4096, 8192, 16384]): one dimension, doubling."""
    from taxes.workloads import parse_int

    if "=" not in text or ":" not in text:
        raise TaxesError(f"sweep: {text!r} is not DIM=START:STOP (e.g. M=1024:16384)")
    dim, rng = (s.strip() for s in text.split("=", 1))
    if dim not in workload.dims:
        raise TaxesError(f"sweep: {workload.name} has no dimension {dim!r} (its dimensions: {', '.join(workload.dims)})")
    lo_text, hi_text = rng.split(":", 1)
    lo, hi = parse_int(lo_text, dim), parse_int(hi_text, dim)
    if lo <= 0 or hi < lo:
        raise TaxesError(f"sweep: {dim} range {lo}:{hi} must be positive and increasing")
    values = []
    v = lo
    while v <= hi and len(values) < 64:
        values.append(v)
        v *= 2
    return dim, values


def sweep(w: Workload, dim: str, values: list[int], hw: HardwareProfile, variants=None,
          options: ModelOptions | None = None) -> list[list[Prediction]]:
    """Predictions for each value of one dimension (each value validated like any shape)."""
    return [predict_all(replace_dim(w, dim, v), hw, variants, options) for v in values]
