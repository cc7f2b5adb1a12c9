"""Faults and bad input: nothing hangs, nothing is lost, every error is one line saying what to do.

Kernel waits and rank failures run on emulated ranks (forked processes, Triton's interpreter); a few
faults run a launcher in a subprocess and signal it. Files: a committed corpus of broken documents
(tests/data/broken/), a few generated here (too large to commit), and hypothesis-made ones.
docs/reliability.md's table names a test of this suite (or another) for every fault it lists; the last
test checks that each named test exists.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import ast
import copy
import datetime
import json
import math
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from _util import assert_one_line
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from taxes.variants import variants_of
from taxes.model import hardware
from taxes.run import preflight
from taxes.documents import results
from taxes.cli.main import cli
from taxes.errors import TaxesError
from taxes.kernels import runtime
from taxes.kernels.device import interpreting
from taxes.kernels.rank import RankContext, RankError, SymmetricHeap
from taxes.kernels.runtime import launch
from taxes.kernels.sync import FlagTimeout, wait_for_flag
from taxes.workloads import make_workload

ROOT = Path(__file__).resolve().parent.parent
BROKEN = Path(__file__).resolve().parent / "data" / "broken"
emulated = pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")


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


# ---- preflight: refuse before allocating ---------------------------------------------------------------


H200 = "NVIDIA H200"


@pytest.mark.parametrize("facts,world,words", [
    (preflight.GpuFacts(False, [], "no CUDA", "2.13.0+cpu"), 2, ["no CUDA GPU", "taxes model"]),
    (preflight.GpuFacts(True, [H200], None), 2, ["--world 2 needs 2 GPUs", "shows 1", "--world 1"]),
    (preflight.GpuFacts(True, [H200, "NVIDIA H100 80GB HBM3"], None), 2, ["different kinds", "CUDA_VISIBLE_DEVICES"]),
    (preflight.GpuFacts(True, [H200, H200], "torch.distributed._symmetric_memory cannot be imported (x)"), 2,
     ["symmetric memory is not usable", "_symmetric_memory cannot be imported"]),
    (preflight.GpuFacts(True, [H200, H200], "GPU 0 cannot access GPU 1's memory (no peer access)"), 2, ["peer access"]),
])
def test_each_unusable_machine_gets_its_own_message(facts, world, words):
    with pytest.raises(TaxesError) as e:
        preflight.check_gpus(world, facts)
    msg = str(e.value)
    assert_one_line(msg)
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("world", [0, -2, True, 1.5])
def test_a_nonsense_world_size_is_refused(world):
    with pytest.raises(TaxesError, match="positive whole number"):
        preflight.check_gpus(world, preflight.GpuFacts(True, [H200] * 2, None))


def test_usable_machines_pass_the_gpu_check():
    assert preflight.check_gpus(2, preflight.GpuFacts(True, [H200] * 4, None)).names == [H200] * 4
    # one rank needs no symmetric memory; the unused GPUs may be of any kind
    preflight.check_gpus(1, preflight.GpuFacts(True, [H200, "other"], "no peer access"))
    if not torch.cuda.is_available():
        with pytest.raises(TaxesError, match="no CUDA GPU"):
            preflight.check_gpus(1)  # this machine's own facts


@given(need=st.floats(0, 1e13), free=st.integers(0, 1 << 43), reserve=st.sampled_from([0, 1 << 30, preflight.RESERVE_BYTES]))
def test_memory_check_refuses_exactly_what_does_not_fit(need, free, reserve):
    total = free + (5 << 30)
    try:
        preflight.check_memory(need, 3, free_total=(free, total), what="ag-gemm M=8192", reserve_bytes=reserve)
    except TaxesError as e:
        msg = str(e)
        assert need + reserve > free
        assert_one_line(msg)
        nums = [float(x) for x in re.findall(r"([\d.]+) GiB", msg)]
        assert nums == pytest.approx([(need + reserve) / 2**30, need / 2**30, reserve / 2**30, free / 2**30,
                                      total / 2**30], abs=0.051)
        assert msg.startswith("ag-gemm M=8192 needs") and "GPU 3 has" in msg
    else:
        assert need + reserve <= free


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_memory_check_refuses_a_nonsense_estimate(bad):
    with pytest.raises(TaxesError, match="not a byte count"):
        preflight.check_memory(bad, 0, free_total=(1 << 40, 1 << 40))


class _FakeCtx:
    """Enough of a RankContext for the kernels' constructors: rank 0 of `world`, CPU arenas."""

    def __init__(self, world):
        self.rank, self.world, self.backend, self.device = 0, world, "emulated", torch.device("cpu")
        self.heap = SymmetricHeap(0, world, [torch.zeros(64 << 20, dtype=torch.uint8) for _ in range(world)])
        self.private = 0

    def barrier(self, timeout_s=0):
        pass


