"""A DDP training step of a small Llama (transformers, random weights from a config: nothing downloaded), with
one rank made late on purpose: the known answers of the straggler and sync-wait analysis on a real job.

    torchrun --nproc_per_node 2 benchmarks/programs/ddp_llama.py                           # nobody late
    torchrun --nproc_per_node 2 benchmarks/programs/ddp_llama.py --late-ms 3 --late-on host
    torchrun --nproc_per_node 2 benchmarks/programs/ddp_llama.py --late-ms 3 --late-on device
    torchrun --nproc_per_node 2 benchmarks/programs/ddp_llama.py --late-ms 3 --late-period 1   # every other step

The delay comes before each forward on --late-rank: a host spin (the rank's launches start late) or a timed
spin kernel on its stream (torch.cuda._sleep, its cycles per us measured first with CUDA events), so the
rank reaches DDP's gradient all-reduce late and the others wait there. With --late-period P the delay comes
only in steps i with (i // P) odd, so late and on-time steps interleave within one run and their difference
is the truth, free of the run-to-run drift of a host-bound job. Every step ends with the fused AdamW
step (optimizer.step(), which ends a step for `taxes trace`) and reads the loss (a host sync, as a training
loop that logs its loss does). Prints each rank's plain step time (CUDA events, median of the second half).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def sleep_cycles_per_us() -> float:
    """Clock cycles of torch.cuda._sleep per microsecond on this GPU, from CUDA events around a long sleep."""
    torch.cuda._sleep(1000)  # warm up
    cycles, best = 20_000_000, float("inf")
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3)
    return cycles / best


def spin_host_us(us: float) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < us * 1e-6:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--late-rank", type=int, default=1)
    ap.add_argument("--late-ms", type=float, default=0.0)
    ap.add_argument("--late-on", choices=("host", "device"), default="host")
    ap.add_argument("--late-period", type=int, default=0, help="late only in steps i with (i // P) odd; 0: every step")
    args = ap.parse_args()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75),
                      num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=4096, use_cache=False)
    torch.manual_seed(0)  # the same weights on every rank, as DDP expects
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    ddp = DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-5, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1 + rank)  # each rank its own batch
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.tokens), device="cuda", generator=gen)
    late = rank == args.late_rank and args.late_ms > 0
    cycles = int(args.late_ms * 1e3 * sleep_cycles_per_us()) if late and args.late_on == "device" else 0
    times, losses = [], []
    for i in range(args.steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        late_now = late and (args.late_period <= 0 or (i // args.late_period) % 2 == 1)
        if late_now and args.late_on == "host":
            spin_host_us(args.late_ms * 1e3)
        elif late_now:
            torch.cuda._sleep(cycles)
        loss = ddp(ids, labels=ids).loss
        loss.backward()
        opt.step()  # ends the step for taxes trace
        opt.zero_grad(set_to_none=True)
        b.record()
        losses.append(loss.item())
        times.append(a.elapsed_time(b) * 1e3)
    tail = times[len(times) // 2:]
    print(f"rank {rank}: plain step {statistics.median(tail):.1f} us (median of the last {len(tail)}); "
          f"late {args.late_ms if late else 0} ms on the {args.late_on if late else '-'}; loss {losses[-1]:.3f}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
