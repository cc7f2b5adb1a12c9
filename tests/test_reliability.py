"""Faults while running: nothing hangs, nothing is left running, every error is one line saying what to do.

Kernel waits and rank failures run on emulated ranks (forked processes, Triton's interpreter); a few
faults run a launcher in a subprocess and signal it; torchrun's environment makes this process one rank.
docs/reliability.md's table names a test of this suite (or another) for every fault it lists; the last
test checks that each named test exists.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import ast
import datetime
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from _emulated import emulated
from _util import assert_one_line

from taxes.kernels import runtime
from taxes.kernels.device import interpreting
from taxes.kernels.rank import RankContext, RankError, SymmetricHeap
from taxes.kernels.runtime import launch
from taxes.kernels.sync import FlagTimeout, wait_for_flag


ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    """Running (a zombie holds no memory and no GPU: it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _wait_gone(pids, within_s: float) -> list[int]:
    """The pids still alive after waiting up to within_s for all of them to end."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


# ---- bounded waits inside kernels -----------------------------------------------------------------


def _probe_job(ctx, wait_s):
    """Every rank first waits for a flag its peer raises (must succeed), then for one nobody raises
    (must give up): flag 3 + rank, value 7 + rank."""
    flags = ctx.heap.zeros((8,), torch.int32)
    ctx.barrier()
    peer = (ctx.rank + 1) % ctx.world
    flags.peers[peer][0] = 5  # the raised one: the peer's flag 0 reaches 5
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    ctx.barrier()
    ctx.doing("waiting for a flag that was raised")
    wait_for_flag(flags.local, 0, 5, ctx.rank, wait_s)  # must not time out
    ctx.doing("waiting for a flag nobody raises")
    t0 = time.monotonic()
    try:
        wait_for_flag(flags.local, 3 + ctx.rank, 7 + ctx.rank, ctx.rank, wait_s)
    except FlagTimeout as e:
        message = str(e)
    else:
        message = "no error"
    took = time.monotonic() - t0
    ctx.barrier()  # no rank leaves (and unmaps its arena) while a peer may still read it
    return message, took


def _check_probe_messages(out, budget_s):
    for rank, (message, took) in enumerate(out):
        assert_one_line(message)
        assert message.startswith(f"rank {rank}: flag probe gave up waiting for the probe flag"), message
        assert f"(index {3 + rank})" in message and f"to reach {7 + rank}" in message, message
        assert "it still read 0" in message, message
        assert took < budget_s, (took, message)


@emulated
def test_a_flag_nobody_raises_is_a_host_error_naming_rank_flag_and_value():
    t0 = time.monotonic()
    out = launch(_probe_job, 2, 0.2, timeout_s=60)
    _check_probe_messages(out, budget_s=20)  # a 0.2 s budget (polls under the interpreter): seconds at most
    assert time.monotonic() - t0 < 40


def _probe_job_uncaught(ctx):
    flags = ctx.heap.zeros((8,), torch.int32)
    ctx.doing(f"waiting on probe flag {3 + ctx.rank}")
    wait_for_flag(flags.local, 3 + ctx.rank, 7 + ctx.rank, ctx.rank, 0.1)


@emulated
def test_a_flag_timeout_ends_the_whole_launch_with_one_line():
    with pytest.raises(RankError) as e:
        launch(_probe_job_uncaught, 2, timeout_s=60)
    msg = str(e.value)
    assert_one_line(msg)
    m = re.match(r"rank (\d) failed while waiting on probe flag (\d): FlagTimeout: rank (\d): flag probe gave up "
                 r"waiting for the probe flag \(index (\d)\) to reach (\d+)", msg)
    assert m, msg
    r = int(m.group(1))
    assert [int(g) for g in m.groups()] == [r, 3 + r, r, 3 + r, 7 + r], msg


@pytest.mark.gpu
@pytest.mark.skipif(interpreting() or not torch.cuda.is_available(), reason="needs a CUDA GPU and TRITON_INTERPRET unset")
def test_a_flag_nobody_raises_on_gpus():
    world = min(2, torch.cuda.device_count())
    t0 = time.monotonic()
    out = launch(_probe_job, world, 0.5, backend="cuda", timeout_s=300)
    _check_probe_messages(out, budget_s=5)  # 0.5 s of %globaltimer, plus the launch
    assert time.monotonic() - t0 < 200


def _silent_flash_decode_peer(ctx):
    from taxes.kernels import flash_decode as fd

    B, Hq, Hkv, D, S = 1, 16, 2, 64, 128
    g = torch.Generator().manual_seed(ctx.rank)
    q = torch.randn(B, Hq, D, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, generator=g).to(torch.bfloat16) for _ in range(2))
    run = fd.FlashDecode(ctx, B, Hq, Hkv, D, S, torch.bfloat16, "fused-push", wait_s=0.3)
    if ctx.rank == 1:
        ctx.barrier()
        return "silent"  # never pushes its partial: rank 0's combine must give up, not hang
    ctx.doing("combining partials")
    run(q, k, v, torch.empty(B, Hq, D, dtype=torch.bfloat16))
    try:
        run.check()
        message = "no error"
    except FlagTimeout as e:
        message = str(e)
    ctx.barrier()
    return message


@emulated
def test_a_silent_peer_in_fused_flash_decode_is_a_clear_error():
    t0 = time.monotonic()
    message, silent = launch(_silent_flash_decode_peer, 2, timeout_s=120)
    assert silent == "silent"
    assert_one_line(message)
    assert message.startswith("rank 0: fused flash-decode combine gave up waiting for the data chunk flag "
                              "(rows block 0 from rank 1) to reach 1"), message
    assert time.monotonic() - t0 < 60


# ---- ranks that die, overrun or are interrupted -----------------------------------------------------


def _killed_job(ctx, pid_dir):
    Path(pid_dir, f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    if ctx.rank == 1:
        ctx.doing("step 3 of 5: copying the planted chunk")
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.doing("waiting at the barrier")
    ctx.barrier(timeout_s=120)  # never reached by rank 1: only the launcher can end this


@emulated
def test_a_rank_killed_mid_run_is_named_with_what_it_was_doing(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankError) as e:
        launch(_killed_job, 2, str(tmp_path), timeout_s=120)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert_one_line(msg)
    assert msg.startswith("rank 1 died (killed by SIGKILL) while step 3 of 5: copying the planted chunk"), msg
    assert took < 15, took  # noticed at once, not at the barrier's 120 s or the launch's timeout
    pids = [int(Path(tmp_path, f"rank{r}.pid").read_text()) for r in (0, 1)]
    assert _wait_gone(pids, 0) == [], "a rank outlived the launcher"


def _sleepy_job(ctx):
    ctx.doing("sleeping through its time budget" if ctx.rank == 1 else "done")
    if ctx.rank == 1:
        time.sleep(60)
    return ctx.rank


@emulated
def test_a_rank_that_overruns_the_time_budget_is_stopped(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    t0 = time.monotonic()
    with pytest.raises(RankError, match=r"^rank 1 did not finish within 2 s \(it was sleeping through its time budget\)") as e:
        launch(_sleepy_job, 2, timeout_s=2)
    assert time.monotonic() - t0 < 12
    msg = str(e.value)
    assert_one_line(msg)
    stacks = Path(msg.rsplit("; their stacks: ", 1)[1])  # the rank's stacks, in a file the line names
    assert stacks.parent == tmp_path
    text = stacks.read_text()
    assert text.startswith("rank 1: ") and "in _sleepy_job" in text and "rank 0" not in text
    assert "_sleepy_job" not in capfd.readouterr().err  # none on the terminal
    assert [p.name for p in tmp_path.iterdir()] == [stacks.name]  # the ranks' own files are gone


@pytest.mark.gpu
@pytest.mark.skipif(interpreting() or not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA GPUs and TRITON_INTERPRET unset")
def test_a_rank_killed_inside_a_collective_on_gpus(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankError) as e:
        launch(_killed_job, 2, str(tmp_path), backend="cuda", timeout_s=300)  # rank 0 waits in an NCCL barrier
    msg = str(e.value)
    assert msg.startswith("rank 1 died (killed by SIGKILL) while step 3 of 5: copying the planted chunk"), msg
    assert time.monotonic() - t0 < 120
    pids = [int(Path(tmp_path, f"rank{r}.pid").read_text()) for r in (0, 1)]
    assert _wait_gone(pids, 0) == []


LAUNCHER = """
import os, sys, time
os.environ["TRITON_INTERPRET"] = "1"
from taxes.kernels.runtime import launch

def job(ctx):
    print(f"rank {ctx.rank} pid {os.getpid()}", flush=True)
    ctx.doing("sleeping")
    time.sleep(120)

if __name__ == "__main__":
    try:
        launch(job, 2, timeout_s=300)
    except KeyboardInterrupt:
        print("interrupted: every rank was stopped", file=sys.stderr)
        sys.exit(130)
"""


def _start_launcher(tmp_path):
    """The launcher script with its two ranks running: (process, rank pids). In loaded full-suite runs the
    launcher has, rarely, ended during start-up with no output at all; a second start is allowed, with what
    the first said (exit status, output, a fault handler's stack) kept for a failure of both."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    said = []
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, cwd=tmp_path,  # TMPDIR: what a killed one leaves
                                env={**os.environ, "PYTHONFAULTHANDLER": "1", "TMPDIR": str(tmp_path)})
        pids = []
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()  # the ranks print their pids as soon as they run
            m = re.match(r"rank \d pid (\d+)", line)
            if m:
                pids.append(int(m.group(1)))
            elif not line:
                break
        if len(pids) == 2:
            return proc, pids
        proc.kill()
        out, err = proc.communicate(timeout=10)
        said.append(f"exit {proc.returncode}, stdout {out!r}, stderr {err[-2000:]!r}")
    pytest.fail("the launcher did not start its ranks, twice: " + " | ".join(said))


def _finish(proc, pids, within_s):
    """Wait for the launcher and its ranks; kill what is left (and fail) rather than leave it behind."""
    try:
        code = proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        code = None
    left = _wait_gone(pids, within_s)
    for pid in left + ([proc.pid] if code is None else []):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    err = proc.stderr.read() if not left and code is not None else ""
    proc.stdout.close()
    proc.stderr.close()
    return code, left, err


@emulated
@pytest.mark.parametrize("whole_group", [True, False], ids=["ctrl-c-in-a-terminal", "sigint-to-the-launcher"])
def test_ctrl_c_stops_and_reaps_every_rank(tmp_path, whole_group):
    proc, pids = _start_launcher(tmp_path)
    t0 = time.monotonic()
    if whole_group:  # what a terminal does: SIGINT to every process of the foreground group
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGINT)
    code, left, err = _finish(proc, pids, within_s=15)
    assert code is not None, "the launcher did not exit after Ctrl-C"
    assert left == [], f"ranks {left} outlived the launcher"
    assert time.monotonic() - t0 < 15
    assert code == 130
    assert err.strip() == "interrupted: every rank was stopped", err  # no traceback from any process


