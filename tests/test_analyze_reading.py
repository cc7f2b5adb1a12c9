"""`taxes analyze` reading Kineto traces: plain and gzip, streaming, timestamps, malformed files, and the
ranks of a job (rank, world, clock offsets, refusals).

Synthetic traces are built event by event (tests/kineto_build.py), so every expected number follows from
the construction.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from _analyze_data import BAD_TRACES, DATA, assert_closure, row, tp_rank_trace, write_tp
from _util import assert_one_line
from hypothesis import given, settings
from hypothesis import strategies as st
from kineto_build import AG, T0, new_trace, write_trace

from taxes.attribution import analyze as A
from taxes.traces import kineto
from taxes.attribution.attribute import ROWS
from taxes.errors import TaxesError


# ---- reading traces ---------------------------------------------------------------------------------


def test_plain_and_gzip_traces_load_the_same(tmp_path):
    import pandas as pd

    tr = tp_rank_trace(0)
    plain = kineto.load_trace(write_trace(tr, tmp_path / "a.json"))
    gz = kineto.load_trace(write_trace(tr, tmp_path / "b.json.gz"))
    odd_name = kineto.load_trace(write_trace(tr, tmp_path / "c.trace", gz=True))  # gzip told by content, not name
    pd.testing.assert_frame_equal(plain, gz)
    pd.testing.assert_frame_equal(plain, odd_name)
    assert plain.attrs["trace"]["rank"] == 0 and plain.attrs["trace"]["world_size"] == 2
    assert plain.attrs["trace"]["nccl_version"] == "2.21.5" and plain.attrs["trace"]["cuda_version"] == "12.8"


def test_streaming_reads_what_json_reads(tmp_path, monkeypatch):
    """Chunks far smaller than an event: the reader refills mid-value and mid-number and still agrees
    with json.loads on every kept event; keys after traceEvents are read too."""
    from taxes.traces import stream as tracestream

    tr = tp_rank_trace(1, steps=2)
    tr["doc"]["traceName"] = "after the events"
    path = write_trace(tr, tmp_path / "r.json")
    whole = kineto.load_trace(path)
    monkeypatch.setattr(tracestream, "CHUNK_BYTES", 7)
    small = kineto.load_trace(path)
    import pandas as pd

    pd.testing.assert_frame_equal(whole, small)
    kept = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") in ("X", "s", "f") and e.get("cat")]
    assert len(whole) == len(kept)
    s = tracestream.TraceStream(path, 1 << 30)
    list(s.events())
    assert s.meta["traceName"] == "after the events" and s.meta["distributedInfo"]["rank"] == 1


def test_sub_microsecond_times_are_kept(tmp_path):
    an = A.analyze([write_trace(tp_rank_trace(0, world=1, steps=1), tmp_path / "rank0.json")])
    acts = an.timelines[0].activities
    ag = acts[acts["name"] == AG].iloc[0]
    assert ag["start_us"] - T0 == pytest.approx(10.5, abs=1e-6)
    assert ag["end_us"] - ag["start_us"] == pytest.approx(19.75, abs=1e-9)


def _absolute(doc: dict, origin: str) -> bytes:
    """The same trace with absolute epoch timestamps written with ns digits (old Kineto's form)."""
    import copy
    from decimal import Decimal

    doc = copy.deepcopy(doc)
    doc.pop("baseTimeNanoseconds")
    for e in doc["traceEvents"]:
        e["ts"] = f"@{Decimal(origin) + Decimal(repr(e['ts'])) - Decimal(repr(T0)):.3f}@"
    return json.dumps(doc).replace('"@', "").replace('@"', "").encode()


def test_absolute_timestamps_keep_their_nanoseconds(tmp_path):
    tr = tp_rank_trace(0, world=1, steps=2)
    rel = A.analyze([write_trace(tr, tmp_path / "rel" / "rank0.json")])
    path = tmp_path / "abs" / "rank0.json"
    path.parent.mkdir()
    path.write_bytes(_absolute(tr["doc"], "1790857026123456.789"))
    ab = A.analyze([path])
    assert ab.info[0]["origin_us"] > 0
    cols = ["span_us"] + list(ROWS)
    np.testing.assert_allclose(ab.decomposition[cols], rel.decomposition[cols], atol=2e-6)


@pytest.mark.parametrize("name", sorted(BAD_TRACES))
def test_malformed_traces_are_one_line_errors(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(BAD_TRACES[name])
    with pytest.raises(TaxesError) as e:
        A.analyze([path])
    assert_one_line(str(e.value))


def test_odd_pid_and_tid_values_are_names(tmp_path):
    path = tmp_path / "odd.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": [1], "tid": {}}]}')
    an = A.analyze([path])
    assert row(an, 0, 0)["span_us"] == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(cut=st.floats(0.0, 0.999))
def test_truncated_files_are_one_line_errors(tmp_path_factory, cut):
    tmp = tmp_path_factory.mktemp("cut")
    data = json.dumps(tp_rank_trace(0, steps=1)["doc"]).encode()
    for name, blob in (("t.json", data), ("t.json.gz", gzip.compress(data))):
        path = tmp / name
        path.write_bytes(blob[: int(len(blob) * cut)])
        with pytest.raises(TaxesError) as e:
            kineto.load_trace(path)
        assert_one_line(str(e.value))