def _count_private(monkeypatch, ctx):
    """Count the bytes of plain tensors the kernels allocate (torch.empty/zeros/arange)."""
    for name in ("empty", "zeros"):
        real = getattr(torch, name)

        def counting(*shape, _real=real, **kw):
            t = _real(*shape, **kw)
            ctx.private += t.numel() * t.element_size()
            return t

        monkeypatch.setattr(torch, name, counting)


@emulated
@pytest.mark.parametrize("variant", ["bsp", "fused-push", "fused-pull"])
def test_ag_gemm_memory_estimate_covers_what_the_kernel_allocates(monkeypatch, variant):
    from taxes.kernels import ag_gemm as ag

    M, N, K, p = 256, 128, 64, 2
    ctx = _FakeCtx(p)
    a_full = ctx.heap.alloc((M, K), torch.bfloat16)  # the input every variant gets (taxes.run.cases)
    w, out = torch.empty(K, N // p, dtype=torch.bfloat16), torch.empty(M, N // p, dtype=torch.bfloat16)
    _count_private(monkeypatch, ctx)
    cfg = ag.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, copiers=1,
                    chunk_rows=8, copy_block=256, grid=4)
    ag.make_variant(ctx, variant, M, N // p, K, torch.bfloat16, cfg)
    est = preflight.memory_breakdown(make_workload("ag-gemm", {"M": M, "N": N, "K": K}, p), variant, check=False)
    monkeypatch.undo()
    assert ctx.heap._top <= est["symmetric heap"]
    assert est["symmetric heap"] - ctx.heap._top < 8192  # not padded beyond flags and alignment
    assert a_full.local.numel() * 2 <= est["symmetric heap"]
    assert est["inputs"] == w.numel() * 2 and est["outputs"] == out.numel() * 2
    assert est["gathered"] <= ctx.private <= est["gathered"] + est["control words"]
    assert (est["gathered"] > 0) == (variant == "bsp")


@emulated
@pytest.mark.parametrize("variant", ["bsp", "fused-push"])
def test_flash_decode_memory_estimate_covers_what_the_kernel_allocates(monkeypatch, variant):
    from taxes.kernels import flash_decode as fd
    from taxes.kernels.decode_local import Config

    B, Hq, Hkv, D, S, p = 2, 16, 2, 64, 512, 2
    ctx = _FakeCtx(p)
    _count_private(monkeypatch, ctx)
    fd.FlashDecode(ctx, B, Hq, Hkv, D, S, torch.bfloat16, variant, Config(splits=0))
    w = make_workload("flash-decode", {"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "S": S}, p)
    monkeypatch.setattr(preflight, "SM_COUNT", 4)  # the CPU stand-in's SM count (kernels/device.py)
    est = preflight.memory_breakdown(w, variant, check=False)
    monkeypatch.undo()
    assert ctx.heap._top <= est["symmetric heap"]
    assert est["gathered"] <= ctx.private <= est["gathered"] + est["control words"]


@given(pair=st.sampled_from([(w, v.name) for w in ("ag-gemm", "gemm-rs", "flash-decode") for v in variants_of(w)]),
       scale=st.integers(0, 4), world=st.sampled_from([1, 2, 4, 8]), sets=st.integers(1, 4))
def test_memory_estimate_grows_with_the_problem_and_covers_its_inputs(pair, scale, world, sets):
    name, variant = pair
    base = {"ag-gemm": {"M": 1024, "N": 1024, "K": 512}, "gemm-rs": {"M": 1024, "N": 512, "K": 1024},
            "flash-decode": {"B": 1, "Hq": 32, "Hkv": 8, "D": 128, "S": 1024}}[name]
    big = {k: v * (2 ** scale if k in ("M", "N", "K", "S") else 1) for k, v in base.items()}
    small_w, big_w = make_workload(name, base, world), make_workload(name, big, world)
    small, large = preflight.bytes_needed(small_w, variant, sets), preflight.bytes_needed(big_w, variant, sets)
    assert large >= small * (1.5 if scale else 1) * 0.999
    assert preflight.bytes_needed(big_w, variant, sets + 1) > large  # another input set costs memory
    assert large >= sets * big_w.hbm_bytes()  # inputs and outputs at least, for each input set
    assert preflight.heap_bytes_needed(big_w, variant, sets) >= preflight.memory_breakdown(big_w, variant, sets)["symmetric heap"]


def test_memory_estimate_refuses_unknown_variants_and_input_sets():
    w = make_workload("ag-gemm", {}, 2)
    for bad in [("nope", 1), ("bsp", 0), ("bsp", True), ("bsp", 1.5)]:
        with pytest.raises(TaxesError) as e:
            preflight.bytes_needed(w, *bad)
        assert_one_line(str(e.value))


def test_a_shape_too_large_for_the_gpu_is_refused_with_needed_and_available():
    w = make_workload("ag-gemm", {"M": 262144, "N": 262144, "K": 65536}, 2)
    need = preflight.bytes_needed(w, "bsp")
    with pytest.raises(TaxesError) as e:
        preflight.check_memory(need, 0, free_total=(130 << 30, 141 << 30), what="ag-gemm M=256K")
    msg = str(e.value)
    assert f"{(need + preflight.RESERVE_BYTES) / 2**30:.1f} GiB per GPU" in msg and "130.0 GiB free of 141.0 GiB" in msg


# ---- broken, hostile and wrong files ---------------------------------------------------------------------

# What the result-document loader must say about each corpus file (a word of its one-line message).
RESULT_WORDS = {
    "binary_garbage.bin": "not UTF-8", "empty.json": "not valid JSON", "whitespace.json": "not valid JSON",
    "nul_bytes.json": "not valid JSON", "null.json": "found null", "number.json": "found a number",
    "result_truncated.json": "not valid JSON", "result_wrong_version.json": "version 2 is not supported",
    "result_version_as_string.json": "version '1' is not supported", "result_not_a_result.json": "not a taxes result",
    "result_nan.json": "NaN", "result_infinity.json": "Infinity", "result_overflow_1e999.json": "finite number",
    "result_huge_int.json": "impossible here", "result_int_too_long.json": "digits",
    "result_huge_world.json": "world_size", "result_cases_not_a_list.json": "cases: expected a list",
    "result_samples_a_string.json": "samples_us: expected a list", "result_shape_bool.json": "shape.S",
    "result_shape_key_control_chars.json": "no dimension", "result_phase_ends_before_start.json": "ends before it starts",
    "result_kind_nested.json": "metadata.kind", "result_nested_2000.json": "nested too deeply",
    "result_top_level_list.json": "found a list", "result_utf16.json": "not UTF-8",
    "trace_chrome.json": "missing 'schema'", "trace_truncated.json": "not valid JSON", "trace_nan_timestamps.json": "NaN",
    "trace_events_list.json": "found a list", "trace_deep_args.json": "nested too deeply",
}
# What the hardware-profile loader must say about the profile files (every other file: any one line).
PROFILE_WORDS = {
    "profile_truncated.json": "not valid JSON", "profile_wrong_version.json": "version 2 is not supported",
    "profile_version_true.json": "version true is not supported", "profile_nan.json": "NaN",
    "profile_overflow_1e999.json": "hbm_gbps=Infinity", "profile_huge_int.json": "hbm_gbps=1000",
    "profile_tflops_huge_int.json": "matrix_tflops", "profile_string_numbers.json": "sm_count='132'",
    "profile_name_control_chars.json": "name must be printable", "profile_extra_nested.json": "extra",
    "profile_missing_fields.json": "lacks",
}
CORPUS = sorted(p.name for p in BROKEN.iterdir())


def test_the_corpus_is_whole_and_every_file_has_its_expected_message():
    assert set(CORPUS) == set(RESULT_WORDS) | set(PROFILE_WORDS), set(CORPUS) ^ (set(RESULT_WORDS) | set(PROFILE_WORDS))
    assert sum(p.stat().st_size for p in BROKEN.iterdir()) < 512 * 1024  # big cases are made at test time


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Broken files too large to commit: 10^5 levels of nesting, a file over the size limits, a long
    valid-looking document."""
    d = tmp_path_factory.mktemp("generated")
    (d / "deep_list.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "deep_object.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with open(d / "huge.json", "wb") as f:  # sparse: over both limits, costs no disk
        f.truncate(max(results.MAX_BYTES, hardware.MAX_PROFILE_BYTES) + 1)
    with open(d / "huge_profile.json", "w") as f:  # over the profile limit only, really written (17 MiB)
        f.write('{"extra": [' + "1.5," * (hardware.MAX_PROFILE_BYTES // 4 + 1) + "1.5]}")
    return d


GENERATED_WORDS = {"deep_list.json": "nested too deeply", "deep_object.json": "nested too deeply",
                   "huge.json": "larger than", "huge_profile.json": None}


@pytest.mark.parametrize("name", CORPUS + list(GENERATED_WORDS))
def test_broken_files_are_refused_with_one_line_by_both_loaders(name, generated):
    path = (generated if name in GENERATED_WORDS else BROKEN) / name
    for loader, words in ((results.load, RESULT_WORDS), (hardware.load_profile_file, PROFILE_WORDS)):
        with pytest.raises(TaxesError) as e:
            loader(path)
        msg = str(e.value)
        assert_one_line(msg)
        assert str(path) in msg and len(msg) < 600, msg
        assert "\x1b" not in msg  # a hostile key or name never reaches the terminal raw
        word = GENERATED_WORDS.get(name) if name in GENERATED_WORDS else words.get(name)
        if name == "huge_profile.json":
            word = "larger than" if loader is hardware.load_profile_file else None
        if word:
            assert word in msg, msg


def _cli(args):
    """The CLI in-process through click's runner (stdout and stderr apart)."""
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.parametrize("name", CORPUS + ["deep_list.json", "huge.json"])
def test_the_cli_refuses_broken_files_with_exit_2_and_one_line(name, generated):
    path = (generated if name in GENERATED_WORDS else BROKEN) / name
    for args in (["report", str(path)], ["hardware", "show", str(path)], ["model", "ag-gemm", "--hardware", str(path)]):
        res = _cli(args)
        assert res.exit_code == 2, (args, res.output)
        assert res.stdout == ""
        line = res.stderr.rstrip("\n")
        assert_one_line(line)
        assert line.startswith("taxes: error: ") and "Traceback" not in line and "\x1b" not in line


@pytest.mark.parametrize("name", ["binary_garbage.bin", "result_nested_2000.json", "profile_huge_int.json"])
def test_the_installed_command_refuses_broken_files_the_same_way(name):
    for args in (["report", str(BROKEN / name)], ["hardware", "show", str(BROKEN / name)]):
        p = subprocess.run([sys.executable, "-m", "taxes.cli.main", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p
        assert p.stdout == "" and p.stderr.count("\n") == 1 and p.stderr.startswith("taxes: error: "), p.stderr


# ---- hypothesis: random and mutated inputs load or fail in one line -----------------------------------

def _scaled(n: int) -> int:
    """n examples under the suite's profile (100 examples a test); more under --hypothesis-profile=thorough."""
    return max(1, n * settings.default.max_examples // 100)


def _nested(depth: int) -> list:
    """A list nested `depth` deep (built without recursion: deeper than json can read or write)."""
    v: list = []
    for _ in range(depth):
        v = [v]
    return v


HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-(10 ** 30), 10 ** 30), st.sampled_from([10 ** 400, -(10 ** 400), 2 ** 63, 0]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, 1e16, -0.0, 5e-324]),
    st.text(max_size=30), st.sampled_from(["", "[/x]", "line\nbreak", "\x1b[2J", "\u2028", "%s%n", "ag-gemm", "bsp"]),
    st.builds(lambda depth: _nested(depth), st.integers(0, 3000)),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4), max_leaves=20)


def _nodes(obj, path=()):
    """Every (path, container) in a JSON value, for mutation."""
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nodes(v, path + (i,))


def _mutate(doc, data):
    """Replace, delete or add one node of `doc` with a hostile value."""
    doc = copy.deepcopy(doc)
    spots = [(p, n) for p, n in _nodes(doc) if isinstance(n, (dict, list)) and n]
    path, node = data.draw(st.sampled_from(spots))
    key = data.draw(st.sampled_from(list(node) if isinstance(node, dict) else list(range(len(node)))))
    action = data.draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    if action == "delete":
        del node[key]
    elif action == "add" and isinstance(node, dict):
        node[data.draw(st.text(max_size=8))] = data.draw(HOSTILE)
    else:
        node[key] = data.draw(HOSTILE)
    return doc


def _loads_or_one_line(text, load):
    try:
        load(text)
    except TaxesError as e:
        assert_one_line(str(e))
        assert "\x1b" not in str(e)
        return False
    return True


@pytest.fixture(scope="module")
def small_doc():
    return json.loads((BROKEN / "result_wrong_version.json").read_text()) | {"schema_version": results.SCHEMA_VERSION}


@settings(max_examples=_scaled(150))
@given(value=JSON_VALUES)
def test_random_json_is_refused_in_one_line(value):
    text = json.dumps(value)
    assert not _loads_or_one_line(text, results.loads)
    assert not _loads_or_one_line(text, lambda t: hardware.profile_from_dict(json.loads(t)))


@settings(max_examples=_scaled(200))
@given(data=st.data())
def test_hostile_mutations_of_a_result_document_load_or_fail_in_one_line(small_doc, data):
    assert results.validate(copy.deepcopy(small_doc))
    doc = _mutate(small_doc, data)
    try:
        text = json.dumps(doc)  # NaN and Infinity become literals JSON forbids; the loader must refuse them
    except (ValueError, RecursionError):
        text = None
    if text is not None:
        _loads_or_one_line(text, results.loads)
    _loads_or_one_line(doc, results.validate)


@settings(max_examples=_scaled(200))
@given(data=st.data())
def test_hostile_mutations_of_a_hardware_profile_load_or_fail_in_one_line(data):
    valid = hardware.profile_to_dict(hardware.BUILTIN["h200-sxm"])
    assert hardware.profile_from_dict(copy.deepcopy(valid)).name == "h200-sxm"
    _loads_or_one_line(_mutate(valid, data), hardware.profile_from_dict)


@settings(max_examples=_scaled(25))
@given(data=st.data())
def test_the_report_command_renders_or_refuses_mutated_documents(small_doc, data, tmp_path_factory):
    doc = _mutate(small_doc, data)
    path = tmp_path_factory.mktemp("mut") / "doc.json"
    try:
        path.write_text(json.dumps(doc))
    except (ValueError, RecursionError):
        return
    fmt = data.draw(st.sampled_from(["table", "md", "json"]))
    res = _cli(["report", str(path), "--format", fmt])
    assert res.exit_code in (0, 2), res.output
    assert "internal error" not in res.stderr, res.stderr  # a bug
    if res.exit_code == 2:
        assert_one_line(res.stderr.rstrip("\n"))
        assert res.stderr.startswith("taxes: error: ")


@settings(max_examples=_scaled(40))
@given(shape=st.one_of(st.text(max_size=30), st.builds(lambda d, v: f"{d}={v}", st.sampled_from("MNKQ"),
                                                       st.sampled_from(["0", "-8", "1e999", "nan", "8K", "9" * 30, "1M", "",
                                                                        "0x10", "8.5", "\x1b"]))),
       world=st.sampled_from(["0", "-1", "2", "3", "99999999999999999999", "x"]))
def test_cli_options_from_the_user_run_or_fail_in_one_line(shape, world):
    res = _cli(["model", "ag-gemm", "--shape", shape, "--world", world, "--format", "json"])
    assert res.exit_code in (0, 2), res.output
    assert "internal error" not in res.stderr, res.stderr
    if res.exit_code:
        assert_one_line(res.stderr.rstrip("\n"))
    else:
        results.loads(res.stdout)


def test_a_bug_in_taxes_is_still_one_line_with_the_way_to_see_more(monkeypatch):
    import taxes.model.hardware

    def broken(name):
        raise ZeroDivisionError("planted bug")

    monkeypatch.setattr(taxes.model.hardware, "get_profile", broken)
    res = _cli(["hardware", "show", "h200-sxm"])
    assert res.exit_code == 2  # never 1: that is a verdict (compare, check), a crash must not read as one
    assert res.stderr == "taxes: error: internal error: ZeroDivisionError: planted bug (set TAXES_DEBUG=1 for the traceback)\n"


def test_hostile_names_are_shown_as_text_not_markup(tmp_path):
    prof = hardware.profile_to_dict(hardware.BUILTIN["h200-sxm"]) | {"name": "[/x] [bold]h", "description": "[red]d"}
    (tmp_path / "p.json").write_text(json.dumps(prof))
    res = _cli(["hardware", "show", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    assert "[/x] [bold]h: [red]d" in res.stdout
    doc = json.loads((BROKEN / "result_wrong_version.json").read_text()) | {"schema_version": 1}
    doc["cases"][0]["variants"][0]["variant"] = "[/oops]"
    doc["metadata"]["tool_version"] = "[bold]9"
    (tmp_path / "d.json").write_text(json.dumps(doc))
    res = _cli(["report", str(tmp_path / "d.json")])
    assert res.exit_code == 0, res.output
    assert "[/oops]" in res.stdout and "[bold]9" in res.stderr


# ---- writing files: atomic, never over an existing one unless asked ---------------------------------------

WRITER = """
import sys
import tempfile
from taxes.documents.results import write_atomic
path, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
texts = [open(a).read(), open(b).read()]
print("ready", flush=True)
i = 0
while True:
    write_atomic(path, texts[i % 2])
    i += 1
"""


def test_a_run_killed_while_writing_leaves_the_old_or_the_whole_new_file(tmp_path):
    a = json.dumps({"version": "a", "pad": ["x" * 100] * 20000})  # 2 MB each: the kill lands mid-write
    b = json.dumps({"version": "b", "pad": ["y" * 100] * 20000})
    (tmp_path / "a").write_text(a)
    (tmp_path / "b").write_text(b)
    (tmp_path / "writer.py").write_text(WRITER)
    target = tmp_path / "doc.json"
    target.write_text(a)
    rng = random.Random(11)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), str(target), str(tmp_path / "a"),
                                 str(tmp_path / "b")], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.4))
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        assert target.read_text() in (a, b)  # whole, one of the two
    stray = [p.name for p in tmp_path.iterdir() if p.name not in ("a", "b", "writer.py", "doc.json")]
    assert all(p.startswith(".taxes-") and p.endswith(".tmp") for p in stray), stray  # at most unfinished temporaries


