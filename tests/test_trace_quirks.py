"""A recorder's quirks are repaired, never refused: exact copies dropped, the first of conflicting records kept,
graph replays whose launch was not recorded attached as replays, and one warning line per rank saying what
was dropped and how much device time it held (taxes/traces/checks.py). Generated traces plant each quirk,
so the repaired analysis must equal the clean trace's.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
from _analyze_data import tp_rank_trace
from _util import assert_one_line
from kineto_build import MM, add_launch, add_op, write_trace

from taxes.attribution import analyze as A
from taxes.errors import TaxesError

QUIRK = "the recorder's duplicate or dangling records"


def with_runtime_calls(rank: int) -> dict:
    """The tensor-parallel trace plus, in each step, the calls real traces were refused for: a copy
    (cudaMemcpyAsync and its memcpy), cudaFuncSetAttribute, cudaPeekAtLastError, an aten::zeros op."""
    tr = tp_rank_trace(rank, 2)
    for i in range(3):
        t = 300.0 * i
        add_op(tr, "aten::zeros", t + 15, t + 17)
        add_launch(tr, t + 15.5, [("Memcpy HtoD (Pageable -> Device)", 7, t + 61.0, t + 63.0)], api="cudaMemcpyAsync",
                   dur=1.0)
        add_launch(tr, t + 17.5, [], api="cudaFuncSetAttribute", dur=0.5)
        add_launch(tr, t + 18.25, [], api="cudaPeekAtLastError", dur=0.125)
    return tr


def analysed(tmp_path, docs: list[dict]):
    return A.analyze([write_trace(d, tmp_path / f"rank{r}.json.gz") for r, d in enumerate(docs)])


def same_rows(a, b) -> None:
    cols = ["rank", "step", "span_us", "compute", "launch", "host_bound", "sync_wait", "exposed_transfer", "unattributed"]
    np.testing.assert_allclose(a.decomposition[cols].to_numpy(float), b.decomposition[cols].to_numpy(float),
                               rtol=0, atol=1e-6)
    assert a.summary["e2e_us"] == pytest.approx(b.summary["e2e_us"], abs=1e-6)


def quirk_lines(an) -> list[str]:
    return [w for w in an.warnings if QUIRK in w]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_exact_copies_are_dropped_and_their_device_time_said(tmp_path, seed):
    """Random events of the trace written twice, at random places: the analysis equals the clean one, and one
    line per rank counts the copies and the device time they held."""
    clean = [with_runtime_calls(r) for r in range(2)]
    base = analysed(tmp_path / "clean", clean)
    rnd = random.Random(seed)
    quirky, planted = copy.deepcopy(clean), {}
    for r, tr in enumerate(quirky):
        ev = tr["doc"]["traceEvents"]
        complete = [e for e in ev if e.get("ph") == "X"]
        dup = rnd.sample(complete, 12) + [e for e in complete if e["name"] in
                                          ("cudaMemcpyAsync", "cudaFuncSetAttribute", "cudaPeekAtLastError", "aten::zeros")][:4]
        for e in dup:
            ev.insert(rnd.randrange(len(ev) + 1), dict(e))
        planted[r] = (len(dup), sum(e["dur"] for e in dup if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")))
    an = analysed(tmp_path / "quirky", quirky)
    same_rows(an, base)
    lines = quirk_lines(an)
    assert len(lines) == 2, an.warnings
    for r, (n, device_us) in planted.items():
        line = next(w for w in lines if w.startswith(f"rank {r}:"))
        assert_one_line(line)
        assert f"dropped {n} events listed twice ({device_us:,.1f} us of device time)" in line, (line, n, device_us)


def test_calls_in_one_microsecond_are_two_calls(tmp_path):
    """Two calls that differ only in their ids (whole-microsecond timestamps put them at one instant) are both
    kept: no repair, no warning (public traces were refused for this: cudaPeekAtLastError, aten::zeros)."""
    tr = with_runtime_calls(0)
    add_launch(tr, 200.0, [], api="cudaPeekAtLastError", dur=0.0)
    add_launch(tr, 200.0, [], api="cudaPeekAtLastError", dur=0.0)
    add_op(tr, "aten::zeros", 201.0, 203.0)
    add_op(tr, "aten::zeros", 201.0, 203.0)
    an = analysed(tmp_path, [tr, with_runtime_calls(1)])
    assert not quirk_lines(an), an.warnings


def _later_copy(match):
    def mutate(ev):
        first = next(e for e in ev if match(e))
        ev.append(dict(first, ts=first["ts"] + 5000.0))  # the same ids, later: a merged or tampered trace
        return first
    return mutate


@pytest.mark.parametrize("what,mutate,words,device", [
    ("a kernel", _later_copy(lambda e: e.get("cat") == "kernel" and e["name"] == MM),
     "dropped 1 GPU activities reusing a launched activity's correlation id", True),
    ("a launch call", _later_copy(lambda e: e.get("cat") == "cuda_runtime" and e["name"] == "cudaLaunchKernel"),
     "dropped 1 CUDA API calls reusing an earlier call's correlation id", False),
    ("a flow start", _later_copy(lambda e: e.get("ph") == "s"), "dropped 1 launch flows started again elsewhere", False),
])
def test_the_first_of_conflicting_records_is_kept(tmp_path, what, mutate, words, device):
    """Before: refused ("correlation id ... is on 2 GPU activities", "... on 2 CUDA API calls", "flow id ...
    starts twice"); a kept copy stretched E2E (3,778 -> 6,129 us). Now the later record is dropped and the
    analysis equals the clean one."""
    clean = [with_runtime_calls(r) for r in range(2)]
    base = analysed(tmp_path / "clean", clean)
    quirky = copy.deepcopy(clean)
    dropped = mutate(quirky[1]["doc"]["traceEvents"])
    an = analysed(tmp_path / "quirky", quirky)
    same_rows(an, base)
    (line,) = quirk_lines(an)
    assert line.startswith("rank 1:") and words in line, line
    if device:
        assert f"({dropped['dur']:,.1f} us of device time)" in line


def test_a_graph_replay_whose_launch_was_not_recorded_is_attached(tmp_path):
    """Before: "correlation id ... is on 4 GPU activities but on no CUDA graph launch", exit 2 (an A100
    CUDA-graph trace). The replay was launched before recording began: its activities share one id and no
    host call carries it. They are attached as one replay, charged to no step, and the steps are as
    without them; one line says so with their device time."""
    clean = [with_runtime_calls(r) for r in range(2)]
    base = analysed(tmp_path / "clean", clean)
    quirky = copy.deepcopy(clean)
    replay = [("Memset (Unknown)", 7, -80.0, -79.0), ("Memset (Unknown)", 7, -78.5, -77.0), (MM, 7, -76.0, -40.0),
              ("Memset (Unknown)", 7, -39.5, -39.0)]
    corr = add_launch(quirky[0], -100.0, replay, record_call=False, flows=False)
    an = analysed(tmp_path / "quirky", quirky)
    same_rows(an, base)
    (line,) = quirk_lines(an)
    held = sum(b - a for _, _, a, b in replay)
    assert line.startswith("rank 0:") and f"attached 4 GPU activities of 1 CUDA graph replay(s) whose launch was not recorded" \
        in line and f"({held:,.1f} us of device time)" in line, line
    acts = an.timelines[0].activities
    mine = acts[acts["correlation"] == corr]
    assert len(mine) == 4 and (mine["graph"] == corr).all() and (mine["step"] < 0).all()


def test_what_cannot_be_analysed_is_still_refused_in_one_line(tmp_path):
    tr = with_runtime_calls(0)
    tr["doc"]["traceEvents"] = [e for e in tr["doc"]["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy")]
    path = write_trace(tr, tmp_path / "rank0.json")
    with pytest.raises(TaxesError, match="no GPU activity") as e:
        A.analyze([path])
    assert_one_line(str(e.value))


@pytest.mark.parametrize("cat,words", [("cuda_profiler_range", "counter ranges"),
                                       ("mtia_ccp_events", "another accelerator's")])
def test_a_trace_of_another_recorders_device_events_is_refused_saying_what_they_are(tmp_path, cat, words):
    """CUPTI's counter ranges (kernels replayed one by one) and another accelerator's events hold no GPU
    timeline: refused in one line that names them, so the user knows what to record instead."""
    tr = with_runtime_calls(0)
    events = tr["doc"]["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
    tr["doc"]["traceEvents"] = [e for e in events if e not in kernels] + [{**e, "cat": cat} for e in kernels]
    path = write_trace(tr, tmp_path / "rank0.json")
    with pytest.raises(TaxesError, match="no GPU activity") as e:
        A.analyze([path])
    assert_one_line(str(e.value))
    assert f"its {len(kernels)} {cat} events are" in str(e.value) and words in str(e.value), str(e.value)
