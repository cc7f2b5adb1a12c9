"""Synthetic and real Kineto traces shared by the `taxes analyze` tests.

Synthetic traces are built event by event (tests/kineto_build.py), so every expected number follows from
the construction. Real traces (tests/data/traces) must still analyse.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kineto_build import AG, AR, MM, TRITON, add_launch, add_op, add_step, new_trace, write_trace

from taxes.attribution.attribute import ROWS


DATA = Path(__file__).parent / "data" / "traces"
REAL_PATHS = sorted((DATA / "real").glob("rank*.json.gz"))


def tp_rank_trace(rank: int, world: int = 2, steps: int = 3, late_s: float = 40.0, **kw) -> dict:
    """A tensor-parallel step per 300 us: all-gather -> matmul -> Triton kernel (outside any op) -> matmul ->
    all-reduce on stream 7 while a matmul runs on stream 20 -> graph replay (matmul + all-reduce). In odd
    steps the last rank launches its all-reduce late_s us late (a host sleep inside `skew_sleep`)."""
    tr = new_trace(rank, world, **kw)
    for i in range(steps):
        t = 300.0 * i
        add_step(tr, 10 + i, t, t + 290.0)
        late = late_s if i % 2 == 1 else 0.0
        mine = late if rank == world - 1 else 0.0
        wait = late if rank != world - 1 else 0.0
        add_op(tr, "c10d::_allgather_base_", t + 1, t + 8, [[256, 128], [128, 128]], ["c10::BFloat16", "c10::BFloat16"])
        add_op(tr, "record_param_comms", t + 1.5, t + 7, args={"Collective name": "_allgather_base",
                                                               "Process Group Name": "0", "Seq": 2 * i})
        add_launch(tr, t + 2.125, [(AG, 7, t + 10.5, t + 30.25)], api="cudaLaunchKernelExC")
        add_op(tr, "aten::mm", t + 9, t + 14, [[256, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"])
        add_launch(tr, t + 10, [(MM, 7, t + 30.25, t + 60.0)])
        add_launch(tr, t + 70.0, [(TRITON, 7, t + 75.0, t + 85.0)], api="cuLaunchKernel")
        add_op(tr, "aten::mm", t + 86, t + 90, [[256, 256], [256, 128]], ["c10::BFloat16", "c10::BFloat16"])
        add_launch(tr, t + 87, [(MM, 7, t + 92.0, t + 120.0)])
        if mine:
            add_op(tr, "skew_sleep", t + 91, t + 91 + mine)
        ar0 = t + 121.0 + mine
        add_op(tr, "c10d::allreduce_", ar0 - 1, ar0 + 3, [[[256, 128]]], ["TensorList"])
        add_op(tr, "record_param_comms", ar0 - 0.75, ar0 + 2, args={"Collective name": "allreduce",
                                                                    "Process Group Name": "0", "Seq": 2 * i + 1})
        add_launch(tr, ar0 - 0.5, [(AR, 7, ar0 + 0.5, ar0 + 20.5 + wait)], api="cudaLaunchKernelExC")
        add_op(tr, "aten::mm", ar0 + 4, ar0 + 8, [[128, 128], [128, 128]], ["c10::BFloat16", "c10::BFloat16"])
        add_launch(tr, ar0 + 5, [(MM, 20, ar0 + 6.0, ar0 + 16.0)])
        g0 = ar0 + 21.0 + wait
        add_launch(tr, ar0 + 9, [(MM, 7, g0, g0 + 15.0), (AR, 7, g0 + 15.75, g0 + 30.75)], api="cudaGraphLaunch")
    return tr


def write_tp(tmp_path: Path, world: int = 2, **kw) -> list[Path]:
    return [write_trace(tp_rank_trace(r, world, **kw), tmp_path / f"rank{r}.json.gz") for r in range(world)]


def row(an, rank, step):
    d = an.decomposition
    return d[(d["rank"] == rank) & (d["step"] == step)].iloc[0]


def assert_closure(an) -> None:
    d = an.decomposition
    np.testing.assert_allclose(d[list(ROWS)].sum(axis=1), d["span_us"], rtol=1e-9, atol=1e-6)


BAD_TRACES = {
    "empty.json": b"",
    "text.json": b"this is not json",
    "cut.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel"',
    "no_events.json": b'{"schemaVersion": 1}',
    "events_not_list.json": b'{"traceEvents": 5}',
    "scalar.json": b"42",
    "event_not_object.json": b"[1, 2]",
    "ts_string.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "1.5", "dur": 1}]}',
    "no_dur.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5}]}',
    "negative_dur.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": -2}]}',
    "bool_ts.json": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "k", "ts": true, "dur": 1}]}',
    "nan.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": NaN, "dur": 1}]}',
    "args_list.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": []}]}',
    "name_number.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": 7, "ts": 1, "dur": 1}]}',
    "latin1.json": '{"traceEvents": [{"name": "\u00e9"}]}'.encode("latin-1"),
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "deep_event.json": b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
    "bad.json.gz": b"\x1f\x8b\x08\x00 definitely not deflate data",
    "huge_int.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1' + b"0" * 400 + b', "dur": 1}]}',
    "giant_int.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1' + b"0" * 5000 + b', "dur": 1}]}',
    "devices_number.json": b'{"deviceProperties": 3, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": -1e400, "dur": 1}]}',
    "line\nbreak.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\\nx\\u0007", "ts": null, "dur": 1}]}',
    "trailing.json": b'{"traceEvents": []} {"more": 1}',
}


# ---- real traces (docs/record_traces.py on 2 x H200) -------------------------------------------------


needs_real = pytest.mark.skipif(len(REAL_PATHS) < 2, reason="no real traces in tests/data/traces/real")
