"""The attribution's rules, each on a synthetic timeline with a tax of known size planted on purpose.

The simulator (tests/sim.py) places every host call and device activity; the planted amount of each tax
is known by construction (the regime is chosen so that the answer is unambiguous: a device that always
waits, a spin the host does on purpose, a rank that arrives late). Every test also checks that the rows
add up to the window exactly, and that the rows a planted tax must NOT move stay where they were.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from sim import Launch, Sim, run
from taxes.attribution.attribute import ROWS, attribute, iqm, kept_iterations, summarize
from taxes.model.floor import Floor
from taxes.traces.timeline import timeline


def rows_of(tl, **kw):
    att = attribute([tl] if not isinstance(tl, list) else tl, **kw)
    return att, att.rows


def one(rows, rank=0, step=0):
    r = rows[(rows["rank"] == rank) & (rows["step"] == step)]
    assert len(r) == 1
    return r.iloc[0]


def adds_up(r):
    assert math.fsum(r[k] for k in ROWS) == pytest.approx(r["span_us"], abs=1e-6)


def chain(n, **kw):
    return [Launch(name=f"k{i}", **kw) for i in range(n)]


@pytest.mark.parametrize("n", [1, 5, 40])
def test_a_device_that_always_waits_on_the_launch_path_is_all_launch_tax(n):
    # host: 3 us of dispatch then a 2 us launch API per kernel, back to back; device: 1 us kernels,
    # starting 1.5 us after their launch returns: every idle moment is the launch path
    r = one(rows_of(run(chain(n, dur_us=1.0, call_us=3.0, api_us=2.0), Sim(latency_us=1.5)))[1])
    planted = (3.0 + 2.0 + 1.5) + (n - 1) * (3.0 + 2.0 - 1.0)
    assert r["launch"] == pytest.approx(planted)
    assert r["host_bound"] == pytest.approx(0.0)
    assert r["queued"] == pytest.approx(0.0) and r["unattributed"] == pytest.approx(0.0)
    assert r["compute"] == pytest.approx(n * 1.0)
    adds_up(r)


@pytest.mark.parametrize("spin", [0.5, 7.0, 200.0])
def test_a_host_spin_before_each_launch_is_host_bound_and_leaves_launch_unchanged(spin):
    base = one(rows_of(run(chain(12, dur_us=1.0, call_us=3.0, api_us=2.0)))[1])
    spun = one(rows_of(run(chain(12, dur_us=1.0, call_us=3.0, api_us=2.0, pre_us=spin)))[1])
    assert spun["host_bound"] - base["host_bound"] == pytest.approx(12 * spin)
    assert spun["launch"] == pytest.approx(base["launch"])
    adds_up(spun)


def test_work_queued_ahead_of_the_device_pays_no_launch_tax():
    # the host is far ahead (kernels of 50 us, launches of 5 us): after the first, every kernel is queued
    # before the device needs it; a dependency holds kernel 3 for 20 us: that gap is `queued`
    ks = chain(6, dur_us=50.0, call_us=3.0, api_us=2.0)
    tl0 = run(ks)
    hold_until = tl0.activities["end_us"][2] + 20.0
    ks[3].not_before_us = hold_until
    r = one(rows_of(run(ks))[1])
    first_gap = 3.0 + 2.0 + 1.5
    assert r["launch"] == pytest.approx(first_gap)
    assert r["queued"] == pytest.approx(20.0)
    assert r["host_bound"] == 0.0
    adds_up(r)


def test_gaps_inside_one_graph_replay_are_graph_gaps_not_launch_tax():
    r = one(rows_of(run(chain(10, dur_us=2.0), graph=True, graph_gap_us=0.8, graph_api_us=6.0))[1])
    assert r["graph_gaps"] == pytest.approx(9 * 0.8)
    assert r["launch"] == pytest.approx(6.0 + 1.5)  # the replay's own launch call and latency, once
    adds_up(r)


@pytest.mark.parametrize("harness_us, python_us", [(4.0, 1.0), (9.0, 0.5), (9.0, 6.0)])
def test_the_harnesss_start_event_record_is_not_the_programs_host_time(harness_us, python_us):
    # the harness records the iteration's start event in a host call of its own (it launches nothing) before
    # the program's graph replay: the program's host time is only from that call's end to the replay's call
    from taxes.run.instrument import HARNESS_START

    delay = harness_us + python_us
    tl = run(chain(4, dur_us=2.0), graph=True, graph_gap_us=0.5, graph_api_us=6.0, start_delay_us=delay)
    t0 = Sim().t0
    host = [*tl.host.to_dict("records"), {"name": HARNESS_START, "kind": "call", "start_us": t0,
                                          "end_us": t0 + harness_us, "tid": 0}]
    r = one(rows_of(timeline(tl.rank, tl.activities, tl.launches, host, tl.windows))[1])
    assert r["host_bound"] == pytest.approx(python_us)
    assert r["launch"] == pytest.approx(harness_us + 6.0 + Sim().latency_us)
    without = one(rows_of(tl)[1])  # no harness call: the step's start is when the host was last free
    assert without["host_bound"] == pytest.approx(delay)
    adds_up(r)


def test_a_long_dependency_wait_inside_a_graph_is_a_graph_gap():
    ks = chain(4, dur_us=2.0)
    ks[2].not_before_us = 100.0 + 6.0 + 1.5 + 300.0
    r = one(rows_of(run(ks, graph=True, graph_gap_us=1.0, graph_api_us=6.0))[1])
    assert r["graph_gaps"] > 290.0 and r["launch"] == pytest.approx(7.5)
    adds_up(r)


def test_the_gap_after_a_host_synchronisation_is_sync():
    ks = chain(4, dur_us=30.0, call_us=3.0, api_us=2.0)
    ks[2].sync_before = True
    ks[2].pre_us = 40.0  # Python after the sync returns
    base = one(rows_of(run(chain(4, dur_us=30.0, call_us=3.0, api_us=2.0)))[1])
    r = one(rows_of(run(ks))[1])
    # the sync returns 2 us after the device drained, then 40 us of Python, then the launch (3 + 2 us) and its
    # latency (1.5 us): the device waited 48.5 us because the host waited for it; launching cost no more
    assert r["sync"] == pytest.approx(2.0 + 40.0 + 6.5)
    assert r["launch"] == pytest.approx(base["launch"])
    assert r["host_bound"] == pytest.approx(base["host_bound"])
    adds_up(r)


def test_time_the_host_spent_compiling_is_compile_not_launch():
    ks = chain(3, dur_us=5.0, call_us=3.0, api_us=2.0)
    ks[1].pre_us = 1000.0
    tl = run(ks, compile_ranges=[("triton compile", 100.0 + 5.0 + 20.0, 100.0 + 5.0 + 820.0)])
    r = one(rows_of(tl)[1])
    # kernel 1's launch is 1000 us late: 800 of them compiling, the rest elsewhere; its launch path (6.5 us)
    # ran where the device was waiting anyway
    assert r["compile"] == pytest.approx(800.0)
    assert r["host_bound"] == pytest.approx(200.0)
    assert r["launch"] == pytest.approx(3.0 + 2.0 + 1.5)
    adds_up(r)


def test_an_activity_without_a_launch_record_leaves_its_gap_unattributed():
    tl = run(chain(5, dur_us=1.0, call_us=3.0, api_us=2.0))
    tl = dataclasses.replace(tl, launches=tl.launches[tl.launches["correlation"] != 3])
    r = one(rows_of(tl)[1])
    gap = tl.activities["start_us"][2] - tl.activities["end_us"][1]
    assert r["unattributed"] == pytest.approx(gap)
    adds_up(r)


@pytest.mark.parametrize("late_us", [20.0, 100.0, 500.0])
def test_a_rank_that_arrives_late_at_a_collective_is_sync_wait_on_the_other(late_us):
    # both ranks: a 50 us compute kernel, then a collective whose transfer takes 30 us once both are there;
    # rank 1 spins late_us before its collective
    tls = []
    for rank, pre in ((0, 0.0), (1, late_us)):
        ks = [Launch("gemm", dur_us=50.0), Launch("allgather", dur_us=0.0, comm="nccl", collective="g0:1", pre_us=pre)]
        tl = run(ks, rank=rank)
        tls.append(tl)
    arrive = [tl.activities.loc[1, "start_us"] for tl in tls]
    finish = max(arrive) + 30.0
    for tl in tls:  # the collective ends when the last rank's data has moved
        tl.activities.loc[1, "end_us"] = finish
        tl.windows.loc[0, "end_us"] = finish
    att, rows = rows_of(tls)
    planted = arrive[1] - arrive[0]
    r0, r1 = one(rows, 0), one(rows, 1)
    assert r0["sync_wait"] == pytest.approx(planted)
    assert r0["exposed_transfer"] == pytest.approx(30.0)
    assert r1["sync_wait"] == pytest.approx(0.0) and r1["exposed_transfer"] == pytest.approx(30.0)
    assert att.collectives["matched"].all()
    adds_up(r0), adds_up(r1)


def test_collectives_that_never_overlap_are_unmatched_and_get_no_sync_wait():
    tls = []
    for rank, pre in ((0, 0.0), (1, 500.0)):
        ks = [Launch("gemm", dur_us=50.0), Launch("sendrecv", dur_us=10.0, comm="nccl", collective="g0:7", pre_us=pre)]
        tls.append(run(ks, rank=rank))
    att, rows = rows_of(tls)
    assert not att.collectives["matched"].any()
    assert one(rows, 0)["sync_wait"] == 0.0 and one(rows, 0)["exposed_transfer"] == pytest.approx(10.0)


def test_communication_under_compute_is_not_exposed():
    acts = [{"name": "gemm", "start_us": 0.0, "end_us": 100.0, "correlation": 1},
            {"name": "copy", "kind": "memcpy", "start_us": 20.0, "end_us": 130.0, "correlation": 2, "comm": "p2p",
             "stream": 7}]
    launches = [{"start_us": -5.0, "end_us": -4.0, "correlation": 1}, {"start_us": -3.0, "end_us": -2.0, "correlation": 2}]
    r = one(rows_of(timeline(0, acts, launches, None, [{"step": 0, "start_us": 0.0, "end_us": 130.0}]))[1])
    assert r["exposed_transfer"] == pytest.approx(30.0)
    assert r["compute"] == pytest.approx(100.0)
    adds_up(r)


@pytest.mark.parametrize("nbytes", [0.0, 1e6, 3.3e8])
def test_locality_is_bytes_times_time_per_byte_never_capped(nbytes):
    us_per_byte = 1 / 3.0e6  # 3 TB/s
    r = one(rows_of(run(chain(2, dur_us=10.0)), locality_bytes=nbytes, us_per_byte=us_per_byte)[1])
    assert r["locality"] == pytest.approx(nbytes * us_per_byte)
    # without a floor, the estimate is carved out of compute, whatever its size (compute may go negative)
    assert r["compute"] == pytest.approx(20.0 - nbytes * us_per_byte)
    adds_up(r)


def test_a_fused_kernels_own_wait_is_sync_wait_beyond_the_unhideable_link_time():
    k = Launch("fused", dur_us=100.0, wait_us=30.0, floor_us=60.0)
    fl = Floor(compute_us=60.0, hbm_us=10.0, link_us=70.0)  # 10 us of link time no schedule hides
    r = one(rows_of(run([k]), floor=fl)[1])
    assert r["sync_wait"] == pytest.approx(30.0 - 10.0)
    assert r["ideal"] == pytest.approx(70.0)
    assert r["inefficiency"] == pytest.approx(100.0 - 30.0 - 60.0)
    adds_up(r)


@pytest.mark.parametrize("seed", range(4))
def test_a_fused_kernel_waited_no_longer_than_it_ran_beyond_its_floor(seed):
    # a fused kernel's wait rule (the longest any CTA waited) also counts wait that other CTAs' compute
    # covered: a kernel of dur us whose floor is fl cannot have been held by waiting for more than dur - fl
    rng = random.Random(seed)
    dur = rng.uniform(80.0, 200.0)
    fl_us = rng.uniform(0.3, 0.8) * dur
    beyond = dur - fl_us
    for wait in (0.5 * beyond, 2.0 * beyond):
        k = Launch("fused", dur_us=dur, wait_us=wait, floor_us=fl_us)
        r = one(rows_of(run([k]), floor=Floor(compute_us=fl_us, hbm_us=1.0))[1])
        assert r["sync_wait"] == pytest.approx(min(wait, beyond))
        assert r["inefficiency"] == pytest.approx(beyond - min(wait, beyond))
        assert r["inefficiency"] >= -1e-9
        adds_up(r)


def test_inefficiency_is_each_kernels_time_above_its_own_floor_and_unattributed_keeps_its_sign():
    # two memory-bound kernels with their own floors; a third without; the step's floor says less work
    # than the kernels' floors add up to (the extra is locality the step floor does not count)
    ks = [Launch("a", dur_us=40.0, floor_us=30.0), Launch("b", dur_us=25.0, floor_us=20.0), Launch("c", dur_us=7.0)]
    fl = Floor(compute_us=5.0, hbm_us=35.0)
    r = one(rows_of(run(ks), floor=fl, locality_bytes=9e6, us_per_byte=1e-6)[1])
    assert r["inefficiency"] == pytest.approx((40 - 30) + (25 - 20))
    assert r["compute"] == pytest.approx(7.0)
    assert r["locality"] == pytest.approx(9.0)
    # kernels' floors (50) = step floor (35) + 15; locality says 9: 6 us nobody explains, with its sign
    assert r["unattributed"] == pytest.approx((30 + 20) - 35 - 9)
    adds_up(r)


def test_rows_add_up_on_random_timelines():
    rng = random.Random(7)
    for _ in range(60):
        ks = [Launch(f"k{i}", dur_us=rng.uniform(0.5, 80), pre_us=rng.choice([0, 0, rng.uniform(0, 40)]),
                     call_us=rng.uniform(0, 10), api_us=rng.uniform(0.5, 5),
                     comm=rng.choice(["", "", "nccl"]), floor_us=rng.choice([math.nan, rng.uniform(0.1, 40)]),
                     sync_before=rng.random() < 0.1) for i in range(rng.randint(1, 15))]
        fl = rng.choice([None, Floor(rng.uniform(1, 100), rng.uniform(1, 100), rng.uniform(0, 100))])
        r = one(rows_of(run(ks, graph=rng.random() < 0.2), floor=fl, locality_bytes=rng.uniform(0, 1e7),
                        us_per_byte=1e-6)[1])
        adds_up(r)
        for k in ("launch", "host_bound", "sync", "graph_gaps", "queued", "sync_wait", "exposed_transfer"):
            assert r[k] >= -1e-9, k


def test_the_interquartile_set_trims_an_outlier_even_among_ten_iterations():
    e2e = [100.0 + i * 0.1 for i in range(9)] + [2000.0]
    keep = kept_iterations(e2e)
    assert 9 not in keep and len(keep) == 6
    assert iqm(e2e) == pytest.approx(sum(sorted(e2e)[2:8]) / 6)


def test_a_slow_outlier_iteration_does_not_become_sync_wait():
    # ten iterations; in one, rank 1 is late by 2 ms: the summary keeps the interquartile set, whose rows
    # add up to the interquartile mean
    tls = {0: [], 1: []}
    for it in range(10):
        late = 2000.0 if it == 4 else 5.0
        for rank in (0, 1):
            ks = [Launch("gemm", dur_us=50.0),
                  Launch("ag", dur_us=0.0, comm="nccl", collective=f"g:{it}", pre_us=late if rank else 0.0)]
            tl = run(ks, rank=rank, step=it, sim=Sim(t0=10000.0 * it))
            tls[rank].append(tl)
    merged = []
    for rank, parts in tls.items():
        import pandas as pd

        acts = pd.concat([p.activities for p in parts], ignore_index=True)
        wins = pd.concat([p.windows for p in parts], ignore_index=True)
        launches = pd.concat([p.launches for p in parts], ignore_index=True)
        host = pd.concat([p.host for p in parts], ignore_index=True)
        merged.append(timeline(rank, acts, launches, host, wins))
    for it in range(10):
        arr = [m.activities[(m.activities["step"] == it) & (m.activities["comm"] != "")]["start_us"].iloc[0] for m in merged]
        for m in merged:
            i = m.activities[(m.activities["step"] == it) & (m.activities["comm"] != "")].index[0]
            m.activities.loc[i, "end_us"] = max(arr) + 30.0
            m.windows.loc[m.windows["step"] == it, "end_us"] = max(arr) + 30.0
    att = attribute(merged)
    s = summarize(att.rows)
    assert 4 not in s["kept"]
    assert s["rows"]["sync_wait"] < 10.0
    assert math.fsum(s["rows"].values()) == pytest.approx(s["e2e_us"])


def test_locality_bytes_per_rank_and_step_and_gap_times():
    # two ranks, one step each: bytes keyed by (rank, step) reach only that rank's row; each gap piece
    # carries the gap it came from, and a host-bound piece the interval the host was elsewhere
    tls = [run(chain(3, dur_us=1.0, call_us=3.0, api_us=2.0, pre_us=9.0), rank=r) for r in (0, 1)]
    att = attribute(tls, locality_bytes={(1, 0): 1000.0}, us_per_byte=0.002)
    assert one(att.rows, rank=0)["locality"] == 0.0
    assert one(att.rows, rank=1)["locality"] == pytest.approx(2.0)
    g = att.gaps[(att.gaps["rank"] == 0) & (att.gaps["cause"] == "host")]
    assert len(g) == 3 and (g["host_end_us"] - g["host_start_us"]).tolist() == pytest.approx([9.0] * 3)
    assert ((g["end_us"] - g["start_us"]) >= g["dur_us"] - 1e-9).all()


def test_an_activity_launched_in_no_window_is_charged_to_none():
    # a kernel launched before recording began (step -2: no window holds its launch) runs at the start of
    # the window: its device time is not the window's compute; the window's own kernel queued behind it
    tl = run(chain(1, dur_us=10.0, not_before_us=130.5))
    early = {"name": "before", "start_us": 100.5, "end_us": 130.5, "step": -2}
    tl = timeline(0, [early, *tl.activities.to_dict("records")], tl.launches, tl.host, tl.windows)
    r = one(rows_of(tl)[1])
    assert r["compute"] == pytest.approx(10.0)
    # the device was busy, but not with this window's work (and idle 0.5 us before it, cause unknown)
    assert r["unattributed"] == pytest.approx(30.5)
    assert r["launch"] + r["queued"] + r["host_bound"] == pytest.approx(0.0)
    adds_up(r)


def test_kernels_without_floors_of_their_own_are_inefficient_together_beyond_the_windows_floor():
    # someone else's sequence (PyTorch's fused matmul + reduce-scatter): no kernel carries a floor, and a copy
    # runs beside the GEMMs on a second stream. The window's floor is the ideal; their busy time beyond it is
    # inefficiency, counted once, so nothing is left unattributed (not minus the floor, not minus the overlap)
    from taxes.traces.timeline import timeline

    acts = [{"name": "gemm0", "start_us": 10.0, "end_us": 70.0, "correlation": 1, "stream": 0},
            {"name": "copy0", "start_us": 40.0, "end_us": 80.0, "correlation": 2, "stream": 1},
            {"name": "gemm1", "start_us": 70.0, "end_us": 130.0, "correlation": 3, "stream": 0}]
    calls = [{"name": "cudaLaunchKernel", "kind": "launch", "start_us": 1.0 + i, "end_us": 1.5 + i, "correlation": i + 1}
             for i in range(3)]
    host = [{"name": "step 0", "kind": "step", "start_us": 0.0, "end_us": 130.0}]
    tl = timeline(0, acts, calls, host, [{"step": 0, "start_us": 0.0, "end_us": 130.0}])
    r = one(rows_of(tl, floor=Floor(compute_us=70.0, hbm_us=20.0))[1])
    busy = 120.0  # 10 to 130: the copy ran beside the GEMMs
    assert r["ideal"] == pytest.approx(70.0)
    assert r["inefficiency"] == pytest.approx(busy - 70.0)
    assert r["compute"] == pytest.approx(0.0)
    assert r["unattributed"] == pytest.approx(0.0, abs=1e-6)
    adds_up(r)