@emulated
def test_a_killed_launcher_takes_its_ranks_with_it(tmp_path):
    proc, pids = _start_launcher(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up: the ranks must still not be orphaned
    code, left, _ = _finish(proc, pids, within_s=10)
    assert code == -signal.SIGKILL
    assert left == [], f"ranks {left} were orphaned"


# ---- torchrun: this process is one rank ---------------------------------------------------------------


def test_torchrun_environment_is_read_and_checked(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert runtime.torchrun_rank() is None
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert runtime.torchrun_rank() is None  # LOCAL_RANK missing: not torchrun
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert runtime.torchrun_rank() == (1, 2, 1)
    with pytest.raises(RankError, match=r"torchrun started 2 processes but this run asks for 4 ranks.*--nproc-per-node 4"):
        launch(_sleepy_job, 4, backend="cuda")
    if not torch.cuda.is_available():
        with pytest.raises(RankError, match="no CUDA GPU"):
            launch(_sleepy_job, 2, backend="cuda")
    for bad in ("two", "2.0", "-1"):
        monkeypatch.setenv("RANK", bad)
        with pytest.raises(RankError) as e:
            runtime.torchrun_rank()
        assert_one_line(str(e.value))
        assert "RANK" in str(e.value)


def _gathered_job(ctx, fail_rank):
    ctx.doing(f"computing step {ctx.rank}")
    if ctx.rank == fail_rank:
        raise ValueError("planted failure")
    return {"rank": ctx.rank, "square": ctx.rank ** 2}


def _as_torchrun_rank(rank, port, fail_rank, q):
    """One rank as torchrun would start it, on gloo (CPU) instead of NCCL and symmetric memory."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

    def make_context():
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=10))
        arenas = [torch.zeros(4096, dtype=torch.uint8) for _ in range(2)]
        return RankContext(rank, 2, "emulated", SymmetricHeap(rank, 2, arenas), torch.device("cpu"))

    try:
        out = runtime._launch_here(_gathered_job, 2, (fail_rank,), (rank, 2, rank), 0, 30.0, make_context=make_context)
        q.put((rank, "ok", out))
    except Exception as e:
        q.put((rank, type(e).__name__, str(e)))


def _run_as_torchrun(fail_rank):
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = runtime._free_port()
    procs = [ctx.Process(target=_as_torchrun_rank, args=(r, port, fail_rank, q)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = {}
        for _ in range(2):
            rank, status, value = q.get(timeout=40)
            got[rank] = (status, value)
        return got
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def test_under_torchrun_every_rank_returns_every_ranks_result():
    got = _run_as_torchrun(fail_rank=-1)
    expected = [{"rank": 0, "square": 0}, {"rank": 1, "square": 1}]
    assert got == {0: ("ok", expected), 1: ("ok", expected)}


def test_under_torchrun_a_failing_rank_is_named_and_its_peer_does_not_hang():
    t0 = time.monotonic()
    got = _run_as_torchrun(fail_rank=1)
    assert time.monotonic() - t0 < 40
    status, msg = got[1]
    assert status == "RankError" and msg == "rank 1 failed while computing step 1: ValueError: planted failure"
    status, msg = got[0]  # its peer left: rank 0 cannot gather, and says so in one line (torchrun stops it anyway)
    assert status == "RankError", got
    assert_one_line(msg)
    assert msg.startswith("rank 0 finished but could not gather the others' results"), msg


# ---- the documentation's table is backed by tests ------------------------------------------------------


def test_every_row_of_the_reliability_table_names_a_real_test():
    text = (ROOT / "docs" / "reliability.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("|") and not re.match(r"\|\s*-", line)]
    header, rows = rows[0], rows[1:]
    assert [c.strip() for c in header.strip("|").split("|")] == ["fault", "what taxes does", "test that shows it"]
    assert len(rows) >= 15
    defined: dict[str, set[str]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 3 and all(cells), row
        refs = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", cells[2])
        assert refs, f"row names no test: {row}"
        for file, name in refs:
            if file not in defined:
                tree = ast.parse((ROOT / file).read_text())
                defined[file] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in defined[file], f"{file}::{name} does not exist (row: {cells[0]})"
