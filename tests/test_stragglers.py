"""The straggler summary on multi-rank timelines with a planted late rank (taxes/attribution/stragglers.py).

Each rank runs the same steps in lockstep (tests/kineto_build.Program): a matmul, then all-reduces whose
NCCL-like kernels all end together, once the last rank has arrived. One rank, drawn at random, is late
before every all-reduce by X us, on the host (a Python frame spinning) or on the device (a spin kernel
before the collective). The arrivals are known from the construction, so every number is planted.
"""

from __future__ import annotations

import json
import random

import pytest
from kineto_build import AR, MM, Op, Program, add_step, new_trace, write_trace

from taxes.attribution import analyze as A
from taxes.documents import analysis_document as D
from taxes.attribution import stragglers as late

TRANSFER_US = 12.0
HOST_FRAME = "late_host_work"
SPIN = "late_spin_kernel"


def lockstep(world: int, late_rank: int | None, delay_us: float, where: str, steps: int = 4, per_step: int = 3,
             compute_us: float = 20.0, seed: int = 0):
    """Traces of `world` ranks; returns (programs, arrivals {(step, k): {rank: us}})."""
    rnd = random.Random(seed)
    progs = [Program(new_trace(r, world)) for r in range(world)]
    arrivals: dict = {}
    seq = 0
    for step in range(steps):
        s0 = [p.t for p in progs]
        for k in range(per_step):
            for p in progs:
                p.run(Op(name="aten::mm", kernel=MM, dur_us=compute_us, pre_us=rnd.uniform(0.0, 0.5)))
            ops = []
            for r, p in enumerate(progs):
                jitter = rnd.uniform(0.0, 1.0)
                late_here = r == late_rank
                if late_here and where == "device":
                    p.run(Op(name="spin", kernel=SPIN, dur_us=delay_us, pre_us=jitter))
                    jitter = 0.0
                pre = jitter + (delay_us if late_here and where == "host" else 0.0)
                ops.append(Op(name="c10d::allreduce_", kernel=AR, pre_us=pre,
                              pre_frame=HOST_FRAME if late_here and where == "host" else None,
                              collective={"Collective name": "allreduce", "Process Group Name": "0", "Seq": seq}))
            # the device start of each rank's collective, as Program.run will place it
            starts = [max(p.dev_free.get(op.stream, -1e18), p.t + op.pre_us + op.call_us + op.api_us + p.latency_us)
                      for p, op in zip(progs, ops)]
            last = max(starts)
            for p, op, s in zip(progs, ops, starts):
                op.dur_us = last - s + TRANSFER_US  # NCCL: every rank's kernel ends once the last has arrived
                p.run(op)
            arrivals[(step, k)] = dict(enumerate(starts))
            seq += 1
        for r, p in enumerate(progs):
            add_step(p.tr, step, s0[r], p.t)
            p.t += 1.0
        t = max(p.t for p in progs)
        for p in progs:
            p.t = t
    return progs, arrivals


def analysed(tmp_path, progs):
    return A.analyze([write_trace(p.tr, tmp_path / f"rank{r}.json") for r, p in enumerate(progs)])


@pytest.mark.parametrize("seed", range(6))
def test_the_late_rank_is_named_with_the_wait_it_caused_and_where_it_was(tmp_path, seed):
    rnd = random.Random(seed)
    world = rnd.choice([2, 3, 4])
    late_rank = rnd.randrange(world)
    delay = rnd.uniform(100.0, 400.0)
    where = rnd.choice(["host", "device"])
    progs, arrivals = lockstep(world, late_rank, delay, where, seed=seed)
    an = analysed(tmp_path, progs)
    st = an.stragglers.set_index("rank")
    n = len(arrivals)
    ulp = 0.01 * n * world  # Kineto-like timestamps (~4e12 us) keep about 1 ns per event
    caused = sum(a[late_rank] - a[r] for a in arrivals.values() for r in a if r != late_rank)
    assert st.loc[late_rank, "straggler"] and st["straggler"].sum() == 1, st
    assert st.loc[late_rank, "times_last"] == n == st.loc[late_rank, "instances"]
    assert st.loc[late_rank, "caused_wait_us"] == pytest.approx(caused, abs=ulp)
    assert st.loc[late_rank, "score"] == pytest.approx(1.0)
    assert st.loc[late_rank, "suffered_wait_us"] == pytest.approx(0.0, abs=ulp)
    for r in range(world):
        if r != late_rank:
            suffered = sum(a[late_rank] - a[r] for a in arrivals.values())
            assert st.loc[r, "times_last"] == 0 and st.loc[r, "suffered_wait_us"] == pytest.approx(suffered, abs=ulp)
            assert st.loc[r, "score"] == pytest.approx(0.0)
    lateness = sum(a[late_rank] - min(a.values()) for a in arrivals.values()) / n
    assert st.loc[late_rank, "lateness_us"] == pytest.approx(lateness, abs=ulp)
    # where the late rank was while the others waited: the planted frame, about X per instance
    frame = f"host: {HOST_FRAME}" if where == "host" else f"device: {SPIN}"
    top = st.loc[late_rank, "where"].split("; ")[0]
    assert top.startswith(frame), st.loc[late_rank, "where"]
    per_instance = float(top.rsplit("(", 1)[1].split(" us")[0].replace(",", ""))
    assert delay - 30.0 <= per_instance <= delay + 1.0, (per_instance, delay)


