"""Faults on real GPUs: each one must end in one clear line, in bounded time, with nothing left running.

    python benchmarks/fault_flag.py                              # 2 GPUs, every fault below
    torchrun --nproc-per-node 2 benchmarks/fault_flag.py         # the flag fault with launch() under torchrun
    TRITON_INTERPRET=1 python benchmarks/fault_flag.py --emulate # CPU: the same faults on emulated ranks

Faults tried (world 2, backend cuda):
- a flag nobody raises, in the smallest kernel that waits (kernels/sync.wait_for_flag): every rank's
  host error names the rank, the flag index and the value waited for, after about the wait budget;
  the same wait on a flag that was raised returns;
- the same timeout left uncaught: launch() raises RankError naming the rank;
- a silent peer in the fused kernels (ag-gemm fused-push and fused-pull, flash-decode fused-push,
  gemm-rs fused-push):
  the waiting rank's kernel gives up and check() raises FlagTimeout instead of hanging;
- a rank that raises; a rank killed with SIGKILL while its peer waits in an NCCL barrier: RankError
  naming the rank and its last ctx.doing(...), every rank process gone (and none on nvidia-smi);
- preflight: more GPUs than the machine has, and a shape too large for GPU memory, are refused with
  one line (memory needed and available); this machine's GPUs pass the check.
Prints one line per fault ("ok" or "FAIL", the fault, the error seen) and exits 0 when every fault
produced the expected error. Runs over the installed package (`pip install -e .`).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from taxes.run import preflight
from taxes.errors import TaxesError
from taxes.kernels import ag_gemm as ag
from taxes.kernels import flash_decode as fd
from taxes.kernels import gemm_rs as rs
from taxes.kernels.rank import RankError
from taxes.kernels.runtime import launch, torchrun_rank
from taxes.kernels.sync import FlagTimeout, wait_for_flag
from taxes.workloads import make_workload

WAIT_S = 0.5  # the budget of every planted wait
SILENT_LIMIT_S = 90  # the launcher's deadline for a silent-peer fault (compiling included): a hang fails it


# ---- rank jobs (module level: spawned ranks import them) ------------------------------------------------


def probe_job(ctx, wait_s):
    """Wait for a flag the peer raised (must return), then for one nobody raises (must give up):
    flag 3 + rank, value 7 + rank. Returns (message, seconds the second wait took)."""
    flags = ctx.heap.zeros((8,), torch.int32)
    ctx.barrier()
    flags.peers[(ctx.rank + 1) % ctx.world][0] = 5
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    ctx.barrier()
    ctx.doing("waiting for a flag that was raised")
    wait_for_flag(flags.local, 0, 5, ctx.rank, wait_s)
    ctx.doing("waiting for a flag nobody raises")
    t0 = time.monotonic()
    try:
        wait_for_flag(flags.local, 3 + ctx.rank, 7 + ctx.rank, ctx.rank, wait_s)
        message = "no error"
    except FlagTimeout as e:
        message = str(e)
    took = time.monotonic() - t0
    ctx.barrier()
    return message, took


def probe_uncaught_job(ctx, wait_s):
    flags = ctx.heap.zeros((8,), torch.int32)
    ctx.doing(f"waiting on probe flag {3 + ctx.rank}")
    wait_for_flag(flags.local, 3 + ctx.rank, 7 + ctx.rank, ctx.rank, wait_s)


def _rank0_runs_alone(ctx, run, call, doing: str) -> str:
    """Rank 0 calls run (its peer stays silent) and reports the FlagTimeout message its check() raises;
    the silent rank keeps its memory mapped until rank 0 is done with it."""
    message = "silent"
    if ctx.rank == 0:
        ctx.doing(doing)
        call()
        try:
            run.check()
            message = "no error"
        except FlagTimeout as e:
            message = str(e)
    ctx.barrier()
    return message


def silent_ag_gemm_job(ctx, variant, wait_s):
    """Rank 1 builds the fused kernel but never runs it; rank 0's run must give up on its flags."""
    small = ctx.backend != "cuda"  # the interpreter: tiny tiles
    M, N, K = (64, 64, 32) if small else (1024, 1024, 1024)
    cfg = (ag.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, copiers=1, chunk_rows=8,
                     copy_block=256, grid=4) if small else ag.tuned_config(M, N, K, ctx.world, variant))
    dtype = torch.bfloat16
    a_full = ctx.heap.alloc((M, K), dtype)
    a_full.local.normal_()
    w = torch.randn(K, N // ctx.world, device=ctx.device, dtype=dtype)
    out = torch.empty(M, N // ctx.world, device=ctx.device, dtype=dtype)
    run = ag.make_variant(ctx, variant, M, N // ctx.world, K, dtype, cfg, wait_s=wait_s)
    return _rank0_runs_alone(ctx, run, lambda: run(a_full, w, out), f"running {variant} with a silent peer")


def silent_flash_decode_job(ctx, wait_s):
    B, Hq, Hkv, D, S = (1, 16, 2, 64, 128) if ctx.backend != "cuda" else (1, 32, 8, 128, 4096)
    q = torch.randn(B, Hq, D, device=ctx.device, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, device=ctx.device, dtype=torch.bfloat16) for _ in range(2))
    run = fd.FlashDecode(ctx, B, Hq, Hkv, D, S, torch.bfloat16, "fused-push", wait_s=wait_s)
    out = torch.empty(B, Hq, D, device=ctx.device, dtype=torch.bfloat16)
    return _rank0_runs_alone(ctx, run, lambda: run(q, k, v, out), "combining with a silent peer")


def silent_gemm_rs_job(ctx, wait_s, producer="ctas"):
    """Rank 1 builds the fused GEMM + reduce-scatter but never runs it: rank 0 pushes its peer tiles (or
    its copy engine copies them), then its own tiles wait for rank 1's partials, which never come."""
    small = ctx.backend != "cuda"
    M, N, K = (64, 32, 64) if small else (2048, 2048, 4096)
    cfg = (rs.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, grid=4) if small
           else rs.Config())
    cfg = replace(cfg, producer=producer)
    a = torch.randn(M, K // ctx.world, device=ctx.device, dtype=torch.bfloat16)
    w = torch.randn(K // ctx.world, N, device=ctx.device, dtype=torch.bfloat16)
    out = torch.empty(M // ctx.world, N, device=ctx.device, dtype=torch.bfloat16)
    run = rs.make_variant(ctx, "fused-push", M, N, K, torch.bfloat16, cfg, wait_s=wait_s)
    return _rank0_runs_alone(ctx, run, lambda: run(a, w, out), "reducing with a silent peer")


def raising_job(ctx):
    ctx.doing("step 2: checking the planted failure")
    if ctx.rank == 1:
        raise ValueError("planted failure")
    ctx.barrier()


def killed_job(ctx, pid_dir):
    Path(pid_dir, f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    ctx.barrier()
    if ctx.rank == 1:
        ctx.doing("step 3 of 5: copying the planted chunk")
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.doing("waiting in an NCCL barrier")
    ctx.barrier()  # never completed: rank 1 is gone


# ---- checks: each returns (ok, what was seen) --------------------------------------------------------------


def _probe_ok(out, wait_s) -> tuple[bool, str]:
    lines = []
    ok = True
    for rank, (message, took) in enumerate(out):
        want = (f"rank {rank}: flag probe gave up waiting for the probe flag (index {3 + rank}) to reach {7 + rank}; "
                f"it still read 0")
        ok &= message.startswith(want) and "\n" not in message and took < wait_s + 5
        lines.append(f"[{took:.2f} s] {message}")
    return ok, " / ".join(lines)


def fault_probe(backend, world):
    return _probe_ok(launch(probe_job, world, WAIT_S, backend=backend, timeout_s=300), WAIT_S)


def fault_probe_uncaught(backend, world):
    try:
        launch(probe_uncaught_job, world, WAIT_S, backend=backend, timeout_s=300)
        return False, "no error"
    except RankError as e:
        msg = str(e)
    m = re.match(r"rank (\d) failed while waiting on probe flag (\d): FlagTimeout: rank (\d): .*\(index (\d)\) to reach (\d+)",
                 msg)
    r = int(m.group(1)) if m else -1
    return bool(m) and [int(g) for g in m.groups()] == [r, 3 + r, r, 3 + r, 7 + r], msg


def fault_silent_ag_gemm(variant):
    def run(backend, world):
        t0 = time.monotonic()
        msg, silent = launch(silent_ag_gemm_job, world, variant, WAIT_S, backend=backend, timeout_s=SILENT_LIMIT_S)
        took = time.monotonic() - t0
        ok = msg.startswith("rank 0: fused all-gather + GEMM gave up waiting") and "rank 1" in msg and silent == "silent"
        return ok, f"[{took:.1f} s with launch] {msg}"
    return run


def fault_silent_flash_decode(backend, world):
    msg, silent = launch(silent_flash_decode_job, world, WAIT_S, backend=backend, timeout_s=SILENT_LIMIT_S)
    return msg.startswith("rank 0: fused flash-decode combine gave up waiting") and "from rank 1" in msg, msg


def fault_silent_gemm_rs(producer):
    def run(backend, world):
        t0 = time.monotonic()
        msg, silent = launch(silent_gemm_rs_job, world, WAIT_S, producer, backend=backend, timeout_s=SILENT_LIMIT_S)
        took = time.monotonic() - t0
        ok = (msg.startswith("rank 0: fused GEMM + reduce-scatter gave up waiting") and "from rank 1" in msg
              and silent == "silent")
        return ok, f"[{took:.1f} s with launch] {msg}"
    return run


def fault_raising_rank(backend, world):
    try:
        launch(raising_job, world, backend=backend, timeout_s=300)
        return False, "no error"
    except RankError as e:
        msg = str(e)
    return msg == "rank 1 failed while step 2: checking the planted failure: ValueError: planted failure", msg


def _gpu_pids() -> set[int] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return {int(x) for x in out.stdout.split() if x.strip().isdigit()} if out.returncode == 0 else None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def fault_killed_rank(backend, world):
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        try:
            launch(killed_job, world, d, backend=backend, timeout_s=300)
            return False, "no error"
        except RankError as e:
            msg = str(e)
        took = time.monotonic() - t0
        pids = [int(Path(d, f"rank{r}.pid").read_text()) for r in range(world) if Path(d, f"rank{r}.pid").exists()]
    alive = [p for p in pids if _alive(p)]
    on_gpu = (_gpu_pids() or set()) & set(pids) if backend == "cuda" else set()
    ok = (msg.startswith("rank 1 died (killed by SIGKILL) while step 3 of 5: copying the planted chunk")
          and not alive and not on_gpu and len(pids) == world)
    return ok, f"[{took:.1f} s] {msg}; ranks left alive: {alive or 'none'}; on nvidia-smi: {sorted(on_gpu) or 'none'}"


def fault_preflight(backend, world):
    seen = []
    ok = True
    if backend != "cuda":
        return True, "skipped: needs CUDA"
    have = torch.cuda.device_count()
    try:
        preflight.check_gpus(have + 1)
        ok = False
        seen.append("more GPUs than present: no error")
    except TaxesError as e:
        ok &= f"needs {have + 1} GPUs" in str(e)
        seen.append(str(e))
    try:
        facts = preflight.check_gpus(world)
        seen.append(f"{world} x {facts.names[0]}: usable")
    except TaxesError as e:
        ok = False
        seen.append(f"this machine refused: {e}")
    big = make_workload("ag-gemm", {"M": 1 << 20, "N": 1 << 16, "K": 1 << 16}, world)
    try:
        preflight.check_memory(preflight.bytes_needed(big, "bsp"), 0, what="ag-gemm M=1M,N=64K,K=64K")
        ok = False
        seen.append("a shape that cannot fit: no error")
    except TaxesError as e:
        ok &= "GiB per GPU" in str(e) and "GiB free" in str(e)
        seen.append(str(e))
    small = make_workload("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, world)
    try:
        preflight.check_memory(preflight.bytes_needed(small, "bsp"), 0, what="ag-gemm 8K^3")
    except TaxesError as e:
        ok = False
        seen.append(f"a shape that fits was refused: {e}")
    return ok, " / ".join(seen)


FAULTS = [
    ("flag nobody raises (probe kernel)", fault_probe),
    ("flag timeout left uncaught", fault_probe_uncaught),
    ("silent peer, ag-gemm fused-push", fault_silent_ag_gemm("fused-push")),
    ("silent peer, ag-gemm fused-pull", fault_silent_ag_gemm("fused-pull")),
    ("silent peer, flash-decode fused-push", fault_silent_flash_decode),
    ("silent peer, gemm-rs fused-push", fault_silent_gemm_rs("ctas")),
    ("silent peer, gemm-rs fused-push, copy-engine producer", fault_silent_gemm_rs("copy-engine")),
    ("rank raises", fault_raising_rank),
    ("rank SIGKILLed while its peer waits in a collective", fault_killed_rank),
    ("preflight: GPUs and memory", fault_preflight),
]


def _report(name, fn, backend, world) -> bool:
    t0 = time.monotonic()
    try:
        ok, seen = fn(backend, world)
    except Exception as e:  # an unexpected error is a failed fault, still on one line
        ok, seen = False, f"unexpected {type(e).__name__}: {' '.join(str(e).split())[:400]}"
    print(f"{'ok  ' if ok else 'FAIL'} | {name} | {time.monotonic() - t0:.1f} s | {' '.join(seen.split())}", flush=True)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--emulate", action="store_true", help="emulated ranks on the CPU (needs TRITON_INTERPRET=1)")
    ap.add_argument("--only", default="", help="run only faults whose name contains this text")
    args = ap.parse_args(argv)
    backend = "emulated" if args.emulate else "cuda"
    here = torchrun_rank()
    if here is not None and backend == "cuda":  # torchrun: this process is one rank; launch() runs here
        rank = here[0]
        try:
            ok, seen = _probe_ok(launch(probe_job, here[1], WAIT_S, backend="cuda", timeout_s=300), WAIT_S)
        except Exception as e:
            ok, seen = False, f"unexpected {type(e).__name__}: {' '.join(str(e).split())[:400]}"
        print(f"{'ok  ' if ok else 'FAIL'} | rank {rank} under torchrun: flag nobody raises | {seen}", flush=True)
        return 0 if ok else 1
    results = [_report(name, fn, backend, args.world) for name, fn in FAULTS if args.only in name]
    print(f"{sum(results)} of {len(results)} faults gave the expected clear error", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
