"""The multi-rank rules on synthetic timelines with answers planted on purpose: ranks put on one clock, the
harness's start skew split from sync wait, a collective's wait measured by what it cost the waiting rank,
a fused kernel's wait taken from the CTA that finished last, and the late-rank known answer's plumbing.

Every planted answer is known by construction (a rank's clock origin moved by a known amount, a window
started late by a known amount, a collective whose early rank overlapped part of its set-up with its
wait), never read back from the rule that is tested."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pandas as pd
import pytest

from sim import Launch, Sim, run
from taxes.attribution.attribute import ROWS, attribute
from taxes.attribution.waits import own_durations
from taxes.traces.records import assemble_ranks, on_one_clock, raw_from_columns, raw_to_columns, shifted
from taxes.traces.timeline import timeline


def one(rows, rank, step=0):
    r = rows[(rows["rank"] == rank) & (rows["step"] == step)]
    assert len(r) == 1
    return r.iloc[0]


def adds_up(r):
    assert math.fsum(r[k] for k in ROWS) == pytest.approx(r["span_us"], abs=1e-6)


# ---- one clock for every rank ---------------------------------------------------------------------


def raw_record(rank: int, origin_us, arrival_us: float, coll_us: float, e2e_us: float) -> dict:
    """One rank's raw records of one iteration, on its own clock (time 0 = its recorder's origin): a host
    step from 0, a 10 us kernel launched at 1, then a collective launched at 12 whose kernel starts at
    `arrival_us` and ends at `arrival_us + coll_us` (times on the rank's own clock)."""
    acts = pd.DataFrame([
        {"name": "gemm", "kind": "kernel", "stream": 7, "start_us": 2.0, "end_us": 12.0, "correlation": 1, "graph": -1,
         "comm": ""},
        {"name": "nccl", "kind": "kernel", "stream": 7, "start_us": arrival_us, "end_us": arrival_us + coll_us,
         "correlation": 2, "graph": -1, "comm": ""}])
    launches = pd.DataFrame([{"name": "cudaLaunchKernel", "kind": "launch", "start_us": 1.0, "end_us": 1.5,
                              "correlation": 1, "tid": 3},
                             {"name": "cudaLaunchKernel", "kind": "launch", "start_us": 12.0, "end_us": 12.5,
                              "correlation": 2, "tid": 3}])
    host = pd.DataFrame([{"name": "step 0", "kind": "step", "start_us": 0.0, "end_us": 13.0},
                         {"name": "gemm", "kind": "call", "start_us": 0.5, "end_us": 1.6},
                         {"name": "all-gather", "kind": "call", "start_us": 11.9, "end_us": 12.6}])
    return {"activities": acts, "launches": launches, "host": host, "clock": "test", "shared_origin_us": origin_us,
            "iterations": [{"step": 0, "e2e_us": e2e_us, "waits": {}, "warmup": False}]}


@pytest.mark.parametrize("seed", range(5))
def test_ranks_whose_recorders_started_apart_are_put_on_one_clock_before_their_arrivals_are_compared(seed):
    rng = random.Random(seed)
    # on the host's shared clock: both ranks begin at 1000 us; rank 1 reaches the collective `late` us after
    # rank 0, and the collective ends for both at the same shared time. Each recorder's origin is elsewhere.
    late = rng.uniform(5.0, 200.0)
    coll = 30.0
    origins = [1000.0 - rng.uniform(0.0, 5000.0), 1000.0 - rng.uniform(0.0, 5000.0)]
    arrival_shared = [1020.0, 1020.0 + late]
    end_shared = arrival_shared[1] + coll
    raws = []
    for r in (0, 1):
        # times from the iteration's start (shared 1000 us), then moved onto the rank's own clock
        raw = raw_record(r, None, arrival_shared[r] - 1000.0, end_shared - arrival_shared[r], end_shared - 1000.0)
        raw = shifted(raw, 1000.0 - origins[r])
        raw["shared_origin_us"] = origins[r]
        raws.append(raw)
    aligned, ok = on_one_clock(raws)
    assert ok
    starts = [float(r["activities"]["start_us"].iloc[1]) for r in aligned]
    assert starts[1] - starts[0] == pytest.approx(late)  # the arrivals' gap on the shared clock
    tls = assemble_ranks(raws, comm_phases=("all-gather",))
    a = attribute(tls)
    r0, r1 = one(a.rows, 0), one(a.rows, 1)
    assert r0["sync_wait"] == pytest.approx(late, abs=1e-6) and r1["sync_wait"] == pytest.approx(0.0, abs=1e-6)
    adds_up(r0), adds_up(r1)


def test_ranks_without_a_shared_origin_are_not_compared_and_say_so():
    raws = [raw_record(0, None, 20.0, 130.0, 150.0), raw_record(1, None, 120.0, 30.0, 150.0)]
    tls = assemble_ranks(raws, comm_phases=("all-gather",))
    assert not any(tl.meta["clock_aligned"] for tl in tls)
    a = attribute(tls, aligned_starts=True)
    assert (a.rows["sync_wait"] == 0.0).all() and (a.rows["start_skew"] == 0.0).all()
    assert any("not aligned" in n for n in a.notes)
    for r in (0, 1):
        adds_up(one(a.rows, r))


def test_the_shared_origin_survives_the_stored_form():
    raw = raw_record(0, 123456.789, 20.0, 30.0, 50.0)
    raw = shifted(raw, 40.0)  # times from 40 us: the stored form moves them to start near 0
    back = raw_from_columns(raw_to_columns(raw))
    moved = float(raw["activities"]["start_us"].min()) - float(back["activities"]["start_us"].min())
    # the same events on the shared clock, before and after
    assert back["shared_origin_us"] + float(back["activities"]["start_us"].iloc[1]) == pytest.approx(
        raw["shared_origin_us"] + float(raw["activities"]["start_us"].iloc[1]), abs=1e-3)
    assert moved > 0


def test_blocks_of_one_rank_keep_their_distance_on_the_shared_clock():
    from taxes.run.measure import merge_blocks

    a, b = raw_record(0, 5000.0, 20.0, 30.0, 50.0), raw_record(0, 7500.0, 20.0, 30.0, 50.0)
    merged = merge_blocks([a, b])
    st = merged["activities"]["start_us"].values
    assert st[2] - st[0] == pytest.approx(2500.0)  # the second block's gemm, 2.5 ms after the first's
    assert merged["shared_origin_us"] == 5000.0
    assert merged["activities"]["correlation"].is_unique  # ids restart per recorder: moved apart
    a["shared_origin_us"] = None
    assert merge_blocks([a, b])["shared_origin_us"] is None  # one block of unknown origin: no shared clock


# ---- the harness's start skew ----------------------------------------------------------------------


@pytest.mark.parametrize("skew, late", [(30.0, 0.0), (30.0, 20.0), (5.0, 40.0), (0.0, 15.0)])
def test_the_wait_a_later_start_explains_is_start_skew_the_rest_sync_wait(skew, late):
    # rank 1's device begins its iteration `skew` us after rank 0's (the barrier's exit), and reaches the
    # collective `late` us later still (its program); both run a 50 us kernel first, and the collective
    # takes 20 us once both are there
    tls = []
    for rank in (0, 1):
        t0 = 100.0 + (skew if rank else 0.0)
        ks = [Launch("gemm", dur_us=50.0, not_before_us=t0),
              Launch("ag", dur_us=0.0, comm="nccl", collective="g:1", not_before_us=t0 + 60.0 + (late if rank else 0.0))]
        tl = run(ks, rank=rank)
        tl.windows.loc[0, "start_us"] = t0
        tls.append(tl)
    arrive = [tl.activities.loc[1, "start_us"] for tl in tls]
    assert arrive[1] - arrive[0] == pytest.approx(skew + late)
    for tl in tls:
        tl.activities.loc[1, "end_us"] = max(arrive) + 20.0
        tl.windows.loc[0, "end_us"] = max(arrive) + 20.0
    a = attribute(tls, aligned_starts=True)
    r0, r1 = one(a.rows, 0), one(a.rows, 1)
    assert r0["start_skew"] == pytest.approx(skew) and r0["sync_wait"] == pytest.approx(late)
    assert r1["start_skew"] == 0.0 and r1["sync_wait"] == pytest.approx(0.0)
    adds_up(r0), adds_up(r1)
    b = attribute(tls)  # iterations not begun together (a trace): all of it is sync wait
    assert one(b.rows, 0)["sync_wait"] == pytest.approx(skew + late) and one(b.rows, 0)["start_skew"] == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_sync_wait_is_what_the_programs_lateness_added_when_set_up_overlaps_the_skew(seed):
    # rank 1 begins `skew` us after rank 0 (the harness) and reaches the collective `late` us later still
    # (its program); rank 0's collective does up to `setup` us of its own work while it waits, and takes D
    # once both are there. The truth, from the simulated ends alone: how much later rank 0's iteration ends
    # with rank 1 late than with rank 1 on time (same skew), which the sync_wait row must be.
    rng = random.Random(seed)
    skew, late, setup, D = rng.uniform(0.5, 6.0), rng.uniform(10.0, 120.0), rng.uniform(2.0, 15.0), 60.0

    def ranks(lateness):
        tls = []
        for rank in (0, 1):
            t0 = 100.0 + (skew if rank else 0.0)
            ks = [Launch("gemm", dur_us=50.0, not_before_us=t0),
                  Launch("ag", dur_us=0.0, comm="nccl", collective="g:1",
                         not_before_us=t0 + 60.0 + (lateness if rank else 0.0))]
            tl = run(ks, rank=rank)
            tl.windows.loc[0, "start_us"] = t0
            tls.append(tl)
        arrive = [tl.activities.loc[1, "start_us"] for tl in tls]
        for tl, t in zip(tls, arrive):
            end = max(arrive) + D - min(setup, max(arrive) - t)
            tl.activities.loc[1, "end_us"] = end
            tl.windows.loc[0, "end_us"] = end
        return tls

    on_time, with_late = ranks(0.0), ranks(late)
    truth = with_late[0].windows.loc[0, "end_us"] - on_time[0].windows.loc[0, "end_us"]
    a, b = one(attribute(with_late, aligned_starts=True).rows, 0), one(attribute(on_time, aligned_starts=True).rows, 0)
    assert a["sync_wait"] - b["sync_wait"] == pytest.approx(truth, abs=1e-6)
    assert b["sync_wait"] == pytest.approx(0.0, abs=1e-6)  # on time, the whole wait is the harness's
    assert b["start_skew"] == pytest.approx(max(0.0, skew - setup), abs=1e-6)
    adds_up(a), adds_up(b)


# ---- what a wait at a collective costs the waiting rank --------------------------------------------


@pytest.mark.parametrize("late, setup", [(40.0, 12.0), (100.0, 5.0), (8.0, 12.0)])
def test_an_early_ranks_set_up_done_while_it_waits_is_not_sync_wait(late, setup):
    # a collective that takes D = 60 us on a rank that arrives last; a rank that arrives early does up to
    # `setup` us of it while it waits. The truth: how much later the early rank's iteration ends with the
    # other rank late than with both on time, from the simulated times alone.
    D = 60.0

    def ranks(lateness):
        tls = []
        for rank in (0, 1):
            ks = [Launch("gemm", dur_us=50.0), Launch("ag", dur_us=0.0, comm="nccl", collective="g:1",
                                                      not_before_us=160.0 + (lateness if rank else 0.0))]
            tls.append(run(ks, rank=rank))
        arrive = [tl.activities.loc[1, "start_us"] for tl in tls]
        last = max(arrive)
        for tl, t in zip(tls, arrive):
            overlap = min(setup, last - t)  # the early rank's set-up done while waiting
            tl.activities.loc[1, "end_us"] = last + D - overlap
            tl.windows.loc[0, "end_us"] = last + D - overlap
        return tls

    on_time, with_late = ranks(0.0), ranks(late)
    truth = (with_late[0].windows.loc[0, "end_us"] - on_time[0].windows.loc[0, "end_us"])
    rows = attribute(with_late).rows
    assert one(rows, 0)["sync_wait"] == pytest.approx(truth)
    assert one(rows, 1)["sync_wait"] == pytest.approx(0.0)
    assert one(attribute(on_time).rows, 0)["sync_wait"] == pytest.approx(0.0)
    adds_up(one(rows, 0))


def _steps_of_collectives(own: dict, late_by: dict, steps: int, seed: int, D: float = 60.0, setup: float = 12.0,
                          last_of=lambda s: s % 4):
    """4 ranks, `steps` iterations of a GEMM then a reduce-scatter, one timeline per rank. In step s the ranks
    reach the collective up to 3 us apart, rank last_of(s) last, then rank 1 later by late_by.get(s, 0). The
    collective ends D after the last arrival, less the set-up an early rank did while waiting (up to `setup`),
    plus the rank's own offset own[rank] (its own reductions: a rank's duration when it arrives last is
    D + own[rank]). Returns (timelines, {(rank, step): the collective's end})."""
    rng = random.Random(seed)
    per_rank = {r: ([], [], [], []) for r in range(4)}
    ends = {}
    for s in range(steps):
        t0 = 1000.0 * s + 100.0
        offset = {r: (3.0 if r == last_of(s) else rng.uniform(0.0, 2.5)) for r in range(4)}
        offset[1] += late_by.get(s, 0.0)
        tls = [run([Launch("gemm", dur_us=50.0), Launch("rs", dur_us=0.0, comm="nccl", collective=f"g:{s}",
                                                        not_before_us=t0 + 60.0 + offset[r])],
                   sim=Sim(t0=t0), rank=r, step=s) for r in range(4)]
        arrive = [tl.activities.loc[1, "start_us"] for tl in tls]
        last = max(arrive)
        for r, (tl, t) in enumerate(zip(tls, arrive)):
            end = last + D - min(setup, last - t) + own[r]
            tl.activities.loc[1, "end_us"] = end
            tl.windows.loc[0, "end_us"] = end
            ends[(r, s)] = end
            for part, frame in zip(per_rank[r], (tl.activities, tl.launches, tl.host, tl.windows)):
                part.append(frame)
    tls = [timeline(r, *(pd.concat(p, ignore_index=True) for p in per_rank[r])) for r in range(4)]
    return tls, ends


OWN = {0: -0.7, 1: 0.0, 2: 0.5, 3: 0.3}  # each rank's own offset of the collective's duration, us


@pytest.mark.parametrize("late", [20.0, 100.0])
def test_a_wait_is_measured_against_the_last_arrivals_duration_not_the_quickest_ranks(late):
    # one step: 4 ranks arrive a few us apart (rank 1 last), each early one doing up to 12 us of set-up while it
    # waits; the collective ends 60 us after the last arrival, less that set-up, plus a rank's own offset (OWN:
    # rank 0's collective always ends 0.7 us sooner, ranks 2 and 3 0.5 and 0.3 us later, their own reductions).
    # Rank 1 is then made `late` us later. Truth: how much later each waiting rank's collective ends than on
    # time. One step holds too few instances of a rank's own duration, so the last arrival's is the reference.
    on_time, e0 = _steps_of_collectives(OWN, {}, 1, seed=0, last_of=lambda s: 1)
    with_late, e1 = _steps_of_collectives(OWN, {0: late}, 1, seed=0, last_of=lambda s: 1)
    before, after = attribute(on_time).rows, attribute(with_late).rows
    for rank in (2, 3):  # later than the last arrival's own: their change is recovered exactly
        truth = e1[(rank, 0)] - e0[(rank, 0)]
        assert one(after, rank)["sync_wait"] - one(before, rank)["sync_wait"] == pytest.approx(truth)
    # rank 0's collective is quicker than the last arrival's by 0.7 us: a rank's own duration without a wait
    # is not in the record when it always waits, so its wait reads that much low (docs/method.md)
    truth0 = e1[(0, 0)] - e0[(0, 0)]
    assert one(after, 0)["sync_wait"] - one(before, 0)["sync_wait"] == pytest.approx(truth0 - 0.7)
    assert one(after, 1)["sync_wait"] == pytest.approx(0.0)


@pytest.mark.parametrize("late", [20.0, 100.0])
def test_a_wait_is_measured_against_the_ranks_own_duration_when_it_waited_for_nobody(late):
    # ranks take turns arriving last, so each rank's own duration without a wait is in the record; rank 1 is
    # then `late` us later in every step (last in each: the other ranks' own durations come from the run
    # without the delay). Truth: how much later each waiting rank's collective ends than on time, per step.
    # The last arrival's duration as the reference reads each waiting rank off by its own offset less rank 1's.
    steps = 20  # each rank last in 5
    on_time, e0 = _steps_of_collectives(OWN, {}, steps, seed=1)
    with_late, e1 = _steps_of_collectives(OWN, {s: late for s in range(steps)}, steps, seed=1)
    base = attribute(on_time)
    reference = own_durations(base.collectives)
    assert {k for k in reference} == {(r, "rs#0") for r in range(4)}
    after = attribute(with_late, collective_reference=reference).rows
    for rank in (0, 2, 3):
        for s in range(steps):
            truth = e1[(rank, s)] - e0[(rank, s)]
            assert one(after, rank, s)["sync_wait"] - one(base.rows, rank, s)["sync_wait"] == pytest.approx(truth)
            adds_up(one(after, rank, s))
    assert after[after["rank"] == 1]["sync_wait"].max() == pytest.approx(0.0)


def test_where_a_rank_is_late_only_sometimes_its_peers_own_durations_come_from_the_same_record():
    # one record, rank 1 late by 40 us in odd steps only: no reference is passed, the waiting ranks' own
    # durations are read from the even steps, where they took turns arriving last (each 5 times)
    steps = 40
    late = {s: 40.0 for s in range(1, steps, 2)}
    turns = lambda s: (s // 2) % 4  # noqa: E731
    plain, e0 = _steps_of_collectives(OWN, {}, steps, seed=2, last_of=turns)
    mixed, e1 = _steps_of_collectives(OWN, late, steps, seed=2, last_of=turns)
    rows0, rows1 = attribute(plain).rows, attribute(mixed).rows
    for rank in (0, 2, 3):
        for s in late:
            truth = e1[(rank, s)] - e0[(rank, s)]
            assert one(rows1, rank, s)["sync_wait"] - one(rows0, rank, s)["sync_wait"] == pytest.approx(truth)


def test_a_rank_that_was_not_early_gets_no_wait_from_a_longer_collective():
    # rank 0 arrives last but its collective runs longer (more to reduce): that is no wait of its own
    tls = []
    for rank, late, dur in ((0, 30.0, 90.0), (1, 0.0, 100.0)):
        ks = [Launch("gemm", dur_us=50.0), Launch("rs", dur_us=dur, comm="nccl", collective="g:2",
                                                  not_before_us=160.0 + late)]
        tls.append(run(ks, rank=rank))
    rows = attribute(tls).rows
    assert one(rows, 0)["sync_wait"] == 0.0


# ---- a fused kernel's wait -------------------------------------------------------------------------


class _FusedRunner:
    """A runner whose last traced call's CTAs are given (start ns, end ns, data wait ns, peer wait ns)."""

    def __init__(self, ctas):
        self.ctas = ctas

    def cta_trace_rows(self):
        return [{"start_ns": s, "end_ns": e, "data_wait_ns": dw, "peer_wait_ns": pw, "tiles": 1, "copies_done_ns": 0}
                for s, e, dw, pw in self.ctas]


def _fused_call(rng, n_ctas: int, arrive_ns: float, local_ns: list, peer_ns: list) -> tuple[list, float]:
    """A fused kernel's CTAs simulated: each computes its local tiles, then wants the late peer's rows, waits
    until they arrive at arrive_ns and computes its peer tile. Returns (CTA stamps, the kernel's end ns)."""
    ctas = []
    for i in range(n_ctas):
        want = local_ns[i]
        wait = max(0.0, arrive_ns - want) if peer_ns[i] else 0.0
        ctas.append((0, int(want + wait + peer_ns[i]), int(wait), 0))
    return ctas, max(c[1] for c in ctas)


@pytest.mark.parametrize("seed", range(4))
def test_a_fused_kernels_wait_moves_with_its_late_peer_as_the_kernels_end_does(seed):
    from taxes.run.measure import critical_waits

    rng = random.Random(seed)
    # 132 CTAs, a quarter of them with a tile of the late peer's rows: its rows arriving d us later ends the
    # kernel d us later (the truth, from the simulated ends), and the wait of the rule in use must move by as
    # much; a mean over CTAs dilutes it by every CTA that had nothing to wait for
    n = 132
    local = [rng.uniform(20e3, 60e3) for _ in range(n)]
    peer = [rng.uniform(30e3, 45e3) if rng.random() < 0.25 else 0.0 for _ in range(n)]
    arrive = rng.uniform(65e3, 80e3)  # after every CTA wanted the rows: the kernel waits for them
    d = rng.choice([20e3, 100e3, 500e3])
    (on_time, end0), (late, end1) = (_fused_call(rng, n, a, local, peer) for a in (arrive, arrive + d))
    truth_us = (end1 - end0) / 1e3
    got = critical_waits(_FusedRunner(late))["fused-gemm"] - critical_waits(_FusedRunner(on_time))["fused-gemm"]
    assert got == pytest.approx(truth_us, abs=1e-2)
    mean_change = (np.mean([c[2] for c in late]) - np.mean([c[2] for c in on_time])) / 1e3
    assert mean_change < 0.5 * truth_us


@pytest.mark.parametrize("seed", range(5))
def test_the_held_wait_is_how_much_earlier_the_kernel_would_have_ended_had_no_cta_waited(seed):
    from taxes.run.cases import cta_stamps
    from taxes.run.measure import critical_waits, waits_by_rule

    rng = random.Random(seed)
    # each CTA: its own work and its wait for peers' rows (ns); it ends after both. The truth, from the
    # simulated CTAs alone: the kernel's end against its end had every wait been zero
    ctas, ends_without = [], []
    for _ in range(rng.randint(8, 140)):
        start, work = rng.uniform(0, 2e3), rng.uniform(20e3, 60e3)
        wait = rng.choice([0.0, rng.uniform(1e3, 40e3)])
        ctas.append((int(start), int(start + work + wait), int(wait), 0))
        ends_without.append(int(start + work))
    runner = _FusedRunner(ctas)
    truth_us = (max(c[1] for c in ctas) - max(ends_without)) / 1e3
    held, critical = waits_by_rule(cta_stamps(runner), "held")["fused-gemm"], critical_waits(runner)["fused-gemm"]
    assert held == pytest.approx(truth_us, abs=1e-3)
    assert 0.0 <= held <= critical + 1e-9  # never more than the longest wait, the rule in use


def test_the_held_waits_survive_the_stored_records():
    raw = raw_record(0, 1000.0, 20.0, 30.0, 50.0)
    raw["iterations"] = [dict(it, waits={"fused-gemm": 4.0}, waits_held={"fused-gemm": 2.5}) for it in raw["iterations"]]
    back = raw_from_columns(raw_to_columns(raw))
    assert [it["waits_held"] for it in back["iterations"]] == [{"fused-gemm": 2.5}] * len(raw["iterations"])
    assert [it["waits"] for it in back["iterations"]] == [{"fused-gemm": 4.0}] * len(raw["iterations"])


def test_the_ctas_own_stamps_are_kept_from_the_kernels_start_and_survive_the_stored_records():
    from taxes.run.cases import cta_stamps

    rng = random.Random(11)
    t0 = 10**15 + rng.randrange(10**6)  # globaltimer ns: far from zero
    ctas = [(t0 + rng.randrange(2000), t0 + 50_000 + rng.randrange(30_000), rng.randrange(9000), rng.randrange(500))
            for _ in range(132)]
    stamps = cta_stamps(_FusedRunner(ctas))["fused-gemm"]
    first = min(c[0] for c in ctas)
    assert [row[:4] for row in stamps] == [[s - first, e - first, dw, pw] for s, e, dw, pw in ctas]
    assert min(row[0] for row in stamps) == 0
    raw = raw_record(0, 1000.0, 20.0, 30.0, 50.0)
    raw["iterations"] = [dict(it, ctas={"fused-gemm": stamps}) for it in raw["iterations"]]
    back = raw_from_columns(json.loads(json.dumps(raw_to_columns(raw))))
    assert all(it["ctas"] == {"fused-gemm": stamps} for it in back["iterations"])


# ---- the late rank's plumbing ----------------------------------------------------------------------


class _Ctx:
    def __init__(self, rank):
        import torch

        self.rank, self.world, self.device = rank, 2, torch.device("cpu")


class _Bsp:
    def phases(self, *inputs, traced=False):
        return [("matmul", "compute", lambda: None), ("reduce-scatter", "communication", lambda: None),
                ("cast", "compute", lambda: None)]


@pytest.mark.parametrize("how, x", [("device", 100.0), ("host", 100.0), ("host", 0.0), ("device", 0.0)])
def test_the_late_rank_is_delayed_just_before_its_first_collective_and_only_it(how, x):
    from taxes.run.planted import Late

    names = [[n for n, _, _ in Late(_Ctx(r), _Bsp(), how, x).phases()] for r in (0, 1)]
    assert names[0] == ["matmul", "reduce-scatter", "cast"]  # every other rank runs the runner unchanged
    want = {("device", True): ["delay"], ("device", False): [], ("host", True): ["delay"],
            ("host", False): []}[(how, bool(x))]
    assert names[1] == ["matmul"] + want + ["reduce-scatter", "cast"]


@pytest.mark.parametrize("x", [0.0, 100.0])
def test_on_a_gpu_the_late_ranks_host_closes_its_gate_before_the_collective_and_opens_it_last(x):
    # (a stand-in gate: the GPU's own is checked by tests/test_host_gate.py)
    from taxes.run.planted import Late

    class Gate:
        def __init__(self):
            self.calls = []

        def close(self):
            self.calls.append("close")

        def open_after(self, us):
            self.calls.append(("open", us))
            return us

    late = Late(_Ctx(1), _Bsp(), "host", x)
    late.gate = Gate()
    steps = late.phases()
    assert [(n, r) for n, r, _ in steps] == [("matmul", "compute"), ("gate", "host"), ("reduce-scatter", "communication"),
                                             ("cast", "compute"), ("delay", "host-after")]
    late()
    assert late.gate.calls == ["close", ("open", x)] and late.spun == [x]  # the run without a delay keeps its gate


def test_the_machines_gpu_picks_its_hardware_profile():
    from taxes.model.hardware import machine_profile

    hw, why, warn = machine_profile("NVIDIA H100 80GB HBM3", 2)  # a calibration of 2 x H100 is committed
    assert hw.name == "h100-x2-calibrated" and warn is None
    hw, why, warn = machine_profile("NVIDIA H100 80GB HBM3", 3)
    assert hw.name == "h100-sxm" and warn is None and "no h100-x3-calibrated" in why
    hw, why, warn = machine_profile("NVIDIA H100 80GB HBM3", 2, "h200-sxm")
    assert hw.name == "h200-sxm" and "H200" in warn and "H100" in warn
    hw, why, warn = machine_profile("Some Future GPU", 2)
    assert hw.name == "h200-sxm" and warn and "taxes calibrate" in warn


def _ddp_like(rank: int, late_us: float, host_period_us: float = 100.0, t_us: float = 30.0,
              opt_launch_us: float | None = None):
    """A host-bound rank (its host launches a 20 us kernel every host_period_us) whose gradient all-reduce,
    launched after the second kernel on its own stream, overlaps the rest of the backward; the optimizer kernel,
    launched last, waits for it. Rank 1 reaches the all-reduce late_us later than rank 0 (the all-reduce ends
    t_us after the later arrival on both). opt_launch_us: the optimizer's launch, if not last (queued early, it
    still runs after the backward and the all-reduce)."""
    from taxes.traces.timeline import timeline

    acts, calls, host = [], [], [{"name": "step 0", "kind": "step", "start_us": 0.0, "end_us": 0.0}]
    lat = 2.0
    arrive = {0: 152.0, 1: 152.0 + late_us}
    ar_end = max(arrive.values()) + t_us

    def launch(name, corr, at, start, dur, stream=0, comm="", coll=""):
        calls.append({"name": "cudaLaunchKernel", "kind": "launch", "start_us": at, "end_us": at + 1.0,
                      "correlation": corr})
        host.append({"name": name, "kind": "call", "start_us": at, "end_us": at + 1.0})
        acts.append({"name": name, "start_us": start, "end_us": start + dur, "correlation": corr, "graph": -1,
                     "comm": comm, "collective": coll, "stream": stream, "step": 0})

    corr = 1
    for i in range(4):  # the backward, host-bound
        at = i * host_period_us
        launch(f"bwd{i}", corr, at, at + 1.0 + lat, 20.0)
        corr += 1
    launch("ncclDevKernel_AllReduce", corr, 149.0, arrive[rank], ar_end - arrive[rank], stream=1, comm="nccl",
           coll="ar:1")
    corr += 1
    opt_at = 4 * host_period_us if opt_launch_us is None else opt_launch_us
    launch("adamw", corr, opt_at, max(opt_at + 1.0 + lat, ar_end, max(a["end_us"] for a in acts if a["stream"] == 0)),
           20.0)
    end = max(a["end_us"] for a in acts)
    return timeline(rank, acts, calls, host, [{"step": 0, "start_us": 0.0, "end_us": end}])


@pytest.mark.parametrize("late", [60.0, 150.0, 400.0, 900.0])
def test_a_wait_the_ranks_own_host_would_have_idled_through_is_host_bound_not_sync_wait(late):
    # DDP overlaps its gradient all-reduce with a host-bound backward: a peer late by less than the host's own
    # slack moves the waiting rank's step end by nothing, by more, by the excess. The truth is the change of
    # rank 0's step end from the simulated times; sync wait must follow it, not the all-reduce's whole wait.
    on_time = [_ddp_like(r, 0.0) for r in (0, 1)]
    with_late = [_ddp_like(r, late) for r in (0, 1)]
    truth = with_late[0].windows.loc[0, "end_us"] - on_time[0].windows.loc[0, "end_us"]
    a, b = one(attribute(with_late).rows, 0), one(attribute(on_time).rows, 0)
    assert a["sync_wait"] - b["sync_wait"] == pytest.approx(truth, abs=0.05 * late)
    if truth == 0.0:  # the whole wait passed while the host was still launching the backward
        assert a["sync_wait"] == pytest.approx(0.0, abs=1e-6) and a["host_bound"] > b["host_bound"]
    adds_up(a), adds_up(b)


@pytest.mark.parametrize("late", [250.0, 400.0, 900.0])
def test_compute_idle_inside_a_wait_that_the_host_made_is_host_bound_even_when_the_next_kernel_was_queued(late):
    # The optimizer is queued at once behind the all-reduce, but the backward is still launched by a slow host:
    # inside the wait the device idles between backward kernels the host had not launched yet, as it does
    # when nobody is late. Only the idle after the last backward kernel, until the wait ends, is the peer's;
    # the transfer after it is exposed_transfer. The truth is rank 0's step end change from the simulated
    # times, less the transfer the wait exposed.
    on_time = [_ddp_like(r, 0.0, opt_launch_us=149.5) for r in (0, 1)]
    with_late = [_ddp_like(r, late, opt_launch_us=149.5) for r in (0, 1)]
    def exposed_transfer(tl):  # the all-reduce's transfer (after the later arrival) no backward kernel overlapped
        acts = tl.activities
        ar = acts[acts["comm"] != ""].iloc[0]
        return max(0.0, ar["end_us"] - max(acts[acts["name"] == "bwd3"]["end_us"].iloc[0], ar["end_us"] - 30.0))

    truth = (with_late[0].windows.loc[0, "end_us"] - exposed_transfer(with_late[0])) - \
        (on_time[0].windows.loc[0, "end_us"] - exposed_transfer(on_time[0]))
    a, b = one(attribute(with_late).rows, 0), one(attribute(on_time).rows, 0)
    assert truth > 0.0
    assert a["sync_wait"] - b["sync_wait"] == pytest.approx(truth, abs=0.5)
    assert a["host_bound"] > b["host_bound"]  # the host's own gaps inside the wait stay the host's
    adds_up(a), adds_up(b)


def test_the_known_answers_weigh_a_fused_kernels_held_wait_from_the_same_iterations():
    from taxes.run.planted_answers import _rule_change, attributed

    def measured(rank, crit, held):
        raw = raw_record(rank, 1000.0, 20.0, 30.0, 50.0)
        raw["iterations"] = [dict(it, waits={"gemm": crit}, waits_held={"gemm": held}) for it in raw["iterations"]]
        return {"raw": raw, "plain": [50.0], "comm": ("all-gather",), "locality_bytes": 0.0, "us_per_byte": None,
                "eager_twin": None}

    results = [{"base": measured(r, 0.0, 0.0), "late": measured(r, 6.0, 3.0)} for r in (0, 1)]
    held = _rule_change(results, {"base": None, "late": None}, "held")
    crit = {r: attributed([x["late"] for x in results])["by_rank"][r]["rows"]["sync_wait"]
            - attributed([x["base"] for x in results])["by_rank"][r]["rows"]["sync_wait"] for r in (0, 1)}
    assert held == pytest.approx({0: 3.0, 1: 3.0}) and crit == pytest.approx({0: 6.0, 1: 6.0})
    assert _rule_change(results, {"base": None, "late": None}, "held", stamps_only=True) is None
    for x in results:  # records without the second rule: nothing to weigh
        for m in x.values():
            for it in m["raw"]["iterations"]:
                it.pop("waits_held")
    assert _rule_change(results, {"base": None, "late": None}, "held") is None


def test_every_fused_wait_rule_is_read_again_from_the_ctas_stored_stamps():
    from taxes.run.planted_answers import _rule_change

    # per CTA [start, end, data wait, peer wait, tiles, copies done] ns. On time nobody waits. Late: CTA a
    # ends last after waiting 6 us (4 for data, 2 for a peer), b waited 9 us and ended at 53, c waited
    # nothing and also ended at 53: the last CTA waited 6 us, the kernel would have ended 3 us earlier
    # without any wait (at c's end), and the longest wait was 9 us
    on_time = [[0, 50_000, 0, 0, 1, 0], [0, 48_000, 0, 0, 1, 0], [0, 47_000, 0, 0, 1, 0]]
    late = [[0, 56_000, 4_000, 2_000, 1, 0], [0, 53_000, 9_000, 0, 1, 0], [0, 53_000, 0, 0, 1, 0]]

    def measured(rank, stamps):
        raw = raw_record(rank, 1000.0, 20.0, 30.0, 50.0)
        raw["iterations"] = [dict(it, waits={"gemm": 123.0}, ctas={"gemm": stamps}) for it in raw["iterations"]]
        return {"raw": raw, "plain": [50.0], "comm": ("all-gather",), "locality_bytes": 0.0, "us_per_byte": None,
                "eager_twin": None}

    results = [{"base": measured(r, on_time), "late": measured(r, late)} for r in (0, 1)]
    got = {rule: _rule_change(results, {"base": None, "late": None}, rule, stamps_only=True)
           for rule in ("last", "held", "longest")}
    assert got == {"last": pytest.approx({0: 6.0, 1: 6.0}), "held": pytest.approx({0: 3.0, 1: 3.0}),
                   "longest": pytest.approx({0: 9.0, 1: 9.0})}


def _run_slowed(work_us: list, t0: float, slow: tuple, factor: float, gap_us: float = 0.0) -> list:
    """Kernels of the given work from t0, each gap_us after the one before (the device's own dispatch gap),
    running `factor` times slower inside slow=(a, b): their (start, end)s."""
    out, t = [], t0
    a, b = slow
    for k, w in enumerate(work_us):
        t += gap_us if k else 0.0
        s = t
        if t < a:  # full speed up to a
            done = min(w, a - t)
            t, w = t + done, w - done
        if w > 0 and a <= t < b:  # slowed inside the wait
            done = min(w, (b - t) / factor)
            t, w = t + done * factor, w - done
        t += w
        out.append((s, t))
    return out


def _device_bound_ddp(late_steps: set, late_us: float, slow_factor: float, steps: int = 8, seed: int = 0,
                      n_bwd: int = 6, gap_us: float = 0.0):
    """A device-bound training step on two ranks: six backward kernels back to back on the compute stream, the
    gradient all-reduce on another stream from the end of the second (on rank 1, the late one, `late_us`
    later in the steps of late_steps, after a delay kernel), ending on both ranks 40 us after the later
    arrival, then the optimizer once both are done; the next step starts on both once both are done. While
    rank 0's all-reduce waits for rank 1, its backward runs slow_factor times slower (the waiting kernel
    keeps its SMs). Returns both ranks' timelines and rank 0's steps as (start, end, exposed transfer)."""
    from taxes.traces.timeline import timeline

    rng = random.Random(seed)
    work = [rng.uniform(30.0, 80.0) for _ in range(n_bwd)]
    t_ar, opt_us = 40.0, 15.0
    acts = {0: [], 1: []}
    calls = {0: [], 1: []}
    windows = {0: [], 1: []}
    corr, t = 1, 0.0

    def add(rank, name, start, end, step, stream=0, comm="", coll=""):
        # the host runs ahead: each step's launches all come at its start, 1 us apart
        nonlocal corr
        at = windows_lo[step] + 0.5 * len([c for c in acts[rank] if c["step"] == step])
        calls[rank].append({"name": "cudaLaunchKernel", "kind": "launch", "start_us": at, "end_us": at + 0.5,
                            "correlation": corr})
        acts[rank].append({"name": name, "start_us": start, "end_us": end, "correlation": corr, "graph": -1,
                           "comm": comm, "collective": coll, "stream": stream, "step": step})
        corr += 1

    windows_lo, exposed_transfer = {}, []
    for step in range(steps):
        lo = windows_lo[step] = t
        late = late_us if step in late_steps else 0.0
        t_dev = lo + 6.0
        if late:
            add(1, "delay", t_dev, t_dev + late, step)
        arrive = {0: t_dev + work[0] + gap_us + work[1], 1: t_dev + late + work[0] + gap_us + work[1]}
        ar_end = arrive[1] + t_ar
        ends = {}
        for rank in (0, 1):
            begin = t_dev + (late if rank == 1 else 0.0)
            slow = (arrive[0], arrive[1]) if rank == 0 else (0.0, 0.0)
            spans = _run_slowed(work, begin, slow, slow_factor, gap_us)
            for i, (a, b) in enumerate(spans):
                add(rank, f"bwd{i}", a, b, step)
            add(rank, "ncclDevKernel_AllReduce", arrive[rank], ar_end, step, stream=1, comm="nccl", coll=f"ar:{step}")
            o = max(spans[-1][1], ar_end)
            add(rank, "adamw", o, o + opt_us, step)
            ends[rank] = o + opt_us
            if rank == 0:  # the transfer (after the later arrival) that no backward kernel overlapped
                exposed_transfer.append(max(0.0, ar_end - max(spans[-1][1], arrive[1])))
        for rank in (0, 1):
            windows[rank].append({"step": step, "start_us": lo, "end_us": ends[rank]})
        t = max(ends.values()) + 3.0
    host = [{"name": f"step {w['step']}", "kind": "step", "start_us": w["start_us"], "end_us": w["end_us"]}
            for w in windows[0]]
    tls = [timeline(r, acts[r], calls[r], host, windows[r]) for r in (0, 1)]
    return tls, [(w["start_us"], w["end_us"], x) for w, x in zip(windows[0], exposed_transfer)]


def _late_against_on_time(late_steps: set, tls, spans):
    """The truth (rank 0's step, late steps against on-time ones, less the transfer no kernel overlapped: a
    wait that outlasts the backward exposes the transfer after it, which is exposed_transfer, not the wait)
    and rank 0's rows: (truth, all rows by step, late steps' rows, on-time steps' rows)."""
    cost = [b - a - x for a, b, x in spans]
    truth = np.mean([c for i, c in enumerate(cost) if i in late_steps]) - \
        np.mean([c for i, c in enumerate(cost) if i not in late_steps])
    rows = attribute(tls).rows
    r0 = rows[rows["rank"] == 0].set_index("step")
    return truth, r0, r0.loc[sorted(late_steps)], r0.drop(index=sorted(late_steps))


@pytest.mark.parametrize("late,factor", [(100.0, 1.3), (400.0, 1.6), (60.0, 2.0), (600.0, 1.0), (300.0, 1.25)])
def test_compute_that_ran_slower_beside_a_waiting_all_reduce_is_the_waits_cost(late, factor):
    # A device-bound DDP step: rank 0's gradient all-reduce waits for rank 1 while rank 0's own backward runs
    # on; the waiting kernel keeps its SMs, so that backward runs slower and the step ends later by the exposed
    # wait plus the stretch. The truth is rank 0's step length, late steps against on-time ones, from the
    # simulated times; sync wait must follow it, and compute must stay what it is on time. A short wait hides
    # behind the rest of the backward but for its stretch; a long one is exposed too.
    late_steps = {1, 3, 5, 7}
    truth, r0, late_m, on_m = _late_against_on_time(late_steps, *_device_bound_ddp(late_steps, late, factor))
    assert truth > 0.0
    assert late_m["sync_wait"].mean() - on_m["sync_wait"].mean() == pytest.approx(truth, rel=0.02)
    assert late_m["compute"].mean() == pytest.approx(on_m["compute"].mean(), rel=0.01)
    assert (late_m["wait_stretch_us"] > 0).all() == (factor > 1.0) and (on_m["wait_stretch_us"] == 0).all()
    for _, r in r0.iterrows():
        adds_up(r)


@pytest.mark.parametrize("late,factor", [(100.0, 1.0), (300.0, 1.3), (1500.0, 1.0), (1200.0, 1.5)])
def test_the_devices_own_dispatch_gaps_inside_a_wait_are_not_the_late_ranks(late, factor):
    # The same step with 24 backward kernels, each 3 us after the one before on the device although all were
    # queued at the step's start (its dispatch gap, in every step alike). A waiting all-reduce covers some of
    # those gaps in the late steps; they were there on time too, so they are not what the late rank cost:
    # sync wait must still follow the step's change, which is nothing where the rest of the backward hides
    # the wait (before, every gap a wait covered counted as the peer's, 3 us each).
    late_steps = {1, 3, 5, 7}
    truth, r0, late_m, on_m = _late_against_on_time(late_steps, *_device_bound_ddp(late_steps, late, factor,
                                                                                    n_bwd=24, gap_us=3.0))
    got = late_m["sync_wait"].mean() - on_m["sync_wait"].mean()
    assert abs(got - truth) <= max(0.02 * truth, 0.5), (got, truth)
    for _, r in r0.iterrows():
        adds_up(r)