def test_without_a_late_rank_nobody_is_named(tmp_path):
    progs, _ = lockstep(4, None, 0.0, "host", compute_us=400.0, seed=7)
    an = analysed(tmp_path, progs)
    assert not an.stragglers["straggler"].any(), an.stragglers
    assert an.stragglers["score"].sum() == pytest.approx(1.0)  # jitter waits still add up to the whole


def test_the_score_is_a_share_comparable_across_ranks():
    """Hand-made instances: rank 2 last at two, rank 0 at one; the score is each rank's share of the wait."""
    import pandas as pd

    rows = []
    for key, arr in (("a", {0: 0.0, 1: 1.0, 2: 10.0}), ("b", {0: 0.0, 1: 2.0, 2: 6.0}), ("c", {0: 5.0, 1: 4.0, 2: 3.0})):
        last = max(arr.values())
        for r, t in arr.items():
            rows.append({"key": key, "rank": r, "activity": 0, "arrival_us": t, "wait_us": last - t, "matched": True})
    per_rank = pd.DataFrame(rows)
    per_inst = pd.DataFrame({"key": ["a", "b", "c"], "matched": True, "slowest_rank": [2, 2, 0]})
    st = late.summary(per_rank, per_inst).set_index("rank")
    caused = {2: (10 + 9) + (6 + 4), 0: 1 + 2}
    total = sum(caused.values())
    assert st.loc[2, "caused_wait_us"] == caused[2] and st.loc[0, "caused_wait_us"] == caused[0]
    assert st.loc[2, "score"] == pytest.approx(caused[2] / total) and st.loc[1, "score"] == 0.0
    assert st.loc[2, "straggler"] and not st.loc[0, "straggler"]
    assert st.loc[1, "suffered_wait_us"] == 9 + 4 + 1


def test_a_record_costing_over_5_percent_marks_waits_and_stragglers_untrusted(tmp_path, capsys):
    """With plain step times, a record that cost more than 5% of the plain step marks the bulk-synchronous rows
    and the straggler table untrusted in every view; within 5% it does not."""
    from test_not_measured import run

    progs, _ = lockstep(2, 1, 150.0, "host", seed=5)
    paths = [write_trace(p.tr, tmp_path / f"rank{r}.json") for r, p in enumerate(progs)]
    an = A.analyze(paths)
    e2e = an.summary["e2e_us"]
    for plain_us, marked in ((e2e / 1.5, True), (e2e / 1.02, False)):
        plain = tmp_path / "plain.json"
        plain.write_text(json.dumps({"0": [plain_us] * 6, "1": [plain_us] * 6}))
        again = A.analyze(paths, plain_steps=A.read_plain(plain))
        doubt = D.analysis_document(again)["trace_analysis"]["untrusted"]
        assert (doubt is not None) == marked, doubt
        for fmt in ("md", "table"):
            out = tmp_path / f"r.{fmt}"
            code, _, err = run(["analyze", *map(str, paths), "--plain", str(plain), "--format", fmt, "-o", str(out),
                                "--force"], capsys)
            assert code == 0, err
            text = out.read_text()
            assert ("UNTRUSTED" in text and "not to be trusted" in text) == marked, fmt


def _without_collective_identity(progs):
    """What a timing record keeps: no record_param_comms ops, and no process group or sequence number on the
    kernels; only the kernels, their launches and the steps."""
    for p in progs:
        p.tr["doc"]["traceEvents"] = [e for e in p.tr["doc"]["traceEvents"] if e.get("name") != "record_param_comms"]
        for e in p.tr["doc"]["traceEvents"]:
            for k in ("Process Group Name", "Process Group ID", "pg", "Seq", "seq", "Collective name"):
                (e.get("args") or {}).pop(k, None)
    return progs


