"""Instrumented iterations and their assembly into a timeline (taxes/run/instrument.py), on the host clock.

The cheap clock records device activities alone in the timed iterations and places their launches from the
warm-up's launch sequence and the host stamps: the rows it gives must be the rows the full records give."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pandas as pd
import torch
import pytest

from taxes.attribution.attribute import ROWS, attribute
from taxes.run.instrument import HostRecorder, record_iterations
from taxes.traces.records import assemble
from taxes.run.planted import spin_us


class Ctx(SimpleNamespace):
    def barrier(self):
        pass

    def start_barrier(self):
        pass


CTX = Ctx(device=SimpleNamespace(type="cpu"), rank=0, world=1)


class Steps:
    """Three launching calls of known host time, a host spin between two of them."""

    def __init__(self, spin=0.0, extra=False):
        self.spin, self.extra = spin, extra

    def phases(self, *inputs, traced=False):
        out = [("a", "compute", lambda: spin_us(30)), ("b", "communication", lambda: spin_us(20))]
        if self.spin:
            out.append(("spin", "host", lambda: spin_us(self.spin)))
        out.append(("c", "compute", lambda: spin_us(10)))
        return out


class ActivitiesOnly(HostRecorder):
    """The host clock, recording launches only until api_off(), like cupti-python's cheap clock."""

    def api_off(self):
        self.cut = time.perf_counter_ns()

    def stop(self):
        acts, launches, host = super().stop()
        cut = self.to_us(getattr(self, "cut", time.perf_counter_ns()))
        return acts, launches[launches["start_us"] < cut], host


def _rows(recorder, runner, iters=6, warmup=3):
    raw = record_iterations(CTX, runner, [()], iters, warmup, recorder, graph=False, fused=False)
    tl = assemble(0, raw, comm_phases=("b",))
    return tl, attribute([tl]).rows


def test_launches_placed_from_the_warmup_give_the_rows_recorded_launches_give():
    runner = Steps(spin=40.0)
    raw = record_iterations(CTX, runner, [()], 6, 3, ActivitiesOnly(), graph=False, fused=False)
    placed = assemble(0, raw, comm_phases=("b",))
    assert (placed.launches["name"] == "launch (placed)").sum() == 3 * 6  # every timed activity got one
    assert placed.meta["launches"].startswith("from the warm-up")
    # the same records with every launch kept (the host clock launches at each call's start)
    calls = raw["host"][raw["host"]["kind"] == "call"].reset_index(drop=True)
    full = dict(raw)
    full["launches"] = pd.DataFrame({"name": "call", "kind": "launch", "start_us": calls["start_us"],
                                     "end_us": calls["start_us"], "correlation": range(len(calls)), "tid": 0})
    recorded = assemble(0, full, comm_phases=("b",))
    a, b = attribute([placed]).rows, attribute([recorded]).rows
    for k in ROWS:
        assert list(a[k]) == pytest.approx(list(b[k]), abs=1e-6), k
    assert (a["host_bound"] >= 40.0).all()  # the 40 us spin between calls is host-bound in every iteration
    assert set(placed.activities["phase"]) == {"a", "b", "c"}
    assert (placed.activities.loc[placed.activities["phase"] == "b", "comm"] == "nccl").all()


def test_the_last_warmup_already_runs_without_launch_records():
    """Switching the API records off costs the first iteration after it: that iteration is a warm-up."""
    rec = ActivitiesOnly()
    raw = record_iterations(CTX, Steps(), [()], 4, 3, rec, graph=False, fused=False)
    steps = raw["host"][raw["host"]["kind"] == "step"].set_index("name")["start_us"]
    cut = rec.to_us(rec.cut)
    assert steps["step 1"] < cut < steps["step 2"]  # off before warm-up 2, the last of three
    tl = assemble(0, raw, comm_phases=("b",))
    assert (tl.launches["name"] == "launch (placed)").sum() == 3 * 4  # the timed ones placed from warm-up 1
    assert sorted(set(tl.activities["step"])) == [3, 4, 5, 6]


class NoLaunches(HostRecorder):
    """The host clock recording device activities alone (cupti-python's api="none")."""

    def stop(self):
        acts, launches, host = super().stop()
        # as cupti-python leaves it: no rows, untyped (object) columns
        return acts, pd.DataFrame(columns=list(launches.columns)), host