def test_unreadable_paths_and_the_size_limit(tmp_path, monkeypatch):
    for path, words in ((tmp_path / "missing.json", "no such file"), (tmp_path, "a directory")):
        with pytest.raises(TaxesError, match=words) as e:
            kineto.load_trace(path)
        assert_one_line(str(e.value))
    big = write_trace(tp_rank_trace(0), tmp_path / "big.json.gz")
    monkeypatch.setattr(kineto, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(TaxesError, match="larger than"):
        kineto.load_trace(big)


# ---- ranks and jobs ----------------------------------------------------------------------------------


def test_rank_comes_from_distributed_info_then_the_file_name(tmp_path):
    named = write_trace(tp_rank_trace(1), tmp_path / "rank5.json")
    assert kineto.load_trace(named).attrs["trace"]["rank"] == 1
    for fname, rank in (("rank3.json", 3), ("trainer_Rank-7.pt.trace.json.gz", 7), ("trace.json", None)):
        tr = tp_rank_trace(0)
        del tr["doc"]["distributedInfo"]
        assert kineto.load_trace(write_trace(tr, tmp_path / fname)).attrs["trace"]["rank"] == rank


def test_rank_conflicts_are_one_line_errors(tmp_path):
    a = write_trace(tp_rank_trace(0), tmp_path / "a" / "rank0.json")
    b = write_trace(tp_rank_trace(0), tmp_path / "b" / "rank0.json")
    with pytest.raises(TaxesError, match="rank 0 again"):
        A.analyze([a, b])
    anon = []
    for name in ("x.json", "y.json"):
        tr = tp_rank_trace(0)
        del tr["doc"]["distributedInfo"]
        anon.append(write_trace(tr, tmp_path / name))
    with pytest.raises(TaxesError, match="cannot tell its rank") as e:
        A.analyze(anon)
    assert_one_line(str(e.value))
    assert A.analyze(anon[:1]).ranks == {0: str(anon[0])}


def test_traces_of_different_jobs_are_refused(tmp_path):
    ok = write_tp(tmp_path / "ok")
    other_world = write_trace(tp_rank_trace(1, world=8), tmp_path / "w8" / "rank1.json")
    with pytest.raises(TaxesError, match="different world sizes") as e:
        A.analyze([ok[0], other_world])
    assert_one_line(str(e.value))
    other_gpu = write_trace(tp_rank_trace(1, gpu="NVIDIA A100-SXM4-80GB"), tmp_path / "a100" / "rank1.json")
    with pytest.raises(TaxesError, match="different GPUs"):
        A.analyze([ok[0], other_gpu])
    later = write_trace(tp_rank_trace(1, base_ns=new_trace()["doc"]["baseTimeNanoseconds"] + 3_600 * 10**9),
                        tmp_path / "later" / "rank1.json")
    with pytest.raises(TaxesError, match="never overlaps"):
        A.analyze([ok[0], later])


@pytest.mark.parametrize("given_rank", [0, 1])
def test_a_missing_rank_is_a_warning_not_a_crash(tmp_path, given_rank):
    path = write_trace(tp_rank_trace(given_rank), tmp_path / f"rank{given_rank}.json")
    an = A.analyze([path])
    assert list(an.ranks) == [given_rank] and an.world_size == 2
    assert any(f"rank(s) {1 - given_rank} of world 2 are missing" in w for w in an.warnings)
    assert (an.collectives["wait_us"] == 0).all()
    assert_closure(an)


def test_clock_offsets_put_ranks_on_one_clock(tmp_path):
    shift_us = 1234.5
    t0 = tp_rank_trace(0, late_s=0.0)
    t1 = tp_rank_trace(1, late_s=0.0, base_ns=new_trace()["doc"]["baseTimeNanoseconds"] - int(shift_us * 1000))
    for e in t1["doc"]["traceEvents"]:
        e["ts"] = e["ts"] + shift_us
    an = A.analyze([write_trace(t0, tmp_path / "rank0.json"), write_trace(t1, tmp_path / "rank1.json")])
    assert an.instances["matched"].all()
    assert an.instances["skew_us"].abs().max() < 1e-6
    assert an.collectives["wait_us"].abs().max() < 1e-9


def test_parallel_and_serial_parsing_agree(tmp_path):
    paths = write_tp(tmp_path)
    a, b = A.analyze(paths, jobs=1), A.analyze(paths, jobs=2)
    import pandas as pd

    pd.testing.assert_frame_equal(a.decomposition, b.decomposition)


def test_cpu_only_traces_are_refused_in_one_line():
    paths = sorted((DATA / "cpu").glob("rank*.json.gz"))
    assert len(paths) == 2
    ev = kineto.load_trace(paths[0])
    assert ev.attrs["trace"]["backend"] == "gloo" and list(kineto.profiler_steps(ev)["step"]) == [2, 3, 4, 5]
    with pytest.raises(TaxesError, match="no GPU activity") as e:
        A.analyze(paths)
    assert_one_line(str(e.value))