@pytest.mark.parametrize("seed", range(4))
def test_a_record_that_names_no_collective_still_finds_the_late_rank(tmp_path, seed):
    """A timing record keeps no cpu ops: the all-reduces are identified by their kernels' order on each rank
    (one order on every rank, as in DDP), so the late rank is still named, every rank's sync wait is the
    planted one, and a warning says how the instances were identified."""
    rnd = random.Random(100 + seed)
    world, where = rnd.choice([2, 4]), rnd.choice(["host", "device"])
    late_rank, delay = rnd.randrange(world), rnd.uniform(100.0, 400.0)
    progs, arrivals = lockstep(world, late_rank, delay, where, seed=seed)
    an = analysed(tmp_path, _without_collective_identity(progs))
    assert set(an.instances["source"]) == {"kernel-order"} and an.instances["matched"].all()
    assert any("order on each rank" in w for w in an.warnings)
    assert not any("carry no collective identity" in w for w in an.warnings)
    st = an.stragglers.set_index("rank")
    assert st.loc[late_rank, "straggler"] and st["straggler"].sum() == 1, st
    ulp = 0.01 * len(arrivals) * world
    for r in range(world):
        if r != late_rank:
            suffered = sum(a[late_rank] - a[r] for a in arrivals.values())
            assert st.loc[r, "suffered_wait_us"] == pytest.approx(suffered, abs=ulp)


def test_kernels_in_different_orders_on_two_ranks_are_not_paired(tmp_path):
    """Without identity, an order that differs between ranks (in the first step rank 0 runs collective B then
    the all-reduce, rank 1 the all-reduce then B) must not turn into sync wait between kernels that did not
    meet: the overlap test leaves such pairs unmatched, and the other steps still match."""
    progs, _ = lockstep(2, None, 0.0, "host", steps=2, per_step=2, seed=3)
    progs = _without_collective_identity(progs)
    first = {}
    for r, p in enumerate(progs):
        first[r] = [e for e in p.tr["doc"]["traceEvents"] if e.get("name") == AR and e.get("cat") == "kernel"][:2]
    first[0][0]["name"] = first[1][1]["name"] = "ncclDevKernel_Broadcast_RING_LL"
    an = analysed(tmp_path, progs)
    inst = an.instances
    swapped = inst["key"].str.startswith("order:0:")
    assert swapped.sum() == 2 and not inst.loc[swapped, "matched"].any(), inst
    assert inst.loc[~swapped, "matched"].all() and (~swapped).sum() == 2
    assert an.summary["rows"]["sync_wait"] < 5.0  # jitter only: nobody was late


def test_with_no_collective_matched_sync_wait_is_not_measured_never_zero(tmp_path):
    """Communication kernels that no rule identifies (here named by a user pattern, so no NCCL order either)
    leave nothing to wait at: sync wait reads "not measured" with what to record, not 0.0, and the rows the
    document keeps still add up to the E2E above them."""
    from taxes.documents.analysis_document import analysis_document

    progs, _ = lockstep(2, 1, 200.0, "host", seed=5)
    progs = _without_collective_identity(progs)
    for p in progs:
        for e in p.tr["doc"]["traceEvents"]:
            if e.get("name") == AR:
                e["name"] = "late_comm_kernel"
    paths = [write_trace(p.tr, tmp_path / f"rank{r}.json") for r, p in enumerate(progs)]
    an = A.analyze(paths, comm_patterns=("late_comm",))
    assert "sync_wait" in an.not_measured and "identity" in an.not_measured["sync_wait"]
    doc = analysis_document(an)
    var = doc["cases"][0]["variants"][0]
    assert not any(c["name"] == "sync_wait" for c in var["components"])
    overall = [c["value_us"] for c in var["components"] if c["rank"] is None]
    assert sum(overall) == pytest.approx(var["attributed_e2e_us"], rel=1e-3)
    assert "sync_wait" in var["not_measured"]


def test_identified_collectives_keep_sync_wait_measured(tmp_path):
    progs, _ = lockstep(2, 1, 200.0, "host", seed=5)
    an = analysed(tmp_path, _without_collective_identity(progs))
    assert "sync_wait" not in an.not_measured and an.summary["rows"]["sync_wait"] > 100.0
