"""`taxes trace -- PROGRAM`: the program runs unchanged, its steps are found from outside (optimizer.step(),
taxes.step(), an NVTX range), some are timed without the profiler, the next ones profiled with step marks.
On the CPU the traces hold no GPU activity, so the analysis is refused in one line; the recording is what
these tests check (tests/test_analyze*.py check the analysis)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

PROGRAM = """
import subprocess, sys, torch, taxes
m = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
# a child process of the program's own (like a compile worker): it loads the hook, sees no step, says nothing
subprocess.run([sys.executable, "-c", "import torch"], check=True)
for i in range({n}):
    m(torch.randn(4, 32)).sum().backward()
    opt.step()
print("done", flush=True)
"""


def _trace(tmp_path, body: str, *args: str):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "taxes.cli.main", "trace", "--out", str(out), *args, "--", sys.executable,
                        str(prog)], capture_output=True, text=True, timeout=300)
    return r, out


def test_steps_are_found_timed_plain_then_profiled_with_marks(tmp_path):
    r, out = _trace(tmp_path, PROGRAM.format(n=20), "--steps", "3", "--plain", "4", "--skip", "2")
    assert "done" in r.stdout  # the program ran to its end
    plain = json.loads((out / "plain_rank0.json").read_text())
    assert plain["steps_seen"] == 2 + 4 + 1 + 3 and len(plain["plain_step_us"]) == 4
    assert all(x > 0 for x in plain["plain_step_us"])
    trace = json.loads(gzip.decompress((out / "rank0.json.gz").read_bytes()))
    marks = sorted(e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert marks == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert (out / "rank0.et.json.gz").exists()  # the execution trace (tensors by storage id), where analyze looks
    meta = {k: v for k, v in trace.items() if k != "traceEvents"}
    assert meta.get("torch_version") == torch.__version__  # the trace names what recorded it
    # no GPU: the analysis is refused in one line, after the recording
    assert r.returncode == 2 and "no GPU activity" in r.stderr and r.stderr.strip().splitlines()[-1].startswith("taxes: error")


def test_a_program_that_ends_before_the_profiled_steps_is_one_line(tmp_path):
    r, _ = _trace(tmp_path, PROGRAM.format(n=3), "--steps", "3", "--plain", "4", "--skip", "2")
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert "no profiled steps" in last and "saw 3 step(s)" in last


@pytest.mark.parametrize("argv,needle", [
    (["--", "no-such-program-here"], "no such program"),
    ([], "give the program"),
    (["--steps", "0", "--", sys.executable, "-c", "pass"], "--steps"),
    (["--step", "bogus", "--", sys.executable, "-c", "pass"], "--step"),
])
def test_bad_trace_input_is_one_line_and_exit_2(tmp_path, argv, needle):
    r = subprocess.run([sys.executable, "-m", "taxes.cli.main", "trace", "--out", str(tmp_path / "o"), *argv],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_trace_hands_its_plain_step_times_and_hardware_to_the_analysis(tmp_path, monkeypatch):
    """The recording is stood in for by a real 2-rank trace (tests/data/traces/real) and plain step times
    chosen here: the document must carry them as plain E2E (interquartile mean of the slowest rank per step)
    and the measurement cost as instrumented - plain."""
    import shutil
    from pathlib import Path

    from click.testing import CliRunner

    from taxes.run import trace as T
    from taxes.cli.main import cli

    real = Path(__file__).parent / "data" / "traces" / "real"
    out = tmp_path / "out"
    out.mkdir()
    traces = [str(shutil.copy(real / f"rank{r}.json.gz", out / f"rank{r}.json.gz")) for r in (0, 1)]
    plain = {0: [900.0, 1000.0, 1100.0, 1000.0], 1: [950.0, 1200.0, 1050.0, 1000.0]}
    monkeypatch.setattr(T, "run", lambda *a, **k: {"returncode": 0, "traces": traces, "plain": plain,
                                                   "steps_seen": {0: 9, 1: 9}})
    r = CliRunner().invoke(cli, ["trace", "--out", str(out), "--format", "json", "--hardware", "h100-sxm", "--",
                                 sys.executable, "-c", "pass"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "report.json").read_text())
    assert doc["metadata"]["hardware_profile"] == "h100-sxm"
    v = doc["cases"][0]["variants"][0]
    slowest = sorted(max(a, b) for a, b in zip(plain[0], plain[1]))  # 950, 1000, 1100, 1200
    iqm = sum(slowest[1:3]) / 2
    assert v["plain_e2e_us"] == pytest.approx(iqm)
    assert v["measurement_cost_us"] == pytest.approx(v["attributed_e2e_us"] - iqm)


def _timing_recording(spins_us, kernel_us=50.0, launches=4):
    """What a timing-mode recording holds (taxes.run.cupti.Recorder's frames and the step boundaries) for steps
    in which the host is elsewhere for spins_us[i] after the step begins, then launches `launches` kernels
    back to back (1 us calls; the first starts 4 us after its call, the rest queue behind it); the next
    step begins when the last kernel ends."""
    import pandas as pd

    acts, calls, bounds, t, corr = [], [], [], 0.0, 1
    for spin in spins_us:
        bounds.append(t)
        t += spin
        first = t + 4.0
        for i in range(launches):
            calls.append(("cudaLaunchKernel", "launch", t + i, t + i + 1.0, corr, 4321))
            acts.append(("gemm_kernel", "kernel", 7, first + i * kernel_us, first + (i + 1) * kernel_us, corr, -1, "", 0,
                         t + i + 0.2, t + i + 0.9))  # CUPTI's queued and submitted, inside the call
            corr += 1
        t = first + launches * kernel_us
    bounds.append(t)
    return (pd.DataFrame(acts, columns=["name", "kind", "stream", "start_us", "end_us", "correlation", "graph", "comm",
                                        "bytes", "queued_us", "submitted_us"]),
            pd.DataFrame(calls, columns=["name", "kind", "start_us", "end_us", "correlation", "tid"]), bounds)


@pytest.mark.parametrize("host_calls", ["recorded", "from queued times"])
def test_a_timing_recording_is_a_trace_analyze_reads_and_the_planted_host_time_is_host_bound(tmp_path, host_calls):
    """taxes.run.cupti_kineto writes a timing-mode recording as a Kineto trace: its steps are the stamped
    boundaries, and the host time planted before each step's first launch comes back as host-bound, whether
    the launch calls were recorded or stand in from the kernels' queued and submitted times."""
    import gzip

    from taxes.attribution import analyze as A
    from taxes.run.cupti_kineto import to_kineto

    spins = [300.0, 120.0, 500.0, 80.0, 200.0, 150.0]
    acts, calls, bounds = _timing_recording(spins)
    if host_calls != "recorded":
        calls = calls.iloc[0:0]
    # steps 2 and 3 ran plain, between two recorded blocks: no records, no windows
    windows = list(zip(bounds, bounds[1:]))
    lo, hi = windows[2][0], windows[3][1]
    acts = acts[(acts["end_us"] <= lo) | (acts["start_us"] >= hi)]
    calls = calls[calls["correlation"].isin(acts["correlation"])]
    windows, spins = windows[:2] + windows[4:], spins[:2] + spins[4:]
    doc = to_kineto(acts, calls, windows, {"pid": 99, "tid": 4321, "device": 0, "gpu": "NVIDIA H100 80GB HBM3",
                                           "rank": 0})
    launches = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"]
    assert len(launches) == 4 * len(spins) and {e["name"] for e in launches} == {"cudaLaunchKernel"}
    steps = sorted((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    assert [(e["ts"], e["ts"] + e["dur"]) for e in steps] == windows
    assert {e["tid"] for e in steps} == {4321}  # on the thread that launched
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    an = A.analyze([str(path)])  # the GPU name selects the profile
    assert an.hardware == "h100-sxm"
    d = an.decomposition.set_index("step").sort_index()
    assert len(d) == len(spins)
    # each step's host-bound time: the host's time elsewhere from the step's start to its first launch (the
    # planted spin); its launch tax: the first kernel's 4 us launch latency (the others queued behind it)
    for (step, row), spin in zip(d.iterrows(), spins):
        assert row["host_bound"] == pytest.approx(spin, rel=0.02), step
        # launch: the first kernel's 4 us from its call; with queued times the call starts 0.2 us later
        assert row["launch"] == pytest.approx(4.0 if host_calls == "recorded" else 3.8, abs=0.2), step
        assert row["compute"] == pytest.approx(4 * 50.0, rel=0.01)


def test_a_graph_replay_keeps_its_recorded_launch_not_its_kernels_latency_timestamps(tmp_path):
    """A timing recording of eager steps alternating with graph replays: CUPTI gives a replay's kernels the
    latency timestamps of the last eager launch before it (seen on an H100), and its graph launch is recorded
    as a call. The replay belongs to the step that launched it, the host time before the graph launch is that
    step's host-bound time, and the replay's own gaps are graph gaps."""
    import gzip

    import pandas as pd

    from taxes.attribution import analyze as A
    from taxes.run.cupti_kineto import to_kineto

    rng = np.random.default_rng(7)
    spins = rng.uniform(100.0, 400.0, size=6)
    acts, calls, bounds, t, corr = [], [], [], 0.0, 1
    last_queued = (np.nan, np.nan)
    for i, spin in enumerate(spins):
        bounds.append(t)
        t += spin
        if i % 2 == 0:  # eager: four launches, their kernels 30 us each, the first 4 us after its call
            for j in range(4):
                last_queued = (t + j + 0.2, t + j + 0.9)
                acts.append(("k", "kernel", 7, t + 4.0 + 30.0 * j, t + 4.0 + 30.0 * (j + 1), corr, -1, "", 0,
                             *last_queued))
                corr += 1
            t += 4.0 + 4 * 30.0
        else:  # one graph launch (a 2 us call), its four kernels 20 us each with 1 us between them, 6 us after
            calls.append(("cudaGraphLaunch", "graph", t, t + 2.0, corr, 4321))
            for j in range(4):
                acts.append(("g", "kernel", 7, t + 6.0 + 21.0 * j, t + 6.0 + 21.0 * j + 20.0, corr, corr, "", 0,
                             *last_queued))  # stale: the last eager launch's
            corr += 1
            t += 6.0 + 4 * 21.0 - 1.0
    bounds.append(t)
    cols = ["name", "kind", "stream", "start_us", "end_us", "correlation", "graph", "comm", "bytes", "queued_us",
            "submitted_us"]
    doc = to_kineto(pd.DataFrame(acts, columns=cols),
                    pd.DataFrame(calls, columns=["name", "kind", "start_us", "end_us", "correlation", "tid"]),
                    list(zip(bounds, bounds[1:])),
                    {"pid": 99, "tid": 4321, "device": 0, "gpu": "NVIDIA H100 80GB HBM3", "rank": 0})
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"]
    assert names.count("cudaGraphLaunch") == 3 and names.count("cudaLaunchKernel") == 12
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    d = A.analyze([str(path)]).decomposition.set_index("step").sort_index()
    assert len(d) == len(spins)
    for step, spin in enumerate(spins):
        row = d.loc[step]
        assert row["host_bound"] == pytest.approx(spin, rel=0.01), step
        if step % 2:
            assert row["compute"] == pytest.approx(80.0, rel=0.01), step
            assert row["graph_gaps"] == pytest.approx(3.0, abs=0.05), step
            assert row["launch"] == pytest.approx(6.0, abs=0.05), step
        else:
            assert row["compute"] == pytest.approx(120.0, rel=0.01), step
            assert row["launch"] == pytest.approx(3.8, abs=0.05), step
        assert abs(row["unattributed"]) < 0.05, step


def test_timing_mode_without_cupti_is_one_line(tmp_path):
    from taxes.run.cupti import available

    if available() is None:
        pytest.skip("cupti-python records here")
    r = subprocess.run([sys.executable, "-m", "taxes.cli.main", "trace", "--out", str(tmp_path / "o"), "--record",
                        "timing", "--", sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--record timing records with cupti-python" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_timing_schedule_alternates_plain_and_profiled_blocks_abba():
    from taxes.run.trace_hook import schedule

    P, R = "plain", "profiled"
    assert schedule(6, 6, 4) == [P] * 4 + [R] * 4 + [R] * 2 + [P] * 2
    assert schedule(8, 8, 2) == [P, P, R, R, R, R, P, P] * 2
    assert schedule(3, 5, 0) == [P] * 3 + [R] * 5  # the full record: one profiler cycle after the plain steps
    assert schedule(2, 5, 2) == [P, P, R, R, R, R, R]  # plain ran out: the profiled blocks follow each other


def test_the_hook_times_plain_blocks_and_pauses_the_recorder_between_profiled_ones(tmp_path, monkeypatch):
    """Driven step by step (the host clock stands in for CUDA events): which program steps were timed plain,
    which profiled, and that the recorder pauses before every plain block and resumes after it."""
    from taxes.run import trace_hook as H

    calls: list = []

    class Recorder:  # stands in for _CuptiCycle
        def step(self):
            calls.append("step")

        def pause(self):
            calls.append("pause")

        def resume(self):
            calls.append("resume")

        def __exit__(self, *a):
            calls.append("exit")

        def export_chrome_trace(self, path):
            Path(path).write_text("{}")

    for k, v in {"TAXES_TRACE_DIR": str(tmp_path), "TAXES_TRACE_SKIP": "2", "TAXES_TRACE_PLAIN": "6",
                 "TAXES_TRACE_STEPS": "6", "TAXES_TRACE_BLOCK": "2", "TAXES_TRACE_RECORD": "timing",
                 "TAXES_TRACE_STEP": "taxes"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(H, "_STATE", {})
    monkeypatch.setattr(H.atexit, "register", lambda f: None)
    monkeypatch.setattr(H, "_start_profiler", lambda: (calls.append("start"), H._STATE.update(prof=Recorder())))
    monkeypatch.setattr(H, "_device_idle", lambda: calls.append("sync"))
    H.install()
    for _ in range(30):
        H.step()
    # schedule(6, 6, 2): P P R R | R R P P | P P R R, after steps 0..2 (the end of step 2 is the first boundary);
    # the device is waited for before the records start or resume
    assert calls == ["sync", "start", "step", "step", "step", "step", "pause", "sync", "resume", "step", "step",
                     "exit"]
    d = json.loads((tmp_path / "plain_rank0.json").read_text())
    assert d["plain_steps"] == [3, 4, 9, 10, 11, 12] and d["profiled_steps"] == [5, 6, 7, 8, 13, 14]
    assert len(d["plain_step_us"]) == 6 and all(x > 0 for x in d["plain_step_us"])
    assert d["steps_seen"] == 15  # done after the last profiled step
    assert d["after_switch_steps"] == []  # one rank: no other rank's switch to land in a plain step


def test_with_several_ranks_the_first_plain_step_after_a_profiled_block_is_kept_apart(tmp_path, monkeypatch):
    """Another rank's switch of its records lands in the first plain step after a profiled block (it holds
    this rank at the step's first collective): that step is no plain sample, and it is kept apart."""
    from taxes.run import trace_hook as H

    class Recorder:
        def step(self):
            pass

        pause = resume = step

        def __exit__(self, *a):
            pass

        def export_chrome_trace(self, path):
            Path(path).write_text("{}")

    for k, v in {"TAXES_TRACE_DIR": str(tmp_path), "TAXES_TRACE_SKIP": "2", "TAXES_TRACE_PLAIN": "6",
                 "TAXES_TRACE_STEPS": "6", "TAXES_TRACE_BLOCK": "2", "TAXES_TRACE_RECORD": "timing",
                 "TAXES_TRACE_STEP": "taxes", "WORLD_SIZE": "2", "RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(H, "_STATE", {})
    monkeypatch.setattr(H.atexit, "register", lambda f: None)
    monkeypatch.setattr(H, "_start_profiler", lambda: H._STATE.update(prof=Recorder()))
    monkeypatch.setattr(H, "_device_idle", lambda: None)
    H.install()
    for _ in range(30):
        H.step()
    d = json.loads((tmp_path / "plain_rank1.json").read_text())
    # P P R R | R R P P | P P R R after steps 0..2: step 9 follows the profiled step 8
    assert d["plain_steps"] == [3, 4, 10, 11, 12] and d["after_switch_steps"] == [9]
    assert len(d["plain_step_us"]) == 5 and len(d["after_switch_step_us"]) == 1


def test_launches_without_recorded_calls_are_placed_and_the_idle_before_them_is_measured(tmp_path):
    """A timing record keeps no host calls: eager kernels bring their queued and submitted times; memsets
    and a graph replay bring none (the replay's kernels the last eager launch's). Their launches are placed
    one median launch latency (submitted -> start on an idle device, 0.7 us here) before they started and
    marked inferred; the idle before them is measured whole (host_bound + launch = the planted gap) and
    nothing is left unattributed."""
    import gzip

    import pandas as pd

    from taxes.attribution import analyze as A
    from taxes.run.cupti_kineto import to_kineto

    rng = np.random.default_rng(11)
    spins = rng.uniform(80.0, 300.0, size=6)
    acts, bounds, t, corr, planted_idle = [], [], 0.0, 1, []
    last = (np.nan, np.nan)
    for i, spin in enumerate(spins):
        bounds.append(t)
        t += spin
        if i % 2 == 0:  # k1, a memset 20 us of host work later, k2 15 us after that
            last = (t + 0.2, t + 0.9)
            acts.append(("k1", "kernel", 7, t + 1.6, t + 31.6, corr, -1, "", 0, *last))
            acts.append(("memset", "memset", 7, t + 51.6, t + 53.6, corr + 1, -1, "", 64, np.nan, np.nan))
            last = (t + 68.0, t + 68.7)
            acts.append(("k2", "kernel", 7, t + 69.4, t + 99.4, corr + 2, -1, "", 0, *last))
            corr += 3
            planted_idle.append(spin + 1.6 + 20.0 + 15.8)
            t += 99.4
        else:  # a graph replay launched at t: its kernels start 6 us later, 20 us each, 1 us apart
            for j in range(3):
                acts.append(("g", "kernel", 7, t + 6.0 + 21.0 * j, t + 26.0 + 21.0 * j, corr, corr, "", 0, *last))
            corr += 1
            planted_idle.append(spin + 6.0)
            t += 6.0 + 63.0 - 1.0
    bounds.append(t)
    cols = ["name", "kind", "stream", "start_us", "end_us", "correlation", "graph", "comm", "bytes", "queued_us",
            "submitted_us"]
    no_calls = pd.DataFrame(columns=["name", "kind", "start_us", "end_us", "correlation", "tid"])
    doc = to_kineto(pd.DataFrame(acts, columns=cols), no_calls, list(zip(bounds, bounds[1:])),
                    {"pid": 99, "tid": 4321, "device": 0, "gpu": "NVIDIA H100 80GB HBM3", "rank": 0})
    placed = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime" and "inferred" in e["args"]]
    assert doc["taxes_inferred_launches"] == len(placed) == 6  # 3 memsets, 3 graph replays
    assert sorted({e["name"] for e in placed}) == ["cudaGraphLaunch", "cudaMemsetAsync"]
    memset_starts = sorted(a[3] for a in acts if a[1] == "memset")
    assert sorted(e["ts"] for e in placed if e["name"] == "cudaMemsetAsync") == pytest.approx(
        [s - 0.7 for s in memset_starts])
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    an = A.analyze([str(path)])
    assert any("launches placed, not recorded" in w for w in an.warnings)
    d = an.decomposition.set_index("step").sort_index()
    for step, idle in enumerate(planted_idle):
        row = d.loc[step]
        assert row["host_bound"] + row["launch"] == pytest.approx(idle, rel=1e-3), step
        assert abs(row["unattributed"]) < 0.05, step
        if step % 2:  # the replay: graph gaps between its kernels, the placed launch one latency before it
            assert row["graph_gaps"] == pytest.approx(2.0, abs=0.01)
            assert row["launch"] == pytest.approx(0.7, abs=0.01)


def test_the_record_under_torchrun_is_the_timing_one_where_it_can_record(monkeypatch):
    """--record auto: several ranks (torchrun) take the timing record, whose cost leaves the ranks' order at
    collectives to the job; one process takes the full record; without cupti-python, the full one with a reason."""
    from taxes.run import cupti
    from taxes.run.trace import choose_record, launches_ranks

    assert launches_ranks(["torchrun", "--nproc_per_node", "2", "train.py"])
    assert launches_ranks(["/usr/bin/python3", "-m", "torch.distributed.run", "train.py"])
    assert not launches_ranks(["python", "train.py", "--torchrun"]) and not launches_ranks(["python", "torchrun.py"])
    monkeypatch.setattr(cupti, "available", lambda: "")
    assert choose_record(["torchrun", "train.py"], "auto")[0] == "timing"
    assert choose_record(["python", "train.py"], "auto") == ("full", "")
    assert choose_record(["torchrun", "train.py"], "full") == ("full", "")
    monkeypatch.setattr(cupti, "available", lambda: "no CUDA")
    record, why = choose_record(["torchrun", "train.py"], "auto")
    assert record == "full" and "no CUDA" in why


def test_no_plain_steps_reach_the_analysis_without_a_plain_times_error(tmp_path):
    """--plain 0 times no plain step: the hook writes empty lists, and the analysis gets no plain times (no
    measurement cost) instead of refusing them ("at least one per rank"); a rank that timed none beside
    one that did is still refused by the analysis."""
    from taxes.attribution.analyze import _plain
    from taxes.errors import TaxesError
    from taxes.run.trace import plain_for_analysis

    r, out = _trace(tmp_path, PROGRAM.format(n=10), "--steps", "3", "--plain", "0", "--skip", "2")
    recorded = {int(k): v for k, v in json.loads((out / "plain.json").read_text()).items()}
    assert recorded == {0: []}
    assert plain_for_analysis(recorded) is None
    assert _plain(plain_for_analysis(recorded), {"e2e_us": 100.0})["measurement_cost_us"] is None
    with pytest.raises(TaxesError, match="at least one per rank"):
        _plain(plain_for_analysis({0: [], 1: [90.0]}), {"e2e_us": 100.0})


@pytest.mark.parametrize("seed", range(3))
def test_timing_recordings_of_ranks_that_began_recording_apart_line_up_by_their_base_time(tmp_path, seed):
    """Each rank's timing recording counts from its own recorder's origin; the trace carries that origin on the
    host's shared clock (baseTimeNanoseconds), so analysis puts the ranks on one clock: an all-reduce that
    rank 1 reached `late` us after rank 0 (on the shared clock) is rank 0's sync wait, and rank 1 is the one
    that was late, however far apart the two recorders started."""
    import gzip

    import pandas as pd

    from taxes.attribution import analyze as A
    from taxes.run.cupti_kineto import to_kineto

    rng = np.random.default_rng(seed)
    late, coll_us = rng.uniform(200.0, 3000.0), 40.0
    origin_ns = {0: 5_000_000_000, 1: 5_000_000_000 + int(rng.uniform(1e6, 3e7))}  # rank 1 recorded ms later
    cols = ["name", "kind", "stream", "start_us", "end_us", "correlation", "graph", "comm", "bytes", "queued_us",
            "submitted_us"]
    no_calls = pd.DataFrame(columns=["name", "kind", "start_us", "end_us", "correlation", "tid"])
    nccl = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    paths = []
    for rank in (0, 1):
        shift = origin_ns[rank] / 1000.0  # shared-clock us -> this rank's recorder us
        acts, bounds = [], []
        for step in range(4):
            t0 = origin_ns[0] / 1000.0 + 60_000.0 + step * 10_000.0  # the step begins together (shared clock, us)
            gemm_end = t0 + 500.0
            arrive = gemm_end + (late if rank == 1 else 0.0)
            end = gemm_end + late + coll_us
            acts.append(("gemm", "kernel", 7, t0 - shift, gemm_end - shift, 2 * step + 1, -1, "", 0,
                         t0 - shift - 5.0, t0 - shift - 4.0))
            acts.append((nccl, "kernel", 9, arrive - shift, end - shift, 2 * step + 2, -1, "", 0,
                         t0 - shift - 3.0, t0 - shift - 2.0))
            bounds.append((t0 - shift - 10.0, end - shift + 1.0))
        doc = to_kineto(pd.DataFrame(acts, columns=cols), no_calls, bounds,
                        {"pid": 10 + rank, "tid": 4321, "device": rank, "gpu": "NVIDIA H100 80GB HBM3", "rank": rank,
                         "world_size": 2, "base_ns": origin_ns[rank]})
        path = tmp_path / f"rank{rank}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
        paths.append(str(path))
    an = A.analyze(paths)
    d = an.decomposition
    for step in range(4):
        r0 = d[(d["rank"] == 0) & (d["step"] == step)].iloc[0]
        r1 = d[(d["rank"] == 1) & (d["step"] == step)].iloc[0]
        assert r0["sync_wait"] == pytest.approx(late, rel=1e-3), step
        assert r1["sync_wait"] == pytest.approx(0.0, abs=1e-3), step
    top = an.stragglers.sort_values("score", ascending=False).iloc[0]
    assert int(top["rank"]) == 1 and bool(top["straggler"])
