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
