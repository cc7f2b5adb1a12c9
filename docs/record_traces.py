#!/usr/bin/env python
"""Record torch.profiler (Kineto) Chrome traces of a small tensor-parallel program, one per rank, for
`taxes analyze`. Self-contained: it imports only torch and triton, never taxes.

    python docs/record_traces.py --out DIR --world 2          # one process per GPU, NCCL
    python docs/record_traces.py --out DIR --world 2 --cpu    # gloo on CPU: checks the script runs

Each profiled step (a ProfilerStep#N annotation) runs, on every rank:
  1. all_gather_into_tensor of the rank's activation rows, then a matmul with the column shard (eager);
  2. a Triton elementwise kernel (SiLU), launched through cuLaunchKernel;
  3. a second matmul, then an all_reduce of its partial sums on the main stream while a third matmul
     runs concurrently on a second CUDA stream;
  4. one replay of a CUDA graph holding a matmul + all_reduce.
In odd steps the last rank sleeps on the host before the all_reduce (a "skew_sleep" annotation), so the
other ranks wait inside the collective: the trace holds sync wait on purpose.
Writes DIR/rank{r}.json and DIR/rank{r}.json.gz. With --cpu there are no GPU streams, graphs or kernels
(the Triton kernel runs in Triton's interpreter), so the traces hold host activity only.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import socket
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SKEW_SLEEP_S = 0.005  # long against a step's device work (well under 1 ms on an H200), so a gap shows


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_env(port: int, cpu: bool) -> None:
    """The same settings in the parent and in every rank: NVLink SHARP and multicast off (the VMs lack them)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton


_SILU = None


def _silu_kernel():
    """The Triton kernel, built on first use so that TRITON_INTERPRET is set before triton loads."""
    global _SILU
    if _SILU is None:
        import triton
        import triton.language as tl

        @triton.jit
        def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
            y = x / (1.0 + tl.exp(-x))
            tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

        _SILU = silu_kernel
    return _SILU


def silu(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    block = 1024
    _silu_kernel()[((n + block - 1) // block,)](x, y, n, BLOCK=block)
    return y


def _worker(rank: int, world: int, out: str, cpu: bool, steps: int, port: int, sizes: tuple[int, int, int]) -> None:
    _set_env(port, cpu)
    # Newer torch suggests all_gather_single; the program keeps the older, widely used name on purpose.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    if cpu:
        device, dtype = torch.device("cpu"), torch.float32
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        torch.cuda.set_device(rank)
        device, dtype = torch.device("cuda", rank), torch.bfloat16
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    m, k, n = sizes
    gen = torch.Generator(device="cpu").manual_seed(1234 + rank)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(device=device, dtype=dtype)

    x_shard = rand(m // world, k)  # this rank's rows of the activations
    w_col = rand(k, n // world)  # column-parallel weight shard
    w_row = rand(n // world, k)  # row-parallel weight shard
    side_a, side_b = rand(m // 2, k), rand(k, k)
    gathered = torch.empty(m, k, device=device, dtype=dtype)
    side = None if cpu else torch.cuda.Stream(device=device)

    # Check the Triton kernel once against torch before anything is timed.
    probe = rand(64, 257)
    ref = torch.nn.functional.silu(probe.float())
    if not torch.allclose(silu(probe).float(), ref, rtol=2e-2, atol=2e-2):
        raise SystemExit(f"rank {rank}: the Triton SiLU kernel disagrees with torch")

    graph = graph_in = graph_w = None
    if not cpu:  # capture a matmul + all_reduce once, after a warm-up on a side stream (CUDA graph rules)
        graph_in, graph_w = rand(m // 2, k), rand(k, k)
        warm = torch.cuda.Stream(device=device)
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            for _ in range(2):
                dist.all_reduce(graph_in @ graph_w)
        torch.cuda.current_stream().wait_stream(warm)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_out = graph_in @ graph_w
            dist.all_reduce(graph_out)
        torch.cuda.synchronize()

    def step(i: int) -> None:
        dist.all_gather_into_tensor(gathered, x_shard)
        h = silu(gathered @ w_col)
        partial = h @ w_row
        if side is not None:  # the side stream waits for what precedes the all-reduce, not for it
            side.wait_stream(torch.cuda.current_stream())
        if i % 2 == 1 and rank == world - 1:
            with record_function("skew_sleep"):
                time.sleep(SKEW_SLEEP_S)
        dist.all_reduce(partial)
        if side is None:
            side_a @ side_b
        else:
            with torch.cuda.stream(side):
                side_a @ side_b
            torch.cuda.current_stream().wait_stream(side)
        if graph is not None:
            graph.replay()
        if not cpu:
            torch.cuda.synchronize()

    activities = [ProfilerActivity.CPU] + ([] if cpu else [ProfilerActivity.CUDA])
    path = os.path.join(out, f"rank{rank}.json")
    warmup_steps = 2
    with profile(activities=activities, record_shapes=True,
                 schedule=schedule(wait=1, warmup=warmup_steps - 1, active=steps, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for i in range(warmup_steps + steps):
            step(i)
            prof.step()
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for rank{r}.json and rank{r}.json.gz")
    ap.add_argument("--world", type=int, default=2, help="processes, one per GPU")
    ap.add_argument("--steps", type=int, default=4, help="profiled steps (after 2 warm-up steps)")
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU, no CUDA: checks the script, no GPU activity")
    ap.add_argument("--m", type=int, default=2048, help="tokens (rows of the activations)")
    ap.add_argument("--k", type=int, default=2048, help="model width")
    ap.add_argument("--n", type=int, default=8192, help="hidden width (split across ranks)")
    args = ap.parse_args(argv)
    if args.world < 1 or args.steps < 1:
        ap.error("--world and --steps must be at least 1")
    if args.m % (2 * args.world) or args.n % args.world:
        ap.error("--m must divide by 2 x world and --n by world")
    if not args.cpu and torch.cuda.device_count() < args.world:
        ap.error(f"--world {args.world} needs {args.world} GPUs; this machine has {torch.cuda.device_count()} (try --cpu)")
    os.makedirs(args.out, exist_ok=True)
    port = _free_port()
    _set_env(port, args.cpu)
    t0 = time.monotonic()
    mp.spawn(_worker, args=(args.world, args.out, args.cpu, args.steps, port, (args.m, args.k, args.n)),
             nprocs=args.world, join=True)
    files = sorted(f for f in os.listdir(args.out) if f.startswith("rank"))
    print(f"wrote {', '.join(files)} to {args.out} in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
