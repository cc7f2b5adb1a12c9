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

    from taxes import trace as T
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


def _timing_trace(spins_us, kernel_us=50.0, launches=4):
    """A timing-mode trace (CUDA activity only, no CPU ops). Each step starts with a boundary marker
    (torch.cuda._sleep's spin_kernel, launched at the boundary), then the host is elsewhere for spins_us[i],
    then it launches `launches` kernels back to back (1 us calls; the first starts 4 us after its call, the
    rest queue behind it); the next boundary comes when the last kernel ends."""
    from kineto_build import add_launch, new_trace

    tr = new_trace(rank=0, world=1, distributed=False)
    t, boundaries = 0.0, []
    for spin in list(spins_us) + [None]:
        boundaries.append(t)
        add_launch(tr, t, [("at::cuda::(anonymous namespace)::spin_kernel(long)", 7, t + 4, t + 5)])
        if spin is None:
            break
        t += 5.0 + spin
        first = t + 4.0
        for i in range(launches):
            add_launch(tr, t + i, [("gemm_kernel", 7, first + i * kernel_us, first + (i + 1) * kernel_us)], dur=1.0)
        t = first + launches * kernel_us
    return tr, boundaries


def test_timing_mode_markers_become_step_ranges_and_the_planted_host_time_is_host_bound(tmp_path):
    """The hook's marker handling on a built trace: the markers become ProfilerStep#N ranges from one marker's
    launch to the next and leave the trace; analyze then finds those steps, and the host time planted before
    each step's first launch comes back as host-bound."""
    from kineto_build import write_trace

    from taxes import analyze as A
    from taxes.trace_hook import mark_steps

    spins = [300.0, 120.0, 500.0, 80.0, 200.0]
    tr, bounds = _timing_trace(spins)
    assert mark_steps(tr["doc"], len(spins) + 2) is not None  # not the markers launched: left alone
    assert mark_steps(tr["doc"], len(spins) + 1) is None
    events = tr["doc"]["traceEvents"]
    assert not [e for e in events if "spin_kernel" in str(e.get("name"))]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    t0 = min(e["ts"] for e in steps)
    assert [round(e["ts"] - t0, 6) for e in steps] == [round(b - bounds[0], 6) for b in bounds[:-1]]
    assert [round(e["dur"], 6) for e in steps] == [round(b - a, 6) for a, b in zip(bounds, bounds[1:])]
    path = write_trace(tr, tmp_path / "rank0.json.gz")
    an = A.analyze([str(path)], "h100-sxm")
    d = an.decomposition.set_index("step").sort_index()
    assert len(d) == len(spins)
    # each step's host-bound time: the host's time elsewhere from the step's start to its first launch (the
    # planted spin plus the marker's 5 us, which the trace no longer shows); its launch tax: the first
    # kernel's 4 us launch latency (the others were queued behind it)
    for (step, row), spin in zip(d.iterrows(), spins):
        assert row["host_bound"] == pytest.approx(spin + 5.0, rel=0.02), step
        assert row["launch"] == pytest.approx(4.0, abs=0.2), step
        assert row["compute"] == pytest.approx(4 * 50.0, rel=0.01)
