"""Cross-check `taxes analyze` against Holistic Trace Analysis (HTA) on the same traces.

Runs when HTA imports (`pip install holistictraceanalysis psutil`; it is not a dependency of taxes) and
skips otherwise. Where both tools compute the same quantity with the same definition they must agree
to 1 ns; where the definitions differ, the test checks the stated relation instead (docs/analyze.md,
"Cross-check with HTA").
"""

from __future__ import annotations

import logging
import math

import pytest
from _analyze_data import REAL_PATHS, needs_real, write_tp
from kineto_build import AR, MM, add_launch, add_step, new_trace, write_trace

from taxes.attribution import analyze as A
from taxes.traces import kineto

pytest.importorskip("hta.trace_analysis", reason="HTA (holistictraceanalysis, with psutil) is not installed")

pytestmark = pytest.mark.filterwarnings("ignore:::hta")  # HTA's own pandas deprecation warnings
AGREE_US = 1e-3  # same definition, same events: only float rounding may differ


def hta(paths, rounding: bool, monkeypatch):
    """HTA's TraceAnalysis over {rank: path}, every step included, no plots, in this process."""
    import hta.common.trace as hta_trace

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "0" if rounding else "1")
    # HTA 0.5.0 stores event indices in a column typed after the correlation ids (downcast to int8 or
    # int16 when the ids are small); pandas 3 refuses the lossy write HTA then makes. Widen first.
    original = hta_trace.transform_correlation_to_index

    def widened(df, symbol_table):
        if "correlation" in df.columns:
            df["correlation"] = df["correlation"].astype("int64")
        return original(df, symbol_table)

    monkeypatch.setattr(hta_trace, "transform_correlation_to_index", widened)
    logging.getLogger("hta").setLevel(logging.ERROR)
    files = {kineto.load_trace(p).attrs["trace"]["rank"]: str(p) for p in paths}
    t = hta_trace.Trace(trace_files=files, trace_dir="")
    t.load_traces(include_last_profiler_step=True, use_multiprocessing=False)
    # HTA counts every event with a stream as GPU time; GPU-side annotations and sync records are not
    # activities (taxes leaves them out), so compare like with like.
    ids = t.symbol_table.get_sym_id_map()
    drop = [ids[c] for c in ("gpu_user_annotation", "cuda_sync") if c in ids]
    for r, df in t.traces.items():
        t.traces[r] = df[~df["cat"].isin(drop)]
    return t


def hta_figures(t) -> dict[int, dict[str, float]]:
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.analyzers.communication_analysis import CommunicationAnalysis

    temporal = BreakdownAnalysis.get_temporal_breakdown(t, visualize=False).set_index("rank")
    overlap = CommunicationAnalysis.get_comm_comp_overlap(t, visualize=False).set_index("rank")
    _, kernels = BreakdownAnalysis.get_gpu_kernel_breakdown(t, visualize=False, num_kernels=10**6, duration_ratio=1.0)
    comm = kernels[kernels["kernel_type"] == "COMMUNICATION"].groupby("rank")["sum (us)"].sum()
    return {int(r): {"span_us": float(temporal.loc[r, "kernel_time(us)"]), "idle_us": float(temporal.loc[r, "idle_time(us)"]),
                     "non_compute_us": float(temporal.loc[r, "non_compute_time(us)"]),
                     "overlap_pct": float(overlap.loc[r, "comp_comm_overlap_pctg"]), "comm_sum_us": float(comm.get(r, 0.0))}
            for r in temporal.index}


def ours(an: A.Analysis) -> dict[int, dict[str, float]]:
    """The same quantities from taxes' activities, over HTA's span (first to last GPU activity)."""
    out = {}
    for r in an.ranks:
        acts = an.timelines[r].activities
        f = A.timeline_figures(acts)
        f["overlap_pct"] = 100 * f["overlap_us"] / f["comm_us"] if f["comm_us"] else math.nan
        comm = acts[acts["comm"] != ""]
        f["comm_sum_us"] = float((comm["end_us"] - comm["start_us"]).sum())
        out[r] = f
    return out


@pytest.fixture
def synthetic(tmp_path):
    paths = write_tp(tmp_path, late_s=40.0)
    return paths, A.analyze(paths)


def test_same_definitions_agree_without_hta_rounding(synthetic, monkeypatch):
    paths, an = synthetic
    theirs, mine = hta_figures(hta(paths, False, monkeypatch)), ours(an)
    assert sorted(theirs) == sorted(mine) == [0, 1]
    for r in mine:
        for key in ("span_us", "idle_us", "comm_sum_us"):
            assert theirs[r][key] == pytest.approx(mine[r][key], abs=AGREE_US), (r, key)
        # HTA's non-compute time is time with only non-compute kernels running: exposed communication
        # when, as here, no memcpy/memset runs alone.
        assert theirs[r]["non_compute_us"] == pytest.approx(mine[r]["exposed_comm_us"], abs=AGREE_US)
        assert theirs[r]["overlap_pct"] == pytest.approx(mine[r]["overlap_pct"], abs=0.006)  # HTA rounds to 0.01