def test_an_existing_result_is_not_replaced_unless_asked(tmp_path, small_doc):
    path = tmp_path / "r.json"
    results.save(small_doc, path)
    before = path.read_bytes()
    changed = copy.deepcopy(small_doc)
    changed["metadata"]["hardware_profile"] = "h100-sxm"
    with pytest.raises(TaxesError, match=r"r\.json: already exists; pass --force"):
        results.save(changed, path, overwrite=False)
    assert path.read_bytes() == before
    results.save(changed, path, overwrite=True)
    assert results.load(path)["metadata"]["hardware_profile"] == "h100-sxm"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_file_that_appears_while_writing_is_not_clobbered(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    real_fsync = os.fsync

    def someone_else_writes(fd):  # between our check and our publish, another run creates the file
        real_fsync(fd)
        if not path.exists():
            path.write_text("theirs")

    monkeypatch.setattr(os, "fsync", someone_else_writes)
    with pytest.raises(FileExistsError):
        results.write_atomic(path, "ours", overwrite=False)
    assert path.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # our temporary is gone


def test_runs_append_to_a_results_directory(tmp_path, small_doc):
    paths = []
    errors = []

    def add():
        try:
            paths.append(results.save_new(small_doc, tmp_path, "ag-gemm_w2"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=add) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    names = sorted(p.name for p in paths)
    assert len(set(names)) == 6 and "ag-gemm_w2.json" in names and "ag-gemm_w2-6.json" in names
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    for p in paths:
        assert results.load(p) == small_doc
    for bad in ("../x", "", ".hidden"):
        with pytest.raises(TaxesError):
            results.save_new(small_doc, tmp_path, bad)
    with pytest.raises(TaxesError, match="not a directory"):
        results.save_new(small_doc, tmp_path / "missing", "x")


@pytest.mark.parametrize("args,out_flag", [
    (["model", "gemm-rs", "--format", "json"], "-o"),
    (["model", "gemm-rs", "--format", "md"], "-o"),
    (["model", "gemm-rs"], "--plot"),
    (["report", "{doc}", "--format", "md"], "-o"),
    (["report", "{doc}", "--format", "html"], "-o"),
])
def test_cli_outputs_are_kept_unless_force(tmp_path, small_doc, args, out_flag):
    doc = tmp_path / "doc.json"
    results.save(small_doc, doc)
    target = tmp_path / ("out.png" if out_flag == "--plot" else "out.txt")
    target.write_text("keep me")
    args = [a.replace("{doc}", str(doc)) for a in args] + [out_flag, str(target)]
    res = _cli(args)
    assert res.exit_code == 2, res.output
    line = res.stderr.rstrip("\n")
    assert_one_line(line)
    flag = "--plot " if out_flag == "--plot" else ""
    assert line == f"taxes: error: {flag}{target}: already exists; pass --force to replace it (or choose another name)"
    assert target.read_text() == "keep me"
    res = _cli(args + ["--force"])
    assert res.exit_code == 0, res.output
    assert target.read_bytes() != b"keep me" and target.stat().st_size > 100


def test_cli_output_into_a_new_file_needs_no_force(tmp_path):
    target = tmp_path / "new.json"
    res = _cli(["model", "ag-gemm", "--format", "json", "-o", str(target)])
    assert res.exit_code == 0, res.output
    results.load(target)
    res = _cli(["model", "ag-gemm", "--format", "json", "-o", str(target), "--plot", str(target)])
    assert res.exit_code == 2


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