def test_launches_placed_from_a_template_block_recorded_after_the_rounds():
    """`taxes profile` with cupti-python: rounds of blocks without any launch record, then one block of
    warm-ups that records them; merged, every timed iteration is placed from that last block."""
    from taxes.run.measure import merge_blocks

    runner = Steps(spin=40.0)
    blocks = [record_iterations(CTX, runner, [()], 3, 1, NoLaunches(), graph=False, fused=False) for _ in range(2)]
    blocks.append(record_iterations(CTX, runner, [()], 0, 3, ActivitiesOnly(), graph=False, fused=False))
    merged = merge_blocks(blocks)
    placed = assemble(0, merged, comm_phases=("b",))
    assert (placed.launches["name"] == "launch (placed)").sum() == 3 * 6  # two blocks of three timed iterations
    assert len(placed.windows) == 6
    acts = merged["activities"]
    full = dict(merged, launches=pd.DataFrame({"name": "call", "kind": "launch", "start_us": acts["start_us"],
                                               "end_us": acts["start_us"], "correlation": acts["correlation"],
                                               "tid": 0}))
    recorded = assemble(0, full, comm_phases=("b",))
    a, b = attribute([placed]).rows, attribute([recorded]).rows
    for k in ROWS:
        assert list(a[k]) == pytest.approx(list(b[k]), abs=1e-6), k
    assert (a["host_bound"] >= 40.0).all()


def test_a_timed_iteration_with_an_unexpected_activity_still_places_the_known_ones():
    raw = record_iterations(CTX, Steps(), [()], 4, 2, ActivitiesOnly(), graph=False, fused=False)
    acts = raw["activities"]
    last = acts.index[-1]
    extra = acts.loc[[last]].assign(name="surprise", correlation=acts["correlation"].max() + 100)
    raw = dict(raw, activities=pd.concat([acts, extra], ignore_index=True))
    tl = assemble(0, raw, comm_phases=("b",))
    placed = set(tl.launches.loc[tl.launches["name"] == "launch (placed)", "correlation"])
    assert int(extra["correlation"].iloc[0]) not in placed
    assert len(placed) == 3 * 4  # the three known activities of every timed iteration


def test_windows_are_the_event_e2e_ending_at_the_last_activity():
    tl, rows = _rows(HostRecorder(), Steps())
    assert len(tl.windows) == 6
    for w in tl.windows.itertuples():
        last = tl.activities.loc[tl.activities["step"] == w.step, "end_us"].max()
        assert w.end_us == pytest.approx(last)
    assert all(math.isclose(sum(r[k] for k in ROWS), r["span_us"], rel_tol=1e-9) for _, r in rows.iterrows())


def test_what_a_barrier_launches_after_an_iteration_is_not_the_iterations():
    raw = record_iterations(CTX, Steps(), [()], 4, 2, ActivitiesOnly(), graph=False, fused=False)
    acts, host = raw["activities"], raw["host"]
    steps = host[host["kind"] == "step"].sort_values("start_us")
    # after timed iteration 3's work, before iteration 4's host start: a kernel named like the first one
    last = acts[acts["start_us"] < steps["start_us"].iloc[4]].iloc[-1]
    stray = last.to_frame().T.assign(start_us=last["end_us"] + 1.0, end_us=last["end_us"] + 2.0, name="a",
                                     correlation=acts["correlation"].max() + 50)
    raw = dict(raw, activities=pd.concat([acts, stray], ignore_index=True).astype(acts.dtypes.to_dict()))
    tl = assemble(0, raw, comm_phases=("b",))
    assert int(stray["correlation"].iloc[0]) not in set(tl.activities["correlation"])
    placed = tl.launches[tl.launches["name"] == "launch (placed)"].set_index("correlation")
    starts = tl.activities.set_index("correlation")["start_us"]
    assert (placed["end_us"] <= starts.reindex(placed.index)).all()  # a launch returns before its kernel starts
    assert all(tl.activities.groupby("step")["phase"].apply(list).map(lambda p: p == ["a", "b", "c"]))


class Stamped(Steps):
    """A 'fused' runner whose traced calls write a different, known stamp row into its trace buffer each call."""

    def __init__(self):
        super().__init__()
        self.trace = torch.zeros(2, 3, dtype=torch.int64)
        self.calls = 0

    def phases(self, *inputs, traced=False):
        def write():
            self.calls += 1
            self.trace.copy_(torch.tensor([[0, 1000 * self.calls, 7 * self.calls], [0, 500, 0]]))
        return [("fused", "compute", write)]

    def trace_buffers(self):
        return [self.trace]


def test_each_iteration_keeps_its_own_calls_stamps_read_after_the_block():
    runner = Stamped()
    seen_during = []

    def waits(r):  # what a reader sees when it is called
        seen_during.append(r.calls)
        return {"fused": float(r.trace[0, 2])}

    raw = record_iterations(CTX, runner, [()], 5, 2, HostRecorder(), graph=False, fused=True, trace_of=waits,
                            ctas_of=lambda r: {"fused": r.trace.tolist()})
    its = raw["iterations"]
    assert [it["waits"]["fused"] for it in its] == [7.0 * (k + 1) for k in range(7)]
    assert [it["ctas"]["fused"][0][1] for it in its] == [1000 * (k + 1) for k in range(7)]
    assert seen_during == [7] * 7  # every reading came after the block's last call, none between iterations