def test_hta_rounding_moves_idle_by_at_most_its_bound(synthetic, monkeypatch):
    """HTA rounds float timestamps to whole us (start up, end down): each activity loses under 2 us, so
    HTA's idle exceeds ours by at most 2 us per activity and falls short by at most 2 us (the span)."""
    paths, an = synthetic
    theirs, mine = hta_figures(hta(paths, True, monkeypatch)), ours(an)
    for r in mine:
        n = len(an.timelines[r].activities)
        diff = theirs[r]["idle_us"] - mine[r]["idle_us"]
        assert -2.0 <= diff <= 2.0 * n, (r, diff, n)
        assert diff > 0  # the traces' fractional-us kernels do lose time to the rounding


def test_our_idle_is_htas_plus_the_window_edges(synthetic):
    """Our idle (span - busy, summed over steps) covers each step's window, from the host's ProfilerStep
    start; HTA's covers first to last kernel. With all kernels inside the windows the difference is
    exactly the two edges, less the time between steps (in no window)."""
    _, an = synthetic
    mine = ours(an)
    d = an.decomposition
    for r in an.ranks:
        dr, acts = d[d["rank"] == r], an.timelines[r].activities
        idle = (dr["span_us"] - dr["busy_us"]).sum()
        edges = (acts["start_us"].min() - dr["start_us"].min()) + (dr["end_us"].max() - acts["end_us"].max())
        between = (dr["start_us"].to_numpy()[1:] - dr["end_us"].to_numpy()[:-1]).sum()
        assert between > 0  # the synthetic host steps leave 10 us between them
        assert idle == pytest.approx(mine[r]["idle_us"] + edges - between, abs=AGREE_US)


def _single_stream(tmp_path):
    """One stream, no graph: HTA's per-stream gaps are then our union gaps."""
    tr = new_trace(0, 1)
    t = 0.0
    for s in range(3):
        add_step(tr, s, t, t + 100.0)
        add_launch(tr, t + 1.0, [(MM, 7, t + 5.5, t + 20.25)])
        add_launch(tr, t + 2.0, [(AR, 7, t + 21.0, t + 40.0)])  # launched early: the 0.75 us gap is 'other'
        add_launch(tr, t + 55.0, [(MM, 7, t + 58.125, t + 70.0)])  # launched late: 'launch'
        t += 100.0
    return [write_trace(tr, tmp_path / "rank0.json.gz")]


def test_idle_causes_match_htas_host_wait_on_one_stream(tmp_path, monkeypatch):
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis

    paths = _single_stream(tmp_path)
    an = A.analyze(paths)
    t = hta(paths, False, monkeypatch)
    idle, _ = BreakdownAnalysis.get_idle_time_breakdown(t, consecutive_kernel_delay=30, rank=0, visualize=False)
    theirs = idle.groupby("idle_category")["idle_time"].sum()
    g = an.gaps
    acts = an.timelines[0].activities
    inner = g[(g["start_us"] >= acts["start_us"].min()) & (g["end_us"] <= acts["end_us"].max())]
    mine = inner.groupby("cause")["dur_us"].sum()
    # HTA's host_wait: the device waited on the host (our launch path and host-bound time, and the tail of
    # each step's window, unknown for us: nothing of that step follows it, while HTA charges it to the
    # next step's kernel, launched late); its kernel wait and other: issued in time (our queued)
    ours_host = mine.get("launch", 0.0) + mine.get("host", 0.0) + mine.get("unknown", 0.0)
    assert theirs.get("host_wait", 0.0) == pytest.approx(ours_host, abs=0.01)  # HTA rounds to 0.01
    assert theirs.get("kernel_wait", 0.0) + theirs.get("other", 0.0) == pytest.approx(mine.get("queued", 0.0), abs=0.01)


@needs_real
def test_real_traces_agree_where_definitions_match(monkeypatch):
    """Over the activities HTA keeps, against ours. HTA 0.5.0 means to keep those launched up to the end
    of the last ProfilerStep, but compares realigned launch times with a step end it did not realign,
    so it keeps every activity whose launch call is in the trace (and drops those without one)."""
    t = hta(REAL_PATHS, False, monkeypatch)
    theirs = hta_figures(t)
    an = A.analyze(REAL_PATHS)
    for r in an.ranks:
        tl = an.timelines[r]
        kept = tl.activities[tl.extra["launch_us"].notna().values]
        f = A.timeline_figures(kept)
        assert theirs[r]["span_us"] == pytest.approx(f["span_us"], abs=AGREE_US)
        assert theirs[r]["idle_us"] == pytest.approx(f["idle_us"], rel=1e-6, abs=AGREE_US)
        comm = kept[kept["comm"] != ""]
        assert theirs[r]["comm_sum_us"] == pytest.approx((comm["end_us"] - comm["start_us"]).sum(), rel=1e-6, abs=AGREE_US)
